//! The runtime: starting shards, the [`Handle`] that spawns onto them,
//! `block_on`, statistics, and the shutdown protocol.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, RwLock, Weak};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use crossbeam_deque::{Injector, Steal, Worker};
use crossbeam_utils::CachePadded;

use crate::blocking::BlockingPool;
use crate::builder::{Builder, IdlePolicy};
use crate::doorbell::{Delivery, Inbox};
use crate::driver::uring::{send_msg_ring_from_outside, write_eventfd};
use crate::driver::{token, KIND_DOORBELL};
use crate::error::BuildError;
use crate::hot::TinyMessage;
use crate::panic::{drop_payload, CallbackKind, PanicCounts, PanicLog, ShutdownReport};
use crate::placement::{sticky_shard, Placement};
use crate::shard::{shard_main, with_current, InboxItem, SetupReport, ShardId, ShardRemote};
use crate::stats::{ExternalWakeMode, RuntimeStats, ShardCounters};
use crate::task::join::{JoinError, JoinHandle};
use crate::task::{LocalFactory, Task, TaskRef};

static NEXT_RUNTIME_ID: AtomicU64 = AtomicU64::new(1);

/// Every started runtime's shared state, for the rare code that holds only a
/// runtime's id (a timer dropped off its shard sends its removal home, see
/// [`crate::time`]). Entries of runtimes that are gone are pruned when one
/// registers; a few runtimes live at a time, so a list scanned under a lock
/// is enough.
static RUNTIMES: Mutex<Vec<(u64, Weak<Shared>)>> = Mutex::new(Vec::new());

/// How long a shard's shutdown waits for the completions of the operations
/// it cancelled; past it, what those operations lent the kernel is leaked
/// (counted in [`ShutdownReport::ops_leaked`]), never freed. Shutdown then
/// waits as long again for running [`spawn_blocking`](crate::spawn_blocking)
/// jobs; past it, their threads are detached (counted in
/// [`ShutdownReport::blocking_abandoned`]).
pub const SHUTDOWN_OP_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// What shutdown counts beside the per-shard counters (see [`ShutdownReport`]).
#[derive(Debug, Default)]
pub(crate) struct ShutdownTally {
    pub(crate) tasks_cancelled: AtomicU64,
    pub(crate) dropped_unrun: AtomicU64,
    pub(crate) ops_cancelled: AtomicU64,
    pub(crate) ops_leaked: AtomicU64,
    pub(crate) blocking_abandoned: AtomicU64,
    pub(crate) shards_abandoned: AtomicU64,
    /// Panics caught off the shards (a task or closure dropped by an
    /// outside thread), per kind.
    pub(crate) offshard_panics: [AtomicU64; CallbackKind::COUNT],
    /// What layers above the runtime drained and dropped when they stopped
    /// (`Handle::report_drained`).
    pub(crate) layers: std::sync::Mutex<Vec<crate::panic::DrainReport>>,
}

/// Settings every shard reads.
#[derive(Debug)]
pub(crate) struct Config {
    pub(crate) idle: IdlePolicy,
    pub(crate) task_budget: usize,
    pub(crate) hot_tags: Vec<u16>,
    pub(crate) hot_wake_threshold: u64,
    /// [`crate::FaultInjection::multishot_recvmsg_errno`].
    pub(crate) multishot_recvmsg_errno: Option<i32>,
    /// [`crate::FaultInjection::unannounced_fd_moves`].
    pub(crate) unannounced_fd_moves: bool,
    /// [`crate::FaultInjection::no_buf_ring_status`].
    pub(crate) no_buf_ring_status: bool,
}

/// State shared by all shards of one runtime and its handles.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) id: u64,
    pub(crate) shards: Box<[ShardRemote]>,
    /// Stealable tasks spawned from threads outside the runtime.
    pub(crate) injector: Injector<TaskRef>,
    pub(crate) config: Config,
    pub(crate) shutdown_barrier: ShutdownBarrier,
    /// Hot tags registered after `build()` ([`Handle::register_hot_tags`]).
    pub(crate) dynamic_hot: Arc<crate::hot::DynamicHotTags>,
    round_robin: AtomicUsize,
    shutdown: AtomicBool,
    /// `true` while shard fds may be targeted by external wakes.
    wake_gate: RwLock<bool>,
    external_mode: ExternalWakeMode,
    external_wakes: AtomicU64,
    blocking: BlockingPool,
    /// How far the runtime's clock is ahead of the real one (see
    /// [`Handle::advance_clock`]); only ever grows.
    clock_offset_ns: AtomicU64,
    pub(crate) panics: PanicLog,
    pub(crate) tally: ShutdownTally,
    /// Whether the machine has a CPU to spare, asked before a spin.
    pub(crate) cpu_pressure: crate::cpu_pressure::CpuPressure,
}

