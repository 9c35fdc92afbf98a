//! mailring-transports: TCP, Unix, UDP and QUIC transports whose connections
//! attach to the shard that owns their session.
//!
//! The transports are being built (see the project's issues); today this crate
//! re-exports the actor layer.
#![forbid(unsafe_code)]

pub use mailring_actors;
