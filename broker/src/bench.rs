//! The built-in load generator (`broker --bench`): a broker on loopback
//! with a fresh data directory, producers (`XADD`, pipelined) and
//! consumers (`XREADGROUP BLOCK` + `XACK`) on their own threads and
//! connections for a fixed time, a live progress line, and a table of
//! throughput, latencies and the consumers' lag.
//!
//! The load is a closed loop: a producer sends its next batch once the
//! last one is answered, so a stall of the server delays the requests
//! that would have been sent meanwhile instead of showing as their
//! latency (coordinated omission). `XADD` latency runs from a batch's
//! write to each of its replies; end-to-end latency from a batch's stamp
//! (taken as it is encoded) to the consumer's read of the entry, both on
//! this process's monotonic clock.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::server::{Broker, BrokerConfig};
use crate::store::Fsync;

/// The most `XADD`s a producer keeps in flight.
pub const MAX_PIPELINE: usize = 10_000;
/// The largest payload an entry carries.
pub const MAX_PAYLOAD: usize = 16 << 20;
/// The most payload bytes one producer's batch carries (`--pipeline` ×
/// `--payload`): the producer holds the batch, the broker its replies.
pub const MAX_BATCH_BYTES: usize = 64 << 20;
/// The longest run.
pub const MAX_DURATION: Duration = Duration::from_secs(3600);
/// How long consumers may drain what was produced before the last lag
/// is read.
const DRAIN: Duration = Duration::from_secs(2);

/// What the load generator runs.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Producer connections.
    pub producers: usize,
    /// Consumer connections; each reads its own streams (at most one per
    /// stream), or none.
    pub consumers: usize,
    /// `XADD`s each producer keeps in flight.
    pub pipeline: usize,
    /// Bytes of each entry's payload field.
    pub payload: usize,
    /// Streams written (producer `i` writes stream `i % streams`).
    pub streams: usize,
    /// How long producers run.
    pub duration: Duration,
    /// The broker's flush policy.
    pub fsync: Fsync,
    /// The broker's shards.
    pub shards: usize,
    /// Where the run's data directory is made (and removed after):
    /// `None`, the system's temp dir.
    pub parent_dir: Option<PathBuf>,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            producers: 8,
            consumers: 2,
            pipeline: 4,
            payload: 64,
            streams: 4,
            duration: Duration::from_secs(10),
            fsync: Fsync::Always,
            shards: 2,
            parent_dir: None,
        }
    }
}

impl BenchConfig {
    /// Whether the run is one the load generator can make; the reason
    /// when not.
    ///
    /// # Errors
    ///
    /// A message naming the option at fault and its bounds.
    pub fn check(&self) -> Result<(), String> {
        if self.producers == 0 {
            return Err("--producers: at least 1".into());
        }
        if self.streams == 0 {
            return Err("--streams: at least 1".into());
        }
        if !(1..=MAX_PIPELINE).contains(&self.pipeline) {
            return Err(format!("--pipeline: from 1 to {MAX_PIPELINE}"));
        }
        if !(1..=MAX_PAYLOAD).contains(&self.payload) {
            return Err(format!("--payload: from 1 to {MAX_PAYLOAD} bytes"));
        }
        if self.payload.saturating_mul(self.pipeline) > MAX_BATCH_BYTES {
            return Err(format!(
                "--pipeline {} × --payload {}: at most {MAX_BATCH_BYTES} bytes in flight per producer",
                self.pipeline, self.payload
            ));
        }
        if self.consumers > self.streams {
            return Err(format!(
                "--consumers {}: at most --streams ({}): each consumer reads streams of its own",
                self.consumers, self.streams
            ));
        }
        if self.duration.is_zero() || self.duration > MAX_DURATION {
            return Err(format!(
                "--duration: more than 0 and at most {} seconds",
                MAX_DURATION.as_secs()
            ));
        }
        Ok(())
    }
}

