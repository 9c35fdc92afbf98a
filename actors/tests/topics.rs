//! Publish/subscribe: `Topic<M>` across shards, from shards and threads,
//! with subscribers that stop, passivate or unsubscribe.

use std::time::Duration;

use mailring_actors::{
    Actor, ActorSystem, Addr, Ctx, Handler, Message, Placement, Recipient, Runtime, ShardId, Topic,
};

fn system(shards: usize) -> ActorSystem {
    ActorSystem::start(Runtime::builder().shards(shards)).expect("io_uring available")
}

#[derive(Message, Clone, Debug)]
struct Tick(u64);

#[derive(Message)]
#[message(reply = Vec<u64>)]
struct Seen;

macro_rules! listener {
    ($t:ident) => {
        impl Handler<Tick> for $t {
            async fn handle(&mut self, m: Tick, _cx: &mut Ctx<Self>) {
                self.seen.push(m.0);
            }
        }
        impl Handler<Seen> for $t {
            async fn handle(&mut self, _m: Seen, _cx: &mut Ctx<Self>) -> Vec<u64> {
                self.seen.clone()
            }
        }
    };
}

#[derive(Actor, Default)]
#[actor(handles(Tick, Seen))]
struct Listener {
    seen: Vec<u64>,
}
listener!(Listener);

/// A keyed listener that passivates after 20 ms idle.
#[derive(Actor)]
#[actor(key = u32, activate = KeyedListener::new, handles(Tick, Seen), idle_timeout_ms = 20)]
struct KeyedListener {
    seen: Vec<u64>,
}
listener!(KeyedListener);

impl KeyedListener {
    fn new(_key: &u32) -> Self {
        KeyedListener { seen: Vec::new() }
    }
}

fn seen_by(sys: &ActorSystem, listeners: &[Addr<Listener>]) -> Vec<Vec<u64>> {
    let listeners = listeners.to_vec();
    sys.block_on(async move {
        let mut all = Vec::new();
        for l in &listeners {
            all.push(l.ask(Seen).await.unwrap());
        }
        all
    })
}

#[test]
fn every_subscriber_on_every_shard_gets_every_message_in_order() {
    let sys = system(3);
    let topic: Topic<Tick> = sys.handle().topic();
    let listeners: Vec<_> = (0..30)
        .map(|_| sys.spawn_actor(Placement::RoundRobin, Listener::default))
        .collect();
    for l in &listeners {
        assert!(topic.subscribe(l.clone()));
    }
    assert!(
        !topic.subscribe(listeners[0].recipient()),
        "subscribed once"
    );
    assert_eq!(topic.subscriber_count(), 30);
    // From this (outside) thread, then from a task on each shard in turn.
    for v in 0..10 {
        topic.publish(Tick(v));
    }
    for shard in 0..3 {
        let t = topic.clone();
        sys.block_on(sys.runtime().spawn_on(ShardId::new(shard), async move {
            for v in 0..10 {
                t.publish(Tick(10 + 10 * shard as u64 + v));
            }
        }))
        .unwrap();
    }
    let expected: Vec<u64> = (0..40).collect();
    for seen in seen_by(&sys, &listeners) {
        assert_eq!(seen, expected);
    }
    sys.shutdown();
}

#[test]
fn a_publish_does_not_overtake_the_same_task_s_earlier_tell_to_a_subscriber() {
    // One task tells a subscriber on another shard, then publishes: the
    // subscriber sees the tell first (messages from one task to one actor
    // arrive in the order sent, whatever path each takes).
    let sys = system(2);
    let topic: Topic<Tick> = sys.handle().topic();
    let listener = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Listener::default);
    topic.subscribe(listener.clone());
    seen_by(&sys, std::slice::from_ref(&listener));
    for round in 0..50u64 {
        let (t, l) = (topic.clone(), listener.clone());
        sys.block_on(sys.runtime().spawn_on(ShardId::new(0), async move {
            l.tell(Tick(2 * round)).unwrap();
            t.publish(Tick(2 * round + 1));
        }))
        .unwrap();
    }
    let expected: Vec<u64> = (0..100).collect();
    assert_eq!(seen_by(&sys, &[listener]), vec![expected]);
    sys.shutdown();
}

