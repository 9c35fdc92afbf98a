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

/// Keeps shard 1 busy for `time` (a handler that never yields), from
/// when this returns.
fn hold_shard_one(sys: &ActorSystem, time: Duration) {
    let started = std::sync::Arc::new(std::sync::Barrier::new(2));
    let s = started.clone();
    drop(sys.runtime().spawn_on(ShardId::new(1), async move {
        s.wait();
        std::thread::sleep(time);
    }));
    started.wait();
}

/// A system whose cross-shard window is 4 messages, with a `Sink` on
/// shard 1, which is held for `time`.
fn window_of_four_to_a_held_shard(time: Duration) -> (ActorSystem, mailring_actors::Addr<Sink>) {
    let config = SystemConfig {
        cross_shard_window: 4,
        ..SystemConfig::default()
    };
    let sys =
        ActorSystem::start_with(Runtime::builder().shards(2), config).expect("io_uring available");
    let sink = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Sink::default);
    hold_shard_one(&sys, time);
    (sys, sink)
}

/// Thousands of live senders wait on a spent window: each is polled a
/// few times, not over and over while the window stays spent (a sweep of
/// the waiters' list, tried once to drop the wakers of sends given up,
/// woke the live ones, which listed themselves again and set off the
/// next sweep: the shard spun).
#[test]
fn thousands_of_senders_waiting_on_a_spent_window_are_not_woken_over_and_over() {
    const LIVE: u64 = 3_000;
    let (sys, sink) = window_of_four_to_a_held_shard(Duration::from_millis(500));
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

/// A waker that counts its wakes; its `Arc`'s count says who holds it.
struct Spy(std::sync::atomic::AtomicU64);

impl std::task::Wake for Spy {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Polls `fut` once with a waker of its own; whether it was pending, and
/// how many references to that waker are held elsewhere once `fut` is
/// dropped.
fn poll_once_then_drop<F: std::future::Future>(fut: F) -> (bool, usize) {
    let spy = std::sync::Arc::new(Spy(Default::default()));
    let waker = std::task::Waker::from(spy.clone());
    let mut cx = std::task::Context::from_waker(&waker);
    let pending = {
        let mut fut = std::pin::pin!(fut);
        fut.as_mut().poll(&mut cx).is_pending()
    };
    drop(waker);
    (pending, std::sync::Arc::strong_count(&spy) - 1)
}

/// A `send` given up (dropped) while the window is spent takes its waker
/// back: the window's waiters and the credit counter's hold nothing of
/// it (they held its task until the credits came, which for a stuck
/// receiver is never: 20,000 sends given up under a timeout held 11 MB).
#[test]
fn a_send_given_up_on_a_spent_window_holds_no_waker() {
    let (sys, sink) = window_of_four_to_a_held_shard(Duration::from_millis(300));
    let rt = sys.runtime().clone();
    let held = sys.block_on(async move {
        rt.spawn_on(ShardId::new(0), async move {
            for _ in 0..4 {
                sink.send(Note).await.expect("within the window");
            }
            let mut held = Vec::new();
            for _ in 0..3 {
                let (pending, holders) = poll_once_then_drop(sink.send(Note));
                assert!(pending, "the window is spent: the send waits");
                held.push(holders);
                // A tick between them: credits could not have come.
                mailring::yield_now().await;
            }
            held
        })
        .await
        .unwrap()
    });
    sys.shutdown();
    assert_eq!(held, vec![0, 0, 0], "references to given-up sends' wakers");
}

#[derive(Actor, Default)]
#[actor(mailbox = 2, handles(Note))]
struct Narrow;

impl Handler<Note> for Narrow {
    async fn handle(&mut self, _m: Note, _cx: &mut Ctx<Self>) {}
}

/// A `send` given up at a full bounded mailbox takes its waker back: the
/// mailbox's waiters hold nothing of it, from this shard or another.
#[test]
fn a_send_given_up_at_a_full_bounded_mailbox_holds_no_waker() {
    let sys = ActorSystem::start(Runtime::builder().shards(2)).expect("io_uring available");
    let narrow = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Narrow::default);
    hold_shard_one(&sys, Duration::from_millis(300));
    let rt = sys.runtime().clone();
    let n = narrow.clone();
    let held = sys.block_on(async move {
        rt.spawn_on(ShardId::new(0), async move {
            for _ in 0..2 {
                n.send(Note).await.expect("room for two");
            }
            let mut held = Vec::new();
            for _ in 0..3 {
                let (pending, holders) = poll_once_then_drop(n.send(Note));
                assert!(pending, "the mailbox is full: the send waits");
                held.push(holders);
            }
            held
        })
        .await
        .unwrap()
    });
    // And from a thread outside the runtime.
    let (pending, outside) = poll_once_then_drop(narrow.send(Note));
    sys.shutdown();
    assert_eq!(held, vec![0, 0, 0], "references to given-up sends' wakers");
    if pending {
        assert_eq!(outside, 0, "a given-up send from outside the runtime");
    }
}
