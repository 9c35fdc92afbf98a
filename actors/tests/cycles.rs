//! Ask cycles between handlers that each start from a tell: A's handler asks
//! B while B's handler asks A. Neither ask is on the other's chain, so only
//! the blocked-handler check at delivery sees them. Every wait here is
//! bounded: on a build without the check these tests fail with a timeout,
//! they never hang.

use std::time::{Duration, Instant};

use mailring_actors::mailring::time::sleep;
use mailring_actors::{
    Actor, ActorSystem, Addr, AskError, Ctx, Handler, Message, Placement, Runtime, ShardId,
};

fn system(shards: usize) -> ActorSystem {
    ActorSystem::start(Runtime::builder().shards(shards)).expect("io_uring available")
}

/// How long a test waits for an outcome before calling it a deadlock.
const PATIENCE: Duration = Duration::from_secs(3);

type Outcome = Option<Result<u64, AskError>>;

/// An unkeyed actor that asks a peer from a tell handler.
#[derive(Actor, Default)]
#[actor(handles(Call, CallTwo, WaitCall, CallBack, Ping, GetOutcome))]
struct Node {
    outcome: Outcome,
    pings: u64,
}

/// Tell: sleep `delay`, then ask `peer` a `Ping(hold)` from the handler
/// itself (the handler is blocked on the reply).
#[derive(Message)]
struct Call {
    peer: Addr<Node>,
    delay: Duration,
    hold: Duration,
}

/// Tell: ask `slow` a `Ping(hold)` and `peer` a `Ping(0)` at once, and
/// await both (the handler is blocked on two asks); the outcome is the sum.
#[derive(Message)]
struct CallTwo {
    slow: Addr<Node>,
    peer: Addr<Node>,
    hold: Duration,
}

/// Tell: after `delay`, ask `peer` a `CallBack(me)` through `cx.wait_for`,
/// so the actor keeps taking messages meanwhile.
#[derive(Message)]
struct WaitCall {
    peer: Addr<Node>,
    delay: Duration,
}

/// Ask: the handler asks the actor it names a `Ping` (asks back its asker).
#[derive(Message)]
#[message(reply = Result<u64, AskError>)]
struct CallBack(Addr<Node>);

/// Ask: sleep `0`, then count the ping.
#[derive(Message)]
#[message(reply = u64)]
struct Ping(Duration);

#[derive(Message)]
#[message(reply = Outcome)]
struct GetOutcome;

impl Handler<Call> for Node {
    async fn handle(&mut self, m: Call, _cx: &mut Ctx<Self>) {
        if !m.delay.is_zero() {
            sleep(m.delay).await;
        }
        self.outcome = Some(m.peer.ask(Ping(m.hold)).await);
    }
}

