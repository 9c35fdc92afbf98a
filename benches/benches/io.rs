//! Native I/O benchmarks: mailring (2 shards) vs tokio (2 workers), same run.
//!
//! Run: `cargo bench -p mailring-bench --bench io`. Every criterion iteration is
//! one batch (sizes below); divide by the batch size for per-op figures, which
//! the `[cpu]` lines print together with CPU time (cores busy = CPU / wall).

use std::os::unix::fs::FileExt;
use std::rc::Rc;
use std::sync::Arc;

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use futures::executor::block_on;
use mailring::fs::File;
use mailring::net::{TcpListener, TcpStream};
use mailring::ShardId;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use mailring_bench::{
    data_file, offset, Meter, BLOCK, ECHO_ROUNDS, ECHO_SIZE, FSYNC_WRITES, QD, READS,
};

fn mailring_rt() -> mailring::Runtime {
    mailring::Runtime::builder()
        .shards(2)
        .build()
        .expect("mailring runtime")
}

fn tokio_rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn read_rtt(c: &mut Criterion) {
    let path = data_file();
    let mut g = c.benchmark_group("fs_read_rtt_4k");
    g.throughput(Throughput::Elements(READS));
    {
        let rt = mailring_rt();
        let h = rt.handle().clone();
        let mut m = Meter::default();
        g.bench_function("mailring", |b| {
            b.iter_custom(|iters| {
                let p = path.clone();
                m.measure(iters * READS, || {
                    let task = h.spawn_on(ShardId::new(0), async move {
                        let file = File::open(&p).await.unwrap();
                        let mut buf = Vec::with_capacity(BLOCK);
                        for i in 0..iters * READS {
                            buf.clear();
                            let (n, back) = file.read_at(buf, offset(i)).await;
                            assert_eq!(n.unwrap(), BLOCK);
                            buf = back;
                        }
                    });
                    block_on(task).unwrap();
                })
            })
        });
        m.report("fs_read_rtt_4k/mailring");
    }
    {
        let rt = tokio_rt();
        let mut m = Meter::default();
        g.bench_function("tokio", |b| {
            b.iter_custom(|iters| {
                let p = path.clone();
                m.measure(iters * READS, || {
                    rt.block_on(async move {
                        // tokio::fs has no positional read: seek + read, as its docs suggest.
                        use tokio::io::AsyncSeekExt;
                        let mut file = tokio::fs::File::open(&p).await.unwrap();
                        let mut buf = vec![0u8; BLOCK];
                        for i in 0..iters * READS {
                            file.seek(std::io::SeekFrom::Start(offset(i)))
                                .await
                                .unwrap();
                            file.read_exact(&mut buf).await.unwrap();
                        }
                        black_box(&buf);
                    });
                })
            })
        });
        m.report("fs_read_rtt_4k/tokio");
    }
    g.finish();
}

