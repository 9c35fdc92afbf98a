//! Failure paths of the actor layer found by review: each test is bounded
//! (a would-be hang fails by timeout) and goes through the public API.

use std::time::Duration;

mod common;

use common::{Add, Get};
use mailring_actors::mailring::time::{sleep, timeout};
use mailring_actors::{
    Actor, ActorSystem, Ctx, Handler, Hooks, Message, Placement, Runtime, ShardId,
};

const S1: ShardId = ShardId::new(1);

fn system(shards: usize) -> ActorSystem {
    ActorSystem::start(Runtime::builder().shards(shards)).expect("io_uring available")
}

// ---------------------------------------------------------------- timers in a bounded mailbox

/// A bounded actor whose `on_start` runs a 2 ms interval.
#[derive(Actor, Default)]
#[actor(mailbox = 8, handles(Tick, Add, Get), hooks)]
struct TickingBounded {
    ticks: u64,
    total: u64,
}

#[derive(Message)]
struct Tick;

impl Hooks for TickingBounded {
    async fn on_start(&mut self, cx: &mut Ctx<Self>) {
        cx.run_interval(Duration::from_millis(2), || Tick);
    }
}

impl Handler<Tick> for TickingBounded {
    async fn handle(&mut self, _m: Tick, _cx: &mut Ctx<Self>) {
        self.ticks += 1;
    }
}

impl Handler<Add> for TickingBounded {
    async fn handle(&mut self, m: Add, _cx: &mut Ctx<Self>) {
        self.total += m.0;
    }
}

impl Handler<Get> for TickingBounded {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.ticks
    }
}

/// Timer ticks take places in a bounded mailbox like any message: the
/// actor's takes free exactly the places that were taken, so the count
/// never wraps and senders keep getting room.
#[test]
fn timer_ticks_in_a_bounded_mailbox_keep_its_count_right() {
    let sys = system(2);
    let a = sys.spawn_actor(Placement::Pinned(S1), TickingBounded::default);
    let (tried, sent, ticks) = sys.block_on(async move {
        sleep(Duration::from_millis(30)).await;
        let tried = a.try_tell(Add(1)).is_ok();
        let sent = matches!(
            timeout(Duration::from_secs(2), a.send(Add(2))).await,
            Ok(Ok(()))
        );
        let ticks = timeout(Duration::from_secs(2), a.ask(Get)).await;
        (tried, sent, ticks)
    });
    assert!(tried, "try_tell found the mailbox full");
    assert!(sent, "send().await did not finish within 2 s");
    let ticks = ticks
        .expect("the ask did not resolve")
        .expect("the ask failed");
    assert!(ticks >= 3, "the actor counted {ticks} ticks in 30 ms");
    sys.shutdown();
}
