//! mailring-actors: keyed virtual actors on mailring's io_uring shards.
//!
//! An actor is a task on one shard that owns its state and handles one
//! message at a time. Define one with `#[derive(Actor)]`, its messages with
//! `#[derive(Message)]`, and one [`Handler`] impl per message type:
//!
//! ```
//! use mailring_actors::{Actor, ActorSystem, Ctx, Handler, Message, Runtime};
//!
//! #[derive(Actor)]
//! #[actor(key = u64, activate = Partition::new, handles(Append))]
//! struct Partition { next: u64 }
//!
//! impl Partition {
//!     fn new(_key: &u64) -> Self { Partition { next: 0 } }
//! }
//!
//! #[derive(Message)]
//! #[message(reply = u64)]
//! struct Append(Vec<u8>);
//!
//! impl Handler<Append> for Partition {
//!     async fn handle(&mut self, _m: Append, _cx: &mut Ctx<Self>) -> u64 {
//!         self.next += 1;
//!         self.next
//!     }
//! }
//!
//! let system = ActorSystem::start(Runtime::builder().shards(2))?;
//! let p = system.keyed::<Partition>(42); // valid before the actor exists
//! let offset = system.block_on(async move {
//!     p.tell(Append(b"a".to_vec())).unwrap();   // fire and forget
//!     p.ask(Append(b"b".to_vec())).await        // request/response
//! });
//! assert_eq!(offset, Ok(2));
//! system.shutdown();
//! # Ok::<(), mailring::BuildError>(())
//! ```
//!
//! How a message flows: [`Addr::tell`] finds the actor's shard (a stable hash
//! of the key for sticky actors, a directory for stealable ones); on that
//! shard it is a table lookup and a queue push; from another shard it joins
//! the sender's per-destination batch, which the runtime publishes with one
//! `IORING_OP_MSG_RING` doorbell at the end of the sender's tick. See the
//! `local` and `runner` module docs for the details, and `docs/actors.md`.
//!
//! # Entry point
//!
//! `#[mailring_actors::main]` starts a runtime and an actor system on it
//! (one set of shard threads), runs the body on shard 0, then shuts both
//! down; `main` may take the system's [`SystemHandle`]:
//!
//! ```
//! use mailring_actors::{Actor, Ctx, Handler, Message, Placement, SystemHandle};
//!
//! #[derive(Actor, Default)]
//! #[actor(handles(Ping))]
//! struct Pinger;
//!
//! #[derive(Message)]
//! #[message(reply = &'static str)]
//! struct Ping;
//!
//! impl Handler<Ping> for Pinger {
//!     async fn handle(&mut self, _m: Ping, _cx: &mut Ctx<Self>) -> &'static str { "pong" }
//! }
//!
//! #[mailring_actors::main(shards = 2)]
//! async fn main(system: SystemHandle) {
//!     let pinger = system.spawn_actor(Placement::RoundRobin, Pinger::default);
//!     assert_eq!(pinger.ask(Ping).await, Ok("pong"));
//! }
//! ```
//!
//! On a runtime started elsewhere (`#[mailring::main]`, or shared with
//! other layers), use [`ActorSystem::start_on`].
// Unsafe code lives in `reply` (the ask cell), `erased` (the registry's
// typed lookup), `replica` (the biased count of a shard's system
// reference) and `finish` (a handler future's skipped drop) alone;
// everything else is safe Rust.
#![deny(unsafe_code)]
// Under `cfg(loom)` the count's methods that only the gated-out modules
// call are unused.
#![cfg_attr(loom, allow(dead_code, unused_imports))]

// The derive macros name this crate by its path; unit tests use them inside it.
#[cfg(test)]
extern crate self as mailring_actors;

// Under `cfg(loom)` only the bounded-mailbox count and its sync switch are
// compiled (the runtime then exports its own model-checked parts alone):
// `RUSTFLAGS="--cfg loom" cargo test -p mailring-actors --lib --release
// loom_tests` model-checks `capacity`.
mod capacity;
mod loom;

