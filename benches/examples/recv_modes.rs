//! What a multishot receive saves a request/response server over one
//! receive per request: a one-shard `PING`/`+PONG` server driven by
//! `redis-benchmark -t ping_inline` (inline `PING\r\n`, one request in
//! flight per connection), each connection served by one task that either
//! submits a `recv` per read or keeps one multishot receive armed over a
//! provided-buffer ring. Modes alternate; server CPU per request comes from
//! the process's own CPU time.
//!
//! ```text
//! cargo run --release -p mailring-bench --example recv_modes -- [pairs] [clients] [requests]
//! ```
//!
//! Needs `redis-benchmark` on the PATH (pinned to CPU 1 with `taskset`
//! when it is installed). Loopback only.

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use mailring::buf::BufRing;
use mailring::net::{TcpListener, TcpStream};

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    RecvPerRead,
    Multishot,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::RecvPerRead => "one recv per read",
            Mode::Multishot => "multishot recv, provided buffers",
        }
    }
}

/// Replies `+PONG` to each complete `PING\r\n` in `pending` (keeping a cut
/// one for the next read) and sends them in one write.
async fn answer(stream: &TcpStream, pending: &mut Vec<u8>) -> bool {
    let mut replies = 0;
    let mut at = 0;
    while let Some(end) = pending[at..].windows(2).position(|w| w == b"\r\n") {
        at += end + 2;
        replies += 1;
    }
    pending.drain(..at);
    if replies == 0 {
        return true;
    }
    let out = b"+PONG\r\n".repeat(replies);
    let (r, _) = stream.send_all(out).await;
    r.is_ok()
}

async fn serve(stream: TcpStream, mode: Mode, ring: Option<BufRing>) {
    let _ = stream.set_nodelay(true);
    let mut pending = Vec::with_capacity(4096);
    match mode {
        Mode::RecvPerRead => {
            let mut buf = vec![0u8; 4096].into_boxed_slice();
            loop {
                let (r, back) = stream.recv(buf).await;
                buf = back;
                match r {
                    Ok(0) | Err(_) => return,
                    Ok(n) => pending.extend_from_slice(&buf[..n]),
                }
                if !answer(&stream, &mut pending).await {
                    return;
                }
            }
        }
        Mode::Multishot => {
            let ring = ring.expect("a buffer ring");
            let mut recv = stream.recv_multishot(&ring);
            while let Some(Ok(chunk)) = recv.next().await {
                pending.extend_from_slice(&chunk);
                drop(chunk);
                if !answer(&stream, &mut pending).await {
                    return;
                }
            }
        }
    }
}

/// One run: the server up, `redis-benchmark` against it; (req/s, server
/// CPU per request).
fn run(mode: Mode, clients: usize, requests: usize) -> (f64, Duration) {
    let rt = mailring::Runtime::builder()
        .shards(1)
        .build()
        .expect("mailring runtime");
    let (tx, rx) = std::sync::mpsc::channel::<SocketAddr>();
    let server = rt
        .handle()
        .spawn_local_on(mailring::ShardId::new(0), move || async move {
            let listener =
                TcpListener::bind("127.0.0.1:0".parse().expect("address")).expect("bind");
            tx.send(listener.local_addr()).expect("address out");
            let ring = match mode {
                Mode::Multishot => Some(BufRing::new(512, 4096).expect("buffer ring")),
                Mode::RecvPerRead => None,
            };
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                mailring::spawn_local(serve(stream, mode, ring.clone())).detach();
            }
        });
    let addr = rx.recv().expect("server address");
    let cpu0 = mailring_bench::process_cpu();
    let start = Instant::now();
    let taskset = Command::new("taskset").arg("--version").output().is_ok();
    let mut cmd = if taskset {
        let mut c = Command::new("taskset");
        c.args(["-c", "1", "redis-benchmark"]);
        c
    } else {
        Command::new("redis-benchmark")
    };
    let out = cmd
        .args(["-h", "127.0.0.1", "-p", &addr.port().to_string()])
        .args(["-c", &clients.to_string(), "-n", &requests.to_string()])
        .args(["-t", "ping_inline", "-q"])
        .output()
        .expect("redis-benchmark");
    let wall = start.elapsed();
    let cpu = mailring_bench::process_cpu() - cpu0;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("requests per second"),
        "redis-benchmark: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    server.abort();
    let _ = rt.shutdown();
    (requests as f64 / wall.as_secs_f64(), cpu / requests as u32)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let pairs: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    let clients: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(50);
    let requests: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(300_000);
    let modes = [Mode::RecvPerRead, Mode::Multishot];
    let mut rates = vec![Vec::new(); modes.len()];
    let mut cpus = vec![Vec::new(); modes.len()];
    let times = mailring_bench::alternating_pairs(pairs, modes.len(), |i| {
        let (rate, cpu) = run(modes[i], clients, requests);
        rates[i].push(rate);
        cpus[i].push(cpu.as_nanos() as f64);
        rate
    });
    println!(
        "PING_INLINE, {clients} clients, {requests} requests, {pairs} alternating pairs, 1 shard"
    );
    println!(
        "| mode | median req/s | server CPU/req | rate vs one recv per read (median [q1, q3]) |"
    );
    println!("| --- | --- | --- | --- |");
    for (i, mode) in modes.iter().enumerate() {
        let mut ratios: Vec<f64> = times[i].iter().zip(&times[0]).map(|(t, b)| t / b).collect();
        let (_, rate, _) = mailring_bench::quartiles(&mut rates[i].clone());
        let (_, cpu, _) = mailring_bench::quartiles(&mut cpus[i].clone());
        let (q1, m, q3) = mailring_bench::quartiles(&mut ratios);
        println!(
            "| {} | {rate:.0} | {:.2} µs | {m:.2} [{q1:.2}, {q3:.2}] |",
            mode.name(),
            cpu / 1000.0
        );
    }
}
