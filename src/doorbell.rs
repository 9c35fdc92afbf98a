//! The inbox of a shard and the doorbell protocol that wakes it.
//!
//! An [`Inbox`] is how other shards and outside threads hand work to one
//! shard. It has two ways in:
//!
//! * **Peer rings**, one per other shard: a bounded single-producer,
//!   single-consumer ring of [`PEER_RING_SLOTS`] slots, each slot one cache
//!   line holding the item and its sequence number. A shard publishes its
//!   tick's batch for a peer there, slot by slot, with no lock: the item and
//!   the flag that announces it travel in one line, the one the owner polls.
//!   Only the [`PeerSender`] of that shard pushes into its ring.
//! * **The locked queue**, for threads that are not shards of this runtime and
//!   for a peer whose ring is full. Producers append under a lock; the owner
//!   takes the whole queue in one step.
//!
//! Only the [`InboxReader`] (the owning shard) drains.
//!
//! # Order
//!
//! Several ways in must still deliver in an order that respects causality:
//! an item whose push happened before another's (the same sender's earlier
//! push, or one whose effect the other sender saw: a spawn from the main
//! thread, then a message from a shard that was told of it) must come out
//! first. Every push takes a *stamp* from the inbox's counter (an atomic
//! add, AcqRel: one per batch, and one more for the part of a batch that
//! overflows into the queue; pushes to the locked queue take theirs under the
//! lock, so the queue stays sorted), and the owner delivers what it drains in
//! stamp order:
//!
//! 1. it takes every visible item of every source, and notes the highest
//!    stamp `M` among them;
//! 2. it looks at every source again and also takes the items stamped `M` or
//!    lower that became visible meanwhile;
//! 3. it sorts what it took by stamp (stably: one batch shares a stamp).
//!
//! An item `X` whose push happened before that of a taken item `Y` is taken
//! too: `X`'s stamp is lower, and `X` was published before the counter add of
//! the item stamped `M` (the adds form a chain of release–acquire pairs), which
//! the owner acquired in step 1, so step 2 sees `X`. Items the owner has not
//! taken yet have no push that happened before one it took, so they can only
//! be concurrent with what it delivers now. A ring that is full sends the rest
//! of its batch through the locked queue, stamped later, and its next batches
//! go back to the ring; the stamps keep them in order.
//!
//! # The doorbell protocol
//!
//! A shard that has nothing to do sleeps in `io_uring_enter`. Waking it costs a
//! doorbell: one `IORING_OP_MSG_RING` SQE from a sender's ring, or an external
//! wake from a thread without one. A push is *published* by a ring slot's
//! sequence number (Release) or by the `pending` flag of the locked queue; one
//! more flag makes sure a push is never missed and a sleeping shard is rung
//! once per announcement of sleep, not once per push:
//!
//! * `pending`: set by a producer just after it released the queue lock,
//!   cleared by the owner while it holds the lock and takes the queue. Set, it
//!   means the queue may hold items: a producer whose items an earlier drain
//!   already took leaves it set over an empty queue, which costs the owner one
//!   empty drain and nothing else.
//! * `needs_wake`: set by the owner just before it sleeps; cleared by whichever
//!   side claims the wake-up (the producer that will ring, or the owner itself).
//!   Producers clear it with a compare-exchange, so a producer that loses the
//!   race writes nothing (a blind swap would also be correct under C11, but loom
//!   cannot order its write against the owner's next announcement).
//!
//! Transitions:
//!
//! 1. A producer publishes its items (ring slots, or the queue and `pending`).
//! 2. The producer then loads `needs_wake`; if it is set, it compare-exchanges
//!    it from true to false. The one producer whose exchange succeeded rings the doorbell
//!    ([`Delivery::Ring`]); every other delivery of the burst is coalesced
//!    ([`Delivery::Coalesced`]).
//! 3. The owner, before sleeping, stores `needs_wake = true` and then looks
//!    for published items (`pending`, and the next slot of every ring). If
//!    there are some it withdraws (stores `needs_wake = false`) and does not
//!    sleep.
//! 4. After waking, the owner clears `needs_wake` and drains.
//!
//! Steps 1–2 and step 3 are each a store followed by a SeqCst fence and a load
//! of the other side's, so at least one side sees the other's store (the
//! fences are needed: a ring slot is published by a Release store, which on
//! x86 is a plain move, not a barrier): either the owner sees the items and stays awake, or the producer sees
//! `needs_wake` and rings. A push racing a drain is never missed. At worst a
//! doorbell arrives after the owner withdrew, which only makes its next sleep
//! return early.
//!
//! # Closing
//!
//! `closed` is set once, at shutdown, by the owner, which then takes what is
//! queued. A push that finds it set gets its items back so the caller can drop
//! them. A peer that published ring items checks `closed` after a SeqCst fence
//! (the same store–fence–load pattern): if it is set, it takes back each of
//! those slots the owner has not taken, by a compare-exchange of the slot's
//! sequence number, while the owner's closing drain takes slots by the same
//! compare-exchange, so each item ends up with exactly one side. After
//! closing, the owner's ordinary drain takes nothing (its plain stores would
//! race those take-backs).
//!
//! # Cache lines
//!
//! A spinning owner polls `pending` and each ring's next slot. The lock lives
//! on a line of its own, so a producer's lock, append and unlock do not keep
//! losing their line to those polls (with the lock and the flags on one line,
//! a profile of a cross-shard round trip put most of the push's time on three
//! transfers of that one line). The flags share the second line: `needs_wake`
//! and `closed` are written rarely and read where `pending` is. A ring push
//! writes one line the owner polls; the owner's head lives on a line of its
//! own, and the producer's position is in its [`PeerSender`].
//!
//! The protocol is model-checked with loom (`RUSTFLAGS="--cfg loom" cargo test
//! --lib --release doorbell`); the ring that carries the doorbell is not part of
//! this module.