/// Latencies in microseconds, in buckets of at most 1/512 of their value
/// (exact below 1,024 µs): memory stays the same however long the run.
#[derive(Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    samples: u64,
}

/// Values past this many microseconds (about 12.7 days) share a bucket.
const HISTOGRAM_MAX_US: u64 = (1 << 40) - 1;

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; Histogram::index(HISTOGRAM_MAX_US) + 1],
            samples: 0,
        }
    }
}

impl Histogram {
    fn index(us: u64) -> usize {
        let us = us.min(HISTOGRAM_MAX_US);
        if us < 1024 {
            return us as usize;
        }
        let top = 63 - us.leading_zeros() as usize; // 10 or more
        let mantissa = (us >> (top - 9)) as usize; // 512..=1023
        1024 + (top - 10) * 512 + (mantissa - 512)
    }

    /// The smallest value of bucket `i`, in microseconds.
    fn lowest(i: usize) -> u64 {
        if i < 1024 {
            return i as u64;
        }
        let (top, mantissa) = ((i - 1024) / 512 + 10, (i - 1024) % 512 + 512);
        (mantissa as u64) << (top - 9)
    }

    /// Counts one latency.
    pub fn record(&mut self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.counts[Histogram::index(us)] += 1;
        self.samples += 1;
    }

    /// Adds `other`'s samples.
    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.samples += other.samples;
    }

    /// Samples counted.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// The `p` quantile (0 to 1) in milliseconds, as its bucket's lowest
    /// value; `None` without samples.
    pub fn quantile_ms(&self, p: f64) -> Option<f64> {
        if self.samples == 0 {
            return None;
        }
        let rank = ((p.clamp(0.0, 1.0) * self.samples as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(Histogram::lowest(i) as f64 / 1000.0);
            }
        }
        None
    }
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram")
            .field("samples", &self.samples)
            .field("p50_ms", &self.quantile_ms(0.5))
            .field("p99_ms", &self.quantile_ms(0.99))
            .finish()
    }
}

/// What a run measured.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct BenchReport {
    /// Entries whose `XADD` was answered within the timed window.
    pub produced: u64,
    /// The timed window: from the producers' start until they were told
    /// to stop (or the run was interrupted).
    pub elapsed: Duration,
    /// Entries read and acknowledged by the consumers, drain included.
    pub consumed: u64,
    /// Entries added but not yet delivered to the consumers' group
    /// (`XINFO GROUPS` lag, over every stream) when the producers had
    /// stopped.
    pub lag_at_stop: u64,
    /// The same after the consumers drained for up to 2 s.
    pub lag_after_drain: u64,
    /// `XADD` latencies.
    pub xadd: Histogram,
    /// Produce-to-consume latencies.
    pub end_to_end: Histogram,
    /// Stopped early by Ctrl-C or SIGTERM.
    pub interrupted: bool,
}

