//! The `mailring-broker` binary (the same program as `examples/broker.rs`).

// A server allocates and frees a few small buffers per request; mimalloc
// does it in fewer instructions than glibc's malloc (docs/broker.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    mailring_broker::cli::run(std::env::args().skip(1))
}