use std::mem::MaybeUninit;

use crossbeam_utils::CachePadded;

use crate::loom::{
    fence, lock, AtomicBool, AtomicU64, AtomicUsize, Mutex,
    Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst},
    UnsafeCell,
};

/// Slots in each peer ring: how many items one shard can have published to
/// another before it falls back to the locked queue.
pub(crate) const PEER_RING_SLOTS: usize = 64;

/// Ids of inboxes (not part of any protocol: a plain `std` atomic).
static NEXT_INBOX_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// What a producer must do after a push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delivery {
    /// The owner is asleep and this producer claimed the wake-up: ring it.
    Ring,
    /// The owner is awake or another producer already rang it.
    Coalesced,
}

/// The locked queue: stamped items, in stamp order.
type Queue<T> = Vec<(u64, T)>;

/// One slot of a peer ring, one cache line.
///
/// `seq` says what the slot holds for push number `t` (`t ≡ index` modulo the
/// ring size): `t` when it is free for that push, `t + 1` once the item is
/// published, `t + slots` once the owner took it (free for the next lap).
#[repr(align(64))]
struct RingSlot<T> {
    seq: AtomicUsize,
    /// The item and its stamp.
    value: UnsafeCell<MaybeUninit<(u64, T)>>,
}

/// One peer's single-producer ring into this inbox, of `N` slots (a power
/// of two).
struct PeerRing<T, const N: usize> {
    slots: Box<[RingSlot<T>; N]>,
    /// The owner's next take; written by the [`InboxReader`] only, read by
    /// anyone asking whether items wait.
    head: CachePadded<AtomicUsize>,
    /// Whether a [`PeerSender`] exists for this ring.
    sender_made: AtomicBool,
}

impl<T, const N: usize> PeerRing<T, N> {
    fn new() -> Self {
        const { assert!(N.is_power_of_two(), "ring slots must be a power of two") };
        PeerRing {
            slots: Box::new(std::array::from_fn(|i| RingSlot {
                seq: AtomicUsize::new(i),
                value: UnsafeCell::new(MaybeUninit::uninit()),
            })),
            head: CachePadded::new(AtomicUsize::new(0)),
            sender_made: AtomicBool::new(false),
        }
    }

    #[inline]
    fn slot(&self, n: usize) -> &RingSlot<T> {
        &self.slots[n & (N - 1)]
    }

    /// Whether the owner's next slot holds a published item.
    #[inline]
    fn has_next(&self) -> bool {
        let head = self.head.load(Relaxed);
        self.slot(head).seq.load(Acquire) == head.wrapping_add(1)
    }

    /// Moves the published items stamped `max` or lower into `out`, in
    /// order; returns how many. Owner only (the [`InboxReader`], or the
    /// ring's drop).
    fn take_published(&self, max: u64, out: &mut Vec<(u64, T)>) -> usize {
        let start = self.head.load(Relaxed);
        let mut head = start;
        loop {
            let slot = self.slot(head);
            if slot.seq.load(Acquire) != head.wrapping_add(1) {
                break;
            }
            // SAFETY: the Acquire load saw the producer's Release of this
            // push: the value is initialised, and until the store below hands
            // the slot back the producer does not touch it. The inbox is not
            // closed (`drain_into` checks, and only this reader closes it; the
            // ring's drop has `&mut`), so no producer takes the item back.
            let stamp = slot.value.with(|p| unsafe { (*p).assume_init_ref().0 });
            if stamp > max {
                break;
            }
            // SAFETY: as above; read once, then the slot is handed back.
            out.push(slot.value.with(|p| unsafe { (*p).assume_init_read() }));
            slot.seq.store(head.wrapping_add(N), Release);
            head = head.wrapping_add(1);
        }
        if head != start {
            self.head.store(head, Relaxed);
        }
        head.wrapping_sub(start)
    }
}

