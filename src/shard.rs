//! Shards: one thread, one ring, its run queues, and the loop that drives them.
//!
//! A shard owns (thread-local, no locks): the local run queue of started and
//! pinned tasks, a crossbeam `Worker` deque of unstarted stealable tasks, the
//! ring driver, the timer queue, hot counters, the table of tasks it owns, and
//! the per-destination batches of what it sends to other shards this tick.
//! Other threads reach it only through its [`ShardRemote`]: the inbox (with
//! its doorbell flags), the deque's `Stealer`, its wake target, its published
//! load, and its counters.
//!
//! # The loop
//!
//! ```text
//! loop {
//!     tick: drain inbox → reap CQEs → fire timers → poll up to `task_budget` tasks
//!           → flush per-destination batches (one doorbell per sleeping target) → submit
//!     if the tick did nothing: steal (injector, then peers in random order)
//!     still nothing: spin for the idle budget watching inbox, CQ and peers
//!                    (`IdlePolicy::Poll`: until work shows up, yielding every 32 polls)
//!     still nothing: arm the nearest timer, announce sleep, block in io_uring_enter
//! }
//! ```
//!
//! # Shutdown (numbered as in `Runtime::shutdown`)
//!
//! 1. The runtime sets the shutdown flag and wakes every shard.
//! 2. Each shard closes its inbox (later pushes fail and drop their items),
//!    drops every task it owns or holds, its timers and batches, and submits
//!    what its SQ still holds.
//! 3. All shards and the runtime meet at a barrier: after it no doorbell
//!    targets any ring, and the runtime has closed the external wake gate.
//! 4. Each shard cancels its in-flight operations and waits until none is left.
//! 5. The shard drops its driver, closing its ring and eventfd; the runtime
//!    joins the threads.

use std::cell::{Cell, RefCell, RefMut};
use std::collections::VecDeque;
use std::fmt;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::Instant;

use crossbeam_deque::{Steal, Stealer, Worker};
use crossbeam_utils::CachePadded;
use slab::Slab;

use crate::builder::IdlePolicy;
use crate::doorbell::{Delivery, Inbox, InboxReader, PeerSender};
use crate::driver::uring::UringDriver;
use crate::driver::{Completion, RingFeatures, ShardDriver, WakeTarget};
use crate::hot::{HotState, TinyMessage};
use crate::op::{OpTable, Woken};
use crate::panic::{drop_payload, CallbackKind};
use crate::runtime::Shared;
use crate::stats::ShardCounters;
use crate::task::TaskRef;
use crate::time::queue::TimerQueue;

/// The smallest adaptive spin budget: still longer than a cross-shard round
/// trip while both shards are awake (~0.9 µs measured), see docs/runtime.md.
const SPIN_FLOOR: std::time::Duration = std::time::Duration::from_micros(5);

/// A duration in nanoseconds, `u64::MAX` past what 64 bits hold (a cast
/// would keep the low bits: 2^64 + 1,000 ns would read as 1 µs).
fn saturating_nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Flush a destination's batch early once it holds this many items.
const BATCH_LIMIT: usize = 128;

/// The index of a shard within its runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ShardId(usize);

impl ShardId {
    /// The shard with this index (`0..shards`).
    pub const fn new(index: usize) -> Self {
        ShardId(index)
    }

    /// The shard's index.
    pub const fn index(self) -> usize {
        self.0
    }
}

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "shard {}", self.0)
    }
}

/// Something delivered to a shard through its inbox.
pub(crate) enum InboxItem {
    /// A started or pinned task to run here.
    Task(TaskRef),
    /// An unstarted stealable task for this shard's deque.
    Stealable(TaskRef),
    /// A tiny message that could not travel in a MSG_RING completion.
    Tiny(TinyMessage),
    /// A closure to run here.
    Call(Box<dyn FnOnce() + Send>),
    /// A job that owns (and may recycle) its allocation.
    Job(Box<dyn crate::ShardJob>),
}

/// A callback queued for the end of the current tick.
pub(crate) enum TickEnd {
    Once(Box<dyn FnOnce()>),
    Hook(std::rc::Rc<dyn crate::TickEndHook>, usize),
}

impl TickEnd {
    fn run(self) {
        match self {
            TickEnd::Once(f) => f(),
            TickEnd::Hook(hook, arg) => hook.at_tick_end(arg),
        }
    }
}

impl InboxItem {
    /// Disposes of an item no shard will take (see [`crate::task::Runnable::refuse`]),
    /// counting it in the shutdown tally. `shard` is the index of the shard
    /// running the caller, if any; a closure's or job's `Drop` that panics
    /// is caught and reported.
    pub(crate) fn refuse(self, shared: &Shared, shard: Option<usize>) {
        let tally = &shared.tally;
        match self {
            InboxItem::Task(t) | InboxItem::Stealable(t) => {
                if t.refuse() {
                    tally.tasks_cancelled.fetch_add(1, Ordering::Relaxed);
                }
                shared.guard(shard, CallbackKind::Drop, move || drop(t));
            }
            InboxItem::Tiny(_) => {}
            InboxItem::Call(f) => {
                tally.dropped_unrun.fetch_add(1, Ordering::Relaxed);
                shared.guard(shard, CallbackKind::Drop, move || drop(f));
            }
            InboxItem::Job(job) => {
                tally.dropped_unrun.fetch_add(1, Ordering::Relaxed);
                shared.guard(shard, CallbackKind::Drop, move || drop(job));
            }
        }
    }
}

impl fmt::Debug for InboxItem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InboxItem::Task(_) => f.write_str("Task"),
            InboxItem::Stealable(_) => f.write_str("Stealable"),
            InboxItem::Tiny(m) => f.debug_tuple("Tiny").field(m).finish(),
            InboxItem::Call(_) => f.write_str("Call"),
            InboxItem::Job(_) => f.write_str("Job"),
        }
    }
}

/// The part of a shard that other threads may touch.
///
/// The inbox (written by senders), the published load and the counters
/// (written by the owner) sit on cache lines of their own, so the owner's
/// bookkeeping never bounces the line senders are pushing through.
pub(crate) struct ShardRemote {
    /// Shared with the shard itself and its [`PendingProbe`]s (one load to
    /// reach the pending flag, where `shared.shards[index]` takes several).
    pub(crate) inbox: Arc<CachePadded<Inbox<InboxItem>>>,
    pub(crate) stealer: Stealer<TaskRef>,
    pub(crate) target: WakeTarget,
    pub(crate) features: RingFeatures,
    /// Runnable tasks here, published once per tick for submission-time placement.
    pub(crate) load: CachePadded<AtomicUsize>,
    pub(crate) counters: CachePadded<ShardCounters>,
}

impl fmt::Debug for ShardRemote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShardRemote")
            .field("target", &self.target)
            .field("load", &self.load)
            .finish_non_exhaustive()
    }
}

/// A cheap check, from a shard, for deliveries that other shards published
/// to it and it has not applied yet; see [`crate::receive_pending`].
///
/// Hot same-shard send paths call [`receive_pending`](Self::receive_pending)
/// on a probe they keep: a load of the queue's flag and of each peer ring's
/// next slot, and the full drain only when something is there. Use a probe on
/// the shard it came from.
#[derive(Clone)]
pub struct PendingProbe {
    inbox: Arc<CachePadded<Inbox<InboxItem>>>,
}

