//! The built-in load generator (`broker --bench`): a broker on loopback
//! with a fresh data directory, producers (`XADD`, pipelined) and
//! consumers (`XREADGROUP BLOCK` + `XACK`) on their own threads and
//! connections for a fixed time, a live progress line, and a table of
//! throughput, latencies and the consumers' lag at the end.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::server::{Broker, BrokerConfig};
use crate::store::Fsync;

/// What the load generator runs.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Producer connections.
    pub producers: usize,
    /// Consumer connections.
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
        }
    }
}

/// A blocking RESP connection, enough for the load generator.
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

impl Conn {
    fn connect(addr: SocketAddr) -> io::Result<Conn> {
        let s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(Conn {
            r: BufReader::new(s.try_clone()?),
            w: s,
        })
    }

    fn read(&mut self) -> io::Result<Value> {
        let mut line = String::new();
        if self.r.read_line(&mut line)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let line = line.trim_end_matches(['\r', '\n']);
        let bad = || io::Error::new(io::ErrorKind::InvalidData, format!("bad reply {line:?}"));
        let (kind, rest) = line.split_at(1.min(line.len()));
        match kind {
            "+" => Ok(Value::Line),
            "-" => Err(io::Error::other(format!("server error: {rest}"))),
            ":" => rest.parse().map(Value::Int).map_err(|_| bad()),
            "$" => {
                let n: i64 = rest.parse().map_err(|_| bad())?;
                if n < 0 {
                    return Ok(Value::Nil);
                }
                let mut buf = vec![0u8; n as usize + 2];
                self.r.read_exact(&mut buf)?;
                buf.truncate(n as usize);
                Ok(Value::Bulk(buf))
            }
            "*" => {
                let n: i64 = rest.parse().map_err(|_| bad())?;
                if n < 0 {
                    return Ok(Value::Nil);
                }
                (0..n)
                    .map(|_| self.read())
                    .collect::<io::Result<_>>()
                    .map(Value::Array)
            }
            _ => Err(bad()),
        }
    }

    fn call(&mut self, args: &[&[u8]]) -> io::Result<Value> {
        let mut out = Vec::new();
        encode_command(&mut out, args);
        self.w.write_all(&out)?;
        self.read()
    }
}

/// Latencies in microseconds, merged from every thread.
#[derive(Default)]
struct Samples(Vec<u32>);

impl Samples {
    fn push(&mut self, d: Duration) {
        self.0.push(d.as_micros().min(u128::from(u32::MAX)) as u32);
    }

    fn percentile(&self, p: f64) -> f64 {
        if self.0.is_empty() {
            return f64::NAN;
        }
        let i = ((self.0.len() - 1) as f64 * p).round() as usize;
        f64::from(self.0[i]) / 1000.0
    }
}

/// What one producer measured.
struct Produced {
    latencies: Samples,
    entries: u64,
}

fn producer(
    addr: SocketAddr,
    stream: String,
    config: BenchConfig,
    epoch: Instant,
    stop: Arc<AtomicBool>,
    count: Arc<AtomicU64>,
) -> io::Result<Produced> {
    let mut c = Conn::connect(addr)?;
    let payload = vec![b'x'; config.payload];
    let mut out = Vec::new();
    let mut latencies = Samples::default();
    let mut entries = 0;
    while !stop.load(Ordering::Relaxed) {
        out.clear();
        let sent = Instant::now();
        let t = epoch.elapsed().as_nanos().to_string();
        for _ in 0..config.pipeline.max(1) {
            encode_command(
                &mut out,
                &[
                    b"XADD",
                    stream.as_bytes(),
                    b"*",
                    b"t",
                    t.as_bytes(),
                    b"p",
                    &payload,
                ],
            );
        }
        c.w.write_all(&out)?;
        for _ in 0..config.pipeline.max(1) {
            match c.read()? {
                Value::Bulk(_) => {}
                other => return Err(io::Error::other(format!("XADD answered {other:?}"))),
            }
            latencies.push(sent.elapsed());
            entries += 1;
        }
        count.fetch_add(config.pipeline.max(1) as u64, Ordering::Relaxed);
    }
    Ok(Produced { latencies, entries })
}

/// Reads its streams through the group until told to stop and drained;
/// returns end-to-end latencies.
fn consumer(
    addr: SocketAddr,
    name: String,
    streams: Vec<String>,
    epoch: Instant,
    stop: Arc<AtomicBool>,
    count: Arc<AtomicU64>,
) -> io::Result<Samples> {
    let mut c = Conn::connect(addr)?;
    let mut samples = Samples::default();
    loop {
        let mut args: Vec<&[u8]> = vec![
            b"XREADGROUP",
            b"GROUP",
            b"bench",
            name.as_bytes(),
            b"COUNT",
            b"500",
            b"BLOCK",
            b"200",
            b"STREAMS",
        ];
        args.extend(streams.iter().map(|s| s.as_bytes()));
        args.extend(streams.iter().map(|_| &b">"[..]));
        let got = c.call(&args)?;
        let Value::Array(per_stream) = got else {
            // Nothing within the block: done once the producers are.
            if stop.load(Ordering::Relaxed) {
                return Ok(samples);
            }
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
                    if let Some(sent) = std::str::from_utf8(t)
                        .ok()
                        .and_then(|t| t.parse::<u128>().ok())
                    {
                        samples.push(Duration::from_nanos(now.saturating_sub(sent) as u64));
                    }
                }
                ack.push(id);
            }
            if !ack.is_empty() {
                let mut args: Vec<&[u8]> = vec![b"XACK", &key, b"bench"];
                args.extend(ack.iter().map(Vec::as_slice));
                c.call(&args)?;
                count.fetch_add(ack.len() as u64, Ordering::Relaxed);
            }
        }
    }
}

