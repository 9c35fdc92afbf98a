//! Runtime statistics: counters each shard keeps about itself, cheap enough to leave on.
//!
//! Each counter is written by one thread only (its shard) with a relaxed
//! load + store, never a read-modify-write; [`crate::Runtime::stats`] reads them
//! with relaxed loads, so a snapshot is consistent per counter, not across counters.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::builder::ExternalWake;
use crate::driver::RingFeatures;
use crate::panic::{CallbackKind, PanicCounts};

/// A counter written by one thread.
#[derive(Debug, Default)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    #[inline]
    pub(crate) fn add(&self, n: u64) {
        self.0.store(self.0.load(Relaxed).wrapping_add(n), Relaxed);
    }

    #[inline]
    pub(crate) fn set(&self, v: u64) {
        self.0.store(v, Relaxed);
    }

    pub(crate) fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// The counters of one shard (see the module docs for the write rule).
#[derive(Debug, Default)]
pub(crate) struct ShardCounters {
    pub(crate) polls: Counter,
    pub(crate) local_queue_depth: Counter,
    pub(crate) stealable_queue_depth: Counter,
    pub(crate) inbox_items: Counter,
    pub(crate) steal_attempts: Counter,
    pub(crate) steal_successes: Counter,
    pub(crate) tasks_stolen: Counter,
    pub(crate) doorbells_sent: Counter,
    pub(crate) doorbells_coalesced: Counter,
    pub(crate) prewakes: Counter,
    pub(crate) tiny_sent: Counter,
    pub(crate) tiny_received: Counter,
    pub(crate) tiny_dropped: Counter,
    pub(crate) ops_in_flight: Counter,
    pub(crate) ops_offloaded: Counter,
    pub(crate) timers_armed: Counter,
    pub(crate) parks: Counter,
    pub(crate) spin_wakeups: Counter,
    pub(crate) spins_skipped: Counter,
    pub(crate) cq_overflows: Counter,
    pub(crate) direct_descriptors: Counter,
    pub(crate) owned_tasks: Counter,
    /// `io_uring_enter` calls that failed with an error other than a retry.
    pub(crate) ring_errors: Counter,
    pub(crate) last_ring_errno: Counter,
    /// Panics caught per [`CallbackKind`]; incremented with an atomic add
    /// (the one exception to the write rule: a task dropped off its shard at
    /// shutdown reports here from the runtime's thread), a cold path.
    pub(crate) panics: [AtomicU64; CallbackKind::COUNT],
}

impl ShardCounters {
    pub(crate) fn count_panic(&self, kind: CallbackKind) {
        self.panics[kind.index()].fetch_add(1, Relaxed);
    }

    pub(crate) fn panic_counts(&self) -> PanicCounts {
        PanicCounts::from_array(std::array::from_fn(|i| self.panics[i].load(Relaxed)))
    }
}

