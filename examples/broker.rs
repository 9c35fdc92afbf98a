//! The stream broker: `cargo run --release --example broker -- --port 7000`
//! serves the Redis protocol on 127.0.0.1:7000 until Ctrl-C or SIGTERM,
//! keeping its streams in `--dir` (default `./mailring-data`); `--help`
//! lists the flags.

fn main() -> std::process::ExitCode {
    mailring_broker::cli::run(std::env::args().skip(1))
}
