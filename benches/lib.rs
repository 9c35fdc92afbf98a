//! Benchmarks of mailring against peer runtimes; see `benches/`.
