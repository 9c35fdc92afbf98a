//! Does preallocating a log segment make its flushed appends faster? The
//! broker's log appends group-committed batches to a segment opened
//! `O_DSYNC` (each write is its own flush), through io_uring. This times
//! the same appends (4 KiB each, sequential, one in flight, as a queue-depth
//! 1 producer makes them) into a segment that is
//! - `grow`: empty, extended by every write (what the broker does now);
//! - `fallocate`: `fallocate(2)`d to its full size first (extents reserved
//!   but unwritten: the first write into each still commits metadata);
//! - `zeroed`: written with zeros and flushed first (PostgreSQL's
//!   `wal_init_zero`: later writes overwrite initialized blocks).
//!
//! Modes alternate in rounds; the files live in the current directory (the
//! filesystem the broker's data would use) and are removed afterwards.
//!
//! Run: `cargo run --release -p mailring-bench --example prealloc -- [rounds] [writes]`

use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug)]
enum Mode {
    Grow,
    Fallocate,
    Zeroed,
}

const MODES: [Mode; 3] = [Mode::Grow, Mode::Fallocate, Mode::Zeroed];

fn prepare(path: &std::path::Path, mode: Mode, bytes: u64) {
    let _ = std::fs::remove_file(path);
    let f = std::fs::File::create(path).unwrap();
    match mode {
        Mode::Grow => {}
        Mode::Fallocate => {
            // util-linux's fallocate(1): fallocate(2) with mode 0.
            let status = std::process::Command::new("fallocate")
                .args(["-l", &bytes.to_string()])
                .arg(path)
                .status()
                .expect("run fallocate(1)");
            assert!(status.success(), "fallocate failed");
        }
        Mode::Zeroed => {
            use std::io::Write;
            let zeros = vec![0u8; 1 << 20];
            let mut w = &f;
            for _ in 0..bytes.div_ceil(1 << 20) {
                w.write_all(&zeros).unwrap();
            }
        }
    }
    f.sync_all().unwrap();
    std::fs::File::open(path.parent().unwrap())
        .unwrap()
        .sync_all()
        .unwrap();
}

/// Times `writes` sequential 4 KiB O_DSYNC appends through io_uring.
fn run(path: &std::path::Path, writes: usize) -> Vec<Duration> {
    let rt = mailring::Runtime::builder().shards(1).build().unwrap();
    let path = path.to_path_buf();
    let out = rt.block_on(async move {
        let file = mailring::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DSYNC)
            .open(&path)
            .await
            .unwrap();
        let mut lat = Vec::with_capacity(writes);
        let block = vec![7u8; 4096];
        let mut buf = block;
        for i in 0..writes {
            let t = Instant::now();
            let (res, back) = file.write_all_at(buf, (i * 4096) as u64).await;
            res.unwrap();
            buf = back;
            lat.push(t.elapsed());
        }
        lat
    });
    let _ = rt.shutdown();
    out
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort_unstable();
    v[((v.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1e6
}

fn main() {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    let writes: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2000);
    let path = std::env::current_dir()
        .unwrap()
        .join(format!("prealloc-probe-{}", std::process::id()));
    let bytes = (writes * 4096) as u64;
    let mut results: Vec<Vec<Duration>> = vec![Vec::new(); MODES.len()];
    let mut prep_ms: Vec<Vec<f64>> = vec![Vec::new(); MODES.len()];
    for round in 0..rounds {
        let order: Vec<usize> = if round % 2 == 0 {
            vec![0, 1, 2]
        } else {
            vec![2, 1, 0]
        };
        for m in order {
            let t = Instant::now();
            prepare(&path, MODES[m], bytes);
            prep_ms[m].push(t.elapsed().as_secs_f64() * 1000.0);
            results[m].extend(run(&path, writes));
        }
    }
    let _ = std::fs::remove_file(&path);
    println!(
        "# {rounds} rounds x {writes} sequential 4 KiB O_DSYNC appends through io_uring, one in flight; modes alternate"
    );
    println!(
        "| segment | p50 µs | p90 µs | p99 µs | preparing {} MiB |",
        bytes >> 20
    );
    println!("| --- | --- | --- | --- | --- |");
    for (m, mode) in MODES.iter().enumerate() {
        let v = &mut results[m];
        let (p50, p90, p99) = (pct(v, 0.5), pct(v, 0.9), pct(v, 0.99));
        prep_ms[m].sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!(
            "| {mode:?} | {p50:.0} | {p90:.0} | {p99:.0} | {:.1} ms |",
            prep_ms[m][prep_ms[m].len() / 2]
        );
    }
}
