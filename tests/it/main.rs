//! Integration tests of the runtime through its public API (one binary, many modules).

mod blocking;
mod build;
mod direct;
mod entry;
mod fs;
mod hot;
mod misuse;
mod net;
mod panics;
mod shutdown;
mod spawn;
mod sync;
mod time;

/// A two-shard runtime with the default settings.
pub(crate) fn rt2() -> mailring::Runtime {
    mailring::Runtime::builder()
        .shards(2)
        .build()
        .expect("io_uring runtime")
}
