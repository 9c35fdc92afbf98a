//! Shutdown: tasks dropped, joiners told. (The fd-counting tests are in
//! `tests/fd_leak.rs`, a process of their own.)

use mailring::ShardId;

#[test]
fn join_handle_of_a_task_dropped_at_shutdown_says_cancelled() {
    let rt = mailring::Runtime::builder().shards(1).build().unwrap();
    let h = rt.handle().spawn(std::future::pending::<()>());
    rt.shutdown();
    let outer = mailring::Runtime::builder().shards(1).build().unwrap();
    let err = outer.block_on(async move { h.await.unwrap_err() });
    assert!(err.is_cancelled());
}

#[test]
fn spawn_after_shutdown_resolves_cancelled() {
    let rt = mailring::Runtime::builder().shards(1).build().unwrap();
    let handle = rt.handle().clone();
    rt.shutdown();
    let h = handle.spawn_on(ShardId::new(0), async { 1 });
    let outer = mailring::Runtime::builder().shards(1).build().unwrap();
    let err = outer.block_on(async move { h.await.unwrap_err() });
    assert!(err.is_cancelled());
}

use std::future::Future;
use std::sync::mpsc;
use std::time::Duration;

const S0: ShardId = ShardId::new(0);

/// Waits for `rx`, failing (instead of hanging) after `secs` seconds.
fn within<T>(rx: &mpsc::Receiver<T>, secs: u64, what: &str) -> T {
    rx.recv_timeout(Duration::from_secs(secs))
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

/// Awaits a join handle from outside with a deadline.
fn join_within<T: Send + 'static>(
    h: mailring::JoinHandle<T>,
) -> Result<Result<T, mailring::JoinError>, mailring::time::Elapsed> {
    let outer = mailring::Runtime::builder().shards(1).build().unwrap();
    outer.block_on(async move { mailring::time::timeout(Duration::from_secs(5), h).await })
}

/// Shuts `rt` down on a thread of its own; fails if it takes over 20 s.
fn shutdown_within(rt: mailring::Runtime) -> mailring::ShutdownReport {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(rt.shutdown()).unwrap());
    within(&rx, 20, "shutdown finishes")
}

#[test]
fn a_pinned_task_queued_but_never_started_at_shutdown_resolves_cancelled() {
    let rt = mailring::Runtime::builder().shards(1).build().unwrap();
    let (handle_tx, handle_rx) = mpsc::channel();
    rt.handle().run_on(S0, move || {
        // At the end of this tick (after its tasks ran): queue a pinned task,
        // then hold the shard while the runtime starts shutting down, so the
        // task is still queued, unstarted, when the shard stops.
        let queued = mailring::defer_to_tick_end(move || {
            let h = mailring::spawn_on(S0, async { 1 });
            handle_tx.send(h).unwrap();
            std::thread::sleep(Duration::from_millis(200));
        });
        assert!(queued.is_ok());
    });
    let h = within(&handle_rx, 5, "the task is queued");
    let report = shutdown_within(rt);
    let joined = join_within(h).expect("the JoinHandle resolves");
    assert!(joined.unwrap_err().is_cancelled());
    assert_eq!(report.tasks_cancelled, 1);
}

#[test]
fn a_stealable_spawn_after_shutdown_resolves_cancelled() {
    let rt = mailring::Runtime::builder().shards(2).build().unwrap();
    let handle = rt.handle().clone();
    rt.shutdown();
    let h = handle.spawn(async { 1 });
    let joined = join_within(h).expect("the JoinHandle resolves");
    assert!(joined.unwrap_err().is_cancelled());
}

/// Polls `f` once with the current task's waker.
async fn poll_once<F: Future + Unpin>(f: &mut F) {
    std::future::poll_fn(|cx| {
        let _ = std::pin::Pin::new(&mut *f).poll(cx);
        std::task::Poll::Ready(())
    })
    .await;
}