impl fmt::Debug for PendingProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PendingProbe")
            .field("pending", &self.inbox.has_pending())
            .finish()
    }
}

impl PendingProbe {
    /// A probe of the calling shard's inbox; `None` off a shard.
    pub fn current() -> Option<PendingProbe> {
        with_current(|shard| PendingProbe {
            inbox: shard.inbox.clone(),
        })
    }

    /// Whether deliveries wait in the probed shard's inbox.
    #[inline]
    pub fn has_pending(&self) -> bool {
        self.inbox.has_pending()
    }

    /// Applies what other shards have delivered here, if anything waits
    /// (as [`crate::receive_pending`], which it calls only then).
    #[inline]
    pub fn receive_pending(&self) {
        if self.inbox.has_pending() {
            with_current(Shard::receive_pending);
        }
    }
}

thread_local! {
    /// The shard this thread runs, while `shard_main` runs it; null otherwise.
    static CURRENT: Cell<*const Shard> = const { Cell::new(std::ptr::null()) };
}

/// Sends and receives a shard may complete at once (a non-blocking
/// `send`/`recv` instead of an operation on the ring) in one tick. An
/// operation that completes at once does not make its task wait, so a task
/// that only sends (or reads a peer that never stops) would never yield:
/// past this many in a tick, they go through the ring (and their tasks wait
/// for the completion, letting the others run), as Tokio's cooperative
/// budget forces a yield.
pub(crate) const IMMEDIATE_IO_PER_TICK: u32 = 128;

/// Whether the calling task may complete a send or receive at once (see
/// [`IMMEDIATE_IO_PER_TICK`]); takes one from the tick's allowance. Off
/// every shard: no.
pub(crate) fn take_immediate_io() -> bool {
    with_current(|s| {
        let left = s.immediate_io.get();
        s.immediate_io.set(left.saturating_sub(1));
        left > 0
    })
    .unwrap_or(false)
}

/// The number of the calling shard's current tick (each starts by taking
/// its inbox and reaping its ring); `None` off every shard.
pub(crate) fn current_tick() -> Option<u64> {
    with_current(|s| s.ticks.get())
}

/// Runs `f` with the shard of the calling thread, if it is a shard thread.
pub(crate) fn with_current<R>(f: impl FnOnce(&Shard) -> R) -> Option<R> {
    let ptr = CURRENT.try_with(Cell::get).ok()?;
    if ptr.is_null() {
        return None;
    }
    // SAFETY: `shard_main` stores a pointer into its own `Rc<Shard>` before it
    // runs the shard and nulls it before that `Rc` is dropped, all on this
    // thread; so a non-null pointer names a live `Shard`. Only shared references
    // are handed out (the shard's mutable state is behind `Cell`/`RefCell`), and
    // the reference cannot outlive `f`.
    Some(f(unsafe { &*ptr }))
}

/// What a shard sends to others during one tick.
#[derive(Default)]
struct Outgoing {
    batches: Vec<Vec<InboxItem>>,
    /// Destinations whose batch is non-empty, in first-use order.
    dirty: Vec<usize>,
    /// Tiny messages: (destination, tag, value or hot sum).
    tiny: Vec<(usize, u16, u64)>,
    /// Doorbells whose MSG_RING failed and must be rung again.
    retry_doorbells: Vec<usize>,
    /// This shard's ring into each peer's inbox (`None` for itself).
    senders: Vec<Option<PeerSender>>,
}

/// The thread-owned state of one shard (see the module docs).
pub(crate) struct Shard {
    index: usize,
    /// `runtime id << 8 | index` (shard indices fit in 8 bits).
    timer_owner: u64,
    pub(crate) shared: Arc<Shared>,
    run_queue: RefCell<VecDeque<TaskRef>>,
    worker: Worker<TaskRef>,
    driver: RefCell<UringDriver>,
    timers: RefCell<TimerQueue>,
    hot: RefCell<HotState>,
    owned: RefCell<Slab<TaskRef>>,
    ops: RefCell<OpTable>,
    outgoing: RefCell<Outgoing>,
    /// Callbacks to run before this tick's batches are published.
    tick_end: RefCell<Vec<TickEnd>>,
    /// The emptied buffer of the last tick-end run, kept so that queueing
    /// the first callback of a tick does not allocate.
    tick_end_spare: RefCell<Vec<TickEnd>>,
    /// This shard's own inbox (the one in its `ShardRemote`).
    inbox: Arc<CachePadded<Inbox<InboxItem>>>,
    /// The draining side of `inbox`.
    reader: RefCell<InboxReader<InboxItem>>,
    inbox_buf: RefCell<Vec<InboxItem>>,
    /// An inbox drain is applying items (no nested drain may overtake them).
    draining: Cell<bool>,
    /// The kind of user code the inbox drain runs now (for a panic's report).
    running: Cell<CallbackKind>,
    completions: RefCell<Vec<Completion>>,
    rng: Cell<u64>,
    ticks: Cell<u64>,
    /// Sends and receives this tick may still complete at once, without
    /// the ring (see [`take_immediate_io`]); refilled each tick.
    immediate_io: Cell<u32>,
    /// The clock as last read by the loop; timers compare against it.
    now: Cell<Instant>,
    next_buf_group: Cell<u16>,
    shutting_down: Cell<bool>,
    /// Moving average of idle-period lengths, in ns; see `spin`.
    idle_avg_ns: Cell<u64>,
    /// When the current idle period began (set by `spin`, read by `park`).
    idle_since: Cell<Option<Instant>>,
    /// Direct descriptors sent here by other rings, by move id (see
    /// `net::DirectStream`).
    arrivals: RefCell<std::collections::HashMap<u64, Arrival>>,
    /// Occupied slots of this ring's direct-descriptor table.
    direct_in_use: Cell<u64>,
}

/// A direct descriptor on its way to this shard.
enum Arrival {
    /// Its receiver waits.
    Waiting(std::task::Waker),
    /// It came (slot, or the error), before its receiver asked.
    Arrived(i32),
    /// Its receiver gave up: close it when it comes.
    Abandoned,
}

impl fmt::Debug for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shard")
            .field("index", &self.index)
            .finish_non_exhaustive()
    }
}