impl Handler<CallTwo> for Node {
    async fn handle(&mut self, m: CallTwo, _cx: &mut Ctx<Self>) {
        let mut slow = m.slow.ask(Ping(m.hold));
        let mut peer = m.peer.ask(Ping(Duration::ZERO));
        let (mut a, mut b) = (None, None);
        // A join of the two replies, polled by the handler itself.
        std::future::poll_fn(|cx| {
            use std::future::Future;
            use std::pin::Pin;
            if a.is_none() {
                if let std::task::Poll::Ready(r) = Pin::new(&mut slow).poll(cx) {
                    a = Some(r);
                }
            }
            if b.is_none() {
                if let std::task::Poll::Ready(r) = Pin::new(&mut peer).poll(cx) {
                    b = Some(r);
                }
            }
            if a.is_some() && b.is_some() {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
        .await;
        self.outcome = Some(match (a.unwrap(), b.unwrap()) {
            (Ok(x), Ok(y)) => Ok(x + y),
            (Err(e), _) | (_, Err(e)) => Err(e),
        });
    }
}

impl Handler<WaitCall> for Node {
    async fn handle(&mut self, m: WaitCall, cx: &mut Ctx<Self>) {
        let me = cx.myself();
        let (peer, delay) = (m.peer, m.delay);
        cx.wait_for(
            async move {
                sleep(delay).await;
                peer.ask(CallBack(me)).await.and_then(|r| r)
            },
            |this, got, _cx| this.outcome = Some(got),
        );
    }
}

impl Handler<CallBack> for Node {
    async fn handle(&mut self, m: CallBack, _cx: &mut Ctx<Self>) -> Result<u64, AskError> {
        m.0.ask(Ping(Duration::ZERO)).await
    }
}

impl Handler<Ping> for Node {
    async fn handle(&mut self, m: Ping, _cx: &mut Ctx<Self>) -> u64 {
        if !m.0.is_zero() {
            sleep(m.0).await;
        }
        self.pings += 1;
        self.pings
    }
}

impl Handler<GetOutcome> for Node {
    async fn handle(&mut self, _m: GetOutcome, _cx: &mut Ctx<Self>) -> Outcome {
        self.outcome.take()
    }
}

/// The outcome of `node`'s last call, waiting at most [`PATIENCE`] for its
/// handler to be free (a deadlocked handler never is).
async fn outcome_of(node: &Addr<Node>) -> Outcome {
    node.ask(GetOutcome)
        .timeout(PATIENCE)
        .await
        .expect("the node's handler returned: no deadlock")
}

/// Both nodes call each other from tell handlers; returns (a's, b's) outcome.
fn call_each_other(
    sys: &ActorSystem,
    a: &Addr<Node>,
    b: &Addr<Node>,
    a_delay: Duration,
    b_delay: Duration,
) -> (Outcome, Outcome) {
    let (a, b) = (a.clone(), b.clone());
    sys.block_on(async move {
        a.tell(Call {
            peer: b.clone(),
            delay: a_delay,
            hold: Duration::ZERO,
        })
        .unwrap();
        b.tell(Call {
            peer: a.clone(),
            delay: b_delay,
            hold: Duration::ZERO,
        })
        .unwrap();
        sleep(Duration::from_millis(50) + a_delay.max(b_delay)).await;
        (outcome_of(&a).await, outcome_of(&b).await)
    })
}

/// Exactly one of the two asks failed with `WouldDeadlock`, the other got
/// its answer.
fn assert_one_refused(out: &(Outcome, Outcome)) {
    let refused = [&out.0, &out.1]
        .iter()
        .filter(|o| matches!(o, Some(Err(AskError::WouldDeadlock))))
        .count();
    let answered = [&out.0, &out.1]
        .iter()
        .filter(|o| matches!(o, Some(Ok(_))))
        .count();
    assert_eq!((refused, answered), (1, 1), "{out:?}");
}

/// Both actors still take asks and tells, and a call without a cycle works.
fn assert_both_work(sys: &ActorSystem, a: &Addr<Node>, b: &Addr<Node>) {
    let (a, b) = (a.clone(), b.clone());
    let (pa, pb, call) = sys.block_on(async move {
        let pa = a.ask(Ping(Duration::ZERO)).timeout(PATIENCE).await;
        let pb = b.ask(Ping(Duration::ZERO)).timeout(PATIENCE).await;
        a.tell(Call {
            peer: b.clone(),
            delay: Duration::ZERO,
            hold: Duration::ZERO,
        })
        .unwrap();
        (pa, pb, outcome_of(&a).await)
    });
    assert!(pa.is_ok() && pb.is_ok(), "{pa:?} {pb:?}");
    assert!(matches!(call, Some(Ok(_))), "{call:?}");
}

fn two_nodes(sys: &ActorSystem, a_shard: usize, b_shard: usize) -> (Addr<Node>, Addr<Node>) {
    let a = sys.spawn_actor(Placement::Pinned(ShardId::new(a_shard)), Node::default);
    let b = sys.spawn_actor(Placement::Pinned(ShardId::new(b_shard)), Node::default);
    (a, b)
}

// ---------------------------------------------------------------- two handlers ask each other

#[test]
fn tell_handlers_asking_each_other_across_shards_fail_one_ask_at_once() {
    let sys = system(2);
    let (a, b) = two_nodes(&sys, 0, 1);
    // Both handlers sleep the same 20 ms, then ask: both are blocked on
    // their asks when the other's arrives, on two shards at once.
    for _ in 0..5 {
        let out = call_each_other(
            &sys,
            &a,
            &b,
            Duration::from_millis(20),
            Duration::from_millis(20),
        );
        assert_one_refused(&out);
    }
    assert_both_work(&sys, &a, &b);
    sys.shutdown();
}

#[test]
fn the_newer_ask_of_a_cycle_is_the_one_refused() {
    let sys = system(2);
    let (a, b) = two_nodes(&sys, 0, 1);
    // a asks at once and waits; b's handler asks a 30 ms later, while a's
    // ask already sits in b's mailbox: b's ask is the newer one.
    let out = call_each_other(&sys, &a, &b, Duration::ZERO, Duration::from_millis(30));
    assert!(matches!(out.0, Some(Ok(_))), "{out:?}");
    assert_eq!(out.1, Some(Err(AskError::WouldDeadlock)), "{out:?}");
    // And the other way round.
    let out = call_each_other(&sys, &a, &b, Duration::from_millis(30), Duration::ZERO);
    assert_eq!(out.0, Some(Err(AskError::WouldDeadlock)), "{out:?}");
    assert!(matches!(out.1, Some(Ok(_))), "{out:?}");
    assert_both_work(&sys, &a, &b);
    sys.shutdown();
}

#[test]
fn tell_handlers_asking_each_other_on_one_shard_fail_one_ask_at_once() {
    let sys = system(2);
    let (a, b) = two_nodes(&sys, 1, 1);
    for delays in [(20, 20), (0, 30), (30, 0)] {
        let out = call_each_other(
            &sys,
            &a,
            &b,
            Duration::from_millis(delays.0),
            Duration::from_millis(delays.1),
        );
        assert_one_refused(&out);
    }
    assert_both_work(&sys, &a, &b);
    sys.shutdown();
}

#[test]
fn a_handler_blocked_on_two_asks_refuses_a_cycle_through_either() {
    let sys = system(2);
    let a = sys.spawn_actor(Placement::Pinned(ShardId::new(0)), Node::default);
    let b = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Node::default);
    let c = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Node::default);
    let out = sys.block_on(async move {
        // a awaits c (slow, 200 ms) and b at once; 20 ms later b's handler
        // asks a: a waits on b among others, so b's ask closes a cycle.
        a.tell(CallTwo {
            slow: c.clone(),
            peer: b.clone(),
            hold: Duration::from_millis(200),
        })
        .unwrap();
        b.tell(Call {
            peer: a.clone(),
            delay: Duration::from_millis(20),
            hold: Duration::ZERO,
        })
        .unwrap();
        sleep(Duration::from_millis(50)).await;
        (outcome_of(&b).await, outcome_of(&a).await)
    });
    assert_eq!(out.0, Some(Err(AskError::WouldDeadlock)), "{out:?}");
    assert!(matches!(out.1, Some(Ok(_))), "{out:?}");
    sys.shutdown();
}

// ---------------------------------------------------------------- keyed actors

#[derive(Actor, Default)]
#[actor(key = u64, activate = KeyedNode::new, handles(KeyedCall, Ping, GetOutcome))]
struct KeyedNode {
    outcome: Outcome,
    pings: u64,
}

impl KeyedNode {
    fn new(_key: &u64) -> Self {
        KeyedNode::default()
    }
}

/// Tell: sleep `delay`, then ask keyed node `peer` a `Ping`.
#[derive(Message)]
struct KeyedCall {
    peer: u64,
    delay: Duration,
}

impl Handler<KeyedCall> for KeyedNode {
    async fn handle(&mut self, m: KeyedCall, cx: &mut Ctx<Self>) {
        sleep(m.delay).await;
        let peer = cx.system().keyed::<KeyedNode>(m.peer);
        self.outcome = Some(peer.ask(Ping(Duration::ZERO)).await);
    }
}

impl Handler<Ping> for KeyedNode {
    async fn handle(&mut self, _m: Ping, _cx: &mut Ctx<Self>) -> u64 {
        self.pings += 1;
        self.pings
    }
}

impl Handler<GetOutcome> for KeyedNode {
    async fn handle(&mut self, _m: GetOutcome, _cx: &mut Ctx<Self>) -> Outcome {
        self.outcome.take()
    }
}

#[test]
fn keyed_actors_asking_each_other_across_shards_fail_one_ask_at_once() {
    let sys = system(2);
    let h = sys.handle();
    let ka = 0u64;
    let kb = (1..100u64)
        .find(|k| h.keyed::<KeyedNode>(*k).shard() != h.keyed::<KeyedNode>(ka).shard())
        .expect("a key on the other shard");
    let out = sys.block_on(async move {
        let mut outs = Vec::new();
        for delays in [(20, 20), (0, 30)] {
            let (a, b) = (h.keyed::<KeyedNode>(ka), h.keyed::<KeyedNode>(kb));
            a.tell(KeyedCall {
                peer: kb,
                delay: Duration::from_millis(delays.0),
            })
            .unwrap();
            b.tell(KeyedCall {
                peer: ka,
                delay: Duration::from_millis(delays.1),
            })
            .unwrap();
            sleep(Duration::from_millis(80)).await;
            let oa = a.ask(GetOutcome).timeout(PATIENCE).await;
            let ob = b.ask(GetOutcome).timeout(PATIENCE).await;
            outs.push((
                oa.expect("a's handler returned: no deadlock"),
                ob.expect("b's handler returned: no deadlock"),
            ));
        }
        let still = (a_ping(&h, ka).await.is_ok(), a_ping(&h, kb).await.is_ok());
        (outs, still)
    });
    for o in &out.0 {
        assert_one_refused(o);
    }
    assert_eq!(
        out.0[1].1,
        Some(Err(AskError::WouldDeadlock)),
        "the newer ask"
    );
    assert_eq!(out.1, (true, true), "both keyed actors keep answering");
    sys.shutdown();
}

async fn a_ping(h: &mailring_actors::SystemHandle, key: u64) -> Result<u64, AskError> {
    h.keyed::<KeyedNode>(key)
        .ask(Ping(Duration::ZERO))
        .timeout(PATIENCE)
        .await
}

// ---------------------------------------------------------------- not cycles: must keep working

#[test]
fn an_ask_through_wait_for_may_be_asked_back() {
    let sys = system(2);
    let (a, b) = two_nodes(&sys, 0, 1);
    let (a2, b2) = (a.clone(), b.clone());
    let out = sys.block_on(async move {
        // a's ask runs off the actor (wait_for); b's handler asks a back
        // while handling it: a takes the ping meanwhile.
        a2.tell(WaitCall {
            peer: b2.clone(),
            delay: Duration::ZERO,
        })
        .unwrap();
        sleep(Duration::from_millis(30)).await;
        let first = outcome_of(&a2).await;
        // b's tell handler blocks on an ask to a (a takes 100 ms to answer);
        // meanwhile the ask that a keeps in flight through wait_for reaches
        // b. a's handler is not blocked on it: no cycle, nothing refused.
        a2.tell(WaitCall {
            peer: b2.clone(),
            delay: Duration::from_millis(30),
        })
        .unwrap();
        sleep(Duration::from_millis(5)).await;
        b2.tell(Call {
            peer: a2.clone(),
            delay: Duration::ZERO,
            hold: Duration::from_millis(100),
        })
        .unwrap();
        sleep(Duration::from_millis(150)).await;
        (first, outcome_of(&a2).await, outcome_of(&b2).await)
    });
    assert!(matches!(out.0, Some(Ok(_))), "{out:?}");
    assert!(matches!(out.1, Some(Ok(_))), "{out:?}");
    assert!(matches!(out.2, Some(Ok(_))), "{out:?}");
    sys.shutdown();
}

#[test]
fn a_long_blocking_ask_without_a_cycle_is_not_refused() {
    let sys = system(2);
    let a = sys.spawn_actor(Placement::Pinned(ShardId::new(0)), Node::default);
    let b = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Node::default);
    let c = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Node::default);
    let out = sys.block_on(async move {
        let start = Instant::now();
        // a waits 200 ms on b; meanwhile c's handler asks a.
        a.tell(Call {
            peer: b.clone(),
            delay: Duration::ZERO,
            hold: Duration::from_millis(200),
        })
        .unwrap();
        c.tell(Call {
            peer: a.clone(),
            delay: Duration::from_millis(20),
            hold: Duration::ZERO,
        })
        .unwrap();
        sleep(Duration::from_millis(50)).await;
        let c_out = outcome_of(&c).await;
        let c_at = start.elapsed();
        (outcome_of(&a).await, c_out, c_at)
    });
    assert!(matches!(out.0, Some(Ok(_))), "{out:?}");
    assert!(matches!(out.1, Some(Ok(_))), "{out:?}");
    assert!(
        out.2 >= Duration::from_millis(150),
        "c's ask was handled after a's handler returned: {out:?}"
    );
    sys.shutdown();
}

