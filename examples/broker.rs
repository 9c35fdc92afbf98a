//! The stream broker: `cargo run --release --example broker -- --port 7000`
//! serves the Redis protocol on 127.0.0.1:7000 until Ctrl-C or SIGTERM,
//! keeping its streams in `--dir` (default `./mailring-data`); `--help`
//! lists the flags.

// A server allocates and frees a few small buffers per request; mimalloc
// does it in fewer instructions than glibc's malloc (docs/broker.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    mailring_broker::cli::run(std::env::args().skip(1))
}
