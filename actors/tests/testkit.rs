//! The test kit: a moved clock drives idle passivation and ask deadlines;
//! assertions on where actors run.

use std::time::Duration;

use mailring_actors::testkit::TestSystem;
use mailring_actors::{Actor, AskError, Ctx, Handler, Message, Placement, ShardId};

#[derive(Actor, Default)]
#[actor(key = u32, activate = Session::new, idle_timeout_ms = 600000, handles(Touch, Stall))]
struct Session {
    touches: u32,
}

impl Session {
    fn new(_k: &u32) -> Self {
        Session::default()
    }
}

#[derive(Message)]
#[message(reply = u32)]
struct Touch;

#[derive(Message)]
struct Stall;

impl Handler<Touch> for Session {
    async fn handle(&mut self, _m: Touch, _cx: &mut Ctx<Self>) -> u32 {
        self.touches += 1;
        self.touches
    }
}

impl Handler<Stall> for Session {
    async fn handle(&mut self, _m: Stall, _cx: &mut Ctx<Self>) {
        mailring_actors::mailring::time::sleep(Duration::from_secs(7200)).await;
    }
}

#[test]
fn moved_clock_passivates_idle_actors_without_waiting() {
    let kit = TestSystem::start(2);
    let s = kit.keyed::<Session>(3);
    let s2 = s.clone();
    assert_eq!(kit.block_on(async move { s2.ask(Touch).await }), Ok(1));
    assert_eq!(kit.active_on(&s), Some(s.shard()), "active where routed");
    kit.advance(Duration::from_secs(300));
    assert_eq!(kit.active_on(&s), Some(s.shard()), "not idle long enough");
    kit.advance(Duration::from_secs(301));
    assert_eq!(kit.active_on(&s), None, "passivated after 10 idle minutes");
    let s2 = s.clone();
    assert_eq!(
        kit.block_on(async move { s2.ask(Touch).await }),
        Ok(1),
        "re-activated with fresh state"
    );
    let stats = kit.stats().by_type("Session").unwrap();
    assert_eq!((stats.activations, stats.passivations), (2, 1));
}

#[test]
fn moved_clock_expires_ask_deadlines() {
    let kit = TestSystem::start(2);
    let s = kit.keyed::<Session>(4);
    let rt = kit.runtime().clone();
    let s2 = s.clone();
    let asked = kit.runtime().spawn_on(ShardId::new(0), async move {
        s2.tell(Stall).unwrap();
        s2.ask(Touch).timeout(Duration::from_secs(60)).await
    });
    kit.settle();
    rt.advance_clock(Duration::from_secs(61));
    let out = kit.block_on(async move { asked.await.unwrap() });
    assert_eq!(out, Err(AskError::Timeout));
}

#[derive(Actor, Default)]
#[actor(handles(Touch))]
struct Pinned;

impl Handler<Touch> for Pinned {
    async fn handle(&mut self, _m: Touch, _cx: &mut Ctx<Self>) -> u32 {
        0
    }
}

#[test]
fn active_on_reports_the_shard_an_actor_runs_on() {
    let kit = TestSystem::start(3);
    for shard in 0..3 {
        let a = kit.spawn_actor(Placement::Pinned(ShardId::new(shard)), Pinned::default);
        assert_eq!(kit.active_on(&a), Some(ShardId::new(shard)));
        a.stop();
        assert_eq!(kit.active_on(&a), None);
    }
}
