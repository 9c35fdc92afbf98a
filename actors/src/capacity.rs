//! The shared count of a bounded mailbox, taken by senders on every shard
//! and freed by the actor's shard as it takes messages.
//!
//! `depth` counts the places taken: messages sent and not yet taken by the
//! actor. `try_acquire` adds one only while `depth < cap`, with a
//! compare-exchange, so `depth` never holds a transient over-count: every
//! value it takes is a number of places really taken, a failed attempt
//! changes nothing, and `Full` means all `cap` places were taken at the
//! instant the attempt last read `depth`. `tell` takes places whatever the
//! bound (`force_acquire`), so `depth` may exceed `cap`. Only `release`
//! takes places back, and it wakes the waiting senders when `waiting` says
//! there are any.
//!
//! No lost wake: a sender that finds no place registers its waker, sets
//! `waiting`, then reads `depth` again with a read-modify-write. Every write
//! to `depth` is a read-modify-write, so they are totally ordered and each
//! reads the one before. A release ordered before the sender's re-read
//! leaves its freed place visible to that re-read; a release ordered after
//! it acquires from it (the release sequence is unbroken) and so sees
//! `waiting` set, or cleared by a release that took the sender's waker.
//!
//! The protocol is model-checked with loom (`loom_tests` below:
//! `RUSTFLAGS="--cfg loom" cargo test -p mailring-actors --lib --release
//! loom_tests`).

use std::sync::Arc;
use std::task::{Context, Poll};

use mailring::sync::{WaitKey, WaitList};

use crate::loom::{lock, AtomicBool, AtomicUsize, Mutex, Ordering};

/// The shared count of a bounded mailbox.
#[derive(Debug)]
pub(crate) struct Capacity {
    /// At least 1.
    cap: usize,
    /// Places taken. Written only by read-modify-writes (the re-read in
    /// [`Capacity::poll_acquire`] relies on it), never above `cap` but by
    /// [`Capacity::force_acquire_n`].
    depth: AtomicUsize,
    /// `waiters` may hold a waker: set after a push and cleared by the
    /// release that takes them all, both under the `waiters` lock.
    waiting: AtomicBool,
    /// Each waiting sender's waker under a key of its own: a sender that
    /// gives up takes it back ([`Capacity::forget`]).
    waiters: Mutex<WaitList>,
    /// The (unkeyed) actor ended: nothing frees places any more, and none
    /// is needed: every acquire succeeds, and the message becomes a dead
    /// letter.
    closed: AtomicBool,
}

impl Capacity {
    pub(crate) fn new(cap: usize) -> Arc<Self> {
        Arc::new(Capacity {
            cap: cap.max(1),
            depth: AtomicUsize::new(0),
            waiting: AtomicBool::new(false),
            waiters: Mutex::new(WaitList::new()),
            closed: AtomicBool::new(false),
        })
    }

