//! Peer I/O benchmarks: compio (io_uring driver, thread-per-core: one runtime
//! per thread) and spargio 0.5.13 (2 shards, `uring-native`), mirroring the
//! mailring `io` bench (same group names, batch sizes, offsets and `[cpu]` lines).
//!
//! Every criterion iteration is one batch; the `[cpu]` lines print per-op wall
//! and process CPU (getrusage RUSAGE_SELF user+sys, all threads) and cores busy
//! (= CPU / wall). Each runtime is built once per bench function, outside the
//! timed region, and torn down at its end, so spargio's spinning shards never
//! overlap another runtime's measurement.
//!
//! Needs (Cargo.toml): compio = { version = "0.19", features = ["fs", "net",
//! "runtime", "io-uring"] }, spargio = { version = "=0.5.13", features =
//! ["uring-native"] }, io-uring = "0.7" (spargio fdatasync SQE), futures, libc;
//! dev: criterion = "0.5".
//!
//! Knob: PEER_SPARGIO_IDLE_SLEEP_US=N makes spargio shards sleep N us when idle
//! (`IdleStrategy::Sleep`) instead of the default `yield_now` busy loop.

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use compio::io::{
    AsyncRead, AsyncReadAt, AsyncReadExt, AsyncWrite, AsyncWriteAtExt, AsyncWriteExt,
};
use compio::BufResult;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use futures::executor::block_on;

use mailring_bench::{
    data_file, offset, Meter, BLOCK, ECHO_ROUNDS, ECHO_SIZE, FSYNC_WRITES, QD, READS,
};

fn set_nodelay_fd(fd: RawFd) {
    let one: libc::c_int = 1;
    // SAFETY: valid socket fd, pointer/len describe a live c_int.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "setsockopt(TCP_NODELAY)");
}

// ---------------------------------------------------------------- runtimes

/// One compio runtime = one thread, one io_uring. Panics if compio picked the
/// polling driver (it cannot here: only the `io-uring` driver feature is on).
fn compio_rt() -> compio::runtime::Runtime {
    let rt = compio::runtime::Runtime::new().expect("compio runtime");
    assert!(
        matches!(rt.driver_type(), compio::driver::DriverType::IoUring),
        "compio is not on io_uring"
    );
    rt
}

fn spargio_rt() -> spargio::Runtime {
    let mut b = spargio::Runtime::builder().shards(2);
    if let Some(us) = std::env::var("PEER_SPARGIO_IDLE_SLEEP_US")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        b = b.idle_strategy(spargio::IdleStrategy::Sleep(Duration::from_micros(us)));
    }
    let rt = b.build().expect("spargio runtime (needs io_uring)");
    assert!(matches!(rt.backend(), spargio::BackendKind::IoUring));
    rt
}

fn spargio_shutdown(mut rt: spargio::Runtime) {
    block_on(rt.shutdown());
}

/// fdatasync through spargio's raw-SQE escape hatch (`spargio::fs::File::fsync`
/// is a full fsync; spargio 0.5.13 has no datasync API).
async fn spargio_fdatasync(native: &spargio::UringNativeAny, fd: RawFd) -> std::io::Result<()> {
    // SAFETY: the fd stays open (the File outlives this await); the SQE has no
    // buffers.
    unsafe {
        native
            .submit_unsafe(
                (),
                move |_| {
                    Ok(io_uring::opcode::Fsync::new(io_uring::types::Fd(fd))
                        .flags(io_uring::types::FsyncFlags::DATASYNC)
                        .build())
                },
                |_, cqe| {
                    if cqe.result < 0 {
                        Err(std::io::Error::from_raw_os_error(-cqe.result))
                    } else {
                        Ok(())
                    }
                },
            )
            .await
    }
}

// ---------------------------------------------------------------- fs_read_rtt_4k