/// A blocking RESP connection, enough for the load generator (it trusts
/// nothing the server says past these bounds).
struct Conn {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

/// A reply, as far as the load generator reads one.
#[derive(Debug)]
enum Value {
    Line,
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    Array(Vec<Value>),
}

/// Appends `args` as one RESP request (a multibulk of bulk strings).
pub fn encode_command(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// The longest reply line read (a status, an error, a length).
const MAX_LINE: usize = 64 << 10;
/// The largest bulk read (Redis's own limit).
const MAX_BULK: usize = 512 << 20;
/// The deepest nesting of arrays read (the bench's replies nest 4 deep).
const MAX_DEPTH: usize = 8;

impl Conn {
    fn connect(addr: SocketAddr) -> io::Result<Conn> {
        let s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        s.set_write_timeout(Some(Duration::from_secs(30)))?;
        Ok(Conn {
            r: BufReader::new(s.try_clone()?),
            w: s,
        })
    }

    fn read(&mut self) -> io::Result<Value> {
        self.read_nested(0)
    }

    fn read_nested(&mut self, depth: usize) -> io::Result<Value> {
        let mut line = Vec::new();
        let n = (&mut self.r)
            .take(MAX_LINE as u64)
            .read_until(b'\n', &mut line)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        if !line.ends_with(b"\r\n") {
            return Err(bad_reply(&line));
        }
        line.truncate(line.len() - 2);
        let Some((&kind, rest)) = line.split_first() else {
            return Err(bad_reply(&line));
        };
        let number = || -> io::Result<i64> {
            std::str::from_utf8(rest)
                .ok()
                .and_then(|t| t.parse().ok())
                .ok_or_else(|| bad_reply(&line))
        };
        match kind {
            b'+' => Ok(Value::Line),
            b'-' => Err(io::Error::other(format!(
                "server error: {}",
                String::from_utf8_lossy(rest)
            ))),
            b':' => number().map(Value::Int),
            b'$' => {
                let Ok(n) = usize::try_from(number()?) else {
                    return Ok(Value::Nil);
                };
                if n > MAX_BULK {
                    return Err(bad_reply(&line));
                }
                let mut buf = vec![0u8; n + 2];
                self.r.read_exact(&mut buf)?;
                buf.truncate(n);
                Ok(Value::Bulk(buf))
            }
            b'*' => {
                let Ok(n) = usize::try_from(number()?) else {
                    return Ok(Value::Nil);
                };
                if depth >= MAX_DEPTH {
                    return Err(bad_reply(&line));
                }
                let mut items = Vec::with_capacity(n.min(1024));
                for _ in 0..n {
                    items.push(self.read_nested(depth + 1)?);
                }
                Ok(Value::Array(items))
            }
            _ => Err(bad_reply(&line)),
        }
    }

    fn call(&mut self, args: &[&[u8]]) -> io::Result<Value> {
        let mut out = Vec::new();
        encode_command(&mut out, args);
        self.w.write_all(&out)?;
        self.read()
    }
}

fn bad_reply(line: &[u8]) -> io::Error {
    let shown = &line[..line.len().min(80)];
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("bad reply {:?}", String::from_utf8_lossy(shown)),
    )
}

/// What the threads share: when to stop, what they counted, the first
/// failure (which stops the run).
struct Run {
    stop_producers: AtomicBool,
    stop_consumers: AtomicBool,
    produced: AtomicU64,
    consumed: AtomicU64,
    failed: AtomicBool,
    failure: Mutex<Option<io::Error>>,
}

impl Run {
    fn fail(&self, e: io::Error) {
        let mut first = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        first.get_or_insert(e);
        self.failed.store(true, Ordering::Release);
    }

    fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }
}

fn producer(
    mut c: Conn,
    stream: String,
    config: BenchConfig,
    epoch: Instant,
    run: &Run,
) -> io::Result<Histogram> {
    let payload = vec![b'x'; config.payload];
    let mut out = Vec::new();
    let mut latencies = Histogram::default();
    while !run.stop_producers.load(Ordering::Relaxed) && !run.failed() {
        out.clear();
        let stamp = epoch.elapsed().as_nanos().to_string();
        for _ in 0..config.pipeline {
            encode_command(
                &mut out,
                &[
                    b"XADD",
                    stream.as_bytes(),
                    b"*",
                    b"t",
                    stamp.as_bytes(),
                    b"p",
                    &payload,
                ],
            );
        }
        let sent = Instant::now();
        c.w.write_all(&out)?;
        for _ in 0..config.pipeline {
            match c.read()? {
                Value::Bulk(_) => {}
                other => return Err(io::Error::other(format!("XADD answered {other:?}"))),
            }
            latencies.record(sent.elapsed());
        }
        run.produced
            .fetch_add(config.pipeline as u64, Ordering::Relaxed);
    }
    Ok(latencies)
}

