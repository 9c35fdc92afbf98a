//! Senders waiting on a spent cross-shard window, with the shard that
//! holds it stuck for a while.

use std::time::Duration;

use mailring_actors::mailring;
use mailring_actors::{
    Actor, ActorSystem, Ctx, Handler, Message, Placement, Runtime, ShardId, SystemConfig,
};

#[derive(Message)]
struct Note;

#[derive(Actor, Default)]
#[actor(handles(Note))]
struct Sink;

impl Handler<Note> for Sink {
    async fn handle(&mut self, _m: Note, _cx: &mut Ctx<Self>) {}
}

/// Polls its future, counting the polls.
struct Counted<F> {
    polls: std::sync::Arc<std::sync::atomic::AtomicU64>,
    inner: std::pin::Pin<Box<F>>,
}

impl<F: std::future::Future> std::future::Future for Counted<F> {
    type Output = F::Output;
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        self.polls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.as_mut().poll(cx)
    }
}

/// Thousands of live senders wait on a spent window: each is polled a
/// few times, not over and over while the window stays spent (a sweep of
/// the waiters' list, tried once to drop the wakers of sends given up,
/// woke the live ones, which listed themselves again and set off the
/// next sweep: the shard spun).
#[test]
fn thousands_of_senders_waiting_on_a_spent_window_are_not_woken_over_and_over() {
    const LIVE: u64 = 3_000;
    let config = SystemConfig {
        cross_shard_window: 4,
        ..SystemConfig::default()
    };
    let sys =
        ActorSystem::start_with(Runtime::builder().shards(2), config).expect("io_uring available");
    let sink = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Sink::default);
    let started = std::sync::Arc::new(std::sync::Barrier::new(2));
    let s = started.clone();
    drop(sys.runtime().spawn_on(ShardId::new(1), async move {
        s.wait();
        std::thread::sleep(Duration::from_millis(500));
    }));
    started.wait();
    let rt = sys.runtime().clone();
    let polls = sys.block_on(async move {
        rt.spawn_on(ShardId::new(0), async move {
            for _ in 0..4 {
                sink.send(Note).await.expect("within the window");
            }
            let polls = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
            let mut tasks = Vec::new();
            for _ in 0..LIVE {
                let sink = sink.clone();
                let counted = Counted {
                    polls: polls.clone(),
                    inner: Box::pin(async move { sink.send(Note).await }),
                };
                tasks.push(mailring::spawn_local(counted));
            }
            // While shard 1 is held: the senders wait.
            mailring::time::sleep(Duration::from_millis(300)).await;
            let waiting_polls = polls.load(std::sync::atomic::Ordering::Relaxed);
            for t in tasks {
                let _ = t.await;
            }
            waiting_polls
        })
        .await
        .unwrap()
    });
    sys.shutdown();
    // Each sender polled a few times (its first poll, a sweep or two).
    assert!(
        polls < 5 * LIVE,
        "{polls} polls of {LIVE} waiting senders in 300 ms"
    );
}