// SAFETY: the ring moves `T`s from its one producer thread to the owner's
// thread (`T: Send`); each slot's value is accessed by one side at a time, as
// its sequence number hands it over (Release store, Acquire load).
unsafe impl<T: Send, const N: usize> Sync for PeerRing<T, N> {}
// SAFETY: as above; the ring owns the published items it holds.
unsafe impl<T: Send, const N: usize> Send for PeerRing<T, N> {}

impl<T, const N: usize> Drop for PeerRing<T, N> {
    fn drop(&mut self) {
        // Items published and never taken (an inbox dropped without closing).
        let mut rest = Vec::new();
        self.take_published(u64::MAX, &mut rest);
    }
}

/// The ways into one shard, with its doorbell flags; peer rings of `N` slots.
pub(crate) struct Inbox<T, const N: usize = PEER_RING_SLOTS> {
    /// On a line of its own, away from the flags a spinning owner polls.
    queue: CachePadded<Mutex<Queue<T>>>,
    pending: AtomicBool,
    needs_wake: AtomicBool,
    closed: AtomicBool,
    reader_made: AtomicBool,
    /// The next push's stamp (module docs, "Order"); a line of its own, as
    /// producers write it and the owner never reads it.
    next_stamp: CachePadded<AtomicU64>,
    /// Unique in the process: a sender or reader works only on the inbox
    /// that made it (an address could be reused by a later inbox).
    id: u64,
    /// The owning shard's index: it has no ring of its own.
    owner: usize,
    /// One per other shard of the runtime, in shard order without `owner`.
    rings: Box<[PeerRing<T, N>]>,
}

impl<T, const N: usize> std::fmt::Debug for Inbox<T, N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox")
            .field("pending", &self.pending)
            .field("needs_wake", &self.needs_wake)
            .field("closed", &self.closed)
            .field("rings", &self.rings.len())
            .finish_non_exhaustive()
    }
}

impl<T, const N: usize> Inbox<T, N> {
    /// The inbox of shard `owner` in a runtime of `shards` shards: a ring for
    /// each other shard.
    pub(crate) fn new(owner: usize, shards: usize) -> Self {
        Inbox {
            queue: CachePadded::new(Mutex::new(Vec::new())),
            pending: AtomicBool::new(false),
            needs_wake: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            reader_made: AtomicBool::new(false),
            next_stamp: CachePadded::new(AtomicU64::new(0)),
            id: NEXT_INBOX_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            owner,
            rings: (0..shards.saturating_sub(1))
                .map(|_| PeerRing::new())
                .collect(),
        }
    }

    /// The ring of sending shard `src`, if it has one.
    fn ring_of(&self, src: usize) -> Option<&PeerRing<T, N>> {
        match src.cmp(&self.owner) {
            std::cmp::Ordering::Less => self.rings.get(src),
            std::cmp::Ordering::Equal => None,
            std::cmp::Ordering::Greater => self.rings.get(src - 1),
        }
    }

    /// The sending side of peer `src`'s ring; `None` if it was made already
    /// (a ring has one producer) or `src` has no ring.
    pub(crate) fn peer_sender(&self, src: usize) -> Option<PeerSender> {
        let ring = self.ring_of(src)?;
        if ring.sender_made.swap(true, SeqCst) {
            return None;
        }
        Some(PeerSender {
            inbox: self.id,
            src,
            tail: 0,
        })
    }

    /// The draining side; `None` if it was made already.
    pub(crate) fn reader(&self) -> Option<InboxReader<T>> {
        if self.reader_made.swap(true, SeqCst) {
            return None;
        }
        Some(InboxReader {
            inbox: self.id,
            staged: Vec::new(),
        })
    }

    /// Appends one item to the locked queue and says whether to ring; gives
    /// it back when closed.
    pub(crate) fn push(&self, item: T) -> Result<Delivery, T> {
        {
            let mut queue = lock(&self.queue);
            if self.closed.load(SeqCst) {
                return Err(item);
            }
            let stamp = self.take_stamp();
            queue.push((stamp, item));
        }
        // After the unlock: an owner that sees the flag finds the lock free.
        self.pending.store(true, SeqCst);
        Ok(self.claim_wake())
    }