impl Shared {
    /// Makes this runtime findable by id ([`Shared::find`]).
    fn register(self: &Arc<Self>) {
        let mut all = RUNTIMES.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|(_, w)| w.strong_count() > 0);
        all.push((self.id, Arc::downgrade(self)));
    }

    /// The runtime whose id is `id`, while it lives. Not for hot paths: it
    /// takes a process-wide lock.
    pub(crate) fn find(id: u64) -> Option<Arc<Shared>> {
        let all = RUNTIMES.lock().unwrap_or_else(|p| p.into_inner());
        all.iter()
            .find(|(of, _)| *of == id)
            .and_then(|(_, w)| w.upgrade())
    }

    /// The runtime's clock: the real monotonic clock plus the test offset.
    pub(crate) fn now(&self) -> std::time::Instant {
        std::time::Instant::now() + self.clock_offset()
    }

    /// How far the runtime's clock is ahead of the real one.
    pub(crate) fn clock_offset(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.clock_offset_ns.load(Ordering::Acquire))
    }

    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutdown.load(Ordering::SeqCst)
    }

    /// Counts and reports a panic caught in user code (see [`crate::panic`]).
    /// `shard` is the index of the shard whose thread caught it, if any.
    #[cold]
    #[inline(never)]
    pub(crate) fn report_panic(
        &self,
        shard: Option<usize>,
        kind: CallbackKind,
        payload: &(dyn std::any::Any + Send),
    ) {
        match shard {
            Some(i) => self.shards[i].counters.count_panic(kind),
            None => {
                self.tally.offshard_panics[kind.index()].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.panics.report(shard.map(ShardId::new), kind, payload);
    }

    /// Runs `f`, catching a panic as one of `kind` (reported and dropped).
    #[inline]
    pub(crate) fn guard(&self, shard: Option<usize>, kind: CallbackKind, f: impl FnOnce()) {
        if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            self.report_panic(shard, kind, &*p);
            drop_payload(p);
        }
    }

    /// Every panic caught so far, summed over shards (and off them).
    fn panic_counts(&self) -> PanicCounts {
        let counts = std::array::from_fn(|i| {
            let off = self.tally.offshard_panics[i].load(Ordering::Relaxed);
            self.shards
                .iter()
                .map(|r| r.counters.panics[i].load(Ordering::Relaxed))
                .sum::<u64>()
                + off
        });
        PanicCounts::from_array(counts)
    }

    fn shutdown_report(&self) -> ShutdownReport {
        let t = &self.tally;
        ShutdownReport {
            tasks_cancelled: t.tasks_cancelled.load(Ordering::Relaxed),
            dropped_unrun: t.dropped_unrun.load(Ordering::Relaxed),
            ops_cancelled: t.ops_cancelled.load(Ordering::Relaxed),
            ops_leaked: t.ops_leaked.load(Ordering::Relaxed),
            blocking_abandoned: t.blocking_abandoned.load(Ordering::Relaxed),
            shards_abandoned: t.shards_abandoned.load(Ordering::Relaxed),
            panics: self.panic_counts(),
            panic_records: self.panics.records(),
            drained: t.layers.lock().unwrap_or_else(|p| p.into_inner()).clone(),
        }
    }

    /// Re-queues a woken task on its home shard (see `task` module docs, step 3).
    pub(crate) fn schedule_task(self: &Arc<Self>, task: TaskRef, home: usize) {
        self.deliver(home, InboxItem::Task(task));
    }

    /// Hands `item` to shard `dest` from wherever the caller is.
    pub(crate) fn deliver(self: &Arc<Self>, dest: usize, item: InboxItem) {
        let mut item = Some(item);
        with_current(|shard| {
            if shard.belongs_to(self) {
                shard.send_item(dest, item.take().expect("item present"));
            }
        });
        if let Some(item) = item {
            self.push_from_outside(dest, item);
        }
    }

    fn push_from_outside(&self, dest: usize, item: InboxItem) {
        match self.shards[dest].inbox.push(item) {
            Ok(Delivery::Ring) => self.wake_from_outside(dest),
            Ok(Delivery::Coalesced) => {}
            // Shut down: nobody will run it.
            Err(item) => item.refuse(self, None),
        }
    }

    /// Wakes shard `dest` from a thread that has no ring of this runtime.
    fn wake_from_outside(&self, dest: usize) {
        let gate = self.wake_gate.read().unwrap_or_else(|p| p.into_inner());
        if !*gate {
            return;
        }
        let target = &self.shards[dest].target;
        let sent = self.external_mode == ExternalWakeMode::SendMsgRing
            && send_msg_ring_from_outside(target.ring_fd, token(KIND_DOORBELL, 0), 0).is_ok();
        if !sent {
            let _ = write_eventfd(target.eventfd);
        }
        self.external_wakes.fetch_add(1, Ordering::Relaxed);
    }

    /// Wakes one sleeping shard so it picks up injected work.
    fn wake_one_sleeping(&self) {
        for (i, remote) in self.shards.iter().enumerate() {
            if remote.inbox.is_sleeping() && remote.inbox.claim_wake() == Delivery::Ring {
                self.wake_from_outside(i);
                return;
            }
        }
    }

    fn submit(self: &Arc<Self>, task: TaskRef, placement: Placement) {
        let n = self.shards.len();
        let check = |s: ShardId| {
            assert!(
                s.index() < n,
                "{s} does not exist: this runtime has {n} shards"
            );
            s.index()
        };
        match placement {
            Placement::Pinned(s) => self.deliver(check(s), InboxItem::Task(task)),
            Placement::Sticky(key) => {
                self.deliver(sticky_shard(&key, n).index(), InboxItem::Task(task))
            }
            Placement::RoundRobin => {
                let s = self.round_robin.fetch_add(1, Ordering::Relaxed) % n;
                self.deliver(s, InboxItem::Task(task));
            }
            Placement::StealablePreferred(s) => self.deliver(check(s), InboxItem::Stealable(task)),
            Placement::Stealable => {
                let mut task = Some(task);
                with_current(|shard| {
                    if shard.belongs_to(self) {
                        let dest = shard.least_loaded();
                        shard.send_item(
                            dest,
                            InboxItem::Stealable(task.take().expect("task present")),
                        );
                    }
                });
                if let Some(task) = task {
                    self.injector.push(task);
                    if self.is_shutting_down() {
                        // Shutdown may have drained the injector already
                        // (its step 5): whoever sees the task first drops it.
                        self.drain_injector();
                    } else {
                        self.wake_one_sleeping();
                    }
                }
            }
        }
    }
}

