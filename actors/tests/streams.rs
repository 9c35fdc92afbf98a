//! Streams attached to actors: order, end, backpressure, and the end of the
//! activation.

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use mailring_actors::mailring::sync::Slot;
use mailring_actors::mailring::time::sleep;
use mailring_actors::{
    Actor, ActorSystem, Ctx, Handler, Message, Placement, Runtime, ShardId, Stream, StreamMessage,
    STREAM_WINDOW,
};

fn system() -> ActorSystem {
    ActorSystem::start(Runtime::builder().shards(2)).expect("io_uring available")
}

/// 0, 1, 2, ... up to `limit` (`None`: forever), counting its polls and
/// noting its drop.
struct Numbers {
    next: u64,
    limit: Option<u64>,
    polls: Arc<AtomicUsize>,
    dropped: Arc<AtomicBool>,
}

impl Stream for Numbers {
    type Item = u64;
    fn poll_next(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<u64>> {
        self.polls.fetch_add(1, Ordering::SeqCst);
        let n = self.next;
        self.next += 1;
        Poll::Ready(self.limit.is_none_or(|l| n < l).then_some(n))
    }
}

impl Drop for Numbers {
    fn drop(&mut self) {
        self.dropped.store(true, Ordering::SeqCst);
    }
}

/// Attaches the stream it is given.
#[derive(Message)]
struct Attach(Option<Numbers>);

// `Numbers` is `Send` (atomics only), so `Attach` can cross shards.

/// Holds the handler until the slot is filled.
#[derive(Message)]
struct Hold(Arc<Slot<()>>);

#[derive(Message)]
#[message(reply = (Vec<u64>, bool))]
struct Got;

#[derive(Actor, Default)]
#[actor(handles(Attach, Hold, Got, StreamMessage<u64>))]
struct Sink {
    items: Vec<u64>,
    ended: bool,
}

impl Handler<Attach> for Sink {
    async fn handle(&mut self, mut m: Attach, cx: &mut Ctx<Self>) {
        cx.attach_stream(m.0.take().expect("a stream"));
    }
}

impl Handler<Hold> for Sink {
    async fn handle(&mut self, m: Hold, _cx: &mut Ctx<Self>) {
        let _ = poll_fn(|cx| m.0.poll_take(cx)).await;
    }
}

impl Handler<Got> for Sink {
    async fn handle(&mut self, _m: Got, _cx: &mut Ctx<Self>) -> (Vec<u64>, bool) {
        (self.items.clone(), self.ended)
    }
}

impl Handler<StreamMessage<u64>> for Sink {
    async fn handle(&mut self, m: StreamMessage<u64>, _cx: &mut Ctx<Self>) {
        match m {
            StreamMessage::Item(n) => self.items.push(n),
            StreamMessage::End => self.ended = true,
        }
    }
}

fn numbers(limit: Option<u64>) -> (Numbers, Arc<AtomicUsize>, Arc<AtomicBool>) {
    let polls = Arc::new(AtomicUsize::new(0));
    let dropped = Arc::new(AtomicBool::new(false));
    let s = Numbers {
        next: 0,
        limit,
        polls: polls.clone(),
        dropped: dropped.clone(),
    };
    (s, polls, dropped)
}

/// Waits (at most 5 s) until the stream was polled `n` times.
fn wait_for_polls(polls: &AtomicUsize, n: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while polls.load(Ordering::SeqCst) < n {
        assert!(
            std::time::Instant::now() < deadline,
            "{} polls",
            polls.load(Ordering::SeqCst)
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn every_item_arrives_in_order_then_the_end() {
    let sys = system();
    let sink = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Sink::default);
    let (s, _, dropped) = numbers(Some(1000));
    sink.tell(Attach(Some(s))).unwrap();
    let (items, ended) = sys.block_on(async move {
        loop {
            let got = sink.ask(Got).await.unwrap();
            if got.1 {
                return got;
            }
            sleep(Duration::from_millis(1)).await;
        }
    });
    assert_eq!(items, (0..1000).collect::<Vec<_>>());
    assert!(ended);
    assert!(dropped.load(Ordering::SeqCst), "dropped once ended");
    sys.shutdown();
}

#[test]
fn an_endless_stream_waits_for_a_busy_actor() {
    let sys = system();
    let sink = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Sink::default);
    let gate = Arc::new(Slot::new());
    sink.tell(Hold(gate.clone())).unwrap();
    let (s, polls, _) = numbers(None);
    sink.tell(Attach(Some(s))).unwrap();
    // `Attach` is queued behind `Hold`: release once, so it runs, then
    // hold the actor again while the stream fills its mailbox.
    let gate2 = Arc::new(Slot::new());
    sink.tell(Hold(gate2.clone())).unwrap();
    gate.send(()).unwrap();
    wait_for_polls(&polls, STREAM_WINDOW);
    std::thread::sleep(Duration::from_millis(20));
    let held = polls.load(Ordering::SeqCst);
    assert!(
        held <= STREAM_WINDOW + 2,
        "{held} polls while the actor was held"
    );
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        polls.load(Ordering::SeqCst),
        held,
        "not polled while the mailbox is full"
    );
    gate2.send(()).unwrap();
    // Released: the stream goes on.
    wait_for_polls(&polls, 10 * STREAM_WINDOW);
    sys.shutdown();
}

#[test]
fn a_stream_stops_with_its_actor() {
    let sys = system();
    let sink = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Sink::default);
    let (s, polls, dropped) = numbers(None);
    sink.tell(Attach(Some(s))).unwrap();
    wait_for_polls(&polls, STREAM_WINDOW);
    sink.stop();
    let end = sys.block_on(async move { sink.stopped().await });
    assert_eq!(end.reason, mailring_actors::StopReason::Stopped);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !dropped.load(Ordering::SeqCst) {
        assert!(
            std::time::Instant::now() < deadline,
            "the stream was dropped"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let after = polls.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(10));
    assert_eq!(polls.load(Ordering::SeqCst), after, "never polled again");
    sys.shutdown();
}
