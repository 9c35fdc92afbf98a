//! `fs_write_fsync_4k` in alternating pairs: appends of 4 KiB, each
//! followed by `fdatasync`, on a fresh file in the temp dir, and a plain
//! thread doing `pwrite` + `fdatasync` as the disk's floor.
//!
//! ```text
//! cargo run --release -p mailring-bench --example fsync_pairs -- [pairs] [writes]
//! ```
//!
//! Each pair runs every contender once, the order rotating; a contender's
//! figure is its median time per write + flush, and its ratio is the floor's
//! time over its own in the same pair (1.00: as fast as the bare system
//! calls on a thread).

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use compio::io::AsyncWriteAtExt;
use compio::BufResult;

const BLOCK: usize = 4096;

#[derive(Clone, Copy, PartialEq)]
enum Contender {
    Floor,
    Mailring,
    Tokio,
    Compio,
}

const CONTENDERS: [Contender; 4] = [
    Contender::Floor,
    Contender::Mailring,
    Contender::Tokio,
    Contender::Compio,
];

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Contender::Floor => "pwrite + fdatasync on a thread (floor)",
            Contender::Mailring => "mailring (ring write + ring fdatasync)",
            Contender::Tokio => "tokio (write_all + sync_data)",
            Contender::Compio => "compio 0.19.2 (write_all_at + sync_data)",
        }
    }
}

/// `writes` appends with a flush each; the time per write + flush.
fn run(c: Contender, path: &Path, writes: u64) -> Duration {
    let _ = std::fs::remove_file(path);
    let elapsed = match c {
        Contender::Floor => {
            let file = std::fs::File::create(path).expect("create");
            let buf = vec![7u8; BLOCK];
            let start = Instant::now();
            for i in 0..writes {
                file.write_all_at(&buf, i * BLOCK as u64).expect("pwrite");
                file.sync_data().expect("fdatasync");
            }
            start.elapsed()
        }
        Contender::Mailring => {
            // MAILRING_SHARDS (default 2), MAILRING_SPIN_US=0|poll.
            let shards = std::env::var("MAILRING_SHARDS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(2);
            let mut builder = mailring::Runtime::builder().shards(shards);
            match std::env::var("MAILRING_SPIN_US").as_deref() {
                Ok("poll") => builder = builder.idle_policy(mailring::IdlePolicy::Poll),
                Ok("0") => builder = builder.idle_policy(mailring::IdlePolicy::Block),
                _ => {}
            }
            let rt = builder.build().expect("mailring runtime");
            let path = path.to_owned();
            let elapsed = rt.block_on(async move {
                let file = mailring::fs::File::create(&path).await.expect("create");
                let mut buf = vec![7u8; BLOCK];
                let start = Instant::now();
                for i in 0..writes {
                    let (r, back) = file.write_all_at(buf, i * BLOCK as u64).await;
                    r.expect("write");
                    buf = back;
                    file.sync_data().await.expect("fdatasync");
                }
                start.elapsed()
            });
            let _ = rt.shutdown();
            elapsed
        }
        Contender::Tokio => {
            use tokio::io::AsyncWriteExt;
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("tokio runtime");
            let path = path.to_owned();
            rt.block_on(async move {
                let mut file = tokio::fs::File::create(&path).await.expect("create");
                let buf = vec![7u8; BLOCK];
                let start = Instant::now();
                for _ in 0..writes {
                    file.write_all(&buf).await.expect("write");
                    file.sync_data().await.expect("fdatasync");
                }
                start.elapsed()
            })
        }
        Contender::Compio => {
            let rt = compio::runtime::Runtime::new().expect("compio runtime");
            let path = path.to_owned();
            rt.block_on(async move {
                let mut file = compio::fs::File::create(&path).await.expect("create");
                let mut buf = vec![7u8; BLOCK];
                let start = Instant::now();
                for i in 0..writes {
                    let BufResult(r, back) = file.write_all_at(buf, i * BLOCK as u64).await;
                    r.expect("write");
                    buf = back;
                    file.sync_data().await.expect("fdatasync");
                }
                let elapsed = start.elapsed();
                file.close().await.expect("close");
                elapsed
            })
        }
    };
    elapsed / writes as u32
}

fn main() {
    let mut args = std::env::args().skip(1);
    let pairs: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10);
    let writes: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(500);
    let path =
        std::env::temp_dir().join(format!("mailring-fsync-pairs-{}.bin", std::process::id()));
    let times = mailring_bench::alternating_pairs(pairs, CONTENDERS.len(), |i| {
        // FSYNC_ONLY=<index>: run one contender (for tracing); the table's
        // ratios then mean nothing.
        if std::env::var("FSYNC_ONLY").is_ok_and(|o| o != i.to_string()) {
            return 1.0;
        }
        run(CONTENDERS[i], &path, writes).as_nanos() as f64
    });
    let _ = std::fs::remove_file(&path);
    println!(
        "fs_write_fsync_4k: {pairs} alternating pairs of {writes} appends of {BLOCK} B, each followed by fdatasync"
    );
    println!("| contender | median per write + flush | floor's time over its own (median [q1, q3]) | mailring's time over its own |");
    println!("| --- | --- | --- | --- |");
    for (i, c) in CONTENDERS.iter().enumerate() {
        let mut vs_floor: Vec<f64> = times[0].iter().zip(&times[i]).map(|(f, t)| f / t).collect();
        let mut vs_mailring: Vec<f64> =
            times[1].iter().zip(&times[i]).map(|(m, t)| m / t).collect();
        let (_, median, _) = mailring_bench::quartiles(&mut times[i].clone());
        let (q1, m, q3) = mailring_bench::quartiles(&mut vs_floor);
        let (r1, r, r3) = mailring_bench::quartiles(&mut vs_mailring);
        println!(
            "| {} | {:.1} µs | {m:.2} [{q1:.2}, {q3:.2}] | {r:.2} [{r1:.2}, {r3:.2}] |",
            c.name(),
            median / 1000.0
        );
    }
}
