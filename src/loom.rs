//! Synchronisation primitives of the lock-free parts, swapped for loom's under `cfg(loom)`.
//!
//! Only modules whose protocol is model-checked ([`crate::doorbell`]) import from here;
//! everything else uses `std` directly.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::Mutex;

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicBool, Ordering};
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
