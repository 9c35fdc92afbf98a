//! Shared helpers of the benchmarks: workload sizes of the I/O benches, the
//! data file, the offsets, and a wall + CPU time meter.

pub mod counters;

use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Size of the read benchmarks' file.
pub const FILE_SIZE: u64 = 64 << 20;
/// Block size of file operations.
pub const BLOCK: usize = 4096;
/// Reads per batch.
pub const READS: u64 = 10_000;
/// Queue depth of the throughput benchmark.
pub const QD: u64 = 32;
/// Write + fdatasync pairs per batch.
pub const FSYNC_WRITES: u64 = 200;
/// Echo round trips per batch.
pub const ECHO_ROUNDS: u64 = 10_000;
/// Echo message size.
pub const ECHO_SIZE: usize = 256;

/// User + system CPU time of the whole process.
pub fn process_cpu() -> Duration {
    // SAFETY: rusage is plain data; all-zero is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) }, 0);
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, (t.tv_usec as u32) * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Wall and process CPU time over the measured batches.
#[derive(Debug, Default)]
pub struct Meter {
    wall: Duration,
    cpu: Duration,
    ops: u64,
}

impl Meter {
    /// Times `f`, which performs `ops` operations; returns its wall time.
    pub fn measure(&mut self, ops: u64, f: impl FnOnce()) -> Duration {
        let c0 = process_cpu();
        let t0 = Instant::now();
        f();
        let wall = t0.elapsed();
        self.cpu += process_cpu() - c0;
        self.wall += wall;
        self.ops += ops;
        wall
    }

    /// Runs `f`, which performs `ops` operations and returns the wall time of
    /// its timed part; the process CPU time of the whole call is recorded.
    pub fn record(&mut self, ops: u64, f: impl FnOnce() -> Duration) -> Duration {
        let c0 = process_cpu();
        let wall = f();
        self.cpu += process_cpu() - c0;
        self.wall += wall;
        self.ops += ops;
        wall
    }

    /// Prints per-operation wall and CPU time and the cores kept busy.
    pub fn report(&self, id: &str) {
        let ops = self.ops.max(1) as f64;
        eprintln!(
            "[cpu] {id}: wall/op={:.0}ns cpu/op={:.0}ns cores={:.2}",
            self.wall.as_secs_f64() * 1e9 / ops,
            self.cpu.as_secs_f64() * 1e9 / ops,
            self.cpu.as_secs_f64() / self.wall.as_secs_f64().max(1e-12)
        );
    }
}

/// The 64 MiB data file, created once and read to warm the page cache.
pub fn data_file() -> PathBuf {
    let path = std::env::temp_dir().join("mailring-bench-64m.bin");
    let ok = std::fs::metadata(&path)
        .map(|m| m.len() == FILE_SIZE)
        .unwrap_or(false);
    if !ok {
        let chunk: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
        let mut f = std::fs::File::create(&path).unwrap();
        for _ in 0..FILE_SIZE >> 20 {
            std::io::Write::write_all(&mut f, &chunk).unwrap();
        }
        f.sync_all().unwrap();
    }
    // Warm the page cache.
    let _ = std::fs::read(&path).unwrap();
    path
}

/// The seed's `fs_net` fixture: `blocks` blocks of `block_size` bytes whose
/// first byte is the block's index, written and flushed at `path`.
pub fn write_block_fixture(path: &std::path::Path, block_size: usize, blocks: usize) {
    let mut w = std::fs::File::create(path).expect("create fs fixture");
    let mut block = vec![0u8; block_size];
    for i in 0..blocks {
        block[0] = i as u8;
        std::io::Write::write_all(&mut w, &block).expect("write fs fixture");
    }
    w.sync_all().expect("sync fs fixture");
}

/// Runs `contenders` contenders `pairs` times each, the order rotating from
/// pair to pair (`run(i)` measures contender `i` once); returns every
/// contender's figures in pair order, so `times[a][p]` and `times[b][p]` were
/// measured side by side.
pub fn alternating_pairs<T>(
    pairs: usize,
    contenders: usize,
    mut run: impl FnMut(usize) -> T,
) -> Vec<Vec<T>> {
    let mut times: Vec<Vec<T>> = (0..contenders).map(|_| Vec::with_capacity(pairs)).collect();
    for pair in 0..pairs {
        for k in 0..contenders {
            let i = (pair + k) % contenders;
            times[i].push(run(i));
        }
        eprint!("\rpair {}/{pairs}", pair + 1);
    }
    eprintln!();
    times
}

/// The first quartile, the median and the third quartile of `v` (sorted in
/// place).
pub fn quartiles(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.25), at(0.5), at(0.75))
}

