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

/// A `&'static T` of some type `T`, with its type remembered: what a
/// thread-local cell can hold without a destructor (it is `Copy`).
#[derive(Clone, Copy)]
pub(crate) struct ErasedStatic {
    type_id: TypeId,
    ptr: *const (),
}

impl ErasedStatic {
    pub(crate) fn new<T: 'static>(value: &'static T) -> Self {
        ErasedStatic {
            type_id: TypeId::of::<T>(),
            ptr: (value as *const T).cast(),
        }
    }

    /// The value, if it is a `T`.
    #[inline(always)]
    pub(crate) fn get<T: 'static>(self) -> Option<&'static T> {
        if self.type_id != TypeId::of::<T>() {
            return None;
        }
        // SAFETY: `ptr` came from a `&'static T` (in `new`) of the type
        // whose `TypeId` is `type_id`, which is `T`'s: it points at a live
        // `T` for the rest of the program.
        Some(unsafe { &*self.ptr.cast::<T>() })
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
        let leaked: &'static u16 = Box::leak(Box::new(9));
        let erased = ErasedStatic::new(leaked);
        assert_eq!(erased.get::<u16>(), Some(&9));
        assert!(erased.get::<u8>().is_none());
    }
}