#[test]
fn a_forgotten_receive_does_not_hang_shutdown() {
    let rt = mailring::Runtime::builder().shards(1).build().unwrap();
    let keep = rt.block_on(async {
        let (a, b) = mailring::net::UnixStream::pair().unwrap();
        let mut recv = Box::pin(a.recv(vec![0u8; 64]));
        poll_once(&mut recv).await;
        std::mem::forget(recv);
        // The stream itself is leaked with the forgotten future's borrow.
        std::mem::forget(a);
        b
    });
    let report = shutdown_within(rt);
    assert_eq!(report.ops_cancelled, 1);
    assert_eq!(report.ops_leaked, 0);
    drop(keep);
}

#[test]
fn a_listener_dropped_off_its_shard_stops_accepting_and_shutdown_finishes() {
    let rt = mailring::Runtime::builder().shards(1).build().unwrap();
    let listener = rt.block_on(async {
        let listener = mailring::net::TcpListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        {
            let mut accept = Box::pin(listener.accept());
            poll_once(&mut accept).await;
        }
        listener
    });
    let addr = listener.local_addr();
    // Dropped on this thread, not on its shard: the armed accept goes home.
    drop(listener);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => break,
            _ => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the dropped listener still accepts on {addr}"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
    let report = shutdown_within(rt);
    assert_eq!(report.ops_leaked, 0);
}

/// A waker woken during shutdown's step 4 (an operation's cancellation
/// completing) that sends work to another shard: the shard's batches are
/// gone by then, and the item is refused (counted as dropped unrun)
/// instead of indexing an empty list of batches.
#[test]
fn a_wake_during_shutdown_that_sends_to_another_shard_is_refused() {
    use std::os::fd::FromRawFd;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    struct SendsElsewhere(mailring::Handle, AtomicUsize);
    impl std::task::Wake for SendsElsewhere {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.1.fetch_add(1, Ordering::SeqCst);
            self.0.run_on(ShardId::new(1), || {});
        }
    }

    let rt = mailring::Runtime::builder().shards(2).build().unwrap();
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe(2) writes.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors are new and owned by nobody else.
    let (reader, writer) = unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            std::fs::File::from_raw_fd(fds[1]),
        )
    };
    let (tx, rx) = mpsc::channel();
    rt.handle().spawn_on(S0, async move {
        let file = mailring::fs::File::from_std(reader).unwrap();
        let mut read = Box::pin(async move { file.read_at(vec![0u8; 8], 0).await.0.is_ok() });
        poll_once(&mut read).await;
        tx.send(read).unwrap();
    });
    let mut read = within(&rx, 5, "the read is submitted");
    // Polled here: the read's result will be handed over by shard 0, which
    // wakes this waker when the read completes (at shutdown: cancelled).
    let waker = Arc::new(SendsElsewhere(rt.handle().clone(), AtomicUsize::new(0)));
    let w = std::task::Waker::from(waker.clone());
    assert!(read
        .as_mut()
        .poll(&mut std::task::Context::from_waker(&w))
        .is_pending());
    std::thread::sleep(Duration::from_millis(50));
    let report = shutdown_within(rt);
    assert_eq!(waker.1.load(Ordering::SeqCst), 1, "woken at shutdown");
    assert_eq!(report.panics.total(), 0, "{report:?}");
    assert!(report.dropped_unrun >= 1, "{report:?}");
    drop(read);
    drop(writer);
}