#[test]
fn a_publish_crosses_to_each_shard_once_not_once_per_subscriber() {
    let sys = system(2);
    let topic: Topic<Tick> = sys.handle().topic();
    let listeners: Vec<_> = (0..1000)
        .map(|_| sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Listener::default))
        .collect();
    for l in &listeners {
        topic.subscribe(l.clone());
    }
    // Settle the spawns, then count what shard 1's inbox takes for one
    // publish from shard 0.
    seen_by(&sys, &listeners[..1]);
    let before = sys.runtime().stats().shards[1].inbox_items;
    let t = topic.clone();
    sys.block_on(
        sys.runtime()
            .spawn_on(ShardId::new(0), async move { t.publish(Tick(1)) }),
    )
    .unwrap();
    let seen = seen_by(&sys, &listeners);
    let crossed = sys.runtime().stats().shards[1].inbox_items - before;
    assert!(seen.iter().all(|s| s == &[1]));
    // One hand-over for the publish, the rest is the asks that checked.
    assert!(
        crossed < 1000 + 50,
        "{crossed} inbox items for 1000 asks and one publish"
    );
    assert!(crossed >= 1001);
    sys.shutdown();
}

#[test]
fn subscribers_that_stop_mid_publish_leave_the_topic_and_the_rest_miss_nothing() {
    let sys = system(2);
    let topic: Topic<Tick> = sys.handle().topic();
    let listeners: Vec<_> = (0..40)
        .map(|_| sys.spawn_actor(Placement::RoundRobin, Listener::default))
        .collect();
    for l in &listeners {
        topic.subscribe(l.clone());
    }
    let (t, quitters) = (topic.clone(), listeners[..20].to_vec());
    sys.block_on(sys.runtime().spawn_on(ShardId::new(0), async move {
        for v in 0..200 {
            t.publish(Tick(v));
            if v == 100 {
                for q in &quitters {
                    q.stop();
                }
            }
            if v % 16 == 0 {
                mailring_actors::mailring::yield_now().await;
            }
        }
    }))
    .unwrap();
    let stayers = seen_by(&sys, &listeners[20..]);
    let expected: Vec<u64> = (0..200).collect();
    assert!(stayers.iter().all(|s| s == &expected));
    // The publishes after the stops found the quitters stopped.
    topic.publish(Tick(200));
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while topic.subscriber_count() != 20 {
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            topic.subscriber_count()
        );
        topic.publish(Tick(201));
        std::thread::sleep(Duration::from_millis(2));
    }
    sys.shutdown();
}

#[test]
fn a_keyed_subscriber_stays_subscribed_across_passivation_and_is_reactivated() {
    let sys = system(2);
    let topic: Topic<Tick> = sys.handle().named_topic("ticks");
    let k = sys.keyed::<KeyedListener>(9);
    topic.subscribe(k.clone());
    topic.publish(Tick(1));
    let (before, after) = sys.block_on(async move {
        let before = k.ask(Seen).await.unwrap();
        // Idle 20 ms: it passivates; the next publish activates it again.
        k.stopped().await;
        assert!(!k.is_alive().await);
        let same = k.system().named_topic::<Tick>("ticks");
        same.publish(Tick(2));
        (before, k.ask(Seen).await.unwrap())
    });
    assert_eq!(before, [1]);
    assert_eq!(after, [2], "a fresh activation got the publish");
    assert_eq!(topic.subscriber_count(), 1);
    sys.shutdown();
}

#[test]
fn unsubscribe_ends_delivery() {
    let sys = system(2);
    let topic: Topic<Tick> = sys.handle().topic();
    let a = sys.spawn_actor(Placement::Pinned(ShardId::new(0)), Listener::default);
    let b = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Listener::default);
    let rb: Recipient<Tick> = b.recipient();
    topic.subscribe(a.clone());
    topic.subscribe(rb.clone());
    topic.publish(Tick(1));
    // Delivered before the unsubscription (a change of subscribers applies
    // to the deliveries that start after it on the subscriber's shard).
    assert_eq!(seen_by(&sys, std::slice::from_ref(&b)), [vec![1]]);
    assert!(topic.unsubscribe(rb.id()));
    assert!(!topic.unsubscribe(rb.id()));
    topic.publish(Tick(2));
    assert_eq!(seen_by(&sys, &[a, b]), [vec![1, 2], vec![1]]);
    sys.shutdown();
}