#[cfg(not(loom))]
#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;
#[cfg(not(loom))]
mod actor;
#[cfg(not(loom))]
mod addr;
#[cfg(not(loom))]
mod answer;
#[cfg(not(loom))]
mod ctx;
#[cfg(not(loom))]
mod cycle;
#[cfg(not(loom))]
#[allow(unsafe_code)]
mod erased;
#[cfg(not(loom))]
mod error;
#[cfg(not(loom))]
#[allow(unsafe_code)]
mod finish;
#[cfg(not(loom))]
mod flow;
#[cfg(not(loom))]
mod local;
#[cfg(not(loom))]
mod mailbox;
#[cfg(not(loom))]
mod recipient;
#[cfg(not(loom))]
#[allow(unsafe_code)]
mod replica;
#[cfg(not(loom))]
#[allow(unsafe_code)]
mod reply;
#[cfg(not(loom))]
mod route;
#[cfg(not(loom))]
mod runner;
#[cfg(not(loom))]
mod stats;
#[cfg(not(loom))]
mod system;
#[cfg(not(loom))]
pub mod testkit;
#[cfg(not(loom))]
mod topic;

#[cfg(not(loom))]
pub use crate::actor::{
    Accepts, Actor, ActorConfig, ActorKey, ActorPlacement, Envelope, Handler, Hooks, Message,
    SendsTo, Supervision, SupervisionPolicy,
};
#[cfg(not(loom))]
pub use crate::addr::{ActorId, Addr, KeyedRef, LocalActors, LocalAddr};
#[cfg(not(loom))]
pub use crate::ctx::{Ctx, StreamMessage, TimerHandle, STREAM_WINDOW};
#[cfg(not(loom))]
pub use crate::error::{AskError, PlaceError, RunNowError, StopReason, SubscribeError, TellError};
#[cfg(not(loom))]
pub use crate::recipient::Recipient;
#[cfg(not(loom))]
pub use crate::reply::{Asked, Reply, ReplyTo};
#[cfg(not(loom))]
pub use crate::route::{route_hash, RouteHasher, RouteKey};
#[cfg(not(loom))]
pub use crate::stats::{ActorStats, ActorTypeStats};
#[cfg(not(loom))]
pub use crate::system::{ActorSystem, SystemConfig, SystemHandle, SystemShutdownReport};
#[cfg(not(loom))]
pub use crate::topic::Topic;
/// The stream trait [`Ctx::attach_stream`] takes (`futures_core::Stream`).
pub use futures_core::Stream;
#[cfg(not(loom))]
pub use mailring;
#[cfg(not(loom))]
pub use mailring::{Placement, Runtime, ShardId};
#[cfg(not(loom))]
pub use mailring_macros::{actors_main as main, Actor, Message, RouteKey};

/// Sent to a watcher when the actor it watches stops (see [`Ctx::watch`]).
#[cfg(not(loom))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Terminated {
    /// The actor that stopped.
    pub id: ActorId,
    /// Why.
    pub reason: StopReason,
}

#[cfg(not(loom))]
impl Message for Terminated {
    type Reply = ();
}

/// The Rust samples of `README.md`, compiled (and run) by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeSamples;

/// The Rust samples of the actors guide (`docs/actors.md`), compiled (and
/// run) by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../../docs/actors.md")]
pub struct ActorsGuideSamples;

/// The samples of the runtime and I/O guides (`docs/runtime.md`,
/// `docs/io.md`), compiled (and run) by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../../docs/runtime.md")]
#[doc = include_str!("../../docs/io.md")]
pub struct RuntimeGuideSamples;

/// The samples of "Coming from kameo, actix or Tokio"
/// (`docs/coming-from.md`), compiled and run by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../../docs/coming-from.md")]
pub struct ComingFromSamples;
