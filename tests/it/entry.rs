//! Entry points: `#[mailring::main]`, `mailring::run`, runtime knobs.

use std::rc::Rc;

use mailring::{ExternalWake, ExternalWakeMode, IdlePolicy, ShardId};

#[mailring::main(shards = 2, ring_entries = 64)]
async fn macro_main(handle: mailring::Handle) -> (usize, Option<ShardId>) {
    // The body may hold `!Send` state: it runs on shard 0 only.
    let local = Rc::new(1);
    mailring::yield_now().await;
    (handle.shards() + *local - 1, mailring::current_shard())
}

#[test]
fn main_attribute_runs_the_body_on_shard_zero() {
    assert_eq!(macro_main(), (2, Some(ShardId::new(0))));
}

#[test]
fn run_builds_runs_and_shuts_down() {
    let out = mailring::run(|handle| async move {
        let h = handle.spawn(async { 5 });
        h.await.unwrap() + 1
    })
    .unwrap();
    assert_eq!(out, 6);
}

#[test]
fn both_external_wake_modes_deliver() {
    for mode in [ExternalWake::EventFd, ExternalWake::SendMsgRing] {
        let rt = mailring::Runtime::builder()
            .shards(2)
            .external_wake(mode)
            .idle_policy(IdlePolicy::Block)
            .build()
            .unwrap();
        let stats = rt.stats();
        if mode == ExternalWake::EventFd {
            assert_eq!(stats.external_wake, ExternalWakeMode::EventFd);
        }
        // Let both shards fall asleep, then wake them from this thread many times.
        for i in 0..200u64 {
            let h = rt
                .handle()
                .spawn_on(ShardId::new((i % 2) as usize), async move { i });
            let rt2 = mailring::Runtime::builder().shards(1).build().unwrap();
            assert_eq!(rt2.block_on(async move { h.await.unwrap() }), i);
        }
        assert!(rt.stats().external_wakes > 0, "{mode:?}");
    }
}

#[test]
fn pinned_threads_run_on_their_cpu() {
    let rt = mailring::Runtime::builder()
        .shards(2)
        .pin_threads(true)
        .build()
        .unwrap();
    let cpus = std::thread::available_parallelism().unwrap().get();
    let h = rt.handle().spawn_on(ShardId::new(1), async {
        // SAFETY: sched_getcpu takes no arguments and touches no memory of ours.
        unsafe { libc::sched_getcpu() }
    });
    let cpu = rt.block_on(async move { h.await.unwrap() });
    assert_eq!(cpu as usize, 1 % cpus);
}

#[test]
fn dropping_the_runtime_inside_a_task_does_not_deadlock() {
    let rt = mailring::Runtime::builder().shards(1).build().unwrap();
    let slot = std::sync::Arc::new(std::sync::Mutex::new(Some(rt)));
    let handle = slot.lock().unwrap().as_ref().unwrap().handle().clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let s2 = slot.clone();
    handle.spawn_on(ShardId::new(0), async move {
        let rt = s2.lock().unwrap().take();
        drop(rt); // shuts down from another thread once this task returns
        tx.send(()).unwrap();
    });
    rx.recv_timeout(std::time::Duration::from_secs(10))
        .expect("task ran");
}
