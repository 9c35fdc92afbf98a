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
//!
//! A bare io_uring loop with mailring's ring flags and no runtime shows what
//! is the runtime's and what is the thread's placement. Knobs:
//! `MAILRING_SHARDS`, `MAILRING_SPIN_US=0|poll`, `MAILRING_PIN=1` (shard `i`
//! on CPU `i`), `MAILRING_IO_SHARD=N` (the shard that writes), `RAW_PIN=cpu`,
//! `RAW_MAIN=1` (the bare loop on the main thread), `FLOOR_THREAD=1` (the
//! floor on a spawned thread), `FSYNC_ONLY=index` (one contender, for
//! tracing).

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
    Raw,
}

const CONTENDERS: [Contender; 5] = [
    Contender::Floor,
    Contender::Mailring,
    Contender::Tokio,
    Contender::Compio,
    Contender::Raw,
];

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Contender::Floor => "pwrite + fdatasync on a thread (floor)",
            Contender::Mailring => "mailring (ring write + ring fdatasync)",
            Contender::Tokio => "tokio (write_all + sync_data)",
            Contender::Compio => "compio 0.19.2 (write_all_at + sync_data)",
            Contender::Raw => "bare io_uring loop on a spawned thread (no runtime)",
        }
    }
}

/// `writes` appends with a flush each; the time per write + flush.
fn run(c: Contender, path: &Path, writes: u64) -> Duration {
    let _ = std::fs::remove_file(path);
    let elapsed = match c {
        Contender::Floor => {
            let path = path.to_owned();
            let body = move || {
                let file = std::fs::File::create(path).expect("create");
                let buf = vec![7u8; BLOCK];
                let start = Instant::now();
                for i in 0..writes {
                    file.write_all_at(&buf, i * BLOCK as u64).expect("pwrite");
                    file.sync_data().expect("fdatasync");
                }
                start.elapsed()
            };
            if std::env::var_os("FLOOR_THREAD").is_some() {
                std::thread::spawn(body).join().expect("floor thread")
            } else {
                body()
            }
        }
        Contender::Mailring => {
            // MAILRING_SHARDS (default 2), MAILRING_SPIN_US=0|poll,
            // MAILRING_PIN (shard i on CPU i), MAILRING_IO_SHARD (default 0).
            let shards = env_number("MAILRING_SHARDS").unwrap_or(2);
            let mut builder = mailring::Runtime::builder().shards(shards);
            match std::env::var("MAILRING_SPIN_US").as_deref() {
                Ok("poll") => builder = builder.idle_policy(mailring::IdlePolicy::Poll),
                Ok("0") => builder = builder.idle_policy(mailring::IdlePolicy::Block),
                _ => {}
            }
            if std::env::var_os("MAILRING_PIN").is_some() {
                builder = builder.pin_threads(true);
            }
            let io_shard = env_number("MAILRING_IO_SHARD").unwrap_or(0);
            let rt = builder.build().expect("mailring runtime");
            let path = path.to_owned();
            let elapsed = futures::executor::block_on(rt.handle().spawn_on(
                mailring::ShardId::new(io_shard),
                async move {
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
                },
            ))
            .expect("mailring task");
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
        Contender::Raw => {
            let path = path.to_owned();
            let body = move || {
                if let Some(cpu) = env_number("RAW_PIN") {
                    pin_to(cpu);
                }
                raw_ring_appends(&path, writes)
            };
            if std::env::var_os("RAW_MAIN").is_some() {
                body()
            } else {
                std::thread::spawn(body).join().expect("raw thread")
            }
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

/// A numeric environment knob.
fn env_number<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Pins the calling thread to `cpu`.
fn pin_to(cpu: usize) {
    // SAFETY: `set` is a zeroed `cpu_set_t` that CPU_SET fills in bounds
    // (`cpu` < CPU_SETSIZE, checked); sched_setaffinity reads exactly
    // `size_of::<cpu_set_t>()` bytes of it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert!(cpu < libc::CPU_SETSIZE as usize, "no CPU {cpu}");
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// The appends on a bare ring of this thread (no runtime), with mailring's
/// setup flags: each write and each flush submitted and awaited in one
/// `io_uring_enter`, as compio does.
fn raw_ring_appends(path: &Path, writes: u64) -> Duration {
    use io_uring::{cqueue, opcode, types, IoUring};
    use std::os::fd::AsRawFd;
    let mut builder = IoUring::builder();
    builder
        .dontfork()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_coop_taskrun()
        .setup_taskrun_flag();
    let mut ring = builder.build(256).expect("ring");
    let file = std::fs::File::create(path).expect("create");
    let fd = types::Fd(file.as_raw_fd());
    let buf = vec![7u8; BLOCK];
    let start = Instant::now();
    for i in 0..writes {
        let write = opcode::Write::new(fd, buf.as_ptr(), BLOCK as u32)
            .offset(i * BLOCK as u64)
            .build();
        let flush = opcode::Fsync::new(fd)
            .flags(types::FsyncFlags::DATASYNC)
            .build();
        for entry in [write, flush] {
            // SAFETY: the write reads `buf` and both use `file`'s fd; both
            // outlive the op, whose completion is awaited right here.
            unsafe { ring.submission().push(&entry).expect("push") };
            ring.submit_and_wait(1).expect("wait");
            let cqe: cqueue::Entry = ring.completion().next().expect("cqe");
            assert!(cqe.result() >= 0, "ring op failed: {}", cqe.result());
        }
    }
    start.elapsed()
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