/// 4 KiB reads at queue depth 1 with `O_DIRECT` (no page cache), aligned buffers.
fn read_rtt_direct(c: &mut Criterion) {
    use std::os::unix::fs::OpenOptionsExt;
    let path = data_file();
    let mut g = c.benchmark_group("fs_read_rtt_4k_odirect");
    g.throughput(Throughput::Elements(READS));
    // Probe: some filesystems (tmpfs) refuse O_DIRECT.
    if std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .is_err()
    {
        eprintln!("fs_read_rtt_4k_odirect: skipped, O_DIRECT is not supported here");
        return;
    }
    {
        let rt = mailring_rt();
        let h = rt.handle().clone();
        let mut m = Meter::default();
        g.bench_function("mailring", |b| {
            b.iter_custom(|iters| {
                let p = path.clone();
                m.measure(iters * READS, || {
                    let task = h.spawn_on(ShardId::new(0), async move {
                        let file = mailring::fs::OpenOptions::new()
                            .read(true)
                            .custom_flags(libc::O_DIRECT)
                            .open(&p)
                            .await
                            .unwrap();
                        let mut buf = mailring::buf::AlignedBuf::new(BLOCK, BLOCK);
                        for i in 0..iters * READS {
                            buf.clear();
                            let (n, back) = file.read_at(buf, offset(i)).await;
                            assert_eq!(n.unwrap(), BLOCK);
                            buf = back;
                        }
                    });
                    block_on(task).unwrap();
                })
            })
        });
        m.report("fs_read_rtt_4k_odirect/mailring");
    }
    {
        let rt = tokio_rt();
        let mut m = Meter::default();
        g.bench_function("tokio", |b| {
            b.iter_custom(|iters| {
                let p = path.clone();
                m.measure(iters * READS, || {
                    rt.block_on(async move {
                        // tokio::fs buffers internally (unaligned): O_DIRECT goes
                        // through spawn_blocking with an aligned buffer instead.
                        let file = Arc::new(
                            std::fs::OpenOptions::new()
                                .read(true)
                                .custom_flags(libc::O_DIRECT)
                                .open(&p)
                                .unwrap(),
                        );
                        let mut raw = vec![0u8; 2 * BLOCK];
                        for i in 0..iters * READS {
                            let f = file.clone();
                            raw = tokio::task::spawn_blocking(move || {
                                let start = raw.as_ptr().align_offset(BLOCK);
                                f.read_exact_at(&mut raw[start..start + BLOCK], offset(i))
                                    .unwrap();
                                raw
                            })
                            .await
                            .unwrap();
                        }
                    });
                })
            })
        });
        m.report("fs_read_rtt_4k_odirect/tokio");
    }
    g.finish();
}

