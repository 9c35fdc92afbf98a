//! hyper on mailring (through `compat::CompatStream`) against hyper on
//! Tokio, the same service, and the adapter's cost on an echo against
//! mailring's native sessions; load generators in a process of their own.
//!
//! ```text
//! cargo run --release -p mailring-bench --example http_echo -- [pairs] [http1|echo...]
//! ```
//!
//! - `http1`: 64 keep-alive connections, each 1,000 sequential `GET /`
//!   answered with 64 bytes by a hyper `service_fn` (HTTP/1.1); contenders
//!   `mailring+hyper` (a `BalancedListener`: a reuseport listener per
//!   shard, connections kept even across the shards; before 2026-11-27's
//!   eleventh session, plain reuseport listeners whose spread was the
//!   kernel's; each connection served on its shard through the adapter,
//!   `ShardTimer`) and
//!   `tokio+hyper` (2 workers, hyper-util's `TokioIo` and `TokioTimer`):
//!   both with a timer, so hyper keeps its header read timeout on both
//!   (before 2026-11-27's ninth session only mailring's had one).
//! - `echo`: 8 connections, each 20,000 frames of 64 bytes (4-byte length
//!   header) with up to 32 in flight, echoed; contenders `mailring
//!   native` (a `Session`), `mailring compat` (tokio-util's
//!   `LengthDelimitedCodec` over a `CompatStream`, as a Tokio user would
//!   port it), `tokio`.
//!
//! 2 server threads each; contenders alternate within each pair.
//! `HTTP_MAILRING_SPIN_US=N|poll` sets the shards' idle spin (0 blocks at
//! once).
//! `HTTP_CLIENT_CPUS=LIST` runs the load generator under `taskset -c
//! LIST`, `HTTP_CLIENT_THREADS=N` splits it over N threads.

use mailring_bench::{median_of as median, quartiles_of as quartiles};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};

const HTTP_CONNS: usize = 64;
const HTTP_REQUESTS: usize = 1_000;
const ECHO_CONNS: usize = 8;
const ECHO_FRAMES: usize = 20_000;
const ECHO_WINDOW: usize = 32;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Workload {
    Http1,
    Echo,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Contender {
    MailringHyper,
    TokioHyper,
    MailringNative,
    MailringCompat,
    Tokio,
}

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Contender::MailringHyper => "mailring+hyper (adapter)",
            Contender::TokioHyper => "tokio+hyper",
            Contender::MailringNative => "mailring native session",
            Contender::MailringCompat => "mailring compat + tokio-util codec",
            Contender::Tokio => "tokio + tokio-util codec",
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("client") {
        let w = if args[1] == "http1" {
            Workload::Http1
        } else {
            Workload::Echo
        };
        client(w, args[2].parse().unwrap());
        return;
    }
    let pairs: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(5);
    let mut workloads: Vec<Workload> = args
        .iter()
        .filter_map(|a| match a.as_str() {
            "http1" => Some(Workload::Http1),
            "echo" => Some(Workload::Echo),
            _ => None,
        })
        .collect();
    if workloads.is_empty() {
        workloads = vec![Workload::Http1, Workload::Echo];
    }
    println!(
        "http_echo: {pairs} alternating pairs, 2 server threads, load generator in its own process"
    );
    for w in workloads {
        let contenders: &[Contender] = match w {
            Workload::Http1 => &[Contender::MailringHyper, Contender::TokioHyper],
            Workload::Echo => &[
                Contender::MailringNative,
                Contender::MailringCompat,
                Contender::Tokio,
            ],
        };
        let runs: Vec<Vec<Run>> = mailring_bench::alternating_pairs(pairs, contenders.len(), |i| {
            serve_once(contenders[i], w)
        });
        println!("\n## {w:?}");
        println!("| contender | median wall | requests/s | p50 | p99 | server CPU/request | wall ratio vs first (median [q1, q3]) |");
        println!("| --- | --- | --- | --- | --- | --- | --- |");
        for (i, c) in contenders.iter().enumerate() {
            let r = &runs[i];
            let wall = median(r.iter().map(|x| x.0.as_secs_f64()).collect());
            let count = r[0].3 as f64;
            let ratios: Vec<f64> = r
                .iter()
                .zip(&runs[0])
                .map(|(x, m)| x.0.as_secs_f64() / m.0.as_secs_f64())
                .collect();
            let (q1, med, q3) = quartiles(ratios);
            let p50 = median(r.iter().map(|x| x.1 as f64).collect());
            let p99 = median(r.iter().map(|x| x.2 as f64).collect());
            let cpu = median(r.iter().map(|x| x.4.as_secs_f64() / count).collect());
            println!(
                "| {} | {:.1} ms | {:.0} | {:.1} µs | {:.1} µs | {:.2} µs | {med:.2} [{q1:.2}, {q3:.2}] |",
                c.name(),
                wall * 1e3,
                count / wall,
                p50 / 1e3,
                p99 / 1e3,
                cpu * 1e6
            );
        }
    }
}