/// A message whose drop subscribes its listener again: a publish must not
/// deadlock on its own topic while it delivers.
#[derive(Message, Clone)]
struct Sticky(Option<(Topic<Sticky>, Recipient<Sticky>)>);

impl Drop for Sticky {
    fn drop(&mut self) {
        if let Some((topic, me)) = self.0.take() {
            topic.subscribe(me);
        }
    }
}

#[derive(Actor, Default)]
#[actor(handles(Sticky))]
struct StickyListener;

impl Handler<Sticky> for StickyListener {
    async fn handle(&mut self, _m: Sticky, _cx: &mut Ctx<Self>) {}
}

#[test]
fn a_message_drop_that_subscribes_during_a_delivery_does_not_deadlock() {
    let sys = system(2);
    let topic: Topic<Sticky> = sys.handle().topic();
    let l = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), StickyListener::default);
    topic.subscribe(l.clone());
    let t = topic.clone();
    sys.block_on(sys.runtime().spawn_on(ShardId::new(1), async move {
        t.publish(Sticky(Some((t.clone(), l.recipient()))));
    }))
    .unwrap();
    assert_eq!(topic.subscriber_count(), 1);
    sys.shutdown();
}

#[derive(Message)]
struct Boom;

/// A listener that panics on `Boom` (and is restarted, the default policy).
#[derive(Actor, Default)]
#[actor(handles(Tick, Seen, Boom))]
struct Fragile {
    seen: Vec<u64>,
}
listener!(Fragile);

impl Handler<Boom> for Fragile {
    async fn handle(&mut self, _m: Boom, _cx: &mut Ctx<Self>) {
        panic!("injected: Boom");
    }
}

#[test]
fn a_restarted_subscriber_stays_subscribed() {
    let sys = system(2);
    let topic: Topic<Tick> = sys.handle().topic();
    let f = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Fragile::default);
    topic.subscribe(f.clone());
    f.tell(Boom).unwrap();
    topic.publish(Tick(1));
    let seen = sys.block_on(async move { f.ask(Seen).await.unwrap() });
    assert_eq!(seen, [1], "the restarted instance got the publish");
    assert_eq!(topic.subscriber_count(), 1);
    sys.shutdown();
}

/// A keyed listener that never passivates on its own.
#[derive(Actor)]
#[actor(key = u32, activate = SteadyListener::new, handles(Tick, Seen))]
struct SteadyListener {
    seen: Vec<u64>,
}
listener!(SteadyListener);

impl SteadyListener {
    fn new(_key: &u32) -> Self {
        SteadyListener { seen: Vec::new() }
    }
}

#[test]
fn a_stopped_keyed_subscriber_stays_subscribed_and_a_gracefully_stopped_unkeyed_one_leaves() {
    let sys = system(2);
    let topic: Topic<Tick> = sys.handle().topic();
    let k = sys.keyed::<SteadyListener>(4);
    let u = sys.spawn_actor(Placement::Pinned(ShardId::new(0)), Listener::default);
    topic.subscribe(k.clone());
    topic.subscribe(u.clone());
    let (k2, u2) = (k.clone(), u.clone());
    sys.block_on(async move {
        k2.ask(Seen).await.unwrap(); // active
        k2.stop();
        u2.stop_gracefully();
        k2.stopped().await;
        u2.stopped().await;
    });
    topic.publish(Tick(7));
    let seen = sys.block_on(async move { k.ask(Seen).await.unwrap() });
    assert_eq!(seen, [7], "a fresh activation of the key got the publish");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while topic.subscriber_count() != 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            topic.subscriber_count()
        );
        topic.publish(Tick(8));
        std::thread::sleep(Duration::from_millis(2));
    }
    sys.shutdown();
}

