//! Synchronisation primitives of the lock-free parts, swapped for loom's under `cfg(loom)`.
//!
//! Only modules whose protocol is model-checked ([`crate::doorbell`],
//! [`crate::sync`]) import from here; everything else uses `std` directly.

#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{
    fence, AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};
#[cfg(loom)]
pub(crate) use loom::sync::Mutex;

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::Mutex;

/// Locks a mutex, recovering the data if a panicking holder poisoned it.
///
/// The inbox only appends and swaps vectors under its lock, so a poisoned lock
/// still guards a consistent queue.
#[cfg(not(loom))]
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(loom)]
pub(crate) fn lock<T>(m: &Mutex<T>) -> loom::sync::MutexGuard<'_, T> {
    m.lock().unwrap()
}

/// `std`'s `UnsafeCell` with loom's closure-based access (`with`, `with_mut`),
/// so code written for loom compiles to plain pointer access.
#[cfg(not(loom))]
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    pub(crate) const fn new(value: T) -> Self {
        UnsafeCell(std::cell::UnsafeCell::new(value))
    }

    #[inline]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    #[inline]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}