fn read_rtt(c: &mut Criterion) {
    let path = data_file();
    let mut g = c.benchmark_group("fs_read_rtt_4k");
    g.throughput(Throughput::Elements(READS));
    {
        let rt = compio_rt();
        let mut m = Meter::default();
        g.bench_function("compio", |b| {
            b.iter_custom(|iters| {
                let p = path.clone();
                m.measure(iters * READS, || {
                    rt.block_on(async move {
                        let file = compio::fs::File::open(&p).await.unwrap();
                        let mut buf = Vec::with_capacity(BLOCK);
                        for i in 0..iters * READS {
                            buf.clear();
                            let BufResult(n, back) = file.read_at(buf, offset(i)).await;
                            assert_eq!(n.unwrap(), BLOCK);
                            buf = back;
                        }
                        file.close().await.unwrap();
                    })
                })
            })
        });
        m.report("fs_read_rtt_4k/compio");
        drop(rt);
    }
    {
        let rt = spargio_rt();
        let h = rt.handle();
        let mut m = Meter::default();
        g.bench_function("spargio", |b| {
            b.iter_custom(|iters| {
                let p = path.clone();
                let h2 = h.clone();
                m.measure(iters * READS, || {
                    let task = h
                        .spawn_pinned(0, async move {
                            let file = spargio::fs::File::open(h2, &p).await.unwrap();
                            let mut buf = vec![0u8; BLOCK];
                            for i in 0..iters * READS {
                                let (n, back) = file.read_at_into(offset(i), buf).await.unwrap();
                                assert_eq!(n, BLOCK);
                                buf = back;
                            }
                        })
                        .unwrap();
                    block_on(task).unwrap();
                })
            })
        });
        m.report("fs_read_rtt_4k/spargio");
        spargio_shutdown(rt);
    }
    g.finish();
}

// ---------------------------------------------------------------- fs_read_throughput_4k_qd32

fn read_qd32(c: &mut Criterion) {
    let path = data_file();
    let mut g = c.benchmark_group("fs_read_throughput_4k_qd32");
    g.throughput(Throughput::Bytes(READS * BLOCK as u64));
    {
        // 32 tasks on one compio runtime (one ring, one thread).
        let rt = compio_rt();
        let mut m = Meter::default();
        g.bench_function("compio", |b| {
            b.iter_custom(|iters| {
                let p = path.clone();
                m.measure(iters * READS, || {
                    rt.block_on(async move {
                        let file = compio::fs::File::open(&p).await.unwrap();
                        let per = iters * READS / QD;
                        let workers: Vec<_> = (0..QD)
                            .map(|w| {
                                let file = file.clone(); // compio File is Clone (shared fd)
                                compio::runtime::spawn(async move {
                                    let mut buf = Vec::with_capacity(BLOCK);
                                    for i in 0..per {
                                        buf.clear();
                                        let BufResult(n, back) =
                                            file.read_at(buf, offset(w * per + i)).await;
                                        assert_eq!(n.unwrap(), BLOCK);
                                        buf = back;
                                    }
                                })
                            })
                            .collect();
                        for w in workers {
                            w.await.unwrap();
                        }
                        file.close().await.unwrap();
                    })
                })
            })
        });
        m.report("fs_read_throughput_4k_qd32/compio");
        drop(rt);
    }
    {
        // 32 tasks spread over the 2 shards (w % 2). Note spargio routes each
        // native op by a per-fd affinity lease, so most reads of the shared fd
        // land on one ring regardless of which shard the task runs on.
        let rt = spargio_rt();
        let h = rt.handle();
        let mut m = Meter::default();
        g.bench_function("spargio", |b| {
            b.iter_custom(|iters| {
                let p = path.clone();
                let h2 = h.clone();
                m.measure(iters * READS, || {
                    let task = h
                        .spawn_pinned(0, async move {
                            let file = spargio::fs::File::open(h2.clone(), &p).await.unwrap();
                            let per = iters * READS / QD;
                            let workers: Vec<_> = (0..QD)
                                .map(|w| {
                                    let file = file.clone();
                                    h2.spawn_pinned((w % 2) as spargio::ShardId, async move {
                                        let mut buf = vec![0u8; BLOCK];
                                        for i in 0..per {
                                            let (n, back) = file
                                                .read_at_into(offset(w * per + i), buf)
                                                .await
                                                .unwrap();
                                            assert_eq!(n, BLOCK);
                                            buf = back;
                                        }
                                    })
                                    .unwrap()
                                })
                                .collect();
                            for w in workers {
                                w.await.unwrap();
                            }
                        })
                        .unwrap();
                    block_on(task).unwrap();
                })
            })
        });
        m.report("fs_read_throughput_4k_qd32/spargio");
        spargio_shutdown(rt);
    }
    g.finish();
}

// ---------------------------------------------------------------- fs_write_fsync_4k