impl Shard {
    fn new(
        index: usize,
        shared: Arc<Shared>,
        worker: Worker<TaskRef>,
        driver: UringDriver,
    ) -> Self {
        let n = shared.shards.len();
        let hot = HotState::new(
            &shared.config.hot_tags,
            shared.config.hot_wake_threshold,
            shared.dynamic_hot.clone(),
        );
        Shard {
            index,
            timer_owner: (shared.id << 8) | index as u64,
            run_queue: RefCell::new(VecDeque::with_capacity(256)),
            worker,
            driver: RefCell::new(driver),
            timers: RefCell::new(TimerQueue::new(shared.now())),
            hot: RefCell::new(hot),
            owned: RefCell::new(Slab::with_capacity(256)),
            ops: RefCell::new(OpTable::default()),
            outgoing: RefCell::new(Outgoing {
                batches: (0..n).map(|_| Vec::new()).collect(),
                senders: (0..n)
                    .map(|dest| {
                        (dest != index).then(|| {
                            shared.shards[dest]
                                .inbox
                                .peer_sender(index)
                                .expect("one sender per shard pair")
                        })
                    })
                    .collect(),
                ..Outgoing::default()
            }),
            tick_end: RefCell::new(Vec::new()),
            tick_end_spare: RefCell::new(Vec::new()),
            inbox: shared.shards[index].inbox.clone(),
            reader: RefCell::new(
                shared.shards[index]
                    .inbox
                    .reader()
                    .expect("one reader per inbox"),
            ),
            inbox_buf: RefCell::new(Vec::new()),
            draining: Cell::new(false),
            running: Cell::new(CallbackKind::Runtime),
            completions: RefCell::new(Vec::new()),
            rng: Cell::new(0x2545_f491_4f6c_dd1d ^ ((index as u64 + 1) << 17)),
            now: Cell::new(shared.now()),
            next_buf_group: Cell::new(0),
            idle_avg_ns: Cell::new(0),
            idle_since: Cell::new(None),
            arrivals: RefCell::new(std::collections::HashMap::new()),
            direct_in_use: Cell::new(0),
            ticks: Cell::new(0),
            immediate_io: Cell::new(IMMEDIATE_IO_PER_TICK),
            shutting_down: Cell::new(false),
            shared,
        }
    }

    pub(crate) fn index(&self) -> usize {
        self.index
    }

    pub(crate) fn runtime_id(&self) -> u64 {
        self.shared.id
    }

    /// Names this shard among every runtime's shards (timer registrations use it).
    pub(crate) fn timer_owner(&self) -> u64 {
        self.timer_owner
    }

    /// The runtime id in a [`Shard::timer_owner`] value.
    pub(crate) fn runtime_of(timer_owner: u64) -> u64 {
        timer_owner >> 8
    }

    /// The shard index in a [`Shard::timer_owner`] value.
    pub(crate) fn index_of(timer_owner: u64) -> usize {
        (timer_owner & 0xff) as usize
    }

    pub(crate) fn belongs_to(&self, shared: &Arc<Shared>) -> bool {
        Arc::ptr_eq(&self.shared, shared)
    }

    fn remote(&self) -> &ShardRemote {
        &self.shared.shards[self.index]
    }

    /// The clock as last read by this shard's loop (never ahead of the real clock).
    pub(crate) fn cached_now(&self) -> Instant {
        self.now.get()
    }

