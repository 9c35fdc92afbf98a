//! Panics in user code that a shard runs, and what shutdown leaves behind.
//!
//! A shard runs many kinds of user code besides task polls: closures sent
//! with [`Handle::run_on`](crate::Handle::run_on), [`ShardJob`](crate::ShardJob)s,
//! tick-end callbacks, wakers of foreign futures, and the `Drop` of
//! everything it disposes of. None of it may unwind through the shard loop:
//! an unwind there would drop the shard field by field (its ring before its
//! op table) while tasks and in-flight operations still refer to it.
//!
//! So every such call runs inside a `catch_unwind` at the place it is made,
//! where the shard's own state is consistent (no borrow held, nothing half
//! moved). A caught panic is
//!
//! 1. counted per [`CallbackKind`] in the shard's [`ShardStats`](crate::ShardStats)
//!    (`panics`),
//! 2. kept as a [`PanicRecord`] (the first [`MAX_PANIC_RECORDS`] of a
//!    runtime's life) for the [`ShutdownReport`], and
//! 3. passed to the hook installed with [`Builder::on_panic`](crate::Builder::on_panic),
//!
//! and the shard carries on with its next piece of work. The payload is
//! dropped inside a `catch_unwind` too (a payload whose `Drop` panics is
//! leaked). Rust itself aborts the process only for a panic raised while
//! another one unwinds (a `Drop` that panics during an unwind); that is
//! outside any runtime's reach.
//!
//! A catch costs nothing on the path that does not panic (the unwinding
//! tables are consulted only when a panic happens), so the hot paths
//! (a tick-end hook per destination, a job per cross-shard batch) keep
//! their cost.

use std::any::Any;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

use crate::shard::ShardId;
use crate::task::join::panic_message;

/// How many [`PanicRecord`]s a runtime keeps (later panics are only counted).
pub const MAX_PANIC_RECORDS: usize = 64;

/// The kinds of user code a shard runs, for counting and reporting panics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CallbackKind {
    /// A task's poll (its `JoinHandle` also resolves to `JoinError::Panicked`).
    Task,
    /// A closure sent with [`Handle::run_on`](crate::Handle::run_on).
    RunOn,
    /// A [`ShardJob`](crate::ShardJob).
    Job,
    /// A tick-end callback ([`defer_to_tick_end`](crate::defer_to_tick_end),
    /// [`TickEndHook`](crate::TickEndHook)).
    TickEnd,
    /// A waker the shard woke (a timer, an I/O completion, a hot counter).
    Waker,
    /// The `Drop` of something the shard disposed of: a future, a task's
    /// output nobody awaited, a closure or job that never ran, a waker.
    Drop,
    /// A panic the runtime's own code raised: a bug in mailring. The shard
    /// reports it and goes on.
    Runtime,
    /// A message handler, caught and reported by a layer above the runtime
    /// with [`report_caught`] (the actor layer, which also applies its
    /// supervision policy).
    Handler,
    /// A lifecycle hook (an actor's `on_start`, `on_passivate`, `on_stop`),
    /// reported with [`report_caught`].
    LifecycleHook,
    /// A factory that builds user state (an actor's factory or `activate`),
    /// reported with [`report_caught`].
    Factory,
}

impl CallbackKind {
    /// Every kind, in the order of [`PanicCounts`]'s fields.
    pub const ALL: [CallbackKind; 10] = [
        CallbackKind::Task,
        CallbackKind::RunOn,
        CallbackKind::Job,
        CallbackKind::TickEnd,
        CallbackKind::Waker,
        CallbackKind::Drop,
        CallbackKind::Runtime,
        CallbackKind::Handler,
        CallbackKind::LifecycleHook,
        CallbackKind::Factory,
    ];

    pub(crate) const COUNT: usize = Self::ALL.len();

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for CallbackKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CallbackKind::Task => "task",
            CallbackKind::RunOn => "run_on closure",
            CallbackKind::Job => "shard job",
            CallbackKind::TickEnd => "tick-end callback",
            CallbackKind::Waker => "waker",
            CallbackKind::Drop => "drop",
            CallbackKind::Runtime => "runtime",
            CallbackKind::Handler => "handler",
            CallbackKind::LifecycleHook => "lifecycle hook",
            CallbackKind::Factory => "factory",
        })
    }
}

/// Panics caught on one shard, per [`CallbackKind`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PanicCounts {
    /// Task polls (and a `LocalFactory`'s factory) that panicked.
    pub task: u64,
    /// `run_on` closures.
    pub run_on: u64,
    /// Shard jobs.
    pub job: u64,
    /// Tick-end callbacks.
    pub tick_end: u64,
    /// Wakers.
    pub waker: u64,
    /// `Drop`s of what the shard disposed of.
    pub drop: u64,
    /// The runtime's own code (a bug in mailring).
    pub runtime: u64,
    /// Message handlers (reported by the actor layer).
    pub handler: u64,
    /// Lifecycle hooks (reported by the actor layer).
    pub lifecycle_hook: u64,
    /// Factories (reported by the actor layer).
    pub factory: u64,
}