#[test]
fn shutdown_timeout_detaches_a_shard_stuck_in_user_code_and_reports_it() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// Sets its flag when dropped.
    struct SetOnDrop(Arc<AtomicBool>);
    impl Drop for SetOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    let rt = mailring::Runtime::builder().shards(2).build().unwrap();
    let release = Arc::new(AtomicBool::new(false));
    let stuck = Arc::new(AtomicBool::new(false));
    let finished = Arc::new(AtomicBool::new(false));
    // A task on shard 1 that drops its guard when the shard, once unstuck,
    // cancels it in its own shutdown.
    let guard = SetOnDrop(finished.clone());
    rt.handle()
        .spawn_on(mailring::ShardId::new(1), async move {
            let _guard = guard;
            std::future::pending::<()>().await;
        })
        .detach();
    // Another that blocks shard 1's thread until the test releases it.
    let (r, s) = (release.clone(), stuck.clone());
    rt.handle()
        .spawn_on(mailring::ShardId::new(1), async move {
            s.store(true, Ordering::SeqCst);
            while !r.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
        })
        .detach();
    while !stuck.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let started = Instant::now();
    let report = rt.shutdown_timeout(Duration::from_millis(200));
    // A hang check, not a timing claim: without the limit this never returns.
    assert!(started.elapsed() < Duration::from_secs(10));
    // The stuck shard and shard 0, which waits for it at the barrier after
    // which rings are closed (a ring may not close while a peer can still
    // post to it).
    assert_eq!(report.shards_abandoned, 2, "{report:?}");
    assert!(!report.is_clean());
    // Released, the detached shard finishes the shutdown on its own.
    release.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !finished.load(Ordering::SeqCst) {
        assert!(
            Instant::now() < deadline,
            "the released shard never shut down"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn shutdown_timeout_with_nothing_stuck_is_a_plain_shutdown() {
    let rt = mailring::Runtime::builder().shards(2).build().unwrap();
    rt.spawn(std::future::pending::<()>()).detach();
    rt.block_on(mailring::time::sleep(std::time::Duration::from_millis(2)));
    let report = rt.shutdown_timeout(std::time::Duration::from_secs(30));
    assert_eq!(report.shards_abandoned, 0);
    assert_eq!(report.tasks_cancelled, 1);
}

/// A waker held by a timer whose `Drop` spawns: the timer wheel drops its
/// wakers after the shard's tasks were shut down.
struct SpawnsOnDrop {
    handle: mailring::Handle,
    stealable: bool,
    out: mpsc::Sender<mailring::JoinHandle<()>>,
}

impl std::task::Wake for SpawnsOnDrop {
    fn wake(self: std::sync::Arc<Self>) {}
}

impl Drop for SpawnsOnDrop {
    fn drop(&mut self) {
        let join = if self.stealable {
            self.handle.spawn(async {})
        } else {
            self.handle.spawn_on(S0, async {})
        };
        let _ = self.out.send(join);
    }
}

/// User code that runs late in a shard's shutdown (a waker's `Drop`, when
/// the timer wheel lets its wakers go) and spawns: onto its own shard, the
/// task is cancelled and its handle resolves (it was queued where nothing
/// ran it again, and the handle never resolved); as a stealable task on a
/// runtime of two shards, no panic (the shard's batches were gone, and
/// picking the least loaded shard indexed them).
#[test]
fn a_spawn_from_user_code_late_in_shutdown_resolves_and_does_not_panic() {
    for (shards, stealable) in [(1, false), (2, false), (2, true)] {
        let rt = mailring::Runtime::builder().shards(shards).build().unwrap();
        let (tx, rx) = mpsc::channel();
        let handle = rt.handle().clone();
        rt.handle().spawn_on(S0, async move {
            let waker = std::task::Waker::from(std::sync::Arc::new(SpawnsOnDrop {
                handle,
                stealable,
                out: tx,
            }));
            let mut sleep = Box::pin(mailring::time::sleep(Duration::from_secs(3600)));
            assert!(sleep
                .as_mut()
                .poll(&mut std::task::Context::from_waker(&waker))
                .is_pending());
            // The wheel keeps its clone of the waker; this task's goes.
            std::mem::forget(sleep);
        });
        std::thread::sleep(Duration::from_millis(50));
        let report = shutdown_within(rt);
        assert_eq!(report.panics.total(), 0, "{shards} shards: {report:?}");
        let join = within(&rx, 5, "the spawn from the waker's Drop");
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !join.is_finished() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            join.is_finished(),
            "{shards} shards, stealable {stealable}: the handle never resolved"
        );
    }
}
