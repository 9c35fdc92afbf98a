//! UDP echo: mailring datagram sessions (one per peer) and a bare mailring
//! socket loop against a Tokio `UdpSocket` loop, over loopback, with the
//! load generator in a process of its own.
//!
//! ```text
//! cargo run --release -p mailring-bench --example udp_echo -- [pairs]
//! ```
//!
//! The load: 64 peers (one socket each), each 2,000 round trips of a
//! 64-byte datagram, one in flight per peer (a lost one is sent again after
//! 100 ms, and counted). Servers, 2 threads each:
//! - `mailring sessions`: a `DatagramServer` of per-peer sessions that echo
//!   (key lookup, the session's inbox and task, the reply from its shard),
//!   each shard taking datagrams with one multishot receive;
//! - `mailring sessions, single receives`: the same with 8 single receives
//!   in flight per shard (`DatagramConfig::multishot_receive = false`, the
//!   path of kernels before 6.0);
//! - `mailring socket loop`: one reuseport socket per shard, a task that
//!   receives and sends back;
//! - `tokio`: one reuseport socket per worker (2), a task each that
//!   receives and sends back (the loop a Tokio user writes).
//!
//! Contenders alternate within each pair; server CPU per datagram is the
//! process's CPU time over the run. Within a pair every contender's server
//! has the same port and the load generator's peers the same ports, so the
//! kernel's reuseport hash splits the peers over the two server sockets the
//! same way for each (the split is uneven and changes with the ports: with
//! ports of their own, the contenders of a pair drew different splits and
//! the busier socket's thread decided the ratio). Each pair draws new
//! ports. `UDP_CLIENT_CPUS=LIST` runs the load
//! generator under `taskset -c LIST`, `UDP_CLIENT_THREADS=N` splits it
//! over N threads; `UDP_MAILRING_SPIN_US=N|poll` sets the mailring shards'
//! idle policy; `UDP_ONLY=<name>` runs one contender (for profiling).

use mailring_bench::{median_of as median, quartiles_of as quartiles};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

const PEERS: usize = 64;
const ROUNDS: usize = 2_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Contender {
    Sessions,
    SessionsSingleReceives,
    SocketLoop,
    Tokio,
}

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Contender::Sessions => "mailring sessions",
            Contender::SessionsSingleReceives => "mailring sessions, single receives",
            Contender::SocketLoop => "mailring socket loop",
            Contender::Tokio => "tokio",
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("client") {
        client(
            args[1].parse().expect("address"),
            args[2].parse().expect("the peers' first port"),
        );
        return;
    }
    let pairs: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(5);
    // UDP_ONLY=<name>: run one contender (for profiling).
    let only = std::env::var("UDP_ONLY").ok();
    let contenders: Vec<Contender> = [
        Contender::Sessions,
        Contender::SessionsSingleReceives,
        Contender::SocketLoop,
        Contender::Tokio,
    ]
    .into_iter()
    .filter(|c| only.as_deref().is_none_or(|o| o == c.name()))
    .collect();
    let mut runs_done = 0;
    let mut ports = PairPorts::draw();
    let runs: Vec<Vec<Run>> = mailring_bench::alternating_pairs(pairs, contenders.len(), |i| {
        if runs_done > 0 && runs_done % contenders.len() == 0 {
            ports = PairPorts::draw();
        }
        runs_done += 1;
        serve_once(contenders[i], ports)
    });
    println!(
        "UDP echo: {pairs} alternating pairs, {PEERS} peers x {ROUNDS} round trips of 64 B, 2 server threads, load generator in its own process"
    );
    println!("| contender | median wall | datagrams/s | p50 | p99 | resent | server CPU/datagram | wall ratio vs mailring sessions (median [q1, q3]) |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for (i, c) in contenders.iter().enumerate() {
        let r = &runs[i];
        let wall = median(r.iter().map(|x| x.wall.as_secs_f64()).collect());
        let ratios: Vec<f64> = r
            .iter()
            .zip(&runs[0])
            .map(|(x, m)| x.wall.as_secs_f64() / m.wall.as_secs_f64())
            .collect();
        let (q1, med, q3) = quartiles(ratios);
        let n = (PEERS * ROUNDS) as f64;
        let cpu = median(r.iter().map(|x| x.cpu.as_secs_f64() / n).collect());
        let p50 = median(r.iter().map(|x| x.p50 as f64).collect());
        let p99 = median(r.iter().map(|x| x.p99 as f64).collect());
        let resent: u64 = r.iter().map(|x| x.resent).sum();
        println!(
            "| {} | {:.1} ms | {:.0} | {:.1} µs | {:.1} µs | {resent} | {:.2} µs | {med:.2} [{q1:.2}, {q3:.2}] |",
            c.name(),
            wall * 1e3,
            n / wall,
            p50 / 1e3,
            p99 / 1e3,
            cpu * 1e6,
        );
    }
}