/// Work for [`Handle::send_job`]: it runs on the destination shard and
/// owns the box it travelled in.
pub trait ShardJob: Send + 'static {
    /// Runs the job on the shard it was sent to.
    fn run(self: Box<Self>);
}

/// A cheap, cloneable reference to a runtime, usable from any thread.
///
/// Spawning through a handle works from shard threads and from outside
/// threads alike; from a shard, deliveries to other shards are batched until
/// the end of the current tick.
#[derive(Debug, Clone)]
pub struct Handle {
    shared: Arc<Shared>,
}

impl Handle {
    /// The handle of the runtime whose shard is running the caller.
    ///
    /// # Panics
    ///
    /// Outside a mailring shard; see [`Handle::try_current`].
    pub fn current() -> Handle {
        Self::try_current().expect("Handle::current() called outside a mailring shard")
    }

    /// Records, for the runtime's [`ShutdownReport`], what a layer running
    /// on it (a server, a pool) finished (`drained`) and cut off
    /// (`dropped`) when it stopped; `name` says which.
    pub fn report_drained(&self, name: impl Into<String>, drained: u64, dropped: u64) {
        self.shared
            .tally
            .layers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(crate::panic::DrainReport {
                name: name.into(),
                drained,
                dropped,
            });
    }

    /// The runtime's id (what a shard's `runtime_id` compares with).
    pub(crate) fn id(&self) -> u64 {
        self.shared.id
    }

    /// The handle of the current shard's runtime, if the caller runs on one.
    pub fn try_current() -> Option<Handle> {
        with_current(|shard| Handle {
            shared: shard.shared.clone(),
        })
    }

    /// The number of shards.
    pub fn shards(&self) -> usize {
        self.shared.shards.len()
    }

    /// Spawns a `Send` future as [`Placement::Stealable`].
    pub fn spawn<F>(&self, future: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.spawn_with(Placement::Stealable, future)
    }

    /// Spawns a `Send` future pinned to `shard`.
    ///
    /// # Panics
    ///
    /// When `shard` is not a shard of this runtime.
    pub fn spawn_on<F>(&self, shard: ShardId, future: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.spawn_with(Placement::Pinned(shard), future)
    }

    /// Spawns a `Send` future with the given [`Placement`].
    ///
    /// # Panics
    ///
    /// When the placement names a shard this runtime does not have.
    pub fn spawn_with<F>(&self, placement: Placement, future: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let task = Task::new(future, self.shared.clone(), 0);
        let handle = JoinHandle::new(task.clone());
        self.shared.submit(task, placement);
        handle
    }

    /// Builds a future on `shard` with a `Send` factory and runs it there.
    ///
    /// The future itself need not be `Send` (it may hold `Rc` or `RefCell`
    /// state): it is created, polled and dropped on `shard` only.
    ///
    /// # Panics
    ///
    /// When `shard` is not a shard of this runtime.
    pub fn spawn_local_on<G, Fut>(&self, shard: ShardId, factory: G) -> JoinHandle<Fut::Output>
    where
        G: FnOnce() -> Fut + Send + 'static,
        Fut: Future + 'static,
        Fut::Output: Send + 'static,
    {
        let future = LocalFactory::Factory(Some(factory));
        let task = Task::new(future, self.shared.clone(), shard.index());
        let handle = JoinHandle::new(task.clone());
        self.shared.submit(task, Placement::Pinned(shard));
        handle
    }