    /// The next stamp (module docs, "Order"). AcqRel: each add reads the
    /// previous one's, so what was published before an add is visible to
    /// whoever acquires an item stamped later.
    #[inline]
    fn take_stamp(&self) -> u64 {
        self.next_stamp.fetch_add(1, AcqRel)
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

    /// Whether items wait (a cheap check for spinning owners).
    #[inline]
    pub(crate) fn has_pending(&self) -> bool {
        self.pending.load(SeqCst) || self.rings.iter().any(PeerRing::has_next)
    }

    /// Whether the owner announced it is about to sleep or sleeps.
    pub(crate) fn is_sleeping(&self) -> bool {
        self.needs_wake.load(SeqCst)
    }

    /// Owner side, step 3: announces sleep. Returns `true` when the owner may sleep.
    pub(crate) fn prepare_park(&self) -> bool {
        self.needs_wake.store(true, SeqCst);
        fence(SeqCst);
        if self.has_pending() {
            self.needs_wake.store(false, SeqCst);
            return false;
        }
        true
    }

    /// Owner side, step 4 (and withdrawal): the owner is awake again.
    pub(crate) fn unpark(&self) {
        self.needs_wake.store(false, SeqCst);
    }

    /// The closing drain: takes each published slot by compare-exchange,
    /// racing producers that take theirs back (module docs, "Closing").
    fn drain_rings_closing(&self, out: &mut Vec<(u64, T)>) {
        for ring in self.rings.iter() {
            let mut head = ring.head.load(Relaxed);
            loop {
                let slot = ring.slot(head);
                if slot
                    .seq
                    .compare_exchange(head.wrapping_add(1), head.wrapping_add(N), SeqCst, SeqCst)
                    .is_err()
                {
                    break;
                }
                // SAFETY: the exchange took the published item for us; the
                // producer's own exchange on this slot will fail.
                out.push(slot.value.with(|p| unsafe { (*p).assume_init_read() }));
                head = head.wrapping_add(1);
            }
            ring.head.store(head, Relaxed);
        }
    }
}

/// The one producer of a peer ring: the sending shard keeps it, with its
/// position, for the life of the runtime.
#[derive(Debug)]
pub(crate) struct PeerSender {
    /// The id of the inbox that made it.
    inbox: u64,
    src: usize,
    /// The number of the next push into the ring.
    tail: usize,
}

impl PeerSender {
    /// Appends every item of `batch` (leaving it empty) and says whether to ring.
    ///
    /// Returns `Err(())` when the inbox is closed, with the items it did not
    /// take left in `batch`.
    ///
    /// # Panics
    ///
    /// If `inbox` is not the inbox that made this sender.
    pub(crate) fn push_batch<T, const N: usize>(
        &mut self,
        inbox: &Inbox<T, N>,
        batch: &mut Vec<T>,
    ) -> Result<Delivery, ()> {
        assert_eq!(
            self.inbox, inbox.id,
            "a peer sender pushes into its own inbox"
        );
        if batch.is_empty() {
            return Ok(Delivery::Coalesced);
        }
        if inbox.closed.load(SeqCst) {
            return Err(());
        }
        let ring = inbox.ring_of(self.src).expect("made for a ring");
        let first = self.tail;
        let stamp = inbox.take_stamp();
        let mut items = batch.drain(..);
        let mut rest = None;
        for item in items.by_ref() {
            let slot = ring.slot(self.tail);
            if slot.seq.load(Acquire) != self.tail {
                rest = Some(item);
                break;
            }
            // SAFETY: `seq == tail` (Acquire, pairing with the owner's Release
            // when it took the previous lap's item): the slot is free, and we
            // are its one producer (a `PeerSender` is made once per ring).
            slot.value
                .with_mut(|p| unsafe { (*p).write((stamp, item)) });
            slot.seq.store(self.tail.wrapping_add(1), Release);
            self.tail = self.tail.wrapping_add(1);
        }
        let mut refused = Vec::new();
        if let Some(item) = rest {
            // The ring is full: the rest goes through the queue, stamped
            // later than what went into the ring.
            let mut queue = lock(&inbox.queue);
            if inbox.closed.load(SeqCst) {
                refused.push(item);
                refused.extend(items);
            } else {
                let stamp = inbox.take_stamp();
                queue.push((stamp, item));
                queue.extend(items.map(|item| (stamp, item)));
                drop(queue);
                inbox.pending.store(true, SeqCst);
            }
        } else {
            drop(items);
        }
        let delivery = inbox.claim_wake();
        // `claim_wake` fenced after our publications: either the closing
        // owner's drain sees them, or we see `closed` here and take back
        // whatever it has not taken.
        if self.tail != first && inbox.closed.load(SeqCst) {
            let mut n = first;
            while n != self.tail {
                let slot = ring.slot(n);
                if slot
                    .seq
                    .compare_exchange(n.wrapping_add(1), n, SeqCst, SeqCst)
                    .is_ok()
                {
                    // SAFETY: the exchange took our published item back
                    // before the owner took it; the owner's fails.
                    batch.push(slot.value.with(|p| unsafe { (*p).assume_init_read() }).1);
                }
                n = n.wrapping_add(1);
            }
        }
        batch.append(&mut refused);
        if batch.is_empty() {
            Ok(delivery)
        } else {
            Err(())
        }
    }
}

/// The draining side of an inbox, kept by its shard.
pub(crate) struct InboxReader<T> {
    /// The id of the inbox that made it.
    inbox: u64,
    /// Stamped items between taking and sorting (kept for its buffer).
    staged: Vec<(u64, T)>,
}

impl<T> std::fmt::Debug for InboxReader<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InboxReader").finish_non_exhaustive()
    }
}