    pub(crate) fn timers_mut(&self) -> RefMut<'_, TimerQueue> {
        self.timers.borrow_mut()
    }

    /// The hot state, unless it is borrowed already.
    pub(crate) fn try_hot_mut(&self) -> Option<RefMut<'_, HotState>> {
        self.hot.try_borrow_mut().ok()
    }

    pub(crate) fn hot_mut(&self) -> RefMut<'_, HotState> {
        self.hot.borrow_mut()
    }

    pub(crate) fn ops_mut(&self) -> RefMut<'_, OpTable> {
        self.ops.borrow_mut()
    }

    /// Queues the SQE of an op-table operation on this shard's ring.
    ///
    /// # Safety
    ///
    /// As [`ShardDriver::push_op`].
    pub(crate) unsafe fn push_op(&self, entry: &io_uring::squeue::Entry) {
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.driver.borrow_mut().push_op(entry) };
    }

    /// Registers a provided-buffer ring, with incremental consumption
    /// (`IOU_PBUF_RING_INC`, Linux 6.12+) where the kernel accepts it; returns
    /// the group id and whether consumption is incremental.
    ///
    /// # Safety
    ///
    /// As [`ShardDriver::register_buf_ring`].
    pub(crate) unsafe fn register_buf_ring(
        &self,
        addr: u64,
        entries: u16,
        incremental: bool,
    ) -> std::io::Result<(u16, bool)> {
        const IOU_PBUF_RING_INC: u16 = 2;
        let group = self.next_buf_group.get();
        self.next_buf_group.set(group.wrapping_add(1));
        let mut driver = self.driver.borrow_mut();
        if !incremental {
            // SAFETY: forwarded from the caller's contract.
            unsafe { driver.register_buf_ring(addr, entries, group, 0) }?;
            return Ok((group, false));
        }
        // SAFETY: forwarded from the caller's contract.
        match unsafe { driver.register_buf_ring(addr, entries, group, IOU_PBUF_RING_INC) } {
            Ok(()) => Ok((group, true)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                // SAFETY: as above; an older kernel without incremental rings.
                unsafe { driver.register_buf_ring(addr, entries, group, 0) }?;
                Ok((group, false))
            }
            Err(e) => Err(e),
        }
    }

    pub(crate) fn unregister_buf_ring(&self, group: u16) -> std::io::Result<()> {
        self.driver.borrow_mut().unregister_buf_ring(group)
    }

    /// The kernel's head of this shard's provided-buffer ring `group`.
    pub(crate) fn buf_ring_head(&self, group: u16) -> std::io::Result<u16> {
        if self.shared.config.no_buf_ring_status {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        self.driver.borrow_mut().buf_ring_head(group)
    }

    /// Asks the kernel to cancel an in-flight operation.
    pub(crate) fn cancel_op(&self, user_data: u64) {
        self.driver.borrow_mut().queue_cancel(user_data);
    }

    fn complete_op(&self, user_data: u64, res: i32, flags: u32) {
        // The table's borrow ends before any waker runs: a waker may be
        // anything, and may submit or drop an operation itself.
        let woken = self.ops.borrow_mut().complete(user_data, res, flags);
        match woken {
            Woken::None => {}
            Woken::One(w) => self.guard(CallbackKind::Waker, move || w.wake()),
            Woken::Many(ws) => self.wake_all(ws),
            Woken::Released {
                resources,
                cleanup,
                res,
                flags,
            } => self.guard(CallbackKind::Drop, move || {
                if let Some(cleanup) = cleanup {
                    cleanup(res, flags, &*resources);
                }
                drop(resources);
            }),
            Woken::Lent {
                user_data,
                resources,
                cleanup,
                res,
                flags,
            } => {
                self.guard(CallbackKind::Drop, || cleanup(res, flags, &*resources));
                self.ops.borrow_mut().give_back(user_data, resources);
            }
        }
    }

    /// Runs `f`, catching a panic as one of `kind` (counted, reported, and
    /// the shard goes on; see [`crate::panic`]).
    #[inline]
    fn guard(&self, kind: CallbackKind, f: impl FnOnce()) {
        self.shared.guard(Some(self.index), kind, f);
    }

    /// Counts and reports a panic this shard caught, and drops its payload.
    #[cold]
    fn caught(&self, kind: CallbackKind, payload: Box<dyn std::any::Any + Send>) {
        self.shared.report_panic(Some(self.index), kind, &*payload);
        drop_payload(payload);
    }

    /// Wakes every waker; one that panics is reported and the rest are
    /// still woken.
    fn wake_all(&self, wakers: Vec<Waker>) {
        self.run_each(wakers.into_iter(), || CallbackKind::Waker, Waker::wake);
    }

    /// Runs `f` on each item, with one `catch_unwind` for the whole run on
    /// the path that does not panic (one per item cost ~24 instructions a
    /// cross-shard ask): an item whose `f` panics is reported as the kind
    /// `kind()` names then, and the run goes on with the next item.
    fn run_each<I: Iterator>(
        &self,
        mut items: I,
        kind: impl Fn() -> CallbackKind,
        mut f: impl FnMut(I::Item),
    ) {
        loop {
            let (rest, f) = (&mut items, &mut f);
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || rest.for_each(f))) {
                Ok(()) => return,
                Err(p) => self.caught(kind(), p),
            }
        }
    }

    /// Counts a failed `io_uring_enter` (other than the retryable errors,
    /// which the driver absorbs); the shard goes on and submits again.
    #[cold]
    fn ring_error(&self, error: std::io::Error) {
        let counters = &self.remote().counters;
        counters.ring_errors.add(1);
        counters
            .last_ring_errno
            .set(error.raw_os_error().unwrap_or(0).unsigned_abs().into());
    }

    /// Records a task this shard now owns; returns its key.
    pub(crate) fn own_task(&self, task: TaskRef) -> usize {
        self.owned.borrow_mut().insert(task)
    }

    pub(crate) fn disown_task(&self, key: usize) -> Option<TaskRef> {
        self.owned.borrow_mut().try_remove(key)
    }

    /// Queues a started or pinned task on this shard.
    pub(crate) fn push_local(&self, task: TaskRef) {
        self.run_queue.borrow_mut().push_back(task);
    }

    /// Queues an unstarted stealable task on this shard's deque.
    pub(crate) fn push_stealable(&self, task: TaskRef) {
        self.worker.push(task);
    }

    fn next_random(&self) -> u64 {
        let mut x = self.rng.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng.set(x);
        x
    }

    /// Delivers an item to shard `dest`: at once if it is this shard, else in
    /// this tick's batch for `dest`. Inlined, so that a local item (a wake
    /// on the task's own shard, the common case) folds to its run-queue push.
    #[inline]
    pub(crate) fn send_item(&self, dest: usize, item: InboxItem) {
        if dest == self.index {
            self.accept(item);
        } else {
            self.batch_item(dest, item);
        }
    }

    /// Queues a woken task on its home shard: this one's run queue, or this
    /// tick's batch for `dest`. [`send_item`](Self::send_item) without the
    /// match over the kinds of item (a wake is the hottest send there is).
    #[inline]
    pub(crate) fn send_task(&self, dest: usize, task: TaskRef) {
        if dest == self.index {
            self.push_local(task);
        } else {
            self.batch_item(dest, InboxItem::Task(task));
        }
    }

    /// Adds an item to this tick's batch for shard `dest`.
    fn batch_item(&self, dest: usize, item: InboxItem) {
        let flush_now = {
            let mut out = self.outgoing.borrow_mut();
            // Shutdown took the batches (step 2): a wake or a send from a
            // `Drop` that runs after it is refused, as its destination's
            // closed inbox would.
            let Some(batch) = out.batches.get_mut(dest) else {
                drop(out);
                item.refuse(&self.shared, Some(self.index));
                return;
            };
            batch.push(item);
            let len = batch.len();
            if len == 1 {
                out.dirty.push(dest);
            }
            len >= BATCH_LIMIT
        };
        if flush_now && !self.shutting_down.get() {
            self.flush_outgoing();
        }
    }

    /// Applies an item on this shard, catching a closure's or job's panic.
    /// One flat match: a local wake (the common case) folds to its
    /// run-queue push.
    #[inline]
    fn accept(&self, item: InboxItem) {
        match item {
            InboxItem::Task(t) => self.push_local(t),
            InboxItem::Stealable(t) => self.push_stealable(t),
            InboxItem::Tiny(m) => self.ingest_tiny(m),
            InboxItem::Call(f) => self.guard(CallbackKind::RunOn, f),
            InboxItem::Job(job) => self.guard(CallbackKind::Job, move || job.run()),
        }
    }

    /// [`accept`](Self::accept) inside a caller's `catch_unwind` (the inbox
    /// drain): notes which kind of user code runs, for the report.
    #[inline]
    fn accept_unguarded(&self, item: InboxItem) {
        match item {
            InboxItem::Task(t) => self.push_local(t),
            InboxItem::Stealable(t) => self.push_stealable(t),
            InboxItem::Tiny(m) => self.ingest_tiny(m),
            InboxItem::Call(f) => {
                self.running.set(CallbackKind::RunOn);
                f()
            }
            InboxItem::Job(job) => {
                self.running.set(CallbackKind::Job);
                job.run()
            }
        }
    }

    fn ingest_tiny(&self, msg: TinyMessage) {
        self.remote().counters.tiny_received.add(1);
        let mut wake = Vec::new();
        if !self.hot.borrow_mut().ingest(msg, &mut wake) {
            self.remote().counters.tiny_dropped.add(1);
        }
        if !wake.is_empty() {
            self.wake_all(wake);
        }
    }

    /// Sends a tiny message (see [`crate::hot::send_tiny`]).
    pub(crate) fn send_tiny(&self, dest: usize, tag: u16, value: u32) {
        assert!(
            dest < self.shared.shards.len(),
            "shard {dest} does not exist"
        );
        if dest == self.index {
            self.ingest_tiny(TinyMessage {
                from: Some(crate::ShardId::new(self.index)),
                tag,
                value,
            });
            return;
        }
        let hot = self.hot.borrow_mut().is_hot(tag);
        let mut out = self.outgoing.borrow_mut();
        if hot {
            if let Some(slot) = out
                .tiny
                .iter_mut()
                .rev()
                .find(|(d, t, _)| *d == dest && *t == tag)
            {
                slot.2 += u64::from(value);
                return;
            }
        }
        out.tiny.push((dest, tag, u64::from(value)));
    }

    /// Least-loaded shard for a stealable spawn; this shard wins ties.
    pub(crate) fn least_loaded(&self) -> usize {
        let out = self.outgoing.borrow();
        let mine = self.run_queue.borrow().len() + self.worker.len();
        let mut best = (mine, self.index);
        for (i, remote) in self.shared.shards.iter().enumerate() {
            if i == self.index {
                continue;
            }
            // (No batches once shutdown took them: a spawn from a `Drop`
            // that runs after it still finds a shard, which refuses it.)
            let load = remote.load.load(Ordering::Relaxed) + out.batches.get(i).map_or(0, Vec::len);
            if load < best.0 {
                best = (load, i);
            }
        }
        best.1
    }

    /// Runs the shard until shutdown.
    fn run(&self) {
        loop {
            if self.shared.is_shutting_down() {
                break;
            }
            if self.tick() {
                continue;
            }
            if self.try_steal() {
                continue;
            }
            if self.spin() {
                continue;
            }
            self.park();
        }
    }

    /// One pass over every source of work; returns whether anything happened.
    ///
    /// Never inlined: one call per pass costs nothing measurable, and it
    /// gives profilers a symbol that holds all of a shard's work and none of
    /// its idle spinning (`valgrind --tool=callgrind
    /// --toggle-collect='*Shard::tick'`).
    #[inline(never)]
    fn tick(&self) -> bool {
        self.ticks.set(self.ticks.get().wrapping_add(1));
        self.immediate_io.set(IMMEDIATE_IO_PER_TICK);
        let mut work = self.drain_inbox();
        work |= self.reap();
        work |= self.fire_timers();
        if self.ticks.get() % 32 == 0 && !self.shared.injector.is_empty() {
            let _ = self.shared.injector.steal_batch(&self.worker);
        }
        work |= self.run_tasks();
        self.flush_outgoing();
        // The gauges are for stats snapshots: refreshed every 16th busy tick
        // and on every idle one (so an idle shard's figures are exact), not
        // on each tick of a round trip. The load that placement reads is
        // kept current.
        if !work || self.ticks.get() % 16 == 0 {
            self.publish_load();
        } else {
            self.publish_queue_load();
        }
        work
    }

    fn drain_inbox(&self) -> bool {
        let was_draining = self.draining.replace(true);
        let mut buf = self.inbox_buf.take();
        let n = self.reader.borrow_mut().drain_into(&self.inbox, &mut buf);
        if n > 0 {
            self.remote().counters.inbox_items.add(n as u64);
            // A closure or job that panics is reported as the kind it noted
            // in `running` before it ran.
            self.run_each(
                buf.drain(..),
                || self.running.get(),
                |item| self.accept_unguarded(item),
            );
        }
        *self.inbox_buf.borrow_mut() = buf;
        self.draining.set(was_draining);
        n > 0
    }

    /// Applies what other shards have already delivered here, unless an
    /// inbox drain is under way on this thread (its remaining items must go
    /// first); see [`crate::receive_pending`].
    #[inline]
    pub(crate) fn receive_pending(&self) {
        if !self.draining.get() && self.inbox.has_pending() {
            self.drain_inbox();
        }
    }

    fn reap(&self) -> bool {
        let mut comps = self.completions.take();
        let consumed = {
            let mut driver = self.driver.borrow_mut();
            if !driver.has_completions() {
                0
            } else {
                let _ = driver.submit();
                let n = driver.reap(&mut |c| comps.push(c));
                self.remote()
                    .counters
                    .cq_overflows
                    .set(driver.cq_overflows());
                n
            }
        };
        for c in comps.drain(..) {
            match c {
                Completion::Op {
                    user_data,
                    res,
                    flags,
                } => self.complete_op(user_data, res, flags),
                Completion::Tiny { from, tag, value } => {
                    let from = (usize::from(from) < self.shared.shards.len())
                        .then(|| crate::ShardId::new(from.into()));
                    self.ingest_tiny(TinyMessage { from, tag, value });
                }
                Completion::DoorbellFailed { target } => {
                    self.outgoing.borrow_mut().retry_doorbells.push(target)
                }
                Completion::TinyFailed { target, tag, value } => {
                    let from = Some(crate::ShardId::new(self.index));
                    self.send_item(target, InboxItem::Tiny(TinyMessage { from, tag, value }));
                }
                Completion::FdArrived { id, res } => self.fd_arrived(id, res),
            }
        }
        *self.completions.borrow_mut() = comps;
        consumed > 0
    }

    fn fd_arrived(&self, id: u64, res: i32) {
        if res >= 0 {
            self.note_direct_opened();
        }
        let mut arrivals = self.arrivals.borrow_mut();
        match arrivals.remove(&id) {
            Some(Arrival::Waiting(waker)) => {
                arrivals.insert(id, Arrival::Arrived(res));
                drop(arrivals);
                // Whatever it is, its panic must not cost the rest of the
                // batch being reaped.
                self.guard(CallbackKind::Waker, move || waker.wake());
            }
            Some(Arrival::Abandoned) => {
                drop(arrivals);
                if res >= 0 {
                    let _ = self.close_direct(res as u32);
                }
            }
            Some(Arrival::Arrived(_)) | None => {
                arrivals.insert(id, Arrival::Arrived(res));
            }
        }
    }

    /// The slot (or error) of move `id` once it arrived here.
    pub(crate) fn poll_arrival(&self, id: u64, cx: &mut std::task::Context<'_>) -> Poll<i32> {
        let mut arrivals = self.arrivals.borrow_mut();
        match arrivals.remove(&id) {
            Some(Arrival::Arrived(res)) => Poll::Ready(res),
            _ => {
                arrivals.insert(id, Arrival::Waiting(cx.waker().clone()));
                Poll::Pending
            }
        }
    }

    /// The receiver of move `id` is gone: a slot that came is closed, one
    /// still coming will be.
    pub(crate) fn abandon_arrival(&self, id: u64) {
        let mut arrivals = self.arrivals.borrow_mut();
        match arrivals.remove(&id) {
            Some(Arrival::Arrived(res)) => {
                drop(arrivals);
                if res >= 0 {
                    let _ = self.close_direct(res as u32);
                }
            }
            _ => {
                arrivals.insert(id, Arrival::Abandoned);
            }
        }
    }

    pub(crate) fn note_direct_opened(&self) {
        self.direct_in_use.set(self.direct_in_use.get() + 1);
        self.remote()
            .counters
            .direct_descriptors
            .set(self.direct_in_use.get());
    }

    /// Closes slot `slot` of this ring's table.
    pub(crate) fn close_direct(&self, slot: u32) -> std::io::Result<()> {
        self.driver.borrow_mut().close_direct(slot)?;
        self.direct_in_use
            .set(self.direct_in_use.get().saturating_sub(1));
        self.remote()
            .counters
            .direct_descriptors
            .set(self.direct_in_use.get());
        Ok(())
    }

    /// This shard's ring features.
    pub(crate) fn features(&self) -> RingFeatures {
        self.remote().features
    }

    fn fire_timers(&self) -> bool {
        let mut wakers = Vec::new();
        {
            let mut timers = self.timers.borrow_mut();
            let Some(next) = timers.next_deadline() else {
                return false;
            };
            let now = self.shared.now();
            self.now.set(now);
            if next > now {
                return false;
            }
            timers.fire_expired(now, &mut wakers);
        }
        let fired = !wakers.is_empty();
        if fired {
            self.wake_all(wakers);
        }
        fired
    }

    fn run_tasks(&self) -> bool {
        let budget = self.shared.config.task_budget;
        let mut polled = 0;
        let mut published_early = false;
        while polled < budget {
            let next = self.run_queue.borrow_mut().pop_front();
            let Some(task) = next.or_else(|| self.worker.pop()) else {
                break;
            };
            task.run(self);
            polled += 1;
            // The first task of a tick that sent to other shards while
            // local work waits behind it has its deliveries published now,
            // once a tick: those shards start on them alongside this one's
            // local work instead of after it (a pipelined client's
            // requests, half for keys here and half for keys there, ran in
            // series otherwise).
            if !published_early && self.has_pending_batches() && self.has_local_work() {
                published_early = true;
                self.publish_pending();
            }
        }
        self.remote().counters.polls.add(polled as u64);
        polled > 0
    }

    /// Publishes this tick's batches: one push (and at most one doorbell) per
    /// destination, the tiny messages, and a steal hint; then submits.
    fn flush_outgoing(&self) {
        self.run_tick_end();
        let counters = &self.remote().counters;
        let mut refused = Vec::new();
        {
            let mut out = self.outgoing.borrow_mut();
            let mut driver = self.driver.borrow_mut();
            let Outgoing {
                batches,
                dirty,
                tiny,
                retry_doorbells,
                senders,
            } = &mut *out;
            for dest in dirty.drain(..) {
                let remote = &self.shared.shards[dest];
                let sender = senders[dest]
                    .as_mut()
                    .expect("batches go to other shards only");
                match sender.push_batch(&remote.inbox, &mut batches[dest]) {
                    Ok(Delivery::Ring) => {
                        driver.queue_doorbell(dest, &remote.target);
                        counters.doorbells_sent.add(1);
                    }
                    Ok(Delivery::Coalesced) => counters.doorbells_coalesced.add(1),
                    Err(()) => refused.append(&mut batches[dest]),
                }
            }
            if !retry_doorbells.is_empty() {
                for dest in retry_doorbells.drain(..) {
                    driver.queue_doorbell(dest, &self.shared.shards[dest].target);
                    counters.doorbells_sent.add(1);
                }
            }
            for (dest, tag, mut sum) in tiny.drain(..) {
                let target = self.shared.shards[dest].target;
                loop {
                    let value = sum.min(u64::from(u32::MAX)) as u32;
                    driver.queue_tiny(self.index, dest, &target, tag, value);
                    counters.tiny_sent.add(1);
                    sum -= u64::from(value);
                    if sum == 0 {
                        break;
                    }
                }
            }
            if self.worker.len() > 1 {
                self.hint_idle_peer(&mut driver);
            }
            if let Err(e) = driver.submit() {
                drop(driver);
                self.ring_error(e);
            }
        }
        for item in refused {
            item.refuse(&self.shared, Some(self.index));
        }
    }

    /// Queues `f` to run before this tick's batches are published.
    pub(crate) fn defer_to_tick_end(&self, f: TickEnd) {
        self.tick_end.borrow_mut().push(f);
    }

    /// Publishes this tick's deliveries now if there are any (tick-end
    /// callbacks included), so that an effect seen through shared memory
    /// (a task's completion) never overtakes them.
    pub(crate) fn publish_pending(&self) {
        if self.has_pending_deliveries() && !self.shutting_down.get() {
            self.flush_outgoing();
        }
    }

    /// Whether this tick has deliveries for other shards not yet published
    /// (tick-end callbacks, which hand over layers' batches, included).
    fn has_pending_deliveries(&self) -> bool {
        !self.tick_end.borrow().is_empty() || {
            let out = self.outgoing.borrow();
            !out.dirty.is_empty() || !out.tiny.is_empty()
        }
    }

    /// Whether this tick has batches for other shards not yet published
    /// (tick-end callbacks, which hand over layers' batches, included; not
    /// the tiny messages alone, whose per-tick sums would split).
    fn has_pending_batches(&self) -> bool {
        !self.tick_end.borrow().is_empty() || !self.outgoing.borrow().dirty.is_empty()
    }

    /// Whether tasks wait in this shard's queues.
    fn has_local_work(&self) -> bool {
        !self.run_queue.borrow().is_empty() || !self.worker.is_empty()
    }

    /// Runs the tick-end callbacks, including any they queue themselves.
    pub(crate) fn run_tick_end(&self) {
        if self.tick_end.borrow().is_empty() {
            return;
        }
        loop {
            // The spare buffer takes the queue's place, so callbacks queued
            // while these run (and next tick's) find room without allocating.
            let mut batch = self.tick_end_spare.take();
            std::mem::swap(&mut batch, &mut *self.tick_end.borrow_mut());
            if batch.is_empty() {
                *self.tick_end_spare.borrow_mut() = batch;
                return;
            }
            // The callbacks after one that panics still run.
            self.run_each(batch.drain(..), || CallbackKind::TickEnd, TickEnd::run);
            *self.tick_end_spare.borrow_mut() = batch;
        }
    }

    /// Rings one sleeping peer so it comes to steal from our deque.
    /// Starts waking shard `dest` now if it sleeps, because this tick is
    /// batching work for it (see [`crate::prewake`]).
    pub(crate) fn prewake(&self, dest: usize) {
        if dest == self.index || dest >= self.shared.shards.len() {
            return;
        }
        let remote = &self.shared.shards[dest];
        if !remote.inbox.is_sleeping() {
            return;
        }
        // Mid-tick the driver is free; if some caller up the stack holds it,
        // the tick-end publication rings as usual.
        let Ok(mut driver) = self.driver.try_borrow_mut() else {
            return;
        };
        if remote.inbox.claim_wake() == Delivery::Ring {
            driver.queue_doorbell(dest, &remote.target);
            let counters = &self.remote().counters;
            counters.doorbells_sent.add(1);
            counters.prewakes.add(1);
            if let Err(e) = driver.submit() {
                drop(driver);
                self.ring_error(e);
            }
        }
    }

    fn hint_idle_peer(&self, driver: &mut UringDriver) {
        let n = self.shared.shards.len();
        let start = self.next_random() as usize % n;
        for i in 0..n {
            let peer = (start + i) % n;
            if peer == self.index {
                continue;
            }
            let remote = &self.shared.shards[peer];
            if remote.inbox.is_sleeping() && remote.inbox.claim_wake() == Delivery::Ring {
                driver.queue_doorbell(peer, &remote.target);
                self.remote().counters.doorbells_sent.add(1);
                return;
            }
        }
    }

    /// Publishes the queue length that placement reads, if it changed.
    fn publish_queue_load(&self) {
        let load = self.run_queue.borrow().len() + self.worker.len();
        let remote = self.remote();
        if remote.load.load(Ordering::Relaxed) != load {
            remote.load.store(load, Ordering::Relaxed);
        }
    }

    fn publish_load(&self) {
        let local = self.run_queue.borrow().len();
        let stealable = self.worker.len();
        let counters = &self.remote().counters;
        counters.local_queue_depth.set(local as u64);
        counters.stealable_queue_depth.set(stealable as u64);
        counters.owned_tasks.set(self.owned.borrow().len() as u64);
        counters.timers_armed.set(self.timers.borrow().len() as u64);
        let in_flight = self.driver.borrow().in_flight() + self.ops.borrow().len();
        counters.ops_in_flight.set(in_flight as u64);
        counters
            .ops_offloaded
            .set(self.ops.borrow().offloaded() as u64);
        self.remote()
            .load
            .store(local + stealable, Ordering::Relaxed);
    }

    /// Looks for unstarted tasks elsewhere: the injector, then peers in random order.
    fn try_steal(&self) -> bool {
        let counters = &self.remote().counters;
        counters.steal_attempts.add(1);
        let found = loop {
            match self.shared.injector.steal_batch_and_pop(&self.worker) {
                Steal::Success(t) => break Some(t),
                Steal::Retry => continue,
                Steal::Empty => {}
            }
            let n = self.shared.shards.len();
            let start = self.next_random() as usize % n;
            let mut retry = false;
            let mut got = None;
            for i in 0..n {
                let victim = (start + i) % n;
                if victim == self.index {
                    continue;
                }
                match self.shared.shards[victim]
                    .stealer
                    .steal_batch_and_pop(&self.worker)
                {
                    Steal::Success(t) => {
                        got = Some(t);
                        break;
                    }
                    Steal::Retry => retry = true,
                    Steal::Empty => {}
                }
            }
            if got.is_some() || !retry {
                break got;
            }
        };
        let Some(task) = found else { return false };
        counters.steal_successes.add(1);
        counters.tasks_stolen.add(1 + self.worker.len() as u64);
        task.run(self);
        counters.polls.add(1);
        self.flush_outgoing();
        true
    }

    fn peers_have_work(&self) -> bool {
        !self.shared.injector.is_empty()
            || self
                .shared
                .shards
                .iter()
                .enumerate()
                .any(|(i, r)| i != self.index && !r.stealer.is_empty())
    }

    fn wake_idle_hot_consumers(&self) -> bool {
        let mut wake = Vec::new();
        let woke = self.hot.borrow_mut().flush_idle(&mut wake);
        if !wake.is_empty() {
            self.wake_all(wake);
        }
        woke
    }

    /// Spins for the idle budget; returns whether work showed up.
    fn spin(&self) -> bool {
        if self.wake_idle_hot_consumers() {
            return true;
        }
        // `None`: poll until work shows up (`IdlePolicy::Poll`).
        let max = match self.shared.config.idle {
            IdlePolicy::Block => return false,
            IdlePolicy::Spin(max) if max.is_zero() => return false,
            IdlePolicy::Spin(max) => Some(max),
            IdlePolicy::Poll => None,
        };
        if self.ops.borrow().offloaded() > 0 {
            // A kernel worker finishing one of our operations may need this
            // CPU: spinning would only delay the completion we wait for.
            return false;
        }
        // Adaptive: the shard keeps a moving average of how long its idle
        // periods last (a spin that finds work counts as a short one; `park`
        // measures the others). While that average fits in the budget it spins
        // the full budget; when idle periods are mostly longer (slow I/O such
        // as fsync) it spins only a short floor that still covers a
        // cross-shard round trip, so it stops burning CPU for nothing.
        let budget = max.map(|max| {
            if self.idle_avg_ns.get() <= saturating_nanos(max) {
                max
            } else {
                SPIN_FLOOR.min(max)
            }
        });
        let start = Instant::now();
        if max.is_some() && self.shared.cpu_pressure.cpus_short(start) {
            // Threads wait for CPUs: a spin would keep this one from them.
            self.remote().counters.spins_skipped.add(1);
            return false;
        }
        self.idle_since.set(Some(start));
        let inbox = &self.inbox;
        let mut i: u32 = 0;
        loop {
            if inbox.has_pending() || self.driver.borrow().has_completions() {
                self.remote().counters.spin_wakeups.add(1);
                self.idle_avg_ns.set(self.idle_avg_ns.get() / 4 * 3);
                self.idle_since.set(None);
                return true;
            }
            if i % 32 == 0 {
                let due = self
                    .timers
                    .borrow()
                    .next_deadline()
                    .is_some_and(|d| d <= self.shared.now());
                if due || self.peers_have_work() || self.shared.is_shutting_down() {
                    return true;
                }
                match budget {
                    Some(budget) if start.elapsed() >= budget => return false,
                    Some(_) => {}
                    // Polling: let a thread that shares this CPU run first.
                    None => std::thread::yield_now(),
                }
            }
            std::hint::spin_loop();
            i = i.wrapping_add(1);
        }
    }

    /// Blocks in `io_uring_enter` until a completion arrives.
    fn park(&self) {
        if let Some(deadline) = self.timers.borrow().next_deadline() {
            // The kernel counts real time: take the test offset back out.
            let offset = self.shared.clock_offset();
            let real = deadline.checked_sub(offset).unwrap_or_else(Instant::now);
            self.driver.borrow_mut().arm_timer(real);
        }
        let inbox = &self.inbox;
        if !inbox.prepare_park() {
            return;
        }
        if self.shared.is_shutting_down() || self.peers_have_work() {
            inbox.unpark();
            return;
        }
        self.remote().counters.parks.add(1);
        let res = self.driver.borrow_mut().wait();
        inbox.unpark();
        if let Some(since) = self.idle_since.take() {
            // One idle period counts as at most four budgets: it takes
            // several long ones to switch the spin to its floor, and one
            // pause (a quiet second between bursts) does not keep a burst
            // that follows it parking between messages for dozens of rounds
            // (measured: 200 fan-out rounds after a 20 ms pause took 27-34
            // ms against 20-22 ms back to back).
            let cap = match self.shared.config.idle {
                IdlePolicy::Spin(max) => saturating_nanos(max).saturating_mul(4),
                IdlePolicy::Block | IdlePolicy::Poll => u64::MAX / 4,
            };
            let waited = (since.elapsed().as_nanos().min(u128::from(u64::MAX / 4)) as u64).min(cap);
            self.idle_avg_ns
                .set(self.idle_avg_ns.get() / 4 * 3 + waited / 4);
        }
        if let Err(e) = res {
            self.ring_error(e);
        }
    }

    /// Closes the inbox and refuses what it still held (again at step 2's
    /// end: the close takes what peers pushed since).
    fn close_inbox(&self) {
        // Bound first: refusing runs user drops, which may ask for a drain.
        let refused = self.reader.borrow_mut().close(&self.inbox);
        for item in refused {
            item.refuse(&self.shared, Some(self.index));
        }
    }

    /// Runs the loop until shutdown; a panic that escapes the runtime's own
    /// code (every user callback is caught where it runs) is reported as
    /// [`CallbackKind::Runtime`] and the loop goes on, so a shard never
    /// unwinds past this point.
    fn run_guarded(&self) {
        loop {
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run())) {
                Ok(()) => return,
                Err(p) => {
                    // An interrupted drain leaves its flag set; the items it
                    // had taken were dropped by the unwind.
                    self.draining.set(false);
                    self.caught(CallbackKind::Runtime, p);
                }
            }
        }
    }

    /// Steps 2–4 of the shutdown protocol (module docs). Each step is
    /// guarded, so the barrier of step 3 is met whatever panics, and step 4
    /// waits at most [`crate::SHUTDOWN_OP_GRACE`]: what is still in flight
    /// then is leaked, never freed.
    fn shutdown_sequence(&self) {
        self.shutting_down.set(true);
        // 2. Stop accepting; drop every task and everything queued. Retried
        //    after a panic of the runtime's own (user drops are caught inside).
        for _ in 0..3 {
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.drop_all_work())) {
                Ok(()) => break,
                Err(p) => self.caught(CallbackKind::Runtime, p),
            }
        }
        if let Err(e) = self.driver.borrow_mut().submit() {
            self.ring_error(e);
        }
        // 3. Nobody rings anybody after this point.
        self.shared.shutdown_barrier.wait();
        // 4. Cancel in-flight operations and wait, for a bounded time, for
        //    their completions; each abandoned operation's resources are
        //    freed as its CQE arrives.
        if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.cancel_ops()))
        {
            self.caught(CallbackKind::Runtime, p);
        }
        // The wakers of the cancelled operations ran user code, which may
        // have spawned onto this shard.
        if let Err(p) =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.shut_down_tasks()))
        {
            self.caught(CallbackKind::Runtime, p);
        }
        let leaked = self.ops.borrow_mut().leak_pending();
        let tally = &self.shared.tally;
        tally.ops_leaked.fetch_add(leaked as u64, Ordering::Relaxed);
        self.remote().counters.ops_in_flight.set(0);
        self.remote().counters.ops_offloaded.set(0);
    }

    /// Step 2: closes the inbox, drops every task (their joiners resolve to
    /// `Cancelled`), timer, hot counter and batch.
    fn drop_all_work(&self) {
        self.close_inbox();
        self.shut_down_tasks();
        let wakers = self.timers.borrow_mut().clear();
        self.guard(CallbackKind::Drop, move || drop(wakers));
        let wakers = self.hot.borrow_mut().clear();
        self.guard(CallbackKind::Drop, move || drop(wakers));
        // Callbacks queued for a tick end that will not come are dropped unrun.
        let tick_end = std::mem::take(&mut *self.tick_end.borrow_mut());
        self.guard(CallbackKind::Drop, move || drop(tick_end));
        let outgoing = std::mem::take(&mut *self.outgoing.borrow_mut());
        for item in outgoing.batches.into_iter().flatten() {
            item.refuse(&self.shared, Some(self.index));
        }
        self.close_inbox();
        // The user code that ran since (a timer waker's `Drop`, a closure
        // dropped unrun) may have spawned onto this shard.
        self.shut_down_tasks();
    }

    /// Shuts down every task queued or owned here (their joiners resolve to
    /// `Cancelled`), again and again until none is left: dropping one runs
    /// user code, which may spawn another.
    fn shut_down_tasks(&self) {
        let tally = &self.shared.tally;
        let count = |cancelled: bool| {
            if cancelled {
                tally.tasks_cancelled.fetch_add(1, Ordering::Relaxed);
            }
        };
        loop {
            // Queued tasks are shut down, not just dropped: a pinned task
            // that never started is in no owned table, and dropping its last
            // queue reference would leave its joiner waiting forever.
            loop {
                let next = self.run_queue.borrow_mut().pop_front();
                let Some(t) = next else { break };
                count(t.shutdown(Some(self)));
                self.guard(CallbackKind::Drop, move || drop(t));
            }
            while let Some(t) = self.worker.pop() {
                count(t.shutdown(Some(self)));
                self.guard(CallbackKind::Drop, move || drop(t));
            }
            let next = self
                .owned
                .borrow()
                .iter()
                .next()
                .map(|(k, t)| (k, t.clone()));
            match next {
                Some((key, task)) => {
                    count(task.shutdown(Some(self)));
                    let mut owned = self.owned.borrow_mut();
                    if owned.get(key).is_some_and(|t| Arc::ptr_eq(t, &task)) {
                        let stale = owned.remove(key);
                        drop(owned);
                        self.guard(CallbackKind::Drop, move || drop(stale));
                    }
                    self.guard(CallbackKind::Drop, move || drop(task));
                }
                None if self.run_queue.borrow().is_empty() && self.worker.is_empty() => break,
                None => {}
            }
        }
    }

    /// Step 4: cancels every operation in flight and reaps completions until
    /// none is awaited or [`crate::SHUTDOWN_OP_GRACE`] has passed.
    fn cancel_ops(&self) {
        let in_flight = || self.driver.borrow().in_flight() + self.ops.borrow().awaiting_kernel();
        let ops = self.ops.borrow().awaiting_kernel();
        self.shared
            .tally
            .ops_cancelled
            .fetch_add(ops as u64, Ordering::Relaxed);
        self.driver.borrow_mut().cancel_all();
        let deadline = Instant::now() + crate::SHUTDOWN_OP_GRACE;
        let mut comps = Vec::new();
        while in_flight() > 0 {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            {
                let mut driver = self.driver.borrow_mut();
                if let Err(e) = driver.wait_timeout(deadline - now) {
                    drop(driver);
                    self.ring_error(e);
                    // A ring that cannot wait will not complete anything.
                    break;
                }
                driver.reap(&mut |c| comps.push(c));
            }
            for c in comps.drain(..) {
                if let Completion::Op {
                    user_data,
                    res,
                    flags,
                } = c
                {
                    self.complete_op(user_data, res, flags);
                }
            }
        }
    }
}

