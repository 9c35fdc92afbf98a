//! mailring-actors: keyed virtual actors and sessions on mailring shards.
//!
//! The actor layer is being built (see the project's issues); today this crate
//! re-exports the runtime so that one dependency line is enough.
#![forbid(unsafe_code)]

pub use mailring;