/// A snapshot of one shard.
///
/// The gauges (queue depths, owned tasks, ops in flight, timers) are as the
/// shard last published them: on each of its idle passes, and every 16th
/// busy one; the counters are exact.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardStats {
    /// The shard's index.
    pub shard: usize,
    /// What the kernel accepted for this shard's ring.
    pub ring: RingFeatures,
    /// Started and pinned tasks waiting to run.
    pub local_queue_depth: u64,
    /// Unstarted stealable tasks waiting in this shard's deque.
    pub stealable_queue_depth: u64,
    /// Live tasks owned by this shard (started or pinned, not finished).
    pub owned_tasks: u64,
    /// Items received through the inbox.
    pub inbox_items: u64,
    /// Task polls.
    pub polls: u64,
    /// Times this shard looked for work to steal.
    pub steal_attempts: u64,
    /// Steal attempts that found work.
    pub steal_successes: u64,
    /// Tasks this shard stole and ran.
    pub tasks_stolen: u64,
    /// Doorbells this shard rang into sleeping shards.
    pub doorbells_sent: u64,
    /// Deliveries by this shard that needed no doorbell (target awake or already rung).
    pub doorbells_coalesced: u64,
    /// Doorbells of those rung early, mid-tick, because the tick was batching
    /// work for a sleeping shard ([`crate::prewake`]).
    pub prewakes: u64,
    /// Tiny messages posted by this shard (after hot-counter summing).
    pub tiny_sent: u64,
    /// Tiny messages received.
    pub tiny_received: u64,
    /// Tiny messages dropped on arrival: their tag's queue on this shard
    /// already held [`hot::TINY_QUEUE_LIMIT`](crate::hot::TINY_QUEUE_LIMIT)
    /// unconsumed messages.
    pub tiny_dropped: u64,
    /// Operations in flight on this shard's ring.
    pub ops_in_flight: u64,
    /// Of those, the ones the kernel most likely runs on an io-wq worker
    /// thread (file writes, syncs, path operations); while any is, the
    /// shard parks instead of spinning when idle.
    pub ops_offloaded: u64,
    /// Live timers on this shard.
    pub timers_armed: u64,
    /// Times the shard blocked in `io_uring_enter`.
    pub parks: u64,
    /// Times spinning found work before the shard blocked.
    pub spin_wakeups: u64,
    /// Idle periods in which the shard blocked at once instead of spinning,
    /// because other threads were waiting for CPUs (see
    /// [`IdlePolicy::Spin`](crate::IdlePolicy::Spin)).
    pub spins_skipped: u64,
    /// Times the completion queue overflowed and was flushed.
    pub cq_overflows: u64,
    /// Occupied slots of the shard's direct-descriptor table (gauge).
    pub direct_descriptors: u64,
    /// `io_uring_enter` calls that failed (other than the retryable `EINTR`,
    /// `EAGAIN`, `EBUSY`); the shard goes on and submits again next tick.
    pub ring_errors: u64,
    /// The errno of the last of those failures (0: none), to say why.
    pub last_ring_errno: u64,
    /// Panics this shard caught in user code, per kind (see [`crate::panic`]).
    pub panics: PanicCounts,
}

/// A snapshot of the whole runtime; see [`crate::Runtime::stats`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RuntimeStats {
    /// One entry per shard.
    pub shards: Vec<ShardStats>,
    /// How outside threads wake shards.
    pub external_wake: ExternalWakeMode,
    /// Wakes sent to shards by threads outside the runtime.
    pub external_wakes: u64,
    /// Tasks waiting in the global injector (stealable spawns from outside).
    pub injector_depth: u64,
}

/// The external wake mechanism in use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExternalWakeMode {
    /// `IORING_REGISTER_SEND_MSG_RING`.
    SendMsgRing,
    /// An eventfd per shard.
    #[default]
    EventFd,
}

impl ExternalWakeMode {
    pub(crate) fn resolve(requested: ExternalWake, available: bool) -> Self {
        match requested {
            ExternalWake::EventFd => ExternalWakeMode::EventFd,
            _ if available => ExternalWakeMode::SendMsgRing,
            _ => ExternalWakeMode::EventFd,
        }
    }
}

impl ShardCounters {
    pub(crate) fn snapshot(&self, shard: usize, ring: RingFeatures) -> ShardStats {
        ShardStats {
            shard,
            ring,
            local_queue_depth: self.local_queue_depth.get(),
            stealable_queue_depth: self.stealable_queue_depth.get(),
            owned_tasks: self.owned_tasks.get(),
            inbox_items: self.inbox_items.get(),
            polls: self.polls.get(),
            steal_attempts: self.steal_attempts.get(),
            steal_successes: self.steal_successes.get(),
            tasks_stolen: self.tasks_stolen.get(),
            doorbells_sent: self.doorbells_sent.get(),
            doorbells_coalesced: self.doorbells_coalesced.get(),
            prewakes: self.prewakes.get(),
            tiny_sent: self.tiny_sent.get(),
            tiny_received: self.tiny_received.get(),
            tiny_dropped: self.tiny_dropped.get(),
            ops_in_flight: self.ops_in_flight.get(),
            ops_offloaded: self.ops_offloaded.get(),
            timers_armed: self.timers_armed.get(),
            parks: self.parks.get(),
            spin_wakeups: self.spin_wakeups.get(),
            spins_skipped: self.spins_skipped.get(),
            cq_overflows: self.cq_overflows.get(),
            direct_descriptors: self.direct_descriptors.get(),
            ring_errors: self.ring_errors.get(),
            last_ring_errno: self.last_ring_errno.get(),
            panics: self.panic_counts(),
        }
    }
}