/// The median of `v` (the nearest rank).
pub fn median_of(mut v: Vec<f64>) -> f64 {
    quartiles(&mut v).1
}

/// The quartiles of `v`: (q1, median, q3).
pub fn quartiles_of(mut v: Vec<f64>) -> (f64, f64, f64) {
    quartiles(&mut v)
}

/// The shards' idle policy that the environment variable `var` asks for:
/// a number of microseconds to spin (`0`: block at once), or `poll`;
/// `None` (the runtime's default) when unset or unreadable.
pub fn idle_policy_from_env(var: &str) -> Option<mailring::IdlePolicy> {
    match std::env::var(var).ok()?.as_str() {
        "poll" => Some(mailring::IdlePolicy::Poll),
        "0" => Some(mailring::IdlePolicy::Block),
        us => us
            .parse::<u64>()
            .ok()
            .map(|us| mailring::IdlePolicy::Spin(Duration::from_micros(us))),
    }
}

/// A runtime of `shards` shards with the idle policy `var` asks for (see
/// [`idle_policy_from_env`]).
pub fn runtime_from_env(shards: usize, var: &str) -> mailring::Runtime {
    let mut builder = mailring::Runtime::builder().shards(shards);
    if let Some(policy) = idle_policy_from_env(var) {
        builder = builder.idle_policy(policy);
    }
    builder.build().expect("io_uring available")
}

/// A command that runs this program again with `args` as a load
/// generator, under `taskset -c LIST` when the environment variable
/// `cpus_var` holds a CPU list (to keep it off the servers' cores).
pub fn load_generator<I, S>(cpus_var: &str, args: I) -> std::process::Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let exe = std::env::current_exe().expect("the benchmark's own path");
    let mut command = match std::env::var(cpus_var) {
        Ok(cpus) => {
            let mut c = std::process::Command::new("taskset");
            c.args(["-c", &cpus]).arg(exe);
            c
        }
        Err(_) => std::process::Command::new(exe),
    };
    command.args(args);
    command
}

/// What a load generator run of [`drive`] gave: the numbers it printed on
/// its standard output, what it said on its standard error, and the CPU
/// time this process (the server) used while it ran.
pub struct Driven {
    pub figures: Vec<u64>,
    pub stderr: String,
    pub server_cpu: Duration,
}

/// Runs the load generator `command` against `server` (a server of this
/// process), then stops the server with `stop`.
///
/// # Panics
///
/// When the load generator fails or prints something other than numbers.
pub fn drive(mut command: std::process::Command, server: &str, stop: impl FnOnce()) -> Driven {
    let cpu0 = process_cpu();
    let out = command.output().expect("load generator");
    let server_cpu = process_cpu() - cpu0;
    stop();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "load generator failed against {server}: {stderr}"
    );
    let figures = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|x| x.parse().expect("the load generator's figures"))
        .collect();
    Driven {
        figures,
        stderr,
        server_cpu,
    }
}

/// Runs `part` on `threads` threads at once (a load generator split so
/// that no one thread bounds the server): each gets the barrier to wait at
/// once it is set up, and gives back when it started and ended and what it
/// measured. Returns the time from the first start to the last end, and
/// the parts' measures.
pub fn split_over_threads<T, F>(threads: usize, part: F) -> (Duration, Vec<T>)
where
    T: Send + 'static,
    F: Fn(&std::sync::Barrier) -> (std::time::Instant, std::time::Instant, T)
        + Send
        + Sync
        + 'static,
{
    let threads = threads.max(1);
    let part = std::sync::Arc::new(part);
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (part, barrier) = (part.clone(), barrier.clone());
            std::thread::spawn(move || part(&barrier))
        })
        .collect();
    let mut span: Option<(std::time::Instant, std::time::Instant)> = None;
    let mut out = Vec::with_capacity(threads);
    for h in handles {
        let (start, end, measured) = h.join().expect("load generator thread");
        span = Some(span.map_or((start, end), |(s, e)| (s.min(start), e.max(end))));
        out.push(measured);
    }
    let (start, end) = span.expect("at least one thread");
    (end - start, out)
}