impl<T> InboxReader<T> {
    fn check<const N: usize>(&self, inbox: &Inbox<T, N>) {
        assert_eq!(self.inbox, inbox.id, "an inbox reader drains its own inbox");
    }

    /// Moves every waiting item into `out`, in an order that respects
    /// causality (module docs, "Order"); returns the count.
    ///
    /// # Panics
    ///
    /// If `inbox` is not the inbox that made this reader.
    pub(crate) fn drain_into<const N: usize>(
        &mut self,
        inbox: &Inbox<T, N>,
        out: &mut Vec<T>,
    ) -> usize {
        self.check(inbox);
        // After `close` the producers' take-backs decide slots by
        // compare-exchange, which this drain's plain stores would race:
        // nothing more is taken (the closing drains took what was there).
        if inbox.closed.load(SeqCst) {
            return 0;
        }
        let staged = &mut self.staged;
        debug_assert!(staged.is_empty());
        // Step 1: everything visible, and the highest stamp.
        let mut sources = 0;
        let mut max = 0;
        for ring in inbox.rings.iter() {
            if ring.take_published(u64::MAX, staged) > 0 {
                sources += 1;
                max = max.max(staged.last().map_or(0, |(stamp, _)| *stamp));
            }
        }
        if inbox.pending.load(SeqCst) {
            let mut queue = lock(&inbox.queue);
            inbox.pending.store(false, SeqCst);
            if let Some((stamp, _)) = queue.last() {
                max = max.max(*stamp);
                sources += 1;
                staged.append(&mut queue);
            }
        }
        if sources == 0 {
            return 0;
        }
        // Step 2: what became visible meanwhile, up to that stamp.
        for ring in inbox.rings.iter() {
            if ring.take_published(max, staged) > 0 {
                sources += 1;
            }
        }
        if inbox.pending.load(SeqCst) {
            let mut queue = lock(&inbox.queue);
            let upto = queue.partition_point(|(stamp, _)| *stamp <= max);
            if upto > 0 {
                sources += 1;
                staged.extend(queue.drain(..upto));
            }
            if queue.is_empty() {
                inbox.pending.store(false, SeqCst);
            }
        }
        // Step 3: stamp order (stable: a batch shares its stamp).
        if sources > 1 {
            staged.sort_by_key(|(stamp, _)| *stamp);
        }
        let n = staged.len();
        out.extend(staged.drain(..).map(|(_, item)| item));
        n
    }