/// Reads its streams through the group until told to stop; returns
/// end-to-end latencies.
fn consumer(
    mut c: Conn,
    name: String,
    streams: Vec<String>,
    count: usize,
    epoch: Instant,
    run: &Run,
) -> io::Result<Histogram> {
    let mut samples = Histogram::default();
    let count = count.to_string();
    while !run.stop_consumers.load(Ordering::Relaxed) && !run.failed() {
        let mut args: Vec<&[u8]> = vec![
            b"XREADGROUP",
            b"GROUP",
            b"bench",
            name.as_bytes(),
            b"COUNT",
            count.as_bytes(),
            b"BLOCK",
            b"200",
            b"STREAMS",
        ];
        args.extend(streams.iter().map(|s| s.as_bytes()));
        args.extend(streams.iter().map(|_| &b">"[..]));
        let Value::Array(per_stream) = c.call(&args)? else {
            continue;
        };
        let now = epoch.elapsed().as_nanos();
        for s in per_stream {
            let Value::Array(mut kv) = s else { continue };
            let (Some(Value::Array(entries)), Some(Value::Bulk(key))) = (kv.pop(), kv.pop()) else {
                continue;
            };
            let mut ack: Vec<Vec<u8>> = Vec::with_capacity(entries.len());
            for e in entries {
                let Value::Array(mut parts) = e else { continue };
                let (Some(Value::Array(fields)), Some(Value::Bulk(id))) =
                    (parts.pop(), parts.pop())
                else {
                    continue;
                };
                if let Some(Value::Bulk(t)) = fields.get(1) {
                    if let Some(stamp) = std::str::from_utf8(t)
                        .ok()
                        .and_then(|t| t.parse::<u128>().ok())
                    {
                        let ns = u64::try_from(now.saturating_sub(stamp)).unwrap_or(u64::MAX);
                        samples.record(Duration::from_nanos(ns));
                    }
                }
                ack.push(id);
            }
            if !ack.is_empty() {
                let mut args: Vec<&[u8]> = vec![b"XACK", &key, b"bench"];
                args.extend(ack.iter().map(Vec::as_slice));
                c.call(&args)?;
                run.consumed.fetch_add(ack.len() as u64, Ordering::Relaxed);
            }
        }
    }
    Ok(samples)
}

/// The run's data directory: made fresh (never one that was there, nor
/// through a link), readable only by its owner, removed when dropped.
struct DataDir(PathBuf);

impl DataDir {
    fn make(parent: &Path) -> io::Result<DataDir> {
        use std::os::unix::fs::DirBuilderExt;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        for attempt in 0..100u32 {
            let path = parent.join(format!(
                "mailring-broker-bench-{}-{nanos:x}-{attempt}",
                std::process::id()
            ));
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => return Ok(DataDir(path)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("making a data directory in {}: {e}", parent.display()),
                    ))
                }
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("no fresh data directory name in {}", parent.display()),
        ))
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes to stderr, ignoring a closed one (`--bench 2>&1 | head -1`).
macro_rules! progress {
    ($($arg:tt)*) => {{
        let mut err = io::stderr().lock();
        let _ = write!(err, $($arg)*);
        let _ = err.flush();
    }};
}

/// Runs the load generator against a broker started from `broker` (its
/// address, data directory, password and TLS replaced: loopback, a fresh
/// directory under [`BenchConfig::parent_dir`], none), prints the table
/// to stdout, and removes the data directory.
///
/// # Errors
///
/// A refused configuration ([`BenchConfig::check`]), the broker's start-up
/// error, or the first client's error (which ends the run at once).
pub fn run(config: &BenchConfig, broker: BrokerConfig) -> io::Result<BenchReport> {
    let report = start(config, broker, Some(Interrupts::install()))?;
    print_table(config, &report, &mut io::stdout().lock());
    Ok(report)
}

