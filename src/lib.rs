//! mailring: an actor/session runtime whose tasks live on io_uring shards.
//!
//! A **shard** is one thread with its own io_uring ring, a local run queue, a
//! deque of stealable tasks, and an inbox for work from elsewhere. Tasks are
//! placed by a [`Placement`]; a task that has started never changes shard.
//! Shards that sleep are woken by **doorbells**: one `IORING_OP_MSG_RING` per
//! burst from the sender's own ring, never one per message.
//!
//! # The loop every shard runs
//!
//! ```text
//! drain inbox → reap completions → fire timers → poll up to N tasks
//!   → publish this tick's cross-shard batches (one doorbell per sleeping target)
//! nothing to do? steal unstarted tasks (injector, then peers in random order)
//! still nothing? spin for the idle budget, then block in io_uring_enter
//! ```
//!
//! # Entry point
//!
//! `#[mailring::main]` turns an `async fn main` into a `fn main` that starts
//! a runtime, runs the body on shard 0 (it need not be `Send`) and shuts the
//! runtime down:
//!
//! ```
//! #[mailring::main(shards = 2)]
//! async fn main() {
//!     let h = mailring::spawn(async { 40 + 2 });
//!     assert_eq!(h.await.unwrap(), 42);
//! }
//! ```
//!
//! # Examples
//!
//! ```
//! use mailring::{Placement, ShardId};
//!
//! let rt = mailring::Runtime::builder().shards(2).build()?;
//! let sum = rt.block_on(async {
//!     let handles: Vec<_> = (0..8u64)
//!         .map(|i| mailring::spawn_with(Placement::Sticky(i), async move { i * 2 }))
//!         .collect();
//!     let mut sum = 0;
//!     for h in handles {
//!         sum += h.await.unwrap();
//!     }
//!     sum
//! });
//! assert_eq!(sum, 56);
//! # Ok::<(), mailring::BuildError>(())
//! ```
//!
//! When io_uring cannot be used here (disabled by sysctl, refused by a seccomp
//! profile, a kernel without `IORING_OP_MSG_RING`), [`Builder::build`] returns
//! a [`BuildError`] that names the cause and the remedy.

#![cfg_attr(loom, allow(dead_code, unused_imports))]

mod doorbell;
mod loom;
pub mod sync;

#[cfg(not(loom))]
mod blocking;
#[cfg(not(loom))]
pub mod buf;
#[cfg(not(loom))]
mod builder;

mod cpu_pressure;
#[cfg(not(loom))]
mod driver;
#[cfg(not(loom))]
mod error;
#[cfg(not(loom))]
pub mod fs;
#[cfg(not(loom))]
pub mod hot;
#[cfg(not(loom))]
pub mod net;
#[cfg(not(loom))]
mod op;
#[cfg(not(loom))]
pub mod panic;
#[cfg(not(loom))]
mod placement;
#[cfg(not(loom))]
pub mod pool;
#[cfg(not(loom))]
pub mod process;
#[cfg(not(loom))]
mod runtime;
#[cfg(not(loom))]
mod shard;
#[cfg(not(loom))]
pub mod signal;
#[cfg(not(loom))]
mod stats;
#[cfg(not(loom))]
mod task;
#[cfg(not(loom))]
pub mod time;

#[cfg(not(loom))]
pub use crate::api::*;

#[cfg(not(loom))]
mod api {
    use std::future::{poll_fn, Future};
    use std::task::Poll;

    pub use crate::builder::{Builder, ExternalWake, FaultInjection, IdlePolicy, MAX_SHARDS};
    pub use crate::driver::RingFeatures;
    pub use crate::error::BuildError;
    pub use crate::panic::{CallbackKind, DrainReport, PanicCounts, ShutdownReport};
    pub use crate::placement::{
        route_hash, shard_for_hash, sticky_shard, Placement, RouteHasher, RouteKey,
    };
    pub use crate::runtime::{Handle, Runtime, ShardJob, SHUTDOWN_OP_GRACE};
    pub use crate::shard::{PendingProbe, ShardId};
    pub use crate::stats::{ExternalWakeMode, RuntimeStats, ShardStats};
    pub use crate::task::join::{JoinError, JoinHandle};
    pub use mailring_macros::main;

    use crate::shard::{with_current, Shard, TickEnd};
    use crate::task::Task;
    use std::rc::Rc;

    /// The current shard's handle, for the free function `call`; outside a
    /// shard the panic names that call and what to use instead.
    #[track_caller]
    fn handle_for(call: &str, instead: &str) -> Handle {
        match Handle::try_current() {
            Some(handle) => handle,
            None => panic!(
                "mailring::{call} called outside a mailring shard: \
                 call it from a task of a runtime, or use {instead} with the runtime's handle"
            ),
        }
    }