    /// Runs blocking work on the blocking pool, off the shards.
    pub fn spawn_blocking<F, T>(&self, f: F) -> JoinHandle<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        self.shared.blocking.spawn(f)
    }

    /// Runs `f` on `shard`: in its next tick, or at once when called on
    /// `shard` itself.
    ///
    /// The closure is boxed on the calling thread and freed on `shard`'s;
    /// for a stream of work between shards see [`Handle::send_job`].
    ///
    /// # Panics
    ///
    /// When `shard` is not a shard of this runtime.
    pub fn run_on(&self, shard: ShardId, f: impl FnOnce() + Send + 'static) {
        assert!(shard.index() < self.shards(), "{shard} does not exist");
        self.shared
            .deliver(shard.index(), InboxItem::Call(Box::new(f)));
    }

    /// Runs `job` on `shard` (in its next tick, or at once when called on
    /// `shard` itself), as [`Handle::run_on`] does
    /// a closure, except that the job receives its own box: it may put it
    /// back on a list for the sender to reuse instead of freeing it on the
    /// destination's thread (a closure's box is freed where it runs, and a
    /// block allocated on one thread and freed on another keeps both
    /// threads off their allocator's fast path).
    ///
    /// A job that no shard takes (the runtime shut down) is dropped unrun.
    ///
    /// # Panics
    ///
    /// When `shard` is not a shard of this runtime.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::mpsc;
    /// use mailring::{ShardId, ShardJob};
    ///
    /// struct Report(mpsc::Sender<Option<ShardId>>);
    ///
    /// impl ShardJob for Report {
    ///     fn run(self: Box<Self>) {
    ///         let _ = self.0.send(mailring::current_shard());
    ///     }
    /// }
    ///
    /// let rt = mailring::Runtime::builder().shards(2).build()?;
    /// let (tx, rx) = mpsc::channel();
    /// rt.handle().send_job(ShardId::new(1), Box::new(Report(tx)));
    /// assert_eq!(rx.recv().unwrap(), Some(ShardId::new(1)));
    /// # Ok::<(), mailring::BuildError>(())
    /// ```
    pub fn send_job(&self, shard: ShardId, job: Box<dyn ShardJob>) {
        assert!(shard.index() < self.shards(), "{shard} does not exist");
        self.shared.deliver(shard.index(), InboxItem::Job(job));
    }

    /// Sends a tiny message to `shard` from any thread; see [`crate::hot`].
    ///
    /// # Panics
    ///
    /// When `shard` is not a shard of this runtime.
    pub fn send_tiny(&self, shard: ShardId, tag: u16, value: u32) {
        assert!(shard.index() < self.shards(), "{shard} does not exist");
        let mut sent = false;
        with_current(|s| {
            if s.belongs_to(&self.shared) {
                s.send_tiny(shard.index(), tag, value);
                sent = true;
            }
        });
        if !sent {
            let msg = TinyMessage {
                from: None,
                tag,
                value,
            };
            self.shared
                .push_from_outside(shard.index(), InboxItem::Tiny(msg));
        }
    }

    /// Registers `count` consecutive new coalesced hot tags (see
    /// [`crate::hot`]) on a running runtime and returns them: what
    /// [`Builder::coalesced_hot_tag`](crate::Builder::coalesced_hot_tag)
    /// does before `build()`, for a layer started on a runtime built
    /// elsewhere (an actor system on the runtime of `#[mailring::main]`).
    /// Every shard treats them as hot from the moment this returns: each
    /// adopts a tag the first time it sends, receives or waits on it. From
    /// any thread or shard; it never waits.
    ///
    /// The tags come from [`hot::DYNAMIC_HOT_TAGS`](crate::hot::DYNAMIC_HOT_TAGS)
    /// up, skipping the ones the `Builder` registered; two holders never
    /// have the same tag at once: a tag is handed out again only after
    /// [`release_hot_tags`](Self::release_hot_tags) gave it back.
    ///
    /// # Errors
    ///
    /// [`HotTagError::Exhausted`](crate::hot::HotTagError::Exhausted) when
    /// fewer than `count` consecutive tags are left.
    ///
    /// # Examples
    ///
    /// ```
    /// use mailring::{hot, Placement, ShardId};
    /// let rt = mailring::Runtime::builder().shards(2).build()?;
    /// let tags = rt.handle().register_hot_tags(2).expect("tags left");
    /// let tag = tags.start;
    /// let total = rt.block_on(async move {
    ///     let consumer = mailring::spawn_with(Placement::Pinned(ShardId::new(1)), async move {
    ///         let mut sum = 0;
    ///         while sum < 10 {
    ///             sum += hot::next_hot_count(tag).await;
    ///         }
    ///         sum
    ///     });
    ///     for v in 1..=4 {
    ///         hot::send_tiny(ShardId::new(1), tag, v);
    ///     }
    ///     consumer.await.unwrap()
    /// });
    /// assert_eq!(total, 10);
    /// # Ok::<(), mailring::BuildError>(())
    /// ```
    pub fn register_hot_tags(
        &self,
        count: u16,
    ) -> Result<std::ops::Range<u16>, crate::hot::HotTagError> {
        self.shared
            .dynamic_hot
            .register(count, &self.shared.config.hot_tags)
    }

    /// Gives back tags [`register_hot_tags`](Self::register_hot_tags)
    /// handed out, for a later registration to reuse: what a layer
    /// started on this runtime does when it stops (an actor system shut
    /// down gives back its credit tags), so that layers started and
    /// stopped in turn never run out.
    ///
    /// The caller must have stopped using the tags: nothing sends on them,
    /// takes their counts or waits on them any more. Tiny messages already
    /// sent (queued in a shard's tick, or on their way through a ring)
    /// are waited out and discarded with what the counters hold: every
    /// shard begins a new tick (taking its inbox, reaping its ring) twice
    /// over, three rounds in turn, before the counts are dropped and the
    /// tags go back, so none of them reaches the tags' next owner. The
    /// work runs in a task of its own: dropping the returned future (a
    /// timeout) leaves it to finish. From any thread or shard; it waits
    /// for every shard.
    ///
    /// # Errors
    ///
    /// [`HotTagError::NotRegistered`](crate::hot::HotTagError::NotRegistered)
    /// when a tag was not handed out, or was given back already (nothing
    /// is given back then).
    ///
    /// # Examples
    ///
    /// ```
    /// let rt = mailring::Runtime::builder().shards(2).build()?;
    /// let handle = rt.handle().clone();
    /// let tags = handle.register_hot_tags(2).expect("tags left");
    /// let again = rt.block_on(async move {
    ///     handle.release_hot_tags(tags.clone()).await.expect("handed out");
    ///     handle.register_hot_tags(2).expect("tags left")
    /// });
    /// assert_eq!(again, 0xC000..0xC002);
    /// # Ok::<(), mailring::BuildError>(())
    /// ```
    pub fn release_hot_tags(
        &self,
        tags: std::ops::Range<u16>,
    ) -> impl Future<Output = Result<(), crate::hot::HotTagError>> + Send + 'static {
        let begun = self.shared.dynamic_hot.begin_release(tags.clone());
        let handle = self.clone();
        let release = begun.map(|()| {
            // Its own task: the tags are not left half released if the
            // caller gives up waiting.
            self.spawn_on(ShardId::new(0), async move {
                let done = handle.wait_out_and_reset(tags.clone()).await;
                handle.shared.dynamic_hot.end_release(tags, done);
            })
        });
        async move {
            match release {
                Ok(task) => {
                    let _ = task.await;
                    Ok(())
                }
                Err(e) => Err(e),
            }
        }
    }

    /// Waits out the tiny messages on their way on `tags` (see
    /// [`release_hot_tags`](Self::release_hot_tags)), then drops what every
    /// shard holds for them; `false` when a shard could not take part (the
    /// runtime is shutting down).
    async fn wait_out_and_reset(&self, tags: std::ops::Range<u16>) -> bool {
        let shards = self.shards();
        let mut done = true;
        // Each round: every shard begins two ticks after it sees the
        // round's task (the first publishes what the shard had queued, the
        // second's start takes its inbox and reaps its ring). Three rounds
        // in turn: the first publishes, the second reaps what it
        // published, the third allows for a completion queue that
        // overflowed or a send the ring refused.
        for _ in 0..3 {
            let ticks: Vec<_> = (0..shards)
                .map(|s| self.spawn_on(ShardId::new(s), two_tick_starts()))
                .collect();
            for tick in ticks {
                done &= tick.await.is_ok();
            }
        }
        let resets: Vec<_> = (0..shards)
            .map(|s| {
                let tags = tags.clone();
                self.spawn_on(ShardId::new(s), async move {
                    let mut wake = Vec::new();
                    crate::shard::with_current(|shard| shard.hot_mut().reset(tags, &mut wake));
                    for waker in wake {
                        waker.wake();
                    }
                })
            })
            .collect();
        for reset in resets {
            done &= reset.await.is_ok();
        }
        done
    }

    /// Runs `future` on shard 0 and blocks until it finishes (see
    /// [`Runtime::block_on`]); for code that holds a `Handle`, not the
    /// `Runtime`.
    ///
    /// # Panics
    ///
    /// As [`Runtime::block_on`].
    #[track_caller]
    pub fn block_on<F>(&self, future: F) -> F::Output
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        assert_not_on_shard(&self.shared, "block_on");
        let handle = self.spawn_on(ShardId::new(0), future);
        finish_blocking(wait_on_thread(handle))
    }

    /// Builds a future on shard 0 and blocks until it finishes (see
    /// [`Runtime::block_on_local`]).
    ///
    /// # Panics
    ///
    /// As [`Runtime::block_on`].
    #[track_caller]
    pub fn block_on_local<G, Fut>(&self, factory: G) -> Fut::Output
    where
        G: FnOnce() -> Fut + Send + 'static,
        Fut: Future + 'static,
        Fut::Output: Send + 'static,
    {
        assert_not_on_shard(&self.shared, "block_on_local");
        let handle = self.spawn_local_on(ShardId::new(0), factory);
        finish_blocking(wait_on_thread(handle))
    }

    /// The shard running the caller, when it is one of this runtime's shards.
    ///
    /// Unlike [`crate::current_shard`], a shard of another runtime gives `None`.
    pub fn local_shard(&self) -> Option<ShardId> {
        with_current(|s| s.belongs_to(&self.shared).then(|| ShardId::new(s.index()))).flatten()
    }

    /// The shard with the fewest runnable tasks, as last published by each
    /// shard (the calling shard counts its own queues and this tick's batches
    /// and wins ties). From an outside thread: the least loaded published shard.
    pub fn least_loaded_shard(&self) -> ShardId {
        if let Some(Some(i)) =
            with_current(|s| s.belongs_to(&self.shared).then(|| s.least_loaded()))
        {
            return ShardId::new(i);
        }
        let best = self
            .shared
            .shards
            .iter()
            .enumerate()
            .min_by_key(|(_, r)| r.load.load(Ordering::Relaxed))
            .map_or(0, |(i, _)| i);
        ShardId::new(best)
    }

    /// Moves this runtime's clock forward by `by`, for tests: timers, sleeps,
    /// timeouts and intervals see the time jump at once (every shard is woken
    /// to fire what became due), while real time keeps running underneath.
    /// The clock never goes back.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let rt = mailring::Runtime::builder().shards(1).build()?;
    /// let h = rt.handle().clone();
    /// let slept = rt.block_on(async move {
    ///     let sleep = mailring::spawn(mailring::time::sleep(Duration::from_secs(3600)));
    ///     mailring::time::sleep(Duration::from_millis(1)).await;
    ///     h.advance_clock(Duration::from_secs(3600));
    ///     sleep.await.is_ok()
    /// });
    /// assert!(slept);
    /// # Ok::<(), mailring::BuildError>(())
    /// ```
    pub fn advance_clock(&self, by: std::time::Duration) {
        let ns = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        // Saturating: a wrapped offset would move the clock back.
        let _ = self.shared.clock_offset_ns.fetch_update(
            Ordering::AcqRel,
            Ordering::Acquire,
            |offset| Some(offset.saturating_add(ns)),
        );
        for i in 0..self.shards() {
            self.run_on(ShardId::new(i), || {});
        }
    }

    /// This runtime's clock (see [`Handle::advance_clock`]); the real
    /// monotonic clock unless a test moved it.
    pub fn now(&self) -> std::time::Instant {
        self.shared.now()
    }

    /// A snapshot of every shard's counters.
    pub fn stats(&self) -> RuntimeStats {
        RuntimeStats {
            shards: self
                .shared
                .shards
                .iter()
                .enumerate()
                .map(|(i, r)| r.counters.snapshot(i, r.features))
                .collect(),
            external_wake: self.shared.external_mode,
            external_wakes: self.shared.external_wakes.load(Ordering::Relaxed),
            injector_depth: self.shared.injector.len() as u64,
        }
    }
}

