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
// Unsafe code lives in `reply` (the ask cell), `erased` (the registry's
// typed lookup) and `replica` (the biased count of a shard's system
// reference) alone; everything else is safe Rust.
#![deny(unsafe_code)]

// The derive macros name this crate by its path; unit tests use them inside it.
#[cfg(test)]
extern crate self as mailring_actors;

mod actor;
mod addr;
mod ctx;
#[allow(unsafe_code)]
mod erased;
mod error;
mod flow;
mod local;
mod mailbox;
#[allow(unsafe_code)]
mod replica;
#[allow(unsafe_code)]
mod reply;
mod route;
mod runner;
mod stats;
mod system;
pub mod testkit;

pub use crate::actor::{
    handle_asked, handle_message, Accepts, Actor, ActorConfig, ActorKey, ActorPlacement,
    Continuation, DynEnvelope, Envelope, Handler, Hooks, LocalCache, Message, Supervision,
    SupervisionPolicy, TypeSlot,
};
pub use crate::addr::{ActorId, Addr, KeyedRef, LocalAddr};
pub use crate::ctx::{Ctx, TimerHandle};
pub use crate::error::{AskError, StopReason, TellError};
pub use crate::flow::CREDIT_TAG_BASE;
pub use crate::reply::{Asked, Reply, ReplyTo};
pub use crate::route::{route_hash, RouteHasher};
pub use crate::stats::{ActorStats, ActorTypeStats};
pub use crate::system::{ActorSystem, SystemConfig, SystemHandle};
pub use mailring;
pub use mailring::{Placement, Runtime, ShardId};
pub use mailring_macros::{Actor, Message};

/// Sent to a watcher when the actor it watches stops (see [`Ctx::watch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Terminated {
    /// The actor that stopped.
    pub id: ActorId,
    /// Why.
    pub reason: StopReason,
}

impl Message for Terminated {
    type Reply = ();
}
