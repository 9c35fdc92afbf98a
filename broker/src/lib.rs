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
