//! How long the broker takes to recover a given amount of log: fills a
//! data directory through the broker (pipelined `XADD`s of 1 KiB entries
//! over 16 streams, `appendfsync no`), stops it, drops the page cache when
//! allowed (`/proc/sys/vm/drop_caches`, root only; otherwise the read is
//! from cache and says so), and times a restart's recovery.
//!
//! Run: `cargo run --release -p mailring-bench --example broker_recovery -- [MiB]`
//! (default 1024). The data directory is under the current directory and
//! removed afterwards. `BROKER_STREAM_CACHE_MIB=N` sets the per-stream
//! cache; the recovery runs in a child process, which reports its own
//! resident memory.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Instant;

use mailring_broker::bench::encode_command;
use mailring_broker::{Broker, BrokerConfig, Fsync};

/// Bytes of every file under `dir` (generations, logs, segments).
fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

fn start(dir: &std::path::Path) -> Broker {
    let mut config = BrokerConfig {
        addr: "127.0.0.1:0".parse().unwrap(),
        ..BrokerConfig::default()
    };
    config.store.stream_cache_bytes = cache_mib() << 20;
    config.store.dir = dir.to_path_buf();
    config.store.fsync = Fsync::No;
    Broker::start(config).expect("start the broker")
}

fn main() {
    if let Some(dir) = std::env::args()
        .nth(2)
        .filter(|_| std::env::args().nth(1).as_deref() == Some("--recover"))
    {
        // The recovery alone, in a process of its own, so its resident
        // memory is its own.
        let broker = start(std::path::Path::new(&dir));
        let rec = broker.recovery().clone();
        let (peak, now) = (status_kib("VmHWM"), status_kib("VmRSS"));
        broker.shutdown();
        println!(
            "{} {} {} {} {}",
            rec.records,
            rec.bytes,
            rec.elapsed.as_nanos(),
            peak,
            now
        );
        return;
    }
    let mib: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1024);
    let target = mib << 20;
    let dir = std::env::current_dir()
        .unwrap()
        .join(format!("broker-recovery-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let broker = start(&dir);
    let s = TcpStream::connect(broker.local_addr()).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    let payload = vec![b'p'; 1024];
    let started = Instant::now();
    let mut entries = 0u64;
    let mut line = String::new();
    while dir_bytes(&dir) < target {
        let mut out = Vec::new();
        for i in 0..2000u64 {
            let key = format!("recover:{}", (entries + i) % 16);
            encode_command(&mut out, &[b"XADD", key.as_bytes(), b"*", b"p", &payload]);
        }
        w.write_all(&out).unwrap();
        for _ in 0..2000 {
            line.clear();
            r.read_line(&mut line).unwrap();
            let n: usize = line.trim_end()[1..].parse().unwrap();
            let mut id = vec![0u8; n + 2];
            r.read_exact(&mut id).unwrap();
        }
        entries += 2000;
    }
    let fill = started.elapsed();
    broker.shutdown();
    let bytes = dir_bytes(&dir);
    let cold = std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .arg("--recover")
        .arg(&dir)
        .output()
        .expect("run the recovery process");
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Vec<u64> = text
        .split_whitespace()
        .map(|n| n.parse().expect("a number"))
        .collect();
    let [records, rec_bytes, nanos, peak, now] = v[..] else {
        panic!(
            "the recovery process printed {text:?}; stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let elapsed = std::time::Duration::from_nanos(nanos);
    println!(
        "filled {:.0} MiB ({entries} entries of 1 KiB over 16 streams) in {fill:.1?}; recovery of {} records ({:.0} MiB) took {:.2?} = {:.0} MiB/s ({})",
        bytes as f64 / 1048576.0,
        records,
        rec_bytes as f64 / 1048576.0,
        elapsed,
        rec_bytes as f64 / 1048576.0 / elapsed.as_secs_f64(),
        if cold {
            "page cache dropped first"
        } else {
            "from the page cache: dropping it needs root"
        }
    );
    println!(
        "resident memory of the recovering process: peak {} MiB, {} MiB once recovered (stream cache {} MiB per stream)",
        peak / 1024,
        now / 1024,
        cache_mib()
    );
}

/// The stream cache, in MiB: `BROKER_STREAM_CACHE_MIB`, or the default.
fn cache_mib() -> u64 {
    std::env::var("BROKER_STREAM_CACHE_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(mailring_broker::StoreConfig::default().stream_cache_bytes >> 20)
}

/// A field of `/proc/self/status`, in KiB (0 if missing).
fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}