/// [`run`] without the table on stdout (the progress line still goes to
/// stderr) and without catching Ctrl-C or SIGTERM.
///
/// # Errors
///
/// As [`run`].
pub fn measure(config: &BenchConfig, broker: BrokerConfig) -> io::Result<BenchReport> {
    start(config, broker, None)
}

fn start(
    config: &BenchConfig,
    mut broker: BrokerConfig,
    interrupts: Option<Interrupts>,
) -> io::Result<BenchReport> {
    config
        .check()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let parent = config.parent_dir.clone().unwrap_or_else(std::env::temp_dir);
    let dir = DataDir::make(&parent)?;
    broker.addr = SocketAddr::from(([127, 0, 0, 1], 0));
    broker.shards = config.shards;
    broker.requirepass = None;
    broker.tls = None;
    broker.store.dir = dir.0.clone();
    broker.store.fsync = config.fsync;
    let broker = Broker::start(broker)?;
    let result = drive(broker.local_addr(), config, interrupts);
    broker.shutdown();
    drop(dir);
    result
}

/// Ctrl-C and SIGTERM, polled between progress lines.
struct Interrupts(Vec<mailring::signal::Signal>);

impl Interrupts {
    fn install() -> Interrupts {
        use mailring::signal::{signal, SignalKind};
        Interrupts(
            [SignalKind::interrupt(), SignalKind::terminate()]
                .into_iter()
                .filter_map(|k| signal(k).ok())
                .collect(),
        )
    }

    fn arrived(&mut self) -> bool {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        self.0.iter_mut().any(|s| {
            let recv = std::pin::pin!(s.recv());
            recv.poll(&mut cx).is_ready()
        })
    }
}

use std::future::Future as _;