impl PanicCounts {
    pub(crate) fn from_array(counts: [u64; CallbackKind::COUNT]) -> Self {
        let [task, run_on, job, tick_end, waker, drop, runtime, handler, lifecycle_hook, factory] =
            counts;
        PanicCounts {
            task,
            run_on,
            job,
            tick_end,
            waker,
            drop,
            runtime,
            handler,
            lifecycle_hook,
            factory,
        }
    }

    /// The count for one kind.
    pub fn get(&self, kind: CallbackKind) -> u64 {
        match kind {
            CallbackKind::Task => self.task,
            CallbackKind::RunOn => self.run_on,
            CallbackKind::Job => self.job,
            CallbackKind::TickEnd => self.tick_end,
            CallbackKind::Waker => self.waker,
            CallbackKind::Drop => self.drop,
            CallbackKind::Runtime => self.runtime,
            CallbackKind::Handler => self.handler,
            CallbackKind::LifecycleHook => self.lifecycle_hook,
            CallbackKind::Factory => self.factory,
        }
    }

    /// Every kind added up.
    pub fn total(&self) -> u64 {
        CallbackKind::ALL.iter().map(|k| self.get(*k)).sum()
    }
}

/// A panic a shard caught, as the [`Builder::on_panic`](crate::Builder::on_panic)
/// hook sees it.
#[derive(Debug)]
#[non_exhaustive]
pub struct PanicEvent<'a> {
    /// The shard that caught it; `None` for code run off the shards (an
    /// unstarted task dropped by the runtime's own thread at shutdown).
    pub shard: Option<ShardId>,
    /// What kind of user code panicked.
    pub kind: CallbackKind,
    /// The panic's message (`"<non-string panic payload>"` when it has none).
    pub message: &'a str,
}

/// A panic a runtime caught, kept for its [`ShutdownReport`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PanicRecord {
    /// The shard that caught it (`None`: off the shards).
    pub shard: Option<ShardId>,
    /// What kind of user code panicked.
    pub kind: CallbackKind,
    /// The panic's message.
    pub message: String,
}

/// What the runtime's shutdown found and how it disposed of it; returned by
/// [`Runtime::shutdown`](crate::Runtime::shutdown).
///
/// Shutdown never waits without bound: tasks are dropped, queued closures
/// and jobs are dropped unrun, in-flight operations are cancelled, and an
/// operation whose completion does not arrive within
/// [`SHUTDOWN_OP_GRACE`](crate::SHUTDOWN_OP_GRACE) has the memory it lent
/// the kernel leaked rather than freed (the kernel could still write it).
/// A [`spawn_blocking`](crate::spawn_blocking) job still running after
/// another such grace period has its thread detached, not joined.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShutdownReport {
    /// Tasks that had not finished and were dropped (started or not); their
    /// `JoinHandle`s resolved to `JoinError::Cancelled`.
    pub tasks_cancelled: u64,
    /// `run_on` closures and shard jobs that no shard ran (queued when the
    /// shards stopped, or sent after).
    pub dropped_unrun: u64,
    /// Operations in flight when shutdown began, cancelled and completed.
    pub ops_cancelled: u64,
    /// Operations whose completion never came within the grace period: the
    /// buffers and descriptors they hold are leaked, not freed.
    pub ops_leaked: u64,
    /// Blocking jobs ([`spawn_blocking`](crate::spawn_blocking)) still
    /// running at the end of shutdown's grace period
    /// ([`SHUTDOWN_OP_GRACE`](crate::SHUTDOWN_OP_GRACE)); their threads were
    /// detached. Each finishes on its own, and its `JoinHandle` resolves
    /// when the job ends.
    pub blocking_abandoned: u64,
    /// Shard threads still running user code that never yields (a task or
    /// callback stuck in a blocking loop) when
    /// [`Runtime::shutdown_timeout`](crate::Runtime::shutdown_timeout)'s limit
    /// ran out, and the shards waiting for them to stop posting to their
    /// rings: detached, not joined. Each finishes the shutdown on its own
    /// if that code ever returns. Always 0 for `shutdown()` and `Drop`,
    /// which wait for them.
    pub shards_abandoned: u64,
    /// Every panic caught during the runtime's life, per kind and shard
    /// (summed over shards).
    pub panics: PanicCounts,
    /// The first [`MAX_PANIC_RECORDS`] panics caught, in the order caught.
    pub panic_records: Vec<PanicRecord>,
    /// What layers above the runtime reported when they stopped
    /// ([`Handle::report_drained`](crate::Handle::report_drained)): a
    /// server's connections finished within its grace period, and cut off.
    pub drained: Vec<DrainReport>,
}

