//! The seed's `fs_net_microservice_4k_read_then_256b_reply_qd1` in
//! alternating pairs: each iteration reads 1,024 blocks of 4 KiB with
//! `pread` on the bench thread, then asks the runtime's driver task for
//! 1,024 round trips of 256 bytes, one at a time, to a blocking echo thread
//! (the criterion bench `seed_net` runs the same shape, contenders one after
//! another).
//!
//! ```text
//! cargo run --release -p mailring-bench --example qd1_pairs -- [pairs] [iterations]
//! ```
//!
//! Contenders: mailring with its default idle policy, mailring with
//! `IdlePolicy::Poll` (shards never block), spargio 0.5.13 (its default:
//! shards that never block), Tokio (2 workers). Each pair runs every
//! contender once, the order rotating from pair to pair; a contender's figure
//! is its median wall time per round (one read and one round trip), and its
//! ratio is the pair's spargio figure over its own (> 1: faster than spargio).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::FileExt;
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use futures::channel::mpsc;
use futures::StreamExt;

const ROUNDS: usize = 1_024;
const READ_BYTES: usize = 4096;
const REPLY_BYTES: usize = 256;
const FILE_BLOCKS: usize = 128;

#[derive(Clone, Copy, PartialEq)]
enum Contender {
    Mailring,
    MailringPoll,
    Spargio,
    Tokio,
}

const CONTENDERS: [Contender; 4] = [
    Contender::Mailring,
    Contender::MailringPoll,
    Contender::Spargio,
    Contender::Tokio,
];

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Contender::Mailring => "mailring (default idle policy)",
            Contender::MailringPoll => "mailring (IdlePolicy::Poll)",
            Contender::Spargio => "spargio 0.5.13",
            Contender::Tokio => "tokio",
        }
    }
}

/// A blocking echo thread for one connection (the seed's echo server).
fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address");
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        s.set_nodelay(true).expect("nodelay");
        let mut buf = [0u8; 64 * 1024];
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 || s.write_all(&buf[..n]).is_err() {
                break;
            }
        }
    });
    addr
}

/// The bench thread's reads of one iteration.
fn read_blocks(file: &std::fs::File) -> u64 {
    let mut buf = vec![0u8; READ_BYTES];
    let mut sum = 0u64;
    for i in 0..ROUNDS {
        let offset = ((i % FILE_BLOCKS) * READ_BYTES) as u64;
        let n = file.read_at(&mut buf, offset).expect("pread");
        assert_eq!(n, READ_BYTES);
        sum = sum.wrapping_add(u64::from(buf[0]));
    }
    sum
}

type Cmd = std_mpsc::Sender<u64>;

/// Runs `iterations` (after one untimed) and returns the wall time per round.
fn measure(file: &std::fs::File, cmds: &mpsc::UnboundedSender<Cmd>, iterations: usize) -> f64 {
    let once = || {
        let sum = read_blocks(file);
        let (tx, rx) = std_mpsc::channel();
        cmds.unbounded_send(tx).expect("driver gone");
        sum.wrapping_add(rx.recv().expect("driver reply"))
    };
    std::hint::black_box(once());
    let start = Instant::now();
    for _ in 0..iterations {
        std::hint::black_box(once());
    }
    start.elapsed().as_nanos() as f64 / (iterations * ROUNDS) as f64
}

