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