/// A running set of shards.
///
/// Dropping it shuts it down (see [`Runtime::shutdown`]).
#[derive(Debug)]
pub struct Runtime {
    handle: Handle,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Runtime {
    /// A [`Builder`] with the defaults.
    pub fn builder() -> Builder {
        Builder::new()
    }

    /// A runtime with the default settings.
    ///
    /// # Errors
    ///
    /// See [`Builder::build`].
    pub fn new() -> Result<Runtime, BuildError> {
        Builder::new().build()
    }

    pub(crate) fn start(builder: Builder) -> Result<Runtime, BuildError> {
        crate::driver::probe::check_sysctl(&builder)?;
        let n = builder.shards;
        let (setup_tx, setup_rx) = mpsc::channel::<SetupReport>();
        let mut threads = Vec::with_capacity(n);
        let mut gos = Vec::with_capacity(n);
        let mut stealers = Vec::with_capacity(n);
        let abort = |gos: Vec<mpsc::Sender<Option<Arc<Shared>>>>,
                     threads: Vec<thread::JoinHandle<()>>| {
            for go in gos {
                let _ = go.send(None);
            }
            for t in threads {
                let _ = t.join();
            }
        };
        for index in 0..n {
            let worker = Worker::new_fifo();
            stealers.push(worker.stealer());
            let (go_tx, go_rx) = mpsc::channel();
            let (b, tx) = (builder.clone(), setup_tx.clone());
            let spawned = thread::Builder::new()
                .name(format!("{}-{index}", builder.thread_name))
                .spawn(move || shard_main(index, b, worker, tx, go_rx));
            match spawned {
                Ok(t) => {
                    threads.push(t);
                    gos.push(go_tx);
                }
                Err(source) => {
                    abort(gos, threads);
                    return Err(BuildError::ThreadSpawn {
                        shard: index,
                        source,
                    });
                }
            }
        }
        drop(setup_tx);
        let mut reports: Vec<Option<_>> = (0..n).map(|_| None).collect();
        let mut first_error: Option<(usize, BuildError)> = None;
        for (index, report) in setup_rx.iter() {
            match report {
                Ok(r) => reports[index] = Some(r),
                Err(e) => {
                    if first_error.as_ref().is_none_or(|(i, _)| index < *i) {
                        first_error = Some((index, e));
                    }
                }
            }
        }
        if let Some((_, e)) = first_error {
            abort(gos, threads);
            return Err(e);
        }
        let mut remotes = Vec::with_capacity(n);
        for (report, stealer) in reports.into_iter().zip(stealers) {
            let Some((target, features)) = report else {
                abort(gos, threads);
                return Err(BuildError::Config(
                    "a shard thread exited during setup".into(),
                ));
            };
            remotes.push(ShardRemote {
                inbox: Arc::new(CachePadded::new(Inbox::new(remotes.len(), n))),
                stealer,
                target,
                features,
                load: CachePadded::new(AtomicUsize::new(0)),
                counters: CachePadded::new(ShardCounters::default()),
            });
        }
        let send_msg_ring = remotes.iter().all(|r| r.target.send_msg_ring);
        let shared = Arc::new_cyclic(|me| Shared {
            id: NEXT_RUNTIME_ID.fetch_add(1, Ordering::Relaxed),
            shards: remotes.into_boxed_slice(),
            injector: Injector::new(),
            config: Config {
                idle: builder.idle,
                task_budget: builder.task_budget,
                hot_tags: builder.hot_tags.clone(),
                hot_wake_threshold: builder.hot_wake_threshold,
                multishot_recvmsg_errno: builder.faults.multishot_recvmsg_errno,
                unannounced_fd_moves: builder.faults.unannounced_fd_moves,
                no_buf_ring_status: builder.faults.no_buf_ring_status,
            },
            shutdown_barrier: ShutdownBarrier::new(n + 1),
            dynamic_hot: Arc::new(crate::hot::DynamicHotTags::new()),
            round_robin: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            wake_gate: RwLock::new(true),
            external_mode: ExternalWakeMode::resolve(builder.external_wake, send_msg_ring),
            external_wakes: AtomicU64::new(0),
            blocking: BlockingPool::new(
                builder.blocking_threads,
                builder.thread_name.clone(),
                builder.free_cpus.clone(),
                me.clone(),
            ),
            clock_offset_ns: AtomicU64::new(0),
            cpu_pressure: match builder.idle {
                IdlePolicy::Spin(max) if !max.is_zero() => crate::cpu_pressure::CpuPressure::probe(
                    builder
                        .faults
                        .cpu_pressure_path
                        .as_deref()
                        .unwrap_or(std::path::Path::new("/proc/pressure/cpu")),
                ),
                _ => crate::cpu_pressure::CpuPressure::off(),
            },
            panics: PanicLog::new(builder.panic_hook.clone()),
            tally: ShutdownTally::default(),
        });
        shared.register();
        for go in gos {
            let _ = go.send(Some(shared.clone()));
        }
        Ok(Runtime {
            handle: Handle { shared },
            threads,
        })
    }

    /// The runtime's [`Handle`].
    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Spawns a `Send` future as [`Placement::Stealable`]; see [`Handle::spawn`].
    pub fn spawn<F>(&self, future: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handle.spawn(future)
    }

    /// Runs `future` on shard 0 and blocks the calling thread until it finishes.
    ///
    /// # Panics
    ///
    /// Re-raises the future's panic; panics when called from a shard thread
    /// of this or any other mailring runtime (it would block that shard).
    #[track_caller]
    pub fn block_on<F>(&self, future: F) -> F::Output
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handle.block_on(future)
    }

