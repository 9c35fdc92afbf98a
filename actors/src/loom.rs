//! Synchronisation primitives of [`crate::capacity`], swapped for loom's
//! under `cfg(loom)`.
//!
//! Only the bounded-mailbox count imports from here (its protocol is
//! model-checked); everything else uses `std` directly. Under `cfg(loom)` the
//! crate compiles that module alone (the runtime then exports only its own
//! model-checked parts), so its loom models build without the rest.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

/// Locks a mutex, recovering the data if a panicking holder poisoned it.
///
/// The waiter list is only pushed to and taken whole under its lock, so a
/// poisoned lock still guards a consistent list.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
