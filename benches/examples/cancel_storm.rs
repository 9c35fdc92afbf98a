//! Drops thousands of in-flight operations at random points, then shuts down
//! with operations still in flight. Meant to run under
//! `valgrind --tool=memcheck` (shards spin instead of blocking in
//! `io_uring_enter`, which valgrind 3.19 cannot release its lock across).
use std::os::fd::FromRawFd;
use std::time::Duration;

use mailring::fs::File;
use mailring::net::{TcpListener, TcpStream};
use mailring::{IdlePolicy, ShardId};

fn main() {
    let rounds: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200);
    let rt = mailring::Runtime::builder()
        .shards(2)
        .idle_policy(IdlePolicy::Spin(Duration::from_secs(3600)))
        .build()
        .unwrap();
    let h = rt.handle().clone();
    let done = rt.handle().spawn_on(ShardId::new(0), async move {
        let mut fds = [0i32; 2];
        // SAFETY: `fds` is a valid two-element array for pipe2 to fill.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: pipe2 returned two fresh descriptors that we now own.
        let (r, w) = unsafe {
            (
                std::fs::File::from_raw_fd(fds[0]),
                std::fs::File::from_raw_fd(fds[1]),
            )
        };
        let reader = File::from_std(r).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr();
        let client = mailring::spawn_local(async move { TcpStream::connect(addr).await.unwrap() });
        let (server_side, _) = listener.accept().await.unwrap();
        let _client = client.await.unwrap();
        let mut seed = 0x1234_5678u64;
        for i in 0..rounds {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let wait = Duration::from_micros(seed % 50);
            match i % 4 {
                0 => drop(mailring::time::timeout(wait, reader.read_at(vec![0u8; 4096], 0)).await),
                1 => drop(mailring::time::timeout(wait, listener.accept()).await),
                2 => drop(
                    mailring::time::timeout(wait, server_side.recv(Vec::with_capacity(4096))).await,
                ),
                _ => drop(
                    mailring::time::timeout(wait, mailring::time::sleep(Duration::from_secs(60)))
                        .await,
                ),
            }
        }
        // Leave operations in flight for the shutdown.
        for s in 0..2 {
            h.spawn_on(ShardId::new(s), async move {
                mailring::time::sleep(Duration::from_secs(3600)).await;
            })
            .detach();
        }
        mailring::spawn_local(async move {
            let _writer = w;
            let _ = reader.read_at(vec![0u8; 4096], 0).await;
        })
        .detach();
        rounds
    });
    let n = futures::executor::block_on(done).unwrap();
    let stats = rt.stats();
    rt.shutdown();
    println!("{n} rounds of dropped operations; stats before shutdown: {stats:?}");
}