/// A message that panics when a copy is dropped unhandled (a must-use
/// guard): its handler forgets the copy it takes.
#[derive(Message, Debug)]
struct MustUse(u64);

impl Clone for MustUse {
    fn clone(&self) -> Self {
        MustUse(self.0)
    }
}

impl Drop for MustUse {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            panic!("a MustUse was dropped unhandled (the test's own)");
        }
    }
}

#[derive(Actor, Default)]
#[actor(handles(MustUse, Seen))]
struct Careful {
    seen: Vec<u64>,
}

impl Handler<MustUse> for Careful {
    async fn handle(&mut self, m: MustUse, _cx: &mut Ctx<Self>) {
        self.seen.push(m.0);
        std::mem::forget(m);
    }
}

impl Handler<Seen> for Careful {
    async fn handle(&mut self, _m: Seen, _cx: &mut Ctx<Self>) -> Vec<u64> {
        self.seen.clone()
    }
}

/// A stopped subscriber hands its copy back, and dropping it panics: the
/// subscribers after it on that shard still get every message, and the
/// stopped one leaves the topic.
#[test]
fn a_copy_whose_drop_panics_at_a_stopped_subscriber_cuts_off_no_other() {
    let sys = system(1);
    let topic: Topic<MustUse> = sys.handle().topic();
    let subs: Vec<_> = (0..3)
        .map(|_| sys.spawn_actor(Placement::Pinned(ShardId::new(0)), Careful::default))
        .collect();
    for s in &subs {
        assert!(topic.subscribe(s.clone()));
    }
    let first = subs[0].clone();
    sys.block_on(async move {
        first.stop();
        first.stopped().await;
    });
    let t = topic.clone();
    sys.block_on(sys.runtime().spawn_on(ShardId::new(0), async move {
        t.publish(MustUse(1));
        t.publish(MustUse(2));
    }))
    .unwrap();
    let rest = subs[1..].to_vec();
    let seen = sys.block_on(async move {
        let mut all = Vec::new();
        for s in &rest {
            all.push(s.ask(Seen).await.unwrap());
        }
        all
    });
    assert_eq!(seen, vec![vec![1, 2], vec![1, 2]]);
    assert_eq!(topic.subscriber_count(), 2);
    sys.shutdown();
}

/// Two systems on one runtime each have keyed actor 9 of the same type,
/// with the same id (ids are unique within a system). A topic takes its
/// own system's and refuses the other's, saying why, rather than taking
/// it for its own (refused as "already subscribed") or delivering to it
/// through its own system's tables.
#[test]
fn a_topic_refuses_an_actor_of_another_system_and_says_why() {
    use mailring_actors::{SubscribeError, SystemConfig};
    let rt = Runtime::builder()
        .shards(2)
        .build()
        .expect("io_uring available");
    let mine = ActorSystem::start_on(rt.handle(), SystemConfig::default()).unwrap();
    let theirs = ActorSystem::start_on(rt.handle(), SystemConfig::default()).unwrap();
    let topic: Topic<Tick> = mine.handle().topic();
    let own = mine.keyed::<KeyedListener>(9);
    let foreign = theirs.keyed::<KeyedListener>(9);
    assert_eq!(own.id(), foreign.id(), "the same type and key: the same id");
    assert_eq!(
        topic.try_subscribe(foreign.clone()),
        Err(SubscribeError::OtherSystem { id: foreign.id() })
    );
    assert_eq!(topic.try_subscribe(own.clone()), Ok(()));
    assert_eq!(
        topic.try_subscribe(own.clone()),
        Err(SubscribeError::AlreadySubscribed { id: own.id() })
    );
    assert_eq!(topic.subscriber_count(), 1);
    topic.publish(Tick(5));
    let (own_seen, foreign_seen) = rt.block_on(async move {
        (
            own.ask(Seen).await.unwrap(),
            foreign.ask(Seen).await.unwrap(),
        )
    });
    assert_eq!((own_seen, foreign_seen), (vec![5], vec![]));
    mine.shutdown();
    theirs.shutdown();
}