fn drive(
    addr: SocketAddr,
    config: &BenchConfig,
    mut interrupts: Option<Interrupts>,
) -> io::Result<BenchReport> {
    let streams: Vec<String> = (0..config.streams).map(|i| format!("bench:{i}")).collect();
    let mut setup = Conn::connect(addr)?;
    for s in &streams {
        setup.call(&[
            b"XGROUP",
            b"CREATE",
            s.as_bytes(),
            b"bench",
            b"$",
            b"MKSTREAM",
        ])?;
    }
    progress!("{}\n", title(config));
    let run = Arc::new(Run {
        stop_producers: AtomicBool::new(false),
        stop_consumers: AtomicBool::new(false),
        produced: AtomicU64::new(0),
        consumed: AtomicU64::new(0),
        failed: AtomicBool::new(false),
        failure: Mutex::new(None),
    });
    // Connected before the clock starts.
    let producer_conns = (0..config.producers)
        .map(|_| Conn::connect(addr))
        .collect::<io::Result<Vec<_>>>()?;
    let consumer_conns = (0..config.consumers)
        .map(|_| Conn::connect(addr))
        .collect::<io::Result<Vec<_>>>()?;
    // A consumer asks for at most about 4 MiB of payload a read.
    let count = (4 << 20) / config.payload.max(1);
    let count = count.clamp(1, 500);
    let epoch = Instant::now();
    let producers: Vec<_> = producer_conns
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let (stream, cfg, run) = (
                streams[i % streams.len()].clone(),
                config.clone(),
                run.clone(),
            );
            std::thread::spawn(move || {
                producer(c, stream, cfg, epoch, &run)
                    .inspect_err(|e| run.fail(io::Error::new(e.kind(), format!("a producer: {e}"))))
            })
        })
        .collect();
    let consumers: Vec<_> = consumer_conns
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let mine: Vec<String> = streams
                .iter()
                .enumerate()
                .filter(|(s, _)| s % config.consumers == i)
                .map(|(_, s)| s.clone())
                .collect();
            let run = run.clone();
            std::thread::spawn(move || {
                consumer(c, format!("consumer-{i}"), mine, count, epoch, &run)
                    .inspect_err(|e| run.fail(io::Error::new(e.kind(), format!("a consumer: {e}"))))
            })
        })
        .collect();
    // The progress line, once a second, until the time is up, a thread
    // fails or a signal comes.
    let mut interrupted = false;
    let (mut last_count, mut last_at) = (0, Duration::ZERO);
    let elapsed = loop {
        let elapsed = epoch.elapsed();
        if elapsed >= config.duration || run.failed() {
            break elapsed;
        }
        if interrupts.as_mut().is_some_and(Interrupts::arrived) {
            interrupted = true;
            break elapsed;
        }
        std::thread::sleep((config.duration - elapsed).min(Duration::from_millis(100)));
        let at = epoch.elapsed();
        if at - last_at >= Duration::from_secs(1) || at >= config.duration {
            let now = run.produced.load(Ordering::Relaxed);
            let rate = (now - last_count) as f64 / (at - last_at).as_secs_f64();
            progress!(
                "\r  {:>6.1} s  {rate:>9.0} entries/s produced, {now:>10} produced, {:>10} consumed   ",
                at.as_secs_f64(),
                run.consumed.load(Ordering::Relaxed)
            );
            (last_count, last_at) = (now, at);
        }
    };
    let produced = run.produced.load(Ordering::Relaxed);
    run.stop_producers.store(true, Ordering::Relaxed);
    let mut xadd = Histogram::default();
    for p in producers {
        if let Ok(Ok(h)) = p.join() {
            xadd.merge(&h);
        }
    }
    let lag_at_stop = if run.failed() {
        0
    } else {
        lag(&mut setup, &streams)?
    };
    // The consumers drain for a moment (not after an interrupt), then
    // stop at their next reply (a read blocks at most 200 ms).
    let drain_until = Instant::now() + DRAIN;
    while !interrupted
        && !run.failed()
        && config.consumers > 0
        && Instant::now() < drain_until
        && lag(&mut setup, &streams)? > 0
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    run.stop_consumers.store(true, Ordering::Relaxed);
    let mut end_to_end = Histogram::default();
    for c in consumers {
        if let Ok(Ok(h)) = c.join() {
            end_to_end.merge(&h);
        }
    }
    progress!("\n");
    if let Some(e) = run.failure.lock().unwrap_or_else(|p| p.into_inner()).take() {
        return Err(e);
    }
    Ok(BenchReport {
        produced,
        elapsed,
        consumed: run.consumed.load(Ordering::Relaxed),
        lag_at_stop,
        lag_after_drain: lag(&mut setup, &streams)?,
        xadd,
        end_to_end,
        interrupted,
    })
}

/// Entries not yet delivered to the group, over `streams`.
fn lag(c: &mut Conn, streams: &[String]) -> io::Result<u64> {
    let mut lag = 0u64;
    for s in streams {
        let Value::Array(groups) = c.call(&[b"XINFO", b"GROUPS", s.as_bytes()])? else {
            continue;
        };
        for g in groups {
            let Value::Array(kv) = g else { continue };
            for pair in kv.chunks(2) {
                if let [Value::Bulk(k), Value::Int(v)] = pair {
                    if k == b"lag" {
                        lag += u64::try_from(*v).unwrap_or(0);
                    }
                }
            }
        }
    }
    Ok(lag)
}

fn title(config: &BenchConfig) -> String {
    format!(
        "mailring broker load generator: {} producers (pipeline {}), {} consumers, {} streams, {}-byte payloads, {:.1} s, appendfsync {}, {} shards, loopback",
        config.producers,
        config.pipeline,
        config.consumers,
        config.streams,
        config.payload,
        config.duration.as_secs_f64(),
        config.fsync.name(),
        config.shards
    )
}

