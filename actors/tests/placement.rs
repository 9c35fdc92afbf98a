//! Keys and placement: canonical route encodings, per-type placement
//! functions, following another type's placement, `shard_of` and
//! `live_keys`.

use mailring_actors::mailring::sticky_shard;
use mailring_actors::{
    route_hash, Actor, ActorSystem, AskError, Ctx, Handler, Message, RouteKey, Runtime, ShardId,
};

fn system(shards: usize) -> ActorSystem {
    ActorSystem::start(Runtime::builder().shards(shards)).expect("io_uring available")
}

#[derive(Message)]
#[message(reply = usize)]
struct Where;

macro_rules! where_am_i {
    ($t:ty) => {
        impl Handler<Where> for $t {
            async fn handle(&mut self, _m: Where, cx: &mut Ctx<Self>) -> usize {
                cx.shard().index()
            }
        }
    };
}

/// Keyed by a `String`.
#[derive(Actor)]
#[actor(key = String, activate = Named::new, handles(Where))]
struct Named;
impl Named {
    fn new(_k: &String) -> Self {
        Named
    }
}
where_am_i!(Named);

#[test]
fn a_string_key_and_the_same_text_as_bytes_share_a_shard() {
    let sys = system(3);
    for i in 0..40 {
        let text = format!("session-{i}");
        let bytes = text.as_bytes().to_vec();
        let routed = sticky_shard(&bytes, 3);
        assert_eq!(sys.shard_of::<Named>(&text), routed);
        let actor = sys.keyed::<Named>(text.clone());
        let ran = sys.block_on(async move { actor.ask(Where).await.unwrap() });
        assert_eq!(ran, routed.index(), "{text}");
    }
    sys.shutdown();
}

/// A tenant's partition: `(tenant, partition)`.
type PartitionKey = (u32, u32);

/// All of a tenant's partitions on one shard, and tenant 999 (a known hot
/// one) alone on the last shard.
fn by_tenant(key: &PartitionKey, shards: usize) -> ShardId {
    if key.0 == 999 {
        return ShardId::new(shards - 1);
    }
    sticky_shard(&key.0, shards - 1)
}

#[derive(Actor)]
#[actor(key = PartitionKey, placement = by_tenant, activate = Partition::new, handles(Where))]
struct Partition;
impl Partition {
    fn new(_k: &PartitionKey) -> Self {
        Partition
    }
}
where_am_i!(Partition);

/// Follows `Partition`'s placement: each partition's index next to it.
#[derive(Actor)]
#[actor(key = PartitionKey, placement = <Partition as Actor>::place, activate = Index::new, handles(Where))]
struct Index;
impl Index {
    fn new(_k: &PartitionKey) -> Self {
        Index
    }
}
where_am_i!(Index);

#[test]
fn a_placement_function_co_locates_a_tenant_and_isolates_a_hot_one() {
    let sys = system(3);
    let h = sys.handle();
    let shards = sys.block_on(async move {
        let mut shards = Vec::new();
        for p in 0..8 {
            let part = h.keyed::<Partition>((5, p)).ask(Where).await.unwrap();
            let index = h.keyed::<Index>((5, p)).ask(Where).await.unwrap();
            shards.push((part, index));
        }
        let hot = h.keyed::<Partition>((999, 0)).ask(Where).await.unwrap();
        (shards, hot)
    });
    let tenant = sticky_shard(&5u32, 2).index();
    assert!(
        shards.0.iter().all(|&(p, i)| p == tenant && i == tenant),
        "{shards:?}"
    );
    assert_eq!(shards.1, 2);
    assert_eq!(sys.shard_of::<Index>(&(5, 3)).index(), tenant);
    sys.shutdown();
}

/// Places every key past the last shard.
fn nowhere(_key: &u64, shards: usize) -> ShardId {
    ShardId::new(shards + 1)
}

#[derive(Actor)]
#[actor(key = u64, placement = nowhere, activate = Lost::new, handles(Where))]
struct Lost;
impl Lost {
    fn new(_k: &u64) -> Self {
        Lost
    }
}
where_am_i!(Lost);

#[test]
fn a_placement_function_past_the_last_shard_fails_sends_with_no_such_shard() {
    let sys = system(2);
    let lost = sys.keyed::<Lost>(1);
    assert_eq!(
        sys.block_on(async move { lost.ask(Where).await }),
        Err(AskError::NoSuchShard)
    );
    sys.shutdown();
}

#[test]
fn shard_of_does_not_activate_and_live_keys_lists_the_active_ones() {
    let sys = system(2);
    let h = sys.handle();
    let (before, after) = sys.block_on(async move {
        let keys: Vec<String> = (0..6).map(|i| format!("k{i}")).collect();
        for k in &keys {
            let _ = h.shard_of::<Named>(k);
        }
        let mut before = Vec::new();
        for s in 0..2 {
            before.extend(h.live_keys::<Named>(ShardId::new(s)).await);
        }
        for k in &keys[..3] {
            h.keyed::<Named>(k.clone()).ask(Where).await.unwrap();
        }
        let mut after = Vec::new();
        for s in 0..2 {
            let mut on = h.live_keys::<Named>(ShardId::new(s)).await;
            assert!(on.iter().all(|k| h.shard_of::<Named>(k).index() == s));
            after.append(&mut on);
        }
        after.sort();
        (before, after)
    });
    assert!(before.is_empty(), "{before:?}");
    assert_eq!(after, ["k0", "k1", "k2"]);
    sys.shutdown();
}

/// A key type of one's own, routed by its derived encoding.
#[derive(Clone, Debug, PartialEq, Eq, Hash, RouteKey)]
struct TenantId(u64);

#[derive(Clone, Debug, PartialEq, Eq, Hash, RouteKey)]
enum Subject {
    User { id: u64 },
    Group(String, u8),
    Everyone,
}

#[test]
fn derived_route_keys_encode_their_fields_in_order() {
    assert_eq!(route_hash(&TenantId(7)), route_hash(&7u64));
    let user = route_hash(&Subject::User { id: 7 });
    assert_eq!(user, route_hash(&(0u64, 7u64)));
    assert_eq!(
        route_hash(&Subject::Group("ops".into(), 2)),
        route_hash(&(1u64, "ops", 2u8))
    );
    assert_eq!(route_hash(&Subject::Everyone), route_hash(&2u64));
}