/// One run's figures.
#[derive(Clone, Copy)]
struct Run {
    wall: Duration,
    p50: u64,
    p99: u64,
    resent: u64,
    cpu: Duration,
}

/// The loopback ports of one pair: the servers' and the first of the
/// peers' [`PEERS`] consecutive ones.
#[derive(Clone, Copy, Debug)]
struct PairPorts {
    server: SocketAddr,
    first_peer: u16,
}

impl PairPorts {
    /// A free server port (the kernel's pick) and [`PEERS`] free ports in
    /// a row below the ephemeral range, from a start that changes each
    /// time.
    fn draw() -> PairPorts {
        let server = std::net::UdpSocket::bind("127.0.0.1:0")
            .and_then(|s| s.local_addr())
            .expect("a free loopback UDP port");
        let mut seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        for _ in 0..100 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let first = 20_000 + (seed % 10_000) as u16;
            let held: Result<Vec<_>, _> = (0..PEERS as u16)
                .map(|i| std::net::UdpSocket::bind(("127.0.0.1", first + i)))
                .collect();
            let clear_of_server = server.port().wrapping_sub(first) >= PEERS as u16;
            if held.is_ok() && clear_of_server {
                return PairPorts {
                    server,
                    first_peer: first,
                };
            }
        }
        panic!("no {PEERS} free loopback UDP ports in a row in 20000..30064");
    }
}

fn serve_once(c: Contender, ports: PairPorts) -> Run {
    // The last server of the pair has let the port go.
    drop(std::net::UdpSocket::bind(ports.server).expect("the pair's server port is free"));
    let (addr, stop): (SocketAddr, Box<dyn FnOnce()>) = match c {
        Contender::Sessions => sessions_server(true, ports.server),
        Contender::SessionsSingleReceives => sessions_server(false, ports.server),
        Contender::SocketLoop => mailring_loop_server(ports.server),
        Contender::Tokio => tokio_server(ports.server),
    };
    let command = mailring_bench::load_generator(
        "UDP_CLIENT_CPUS",
        ["client", &addr.to_string(), &ports.first_peer.to_string()],
    );
    let run = mailring_bench::drive(command, c.name(), stop);
    if std::env::var("UDP_PEER_TIMES").is_ok() {
        eprintln!("== {}\n{}", c.name(), run.stderr);
    }
    let (f, cpu) = (run.figures, run.server_cpu);
    Run {
        wall: Duration::from_nanos(f[0]),
        p50: f[1],
        p99: f[2],
        resent: f[3],
        cpu,
    }
}

struct Echo;

impl mailring_transports::datagram::DatagramSession for Echo {
    type Key = SocketAddr;

    fn key(_datagram: &[u8], peer: SocketAddr) -> Option<SocketAddr> {
        Some(peer)
    }

    async fn on_datagram(
        &mut self,
        datagram: Bytes,
        cx: &mut mailring_transports::datagram::DatagramCtx,
    ) {
        cx.reply(datagram);
    }
}

/// A 2-shard runtime; `UDP_MAILRING_SPIN_US=N` sets the idle spin (0:
/// block at once, `poll`: never block).
fn runtime() -> mailring::Runtime {
    mailring_bench::runtime_from_env(2, "UDP_MAILRING_SPIN_US")
}

