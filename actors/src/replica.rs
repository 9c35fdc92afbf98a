//! A shard's replica of its system's shared state, with a biased reference
//! count: references taken and released on the replica's own shard thread
//! count in a plain integer, those on any other thread in an atomic one.
//!
//! Building a `KeyedRef` on a shard and dropping it there is the common case
//! (`system.keyed(key).tell(msg)` per message): with one atomic count, that
//! is two locked read-modify-write instructions per message, each of which
//! waits for the sender's store buffer to drain (measured: ~10% of a keyed
//! Zipf producer's time). With the biased count it is two plain increments.
//!
//! # Counting
//!
//! The number of live references is `local + remote`, where either part may
//! be negative (a reference taken on the owner thread can be released
//! elsewhere, and the other way round):
//!
//! - `local` belongs to the owner thread. It starts at one, the reference
//!   the shard's registry holds ([`ReplicaHome`]).
//! - `remote` is atomic and starts at [`UNMERGED`], a bias that keeps it far
//!   from zero while the owner still counts locally. Releases elsewhere of
//!   references taken on the owner thread lower `remote` and raise `local`
//!   by as much; so that this drift stays bounded however long a shard
//!   runs, the owner folds `local` back into `remote` whenever it passes
//!   [`FOLD_AT`] (one compare on the owner's increment).
//! - When the registry drops its home (on the owner thread, when the shard's
//!   actors are cleared or the thread exits), the owner *merges*: it stops
//!   counting locally (its thread-local marker is cleared, so later
//!   operations there take the atomic path) and adds `local - 1 - UNMERGED`
//!   to `remote`. From then on `remote` is the true count, and whoever brings
//!   it to zero frees the replica.
//!
//! Which count an operation uses is decided by the calling thread: a thread's
//! `OWNED` marker is null or points at the replica of a live home created on
//! that thread (set when the home is made; cleared by that home's drop if it
//! still points there, and overwritten if the thread makes another home, in
//! which case the older replica simply takes the atomic path from then on).
//! No other thread's marker ever points at a replica. A home is dropped on
//! the thread that made it: it is not `Send`, and the registry holding it is
//! a thread-local `Rc`.

use std::cell::Cell;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicIsize, Ordering};
use std::sync::Arc;

use crate::system::SystemShared;

/// The bias `remote` carries until the owner merges.
const UNMERGED: isize = 1 << 60;

/// The owner's count at which it is folded into `remote` (far below the
/// bias, so `remote` never comes near zero before the merge).
/// Small in tests, so that they fold.
const FOLD_AT: isize = if cfg!(test) { 1 << 4 } else { 1 << 40 };

thread_local! {
    /// The replica this thread owns and still counts locally, if any.
    static OWNED: Cell<*const Replica> = const { Cell::new(std::ptr::null()) };
}

struct Replica {
    shared: Arc<SystemShared>,
    /// References taken minus released on the owner thread, plus one for
    /// the registry. Owner thread only, and only until the merge.
    local: Cell<isize>,
    /// References taken minus released elsewhere (after the merge: all of
    /// them), plus `UNMERGED` until the merge.
    remote: AtomicIsize,
}

/// The calling thread's replica, when it owns one of `shared`'s system.
#[inline]
fn owned_replica_of(shared: &SystemShared) -> Option<NonNull<Replica>> {
    let ptr = OWNED.try_with(Cell::get).ok()?;
    let ptr = NonNull::new(ptr.cast_mut())?;
    // SAFETY: `OWNED` is null or points at the replica of a live home made on
    // this thread (module docs): a home's drop clears it first if it still
    // points there, and the home's own reference keeps the replica alive.
    let replica = unsafe { ptr.as_ref() };
    (replica.shared.id == shared.id).then_some(ptr)
}

#[inline]
fn owns(ptr: NonNull<Replica>) -> bool {
    OWNED
        .try_with(|o| std::ptr::eq(o.get(), ptr.as_ptr()))
        .unwrap_or(false)
}

/// A counted reference to a replica.
pub(crate) struct ReplicaRef(NonNull<Replica>);

