//! TLS: mailring sessions against tokio-rustls, the same rustls server
//! configuration (ring provider, one certificate made at start), over
//! loopback, with the load generator (Tokio + tokio-rustls, the same for
//! both) in a process of its own.
//!
//! ```text
//! cargo run --release -p mailring-bench --example tls_echo -- [pairs] [workload...]
//! ```
//!
//! Workloads (length-delimited frames, 4-byte big-endian header):
//! - `echo4k`: 8 connections, each 5,000 frames of 4 KiB with up to 32 in
//!   flight, echoed: throughput through the TLS layer.
//! - `handshakes`: 2,000 connections, 16 at a time
//!   (`TLS_HANDSHAKE_CONCURRENCY` sets another), each: connect, full TLS
//!   1.3 handshake (no resumption), one 64-byte round trip, close.
//!
//! Contenders: a mailring `Server` with `ServerBuilder::tls` (2 shards,
//! reuseport), and Tokio (2 workers) with `tokio_rustls::TlsAcceptor` and
//! tokio-util's `LengthDelimitedCodec`, flushing when its read buffer is
//! empty, and ending with `shutdown` (`close_notify`, which a TLS server
//! must send and mailring's does; before 2026-11-27's tenth session the
//! Tokio server closed without it). Contenders alternate within each pair; the server's CPU time per
//! request is its process's CPU time over the run. `TLS_CLIENT_CPUS=LIST`
//! runs the load generator under `taskset -c LIST`, `TLS_CLIENT_THREADS=N`
//! splits it over N threads; `TLS_MAILRING_SPIN_US=N`
//! sets the shards' idle spin (0: block at once); `TLS_ONLY=<name>` runs
//! one contender alone (for a profiler).

use mailring_bench::{median_of as median, quartiles_of as quartiles};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use mailring_transports::rustls;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Workload {
    Echo4k,
    Handshakes,
}

impl Workload {
    fn parse(s: &str) -> Option<Workload> {
        match s {
            "echo4k" => Some(Workload::Echo4k),
            "handshakes" => Some(Workload::Handshakes),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Workload::Echo4k => "echo4k",
            Workload::Handshakes => "handshakes",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Contender {
    Mailring,
    TokioRustls,
}

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Contender::Mailring => "mailring (native TLS)",
            Contender::TokioRustls => "tokio-rustls",
        }
    }
}

const ECHO_CONNS: usize = 8;
const ECHO_FRAMES: usize = 5_000;
const ECHO_WINDOW: usize = 32;
const HANDSHAKES: usize = 2_000;
/// Handshakes in flight (`TLS_HANDSHAKE_CONCURRENCY`, default 16).
fn handshake_concurrency() -> usize {
    std::env::var("TLS_HANDSHAKE_CONCURRENCY")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(16)
        .clamp(1, HANDSHAKES)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("client") {
        let w = Workload::parse(&args[1]).expect("workload");
        let addr: SocketAddr = args[2].parse().expect("address");
        client(w, addr, Path::new(&args[3]));
        return;
    }
    let pairs: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(5);
    let mut workloads: Vec<Workload> = args.iter().filter_map(|a| Workload::parse(a)).collect();
    if workloads.is_empty() {
        workloads = vec![Workload::Echo4k, Workload::Handshakes];
    }
    let pki = Pki::make();
    println!(
        "TLS benchmark: {pairs} alternating pairs per workload, 2 server threads, the same rustls ServerConfig (ring), load generator (Tokio + tokio-rustls) in its own process"
    );
    for w in workloads {
        run_workload(w, pairs, &pki);
    }
}