fn run(c: Contender, file: &std::fs::File, iterations: usize) -> f64 {
    let addr = echo_server();
    let (cmds, mut rx) = mpsc::unbounded::<Cmd>();
    // Joins the driver (it ends once `cmds` is dropped) and stops the runtime.
    let stop: Box<dyn FnOnce()> = match c {
        Contender::Mailring | Contender::MailringPoll => {
            let mut builder = mailring::Runtime::builder().shards(2);
            if c == Contender::MailringPoll {
                builder = builder.idle_policy(mailring::IdlePolicy::Poll);
            }
            let rt = builder.build().expect("mailring runtime");
            let driver =
                rt.handle()
                    .spawn_local_on(mailring::ShardId::new(1), move || async move {
                        let s = mailring::net::TcpStream::connect(addr)
                            .await
                            .expect("connect");
                        s.set_nodelay(true).expect("nodelay");
                        let mut out = vec![0u8; REPLY_BYTES];
                        let mut inb = vec![0u8; REPLY_BYTES].into_boxed_slice();
                        while let Some(reply) = rx.next().await {
                            let mut sum = 0u64;
                            for i in 0..ROUNDS {
                                out[0] = i as u8;
                                let (r, back) = s.send_all(out).await;
                                r.expect("send");
                                out = back;
                                let (r, back) = s.recv(inb).await;
                                let mut got = r.expect("recv");
                                assert!(got > 0, "echo closed");
                                sum = sum.wrapping_add(u64::from(back[0]));
                                inb = back;
                                // A short read's rest goes into a buffer of
                                // exactly the missing size (as seed_net does).
                                while got < REPLY_BYTES {
                                    let rest = vec![0u8; REPLY_BYTES - got].into_boxed_slice();
                                    let (r, _) = s.recv(rest).await;
                                    let n = r.expect("recv");
                                    assert!(n > 0, "echo closed");
                                    got += n;
                                }
                            }
                            let _ = reply.send(sum);
                        }
                    });
            Box::new(move || {
                let _ = futures::executor::block_on(driver);
                let _ = rt.shutdown();
            })
        }
        Contender::Spargio => {
            let base = spargio::Runtime::builder()
                .backend(spargio::BackendKind::IoUring)
                .shards(2);
            let rt = base
                .clone()
                .io_uring_throughput_mode(None)
                .build()
                .or_else(|_| base.build())
                .expect("spargio runtime");
            let handle = rt.handle();
            let h = handle.clone();
            let driver = handle
                .spawn_with_placement(spargio::TaskPlacement::StealablePreferred(1), async move {
                    let s = spargio::net::TcpStream::connect(h, addr)
                        .await
                        .expect("connect");
                    let mut out = vec![0u8; REPLY_BYTES];
                    let mut inb = vec![0u8; REPLY_BYTES];
                    while let Some(reply) = rx.next().await {
                        let mut sum = 0u64;
                        for i in 0..ROUNDS {
                            out[0] = i as u8;
                            out = s.write_all_owned(out).await.expect("write");
                            inb = s.read_exact_owned(inb).await.expect("read");
                            sum = sum.wrapping_add(u64::from(inb[0]));
                        }
                        let _ = reply.send(sum);
                    }
                })
                .expect("spawn");
            Box::new(move || {
                let _ = futures::executor::block_on(driver);
                drop(rt);
            })
        }
        Contender::Tokio => {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("tokio runtime");
            let driver = rt.spawn(async move {
                let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
                s.set_nodelay(true).expect("nodelay");
                let mut out = vec![0u8; REPLY_BYTES];
                let mut inb = vec![0u8; REPLY_BYTES];
                while let Some(reply) = rx.next().await {
                    let mut sum = 0u64;
                    for i in 0..ROUNDS {
                        out[0] = i as u8;
                        s.write_all(&out).await.expect("write");
                        s.read_exact(&mut inb).await.expect("read");
                        sum = sum.wrapping_add(u64::from(inb[0]));
                    }
                    let _ = reply.send(sum);
                }
            });
            Box::new(move || {
                let _ = rt.block_on(driver);
                rt.shutdown_timeout(Duration::from_secs(1));
            })
        }
    };
    let ns = measure(file, &cmds, iterations);
    drop(cmds);
    stop();
    ns
}

fn main() {
    let mut args = std::env::args().skip(1);
    let pairs: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10);
    let iterations: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10);
    let path = std::env::temp_dir().join(format!("mailring-qd1-pairs-{}.dat", std::process::id()));
    mailring_bench::write_block_fixture(&path, READ_BYTES, FILE_BLOCKS);
    let file = std::fs::File::open(&path).expect("open fixture");
    let times = mailring_bench::alternating_pairs(pairs, CONTENDERS.len(), |i| {
        run(CONTENDERS[i], &file, iterations)
    });
    let _ = std::fs::remove_file(&path);
    let spargio = CONTENDERS
        .iter()
        .position(|&c| c == Contender::Spargio)
        .expect("spargio contender");
    println!(
        "fs_net qd1 shape: {pairs} alternating pairs of {iterations} iterations ({ROUNDS} reads of {READ_BYTES} B + {ROUNDS} round trips of {REPLY_BYTES} B each)"
    );
    println!("| contender | median per round | ratio vs spargio (median [q1, q3]) |");
    println!("| --- | --- | --- |");
    for (i, c) in CONTENDERS.iter().enumerate() {
        let mut ratios: Vec<f64> = times[spargio]
            .iter()
            .zip(&times[i])
            .map(|(s, t)| s / t)
            .collect();
        let (_, median, _) = mailring_bench::quartiles(&mut times[i].clone());
        let (q1, m, q3) = mailring_bench::quartiles(&mut ratios);
        println!(
            "| {} | {:.2} µs | {m:.2} [{q1:.2}, {q3:.2}] |",
            c.name(),
            median / 1000.0
        );
    }
}