fn write_fsync(c: &mut Criterion) {
    let mut g = c.benchmark_group("fs_write_fsync_4k");
    g.throughput(Throughput::Elements(FSYNC_WRITES));
    let dir = std::env::temp_dir();
    {
        let rt = compio_rt();
        let mut m = Meter::default();
        let path = dir.join("mailring-bench-append-compio.bin");
        g.bench_function("compio", |b| {
            b.iter_custom(|iters| {
                let p = path.clone();
                m.measure(iters * FSYNC_WRITES, || {
                    rt.block_on(async move {
                        let mut file = compio::fs::File::create(&p).await.unwrap();
                        let mut buf = vec![7u8; BLOCK];
                        for i in 0..iters * FSYNC_WRITES {
                            let BufResult(r, back) = file.write_all_at(buf, i * BLOCK as u64).await;
                            r.unwrap();
                            buf = back;
                            file.sync_data().await.unwrap(); // IORING_FSYNC_DATASYNC
                        }
                        file.close().await.unwrap();
                    })
                })
            })
        });
        m.report("fs_write_fsync_4k/compio");
        drop(rt);
        let _ = std::fs::remove_file(&path);
    }
    // spargio: fdatasync via raw SQE (comparable), and its public full-fsync API.
    for (id, datasync) in [("spargio", true), ("spargio_fullfsync", false)] {
        let rt = spargio_rt();
        let h = rt.handle();
        let mut m = Meter::default();
        let path = dir.join(format!("mailring-bench-append-{id}.bin"));
        g.bench_function(id, |b| {
            b.iter_custom(|iters| {
                let p = path.clone();
                let h2 = h.clone();
                m.measure(iters * FSYNC_WRITES, || {
                    let task = h
                        .spawn_pinned(0, async move {
                            let native = h2.uring_native_unbound().unwrap();
                            let file = spargio::fs::File::create(h2, &p).await.unwrap();
                            let buf = vec![7u8; BLOCK];
                            for i in 0..iters * FSYNC_WRITES {
                                // write_at copies `buf` into an owned Vec per call.
                                file.write_all_at(i * BLOCK as u64, &buf).await.unwrap();
                                if datasync {
                                    spargio_fdatasync(&native, file.as_raw_fd()).await.unwrap();
                                } else {
                                    file.fsync().await.unwrap();
                                }
                            }
                        })
                        .unwrap();
                    block_on(task).unwrap();
                })
            })
        });
        m.report(&format!("fs_write_fsync_4k/{id}"));
        spargio_shutdown(rt);
        let _ = std::fs::remove_file(&path);
    }
    g.finish();
}

// ---------------------------------------------------------------- net_echo_rtt_256b

async fn compio_echo_conn(mut conn: compio::net::TcpStream) {
    let mut buf = Vec::with_capacity(ECHO_SIZE);
    loop {
        buf.clear();
        let BufResult(n, back) = conn.read(buf).await;
        if n.unwrap_or(0) == 0 {
            break;
        }
        let BufResult(r, back) = conn.write_all(back).await;
        if r.is_err() {
            break;
        }
        buf = back;
    }
}

