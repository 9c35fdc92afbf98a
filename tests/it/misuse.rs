//! Misuse from the wrong shard or thread gives errors (or a panic that names
//! the call and its remedy), never another shard's memory or a hang.

use std::future::Future;
use std::time::Duration;

use mailring::buf::BufRing;
use mailring::net::UnixStream;
use mailring::ShardId;

/// A `BufRing` registered on shard 1, used by a stream on shard 0 (which has
/// no buffer group of its own): an error, not an endless re-arm on
/// `ENOBUFS`.
#[test]
fn a_buf_ring_of_another_shard_is_refused_by_recv_multishot() {
    let rt = super::rt2();
    let h = rt.handle().clone();
    let res = rt.block_on(async move {
        let ring = h
            .spawn_on(ShardId::new(1), async { BufRing::new(8, 256) })
            .await
            .unwrap()
            .unwrap();
        h.spawn_on(ShardId::new(0), async move {
            let (a, b) = UnixStream::pair().unwrap();
            a.send_all(b"hello".to_vec()).await.0.unwrap();
            let mut incoming = b.recv_multishot(&ring);
            mailring::time::timeout(Duration::from_secs(5), incoming.next()).await
        })
        .await
        .unwrap()
    });
    let err = res
        .expect("an answer, not an endless re-arm")
        .expect("an item")
        .expect_err("a foreign ring is an error");
    assert!(err.to_string().contains("another shard"), "{err}");
}

/// Group ids repeat across shards: with a ring of its own in the same group,
/// shard 0 must still refuse shard 1's ring instead of reading its own
/// ring's buffers through it.
#[test]
fn a_buf_ring_of_another_shard_never_reads_this_shards_buffers() {
    let rt = super::rt2();
    let h = rt.handle().clone();
    let res = rt.block_on(async move {
        let foreign = h
            .spawn_on(ShardId::new(1), async { BufRing::new(8, 256) })
            .await
            .unwrap()
            .unwrap();
        h.spawn_on(ShardId::new(0), async move {
            let own = BufRing::new(8, 256).unwrap();
            assert_eq!(
                own.group(),
                foreign.group(),
                "group ids repeat across shards"
            );
            let (a, b) = UnixStream::pair().unwrap();
            a.send_all(b"hello".to_vec()).await.0.unwrap();
            let mut incoming = b.recv_multishot(&foreign);
            let got = mailring::time::timeout(Duration::from_secs(5), incoming.next()).await;
            drop(incoming);
            // The data is still there for a receive with the right ring.
            let mut right = b.recv_multishot(&own);
            let data = mailring::time::timeout(Duration::from_secs(5), right.next())
                .await
                .map(|d| d.unwrap().unwrap().to_vec());
            (got.map(|g| g.map(|r| r.map(|b| b.to_vec()))), data)
        })
        .await
        .unwrap()
    });
    let (got, data) = res;
    let got = got.expect("answered").expect("an item");
    assert!(got.is_err(), "read through a foreign ring: {got:?}");
    assert_eq!(data.expect("the data is still in the socket"), b"hello");
}

/// `block_on` of another runtime from a shard would block that shard (and
/// deadlock if the future waits on a task there): it panics with a message
/// that says what to do instead, as Tokio does.
#[test]
fn block_on_of_another_runtime_from_a_shard_panics_with_the_remedy() {
    let rt = super::rt2();
    let other = std::sync::Arc::new(super::rt2());
    let inner = other.clone();
    let message = rt.block_on(async move {
        let caught =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| inner.block_on(async { 1 })));
        let payload = caught.expect_err("block_on from a shard must panic");
        payload
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default()
    });
    assert!(
        message.contains("another mailring runtime") && message.contains("spawn"),
        "{message}"
    );
    // Both runtimes still work.
    assert_eq!(other.block_on(async { 2 }), 2);
    assert_eq!(rt.block_on(async { 3 }), 3);
}

/// Polls `f` on this thread until it is ready, failing after `secs` seconds.
fn poll_here_within<F: std::future::Future>(f: F, secs: u64) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        let now = std::time::Instant::now();
        assert!(now < deadline, "timed out polling off the shards");
        std::thread::park_timeout(deadline - now);
    }
}

/// An I/O future submitted on its shard, then moved to a plain thread and
/// polled there, completes there (the home shard hands the result over)
/// instead of panicking.
#[test]
fn an_io_future_moved_off_its_shard_mid_flight_completes_where_it_is_polled() {
    use std::io::Write;
    use std::os::fd::FromRawFd;
    let rt = super::rt2();
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe(2) writes.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors are new and owned by nobody else.
    let (reader, mut writer) = unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            std::fs::File::from_raw_fd(fds[1]),
        )
    };
    let (tx, rx) = std::sync::mpsc::channel();
    rt.handle().spawn_on(ShardId::new(1), async move {
        let file = mailring::fs::File::from_std(reader).unwrap();
        let mut read = Box::pin(async move { file.read_at(vec![0u8; 32], 0).await });
        // Submitted on shard 1, pending: nothing was written yet.
        std::future::poll_fn(|cx| {
            assert!(read.as_mut().poll(cx).is_pending());
            std::task::Poll::Ready(())
        })
        .await;
        tx.send(read).unwrap();
    });
    let read = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    writer.write_all(b"off the shard").unwrap();
    let (res, buf) = poll_here_within(read, 5);
    let n = res.expect("the read's own result, not a wrong-shard error");
    assert_eq!(&buf[..n], b"off the shard");
    // The shard is unharmed.
    assert_eq!(rt.block_on(async { 5 }), 5);
}

