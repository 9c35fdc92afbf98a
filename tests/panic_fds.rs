//! Panic injection, then shutdown: every kind of user callback a shard runs
//! panics once, the shards keep working, every panic is reported, and after
//! shutdown the process has exactly the descriptors it had before.
//!
//! A binary of its own without the test harness (`harness = false`): one
//! test, one thread of its own, so no other test opens or closes
//! descriptors while this one counts them.

use std::sync::{Arc, Mutex};
use std::task::{Context, Wake, Waker};
use std::time::Duration;

use mailring::panic::PanicEvent;
use mailring::{CallbackKind, Runtime, ShardId, ShardJob};

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

struct PanickingJob;

impl ShardJob for PanickingJob {
    fn run(self: Box<Self>) {
        panic!("job");
    }
}

struct PanickingWaker;

impl Wake for PanickingWaker {
    fn wake(self: Arc<Self>) {
        panic!("waker");
    }
}

struct PanicOnDrop;

impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            panic!("drop");
        }
    }
}

fn main() {
    // The injected panics (on the shards) stay quiet; this thread's
    // assertions still print.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current().name() == Some("main") {
            default_hook(info);
        }
    }));
    let before = open_fds();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let rt = Runtime::builder()
        .shards(2)
        .on_panic(move |e: &PanicEvent<'_>| log.lock().unwrap().push(e.kind))
        .build()
        .expect("io_uring runtime");
    let h = rt.handle().clone();
    let (s0, s1) = (ShardId::new(0), ShardId::new(1));
    h.run_on(s1, || panic!("run_on"));
    h.send_job(s0, Box::new(PanickingJob));
    let h2 = h.clone();
    let sum = rt.block_on_local(move || async move {
        // A tick-end callback.
        assert!(mailring::defer_to_tick_end(|| panic!("tick end")).is_ok());
        // A waker a timer wakes.
        let waker = Waker::from(Arc::new(PanickingWaker));
        let mut sleep = Box::pin(mailring::time::sleep(Duration::from_millis(1)));
        assert!(
            std::future::Future::poll(sleep.as_mut(), &mut Context::from_waker(&waker))
                .is_pending()
        );
        mailring::time::sleep(Duration::from_millis(5)).await;
        drop(sleep);
        // A task's poll, and a detached task's output dropped on its shard.
        let task = h2.spawn_on(s1, async { panic!("task") });
        assert!(task.await.unwrap_err().is_panic());
        h2.spawn_on(s1, async { PanicOnDrop }).detach();
        // I/O in flight on both shards through it all.
        let (a, b) = mailring::net::UnixStream::pair().unwrap();
        a.send_all(b"x".to_vec()).await.0.unwrap();
        let (n, _) = b.recv(vec![0u8; 8]).await;
        let left = h2.spawn_on(s1, async { 40 }).await.unwrap();
        left + n.unwrap() as u64 + 1
    });
    assert_eq!(sum, 42, "both shards still work");
    // The detached output's drop runs on shard 1 after the task finished.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while seen.lock().unwrap().len() < 6 {
        assert!(
            std::time::Instant::now() < deadline,
            "panics reported: {:?}",
            seen.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let report = rt.shutdown();
    let p = report.panics;
    assert_eq!(
        (p.run_on, p.job, p.tick_end, p.waker, p.task, p.drop),
        (1, 1, 1, 1, 1, 1),
        "{report:?}"
    );
    assert_eq!(report.ops_leaked, 0);
    let mut kinds = seen.lock().unwrap().clone();
    kinds.sort_by_key(|k| format!("{k:?}"));
    kinds.dedup();
    for kind in [
        CallbackKind::RunOn,
        CallbackKind::Job,
        CallbackKind::TickEnd,
        CallbackKind::Waker,
        CallbackKind::Task,
        CallbackKind::Drop,
    ] {
        assert!(kinds.contains(&kind), "the hook saw no {kind:?}: {kinds:?}");
    }
    assert_eq!(open_fds(), before, "descriptors after shutdown");
    println!("panic_fds: 1 passed; 0 failed");
}
