//! The inbox of a shard and the doorbell protocol that wakes it.
//!
//! An [`Inbox`] is the multi-producer, single-consumer queue through which other
//! shards and outside threads hand work to one shard. Producers append whole
//! batches (one lock per batch, not per item); the owning shard swaps the queue
//! out in one step.
//!
//! # The doorbell protocol
//!
//! A shard that has nothing to do sleeps in `io_uring_enter`. Waking it costs a
//! doorbell: one `IORING_OP_MSG_RING` SQE from a sender's ring, or an external
//! wake from a thread without one. Two flags make sure a sleeping shard is rung
//! exactly once per burst and a push is never missed:
//!
//! * `pending`: set by a producer while it holds the queue lock, cleared by the
//!   owner while it holds the lock and takes the queue. It may be set only when
//!   the queue is non-empty.
//! * `needs_wake`: set by the owner just before it sleeps; cleared by whichever
//!   side claims the wake-up (the producer that will ring, or the owner itself).
//!   Producers clear it with a compare-exchange, so a producer that loses the
//!   race writes nothing (a blind swap would also be correct under C11, but loom
//!   cannot order its write against the owner's next announcement).
//!
//! Transitions:
//!
//! 1. A producer appends under the lock and sets `pending` (SeqCst).
//! 2. The producer then loads `needs_wake`; if it is set, it compare-exchanges
//!    it from true to false. The one producer whose exchange succeeded rings the doorbell
//!    ([`Delivery::Ring`]); every other delivery of the burst is coalesced
//!    ([`Delivery::Coalesced`]).
//! 3. The owner, before sleeping, stores `needs_wake = true` and then loads
//!    `pending`. If `pending` is set it withdraws (stores `needs_wake = false`)
//!    and does not sleep.
//! 4. After waking, the owner clears `needs_wake` and drains.
//!
//! Steps 1–2 and step 3 are each a store followed by a SeqCst fence and a load
//! of the other flag (the fences are what loom models; on x86 the SeqCst
//! stores already are full barriers), so at least one side sees the other's store: either the owner sees
//! `pending` and stays awake, or the producer sees `needs_wake` and rings. A push
//! racing a drain is never missed. At worst a doorbell arrives after the owner
//! withdrew, which only makes its next sleep return early.
//!
//! `closed` is set once, at shutdown, under the lock; later pushes get their
//! items back so the caller can drop them.
//!
//! The protocol is model-checked with loom (`RUSTFLAGS="--cfg loom" cargo test
//! --lib --release doorbell`); the ring that carries the doorbell is not part of
//! this module.

use crate::loom::{fence, lock, AtomicBool, Mutex, Ordering::SeqCst};

/// What a producer must do after a push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delivery {
    /// The owner is asleep and this producer claimed the wake-up: ring it.
    Ring,
    /// The owner is awake or another producer already rang it.
    Coalesced,
}

/// A multi-producer queue drained by one shard, with its doorbell flags.
#[derive(Debug)]
pub(crate) struct Inbox<T> {
    queue: Mutex<Vec<T>>,
    pending: AtomicBool,
    needs_wake: AtomicBool,
    closed: AtomicBool,
}

impl<T> Inbox<T> {
    pub(crate) fn new() -> Self {
        Inbox {
            queue: Mutex::new(Vec::new()),
            pending: AtomicBool::new(false),
            needs_wake: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        }
    }

    /// Appends every item of `batch` (leaving it empty) and says whether to ring.
    ///
    /// Returns `Err(())` with `batch` untouched when the inbox is closed.
    pub(crate) fn push_batch(&self, batch: &mut Vec<T>) -> Result<Delivery, ()> {
        if batch.is_empty() {
            return Ok(Delivery::Coalesced);
        }
        {
            let mut queue = lock(&self.queue);
            if self.closed.load(SeqCst) {
                return Err(());
            }
            if queue.is_empty() {
                std::mem::swap(&mut *queue, batch);
            } else {
                queue.append(batch);
            }
            self.pending.store(true, SeqCst);
        }
        Ok(self.claim_wake())
    }

    /// Appends one item and says whether to ring; gives it back when closed.
    pub(crate) fn push(&self, item: T) -> Result<Delivery, T> {
        {
            let mut queue = lock(&self.queue);
            if self.closed.load(SeqCst) {
                return Err(item);
            }
            queue.push(item);
            self.pending.store(true, SeqCst);
        }
        Ok(self.claim_wake())
    }

    /// Claims the wake-up of a sleeping owner without pushing anything.
    ///
    /// Used to ask an idle shard to come and steal work.
    pub(crate) fn claim_wake(&self) -> Delivery {
        fence(SeqCst);
        if self.needs_wake.load(SeqCst)
            && self
                .needs_wake
                .compare_exchange(true, false, SeqCst, SeqCst)
                .is_ok()
        {
            Delivery::Ring
        } else {
            Delivery::Coalesced
        }
    }

    /// Whether items are waiting (a cheap check for spinning owners).
    pub(crate) fn has_pending(&self) -> bool {
        self.pending.load(SeqCst)
    }

    /// Whether the owner announced it is about to sleep or sleeps.
    pub(crate) fn is_sleeping(&self) -> bool {
        self.needs_wake.load(SeqCst)
    }