    /// Builds a future on shard 0 with `factory` (the future need not be `Send`)
    /// and blocks until it finishes. `#[mailring::main]` uses this.
    ///
    /// # Panics
    ///
    /// As [`Runtime::block_on`].
    #[track_caller]
    pub fn block_on_local<G, Fut>(&self, factory: G) -> Fut::Output
    where
        G: FnOnce() -> Fut + Send + 'static,
        Fut: Future + 'static,
        Fut::Output: Send + 'static,
    {
        self.handle.block_on_local(factory)
    }

    /// A snapshot of every shard's counters; see [`Handle::stats`].
    pub fn stats(&self) -> RuntimeStats {
        self.handle.stats()
    }

    /// Stops the runtime: every task is dropped, every in-flight operation is
    /// cancelled and completed, rings and eventfds are closed, threads joined.
    ///
    /// Steps (the shard side is in the `shard` module docs):
    ///
    /// 1. Set the shutdown flag and wake every shard.
    /// 2. Close the external wake gate (no outside thread touches a shard fd after this).
    /// 3. Meet the shards at the barrier, after which no doorbell targets any ring.
    /// 4. Join the shard threads (each cancels its ops, waits for them, closes its ring).
    /// 5. Drop injected tasks that never started, then stop the blocking pool:
    ///    queued blocking jobs are dropped unrun, running ones waited for up
    ///    to [`SHUTDOWN_OP_GRACE`].
    ///
    /// It finishes in bounded time whatever the user leaked: operations whose
    /// completion does not come within [`SHUTDOWN_OP_GRACE`] are leaked, not
    /// waited for, and blocking jobs still running after it have their
    /// threads detached. The [`ShutdownReport`] says what was cancelled, dropped
    /// unrun and leaked, and which callbacks panicked during the runtime's life.
    ///
    /// Called on one of the runtime's own shards (from a task), it cannot
    /// wait for that shard: the shutdown finishes on a thread of its own once
    /// the calling task returns, and the report returned is the one of that
    /// moment (nothing cancelled yet).
    ///
    /// # Examples
    ///
    /// ```
    /// let rt = mailring::Runtime::builder().shards(2).build()?;
    /// rt.spawn(std::future::pending::<()>()).detach();
    /// rt.block_on(mailring::time::sleep(std::time::Duration::from_millis(5)));
    /// let report = rt.shutdown();
    /// assert_eq!(report.tasks_cancelled, 1);
    /// assert_eq!(report.ops_leaked, 0);
    /// # Ok::<(), mailring::BuildError>(())
    /// ```
    pub fn shutdown(mut self) -> ShutdownReport {
        self.shutdown_inner(None)
    }