/// One run: (wall, p50 ns, p99 ns, requests, server CPU).
type Run = (Duration, u64, u64, u64, Duration);

fn serve_once(c: Contender, w: Workload) -> Run {
    let (addr, stop) = match c {
        Contender::MailringHyper | Contender::MailringCompat => mailring_server(c),
        Contender::MailringNative => native_server(),
        Contender::TokioHyper | Contender::Tokio => tokio_server(c),
    };
    let w_arg = if w == Workload::Http1 {
        "http1"
    } else {
        "echo"
    };
    let cmd =
        mailring_bench::load_generator("HTTP_CLIENT_CPUS", ["client", w_arg, &addr.to_string()]);
    let run = mailring_bench::drive(cmd, c.name(), stop);
    let f = run.figures;
    (Duration::from_nanos(f[0]), f[1], f[2], f[3], run.server_cpu)
}

async fn hello(
    _req: hyper::Request<hyper::body::Incoming>,
) -> Result<hyper::Response<Full<Bytes>>, Infallible> {
    Ok(hyper::Response::new(Full::new(Bytes::from_static(
        &[b'x'; 64],
    ))))
}

/// hyper (HTTP/1.1) or the tokio-util echo, on a `CompatStream` per
/// connection, through a `BalancedListener` (a reuseport listener per
/// shard, connections kept even across the shards).
fn mailring_server(c: Contender) -> (SocketAddr, Box<dyn FnOnce()>) {
    use mailring_transports::compat::{CompatStream, ShardTimer};
    let rt = mailring_bench::runtime_from_env(2, "HTTP_MAILRING_SPIN_US");
    // A reuseport listener per shard, connections kept even across them.
    let listener = mailring_transports::BalancedListener::bind(
        rt.handle(),
        "127.0.0.1:0".parse().unwrap(),
        move |s, _peer| async move {
            let _ = s.set_nodelay(true);
            let io = CompatStream::tcp(s);
            if c == Contender::MailringHyper {
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(ShardTimer)
                    .serve_connection(io, hyper::service::service_fn(hello))
                    .await;
            } else {
                mailring_bench::codec_echo(io).await;
            }
        },
    )
    .unwrap();
    let addr = listener.local_addr();
    (
        addr,
        Box::new(move || {
            drop(listener);
            rt.shutdown();
        }),
    )
}

struct Echo;

impl mailring_transports::Session for Echo {
    type Codec = mailring_transports::codec::LengthDelimited;
    type Key = ();

    async fn on_frame(&mut self, frame: Bytes, cx: &mut mailring_transports::SessionCtx<Self>) {
        cx.send_frame(frame);
    }
}