    /// Spawns a `Send` future as [`Placement::Stealable`] on the current runtime.
    ///
    /// # Panics
    ///
    /// Outside a mailring shard; use [`Handle::spawn`] there.
    #[track_caller]
    pub fn spawn<F>(future: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        handle_for("spawn", "Handle::spawn").spawn(future)
    }

    /// Spawns a `Send` future pinned to `shard` of the current runtime.
    ///
    /// # Panics
    ///
    /// Outside a mailring shard, or when `shard` does not exist.
    #[track_caller]
    pub fn spawn_on<F>(shard: ShardId, future: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        handle_for("spawn_on", "Handle::spawn_on").spawn_on(shard, future)
    }

    /// Spawns a `Send` future with `placement` on the current runtime.
    ///
    /// # Panics
    ///
    /// Outside a mailring shard, or when the placement names a missing shard.
    #[track_caller]
    pub fn spawn_with<F>(placement: Placement, future: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        handle_for("spawn_with", "Handle::spawn_with").spawn_with(placement, future)
    }

    /// Spawns a future that need not be `Send` on the current shard; it runs
    /// only there.
    ///
    /// # Panics
    ///
    /// Outside a mailring shard.
    // Always inlined: a future passed through one more call is one more
    // copy of it (an actor's message loop is over a kilobyte), and the
    // inliner's choice here changed with unrelated code (+180 instructions
    // a spawned actor when it did not inline).
    #[inline(always)]
    pub fn spawn_local<F>(future: F) -> JoinHandle<F::Output>
    where
        F: Future + 'static,
        F::Output: 'static,
    {
        with_current(move |shard| {
            let task = Task::new(future, shard.shared.clone(), shard.index());
            task.register_owned(shard);
            let handle = JoinHandle::new(task.clone());
            shard.push_local(task);
            handle
        })
        .expect("mailring::spawn_local called outside a mailring shard")
    }