async fn compio_echo_client(addr: SocketAddr, rounds: u64) {
    let mut s = compio::net::TcpStream::connect(addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    let mut out = vec![1u8; ECHO_SIZE];
    let mut inb = Vec::with_capacity(ECHO_SIZE);
    for _ in 0..rounds {
        let BufResult(r, back) = s.write_all(out).await;
        r.unwrap();
        out = back;
        inb.clear();
        let BufResult(r, back) = s.read_exact(inb).await; // fills capacity (256)
        r.unwrap();
        inb = back;
    }
    s.shutdown().await.unwrap();
}

/// compio echo server on its own std thread + compio runtime (thread-per-core).
/// Accepts connections until `stop` is set and a wake-up connection arrives.
fn compio_echo_server_thread() -> (SocketAddr, Arc<AtomicBool>, std::thread::JoinHandle<()>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let t = std::thread::spawn(move || {
        let rt = compio_rt();
        rt.block_on(async move {
            let listener = compio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            loop {
                let (conn, _) = listener.accept().await.unwrap();
                if stop2.load(Ordering::Acquire) {
                    break;
                }
                conn.set_nodelay(true).unwrap();
                compio::runtime::spawn(compio_echo_conn(conn)).detach();
            }
        });
    });
    (rx.recv().unwrap(), stop, t)
}

fn echo_rtt(c: &mut Criterion) {
    let mut g = c.benchmark_group("net_echo_rtt_256b");
    g.throughput(Throughput::Elements(ECHO_ROUNDS));
    {
        // Two threads: client runtime on the bench thread, server runtime on
        // its own thread (built once, outside the timed region).
        let rt = compio_rt();
        let (addr, stop, server) = compio_echo_server_thread();
        let mut m = Meter::default();
        g.bench_function("compio", |b| {
            b.iter_custom(|iters| {
                m.measure(iters * ECHO_ROUNDS, || {
                    rt.block_on(compio_echo_client(addr, iters * ECHO_ROUNDS));
                })
            })
        });
        m.report("net_echo_rtt_256b/compio");
        stop.store(true, Ordering::Release);
        drop(std::net::TcpStream::connect(addr)); // wake the accept loop
        server.join().unwrap();
        drop(rt);
    }
    {
        // compio's idiomatic single-core form: server and client tasks on one
        // runtime/thread/ring.
        let rt = compio_rt();
        let mut m = Meter::default();
        g.bench_function("compio_1thread", |b| {
            b.iter_custom(|iters| {
                m.measure(iters * ECHO_ROUNDS, || {
                    rt.block_on(async move {
                        let listener = compio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                        let addr = listener.local_addr().unwrap();
                        let server = compio::runtime::spawn(async move {
                            let (conn, _) = listener.accept().await.unwrap();
                            conn.set_nodelay(true).unwrap();
                            compio_echo_conn(conn).await;
                        });
                        compio_echo_client(addr, iters * ECHO_ROUNDS).await;
                        server.await.unwrap();
                    })
                })
            })
        });
        m.report("net_echo_rtt_256b/compio_1thread");
        drop(rt);
    }
    {
        // Server on shard 1, client on shard 0 (as in the mailring variant).
        let rt = spargio_rt();
        let h = rt.handle();
        let mut m = Meter::default();
        g.bench_function("spargio", |b| {
            b.iter_custom(|iters| {
                m.measure(iters * ECHO_ROUNDS, || {
                    let (tx, rx) = std::sync::mpsc::channel();
                    let hs = h.clone();
                    let server = h
                        .spawn_pinned(1, async move {
                            let listener = spargio::net::TcpListener::bind(hs, "127.0.0.1:0")
                                .await
                                .unwrap();
                            tx.send(listener.local_addr().unwrap()).unwrap();
                            // Session shard = current shard (ContextPreferred).
                            let (conn, _) = listener.accept().await.unwrap();
                            set_nodelay_fd(conn.as_raw_fd()); // spargio already sets it
                            let mut buf = vec![0u8; ECHO_SIZE];
                            loop {
                                let (n, mut back) = conn.recv_owned(buf).await.unwrap();
                                if n == 0 {
                                    break;
                                }
                                back.truncate(n);
                                let mut back = conn.write_all_owned(back).await.unwrap();
                                back.resize(ECHO_SIZE, 0);
                                buf = back;
                            }
                        })
                        .unwrap();
                    let addr: SocketAddr = rx.recv().unwrap();
                    let hc = h.clone();
                    let client = h
                        .spawn_pinned(0, async move {
                            let stream = spargio::net::TcpStream::connect(hc, addr).await.unwrap();
                            set_nodelay_fd(stream.as_raw_fd());
                            let mut out = vec![1u8; ECHO_SIZE];
                            let mut inb = vec![0u8; ECHO_SIZE];
                            for _ in 0..iters * ECHO_ROUNDS {
                                out = stream.write_all_owned(out).await.unwrap();
                                inb = stream.read_exact_owned(inb).await.unwrap();
                            }
                            // No shutdown API; half-close so the server sees EOF.
                            // SAFETY: valid socket fd owned by `stream`.
                            unsafe { libc::shutdown(stream.as_raw_fd(), libc::SHUT_WR) };
                        })
                        .unwrap();
                    block_on(client).unwrap();
                    block_on(server).unwrap();
                })
            })
        });
        m.report("net_echo_rtt_256b/spargio");
        spargio_shutdown(rt);
    }
    g.finish();
}

/// Streaming 4 KiB messages through an echo server with at most 32 in flight
/// (the same workload as `net_stream_throughput_4k_window32` in `io.rs`).
fn stream_window32(c: &mut Criterion) {
    const MSGS: u64 = 10_000;
    const WINDOW: usize = 32;
    let mut g = c.benchmark_group("net_stream_throughput_4k_window32");
    g.throughput(Throughput::Bytes(MSGS * BLOCK as u64));
    {
        let rt = compio_rt();
        let mut m = Meter::default();
        g.bench_function("compio_1thread", |b| {
            b.iter_custom(|iters| {
                m.measure(iters * MSGS, || {
                    rt.block_on(async move {
                        let listener = compio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                        let addr = listener.local_addr().unwrap();
                        let server = compio::runtime::spawn(async move {
                            let (mut conn, _) = listener.accept().await.unwrap();
                            let mut buf = Vec::with_capacity(64 << 10);
                            loop {
                                buf.clear();
                                let BufResult(n, back) = conn.read(buf).await;
                                if n.unwrap() == 0 {
                                    break;
                                }
                                let BufResult(r, back) = conn.write_all(back).await;
                                r.unwrap();
                                buf = back;
                            }
                        });
                        let total = iters * MSGS;
                        let stream = compio::net::TcpStream::connect(addr).await.unwrap();
                        let (mut rd, mut wr) = stream.into_split();
                        let window = Arc::new(tokio::sync::Semaphore::new(WINDOW));
                        let w2 = window.clone();
                        let reader = compio::runtime::spawn(async move {
                            let mut got = 0usize;
                            let mut buf = Vec::with_capacity(64 << 10);
                            while got < total as usize * BLOCK {
                                buf.clear();
                                let BufResult(n, back) = rd.read(buf).await;
                                let n = n.unwrap();
                                let before = got / BLOCK;
                                got += n;
                                w2.add_permits(got / BLOCK - before);
                                buf = back;
                            }
                        });
                        let mut msg = vec![3u8; BLOCK];
                        for _ in 0..total {
                            window.acquire().await.unwrap().forget();
                            let BufResult(r, back) = wr.write_all(msg).await;
                            r.unwrap();
                            msg = back;
                        }
                        reader.await.unwrap();
                        wr.shutdown().await.unwrap();
                        server.await.unwrap();
                    })
                })
            })
        });
        m.report("net_stream_throughput_4k_window32/compio_1thread");
        drop(rt);
    }
    {
        let rt = spargio_rt();
        let h = rt.handle();
        let mut m = Meter::default();
        g.bench_function("spargio", |b| {
            b.iter_custom(|iters| {
                m.measure(iters * MSGS, || {
                    let (tx, rx) = std::sync::mpsc::channel();
                    let hs = h.clone();
                    let server = h
                        .spawn_pinned(1, async move {
                            let listener = spargio::net::TcpListener::bind(hs, "127.0.0.1:0")
                                .await
                                .unwrap();
                            tx.send(listener.local_addr().unwrap()).unwrap();
                            let (conn, _) = listener.accept().await.unwrap();
                            let mut buf = vec![0u8; 64 << 10];
                            loop {
                                let (n, mut back) = conn.recv_owned(buf).await.unwrap();
                                if n == 0 {
                                    break;
                                }
                                back.truncate(n);
                                let mut back = conn.write_all_owned(back).await.unwrap();
                                back.resize(64 << 10, 0);
                                buf = back;
                            }
                        })
                        .unwrap();
                    let addr: SocketAddr = rx.recv().unwrap();
                    let total = iters * MSGS;
                    let hc = h.clone();
                    let window = Arc::new(tokio::sync::Semaphore::new(WINDOW));
                    let (client, reader) = {
                        let stream = block_on(spargio::net::TcpStream::connect(hc, addr)).unwrap();
                        let (rs, w2) = (stream.clone(), window.clone());
                        let reader = h
                            .spawn_pinned(0, async move {
                                let mut got = 0usize;
                                let mut buf = vec![0u8; 64 << 10];
                                while got < total as usize * BLOCK {
                                    let (n, back) = rs.recv_owned(buf).await.unwrap();
                                    let before = got / BLOCK;
                                    got += n;
                                    w2.add_permits(got / BLOCK - before);
                                    buf = back;
                                    buf.resize(64 << 10, 0);
                                }
                            })
                            .unwrap();
                        let client = h
                            .spawn_pinned(0, async move {
                                let mut msg = vec![3u8; BLOCK];
                                for _ in 0..total {
                                    window.acquire().await.unwrap().forget();
                                    msg = stream.write_all_owned(msg).await.unwrap();
                                }
                                stream
                            })
                            .unwrap();
                        (client, reader)
                    };
                    let stream = block_on(client).unwrap();
                    block_on(reader).unwrap();
                    // No shutdown API; half-close so the server sees EOF.
                    // SAFETY: valid socket fd owned by `stream`.
                    unsafe { libc::shutdown(stream.as_raw_fd(), libc::SHUT_WR) };
                    block_on(server).unwrap();
                })
            })
        });
        m.report("net_stream_throughput_4k_window32/spargio");
        spargio_shutdown(rt);
    }
    g.finish();
}

criterion_group!(
    benches,
    read_rtt,
    read_qd32,
    write_fsync,
    echo_rtt,
    stream_window32
);
criterion_main!(benches);