// SAFETY: the only non-thread-safe part of a replica is `local`, which is
// touched only on the thread whose `OWNED` marker points at the replica
// (module docs); everything else is an `Arc` of `Send + Sync` state or atomic.
// (`OWNED` has no destructor, so its access does not fail; if it did, the
// operation would take the atomic path, which is always correct.)
unsafe impl Send for ReplicaRef {}
// SAFETY: as for `Send`: through `&ReplicaRef` a thread reads `shared` or
// clones, and a clone touches `local` only on the owner thread.
unsafe impl Sync for ReplicaRef {}

/// Adds one to the owner's count, folding it into `remote` when it grows
/// large. Owner thread only, before the merge.
#[inline]
fn increment_local(replica: &Replica) {
    let local = replica.local.get() + 1;
    if local < FOLD_AT {
        replica.local.set(local);
    } else {
        // Keeps `local + remote` and brings `remote` back up by as much as
        // releases elsewhere of references taken here had lowered it.
        replica.remote.fetch_add(local - 1, Ordering::Relaxed);
        replica.local.set(1);
    }
}

impl ReplicaRef {
    /// A new reference to the calling thread's replica of `shared`'s system,
    /// if this thread owns one (a plain increment).
    #[inline]
    pub(crate) fn here(shared: &SystemShared) -> Option<ReplicaRef> {
        let ptr = owned_replica_of(shared)?;
        // SAFETY: owned by this thread and alive (see `owned_replica_of`);
        // `local` is this thread's to touch.
        let replica = unsafe { ptr.as_ref() };
        increment_local(replica);
        Some(ReplicaRef(ptr))
    }

    /// The shared state.
    #[inline]
    pub(crate) fn shared(&self) -> &Arc<SystemShared> {
        // SAFETY: this counted reference keeps the replica alive.
        unsafe { &self.0.as_ref().shared }
    }
}

impl Clone for ReplicaRef {
    #[inline]
    fn clone(&self) -> Self {
        // SAFETY: this counted reference keeps the replica alive.
        let replica = unsafe { self.0.as_ref() };
        if owns(self.0) {
            increment_local(replica);
        } else {
            // As `Arc::clone`: a new reference is made from a live one, so
            // no ordering is needed.
            replica.remote.fetch_add(1, Ordering::Relaxed);
        }
        ReplicaRef(self.0)
    }
}

impl Drop for ReplicaRef {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: this counted reference keeps the replica alive until the
        // release below.
        let replica = unsafe { self.0.as_ref() };
        if owns(self.0) {
            // The registry's own reference is counted here too, so this
            // cannot be the last one.
            replica.local.set(replica.local.get() - 1);
            return;
        }
        if replica.remote.fetch_sub(1, Ordering::Release) == 1 {
            fence(Ordering::Acquire);
            // SAFETY: `remote` reached zero, which happens only after the
            // merge (before it, the bias minus the folded drift keeps it
            // above `UNMERGED - FOLD_AT - live references`): this was the
            // last reference.
            unsafe { free(self.0) };
        }
    }
}

/// The registry's reference, which makes its thread the owner: made on the
/// shard thread, dropped there (the registry is thread-local). Not `Send`
/// (the raw pointer sees to that, and the merge relies on it).
pub(crate) struct ReplicaHome(NonNull<Replica>);

impl ReplicaHome {
    /// A replica of `shared` owned by the calling thread.
    pub(crate) fn new(shared: Arc<SystemShared>) -> ReplicaHome {
        let replica = Box::new(Replica {
            shared,
            local: Cell::new(1),
            remote: AtomicIsize::new(UNMERGED),
        });
        let ptr = NonNull::from(Box::leak(replica));
        let _ = OWNED.try_with(|o| o.set(ptr.as_ptr()));
        ReplicaHome(ptr)
    }
}