/// Runs the load generator and prints its table; the data directory is
/// removed afterwards.
///
/// # Errors
///
/// The broker's start-up error, or a client's.
pub fn run(config: BenchConfig) -> io::Result<()> {
    let dir = std::env::temp_dir().join(format!("mailring-broker-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut broker_config = BrokerConfig {
        addr: "127.0.0.1:0".parse().expect("an address"),
        shards: config.shards,
        ..BrokerConfig::default()
    };
    broker_config.store.dir = dir.clone();
    broker_config.store.fsync = config.fsync;
    let broker = Broker::start(broker_config)?;
    let addr = broker.local_addr();
    let result = drive(addr, &config);
    broker.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn drive(addr: SocketAddr, config: &BenchConfig) -> io::Result<()> {
    let streams: Vec<String> = (0..config.streams.max(1))
        .map(|i| format!("bench:{i}"))
        .collect();
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
    let title = format!(
        "mailring broker load generator: {} producers (pipeline {}), {} consumers, {} streams, {}-byte payloads, {:?}, appendfsync {}, {} shards, loopback",
        config.producers,
        config.pipeline,
        config.consumers,
        streams.len(),
        config.payload,
        config.duration,
        config.fsync.name(),
        config.shards
    );
    eprintln!("{title}");
    let epoch = Instant::now();
    let stop_producers = Arc::new(AtomicBool::new(false));
    let stop_consumers = Arc::new(AtomicBool::new(false));
    let produced = Arc::new(AtomicU64::new(0));
    let consumed = Arc::new(AtomicU64::new(0));
    let producers: Vec<_> = (0..config.producers.max(1))
        .map(|i| {
            let (stream, cfg) = (streams[i % streams.len()].clone(), config.clone());
            let (stop, count) = (stop_producers.clone(), produced.clone());
            std::thread::spawn(move || producer(addr, stream, cfg, epoch, stop, count))
        })
        .collect();
    let consumers: Vec<_> = (0..config.consumers)
        .map(|i| {
            let mine: Vec<String> = streams
                .iter()
                .enumerate()
                .filter(|(s, _)| s % config.consumers == i)
                .map(|(_, s)| s.clone())
                .collect();
            let (stop, count) = (stop_consumers.clone(), consumed.clone());
            let name = format!("consumer-{i}");
            std::thread::spawn(move || consumer(addr, name, mine, epoch, stop, count))
        })
        .collect();
    let started = Instant::now();
    let mut last = 0;
    while started.elapsed() < config.duration {
        std::thread::sleep(Duration::from_secs(1).min(config.duration));
        let now = produced.load(Ordering::Relaxed);
        eprint!(
            "\r  {:>4.0} s  {:>9} entries/s produced, {:>10} produced, {:>10} consumed   ",
            started.elapsed().as_secs_f64(),
            now - last,
            now,
            consumed.load(Ordering::Relaxed)
        );
        let _ = io::stderr().flush();
        last = now;
    }
    stop_producers.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed();
    let mut xadd = Samples::default();
    let mut total = 0u64;
    for p in producers {
        let p = p
            .join()
            .map_err(|_| io::Error::other("a producer panicked"))??;
        xadd.0.extend(p.latencies.0);
        total += p.entries;
    }
    // Let the consumers drain for a moment, then measure the lag.
    let drain_until = Instant::now() + Duration::from_secs(2);
    while consumed.load(Ordering::Relaxed) < total && Instant::now() < drain_until {
        std::thread::sleep(Duration::from_millis(20));
    }
    stop_consumers.store(true, Ordering::Relaxed);
    let mut e2e = Samples::default();
    for c in consumers {
        let s = c
            .join()
            .map_err(|_| io::Error::other("a consumer panicked"))??;
        e2e.0.extend(s.0);
    }
    eprintln!();
    let mut lag = 0i64;
    for s in &streams {
        if let Value::Array(groups) = setup.call(&[b"XINFO", b"GROUPS", s.as_bytes()])? {
            for g in groups {
                if let Value::Array(kv) = g {
                    for pair in kv.chunks(2) {
                        if let [Value::Bulk(k), Value::Int(v)] = pair {
                            if k == b"lag" {
                                lag += v;
                            }
                        }
                    }
                }
            }
        }
    }
    xadd.0.sort_unstable();
    e2e.0.sort_unstable();
    let secs = elapsed.as_secs_f64();
    let rate = total as f64 / secs;
    let mb = rate * config.payload as f64 / 1e6;
    let mut out = io::stdout().lock();
    let _ = writeln!(out, "{title}\n");
    let _ = writeln!(out, "| metric | value |");
    let _ = writeln!(out, "| --- | --- |");
    let _ = writeln!(out, "| entries produced | {total} in {secs:.1} s |");
    let _ = writeln!(out, "| entries/s | {rate:.0} |");
    let _ = writeln!(out, "| payload MB/s | {mb:.2} |");
    let _ = writeln!(
        out,
        "| XADD latency p50 / p99 / p99.9 | {:.2} / {:.2} / {:.2} ms |",
        xadd.percentile(0.5),
        xadd.percentile(0.99),
        xadd.percentile(0.999)
    );
    let _ = writeln!(
        out,
        "| end-to-end (produce → consume) p50 / p99 | {:.2} / {:.2} ms |",
        e2e.percentile(0.5),
        e2e.percentile(0.99)
    );
    let _ = writeln!(out, "| consumed | {} |", consumed.load(Ordering::Relaxed));
    let _ = writeln!(out, "| consumer lag at the end | {lag} entries |");
    Ok(())
}
