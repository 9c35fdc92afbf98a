//! With the `tracing` feature, every handled message runs in an
//! `actor.message` span. Run: `cargo test -p mailring-actors --features tracing --test tracing`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use mailring_actors::{Actor, ActorSystem, Ctx, Handler, Message, Placement, Runtime, ShardId};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// Counts `actor.message` spans created on any thread.
struct SpanCounter(Arc<AtomicUsize>);

impl Subscriber for SpanCounter {
    fn enabled(&self, _m: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &Attributes<'_>) -> Id {
        if span.metadata().name() == "actor.message" {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        Id::from_u64(1)
    }
    fn record(&self, _span: &Id, _values: &Record<'_>) {}
    fn record_follows_from(&self, _span: &Id, _follows: &Id) {}
    fn event(&self, _event: &Event<'_>) {}
    fn enter(&self, _span: &Id) {}
    fn exit(&self, _span: &Id) {}
}

#[derive(Actor, Default)]
#[actor(handles(Ping))]
struct Echo;

#[derive(Message)]
#[message(reply = u8)]
struct Ping;

impl Handler<Ping> for Echo {
    async fn handle(&mut self, _m: Ping, _cx: &mut Ctx<Self>) -> u8 {
        1
    }
}

#[test]
fn every_message_gets_a_span() {
    let count = Arc::new(AtomicUsize::new(0));
    tracing::subscriber::set_global_default(SpanCounter(count.clone())).unwrap();
    let sys = ActorSystem::start(Runtime::builder().shards(2)).unwrap();
    let e = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Echo::default);
    let n = sys.block_on(async move {
        let mut n = 0;
        for _ in 0..5 {
            n += e.ask(Ping).await.unwrap();
        }
        n
    });
    assert_eq!(n, 5);
    assert_eq!(count.load(Ordering::SeqCst), 5);
    sys.shutdown();
}