impl Drop for ReplicaHome {
    fn drop(&mut self) {
        // SAFETY: the home's reference keeps the replica alive until the
        // merge below.
        let replica = unsafe { self.0.as_ref() };
        // From here on this thread takes the atomic path too.
        let _ = OWNED.try_with(|o| {
            if std::ptr::eq(o.get(), self.0.as_ptr()) {
                o.set(std::ptr::null());
            }
        });
        // The registry's reference goes with the local count.
        let delta = replica.local.get() - 1 - UNMERGED;
        replica.local.set(0);
        if replica.remote.fetch_add(delta, Ordering::AcqRel) + delta == 0 {
            // SAFETY: the true count is zero: nobody else holds a reference.
            unsafe { free(self.0) };
        }
    }
}

/// Frees a replica.
///
/// # Safety
///
/// `ptr` came from `ReplicaHome::new` and no reference to it remains.
unsafe fn free(ptr: NonNull<Replica>) {
    // SAFETY: allocated by `Box` in `ReplicaHome::new`; the caller
    // guarantees it is no longer referenced.
    drop(unsafe { Box::from_raw(ptr.as_ptr()) });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shared state over a one-shard runtime (kept alive by the handle).
    /// Its shard spins rather than parks, so the tests also run under
    /// valgrind (which stalls in a blocking `io_uring_enter`).
    fn shared() -> (mailring::Runtime, Arc<SystemShared>) {
        let rt = mailring::Runtime::builder()
            .shards(1)
            .idle_policy(mailring::IdlePolicy::Spin(std::time::Duration::from_secs(
                60,
            )))
            .build()
            .expect("io_uring available");
        let s = SystemShared::new(rt.handle().clone(), &Default::default(), 0xC000);
        (rt, s)
    }

    #[test]
    fn references_released_anywhere_free_the_replica_once() {
        let (_rt, s) = shared();
        let home = ReplicaHome::new(s.clone());
        let here = ReplicaRef::here(&s).expect("owner thread");
        let a = here.clone();
        // One made here, released on another thread; one made there,
        // released here.
        let made_there = std::thread::scope(|t| {
            t.spawn(|| {
                assert!(ReplicaRef::here(&s).is_none(), "not the owner");
                drop(a);
                here.clone()
            })
            .join()
            .unwrap()
        });
        drop(made_there);
        assert_eq!(Arc::strong_count(&s), 2);
        drop(home);
        // `here` still holds the replica after the merge.
        assert_eq!(Arc::strong_count(&s), 2);
        assert!(ReplicaRef::here(&s).is_none(), "merged: no longer local");
        drop(here);
        assert_eq!(Arc::strong_count(&s), 1, "the replica was freed");
    }

    #[test]
    fn folding_the_owners_count_keeps_the_total() {
        let (_rt, s) = shared();
        let home = ReplicaHome::new(s.clone());
        // Many references taken here (past several folds), released on
        // another thread, and a few kept here.
        let taken: Vec<ReplicaRef> = (0..100)
            .map(|_| ReplicaRef::here(&s).expect("owner thread"))
            .collect();
        let kept: Vec<ReplicaRef> = taken.iter().take(3).cloned().collect();
        std::thread::scope(|t| {
            t.spawn(move || drop(taken));
        });
        assert_eq!(Arc::strong_count(&s), 2);
        drop(home);
        assert_eq!(Arc::strong_count(&s), 2, "three references are left");
        drop(kept);
        assert_eq!(Arc::strong_count(&s), 1, "the replica was freed");
    }

    #[test]
    fn the_home_frees_the_replica_when_no_reference_is_left() {
        let (_rt, s) = shared();
        let home = ReplicaHome::new(s.clone());
        drop(ReplicaRef::here(&s));
        drop(home);
        assert_eq!(Arc::strong_count(&s), 1);
    }

    #[test]
    fn a_reference_outliving_the_owner_thread_frees_the_replica() {
        let (_rt, s) = shared();
        let r = std::thread::scope(|t| {
            t.spawn(|| {
                let home = ReplicaHome::new(s.clone());
                let r = ReplicaRef::here(&s).expect("owner thread");
                drop(home);
                r
            })
            .join()
            .unwrap()
        });
        assert_eq!(Arc::strong_count(&s), 2);
        let r2 = r.clone();
        drop(r);
        drop(r2);
        assert_eq!(Arc::strong_count(&s), 1);
    }
}
