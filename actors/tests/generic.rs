//! Generic actor types: each instance of a generic type is a type of its
//! own (its own registry slot and shard caches), on every shard.

use std::collections::HashMap;
use std::hash::Hash;

use mailring_actors::{
    Actor, ActorSystem, Ctx, Handler, Message, Placement, Recipient, Runtime, ShardId,
};

fn system() -> ActorSystem {
    ActorSystem::start(Runtime::builder().shards(2)).expect("io_uring available")
}

#[derive(Message)]
struct Put<K, V>(K, V);

#[derive(Message)]
#[message(reply = Option<V>)]
struct Get<K, V>(K, std::marker::PhantomData<V>);

fn get<K, V>(k: K) -> Get<K, V> {
    Get(k, std::marker::PhantomData)
}

/// A generic cache with a typed mailbox.
#[derive(Actor)]
#[actor(handles(Put<K, V>, Get<K, V>))]
struct Cache<K: Eq + Hash + Send, V: Clone + Send> {
    entries: HashMap<K, V>,
}

impl<K: Eq + Hash + Send, V: Clone + Send> Default for Cache<K, V> {
    fn default() -> Self {
        Cache {
            entries: HashMap::new(),
        }
    }
}

impl<K: Eq + Hash + Send + 'static, V: Clone + Send + 'static> Handler<Put<K, V>> for Cache<K, V> {
    async fn handle(&mut self, m: Put<K, V>, _cx: &mut Ctx<Self>) {
        self.entries.insert(m.0, m.1);
    }
}

impl<K: Eq + Hash + Send + 'static, V: Clone + Send + 'static> Handler<Get<K, V>> for Cache<K, V> {
    async fn handle(&mut self, m: Get<K, V>, _cx: &mut Ctx<Self>) -> Option<V> {
        self.entries.get(&m.0).cloned()
    }
}

/// A generic keyed actor with boxed envelopes (no `handles`).
#[derive(Actor)]
#[actor(key = u64, activate = Tally::new)]
struct Tally<T: Default + std::ops::AddAssign + Copy + Send> {
    total: T,
}

impl<T: Default + std::ops::AddAssign + Copy + Send> Tally<T> {
    fn new(_key: &u64) -> Self {
        Tally {
            total: T::default(),
        }
    }
}

#[derive(Message)]
#[message(reply = T)]
struct Add<T>(T);

impl<T: Default + std::ops::AddAssign + Copy + Send + 'static> Handler<Add<T>> for Tally<T> {
    async fn handle(&mut self, m: Add<T>, _cx: &mut Ctx<Self>) -> T {
        self.total += m.0;
        self.total
    }
}

#[test]
fn two_instances_of_a_generic_actor_are_two_types_on_every_shard() {
    let sys = system();
    let h = sys.handle();
    let (words, numbers) = sys.block_on(async move {
        let mut words = Vec::new();
        let mut numbers = Vec::new();
        for shard in 0..2 {
            let w = h.spawn_actor(
                Placement::Pinned(ShardId::new(shard)),
                Cache::<String, String>::default,
            );
            let n = h.spawn_actor(
                Placement::Pinned(ShardId::new(shard)),
                Cache::<u32, u64>::default,
            );
            w.tell(Put("a".to_string(), format!("on {shard}"))).unwrap();
            n.tell(Put(1, 10 + shard as u64)).unwrap();
            let as_recipient: Recipient<Get<u32, u64>> = n.recipient();
            words.push(w.ask(get::<String, String>("a".into())).await.unwrap());
            numbers.push(as_recipient.ask(get(1)).await.unwrap());
        }
        (words, numbers)
    });
    assert_eq!(words, [Some("on 0".to_string()), Some("on 1".to_string())]);
    assert_eq!(numbers, [Some(10), Some(11)]);
    sys.shutdown();
}

#[test]
fn generic_keyed_actors_with_boxed_envelopes_keep_their_instances_apart() {
    let sys = system();
    let h = sys.handle();
    let totals = sys.block_on(async move {
        let mut totals = Vec::new();
        for k in 0..4u64 {
            let ints = h.keyed::<Tally<i64>>(k);
            let floats = h.keyed::<Tally<f64>>(k);
            ints.ask(Add(2i64)).await.unwrap();
            floats.ask(Add(0.5f64)).await.unwrap();
            totals.push((
                ints.ask(Add(1i64)).await.unwrap(),
                floats.ask(Add(1.0f64)).await.unwrap(),
            ));
        }
        totals
    });
    assert_eq!(totals, vec![(3, 1.5); 4]);
    let stats = format!("{:?}", sys.stats());
    assert!(stats.contains("Tally<i64>"), "{stats}");
    assert!(stats.contains("Tally<f64>"), "{stats}");
    sys.shutdown();
}