    /// [`shutdown`](Self::shutdown), waiting at most about `limit` for the
    /// shard threads: one still running user code that never yields (a
    /// task stuck in a blocking loop, which nothing can interrupt) is
    /// detached instead of joined, and counted in
    /// [`ShutdownReport::shards_abandoned`], with the shards that wait for it
    /// (a shard closes its ring only once every shard has stopped posting
    /// to it, so the others wait for a stuck one). What such a shard owns stays
    /// alive (never freed under it) and it finishes the shutdown on its own
    /// if its code ever returns. Blocking jobs get their own grace
    /// ([`SHUTDOWN_OP_GRACE`]) after it, as in `shutdown`.
    ///
    /// Called on one of the runtime's own shards, it behaves as `shutdown`
    /// there (it cannot wait on that shard).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let rt = mailring::Runtime::builder().shards(1).build()?;
    /// let report = rt.shutdown_timeout(Duration::from_secs(1));
    /// assert_eq!(report.shards_abandoned, 0);
    /// # Ok::<(), mailring::BuildError>(())
    /// ```
    pub fn shutdown_timeout(mut self, limit: Duration) -> ShutdownReport {
        self.shutdown_inner(Some(limit))
    }

    fn shutdown_inner(&mut self, limit: Option<Duration>) -> ShutdownReport {
        let shared = self.handle.shared.clone();
        if self.threads.is_empty() {
            return shared.shutdown_report();
        }
        let threads = std::mem::take(&mut self.threads);
        if with_current(|s| s.belongs_to(&shared)).unwrap_or(false) {
            // Dropped on one of its own shards: finish on another thread once this
            // shard's current task returns.
            let report = shared.shutdown_report();
            let on_thread = shared.clone();
            let spawned = thread::Builder::new()
                .name("mailring-shutdown".into())
                .spawn(move || shutdown_runtime(&on_thread, threads, None));
            if spawned.is_err() {
                // No thread to wait on (out of threads or memory): the
                // shards are told to stop, and each finishes on its own
                // once this task returns; nobody joins them.
                shutdown_without_waiting(&shared);
            }
            return report;
        }
        shutdown_runtime(&shared, threads, limit);
        shared.shutdown_report()
    }
}

/// Steps 1–3 of shutdown, from the thread that shuts the runtime down:
/// every shard told to stop and woken, outside wakes refused, and this
/// thread's arrival at the barrier (it does not wait there).
fn begin_shutdown(shared: &Arc<Shared>) {
    // 1.
    shared.shutdown.store(true, Ordering::SeqCst);
    for i in 0..shared.shards.len() {
        shared.wake_from_outside(i);
    }
    // 2.
    *shared.wake_gate.write().unwrap_or_else(|p| p.into_inner()) = false;
    // 3.
    shared.shutdown_barrier.arrive();
}