    /// Moves every waiting item into `out` (which should be empty); returns the count.
    pub(crate) fn drain_into(&self, out: &mut Vec<T>) -> usize {
        if !self.pending.load(SeqCst) {
            return 0;
        }
        let mut queue = lock(&self.queue);
        self.pending.store(false, SeqCst);
        if out.is_empty() {
            std::mem::swap(&mut *queue, out);
        } else {
            out.append(&mut queue);
        }
        out.len()
    }

    /// Owner side, step 3: announces sleep. Returns `true` when the owner may sleep.
    pub(crate) fn prepare_park(&self) -> bool {
        self.needs_wake.store(true, SeqCst);
        fence(SeqCst);
        if self.pending.load(SeqCst) {
            self.needs_wake.store(false, SeqCst);
            return false;
        }
        true
    }

    /// Owner side, step 4 (and withdrawal): the owner is awake again.
    pub(crate) fn unpark(&self) {
        self.needs_wake.store(false, SeqCst);
    }

    /// Closes the inbox and returns what was still queued.
    pub(crate) fn close(&self) -> Vec<T> {
        let mut queue = lock(&self.queue);
        self.closed.store(true, SeqCst);
        self.pending.store(false, SeqCst);
        std::mem::take(&mut *queue)
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::atomic::AtomicUsize;
    use loom::sync::{Arc, Notify};
    use loom::thread;

    /// Two producers push while the owner drains and sleeps; every item must
    /// arrive and the owner must never sleep through a push (loom reports a
    /// deadlock if it does). The doorbell is a `Notify`: a ring that arrives
    /// before the owner sleeps leaves a permit, as a MSG_RING CQE would.
    #[test]
    fn no_push_is_missed_and_one_ring_per_announcement() {
        let mut model = loom::model::Builder::new();
        model.preemption_bound = Some(4);
        model.check(|| {
            let inbox = Arc::new(Inbox::new());
            let bell = Arc::new(Notify::new());
            let rung = Arc::new(AtomicUsize::new(0));
            let mut producers = Vec::new();
            for p in 0..2u32 {
                let (inbox, bell, rung) = (inbox.clone(), bell.clone(), rung.clone());
                producers.push(thread::spawn(move || {
                    if inbox.push(p).unwrap() == Delivery::Ring {
                        rung.fetch_add(1, SeqCst);
                        bell.notify();
                    }
                }));
            }
            let mut got = Vec::new();
            let mut announcements = 0;
            loop {
                let mut batch = Vec::new();
                inbox.drain_into(&mut batch);
                got.extend(batch);
                if got.len() == 2 {
                    break;
                }
                announcements += 1;
                if inbox.prepare_park() {
                    bell.wait();
                    inbox.unpark();
                }
            }
            for p in producers {
                p.join().unwrap();
            }
            got.sort_unstable();
            assert_eq!(got, vec![0, 1]);
            // Each doorbell claims one announcement of sleep: never one per push.
            assert!(rung.load(SeqCst) <= announcements);
        });
    }

    /// A batch pushed while the owner announces sleep is either seen by the
    /// owner's check or rung for.
    #[test]
    fn batch_racing_announcement_is_seen_or_rung() {
        loom::model(|| {
            let inbox = Arc::new(Inbox::new());
            let producer = {
                let inbox = inbox.clone();
                thread::spawn(move || {
                    let mut batch = vec![1u8, 2, 3];
                    inbox.push_batch(&mut batch).unwrap()
                })
            };
            let may_sleep = inbox.prepare_park();
            let delivery = producer.join().unwrap();
            if may_sleep {
                assert_eq!(
                    delivery,
                    Delivery::Ring,
                    "owner would sleep through the batch"
                );
            }
            let mut out = Vec::new();
            inbox.drain_into(&mut out);
            assert_eq!(out, vec![1, 2, 3]);
        });
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn sleeping_owner_is_rung_once_per_burst() {
        let inbox = Inbox::new();
        assert!(inbox.prepare_park());
        assert_eq!(inbox.push(1), Ok(Delivery::Ring));
        assert_eq!(inbox.push(2), Ok(Delivery::Coalesced));
        let mut batch = vec![3, 4];
        assert_eq!(inbox.push_batch(&mut batch), Ok(Delivery::Coalesced));
        inbox.unpark();
        let mut out = Vec::new();
        assert_eq!(inbox.drain_into(&mut out), 4);
        assert_eq!(out, vec![1, 2, 3, 4]);
    }

    #[test]
    fn owner_with_pending_items_does_not_sleep() {
        let inbox = Inbox::new();
        assert_eq!(inbox.push(1), Ok(Delivery::Coalesced));
        assert!(!inbox.prepare_park());
        assert!(!inbox.is_sleeping());
    }

    #[test]
    fn closed_inbox_returns_items() {
        let inbox = Inbox::new();
        inbox.push(7).unwrap();
        assert_eq!(inbox.close(), vec![7]);
        assert_eq!(inbox.push(8), Err(8));
        let mut batch = vec![9];
        assert!(inbox.push_batch(&mut batch).is_err());
        assert_eq!(batch, vec![9]);
    }
}