/// A waker that, when woken, drops an I/O future it holds (whose drop goes
/// to the op table). Several tasks waiting on one multishot accept are woken
/// by one completion; before, they were woken inside the op table's borrow
/// and such a waker's drop found the table borrowed (a panic on the shard).
struct DropOnWake {
    held: std::sync::Mutex<Option<std::pin::Pin<Box<dyn Future<Output = ()> + Send>>>>,
    woken: std::sync::atomic::AtomicUsize,
}

impl std::task::Wake for DropOnWake {
    fn wake(self: std::sync::Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        self.woken.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let held = self.held.lock().unwrap().take();
        drop(held);
    }
}

#[test]
fn wakers_of_a_multishot_accept_run_outside_the_op_table() {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    let rt = super::rt2();
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let h = rt.handle().clone();
    let done = h.spawn_local_on(ShardId::new(0), move || async move {
        let listener = mailring::net::TcpListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        addr_tx.send(listener.local_addr()).unwrap();
        // Two wakers on the listener's one multishot accept, each holding a
        // pending receive (an op in the table) that its wake drops.
        let mut wakers = Vec::new();
        let mut keep = Vec::new();
        for _ in 0..2 {
            let (a, b) = mailring::net::UnixStream::pair().unwrap();
            let mut recv: std::pin::Pin<Box<dyn Future<Output = ()> + Send>> =
                Box::pin(async move {
                    let _ = a.recv(vec![0u8; 8]).await;
                });
            std::future::poll_fn(|cx| {
                assert!(recv.as_mut().poll(cx).is_pending());
                std::task::Poll::Ready(())
            })
            .await;
            keep.push(b);
            let w = Arc::new(DropOnWake {
                held: std::sync::Mutex::new(Some(recv)),
                woken: Default::default(),
            });
            let waker = std::task::Waker::from(w.clone());
            let mut accept = Box::pin(listener.accept());
            let mut cx = std::task::Context::from_waker(&waker);
            assert!(accept.as_mut().poll(&mut cx).is_pending());
            wakers.push(w);
        }
        // The connection's CQE wakes both; then this task takes it.
        let (conn, _) = mailring::time::timeout(Duration::from_secs(5), listener.accept())
            .await
            .expect("accepted")
            .unwrap();
        drop(conn);
        wakers
            .iter()
            .map(|w| w.woken.load(Ordering::SeqCst))
            .sum::<usize>()
    });
    let addr = addr_rx.recv_timeout(Duration::from_secs(5)).unwrap();
    let _client = std::net::TcpStream::connect(addr).unwrap();
    let woken =
        rt.block_on(async move { mailring::time::timeout(Duration::from_secs(10), done).await });
    let woken = woken.expect("the shard survived").unwrap();
    assert!(woken >= 2, "both wakers ran: {woken}");
    assert_eq!(rt.stats().shards[0].panics.total(), 0);
}

/// A full submission queue whose submit the kernel refuses with `EBUSY`
/// while completions wait (older kernels with a CQ overflow backlog; played
/// here by fault injection): the shard moves the waiting completions aside
/// and goes on, instead of retrying the refused submit forever, and every
/// operation still completes.
#[test]
fn a_full_sq_refused_with_ebusy_while_completions_wait_still_drains() {
    use std::io::Read;
    use std::os::fd::FromRawFd;
    let mut faults = mailring::FaultInjection::default();
    faults.busy_while_completions_wait = u32::MAX;
    let rt = mailring::Runtime::builder()
        .shards(1)
        .ring_entries(8)
        .fault_injection(faults)
        .build()
        .unwrap();
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe(2) writes.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors are new and owned by nobody else.
    let (mut reader, writer) = unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            std::fs::File::from_raw_fd(fds[1]),
        )
    };
    let (tx, rx) = std::sync::mpsc::channel();
    rt.handle()
        .spawn_local_on(ShardId::new(0), move || async move {
            let file = std::rc::Rc::new(mailring::fs::File::from_std(writer).unwrap());
            // 64 writes submitted in one tick: the 8-entry SQ fills again and
            // again while earlier writes' completions wait in the CQ.
            let writes: Vec<_> = (0..64)
                .map(|_| {
                    let f = file.clone();
                    mailring::spawn_local(async move { f.write_at(vec![b'x'], 0).await.0 })
                })
                .collect();
            let mut written = 0;
            for w in writes {
                written += w.await.unwrap().unwrap();
            }
            tx.send(written).unwrap();
        });
    let Ok(written) = rx.recv_timeout(Duration::from_secs(10)) else {
        // A shard spinning on the refused submit never reaches shutdown:
        // leak the runtime so that the test fails instead of hanging.
        std::mem::forget(rt);
        panic!("the writes did not complete: the shard spins on EBUSY");
    };
    assert_eq!(written, 64);
    let mut buf = [0u8; 64];
    reader.read_exact(&mut buf).unwrap();
    assert_eq!(buf, [b'x'; 64]);
}
