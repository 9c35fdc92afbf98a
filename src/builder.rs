//! Runtime configuration: the [`Builder`] and the knobs it sets.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::BuildError;
use crate::runtime::Runtime;

/// The most shards one runtime may have (shard ids travel in 8 bits of a CQE token).
pub const MAX_SHARDS: usize = 256;

/// What a shard does when its run queue empties.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum IdlePolicy {
    /// Keep polling the inbox, the completion queue and peers' queues for this
    /// long before blocking in `io_uring_enter`. A shard that is still spinning
    /// when a message arrives answers it without the ~10 µs cost of a wake-up.
    ///
    /// A shard spins only while CPUs are to spare: where the kernel's CPU
    /// pressure figure (`/proc/pressure/cpu`, machine-wide) shows threads
    /// waiting for a CPU more than a tenth of a 50 ms window (a load generator beside the
    /// server on a small machine, a packed container), shards block at once
    /// for the next 200 ms ([`ShardStats::spins_skipped`](crate::ShardStats::spins_skipped)
    /// counts it), as a spin would keep a CPU from a thread that needs it.
    Spin(Duration),
    /// Block in `io_uring_enter` as soon as there is nothing to do.
    Block,
    /// Never block: an idle shard keeps polling its inbox, its completion
    /// queue, its timers and its peers' queues until shutdown, as
    /// poll-mode runtimes do on dedicated cores (yielding its CPU every 32
    /// polls, so a thread that shares it runs first). Each shard takes a whole
    /// CPU whether or not there is work. What it buys: no wake-up on the
    /// shard itself, and a CPU that never goes idle, so any thread woken
    /// onto it (a peer in the same process, a blocking-pool worker) does not
    /// wait for an idle CPU to come out of its sleep state (~10 µs on the
    /// 2-vCPU VM where it was measured: a 4 KiB pread plus a qd1 round trip
    /// to a blocking echo thread took 20.3 µs with the default policy, 4.96
    /// µs polling; `benches/examples/qd1_pairs.rs`). On
    /// a machine with fewer CPUs than busy threads it takes their time: use
    /// it only where each shard has a core of its own.
    ///
    /// One exception: while a kernel worker (io-wq) runs one of its
    /// operations (a buffered file write the filesystem cannot do without
    /// blocking), a shard blocks as [`Block`](IdlePolicy::Block) would, so
    /// that worker is not kept from the CPU it needs.
    Poll,
}

impl Default for IdlePolicy {
    /// Spins for 50 µs: long enough to cover a cross-shard round trip under
    /// steady load, short enough that an idle runtime costs nothing measurable.
    fn default() -> Self {
        IdlePolicy::Spin(Duration::from_micros(50))
    }
}

/// How threads that have no ring of their own wake a sleeping shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ExternalWake {
    /// `IORING_REGISTER_SEND_MSG_RING` when the kernel has it (6.13+), else an eventfd.
    #[default]
    Auto,
    /// Write to an eventfd that each shard keeps a read armed on.
    EventFd,
    /// `IORING_REGISTER_SEND_MSG_RING`; falls back to the eventfd where missing.
    SendMsgRing,
}