#[test]
fn an_ask_from_outside_any_actor_to_a_blocked_actor_is_not_refused() {
    let sys = system(2);
    let (a, b) = two_nodes(&sys, 0, 1);
    let rt = sys.runtime().clone();
    let out = sys.block_on(async move {
        let start = Instant::now();
        a.tell(Call {
            peer: b.clone(),
            delay: Duration::ZERO,
            hold: Duration::from_millis(200),
        })
        .unwrap();
        sleep(Duration::from_millis(20)).await;
        // A task on the actor's shard and the block_on task (shard 0) keep
        // asks in flight while a is blocked on b: neither is an actor.
        let a2 = a.clone();
        let task = rt.spawn_on(ShardId::new(0), async move {
            let first = a2.ask(Ping(Duration::ZERO));
            let second = a2.ask(Ping(Duration::ZERO));
            (
                first.timeout(PATIENCE).await,
                second.timeout(PATIENCE).await,
            )
        });
        let here = a.ask(Ping(Duration::ZERO)).timeout(PATIENCE).await;
        let at = start.elapsed();
        let there = task.await.unwrap();
        (here, there, at, outcome_of(&a).await)
    });
    assert!(out.0.is_ok(), "{out:?}");
    assert!(out.1 .0.is_ok() && out.1 .1.is_ok(), "{out:?}");
    assert!(out.2 >= Duration::from_millis(150), "{out:?}");
    assert!(matches!(out.3, Some(Ok(_))), "{out:?}");
    sys.shutdown();
}