/// Sends `frames` copies of `frame` on `s` with up to `window` in flight
/// (topped up half a window at a time) and reads each echo back; the
/// latency of each from its send to its echo.
pub async fn windowed_echo<S>(
    s: &mut S,
    frame: &[u8],
    frames: usize,
    window: usize,
) -> Vec<Duration>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut sent_at = std::collections::VecDeque::with_capacity(window);
    let mut lat = Vec::with_capacity(frames);
    let mut reply = vec![0u8; frame.len()];
    let (mut sent, mut got) = (0usize, 0usize);
    while got < frames {
        if sent - got <= window / 2 && sent < frames {
            let n = (window - (sent - got)).min(frames - sent);
            s.write_all(&frame.repeat(n)).await.expect("send");
            s.flush().await.expect("flush");
            let now = std::time::Instant::now();
            sent_at.extend(std::iter::repeat_n(now, n));
            sent += n;
        }
        s.read_exact(&mut reply).await.expect("echo");
        lat.push(sent_at.pop_front().expect("sent").elapsed());
        got += 1;
    }
    lat
}

/// The echo a Tokio user writes with tokio-util: length-delimited frames
/// sent back as they come, flushed when nothing more is buffered. Gives
/// the stream back at the peer's end (or the first error).
pub async fn codec_echo<T>(io: T) -> T
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use futures::{SinkExt, StreamExt};
    let mut framed =
        tokio_util::codec::Framed::new(io, tokio_util::codec::LengthDelimitedCodec::new());
    while let Some(Ok(frame)) = framed.next().await {
        if framed.feed(frame.freeze()).await.is_err() {
            break;
        }
        if framed.read_buffer().is_empty()
            && SinkExt::<bytes::Bytes>::flush(&mut framed).await.is_err()
        {
            break;
        }
    }
    framed.into_inner()
}

/// Deterministic 4 KiB-aligned offsets.
pub fn offset(i: u64) -> u64 {
    let x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 20;
    (x % (FILE_SIZE / BLOCK as u64)) * BLOCK as u64
}

/// Keyed-routing workload: number of keyed actors.
pub const ZIPF_KEYS: u32 = 10_000;
/// Keyed-routing workload: tells in total (split over the producers).
pub const ZIPF_TELLS: u64 = 1_000_000;
/// Keyed-routing workload: Zipf exponent.
pub const ZIPF_S: f64 = 1.1;

/// `count` keys in `0..n_keys` drawn from Zipf(`s`) with a fixed seed
/// (key 0 is the most popular). Deterministic: the same arguments always
/// give the same keys.
pub fn zipf_keys(n_keys: u32, count: u64, s: f64, seed: u64) -> Vec<u32> {
    let mut cdf = Vec::with_capacity(n_keys as usize);
    let mut total = 0.0;
    for k in 1..=n_keys {
        total += 1.0 / f64::from(k).powf(s);
        cdf.push(total);
    }
    let mut state = seed ^ 0x9e37_79b9_7f4a_7c15;
    (0..count)
        .map(|_| {
            // xorshift64*
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            let r = state.wrapping_mul(0x2545_f491_4f6c_dd1d);
            let u = (r >> 11) as f64 / (1u64 << 53) as f64 * total;
            cdf.partition_point(|&c| c < u).min(n_keys as usize - 1) as u32
        })
        .collect()
}

/// Per-key expected counts of a key list.
pub fn histogram(n_keys: u32, keys: &[Vec<u32>]) -> Vec<u64> {
    let mut h = vec![0u64; n_keys as usize];
    for list in keys {
        for &k in list {
            h[k as usize] += 1;
        }
    }
    h
}

/// Actor benches: round trips of the ping-pong and the sequential asks.
pub const ACTOR_RTT_ROUNDS: u64 = 100_000;
/// Actor benches: tells of the throughput workloads.
pub const ACTOR_TELLS: u64 = 2_000_000;
/// Actor benches: fan-out width and rounds.
pub const FANOUT_ACTORS: usize = 1_000;
/// Actor benches: fan-out rounds.
pub const FANOUT_ROUNDS: usize = 200;
/// Tell workloads: producers yield to their scheduler after this many sends
/// (every contender does the same), as a producer fed by I/O would.
pub const PRODUCER_BURST: u64 = 256;

/// Messages a sender may have in flight to a receiver that has not taken
/// them, in the backpressured-send workload: mailring's cross-shard credit
/// window, the Tokio baseline's bounded channel capacity.
pub const SEND_WINDOW: u32 = 1024;