fn native_server() -> (SocketAddr, Box<dyn FnOnce()>) {
    let rt = mailring_bench::runtime_from_env(2, "HTTP_MAILRING_SPIN_US");
    let server = mailring_transports::Server::builder(
        mailring_transports::codec::LengthDelimited::new(),
        |_| Echo,
    )
    .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
    .unwrap();
    let addr = server.local_addr();
    (
        addr,
        Box::new(move || {
            rt.block_on(server.shutdown());
            rt.shutdown();
        }),
    )
}

fn tokio_server(c: Contender) -> (SocketAddr, Box<dyn FnOnce()>) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let _ = s.set_nodelay(true);
            tokio::spawn(async move {
                if c == Contender::TokioHyper {
                    // The same settings as mailring's: a timer, so hyper
                    // keeps its header read timeout on both sides.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .timer(hyper_util::rt::TokioTimer::new())
                        .serve_connection(
                            hyper_util::rt::TokioIo::new(s),
                            hyper::service::service_fn(hello),
                        )
                        .await;
                } else {
                    mailring_bench::codec_echo(s).await;
                }
            });
        }
    });
    (
        addr,
        Box::new(move || rt.shutdown_timeout(Duration::from_secs(1))),
    )
}

// ------------------------------------------------------- load generator

/// Prints `wall_ns p50_ns p99_ns requests`.
fn client(w: Workload, addr: SocketAddr) {
    let threads = std::env::var("HTTP_CLIENT_THREADS")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(1)
        .clamp(1, ECHO_CONNS);
    let conns = match w {
        Workload::Http1 => HTTP_CONNS,
        Workload::Echo => ECHO_CONNS,
    };
    let (wall, parts) = mailring_bench::split_over_threads(threads, move |barrier| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let local = tokio::task::LocalSet::new();
        local.block_on(&rt, load(w, addr, conns / threads, barrier))
    });
    let mut lat: Vec<Duration> = parts.into_iter().flatten().collect();
    lat.sort_unstable();
    let q = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize].as_nanos();
    println!("{} {} {} {}", wall.as_nanos(), q(0.5), q(0.99), lat.len());
}

async fn load(
    w: Workload,
    addr: SocketAddr,
    conns: usize,
    barrier: &std::sync::Barrier,
) -> (Instant, Instant, Vec<Duration>) {
    match w {
        Workload::Http1 => {
            let mut senders = Vec::new();
            for _ in 0..conns {
                let s = tokio::net::TcpStream::connect(addr).await.unwrap();
                s.set_nodelay(true).unwrap();
                let (sender, conn) =
                    hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(s))
                        .await
                        .unwrap();
                tokio::task::spawn_local(conn);
                senders.push(sender);
            }
            barrier.wait();
            let start = Instant::now();
            let tasks: Vec<_> = senders
                .into_iter()
                .map(|mut sender| {
                    tokio::task::spawn_local(async move {
                        let mut lat = Vec::with_capacity(HTTP_REQUESTS);
                        for _ in 0..HTTP_REQUESTS {
                            let t = Instant::now();
                            let req = hyper::Request::get("/")
                                .header("host", "localhost")
                                .body(Full::new(Bytes::new()))
                                .unwrap();
                            let res = sender.send_request(req).await.unwrap();
                            let body = res.into_body().collect().await.unwrap().to_bytes();
                            assert_eq!(body.len(), 64);
                            lat.push(t.elapsed());
                        }
                        lat
                    })
                })
                .collect();
            let mut lat = Vec::new();
            for t in tasks {
                lat.extend(t.await.unwrap());
            }
            (start, Instant::now(), lat)
        }
        Workload::Echo => {
            let mut streams = Vec::new();
            for _ in 0..conns {
                let s = tokio::net::TcpStream::connect(addr).await.unwrap();
                s.set_nodelay(true).unwrap();
                streams.push(s);
            }
            barrier.wait();
            let start = Instant::now();
            let mut one = 64u32.to_be_bytes().to_vec();
            one.extend_from_slice(&[7u8; 64]);
            let tasks: Vec<_> = streams
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
            (start, Instant::now(), lat)
        }
    }
}