/// A self-signed certificate for `localhost` in a temporary directory.
struct Pki {
    dir: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

impl Pki {
    fn make() -> Pki {
        let dir = std::env::temp_dir().join(format!("mailring-tls-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let pki = Pki {
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
            dir,
        };
        std::fs::write(&pki.cert, cert.pem()).unwrap();
        std::fs::write(&pki.key, key.serialize_pem()).unwrap();
        pki
    }

    fn server_config(&self) -> Arc<rustls::ServerConfig> {
        Arc::new(
            mailring_transports::tls::server_config_from_pem_files(&self.cert, &self.key).unwrap(),
        )
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

struct Run {
    wall: Duration,
    count: u64,
    p50: Duration,
    p99: Duration,
    server_cpu: Duration,
}

fn run_workload(w: Workload, pairs: usize, pki: &Pki) {
    // TLS_ONLY=<name>: run one contender (for profiling).
    let only = std::env::var("TLS_ONLY").ok();
    let contenders: Vec<Contender> = [Contender::Mailring, Contender::TokioRustls]
        .into_iter()
        .filter(|c| only.as_deref().is_none_or(|o| o == c.name()))
        .collect();
    let runs: Vec<Vec<Run>> = mailring_bench::alternating_pairs(pairs, contenders.len(), |i| {
        serve_once(contenders[i], w, pki)
    });
    let unit = match w {
        Workload::Echo4k => "frames/s",
        Workload::Handshakes => "handshakes/s",
    };
    println!("\n## {}", w.name());
    println!(
        "| contender | median wall | {unit} | MB/s each way | p50 | p99 | server CPU per item | wall ratio vs mailring (median [q1, q3]) |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for (i, c) in contenders.iter().enumerate() {
        let r = &runs[i];
        let wall = median(r.iter().map(|x| x.wall.as_secs_f64()).collect());
        let p50 = median(r.iter().map(|x| x.p50.as_secs_f64()).collect());
        let p99 = median(r.iter().map(|x| x.p99.as_secs_f64()).collect());
        let cpu = median(
            r.iter()
                .map(|x| x.server_cpu.as_secs_f64() / x.count as f64)
                .collect(),
        );
        let rate = r[0].count as f64 / wall;
        let mbs = match w {
            Workload::Echo4k => format!("{:.0}", rate * 4096.0 / 1e6),
            Workload::Handshakes => "-".to_owned(),
        };
        let ratios: Vec<f64> = r
            .iter()
            .zip(&runs[0])
            .map(|(x, m)| x.wall.as_secs_f64() / m.wall.as_secs_f64())
            .collect();
        let (q1, med, q3) = quartiles(ratios);
        println!(
            "| {} | {:.1} ms | {rate:.0} | {mbs} | {:.1} µs | {:.1} µs | {:.2} µs | {med:.2} [{q1:.2}, {q3:.2}] |",
            c.name(),
            wall * 1e3,
            p50 * 1e6,
            p99 * 1e6,
            cpu * 1e6,
        );
    }
}

/// Starts `c`'s server, runs the load generator against it in another
/// process, stops the server.
fn serve_once(c: Contender, w: Workload, pki: &Pki) -> Run {
    let config = pki.server_config();
    let (addr, stop): (SocketAddr, Box<dyn FnOnce()>) = match c {
        Contender::Mailring => mailring_server(config),
        Contender::TokioRustls => tokio_server(config),
    };
    let command = mailring_bench::load_generator(
        "TLS_CLIENT_CPUS",
        [
            "client".to_owned(),
            w.name().to_owned(),
            addr.to_string(),
            pki.cert.display().to_string(),
        ],
    );
    let run = mailring_bench::drive(command, c.name(), stop);
    let (f, server_cpu) = (run.figures, run.server_cpu);
    Run {
        wall: Duration::from_nanos(f[0]),
        count: f[1],
        p50: Duration::from_nanos(f[2]),
        p99: Duration::from_nanos(f[3]),
        server_cpu,
    }
}

struct Echo;

impl mailring_transports::Session for Echo {
    type Codec = mailring_transports::codec::LengthDelimited;
    type Key = ();

    async fn on_frame(&mut self, frame: Bytes, cx: &mut mailring_transports::SessionCtx<Self>) {
        cx.send_frame(frame);
    }
}

fn mailring_server(config: Arc<rustls::ServerConfig>) -> (SocketAddr, Box<dyn FnOnce()>) {
    // TLS_MAILRING_SPIN_US=N|poll: the shards' idle spin (0 blocks at once);
    // TLS_MAILRING_SHARDS=N: another shard count (1 under valgrind, which
    // serializes threads and stalls while a shard waits in the kernel).
    let shards = std::env::var("TLS_MAILRING_SHARDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2);
    let rt = mailring_bench::runtime_from_env(shards, "TLS_MAILRING_SPIN_US");
    let server = mailring_transports::Server::builder(
        mailring_transports::codec::LengthDelimited::new(),
        |_| Echo,
    )
    .tls(mailring_transports::tls::TlsAcceptor::new(
        (*config).clone(),
    ))
    .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
    .unwrap();
    let addr = server.local_addr();
    (
        addr,
        Box::new(move || {
            // TLS_STATS=1: the server's counters per connection, on stderr.
            if std::env::var_os("TLS_STATS").is_some() {
                let s = server.stats();
                let accepted = s.total(|s| s.accepted).max(1) as f64;
                eprintln!(
                    "mailring server: {} connections, per connection {:.2} receives, {:.2} sends; {} moved for balance",
                    s.total(|s| s.accepted),
                    s.total(|s| s.recv_ops) as f64 / accepted,
                    s.total(|s| s.send_ops) as f64 / accepted,
                    s.total(|s| s.handshakes_moved),
                );
            }
            rt.block_on(server.shutdown());
            rt.shutdown();
        }),
    )
}

fn tokio_server(config: Arc<rustls::ServerConfig>) -> (SocketAddr, Box<dyn FnOnce()>) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    rt.spawn(async move {
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let Ok((stream, _)) = accepted else { continue };
                    let acceptor = acceptor.clone();
                    tokio::spawn(async move {
                        let _ = stream.set_nodelay(true);
                        let Ok(tls) = acceptor.accept(stream).await else { return };
                        let mut tls = mailring_bench::codec_echo(tls).await;
                        // close_notify before the close, as a TLS server
                        // must (RFC 8446 §6.1) and mailring's sends.
                        let _ = tokio::io::AsyncWriteExt::shutdown(&mut tls).await;
                    });
                }
                _ = stopped.changed() => return,
            }
        }
    });
    (
        addr,
        Box::new(move || {
            let _ = stop.send(true);
            rt.shutdown_timeout(Duration::from_secs(1));
        }),
    )
}

// ------------------------------------------------------- load generator

/// Runs `w` against `addr` and prints `wall_ns count p50_ns p99_ns`.
fn client(w: Workload, addr: SocketAddr, ca: &Path) {
    let mut config = mailring_transports::tls::client_config_from_ca_pem_file(ca).unwrap();
    // Every handshake is a full one.
    config.resumption = rustls::client::Resumption::disabled();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    // TLS_CLIENT_THREADS=N: the connections (or the handshaking tasks)
    // split over N threads, each a current-thread runtime, started
    // together (a machine with cores to spare, where one client thread
    // would bound the servers).
    let threads = std::env::var("TLS_CLIENT_THREADS")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(1)
        .clamp(1, ECHO_CONNS.min(handshake_concurrency()));
    let (wall, parts) = mailring_bench::split_over_threads(threads, move |barrier| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let local = tokio::task::LocalSet::new();
        let connector = connector.clone();
        local.block_on(&rt, async move {
            let (start, end, n, lat) = match w {
                Workload::Echo4k => echo_load(addr, connector, ECHO_CONNS / threads, barrier).await,
                Workload::Handshakes => {
                    handshake_load(addr, connector, handshake_concurrency() / threads, barrier)
                        .await
                }
            };
            (start, end, (n, lat))
        })
    });
    let (mut count, mut lat) = (0, Vec::new());
    for (n, l) in parts {
        count += n;
        lat.extend(l);
    }
    lat.sort_unstable();
    let q = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize].as_nanos();
    println!("{} {count} {} {}", wall.as_nanos(), q(0.5), q(0.99));
}