/// What a shard thread reports once its ring is (or is not) set up.
pub(crate) type SetupReport = (usize, Result<(WakeTarget, RingFeatures), crate::BuildError>);

/// The body of a shard thread: set up the ring, report, wait for the go, run.
pub(crate) fn shard_main(
    index: usize,
    builder: crate::Builder,
    worker: Worker<TaskRef>,
    setup: std::sync::mpsc::Sender<SetupReport>,
    go: std::sync::mpsc::Receiver<Option<Arc<Shared>>>,
) {
    if let Some(&cpu) = builder.cpu_plan.get(index) {
        if let Err(source) = pin_to_cpu(cpu) {
            let _ = setup.send((
                index,
                Err(crate::BuildError::Pin {
                    shard: index,
                    cpu,
                    source,
                }),
            ));
            return;
        }
    }
    let driver = match UringDriver::new(&builder, index) {
        Ok(d) => d,
        Err(e) => {
            let _ = setup.send((index, Err(e)));
            return;
        }
    };
    let _ = setup.send((index, Ok((driver.wake_target(), *driver.features()))));
    drop(setup);
    let Ok(Some(shared)) = go.recv() else { return };
    let shard = Rc::new(Shard::new(index, shared, worker, driver));
    /// Clears the thread's current shard however the thread leaves
    /// (an unwind included), before the shard itself is dropped: what its
    /// drop runs must never find a shard being dropped.
    struct ClearCurrent;
    impl Drop for ClearCurrent {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(std::ptr::null()));
        }
    }
    CURRENT.with(|c| c.set(Rc::as_ptr(&shard)));
    let current = ClearCurrent;
    shard.run_guarded();
    shard.shutdown_sequence();
    drop(current);
    // 5. Dropping the last reference closes the ring and the eventfd.
    drop(shard);
}

