//! The `mailring-broker` binary (the same program as `examples/broker.rs`).

fn main() -> std::process::ExitCode {
    mailring_broker::cli::run(std::env::args().skip(1))
}
