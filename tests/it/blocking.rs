//! The blocking pool (`spawn_blocking`) at its failure edges: jobs that
//! outlive shutdown, outputs and captures whose `Drop` panics.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use mailring::JoinHandle;

/// A value whose `Drop` panics (after telling `dropped`, if given).
struct PanicOnDrop(Option<mpsc::Sender<()>>);

impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
        panic!("PanicOnDrop dropped");
    }
}

fn pool_of_one() -> mailring::Runtime {
    mailring::Runtime::builder()
        .shards(1)
        .blocking_threads(1)
        .build()
        .expect("io_uring runtime")
}

/// Awaits `h` on a runtime of its own, on a thread of its own: `None` when
/// it has not resolved within `limit`.
fn join_within<T: Send + 'static>(
    h: JoinHandle<T>,
    limit: Duration,
) -> Option<Result<T, mailring::JoinError>> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let outer = mailring::Runtime::builder()
            .shards(1)
            .build()
            .expect("io_uring runtime");
        let _ = tx.send(outer.block_on(h));
    });
    rx.recv_timeout(limit).ok()
}

/// A blocking job that never ends by itself used to hold `Runtime::shutdown`
/// for as long as it ran (the pool joined its threads without bound).
#[test]
fn shutdown_abandons_a_blocking_job_still_running_after_the_grace_period() {
    let rt = pool_of_one();
    let (started_tx, started_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let h = rt.handle().spawn_blocking(move || {
        let _ = started_tx.send(());
        let _ = release_rx.recv_timeout(Duration::from_secs(30));
        5
    });
    started_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the blocking job never started");
    let (done_tx, done_rx) = mpsc::channel();
    let shutting = thread::spawn(move || {
        let _ = done_tx.send(rt.shutdown());
    });
    let report = done_rx.recv_timeout(Duration::from_secs(10));
    // Release the job whatever happened, so nothing outlives the test.
    let _ = release_tx.send(());
    let report = report.expect("shutdown waited on a running blocking job");
    shutting.join().unwrap();
    assert_eq!(report.blocking_abandoned, 1, "{report:?}");
    assert!(!report.is_clean());
    // The detached thread finishes the job; its handle resolves with the output.
    let out =
        join_within(h, Duration::from_secs(10)).expect("the abandoned job's handle never resolved");
    assert_eq!(out.unwrap(), 5);
}

/// A detached blocking job whose output panics when dropped used to kill its
/// pool thread without the pool noticing: after `blocking_threads` of them no
/// job ever ran again.
#[test]
fn blocking_pool_survives_detached_outputs_that_panic_on_drop() {
    let rt = pool_of_one();
    let handle = rt.handle().clone();
    for _ in 0..3 {
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let h = handle.spawn_blocking(move || {
            let _ = go_rx.recv_timeout(Duration::from_secs(10));
            PanicOnDrop(None)
        });
        // Detached before the job ends, so the pool thread drops the output.
        drop(h);
        let _ = go_tx.send(());
    }
    let (ran_tx, ran_rx) = mpsc::channel();
    let _ran = handle.spawn_blocking(move || {
        let _ = ran_tx.send(7);
    });
    assert_eq!(
        ran_rx.recv_timeout(Duration::from_secs(10)),
        Ok(7),
        "no blocking job runs after the pool threads died"
    );
    let report = rt.shutdown();
    assert_eq!(report.panics.drop, 3, "{report:?}");
}

/// A queued job dropped unrun at shutdown whose capture panics on drop used
/// to stop the pool's shutdown (and escape `Runtime::shutdown`): the jobs
/// queued behind it never resolved.
#[test]
fn blocking_shutdown_survives_a_queued_job_whose_capture_panics_on_drop() {
    let rt = pool_of_one();
    let handle = rt.handle().clone();
    let (started_tx, started_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    // Occupies the one pool thread, so the next two stay queued.
    let busy = handle.spawn_blocking(move || {
        let _ = started_tx.send(());
        let _ = release_rx.recv_timeout(Duration::from_secs(30));
    });
    started_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the blocking job never started");
    let (dropped_tx, dropped_rx) = mpsc::channel();
    let capture = PanicOnDrop(Some(dropped_tx));
    let bad = handle.spawn_blocking(move || drop(capture));
    let other = handle.spawn_blocking(|| 3);
    let (done_tx, done_rx) = mpsc::channel();
    let shutting = thread::spawn(move || {
        let _ = done_tx.send(rt.shutdown());
    });
    // Let the running job end once shutdown has dropped the queued ones.
    let _ = dropped_rx.recv_timeout(Duration::from_secs(10));
    let _ = release_tx.send(());
    let report = done_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("shutdown did not return");
    let _ = shutting.join();
    let other = join_within(other, Duration::from_secs(10))
        .expect("a job queued behind the panicking one never resolved");
    assert!(other.unwrap_err().is_cancelled());
    let bad = join_within(bad, Duration::from_secs(10)).expect("the panicking job never resolved");
    assert!(bad.unwrap_err().is_cancelled());
    join_within(busy, Duration::from_secs(10))
        .expect("the running job never resolved")
        .unwrap();
    assert_eq!(report.panics.drop, 1, "{report:?}");
}