fn shutdown_runtime(
    shared: &Arc<Shared>,
    threads: Vec<thread::JoinHandle<()>>,
    limit: Option<Duration>,
) {
    begin_shutdown(shared);
    // 4.
    let deadline = limit.and_then(|l| Instant::now().checked_add(l));
    let mut abandoned = 0;
    for t in threads {
        if let Some(deadline) = deadline {
            while !t.is_finished() && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(1));
            }
            if !t.is_finished() {
                abandoned += 1;
                continue; // Dropping the handle detaches the thread.
            }
        }
        let _ = t.join();
    }
    shared
        .tally
        .shards_abandoned
        .fetch_add(abandoned, Ordering::Relaxed);
    // 5.
    finish_shutdown(shared, SHUTDOWN_OP_GRACE);
}

/// Shutdown when no thread can wait for the shards (see
/// [`Runtime::shutdown`] on a shard whose helper thread could not start).
fn shutdown_without_waiting(shared: &Arc<Shared>) {
    begin_shutdown(shared);
    finish_shutdown(shared, Duration::ZERO);
}

/// Step 5: what no shard owns (the injector's unstarted tasks, the
/// blocking pool) goes.
fn finish_shutdown(shared: &Arc<Shared>, blocking_grace: Duration) {
    shared.drain_injector();
    let abandoned = shared.blocking.shutdown(blocking_grace);
    shared
        .tally
        .blocking_abandoned
        .fetch_add(abandoned, Ordering::Relaxed);
}

/// Step 3's meeting point: every shard waits there for the others and for
/// the shutting-down thread, which only arrives (it joins the shard
/// threads afterwards, with or without a limit; see `Runtime::shutdown_timeout`).
#[derive(Debug)]
pub(crate) struct ShutdownBarrier {
    arrived: Mutex<usize>,
    all_here: Condvar,
    expected: usize,
}

impl ShutdownBarrier {
    fn new(expected: usize) -> Self {
        ShutdownBarrier {
            arrived: Mutex::new(0),
            all_here: Condvar::new(),
            expected,
        }
    }

    /// Arrives and waits for every other participant (a shard).
    pub(crate) fn wait(&self) {
        let mut arrived = self.arrive_locked();
        while *arrived < self.expected {
            arrived = self
                .all_here
                .wait(arrived)
                .unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Arrives without waiting (the shutting-down thread).
    fn arrive(&self) {
        drop(self.arrive_locked());
    }

    fn arrive_locked(&self) -> std::sync::MutexGuard<'_, usize> {
        let mut arrived = self.arrived.lock().unwrap_or_else(|p| p.into_inner());
        *arrived += 1;
        if *arrived >= self.expected {
            self.all_here.notify_all();
        }
        arrived
    }
}

impl Shared {
    /// Drops the unstarted tasks in the injector (shutdown's step 5, and a
    /// stealable spawn from outside that raced it).
    fn drain_injector(&self) {
        loop {
            match self.injector.steal() {
                Steal::Success(task) => {
                    if task.shutdown(None) {
                        self.tally.tasks_cancelled.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Steal::Retry => continue,
                Steal::Empty => break,
            }
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        let _ = self.shutdown_inner(None);
    }
}

fn finish_blocking<T>(result: Result<T, JoinError>) -> T {
    match result {
        Ok(v) => v,
        Err(JoinError::Panicked(p)) => std::panic::resume_unwind(p),
        Err(JoinError::Cancelled) => {
            panic!("the runtime shut down before the blocked-on future finished")
        }
    }
}

struct ThreadWaker {
    thread: Thread,
    notified: AtomicBool,
}

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.notified.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

/// Blocking a shard thread (of this runtime or any other) stalls every task
/// on it and deadlocks as soon as the blocked-on future waits for one of
/// them, so it is refused outright, as Tokio refuses to start a runtime
/// from within a runtime.
#[track_caller]
fn assert_not_on_shard(shared: &Arc<Shared>, what: &str) {
    match with_current(|s| s.belongs_to(shared)) {
        None => {}
        Some(true) => panic!(
            "{what} (of a Runtime, Handle or ActorSystem) called from one of the runtime's own \
             shards: it would block \
             that shard; spawn the future instead (mailring::spawn) and await its JoinHandle"
        ),
        Some(false) => panic!(
            "{what} (of a Runtime, Handle or ActorSystem) called from a shard of another \
             mailring runtime: blocking that \
             shard stalls its tasks and deadlocks if the future waits on one of them; spawn \
             the future on this runtime (Handle::spawn) and await its JoinHandle, or call \
             {what} from a thread that is not a shard (e.g. spawn_blocking)"
        ),
    }
}

/// Polls `future` on the calling (non-shard) thread, parking between wakes.
pub(crate) fn wait_on_thread<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let signal = Arc::new(ThreadWaker {
        thread: thread::current(),
        notified: AtomicBool::new(false),
    });
    let waker = Waker::from(signal.clone());
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(v) = Pin::as_mut(&mut future).poll(&mut cx) {
            return v;
        }
        while !signal.notified.swap(false, Ordering::Acquire) {
            thread::park();
        }
    }
}

/// Completes once the shard it runs on has begun two more ticks than the
/// one it was first polled in (every tick begins by taking its inbox and
/// reaping its ring, and the one between ends by publishing what it
/// queued).
async fn two_tick_starts() {
    let mut first = None;
    std::future::poll_fn(|cx| {
        let now = crate::shard::current_tick().unwrap_or(0);
        let first = *first.get_or_insert(now);
        if now >= first.wrapping_add(2) || crate::shard::current_tick().is_none() {
            return std::task::Poll::Ready(());
        }
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    })
    .await;
}