// ---------------------------------------------------------------- a refused ask's message

/// A keyed actor: `KCall` tells a peer a `KNote` and asks it a `KPing`
/// from its handler; `KNote` counts; `KCount` tells the count.
#[derive(Actor, Default)]
#[actor(key = u64, handles(KCall, KPing, KNote, KCount))]
struct Knot {
    notes: u64,
    outcome: Outcome,
}

#[derive(Message)]
struct KCall {
    peer: Addr<Knot>,
    delay: Duration,
    witness: Addr<Knot>,
}

/// Its `Drop` tells the witness a `KNote`: a send to a key that may not
/// be active yet, from wherever the message is dropped.
struct Witness(Addr<Knot>);

impl Drop for Witness {
    fn drop(&mut self) {
        let _ = self.0.tell(KNote);
    }
}

#[derive(Message)]
#[message(reply = u64)]
struct KPing(#[allow(dead_code)] Witness);

#[derive(Message)]
struct KNote;

#[derive(Message)]
#[message(reply = (u64, Outcome))]
struct KCount;

impl Handler<KCall> for Knot {
    async fn handle(&mut self, m: KCall, _cx: &mut Ctx<Self>) {
        if !m.delay.is_zero() {
            sleep(m.delay).await;
        }
        // A tell first: from another shard, the ask then travels second in
        // a batch.
        let _ = m.peer.tell(KNote);
        self.outcome = Some(m.peer.ask(KPing(Witness(m.witness))).await);
    }
}

impl Handler<KPing> for Knot {
    async fn handle(&mut self, _m: KPing, _cx: &mut Ctx<Self>) -> u64 {
        1
    }
}

impl Handler<KNote> for Knot {
    async fn handle(&mut self, _m: KNote, _cx: &mut Ctx<Self>) {
        self.notes += 1;
    }
}

impl Handler<KCount> for Knot {
    async fn handle(&mut self, _m: KCount, _cx: &mut Ctx<Self>) -> (u64, Outcome) {
        (self.notes, self.outcome.take())
    }
}

/// The message of an ask refused at delivery (`WouldDeadlock`) is dropped
/// after the shard's table of the type is let go: its `Drop` may send to
/// an actor of the same type that must be activated (which takes the
/// table to change it), and that send arrives.
#[test]
fn a_refused_asks_message_is_dropped_outside_the_table_and_may_send() {
    // On one shard (a same-shard send refused), and on two with the asker
    // on the other shard (refused in the batch from there), the witness on
    // the refusing shard.
    for shards in [1, 2] {
        refused_ask_drop_sends(shards);
    }
}

fn refused_ask_drop_sends(shards: usize) {
    let sys = system(shards);
    sys.register_factory::<Knot>(|_| Knot::default());
    let shard = |k: u64| sys.shard_of::<Knot>(&k);
    let a_key = 1;
    let b_key = (2..)
        .find(|k| shards == 1 || shard(*k) != shard(a_key))
        .unwrap();
    let w_key = (100..).find(|k| shard(*k) == shard(a_key)).unwrap();
    let (a, b, witness) = (
        sys.keyed::<Knot>(a_key),
        sys.keyed::<Knot>(b_key),
        sys.keyed::<Knot>(w_key),
    );
    let (notes, out_a, out_b) = sys.block_on(async move {
        a.tell(KCall {
            peer: b.clone(),
            delay: Duration::ZERO,
            witness: witness.clone(),
        })
        .unwrap();
        b.tell(KCall {
            peer: a.clone(),
            delay: Duration::from_millis(30),
            witness: witness.clone(),
        })
        .unwrap();
        sleep(Duration::from_millis(100)).await;
        let (_, out_a) = a.ask(KCount).timeout(PATIENCE).await.unwrap();
        let (_, out_b) = b.ask(KCount).timeout(PATIENCE).await.unwrap();
        let (notes, _) = witness.ask(KCount).timeout(PATIENCE).await.unwrap();
        (notes, out_a, out_b)
    });
    assert!(matches!(out_a, Some(Ok(1))), "{shards} shards: {out_a:?}");
    assert_eq!(out_b, Some(Err(AskError::WouldDeadlock)), "{shards} shards");
    assert_eq!(
        notes, 2,
        "{shards} shards: the refused ask's message did not send from its Drop"
    );
    let drops: u64 = sys
        .runtime()
        .stats()
        .shards
        .iter()
        .map(|s| {
            s.panics
                .get(mailring_actors::mailring::panic::CallbackKind::Drop)
        })
        .sum();
    assert_eq!(drops, 0, "{shards} shards: a Drop panicked");
    sys.shutdown();
}
