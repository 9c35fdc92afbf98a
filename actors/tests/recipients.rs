//! `Recipient<M>`: one message type, any actor type, from any shard or
//! thread.

mod common;

use common::{block_on_thread, Add, Counter, Get, KeyedCounter};
use mailring_actors::{
    Actor, ActorSystem, AskError, Ctx, Handler, Placement, Recipient, Runtime, ShardId,
    SystemConfig, TellError,
};

fn system(shards: usize) -> ActorSystem {
    ActorSystem::start(Runtime::builder().shards(shards)).expect("io_uring available")
}

/// A second actor type that handles `Add` and `Get` (doubling).
#[derive(Actor, Default)]
#[actor(handles(Add, Get))]
struct Doubler {
    total: u64,
}

impl Handler<Add> for Doubler {
    async fn handle(&mut self, m: Add, _cx: &mut Ctx<Self>) {
        self.total += 2 * m.0;
    }
}

impl Handler<Get> for Doubler {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.total
    }
}

#[test]
fn recipients_of_three_actor_types_on_two_shards_take_tells_and_asks() {
    let sys = system(2);
    let counter = sys.spawn_actor(Placement::Pinned(ShardId::new(0)), Counter::default);
    let doubler = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Doubler::default);
    let keyed = sys.keyed::<KeyedCounter>(7);
    let adds: Vec<Recipient<Add>> = vec![
        counter.clone().into(),
        doubler.recipient(),
        keyed.clone().into(),
    ];
    let gets: Vec<Recipient<Get>> = vec![counter.into(), doubler.into(), keyed.clone().into()];
    assert_eq!(adds[2].id(), keyed.id());
    assert_eq!(adds[1].shard(), ShardId::new(1));
    let totals = sys.block_on(async move {
        for r in &adds {
            r.tell(Add(1)).unwrap();
            r.send(Add(2)).await.unwrap();
            r.try_tell(Add(3)).unwrap();
        }
        let mut totals = Vec::new();
        for g in &gets {
            totals.push(g.ask(Get).await.unwrap());
        }
        totals
    });
    assert_eq!(totals, [6, 12, 6]);
    sys.shutdown();
}

#[test]
fn a_recipient_works_from_a_plain_thread() {
    let sys = system(2);
    let doubler = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Doubler::default);
    let (add, get): (Recipient<Add>, Recipient<Get>) = (doubler.recipient(), doubler.recipient());
    let total = std::thread::spawn(move || {
        for i in 0..100 {
            add.tell(Add(i)).unwrap();
        }
        block_on_thread(add.send(Add(1))).unwrap();
        block_on_thread(get.ask(Get)).unwrap()
    })
    .join()
    .unwrap();
    assert_eq!(total, 2 * (4950 + 1));
    sys.shutdown();
}

#[test]
fn a_recipients_send_waits_for_credit_and_try_tell_says_full() {
    let config = SystemConfig {
        cross_shard_window: 4,
        ..SystemConfig::default()
    };
    let sys = ActorSystem::start_with(Runtime::builder().shards(2), config).expect("io_uring");
    let doubler = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Doubler::default);
    let (add, get): (Recipient<Add>, Recipient<Get>) = (doubler.recipient(), doubler.recipient());
    let (full, total) = sys
        .block_on(sys.runtime().spawn_on(ShardId::new(0), async move {
            // One tick: the window (4) is spent by the fifth.
            let mut full = 0;
            for _ in 0..5 {
                if let Err(TellError::Full(_)) = add.try_tell(Add(1)) {
                    full += 1;
                }
            }
            // `send` waits for the credits to come back instead.
            for _ in 0..100 {
                add.send(Add(1)).await.unwrap();
            }
            (full, get.ask(Get).await.unwrap())
        }))
        .unwrap();
    assert_eq!(full, 1);
    assert_eq!(total, 2 * 104);
    sys.shutdown();
}

#[test]
fn a_recipient_of_a_stopped_actor_fails_its_asks() {
    let sys = system(2);
    let counter = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Counter::default);
    let get: Recipient<Get> = counter.recipient();
    counter.stop();
    let outcome = sys.block_on(async move {
        // The stop reached shard 1's inbox before this ask was made.
        get.ask(Get).await
    });
    assert_eq!(outcome, Err(AskError::Stopped));
    sys.shutdown();
}

/// A generic helper over actor types, bounded by `SendsTo` alone.
async fn add_then_get<A>(addr: &mailring_actors::Addr<A>, n: u64) -> u64
where
    A: mailring_actors::SendsTo<Add> + mailring_actors::SendsTo<Get>,
{
    addr.tell(Add(n)).unwrap();
    addr.send(Add(n)).await.unwrap();
    let as_recipient: Recipient<Get> = addr.recipient();
    as_recipient.ask(Get).await.unwrap()
}

#[test]
fn a_generic_helper_bounded_by_sends_to_tells_sends_and_asks() {
    let sys = system(2);
    let c = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Counter::default);
    let d = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Doubler::default);
    let got = sys.block_on(async move { (add_then_get(&c, 1).await, add_then_get(&d, 1).await) });
    assert_eq!(got, (2, 4));
    sys.shutdown();
}