    /// The actor whose mailbox this bounds ended for good (an unkeyed
    /// actor; a key's count outlives its activations): senders never wait
    /// for room again, and those waiting are woken. Places taken by
    /// messages it will never take are never freed, and need not be.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let waiters = {
            let mut w = lock(&self.waiters);
            self.waiting.store(false, Ordering::Release);
            w.take_all()
        };
        waiters.wake();
    }

    /// No place is taken (nothing sent and not yet taken by the actor).
    pub(crate) fn is_idle(&self) -> bool {
        self.depth.load(Ordering::Acquire) == 0
    }

    /// Takes a place if one is free; `false` only if all `cap` places were
    /// taken when `depth` was read.
    pub(crate) fn try_acquire(&self) -> bool {
        self.acquire_from(self.depth.load(Ordering::Relaxed))
    }

    /// Whether [`close`](Self::close) was called.
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Takes a place if one is free, `depth` being its value as last read:
    /// adds one only to a value below `cap` (a failed attempt writes
    /// nothing, so it can neither fail another attempt nor need a
    /// compensating decrement that would free a place without a wake).
    fn acquire_from(&self, mut depth: usize) -> bool {
        if self.is_closed() {
            // Taken whatever the bound, as `tell` takes it: a release that
            // follows (a same-shard dead letter gives its place back) stays
            // balanced.
            self.depth.fetch_add(1, Ordering::AcqRel);
            return true;
        }
        while depth < self.cap {
            match self.depth.compare_exchange_weak(
                depth,
                depth + 1,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(now) => depth = now,
            }
        }
        false
    }

    /// Takes a place whatever the bound (`tell`).
    pub(crate) fn force_acquire(&self) {
        self.force_acquire_n(1);
    }

    /// Takes `n` places whatever the bound.
    pub(crate) fn force_acquire_n(&self, n: usize) {
        self.depth.fetch_add(n, Ordering::AcqRel);
    }

    /// Frees `n` taken places and wakes the senders waiting for room.
    ///
    /// The only decrement of `depth`: the acquiring decrement orders the
    /// `waiting` load after the re-read of any sender whose re-read came
    /// before it (see the module docs), so such a sender is woken.
    pub(crate) fn release(&self, n: usize) {
        let before = self.depth.fetch_sub(n, Ordering::AcqRel);
        debug_assert!(before >= n, "released {n} places of {before} taken");
        if self.waiting.load(Ordering::Acquire) {
            let waiters = {
                let mut w = lock(&self.waiters);
                self.waiting.store(false, Ordering::Release);
                w.take_all()
            };
            waiters.wake();
        }
    }

    /// Takes a place, or registers `cx` to be woken when one frees, under
    /// `key` (a sender polled again while it waits is listed once; one
    /// that gets its place, or gives up, takes its waker back with
    /// [`forget`](Self::forget)).
    pub(crate) fn poll_acquire(&self, cx: &mut Context<'_>, key: &mut Option<WaitKey>) -> Poll<()> {
        if self.try_acquire() {
            self.forget(key);
            return Poll::Ready(());
        }
        let replaced = {
            let mut w = lock(&self.waiters);
            let replaced = w.register(key, cx.waker());
            self.waiting.store(true, Ordering::Release);
            replaced
        };
        // Dropped with the lock released: a waker's drop may run code that
        // takes it (a sender's `PlaceWait`).
        drop(replaced);
        // Registered: a release whose decrement comes after this re-read
        // in `depth`'s order sees `waiting` and wakes us; one that comes
        // before it freed a place this re-read sees. The re-read is a
        // read-modify-write (adding nothing) because a plain load could
        // read a value older than such a decrement.
        if self.acquire_from(self.depth.fetch_add(0, Ordering::AcqRel)) {
            self.forget(key);
            return Poll::Ready(());
        }
        Poll::Pending
    }

    /// Takes back the waker a sender listed under `key`, if no release
    /// took it yet (the sender got its place, or gave up).
    pub(crate) fn forget(&self, key: &mut Option<WaitKey>) {
        if key.is_none() {
            return;
        }
        let waker = lock(&self.waiters).remove(key);
        // Dropped with the lock released: it may be a task's last reference.
        drop(waker);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::thread;
    use std::task::{Wake, Waker};

    /// Counts wakes; `Wake` needs std's `Arc`, which is fine for a counter
    /// read only after the threads are joined.
    struct Count(std::sync::atomic::AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    impl Count {
        fn woken(&self) -> bool {
            self.0.load(std::sync::atomic::Ordering::SeqCst) > 0
        }
    }

    /// A waker that counts its wakes, with its counter.
    fn counting_waker() -> (Arc<Count>, Waker) {
        let count = Arc::new(Count(std::sync::atomic::AtomicUsize::new(0)));
        (count.clone(), Waker::from(count))
    }

    /// A full mailbox: capacity 1, its place taken by a queued message.
    fn full() -> Arc<Capacity> {
        let c = Capacity::new(1);
        c.force_acquire();
        c
    }

    /// Places taken, read once every thread is joined.
    fn depth(c: &Capacity) -> usize {
        c.depth.load(Ordering::Acquire)
    }

    /// At a full mailbox, a `try_acquire` racing the release of the place
    /// and a sender's `poll_acquire`: when the trier fails and the sender
    /// got `Pending`, the place is free at the end, so the sender must have
    /// been woken (and then gets the place). Fails without the fix: the
    /// trier's over-count fails the sender's re-check after registering,
    /// and its compensating decrement frees the place without a wake.
    #[test]
    fn a_failed_try_acquire_racing_a_release_never_strands_a_waiter() {
        loom::model(|| {
            let c = full();
            let releaser = {
                let c = c.clone();
                thread::spawn(move || c.release(1))
            };
            let trier = {
                let c = c.clone();
                thread::spawn(move || c.try_acquire())
            };
            let (count, waker) = counting_waker();
            let mut cx = Context::from_waker(&waker);
            let mut key = None;
            let polled = c.poll_acquire(&mut cx, &mut key);
            releaser.join().unwrap();
            let tried = trier.join().unwrap();
            assert!(
                !(tried && polled.is_ready()),
                "two places taken at capacity 1"
            );
            if polled.is_pending() && !tried {
                assert!(
                    count.woken(),
                    "lost wake: the place is free, the sender waits"
                );
                assert!(c.poll_acquire(&mut cx, &mut key).is_ready());
            }
            assert_eq!(depth(&c), 1, "the place is taken once (by trier or sender)");
        });
    }

    /// At a full mailbox, a thread frees the place and then `try_acquire`s,
    /// racing another thread's `try_acquire`: from the release on the place
    /// is free and only these two ask for it, so exactly one of them gets
    /// it; both seeing `Full` is spurious. Fails without the fix (the other
    /// thread's transient over-count fails the releaser's attempt).
    #[test]
    fn two_try_acquires_racing_a_release_are_never_both_full() {
        loom::model(|| {
            let c = full();
            let other = {
                let c = c.clone();
                thread::spawn(move || c.try_acquire())
            };
            c.release(1);
            let mine = c.try_acquire();
            let theirs = other.join().unwrap();
            assert!(mine || theirs, "spurious Full: a place was free throughout");
            assert!(!(mine && theirs), "two places taken at capacity 1");
            assert_eq!(depth(&c), 1, "the count is the places taken");
        });
    }

    /// A sender's `poll_acquire` racing the release of a full mailbox's
    /// place: the sender gets the place at once, or registered in time to be
    /// woken, and its next poll gets it.
    #[test]
    fn a_poll_acquire_racing_a_release_gets_the_place_or_is_woken() {
        loom::model(|| {
            let c = full();
            let releaser = {
                let c = c.clone();
                thread::spawn(move || c.release(1))
            };
            let (count, waker) = counting_waker();
            let mut cx = Context::from_waker(&waker);
            let mut key = None;
            let polled = c.poll_acquire(&mut cx, &mut key);
            releaser.join().unwrap();
            if polled.is_pending() {
                assert!(count.woken(), "lost wake: the place was freed");
                assert!(c.poll_acquire(&mut cx, &mut key).is_ready());
            }
            assert_eq!(depth(&c), 1, "the count is the places taken");
        });
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::task::Waker;

    #[test]
    fn a_sender_polled_again_while_full_is_registered_once() {
        let cap = Capacity::new(1);
        assert!(cap.try_acquire());
        struct Nop;
        impl std::task::Wake for Nop {
            fn wake(self: Arc<Self>) {}
        }
        let waker = Waker::from(Arc::new(Nop));
        let mut cx = Context::from_waker(&waker);
        let mut key = None;
        for _ in 0..5 {
            assert!(cap.poll_acquire(&mut cx, &mut key).is_pending());
        }
        assert_eq!(lock(&cap.waiters).len(), 1);
        cap.release(1);
        assert!(cap.poll_acquire(&mut cx, &mut key).is_ready());
    }
}