async fn connect(
    addr: SocketAddr,
    connector: &tokio_rustls::TlsConnector,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.set_nodelay(true).unwrap();
    connector
        .connect(
            rustls::pki_types::ServerName::try_from("localhost").unwrap(),
            s,
        )
        .await
        .expect("TLS handshake")
}

fn frame(body: &[u8]) -> Vec<u8> {
    let mut v = (body.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(body);
    v
}

/// `conns_here` connections, each 5,000 frames of 4 KiB, up to 32 in
/// flight, sent in half-window batches; latency per frame from its send to
/// its echo. Returns (start, end, frames, latencies).
async fn echo_load(
    addr: SocketAddr,
    connector: tokio_rustls::TlsConnector,
    conns_here: usize,
    barrier: &std::sync::Barrier,
) -> (Instant, Instant, u64, Vec<Duration>) {
    let mut conns = Vec::new();
    for _ in 0..conns_here {
        conns.push(connect(addr, &connector).await);
    }
    barrier.wait();
    let one = frame(&[7u8; 4096]);
    let start = Instant::now();
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|mut s| {
            let one = one.clone();
            tokio::task::spawn_local(async move {
                mailring_bench::windowed_echo(&mut s, &one, ECHO_FRAMES, ECHO_WINDOW).await
            })
        })
        .collect();
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    (
        start,
        Instant::now(),
        (conns_here * ECHO_FRAMES) as u64,
        lat,
    )
}

/// 2,000 connections over all threads, 16 at a time: connect, handshake,
/// one 64-byte round trip, close; latency from connect to the reply.
/// Returns (start, end, handshakes, latencies).
async fn handshake_load(
    addr: SocketAddr,
    connector: tokio_rustls::TlsConnector,
    concurrency: usize,
    barrier: &std::sync::Barrier,
) -> (Instant, Instant, u64, Vec<Duration>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    barrier.wait();
    let start = Instant::now();
    let per_task = HANDSHAKES / handshake_concurrency();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let connector = connector.clone();
            tokio::task::spawn_local(async move {
                let request = frame(&[5u8; 64]);
                let mut reply = vec![0u8; request.len()];
                let mut lat = Vec::with_capacity(per_task);
                for _ in 0..per_task {
                    let t = Instant::now();
                    let mut s = connect(addr, &connector).await;
                    s.write_all(&request).await.unwrap();
                    s.flush().await.unwrap();
                    s.read_exact(&mut reply).await.unwrap();
                    lat.push(t.elapsed());
                    let _ = s.shutdown().await;
                }
                lat
            })
        })
        .collect();
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    (start, Instant::now(), (per_task * concurrency) as u64, lat)
}