/// One layer's line in [`ShutdownReport::drained`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrainReport {
    /// Which layer (e.g. `"server 127.0.0.1:7000"`).
    pub name: String,
    /// Work it finished while stopping (connections that closed within the
    /// grace period).
    pub drained: u64,
    /// Work it cut off (connections closed with work left).
    pub dropped: u64,
}

impl ShutdownReport {
    /// Whether shutdown found nothing to report: no task cancelled, nothing
    /// dropped unrun, no operation cancelled or leaked, no blocking job
    /// or shard abandoned, no panic.
    pub fn is_clean(&self) -> bool {
        self.tasks_cancelled == 0
            && self.dropped_unrun == 0
            && self.ops_cancelled == 0
            && self.ops_leaked == 0
            && self.blocking_abandoned == 0
            && self.shards_abandoned == 0
            && self.panics.total() == 0
    }

    /// Adds another report's figures to this one (the actor layer merges
    /// its own with the runtime's).
    pub fn merge(&mut self, other: ShutdownReport) {
        self.tasks_cancelled += other.tasks_cancelled;
        self.dropped_unrun += other.dropped_unrun;
        self.ops_cancelled += other.ops_cancelled;
        self.ops_leaked += other.ops_leaked;
        self.blocking_abandoned += other.blocking_abandoned;
        self.shards_abandoned += other.shards_abandoned;
        let mut counts = [0; CallbackKind::COUNT];
        for kind in CallbackKind::ALL {
            counts[kind.index()] = self.panics.get(kind) + other.panics.get(kind);
        }
        self.panics = PanicCounts::from_array(counts);
        let room = MAX_PANIC_RECORDS.saturating_sub(self.panic_records.len());
        self.panic_records
            .extend(other.panic_records.into_iter().take(room));
    }
}

/// The hook installed with [`Builder::on_panic`](crate::Builder::on_panic).
#[derive(Clone)]
pub(crate) struct PanicHook(pub(crate) Arc<dyn Fn(&PanicEvent<'_>) + Send + Sync>);

impl fmt::Debug for PanicHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PanicHook(..)")
    }
}

/// The runtime-wide part of panic reporting: the records and the hook.
#[derive(Debug, Default)]
pub(crate) struct PanicLog {
    records: Mutex<Vec<PanicRecord>>,
    hook: Option<PanicHook>,
}

impl PanicLog {
    pub(crate) fn new(hook: Option<PanicHook>) -> Self {
        PanicLog {
            records: Mutex::new(Vec::new()),
            hook,
        }
    }

    /// Keeps a record of a caught panic and calls the hook, neither of
    /// which may unwind into the caller. The caller keeps the payload (a
    /// task's goes to its `JoinHandle`; others go to [`drop_payload`]).
    pub(crate) fn report(
        &self,
        shard: Option<ShardId>,
        kind: CallbackKind,
        payload: &(dyn Any + Send),
    ) {
        let message = panic_message(payload);
        {
            let mut records = self.records.lock().unwrap_or_else(|p| p.into_inner());
            if records.len() < MAX_PANIC_RECORDS {
                records.push(PanicRecord {
                    shard,
                    kind,
                    message: message.to_owned(),
                });
            }
        }
        if let Some(hook) = &self.hook {
            let event = PanicEvent {
                shard,
                kind,
                message,
            };
            // A hook that panics is not called again for its own panic.
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| (hook.0)(&event))) {
                drop_payload(p);
            }
        }
    }

    pub(crate) fn records(&self) -> Vec<PanicRecord> {
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Reports a panic that code running on a shard caught itself (a layer
/// above the runtime that runs user code in its own `catch_unwind`, as the
/// actor layer does for handlers, lifecycle hooks and factories): it is
/// counted in the shard's stats, kept for the [`ShutdownReport`] and passed
/// to the [`Builder::on_panic`](crate::Builder::on_panic) hook, as the
/// shard's own catches are. The caller keeps the payload.
///
/// Returns `false` (and reports nothing) off a shard.
pub fn report_caught(kind: CallbackKind, payload: &(dyn Any + Send)) -> bool {
    crate::shard::with_current(|shard| {
        shard
            .shared
            .report_panic(Some(shard.index()), kind, payload)
    })
    .is_some()
}

/// Drops a panic payload; one whose own `Drop` panics is leaked.
pub fn drop_payload(payload: Box<dyn Any + Send>) {
    if let Err(again) = catch_unwind(AssertUnwindSafe(move || drop(payload))) {
        std::mem::forget(again);
    }
}