/// Per-peer sessions; `multishot`: one multishot receive per shard, else
/// single receives in flight (the path of kernels before 6.0).
fn sessions_server(multishot: bool, at: SocketAddr) -> (SocketAddr, Box<dyn FnOnce()>) {
    let rt = runtime();
    let mut config = mailring_transports::datagram::DatagramConfig::default();
    config.multishot_receive = multishot;
    let server = mailring_transports::datagram::DatagramServer::builder(|_: &SocketAddr| Echo)
        .config(config)
        .place_where_received()
        .bind(rt.handle(), at)
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

/// `n` std UDP sockets on `addr` (`SO_REUSEPORT`), in the group's order.
fn reuseport_sockets(n: usize, addr: SocketAddr) -> Vec<std::net::UdpSocket> {
    let mut out = Vec::new();
    for _ in 0..n {
        let s = socket2::Socket::new(
            socket2::Domain::IPV4,
            socket2::Type::DGRAM,
            Some(socket2::Protocol::UDP),
        )
        .unwrap();
        s.set_reuse_port(true).unwrap();
        s.bind(&addr.into()).unwrap();
        out.push(s.into());
    }
    out
}

fn mailring_loop_server(at: SocketAddr) -> (SocketAddr, Box<dyn FnOnce()>) {
    let rt = runtime();
    let sockets = reuseport_sockets(2, at);
    let addr = sockets[0].local_addr().unwrap();
    let mut tasks = Vec::new();
    for (i, s) in sockets.into_iter().enumerate() {
        tasks.push(
            rt.handle()
                .spawn_local_on(mailring::ShardId::new(i), move || async move {
                    let socket = mailring::net::UdpSocket::from_std(s).unwrap();
                    let mut buf = BytesMut::with_capacity(2048);
                    loop {
                        let (res, b) = socket.recv_from(buf).await;
                        let Ok((_, from)) = res else { return };
                        let (_, mut b) = socket.send_to(b, from).await;
                        b.clear();
                        buf = b;
                    }
                }),
        );
    }
    (
        addr,
        Box::new(move || {
            for t in tasks {
                t.abort();
            }
            rt.shutdown();
        }),
    )
}

fn tokio_server(at: SocketAddr) -> (SocketAddr, Box<dyn FnOnce()>) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let sockets = reuseport_sockets(2, at);
    let addr = sockets[0].local_addr().unwrap();
    for s in sockets {
        s.set_nonblocking(true).unwrap();
        rt.spawn(async move {
            let socket = tokio::net::UdpSocket::from_std(s).unwrap();
            let mut buf = vec![0u8; 2048];
            loop {
                let Ok((n, from)) = socket.recv_from(&mut buf).await else {
                    return;
                };
                let _ = socket.send_to(&buf[..n], from).await;
            }
        });
    }
    (
        addr,
        Box::new(move || rt.shutdown_timeout(Duration::from_secs(1))),
    )
}

// ------------------------------------------------------- load generator

/// Prints `wall_ns p50_ns p99_ns resent`. The peers are bound to the
/// loopback ports from `first_port` on.
fn client(addr: SocketAddr, first_port: u16) {
    // UDP_CLIENT_THREADS=N: the peers split over N threads, each a
    // current-thread runtime, started together.
    let threads = std::env::var("UDP_CLIENT_THREADS")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(1)
        .clamp(1, PEERS);
    let next_port = std::sync::atomic::AtomicU16::new(first_port);
    let (wall, parts) = mailring_bench::split_over_threads(threads, move |barrier| {
        let n = PEERS / threads;
        let first = next_port.fetch_add(n as u16, std::sync::atomic::Ordering::Relaxed);
        let (start, end, lat, resent) = peers(addr, first, n, barrier);
        (start, end, (lat, resent))
    });
    let mut lat: Vec<Duration> = Vec::new();
    let mut resent = 0;
    for (l, r) in parts {
        lat.extend(l);
        resent += r;
    }
    lat.sort_unstable();
    let q = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize].as_nanos();
    println!("{} {} {} {resent}", wall.as_nanos(), q(0.5), q(0.99));
}

/// `n` peers on one current-thread runtime; (start, end, latencies,
/// datagrams sent again).
fn peers(
    addr: SocketAddr,
    first_port: u16,
    n: usize,
    barrier: &std::sync::Barrier,
) -> (Instant, Instant, Vec<Duration>, u64) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let mut sockets = Vec::new();
        for i in 0..n as u16 {
            let s = tokio::net::UdpSocket::bind(("127.0.0.1", first_port + i))
                .await
                .expect("a peer's port (free when the pair was drawn)");
            s.connect(addr).await.unwrap();
            sockets.push(s);
        }
        barrier.wait();
        let start = Instant::now();
        let tasks: Vec<_> = sockets
            .into_iter()
            .map(|s| {
                tokio::task::spawn_local(async move {
                    let payload = [3u8; 64];
                    let mut buf = [0u8; 256];
                    let mut lat = Vec::with_capacity(ROUNDS);
                    let mut resent = 0u64;
                    let began = Instant::now();
                    for _ in 0..ROUNDS {
                        let t = Instant::now();
                        loop {
                            s.send(&payload).await.unwrap();
                            match tokio::time::timeout(Duration::from_millis(100), s.recv(&mut buf))
                                .await
                            {
                                Ok(Ok(_)) => break,
                                _ => resent += 1,
                            }
                        }
                        lat.push(t.elapsed());
                    }
                    if std::env::var("UDP_PEER_TIMES").is_ok() {
                        eprintln!("peer {:?}: {:?}", s.local_addr().unwrap(), began.elapsed());
                    }
                    (lat, resent)
                })
            })
            .collect();
        let mut lat = Vec::new();
        let mut resent = 0;
        for t in tasks {
            let (l, r) = t.await.unwrap();
            lat.extend(l);
            resent += r;
        }
        (start, Instant::now(), lat, resent)
    })
}