    /// Runs blocking work on the current runtime's blocking pool.
    ///
    /// # Panics
    ///
    /// Outside a mailring shard; use [`Handle::spawn_blocking`] there.
    #[track_caller]
    pub fn spawn_blocking<F, T>(f: F) -> JoinHandle<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        handle_for("spawn_blocking", "Handle::spawn_blocking").spawn_blocking(f)
    }

    /// The shard running the caller, if any.
    pub fn current_shard() -> Option<ShardId> {
        with_current(|shard| ShardId::new(shard.index()))
    }

    /// Lets the shard run other ready tasks before continuing.
    pub async fn yield_now() {
        let mut yielded = false;
        poll_fn(|cx| {
            if yielded {
                return Poll::Ready(());
            }
            yielded = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        })
        .await;
    }

    /// Starts a runtime with the default settings, runs `f`'s future on shard 0
    /// until it finishes, and shuts the runtime down.
    ///
    /// # Errors
    ///
    /// A [`BuildError`] when the runtime cannot start.
    ///
    /// # Examples
    ///
    /// ```
    /// let n = mailring::run(|handle| async move { handle.shards() })?;
    /// assert!(n >= 1);
    /// # Ok::<(), mailring::BuildError>(())
    /// ```
    pub fn run<G, Fut>(f: G) -> Result<Fut::Output, BuildError>
    where
        G: FnOnce(Handle) -> Fut + Send + 'static,
        Fut: Future + 'static,
        Fut::Output: Send + 'static,
    {
        let rt = Runtime::new()?;
        let handle = rt.handle().clone();
        let out = rt.block_on_local(move || f(handle));
        rt.shutdown();
        Ok(out)
    }

    /// Starts waking `shard` now if it sleeps, because the caller is batching
    /// work for it that will be published at the end of this tick.
    ///
    /// A sleeping shard takes several microseconds to come back from
    /// `io_uring_enter`; ringing its doorbell when the first delivery of a
    /// long tick is batched overlaps that with the rest of the tick, instead
    /// of paying it after the publication. A shard that is awake (or already
    /// rung) costs one load here. The actor layer calls this for the first
    /// delivery of a tick to each shard. Does nothing off a shard, or for the
    /// caller's own shard.
    #[inline]
    pub fn prewake(shard: ShardId) {
        with_current(|s| s.prewake(shard.index()));
    }

    /// Runs `f` on the calling shard at the end of its current tick, just
    /// before the tick's cross-shard batches are published (earlier if they
    /// are published early: a batch reached its size limit, or a task
    /// finished and its deliveries must be visible first).
    ///
    /// This is the hook for layers that batch their own typed messages per
    /// destination (the actor layer does): the first send of a tick queues one
    /// callback that hands the whole batch to the runtime, so the batch still
    /// travels with this tick's doorbell.
    ///
    /// A callback may queue more; they run in the same tick end, before the
    /// batches go. So a callback that queues itself again every time never
    /// lets the tick end (its shard runs nothing else): queue again only
    /// when there is something new to hand over.
    ///
    /// # Errors
    ///
    /// Gives `f` back when the caller is not running on a shard.
    pub fn defer_to_tick_end<F: FnOnce() + 'static>(f: F) -> Result<(), F> {
        let mut f = Some(f);
        with_current(|shard| {
            if let Some(f) = f.take() {
                shard.defer_to_tick_end(TickEnd::Once(Box::new(f)));
            }
        });
        match f {
            None => Ok(()),
            Some(f) => Err(f),
        }
    }

    /// A callback for [`defer_hook_to_tick_end`]: an object the caller keeps
    /// (in an `Rc`) and queues as often as it needs, with no allocation per
    /// queueing.
    pub trait TickEndHook {
        /// Runs when the tick it was queued in publishes its batches (at its
        /// end, or earlier, as for [`defer_to_tick_end`]), with the argument
        /// it was queued with.
        fn at_tick_end(&self, arg: usize);
    }

    /// Runs `hook.at_tick_end(arg)` on the calling shard at the end of its
    /// current tick, as [`defer_to_tick_end`] does a closure, without boxing
    /// anything: for a callback queued on every busy tick (the actor layer
    /// queues one per destination shard and actor type).
    ///
    /// # Errors
    ///
    /// Gives `hook` back when the caller is not running on a shard.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::cell::Cell;
    /// use std::rc::Rc;
    /// use mailring::TickEndHook;
    ///
    /// struct Sum(Cell<usize>);
    ///
    /// impl TickEndHook for Sum {
    ///     fn at_tick_end(&self, arg: usize) {
    ///         self.0.set(self.0.get() + arg);
    ///     }
    /// }
    ///
    /// let rt = mailring::Runtime::builder().shards(1).build()?;
    /// let total = rt.block_on_local(|| async {
    ///     let sum = Rc::new(Sum(Cell::new(0)));
    ///     for n in 1..=3 {
    ///         assert!(mailring::defer_hook_to_tick_end(sum.clone(), n).is_ok());
    ///     }
    ///     assert_eq!(sum.0.get(), 0);
    ///     // Waiting ends the tick (a yield may not: the task runs again
    ///     // in the same one).
    ///     mailring::time::sleep(std::time::Duration::from_millis(1)).await;
    ///     sum.0.get()
    /// });
    /// assert_eq!(total, 6);
    /// # Ok::<(), mailring::BuildError>(())
    /// ```
    pub fn defer_hook_to_tick_end(
        hook: Rc<dyn TickEndHook>,
        arg: usize,
    ) -> Result<(), Rc<dyn TickEndHook>> {
        let mut hook = Some(hook);
        with_current(|shard| {
            if let Some(h) = hook.take() {
                shard.defer_to_tick_end(TickEnd::Hook(h, arg));
            }
        });
        match hook {
            None => Ok(()),
            Some(h) => Err(h),
        }
    }

    /// Publishes, now, what the calling shard has batched for other shards
    /// in this tick (running the tick-end callbacks first, as the end of the
    /// tick would); a no-op off a shard or when nothing is batched.
    ///
    /// A layer that sends a long burst calls this once a part of it is
    /// ready, so the receiver starts on that part while the burst goes on
    /// (the actor layer does, every 256 messages to one shard).
    #[inline]
    pub fn publish_now() {
        with_current(Shard::publish_pending);
    }

    /// Runs this tick's end callbacks now, so layers hand the batches they
    /// hold for other shards to the runtime's, without publishing; a no-op
    /// off a shard or when none is queued.
    ///
    /// A layer that sends something to another shard outside its batches
    /// (a `run_on` call) calls this first, so that what the task sent
    /// earlier through a batch goes ahead of it, in the order sent.
    #[inline]
    pub fn hand_over_batches() {
        with_current(Shard::run_tick_end);
    }

    /// Applies, now, what other shards have already delivered to the calling
    /// shard (its inbox), in order; a no-op off a shard, when nothing is
    /// pending, or inside a delivery being applied.
    ///
    /// A layer that delivers to a local queue directly (the actor layer's
    /// same-shard sends) calls this first, so that a message never overtakes
    /// one another shard published earlier: if a task on another shard sent
    /// to an actor here and then finished, whoever joins it and then sends
    /// to the same actor sends after it.
    #[inline]
    pub fn receive_pending() {
        with_current(Shard::receive_pending);
    }
}