fn read_qd32(c: &mut Criterion) {
    let path = data_file();
    let mut g = c.benchmark_group("fs_read_throughput_4k_qd32");
    g.throughput(Throughput::Bytes(READS * BLOCK as u64));
    {
        let rt = mailring_rt();
        let h = rt.handle().clone();
        let mut m = Meter::default();
        g.bench_function("mailring", |b| {
            b.iter_custom(|iters| {
                let p = path.clone();
                m.measure(iters * READS, || {
                    let task = h.spawn_local_on(ShardId::new(0), move || async move {
                        let file = Rc::new(File::open(&p).await.unwrap());
                        let per = iters * READS / QD;
                        let workers: Vec<_> = (0..QD)
                            .map(|w| {
                                let file = file.clone();
                                mailring::spawn_local(async move {
                                    let mut buf = Vec::with_capacity(BLOCK);
                                    for i in 0..per {
                                        buf.clear();
                                        let (n, back) =
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
                    });
                    block_on(task).unwrap();
                })
            })
        });
        m.report("fs_read_throughput_4k_qd32/mailring");
    }
    {
        let rt = tokio_rt();
        let mut m = Meter::default();
        g.bench_function("tokio", |b| {
            b.iter_custom(|iters| {
                let p = path.clone();
                m.measure(iters * READS, || {
                    rt.block_on(async move {
                        // Positional reads in tokio go through spawn_blocking (what tokio::fs does).
                        let file = Arc::new(std::fs::File::open(&p).unwrap());
                        let per = iters * READS / QD;
                        let workers: Vec<_> = (0..QD)
                            .map(|w| {
                                let file = file.clone();
                                tokio::spawn(async move {
                                    let mut buf = vec![0u8; BLOCK];
                                    for i in 0..per {
                                        let f = file.clone();
                                        buf = tokio::task::spawn_blocking(move || {
                                            f.read_exact_at(&mut buf, offset(w * per + i)).unwrap();
                                            buf
                                        })
                                        .await
                                        .unwrap();
                                    }
                                })
                            })
                            .collect();
                        for w in workers {
                            w.await.unwrap();
                        }
                    });
                })
            })
        });
        m.report("fs_read_throughput_4k_qd32/tokio");
    }
    g.finish();
}

fn write_fsync(c: &mut Criterion) {
    let mut g = c.benchmark_group("fs_write_fsync_4k");
    g.throughput(Throughput::Elements(FSYNC_WRITES));
    let dir = std::env::temp_dir();
    {
        let rt = mailring_rt();
        let h = rt.handle().clone();
        let mut m = Meter::default();
        let path = dir.join("mailring-bench-append-mailring.bin");
        g.bench_function("mailring", |b| {
            b.iter_custom(|iters| {
                let p = path.clone();
                m.measure(iters * FSYNC_WRITES, || {
                    let task = h.spawn_on(ShardId::new(0), async move {
                        let file = File::create(&p).await.unwrap();
                        let mut buf = vec![7u8; BLOCK];
                        for i in 0..iters * FSYNC_WRITES {
                            let (r, back) = file.write_all_at(buf, i * BLOCK as u64).await;
                            r.unwrap();
                            buf = back;
                            file.sync_data().await.unwrap();
                        }
                    });
                    block_on(task).unwrap();
                })
            })
        });
        m.report("fs_write_fsync_4k/mailring");
    }
    {
        let rt = tokio_rt();
        let mut m = Meter::default();
        let path = dir.join("mailring-bench-append-tokio.bin");
        g.bench_function("tokio", |b| {
            b.iter_custom(|iters| {
                let p = path.clone();
                m.measure(iters * FSYNC_WRITES, || {
                    rt.block_on(async move {
                        let mut file = tokio::fs::File::create(&p).await.unwrap();
                        let buf = vec![7u8; BLOCK];
                        for _ in 0..iters * FSYNC_WRITES {
                            file.write_all(&buf).await.unwrap();
                            file.sync_data().await.unwrap();
                        }
                    });
                })
            })
        });
        m.report("fs_write_fsync_4k/tokio");
    }
    g.finish();
}

fn echo_rtt(c: &mut Criterion) {
    let mut g = c.benchmark_group("net_echo_rtt_256b");
    g.throughput(Throughput::Elements(ECHO_ROUNDS));
    // Server on shard 1, client on shard 0 (each end on its own core, as
    // two processes would be); and both on shard 0, where Tokio's scheduler
    // puts its pair (one worker, no cross-core hop).
    for (name, server_shard) in [("mailring", 1), ("mailring_same_shard", 0)] {
        let rt = mailring_rt();
        let h = rt.handle().clone();
        let mut m = Meter::default();
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                m.measure(iters * ECHO_ROUNDS, || {
                    let (tx, rx) = std::sync::mpsc::channel();
                    let server = h.spawn_on(ShardId::new(server_shard), async move {
                        let listener = TcpListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
                        tx.send(listener.local_addr()).unwrap();
                        let (conn, _) = listener.accept().await.unwrap();
                        conn.set_nodelay(true).unwrap();
                        let mut buf = Vec::with_capacity(ECHO_SIZE);
                        loop {
                            buf.clear();
                            let (n, back) = conn.recv(buf).await;
                            if n.unwrap() == 0 {
                                break;
                            }
                            let (r, back) = conn.send_all(back).await;
                            r.unwrap();
                            buf = back;
                        }
                    });
                    let addr = rx.recv().unwrap();
                    let client = h.spawn_on(ShardId::new(0), async move {
                        let stream = TcpStream::connect(addr).await.unwrap();
                        stream.set_nodelay(true).unwrap();
                        let mut out = vec![1u8; ECHO_SIZE];
                        let mut inb = Vec::with_capacity(ECHO_SIZE);
                        for _ in 0..iters * ECHO_ROUNDS {
                            let (r, back) = stream.send_all(out).await;
                            r.unwrap();
                            out = back;
                            let mut got = 0;
                            while got < ECHO_SIZE {
                                inb.clear();
                                let (n, back) = stream.recv(inb).await;
                                got += n.unwrap();
                                inb = back;
                            }
                        }
                        stream.shutdown(std::net::Shutdown::Write).await.unwrap();
                    });
                    block_on(client).unwrap();
                    block_on(server).unwrap();
                })
            })
        });
        m.report(&format!("net_echo_rtt_256b/{name}"));
    }
    {
        let rt = tokio_rt();
        let mut m = Meter::default();
        g.bench_function("tokio", |b| {
            b.iter_custom(|iters| {
                m.measure(iters * ECHO_ROUNDS, || {
                    rt.block_on(async move {
                        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                        let addr = listener.local_addr().unwrap();
                        let server = tokio::spawn(async move {
                            let (mut conn, _) = listener.accept().await.unwrap();
                            conn.set_nodelay(true).unwrap();
                            let mut buf = vec![0u8; ECHO_SIZE];
                            loop {
                                let n = conn.read(&mut buf).await.unwrap();
                                if n == 0 {
                                    break;
                                }
                                conn.write_all(&buf[..n]).await.unwrap();
                            }
                        });
                        let client = tokio::spawn(async move {
                            let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
                            stream.set_nodelay(true).unwrap();
                            let out = vec![1u8; ECHO_SIZE];
                            let mut inb = vec![0u8; ECHO_SIZE];
                            for _ in 0..iters * ECHO_ROUNDS {
                                stream.write_all(&out).await.unwrap();
                                stream.read_exact(&mut inb).await.unwrap();
                            }
                            stream.shutdown().await.unwrap();
                        });
                        client.await.unwrap();
                        server.await.unwrap();
                    });
                })
            })
        });
        m.report("net_echo_rtt_256b/tokio");
    }
    g.finish();
}

/// Streaming 4 KiB messages through an echo server with at most 32 in flight.
fn stream_window32(c: &mut Criterion) {
    const MSGS: u64 = 10_000;
    const WINDOW: usize = 32;
    let mut g = c.benchmark_group("net_stream_throughput_4k_window32");
    g.throughput(Throughput::Bytes(MSGS * BLOCK as u64));
    {
        let rt = mailring_rt();
        let h = rt.handle().clone();
        let mut m = Meter::default();
        g.bench_function("mailring", |b| {
            b.iter_custom(|iters| {
                m.measure(iters * MSGS, || {
                    let (tx, rx) = std::sync::mpsc::channel();
                    let server = h.spawn_on(ShardId::new(1), async move {
                        let listener = TcpListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
                        tx.send(listener.local_addr()).unwrap();
                        let (conn, _) = listener.accept().await.unwrap();
                        let mut buf = Vec::with_capacity(64 << 10);
                        loop {
                            buf.clear();
                            let (n, back) = conn.recv(buf).await;
                            if n.unwrap() == 0 {
                                break;
                            }
                            let (r, back) = conn.send_all(back).await;
                            r.unwrap();
                            buf = back;
                        }
                    });
                    let addr = rx.recv().unwrap();
                    let total = iters * MSGS;
                    let client = h.spawn_local_on(ShardId::new(0), move || async move {
                        let stream = Rc::new(TcpStream::connect(addr).await.unwrap());
                        let window = Arc::new(tokio::sync::Semaphore::new(WINDOW));
                        let (s2, w2) = (stream.clone(), window.clone());
                        let reader = mailring::spawn_local(async move {
                            let mut got = 0usize;
                            let mut buf = Vec::with_capacity(64 << 10);
                            while got < total as usize * BLOCK {
                                buf.clear();
                                let (n, back) = s2.recv(buf).await;
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
                            let (r, back) = stream.send_all(msg).await;
                            r.unwrap();
                            msg = back;
                        }
                        reader.await.unwrap();
                        stream.shutdown(std::net::Shutdown::Write).await.unwrap();
                    });
                    block_on(client).unwrap();
                    block_on(server).unwrap();
                })
            })
        });
        m.report("net_stream_throughput_4k_window32/mailring");
    }
    {
        let rt = tokio_rt();
        let mut m = Meter::default();
        g.bench_function("tokio", |b| {
            b.iter_custom(|iters| {
                m.measure(iters * MSGS, || {
                    rt.block_on(async move {
                        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                        let addr = listener.local_addr().unwrap();
                        let server = tokio::spawn(async move {
                            let (mut conn, _) = listener.accept().await.unwrap();
                            let mut buf = vec![0u8; 64 << 10];
                            loop {
                                let n = conn.read(&mut buf).await.unwrap();
                                if n == 0 {
                                    break;
                                }
                                conn.write_all(&buf[..n]).await.unwrap();
                            }
                        });
                        let total = iters * MSGS;
                        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
                        let (mut rd, mut wr) = stream.into_split();
                        let window = Arc::new(tokio::sync::Semaphore::new(WINDOW));
                        let w2 = window.clone();
                        let reader = tokio::spawn(async move {
                            let mut got = 0usize;
                            let mut buf = vec![0u8; 64 << 10];
                            while got < total as usize * BLOCK {
                                let n = rd.read(&mut buf).await.unwrap();
                                let before = got / BLOCK;
                                got += n;
                                w2.add_permits(got / BLOCK - before);
                            }
                        });
                        let msg = vec![3u8; BLOCK];
                        for _ in 0..total {
                            window.acquire().await.unwrap().forget();
                            wr.write_all(&msg).await.unwrap();
                        }
                        reader.await.unwrap();
                        wr.shutdown().await.unwrap();
                        server.await.unwrap();
                    });
                })
            })
        });
        m.report("net_stream_throughput_4k_window32/tokio");
    }
    g.finish();
}

/// Where zero-copy send starts to pay: 64 MiB one way over loopback in
/// chunks of each size, with `send_all` (copying) and `send_all_zc`.
fn send_zc(c: &mut Criterion) {
    const TOTAL: usize = 64 << 20;
    let mut g = c.benchmark_group("net_send_zc");
    g.throughput(Throughput::Bytes(TOTAL as u64));
    let rt = mailring_rt();
    let h = rt.handle().clone();
    for size in [4usize << 10, 16 << 10, 64 << 10, 256 << 10] {
        for zc in [false, true] {
            let name = format!("{}_{}k", if zc { "send_zc" } else { "send" }, size >> 10);
            let mut m = Meter::default();
            g.bench_function(&name, |b| {
                b.iter_custom(|iters| {
                    m.measure(iters * (TOTAL / size) as u64, || {
                        let (tx, rx) = std::sync::mpsc::channel();
                        let receiver = h.spawn_on(ShardId::new(1), async move {
                            let listener =
                                TcpListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
                            tx.send(listener.local_addr()).unwrap();
                            let (conn, _) = listener.accept().await.unwrap();
                            let mut buf = Vec::with_capacity(256 << 10);
                            let mut got = 0usize;
                            loop {
                                buf.clear();
                                let (n, back) = conn.recv(buf).await;
                                let n = n.unwrap();
                                if n == 0 {
                                    break;
                                }
                                got += n;
                                buf = back;
                            }
                            got
                        });
                        let addr = rx.recv().unwrap();
                        let sender = h.spawn_on(ShardId::new(0), async move {
                            let stream = TcpStream::connect(addr).await.unwrap();
                            let mut chunk = vec![5u8; size];
                            for _ in 0..iters as usize * (TOTAL / size) {
                                let (r, back) = if zc {
                                    stream.send_all_zc(chunk).await
                                } else {
                                    stream.send_all(chunk).await
                                };
                                r.unwrap();
                                chunk = back;
                            }
                            stream.shutdown(std::net::Shutdown::Write).await.unwrap();
                        });
                        block_on(sender).unwrap();
                        assert_eq!(block_on(receiver).unwrap(), iters as usize * TOTAL);
                    })
                })
            });
            m.report(&format!("net_send_zc/{name}"));
        }
    }
    g.finish();
}

criterion_group!(
    benches,
    read_rtt,
    read_rtt_direct,
    read_qd32,
    write_fsync,
    echo_rtt,
    stream_window32,
    send_zc
);
criterion_main!(benches);