/// Pins the calling thread to `cpu`.
fn pin_to_cpu(cpu: usize) -> std::io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    set_affinity(&[cpu])
}

/// Lets the calling thread run on `cpus` (those past `CPU_SETSIZE` are
/// left out).
pub(crate) fn set_affinity(cpus: &[usize]) -> std::io::Result<()> {
    // SAFETY: `set` is a plain-data cpu_set_t, zeroed and then filled through
    // libc's CPU_SET with indices below CPU_SETSIZE; sched_setaffinity reads
    // `size_of::<cpu_set_t>()` bytes of it.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &cpu in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
            libc::CPU_SET(cpu, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The CPUs the calling thread may run on, in ascending order.
pub(crate) fn allowed_cpus() -> std::io::Result<Vec<usize>> {
    // SAFETY: sched_getaffinity writes at most `size_of::<cpu_set_t>()` bytes
    // into `set`, a zeroed plain-data cpu_set_t; CPU_ISSET reads within it
    // (indices below CPU_SETSIZE).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok((0..libc::CPU_SETSIZE as usize)
            .filter(|&cpu| libc::CPU_ISSET(cpu, &set))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn spin_budgets_past_64_bits_of_nanoseconds_saturate() {
        assert_eq!(super::saturating_nanos(Duration::from_micros(50)), 50_000);
        // 2^64 + 1,000 ns: cut to 64 bits it would be 1,000.
        let huge = Duration::new(18_446_744_073, 709_552_616);
        assert_eq!(huge.as_nanos(), (1u128 << 64) + 1_000);
        assert_eq!(super::saturating_nanos(huge), u64::MAX);
        assert_eq!(super::saturating_nanos(Duration::MAX), u64::MAX);
    }
}
