//! A type-erased `Rc` for the per-shard registry: it remembers the `TypeId`
//! of what it holds, so a typed lookup is one inline compare of two words
//! with a constant instead of `dyn Any`'s virtual `type_id` call, whose
//! 16-byte result comes back through the stack and stalled every send on
//! store forwarding (measured with perf on cross-shard tells). This module
//! owns that one `unsafe` cast.

use std::any::{Any, TypeId};
use std::rc::Rc;

/// An `Rc<T>` of some `'static` type `T`, with its type remembered.
pub(crate) struct ErasedRc {
    type_id: TypeId,
    value: Rc<dyn Any>,
}

impl ErasedRc {
    pub(crate) fn new<T: 'static>(value: Rc<T>) -> Self {
        ErasedRc {
            type_id: TypeId::of::<T>(),
            value,
        }
    }

    /// The value, if it is a `T`.
    #[inline]
    pub(crate) fn get_ref<T: 'static>(&self) -> Option<&T> {
        if self.type_id != TypeId::of::<T>() {
            return None;
        }
        let value: &dyn Any = &*self.value;
        // SAFETY: as in `get_rc`: the value was made as a `T` (its `TypeId`
        // is `T`'s), so the data pointer of the `dyn Any` points at a live
        // `T`, borrowed for as long as `self` is.
        Some(unsafe { &*(value as *const dyn Any).cast::<T>() })
    }

    /// A new `Rc` of the value, if it is a `T`.
    #[inline]
    pub(crate) fn get_rc<T: 'static>(&self) -> Option<Rc<T>> {
        if self.type_id != TypeId::of::<T>() {
            return None;
        }
        let value = self.value.clone();
        // SAFETY: `type_id` is the `TypeId` of the type this `Rc` was made
        // from (set once in `new`), and it equals `T`'s: the `Rc<dyn Any>`
        // was made from an `Rc<T>`, so its raw pointer (metadata dropped) is
        // the one `Rc::<T>::into_raw` would give, with this clone's count.
        Some(unsafe { Rc::from_raw(Rc::into_raw(value).cast::<T>()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_is_found_only_as_its_own_type() {
        let erased = ErasedRc::new(Rc::new(41u64));
        assert!(erased.get_rc::<i64>().is_none());
        assert!(erased.get_rc::<Rc<u64>>().is_none());
        let rc = erased.get_rc::<u64>().unwrap();
        assert_eq!((*rc, Rc::strong_count(&rc)), (41, 2));
        drop(erased);
        assert_eq!(Rc::strong_count(&rc), 1);
        assert!(ErasedRc::new(Rc::new(1u8)).get_rc::<u16>().is_none());
        let erased = ErasedRc::new(Rc::new(7u32));
        assert_eq!(erased.get_ref::<u32>(), Some(&7));
        assert!(erased.get_ref::<i32>().is_none());
    }
}