/// Failures to simulate while building, so the error paths can be tested
/// without changing the machine's sysctls or seccomp profile.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct FaultInjection {
    /// Read `io_uring_disabled` from this file instead of `/proc/sys/kernel/io_uring_disabled`.
    pub sysctl_path: Option<PathBuf>,
    /// Make `io_uring_setup` fail with this errno (e.g. `libc::EPERM`, `libc::ENOSYS`).
    pub setup_errno: Option<i32>,
    /// Report this opcode (an `IORING_OP_*` number) as unsupported by the probe.
    pub hide_opcode: Option<u8>,
    /// Answer this many of the submissions a full submission queue forces
    /// with `EBUSY` while completions wait in the completion queue, as
    /// kernels with a CQ overflow backlog do (Linux 6.18 never does), so the
    /// shard's way out of it can be tested.
    pub busy_while_completions_wait: u32,
    /// Fail every multishot datagram receive
    /// ([`UdpSocket::recv_from_multishot`](crate::net::UdpSocket::recv_from_multishot))
    /// with this errno, as kernels before 6.0 answer them (`EINVAL`), so
    /// the fallbacks of its users can be tested.
    pub multishot_recvmsg_errno: Option<i32>,
    /// Answer every move of a direct descriptor to another ring
    /// ([`DirectStream::send_to_shard`](crate::net::DirectStream::send_to_shard))
    /// as the kernel does when it put the socket in the target's table but
    /// could not post the completion that tells the target (`EOVERFLOW`):
    /// the move is sent with `IORING_MSG_RING_CQE_SKIP`, so the target is
    /// not told, and fails with `EOVERFLOW`.
    pub unannounced_fd_moves: bool,
    /// Refuse `IORING_REGISTER_PBUF_STATUS` (how many buffers of a ring
    /// the kernel still holds) with `EINVAL`, as kernels before 6.8 do, so
    /// the multishot receives' way without it can be tested.
    pub no_buf_ring_status: bool,
    /// Read the CPU pressure figure that decides whether idle shards spin
    /// (see [`IdlePolicy::Spin`]) from this file instead of
    /// `/proc/pressure/cpu`.
    pub cpu_pressure_path: Option<PathBuf>,
}

/// Configures and starts a [`Runtime`].
///
/// # Examples
///
/// ```
/// let rt = mailring::Runtime::builder().shards(2).build()?;
/// assert_eq!(rt.block_on(async { 1 + 1 }), 2);
/// # Ok::<(), mailring::BuildError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Builder {
    pub(crate) shards: usize,
    pub(crate) ring_entries: u32,
    pub(crate) pinning: Pinning,
    /// Shard `i` runs on `cpu_plan[i]`: resolved from `pinning` by `build`.
    pub(crate) cpu_plan: Vec<usize>,
    /// With pinning, the CPUs the building thread could run on: the
    /// blocking pool's threads (started from pinned shards, whose affinity
    /// they would inherit) take this set back.
    pub(crate) free_cpus: Vec<usize>,
    pub(crate) idle: IdlePolicy,
    pub(crate) external_wake: ExternalWake,
    pub(crate) hot_tags: Vec<u16>,
    pub(crate) hot_wake_threshold: u64,
    pub(crate) task_budget: usize,
    pub(crate) blocking_threads: usize,
    pub(crate) thread_name: String,
    pub(crate) faults: FaultInjection,
    pub(crate) panic_hook: Option<crate::panic::PanicHook>,
    pub(crate) direct_descriptors: u32,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            shards: std::thread::available_parallelism().map_or(1, |n| n.get()),
            ring_entries: 256,
            pinning: Pinning::None,
            cpu_plan: Vec::new(),
            free_cpus: Vec::new(),
            idle: IdlePolicy::default(),
            external_wake: ExternalWake::Auto,
            hot_tags: Vec::new(),
            hot_wake_threshold: 1,
            task_budget: 64,
            blocking_threads: 16,
            thread_name: "mailring-shard".to_owned(),
            faults: FaultInjection::default(),
            panic_hook: None,
            direct_descriptors: 0,
        }
    }
}

impl Builder {
    /// A builder with the defaults: one shard per available CPU, 256 SQ entries.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a sparse table of `slots` direct descriptors on each
    /// shard's ring (`IORING_REGISTER_FILES2`, kernel 5.19+), for
    /// [`net::DirectStream`](crate::net::DirectStream): sockets used by slot
    /// (no `fget` per operation) and moved between rings with
    /// `IORING_MSG_SEND_FD`. The table counts against `RLIMIT_NOFILE`. A
    /// kernel or limit that refuses it leaves the shard without one
    /// (`RingFeatures::direct_descriptors` is 0): direct streams then fail
    /// with `Unsupported`, and callers fall back to plain descriptors.
    /// Default 0 (no table).
    pub fn direct_descriptors(mut self, slots: u32) -> Self {
        self.direct_descriptors = slots;
        self
    }

