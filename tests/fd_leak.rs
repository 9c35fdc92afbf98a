//! Shutdown leaks no fd, also with operations in flight.
//!
//! A binary of its own: counting `/proc/self/fd` is only meaningful when no
//! other test opens rings at the same time, so these tests also serialise.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mailring::ShardId;

/// Tests that count fds must not overlap with others opening rings.
static FD_LOCK: Mutex<()> = Mutex::new(());

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn shutdown_closes_every_fd() {
    let _g = FD_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let before = open_fds();
    for _ in 0..5 {
        let rt = mailring::Runtime::builder().shards(2).build().unwrap();
        rt.block_on(async {
            mailring::spawn_on(ShardId::new(1), async { 1 })
                .await
                .unwrap();
        });
        rt.shutdown();
    }
    assert_eq!(open_fds(), before);
}

#[test]
fn shutdown_with_ops_and_tasks_in_flight_leaks_nothing() {
    let _g = FD_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let before = open_fds();
    let dropped = Arc::new(AtomicUsize::new(0));
    struct Guard(Arc<AtomicUsize>);
    impl Drop for Guard {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    {
        let rt = mailring::Runtime::builder().shards(2).build().unwrap();
        let handle = rt.handle().clone();
        let d = dropped.clone();
        rt.block_on(async move {
            for i in 0..100 {
                let g = Guard(d.clone());
                handle.spawn_on(ShardId::new(i % 2), async move {
                    let _g = g;
                    mailring::time::sleep(Duration::from_secs(3600)).await;
                });
            }
            // Let them all start and arm their timers.
            mailring::time::sleep(Duration::from_millis(20)).await;
        });
        let in_flight: u64 = rt.stats().shards.iter().map(|s| s.ops_in_flight).sum();
        assert!(
            in_flight >= 2,
            "expected armed ops before shutdown, got {in_flight}"
        );
        drop(rt);
    }
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        100,
        "every task's future was dropped"
    );
    assert_eq!(open_fds(), before);
}

#[test]
fn shutdown_with_reads_in_flight_closes_their_files() {
    let _g = FD_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let before = open_fds();
    {
        let rt = mailring::Runtime::builder().shards(2).build().unwrap();
        let handle = rt.handle().clone();
        rt.block_on(async move {
            for i in 0..20 {
                handle
                    .spawn_on(ShardId::new(i % 2), async move {
                        let mut fds = [0i32; 2];
                        // SAFETY: `fds` is a valid two-element array for pipe2 to fill.
                        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
                        // SAFETY: pipe2 returned two fresh descriptors that we now own.
                        let (reader, writer) = unsafe {
                            use std::os::fd::FromRawFd;
                            (
                                std::fs::File::from_raw_fd(fds[0]),
                                std::fs::File::from_raw_fd(fds[1]),
                            )
                        };
                        let reader = mailring::fs::File::from_std(reader).unwrap();
                        let _writer = writer;
                        // Never completes: the runtime shuts down under it.
                        let _ = reader.read_at(vec![0u8; 4096], 0).await;
                    })
                    .detach();
            }
            mailring::time::sleep(Duration::from_millis(20)).await;
        });
        let in_flight: u64 = rt.stats().shards.iter().map(|s| s.ops_in_flight).sum();
        assert!(
            in_flight >= 20,
            "expected the reads in flight, got {in_flight}"
        );
    }
    assert_eq!(open_fds(), before);
}

#[test]
fn dropping_a_listener_closes_queued_connections() {
    let _g = FD_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let before = open_fds();
    {
        let rt = mailring::Runtime::builder().shards(1).build().unwrap();
        rt.block_on(async {
            let listener =
                mailring::net::TcpListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
            let addr = listener.local_addr();
            let _ = mailring::time::timeout(Duration::ZERO, listener.accept()).await;
            let mut clients = Vec::new();
            for _ in 0..5 {
                clients.push(mailring::net::TcpStream::connect(addr).await.unwrap());
            }
            // Let the multishot accept take them into its queue, then drop everything.
            mailring::time::sleep(Duration::from_millis(10)).await;
            drop(listener);
            drop(clients);
            mailring::time::sleep(Duration::from_millis(10)).await;
        });
    }
    assert_eq!(open_fds(), before);
}

#[test]
fn thousands_of_ops_dropped_at_random_points_leak_nothing() {
    use mailring::fs::File;
    use mailring::net::{TcpListener, TcpStream};
    let _g = FD_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let before = open_fds();
    {
        let rt = mailring::Runtime::builder().shards(2).build().unwrap();
        let settled = rt.block_on(async {
            let mut fds = [0i32; 2];
            // SAFETY: `fds` is a valid two-element array for pipe2 to fill.
            assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
            // SAFETY: pipe2 returned two fresh descriptors that we now own.
            let (r, w) = unsafe {
                use std::os::fd::FromRawFd;
                (
                    std::fs::File::from_raw_fd(fds[0]),
                    std::fs::File::from_raw_fd(fds[1]),
                )
            };
            let reader = File::from_std(r).unwrap();
            let listener = TcpListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
            let addr = listener.local_addr();
            let client = TcpStream::connect(addr).await.unwrap();
            let (server, _) = listener.accept().await.unwrap();
            let mut seed = 0x9e37_79b9_7f4a_7c15u64;
            for i in 0..4_000u32 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let wait = Duration::from_micros(seed % 30);
                match i % 5 {
                    0 => drop(
                        mailring::time::timeout(wait, reader.read_at(vec![0u8; 4096], 0)).await,
                    ),
                    1 => drop(mailring::time::timeout(wait, listener.accept()).await),
                    2 => drop(
                        mailring::time::timeout(wait, server.recv(Vec::with_capacity(4096))).await,
                    ),
                    3 => drop(
                        mailring::time::timeout(
                            wait,
                            mailring::time::sleep(Duration::from_secs(60)),
                        )
                        .await,
                    ),
                    _ => drop(mailring::time::timeout(wait, TcpStream::connect(addr)).await),
                }
            }
            drop((client, w));
            // Every cancelled operation completes and frees its slot.
            let mut settled = false;
            for _ in 0..500 {
                mailring::time::sleep(Duration::from_millis(2)).await;
                let stats = mailring::Handle::current().stats();
                let in_flight: u64 = stats.shards.iter().map(|s| s.ops_in_flight).sum();
                // Per shard: the eventfd read and, on shard 0, the armed timer and
                // the listener's multishot accept.
                if in_flight <= 4 {
                    settled = true;
                    break;
                }
            }
            settled
        });
        assert!(
            settled,
            "cancelled operations never completed: {:?}",
            rt.stats()
        );
    }
    assert_eq!(open_fds(), before);
}