    /// Closes the inbox and returns what was still queued.
    ///
    /// # Panics
    ///
    /// If `inbox` is not the inbox that made this reader.
    pub(crate) fn close<const N: usize>(&mut self, inbox: &Inbox<T, N>) -> Vec<T> {
        self.check(inbox);
        let mut queue = lock(&inbox.queue);
        inbox.closed.store(true, SeqCst);
        inbox.pending.store(false, SeqCst);
        fence(SeqCst);
        let mut taken = Vec::new();
        inbox.drain_rings_closing(&mut taken);
        taken.append(&mut queue);
        taken.sort_by_key(|(stamp, _)| *stamp);
        taken.into_iter().map(|(_, item)| item).collect()
    }
}
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::atomic::AtomicUsize;
    use loom::sync::{Arc, Notify};
    use loom::thread;

    /// Drains until `want` items arrived, sleeping on `bell` when the inbox
    /// lets it; returns the items and how many times it announced sleep.
    fn drain_until<T, const N: usize>(
        inbox: &Inbox<T, N>,
        reader: &mut InboxReader<T>,
        bell: &Notify,
        want: usize,
    ) -> (Vec<T>, usize) {
        let mut got = Vec::new();
        let mut announcements = 0;
        loop {
            reader.drain_into(inbox, &mut got);
            if got.len() == want {
                return (got, announcements);
            }
            announcements += 1;
            if inbox.prepare_park() {
                bell.wait();
                inbox.unpark();
            }
        }
    }

    /// Runs `push` on a new thread as peer 0 of `inbox`, with its sender.
    fn spawn_peer<const N: usize, R: 'static>(
        inbox: &Arc<Inbox<u8, N>>,
        push: impl FnOnce(&Inbox<u8, N>, &mut PeerSender) -> R + 'static,
    ) -> thread::JoinHandle<R> {
        let inbox = inbox.clone();
        let mut sender = inbox.peer_sender(0).unwrap();
        thread::spawn(move || push(&inbox, &mut sender))
    }

    /// An outside producer (locked queue) and a peer (ring) push while the
    /// owner drains and sleeps; every item must arrive and the owner must
    /// never sleep through a push (loom reports a deadlock if it does). The
    /// doorbell is a `Notify`: a ring that arrives before the owner sleeps
    /// leaves a permit, as a MSG_RING CQE would.
    #[test]
    fn no_push_is_missed_and_one_ring_per_announcement() {
        let mut model = loom::model::Builder::new();
        model.preemption_bound = Some(4);
        model.check(|| {
            let inbox = Arc::new(Inbox::<_, 2>::new(1, 2));
            let mut reader = inbox.reader().unwrap();
            let bell = Arc::new(Notify::new());
            let rung = Arc::new(AtomicUsize::new(0));
            let outside = {
                let (inbox, bell, rung) = (inbox.clone(), bell.clone(), rung.clone());
                thread::spawn(move || {
                    if inbox.push(0u32).unwrap() == Delivery::Ring {
                        rung.fetch_add(1, SeqCst);
                        bell.notify();
                    }
                })
            };
            let peer = {
                let (inbox, bell, rung) = (inbox.clone(), bell.clone(), rung.clone());
                let mut sender = inbox.peer_sender(0).unwrap();
                thread::spawn(move || {
                    if sender.push_batch(&inbox, &mut vec![1u32]).unwrap() == Delivery::Ring {
                        rung.fetch_add(1, SeqCst);
                        bell.notify();
                    }
                })
            };
            let (mut got, announcements) = drain_until(&inbox, &mut reader, &bell, 2);
            outside.join().unwrap();
            peer.join().unwrap();
            got.sort_unstable();
            assert_eq!(got, vec![0, 1]);
            // Each doorbell claims one announcement of sleep: never one per push.
            assert!(rung.load(SeqCst) <= announcements);
        });
    }

    /// A batch pushed while the owner announces sleep (part in the ring, the
    /// rest overflowing into the queue) is either seen by the owner's check or
    /// rung for, and arrives in order.
    #[test]
    fn batch_racing_announcement_is_seen_or_rung() {
        loom::model(|| {
            let inbox = Arc::new(Inbox::<_, 2>::new(1, 2));
            let mut reader = inbox.reader().unwrap();
            let producer = spawn_peer(&inbox, |inbox, sender| {
                sender.push_batch(inbox, &mut vec![1, 2, 3]).unwrap()
            });
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
            reader.drain_into(&inbox, &mut out);
            assert_eq!(out, vec![1, 2, 3]);
        });
    }

    /// A peer overflows its ring, keeps pushing while the owner drains, and
    /// every item comes out in the order pushed.
    #[test]
    fn overflow_keeps_a_peers_order() {
        let mut model = loom::model::Builder::new();
        model.preemption_bound = Some(3);
        model.check(|| {
            let inbox = Arc::new(Inbox::<_, 2>::new(1, 2));
            let mut reader = inbox.reader().unwrap();
            let bell = Arc::new(Notify::new());
            let peer_bell = bell.clone();
            let producer = spawn_peer(&inbox, move |inbox, sender| {
                for mut batch in [vec![1, 2, 3], vec![4], vec![5]] {
                    if sender.push_batch(inbox, &mut batch).unwrap() == Delivery::Ring {
                        peer_bell.notify();
                    }
                }
            });
            let (got, _) = drain_until(&inbox, &mut reader, &bell, 5);
            producer.join().unwrap();
            assert_eq!(got, vec![1, 2, 3, 4, 5]);
        });
    }

    /// Pushes `first` through one way in, then (once that push is done, as
    /// another thread sees it) `second` through another; the owner must
    /// deliver them in that order. Ways in: `None` is the locked queue,
    /// `Some(src)` peer `src`'s ring.
    fn causal_pair(first: Option<usize>, second: Option<usize>) {
        let mut model = loom::model::Builder::new();
        model.preemption_bound = Some(3);
        model.check(move || {
            let inbox = Arc::new(Inbox::<_, 2>::new(2, 3));
            let mut reader = inbox.reader().unwrap();
            let bell = Arc::new(Notify::new());
            let done = Arc::new(AtomicBool::new(false));
            let push = move |way: Option<usize>, inbox: &Inbox<u8, 2>, bell: &Notify, item: u8| {
                let delivery = match way {
                    None => inbox.push(item).unwrap(),
                    Some(src) => {
                        let mut sender = inbox.peer_sender(src).unwrap();
                        sender.push_batch(inbox, &mut vec![item]).unwrap()
                    }
                };
                if delivery == Delivery::Ring {
                    bell.notify();
                }
            };
            let earlier = {
                let (inbox, bell, done) = (inbox.clone(), bell.clone(), done.clone());
                thread::spawn(move || {
                    push(first, &inbox, &bell, 1);
                    done.store(true, Release);
                })
            };
            let later = {
                let (inbox, bell, done) = (inbox.clone(), bell.clone(), done.clone());
                thread::spawn(move || {
                    while !done.load(Acquire) {
                        thread::yield_now();
                    }
                    push(second, &inbox, &bell, 2);
                })
            };
            let (got, _) = drain_until(&inbox, &mut reader, &bell, 2);
            earlier.join().unwrap();
            later.join().unwrap();
            assert_eq!(got, vec![1, 2]);
        });
    }

    /// A spawn sent from outside, then a message from a shard that heard of it.
    #[test]
    fn a_queue_push_then_a_ring_push_arrive_in_order() {
        causal_pair(None, Some(0));
    }

    /// A message from a shard, then one from outside that saw it sent.
    #[test]
    fn a_ring_push_then_a_queue_push_arrive_in_order() {
        causal_pair(Some(0), None);
    }

    /// Shard 1 publishes, then shard 0, whose ring the owner reads first: a
    /// drain that finds both must still deliver shard 1's first (the stamp
    /// sort; without it this model fails).
    #[test]
    fn pushes_through_two_rings_arrive_in_causal_order() {
        causal_pair(Some(1), Some(0));
    }

    /// A peer publishing while the owner closes (and then drains): each item
    /// ends up exactly once, in the owner's closing drain or back with the
    /// peer.
    #[test]
    fn close_racing_a_ring_push_loses_and_doubles_nothing() {
        loom::model(|| {
            let inbox = Arc::new(Inbox::<_, 4>::new(1, 2));
            let mut reader = inbox.reader().unwrap();
            let producer = spawn_peer(&inbox, |inbox, sender| {
                let mut batch = vec![1, 2];
                let _ = sender.push_batch(inbox, &mut batch);
                batch
            });
            let mut closed = reader.close(&inbox);
            // A drain after closing (a drop run by the shutdown may ask for
            // one) must not take what the peer is taking back.
            let mut late = Vec::new();
            reader.drain_into(&inbox, &mut late);
            let back = producer.join().unwrap();
            closed.extend(late);
            closed.extend(back);
            closed.sort_unstable();
            assert_eq!(closed, vec![1, 2]);
        });
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    use super::*;

    #[test]
    fn sleeping_owner_is_rung_once_per_burst() {
        let inbox = Inbox::<_>::new(0, 2);
        let mut reader = inbox.reader().unwrap();
        let mut sender = inbox.peer_sender(1).unwrap();
        assert!(inbox.prepare_park());
        assert_eq!(inbox.push(1), Ok(Delivery::Ring));
        assert_eq!(inbox.push(2), Ok(Delivery::Coalesced));
        let mut batch = vec![3, 4];
        assert_eq!(
            sender.push_batch(&inbox, &mut batch),
            Ok(Delivery::Coalesced)
        );
        assert!(batch.is_empty());
        inbox.unpark();
        let mut out = Vec::new();
        assert_eq!(reader.drain_into(&inbox, &mut out), 4);
        // In push order, across the queue and the ring.
        assert_eq!(out, vec![1, 2, 3, 4]);
        assert!(!inbox.has_pending());
    }

    #[test]
    fn owner_with_pending_items_does_not_sleep() {
        let inbox = Inbox::<_>::new(1, 2);
        assert_eq!(inbox.push(1), Ok(Delivery::Coalesced));
        assert!(!inbox.prepare_park());
        assert!(!inbox.is_sleeping());

        let inbox = Inbox::<_>::new(1, 2);
        let mut sender = inbox.peer_sender(0).unwrap();
        sender.push_batch(&inbox, &mut vec![1]).unwrap();
        assert!(inbox.has_pending());
        assert!(!inbox.prepare_park());
    }

    #[test]
    fn each_ring_has_one_sender_and_the_inbox_one_reader() {
        let inbox = Inbox::<u8>::new(1, 3);
        assert!(inbox.peer_sender(0).is_some());
        assert!(inbox.peer_sender(0).is_none());
        assert!(inbox.peer_sender(2).is_some());
        // The owner sends itself nothing through the inbox.
        assert!(inbox.peer_sender(1).is_none());
        assert!(inbox.peer_sender(3).is_none());
        assert!(inbox.reader().is_some());
        assert!(inbox.reader().is_none());
    }

    /// Batches of every size through a small ring, drained at odd moments:
    /// the peer's order holds through overflow into the queue and back.
    #[test]
    fn a_peers_order_holds_through_overflow_and_back() {
        let inbox = Inbox::<_, 4>::new(1, 2);
        let mut reader = inbox.reader().unwrap();
        let mut sender = inbox.peer_sender(0).unwrap();
        let mut next = 0u32;
        let mut got = Vec::new();
        for round in 0..200u32 {
            let size = (round * 7 + 3) % 11;
            let mut batch: Vec<u32> = (next..next + size).collect();
            next += size;
            sender.push_batch(&inbox, &mut batch).unwrap();
            assert!(batch.is_empty());
            // An outside item now and then, in the queue beside the peer's.
            if round % 5 == 0 {
                inbox.push(u32::MAX).unwrap();
            }
            if round % 3 != 1 {
                reader.drain_into(&inbox, &mut got);
            }
        }
        reader.drain_into(&inbox, &mut got);
        got.retain(|&x| x != u32::MAX);
        assert_eq!(got, (0..next).collect::<Vec<_>>());
    }

    #[test]
    fn a_drained_ring_takes_a_new_lap_without_the_queue() {
        let inbox = Inbox::<_, 4>::new(1, 2);
        let mut reader = inbox.reader().unwrap();
        let mut sender = inbox.peer_sender(0).unwrap();
        let mut out = Vec::new();
        for lap in 0..10u32 {
            sender
                .push_batch(&inbox, &mut (lap * 4..lap * 4 + 4).collect())
                .unwrap();
            // A full ring, nothing in the queue.
            assert!(!inbox.pending.load(SeqCst));
            reader.drain_into(&inbox, &mut out);
        }
        assert_eq!(out, (0..40).collect::<Vec<_>>());
    }

    #[test]
    fn closed_inbox_returns_items() {
        let inbox = Inbox::<_, 2>::new(1, 2);
        let mut reader = inbox.reader().unwrap();
        let mut sender = inbox.peer_sender(0).unwrap();
        inbox.push(7).unwrap();
        sender.push_batch(&inbox, &mut vec![1, 2, 3]).unwrap();
        assert_eq!(reader.close(&inbox), vec![7, 1, 2, 3]);
        assert_eq!(inbox.push(8), Err(8));
        let mut batch = vec![9];
        assert!(sender.push_batch(&inbox, &mut batch).is_err());
        assert_eq!(batch, vec![9]);
        assert!(reader.close(&inbox).is_empty());
    }

    /// Counts its drops.
    struct Tracked(Arc<AtomicUsize>);

    impl Drop for Tracked {
        fn drop(&mut self) {
            self.0.fetch_add(1, SeqCst);
        }
    }

    #[test]
    fn a_dropped_inbox_drops_what_its_rings_hold() {
        let drops = Arc::new(AtomicUsize::new(0));
        let inbox = Inbox::<_, 4>::new(1, 2);
        let mut reader = inbox.reader().unwrap();
        let mut sender = inbox.peer_sender(0).unwrap();
        let mut batch: Vec<_> = (0..3).map(|_| Tracked(drops.clone())).collect();
        sender.push_batch(&inbox, &mut batch).unwrap();
        let mut out = Vec::new();
        reader.drain_into(&inbox, &mut out);
        drop(out);
        assert_eq!(drops.load(SeqCst), 3);
        let mut batch: Vec<_> = (0..2).map(|_| Tracked(drops.clone())).collect();
        sender.push_batch(&inbox, &mut batch).unwrap();
        drop(inbox);
        assert_eq!(drops.load(SeqCst), 5);
    }
}
