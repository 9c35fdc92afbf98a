//! A stream broker speaking the Redis protocol (RESP2 and RESP3), built
//! from mailring's parts: each client connection is a session attached to
//! the shard of the first stream it names, and each stream is a keyed
//! actor owning its entries. Stock Redis clients (`redis-cli`,
//! `redis-benchmark`, client libraries) drive it.
//!
//! ```no_run
//! use mailring_broker::{Broker, BrokerConfig};
//!
//! let broker = Broker::start(BrokerConfig {
//!     addr: "127.0.0.1:7000".parse().unwrap(),
//!     ..BrokerConfig::default()
//! })?;
//! println!("listening on {}", broker.local_addr());
//! broker.shutdown();
//! # Ok::<(), std::io::Error>(())
//! ```

#![forbid(unsafe_code)]

pub mod actor;
pub mod bench;
pub mod cli;
pub mod command;
mod command_meta;
mod command_stats;
pub mod fields;
pub mod glob;
pub mod group;
pub mod id;
pub mod log;
mod rates;
pub mod resp;
pub mod server;
pub mod session;
pub mod store;
pub mod stream;

pub use crate::server::{Broker, BrokerConfig, RecoveryReport, TlsFiles};
pub use crate::store::{AlwaysFlush, Fsync, StoreConfig, SyncGate};

/// A map keyed by stream names, hashed with foldhash under a seed drawn
/// per map at run time (as the actors' own maps of keys are). Names come
/// from clients: the seed keeps them from choosing colliding names ahead,
/// and no reply shows such a map's order (`KEYS` sorts its names), so
/// the seed cannot be read back from it. SipHash, std's default, costs
/// several hundred instructions a name where this costs tens, and every
/// stream's making passes through several of these maps.
pub(crate) type NameMap<V> =
    std::collections::HashMap<bytes::Bytes, V, foldhash::fast::RandomState>;

/// A set of stream names, hashed as [`NameMap`] is.
pub(crate) type NameSet = std::collections::HashSet<bytes::Bytes, foldhash::fast::RandomState>;
