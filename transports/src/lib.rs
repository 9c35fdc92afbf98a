//! mailring-transports: connections owned by the shard of their session's
//! key.
//!
//! A [`Session`] is one connection's protocol logic. A [`Server`] accepts
//! TCP connections (one `SO_REUSEPORT` listener per shard, or a single
//! acceptor), frames them with a [`codec::Codec`], and runs each session on
//! a shard: where it was accepted until [`Session::route`] names a key,
//! then on the key's shard (the shard of the keyed actor type it follows,
//! [`ServerBuilder::follow`]), moved there with its unread bytes once no
//! reply is outstanding. From then on every receive and send of the
//! connection runs on that shard's ring.
//!
//! Replies leave in request order; a reply that waits on an actor is
//! deferred ([`SessionCtx::reply_later`]) so that pipelined requests are
//! handled at once, up to a window. Limits and timeouts
//! ([`ServerConfig`]) close only the connection they concern, with a
//! counted [`CloseReason`].
#![forbid(unsafe_code)]

mod balanced;
pub mod codec;
#[cfg(any(feature = "tokio-io", feature = "futures-io", feature = "hyper"))]
pub mod compat;
mod conn;
pub mod datagram;
#[cfg(test)]
mod fuzz;
pub mod pool;
pub mod proxy;
mod server;
mod session;
mod stats;
pub mod tls;

pub use crate::balanced::BalancedListener;
pub use crate::conn::{Framed, FramedError};
pub use crate::server::{
    HandOff, ListenAddr, ListenMode, PeerClose, Server, ServerBuilder, ServerConfig,
    ServerShutdownReport, SessionsByKey, StatsSource,
};
pub use crate::session::{
    CloseKind, CloseReason, FrameIn, FrameOut, Route, Session, SessionCloser, SessionCtx,
};
pub use crate::stats::{ServerStats, SessionShardStats};

pub use bytes;
pub use mailring_actors;
pub use rustls;

/// The samples of the sessions guide (`docs/sessions.md`), compiled and run
/// by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../../docs/sessions.md")]
pub struct SessionsGuideSamples;

/// The samples of the transports guide (`docs/transports.md`), compiled and
/// run by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../../docs/transports.md")]
pub struct TransportsGuideSamples;
