//! Does preallocating a log segment make its flushed appends faster? The
//! broker's log appends group-committed batches to a segment opened
//! `O_DSYNC` (each write is its own flush), through io_uring. This times
//! the same appends (4 KiB each, sequential, one in flight, as a queue-depth
//! 1 producer makes them) into a segment that is
//! - `grow`: empty, extended by every write (what the broker does now);
//! - `fallocate`: `fallocate(2)`d to its full size first (extents reserved
//!   but unwritten: the first write into each still commits metadata);
//! - `zeroed`: written with zeros and flushed first (PostgreSQL's
//!   `wal_init_zero`: later writes overwrite initialized blocks);
//! - `zeroed-direct`: zeroed, and opened `O_DIRECT | O_DSYNC`: each append
//!   rewrites the 4 KiB blocks it touches from an aligned buffer (the
//!   block's earlier bytes again, then the new ones), which the kernel can
//!   issue straight from the submitting thread instead of handing the write
//!   to an io-wq worker.
//!
//! The third argument is the append size (default 4096; the broker's
//! queue-depth-1 records are about 60 bytes).
//!
//! Modes alternate in rounds; the files live in the current directory (the
//! filesystem the broker's data would use) and are removed afterwards.
//!
//! Run: `cargo run --release -p mailring-bench --example prealloc -- [rounds] [writes] [size]`

use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug)]
enum Mode {
    Grow,
    Fallocate,
    Zeroed,
    ZeroedDirect,
}

const MODES: [Mode; 4] = [
    Mode::Grow,
    Mode::Fallocate,
    Mode::Zeroed,
    Mode::ZeroedDirect,
];

const BLOCK: usize = 4096;

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
        Mode::Zeroed | Mode::ZeroedDirect => {
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

/// Times `writes` sequential `size`-byte O_DSYNC appends through io_uring.
fn run(path: &std::path::Path, mode: Mode, writes: usize, size: usize) -> Vec<Duration> {
    let rt = mailring::Runtime::builder().shards(1).build().unwrap();
    let path = path.to_path_buf();
    let out = rt.block_on(async move {
        let direct = matches!(mode, Mode::ZeroedDirect);
        let flags = libc::O_DSYNC | if direct { libc::O_DIRECT } else { 0 };
        let file = mailring::fs::OpenOptions::new()
            .write(true)
            .custom_flags(flags)
            .open(&path)
            .await
            .unwrap();
        let mut lat = Vec::with_capacity(writes);
        let record = vec![7u8; size];
        let mut pos = 0usize;
        if direct {
            // The block holding the tail, rewritten with each append.
            let cap = (size + 2 * BLOCK).next_multiple_of(BLOCK);
            let mut buf = mailring::buf::AlignedBuf::new(cap, BLOCK);
            for _ in 0..writes {
                let t = Instant::now();
                let start = pos / BLOCK * BLOCK;
                let keep = pos - start;
                buf.truncate(keep);
                buf.extend_from_slice(&record);
                let end = buf.len().next_multiple_of(BLOCK);
                buf.resize_zeroed(end);
                let (res, back) = file.write_all_at(buf, start as u64).await;
                res.unwrap();
                buf = back;
                pos += size;
                // Keep only the tail block's bytes, moved to the front.
                let tail_start = pos / BLOCK * BLOCK - start;
                buf.copy_within(tail_start..tail_start + pos % BLOCK, 0);
                lat.push(t.elapsed());
            }
        } else {
            let mut buf = record;
            for _ in 0..writes {
                let t = Instant::now();
                let (res, back) = file.write_all_at(buf, pos as u64).await;
                res.unwrap();
                buf = back;
                pos += size;
                lat.push(t.elapsed());
            }
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
    let size: usize = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(4096)
        .max(1);
    let path = std::env::current_dir()
        .unwrap()
        .join(format!("prealloc-probe-{}", std::process::id()));
    let bytes = ((writes * size).next_multiple_of(BLOCK) + BLOCK) as u64;
    let mut results: Vec<Vec<Duration>> = vec![Vec::new(); MODES.len()];
    let mut prep_ms: Vec<Vec<f64>> = vec![Vec::new(); MODES.len()];
    for round in 0..rounds {
        let order: Vec<usize> = if round % 2 == 0 {
            vec![0, 1, 2, 3]
        } else {
            vec![3, 2, 1, 0]
        };
        for m in order {
            let t = Instant::now();
            prepare(&path, MODES[m], bytes);
            prep_ms[m].push(t.elapsed().as_secs_f64() * 1000.0);
            results[m].extend(run(&path, MODES[m], writes, size));
        }
    }
    let _ = std::fs::remove_file(&path);
    println!(
        "# {rounds} rounds x {writes} sequential {size}-byte O_DSYNC appends through io_uring, one in flight; modes alternate"
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
