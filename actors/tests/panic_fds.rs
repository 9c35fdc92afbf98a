//! Panic injection in the actor layer, then shutdown: a handler, a
//! lifecycle hook, a factory and a dead letter's `Drop` each panic once,
//! actors keep working, the shutdown report counts each, and afterwards the
//! process has exactly the descriptors it had before.
//!
//! A binary of its own without the test harness (`harness = false`), so
//! no other test opens or closes descriptors while this one counts them.

use std::time::Duration;

use mailring_actors::{
    Actor, ActorSystem, Ctx, Handler, Hooks, Message, Placement, Runtime, ShardId,
};

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

#[derive(Actor, Default)]
#[actor(handles(Boom, Count, Grenade))]
struct Target {
    n: u64,
}

#[derive(Message)]
#[message(reply = u64)]
struct Boom;

#[derive(Message)]
#[message(reply = u64)]
struct Count;

#[derive(Message)]
struct Grenade;

impl Drop for Grenade {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            panic!("dead letter drop");
        }
    }
}

impl Handler<Boom> for Target {
    async fn handle(&mut self, _m: Boom, _cx: &mut Ctx<Self>) -> u64 {
        panic!("handler");
    }
}

impl Handler<Count> for Target {
    async fn handle(&mut self, _m: Count, _cx: &mut Ctx<Self>) -> u64 {
        self.n += 1;
        self.n
    }
}

impl Handler<Grenade> for Target {
    async fn handle(&mut self, m: Grenade, _cx: &mut Ctx<Self>) {
        std::mem::forget(m);
    }
}

#[derive(Actor, Default)]
#[actor(handles(Count), hooks)]
struct BadStart;

impl Hooks for BadStart {
    async fn on_start(&mut self, _cx: &mut Ctx<Self>) {
        panic!("on_start");
    }
}

impl Handler<Count> for BadStart {
    async fn handle(&mut self, _m: Count, _cx: &mut Ctx<Self>) -> u64 {
        0
    }
}

fn main() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current().name() == Some("main") {
            default_hook(info);
        }
    }));
    let before = open_fds();
    let sys = ActorSystem::start(Runtime::builder().shards(2)).expect("io_uring");
    let (s0, s1) = (ShardId::new(0), ShardId::new(1));
    let target = sys.spawn_actor(Placement::Pinned(s1), Target::default);
    let dead = sys.spawn_actor(Placement::Pinned(s1), Target::default);
    let bad_start = sys.spawn_actor(Placement::Pinned(s0), BadStart::default);
    let bad_factory = sys.spawn_actor(Placement::Pinned(s1), || -> Target { panic!("factory") });
    let counted = sys.block_on(async move {
        let limit = Duration::from_secs(5);
        let t = mailring_actors::mailring::time::timeout;
        assert!(t(limit, target.ask(Boom)).await.unwrap().is_err());
        assert!(t(limit, bad_start.ask(Count)).await.unwrap().is_err());
        assert!(t(limit, bad_factory.ask(Count)).await.unwrap().is_err());
        dead.stop();
        while dead.ask(Count).await.is_ok() {
            mailring_actors::mailring::time::sleep(Duration::from_millis(1)).await;
        }
        let _ = dead.tell(Grenade);
        // The actor that panicked was restarted and still answers.
        t(limit, target.ask(Count)).await.unwrap().unwrap()
    });
    assert_eq!(counted, 1);
    let report = sys.shutdown();
    let p = report.runtime.panics;
    // `on_start` panics again on each restart supervision grants.
    assert!(p.lifecycle_hook >= 1, "{report:?}");
    assert_eq!((p.handler, p.factory, p.drop), (1, 1, 1), "{report:?}");
    assert_eq!(report.runtime.ops_leaked, 0);
    assert_eq!(open_fds(), before, "descriptors after shutdown");
    println!("panic_fds: 1 passed; 0 failed");
}