/// Prints `report` as a table.
pub fn print_table(config: &BenchConfig, report: &BenchReport, out: &mut dyn Write) {
    let secs = report.elapsed.as_secs_f64();
    let rate = report.produced as f64 / secs;
    let mb = rate * config.payload as f64 / 1e6;
    let ms = |h: &Histogram, p: f64| {
        h.quantile_ms(p)
            .map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"))
    };
    let _ = writeln!(out, "{}\n", title(config));
    if report.interrupted {
        let _ = writeln!(out, "(interrupted after {secs:.1} s)\n");
    }
    let _ = writeln!(out, "| metric | value |");
    let _ = writeln!(out, "| --- | --- |");
    let _ = writeln!(
        out,
        "| entries produced | {} in {secs:.1} s |",
        report.produced
    );
    let _ = writeln!(out, "| entries/s | {rate:.0} |");
    let _ = writeln!(out, "| payload MB/s | {mb:.2} |");
    let _ = writeln!(
        out,
        "| XADD latency p50 / p99 / p99.9 | {} / {} / {} ms ({} samples) |",
        ms(&report.xadd, 0.5),
        ms(&report.xadd, 0.99),
        ms(&report.xadd, 0.999),
        report.xadd.samples()
    );
    let _ = writeln!(
        out,
        "| end-to-end (produce → consume) p50 / p99 | {} / {} ms ({} samples) |",
        ms(&report.end_to_end, 0.5),
        ms(&report.end_to_end, 0.99),
        report.end_to_end.samples()
    );
    let _ = writeln!(out, "| consumed (acknowledged) | {} |", report.consumed);
    let _ = writeln!(
        out,
        "| consumer lag when producers stopped | {} entries |",
        report.lag_at_stop
    );
    let _ = writeln!(
        out,
        "| consumer lag after a drain of up to {} s | {} entries |",
        DRAIN.as_secs(),
        report.lag_after_drain
    );
    let _ = writeln!(
        out,
        "\nClosed loop: each producer sends its next batch when the last is answered; XADD latency runs from a batch's write to each reply."
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_histogram_keeps_values_within_a_five_hundredth() {
        let mut h = Histogram::default();
        for us in [0u64, 1, 999, 1023, 1024, 1025, 4096, 123_456, 10_000_000] {
            let i = Histogram::index(us);
            let low = Histogram::lowest(i);
            assert!(low <= us, "{us}: {low}");
            assert!(us - low <= us / 512, "{us}: {low}");
            assert!(Histogram::lowest(i + 1) > us, "{us}");
            h.record(Duration::from_micros(us));
        }
        h.record(Duration::MAX);
        assert_eq!(h.samples(), 10);
        assert_eq!(h.quantile_ms(0.0), Some(0.0));
        assert_eq!(h.quantile_ms(0.5), Some(1.024));
        assert!(h.quantile_ms(1.0).unwrap() > 1e9);
        assert_eq!(Histogram::default().quantile_ms(0.5), None);
    }

    #[test]
    fn runs_the_bench_cannot_make_are_refused_with_the_option_named() {
        let ok = BenchConfig::default();
        assert_eq!(ok.check(), Ok(()));
        type Spoil = fn(&mut BenchConfig);
        let cases: [(&str, Spoil); 8] = [
            ("--producers", |c| c.producers = 0),
            ("--streams", |c| c.streams = 0),
            ("--pipeline", |c| c.pipeline = 0),
            ("--pipeline", |c| c.pipeline = MAX_PIPELINE + 1),
            ("--payload", |c| c.payload = MAX_PAYLOAD + 1),
            ("--pipeline 10000 × --payload", |c| {
                c.pipeline = MAX_PIPELINE;
                c.payload = 1 << 20;
            }),
            ("--consumers 5", |c| c.consumers = 5),
            ("--duration", |c| c.duration = Duration::ZERO),
        ];
        for (named, spoil) in cases {
            let mut c = BenchConfig::default();
            spoil(&mut c);
            let e = c.check().expect_err(named);
            assert!(e.starts_with(named), "{named}: {e}");
        }
    }
}