    /// Calls `hook` for every panic a shard catches in user code (task
    /// polls, `run_on` closures, shard jobs, tick-end callbacks, wakers,
    /// drops; see [`crate::panic`]), on the shard that caught it, after the
    /// panic was counted in the shard's stats and before the shard goes on.
    ///
    /// The hook must not block; a hook that panics is caught too (and not
    /// called for its own panic). Rust's panic hook (`std::panic::set_hook`)
    /// still runs first, when the panic is raised.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use mailring::panic::CallbackKind;
    ///
    /// let seen = Arc::new(Mutex::new(Vec::new()));
    /// let log = seen.clone();
    /// let rt = mailring::Runtime::builder()
    ///     .shards(1)
    ///     .on_panic(move |event| log.lock().unwrap().push((event.kind, event.message.to_owned())))
    ///     .build()?;
    /// rt.handle().run_on(mailring::ShardId::new(0), || panic!("boom"));
    /// rt.block_on(async {}); // runs after the closure on the same shard
    /// assert_eq!(seen.lock().unwrap()[0], (CallbackKind::RunOn, "boom".to_owned()));
    /// # Ok::<(), mailring::BuildError>(())
    /// ```
    pub fn on_panic(
        mut self,
        hook: impl Fn(&crate::panic::PanicEvent<'_>) + Send + Sync + 'static,
    ) -> Self {
        self.panic_hook = Some(crate::panic::PanicHook(std::sync::Arc::new(hook)));
        self
    }

    /// The number of shards (threads, each with its own ring); 1 to [`MAX_SHARDS`].
    pub fn shards(mut self, n: usize) -> Self {
        self.shards = n;
        self
    }

    /// The number of shards this builder will start (as set by
    /// [`Builder::shards`], or the default).
    pub fn shard_count(&self) -> usize {
        self.shards
    }

    /// Submission queue entries per ring (rounded up to a power of two by the
    /// kernel). The completion queue gets four times as many plus room for doorbells.
    pub fn ring_entries(mut self, entries: u32) -> Self {
        self.ring_entries = entries;
        self
    }

    /// Pins shard `i` to the `i`-th of the CPUs this process may run on (the
    /// affinity of the thread that calls [`build`](Self::build), in
    /// ascending order, wrapping around): under `taskset -c 2,3` shard 0 runs
    /// on CPU 2 and shard 1 on CPU 3.
    pub fn pin_threads(mut self, pin: bool) -> Self {
        self.pinning = if pin { Pinning::Spread } else { Pinning::None };
        self
    }

    /// Pins shard `i` to `cpus[i % cpus.len()]`: to put the shard that
    /// writes durable data on the CPU that takes the disk's interrupts, say
    /// (docs/runtime.md, "CPU pinning").
    ///
    /// [`build`](Self::build) refuses an empty list and a CPU this process
    /// may not run on.
    ///
    /// ```
    /// let rt = mailring::Runtime::builder().shards(2).pin_to_cpus([0]).build()?;
    /// # drop(rt);
    /// # Ok::<(), mailring::BuildError>(())
    /// ```
    pub fn pin_to_cpus(mut self, cpus: impl IntoIterator<Item = usize>) -> Self {
        self.pinning = Pinning::Cpus(cpus.into_iter().collect());
        self
    }

    /// What an idle shard does before it blocks; see [`IdlePolicy`].
    pub fn idle_policy(mut self, policy: IdlePolicy) -> Self {
        self.idle = policy;
        self
    }

    /// How outside threads wake shards; see [`ExternalWake`].
    pub fn external_wake(mut self, mode: ExternalWake) -> Self {
        self.external_wake = mode;
        self
    }

    /// Registers a tiny-message tag whose values are summed into a per-shard hot
    /// counter instead of queued one by one; see [`crate::hot`].
    pub fn coalesced_hot_tag(mut self, tag: u16) -> Self {
        if !self.hot_tags.contains(&tag) {
            self.hot_tags.push(tag);
        }
        self
    }

    /// Registers several coalesced hot tags.
    pub fn coalesced_hot_tags(mut self, tags: impl IntoIterator<Item = u16>) -> Self {
        for tag in tags {
            self = self.coalesced_hot_tag(tag);
        }
        self
    }

    /// A waiting hot-counter consumer is woken as soon as its counter reaches
    /// this value, or when the shard runs out of other work with a non-zero
    /// count. Default 1 (wake on the first increment).
    pub fn hot_counter_wake_threshold(mut self, threshold: u64) -> Self {
        self.hot_wake_threshold = threshold.max(1);
        self
    }

    /// How many tasks a shard polls before it looks at its inbox and ring again.
    pub fn task_budget(mut self, polls: usize) -> Self {
        self.task_budget = polls.max(1);
        self
    }

    /// The most threads `spawn_blocking` may run at once.
    pub fn blocking_threads(mut self, n: usize) -> Self {
        self.blocking_threads = n.max(1);
        self
    }

    /// The prefix of shard thread names (`{prefix}-{index}`).
    pub fn thread_name(mut self, name: impl Into<String>) -> Self {
        self.thread_name = name.into();
        self
    }

    /// Simulates setup failures; for testing error handling.
    pub fn fault_injection(mut self, faults: FaultInjection) -> Self {
        self.faults = faults;
        self
    }

    /// Starts the shards.
    ///
    /// # Errors
    ///
    /// A [`BuildError`] when io_uring cannot be used here (it names the cause and
    /// the remedy), when a setting is out of range, or when a thread cannot start.
    pub fn build(self) -> Result<Runtime, BuildError> {
        if self.shards == 0 || self.shards > MAX_SHARDS {
            return Err(BuildError::Config(format!(
                "shards must be between 1 and {MAX_SHARDS}, got {}",
                self.shards
            )));
        }
        if !(2..=32768).contains(&self.ring_entries) {
            return Err(BuildError::Config(format!(
                "ring_entries must be between 2 and 32768, got {}",
                self.ring_entries
            )));
        }
        let mut builder = self;
        builder.cpu_plan = builder.resolve_pinning()?;
        if !builder.cpu_plan.is_empty() {
            builder.free_cpus = crate::shard::allowed_cpus().unwrap_or_default();
        }
        Runtime::start(builder)
    }

    /// The CPU of each shard (empty: unpinned), checked against the CPUs
    /// this process may run on.
    fn resolve_pinning(&self) -> Result<Vec<usize>, BuildError> {
        let cpus = match &self.pinning {
            Pinning::None => return Ok(Vec::new()),
            Pinning::Spread | Pinning::Cpus(_) => crate::shard::allowed_cpus().map_err(|e| {
                BuildError::Config(format!("cannot read this thread's CPU affinity: {e}"))
            })?,
        };
        let chosen: Vec<usize> = match &self.pinning {
            Pinning::Cpus(list) if list.is_empty() => {
                return Err(BuildError::Config(
                    "pin_to_cpus needs at least one CPU".to_owned(),
                ))
            }
            Pinning::Cpus(list) => {
                if let Some(cpu) = list.iter().find(|c| !cpus.contains(c)) {
                    return Err(BuildError::Config(format!(
                        "pin_to_cpus names CPU {cpu}, which this process may not run on \
                         (its affinity allows {cpus:?})"
                    )));
                }
                list.clone()
            }
            _ => cpus,
        };
        Ok((0..self.shards).map(|i| chosen[i % chosen.len()]).collect())
    }
}

/// How shard threads are pinned (see [`Builder::pin_threads`] and
/// [`Builder::pin_to_cpus`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Pinning {
    None,
    /// Over the CPUs the process may run on.
    Spread,
    Cpus(Vec<usize>),
}
