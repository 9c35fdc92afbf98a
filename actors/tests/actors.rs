//! Integration tests of the actor layer, through the public API.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod common;

use common::{block_on_thread, send_rounds_from_every_shard, Add, Counter, Get, WhereAmI};
use mailring_actors::{
    Actor, ActorSystem, Addr, AskError, Ctx, Handler, Hooks, Message, PlaceError, Placement,
    Runtime, ShardId, StopReason, SystemConfig, TellError, Terminated,
};

fn system(shards: usize) -> ActorSystem {
    ActorSystem::start(Runtime::builder().shards(shards)).expect("io_uring available")
}

// ---------------------------------------------------------------- basics

#[test]
fn unkeyed_actor_tell_and_ask_across_shards() {
    let sys = system(2);
    let c = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Counter::default);
    assert_eq!(c.shard(), ShardId::new(1));
    let got = sys.block_on(async move {
        // block_on runs on shard 0: every send crosses shards.
        for i in 1..=100 {
            c.tell(Add(i)).unwrap();
        }
        let total = c.ask(Get).await.unwrap();
        let shard = c.ask(WhereAmI).await.unwrap();
        (total, shard)
    });
    assert_eq!(got, (5050, 1));
    sys.shutdown();
}

#[test]
fn same_shard_and_outside_thread_sends() {
    let sys = system(2);
    let c = sys.spawn_actor(Placement::Pinned(ShardId::new(0)), Counter::default);
    // From this (outside) thread.
    for _ in 0..10 {
        c.tell(Add(1)).unwrap();
    }
    let c2 = c.clone();
    let total = sys.block_on(async move {
        for _ in 0..10 {
            c2.tell(Add(1)).unwrap();
        }
        c2.ask(Get).await.unwrap()
    });
    assert_eq!(total, 20);
    sys.shutdown();
}

/// Unkeyed actors placed round robin spread over the shards. Each spawn used
/// to take two ids from one counter, one for the actor and one to pick its
/// shard, so with an even shard count every actor landed on the same shard.
#[test]
fn round_robin_actors_use_every_shard() {
    let sys = system(2);
    let addrs: Vec<_> = (0..4)
        .map(|_| sys.spawn_actor(Placement::RoundRobin, Counter::default))
        .collect();
    let ran_on = sys.block_on(async move {
        let mut ran_on = Vec::new();
        for a in &addrs {
            let asked =
                mailring_actors::mailring::time::timeout(Duration::from_secs(5), a.ask(WhereAmI))
                    .await;
            ran_on.push(asked.expect("the actor answers").expect("the ask succeeds"));
        }
        ran_on
    });
    let mut per_shard = [0usize; 2];
    for s in &ran_on {
        per_shard[*s] += 1;
    }
    assert_eq!(per_shard, [2, 2], "actors ran on shards {ran_on:?}");
    sys.shutdown();
}

// ---------------------------------------------------------------- keyed

static ACTIVATIONS: AtomicUsize = AtomicUsize::new(0);

#[derive(Actor)]
#[actor(key = u64, activate = Account::new, handles(Deposit, Balance, WhereAmI))]
struct Account {
    key: u64,
    balance: u64,
}

impl Account {
    fn new(key: &u64) -> Self {
        ACTIVATIONS.fetch_add(1, Ordering::SeqCst);
        Account {
            key: *key,
            balance: 0,
        }
    }
}

#[derive(Message)]
struct Deposit(u64);

#[derive(Message)]
#[message(reply = (u64, u64))]
struct Balance;

impl Handler<Deposit> for Account {
    async fn handle(&mut self, m: Deposit, _cx: &mut Ctx<Self>) {
        self.balance += m.0;
    }
}

impl Handler<Balance> for Account {
    async fn handle(&mut self, _m: Balance, cx: &mut Ctx<Self>) -> (u64, u64) {
        assert_eq!(*cx.key(), self.key);
        (self.key, self.balance)
    }
}

impl Handler<WhereAmI> for Account {
    async fn handle(&mut self, _m: WhereAmI, cx: &mut Ctx<Self>) -> usize {
        cx.shard().index()
    }
}

#[test]
fn keyed_actors_activate_on_first_message_on_their_sticky_shard() {
    let sys = system(2);
    let before = ACTIVATIONS.load(Ordering::SeqCst);
    let refs: Vec<_> = (0..16u64).map(|k| sys.keyed::<Account>(k)).collect();
    assert_eq!(
        ACTIVATIONS.load(Ordering::SeqCst),
        before,
        "refs alone activate nothing"
    );
    let out = sys.block_on(async move {
        let mut out = Vec::new();
        for r in &refs {
            r.tell(Deposit(r.key().copied().unwrap() * 10)).unwrap();
        }
        for r in &refs {
            let (k, b) = r.ask(Balance).await.unwrap();
            let shard = r.ask(WhereAmI).await.unwrap();
            out.push((k, b, shard, r.shard().index()));
        }
        out
    });
    for (k, b, shard, routed) in out {
        assert_eq!(b, k * 10);
        assert_eq!(shard, routed, "key {k} runs where the router says");
        assert_eq!(
            routed,
            mailring_actors::mailring::sticky_shard(&k, 2).index()
        );
    }
    let stats = sys.stats().by_type("Account").unwrap();
    assert_eq!(stats.activations, 16);
    assert_eq!(stats.active, 16);
    sys.shutdown();
}

/// One key, one shard: a task placed `Sticky(k)`, an actor spawned
/// `Sticky(k)` and the keyed actor with key `k` run on the same shard, the
/// one `sticky_shard(&k, n)` names (with 2 shards, 40 of the keys 0..99 used
/// to disagree between tasks and keyed actors).
#[test]
fn a_key_picks_one_shard_for_tasks_spawned_actors_and_keyed_actors() {
    for shards in [2, 3] {
        let sys = system(shards);
        let h = sys.runtime().clone();
        let spawned: Vec<_> = (0..100u64)
            .map(|k| sys.spawn_actor(Placement::Sticky(k), Counter::default))
            .collect();
        let keyed: Vec<_> = (0..100u64).map(|k| sys.keyed::<Account>(k)).collect();
        let seen = sys.block_on(async move {
            let mut seen = Vec::new();
            for (k, (s, a)) in spawned.iter().zip(&keyed).enumerate() {
                let task = h
                    .spawn_with(Placement::Sticky(k as u64), async {
                        mailring_actors::mailring::current_shard().unwrap().index()
                    })
                    .await
                    .unwrap();
                let spawned_on = s.ask(WhereAmI).await.unwrap();
                let keyed_on = a.ask(WhereAmI).await.unwrap();
                seen.push((k as u64, task, spawned_on, keyed_on));
            }
            seen
        });
        for (k, task, spawned_on, keyed_on) in seen {
            let routed = mailring_actors::mailring::sticky_shard(&k, shards).index();
            assert_eq!(
                (task, spawned_on, keyed_on),
                (routed, routed, routed),
                "key {k} with {shards} shards: (task, spawned actor, keyed actor)"
            );
        }
        sys.shutdown();
    }
}

#[derive(Actor)]
#[actor(key = String)]
struct NoFactory;

impl Handler<Get> for NoFactory {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        0
    }
}

#[test]
fn keyed_actor_without_factory_reports_it() {
    let sys = system(1);
    let r = sys.keyed::<NoFactory>("a".to_string());
    let err = sys.block_on(async move { r.ask(Get).await });
    assert_eq!(err, Err(AskError::NoFactory));
    // With a factory registered, the same key works.
    sys.register_factory::<NoFactory>(|_k| NoFactory);
    let r = sys.keyed::<NoFactory>("a".to_string());
    assert_eq!(sys.block_on(async move { r.ask(Get).await }), Ok(0));
    sys.shutdown();
}

// ---------------------------------------------------------------- ordering

#[derive(Actor, Default)]
#[actor(handles(Seq, Check))]
struct OrderChecker {
    next: HashMap<u64, u64>,
    violations: u64,
    seen: u64,
}

#[derive(Message)]
struct Seq {
    sender: u64,
    n: u64,
}

#[derive(Message)]
#[message(reply = (u64, u64))]
struct Check;

impl Handler<Seq> for OrderChecker {
    async fn handle(&mut self, m: Seq, _cx: &mut Ctx<Self>) {
        let next = self.next.entry(m.sender).or_insert(0);
        if *next != m.n {
            self.violations += 1;
        }
        *next = m.n + 1;
        self.seen += 1;
    }
}

impl Handler<Check> for OrderChecker {
    async fn handle(&mut self, _m: Check, _cx: &mut Ctx<Self>) -> (u64, u64) {
        (self.seen, self.violations)
    }
}

#[test]
fn per_sender_fifo_holds_across_shards_under_load() {
    const SENDERS_PER_SHARD: u64 = 4;
    const PER_SENDER: u64 = 20_000;
    let sys = system(2);
    let checker = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), OrderChecker::default);
    let rt = sys.runtime().clone();
    let c = checker.clone();
    let (seen, violations) = sys.block_on(async move {
        let mut joins = Vec::new();
        for shard in 0..2 {
            for s in 0..SENDERS_PER_SHARD {
                let c = c.clone();
                let sender = shard as u64 * 100 + s;
                joins.push(rt.spawn_on(ShardId::new(shard), async move {
                    for n in 0..PER_SENDER {
                        c.tell(Seq { sender, n }).unwrap();
                        if n % 512 == 0 {
                            mailring_actors::mailring::yield_now().await;
                        }
                    }
                }));
            }
        }
        for j in joins {
            j.await.unwrap();
        }
        // Every sender has been joined: a finished task's sends are published
        // before its completion is visible, so this ask comes after them all.
        c.ask(Check).await.unwrap()
    });
    assert_eq!(violations, 0);
    assert_eq!(seen, 2 * SENDERS_PER_SHARD * PER_SENDER);
    sys.shutdown();
}

/// One keyed actor per key, checking the order of what one sender told it.
#[derive(Actor)]
#[actor(key = u64, activate = KeyedOrder::new, handles(Seq, Check))]
struct KeyedOrder {
    next: u64,
    violations: u64,
    seen: u64,
}

impl KeyedOrder {
    fn new(_key: &u64) -> Self {
        KeyedOrder {
            next: 0,
            violations: 0,
            seen: 0,
        }
    }
}

impl Handler<Seq> for KeyedOrder {
    async fn handle(&mut self, m: Seq, _cx: &mut Ctx<Self>) {
        if m.n != self.next {
            self.violations += 1;
        }
        self.next = m.n + 1;
        self.seen += 1;
    }
}

impl Handler<Check> for KeyedOrder {
    async fn handle(&mut self, _m: Check, _cx: &mut Ctx<Self>) -> (u64, u64) {
        (self.seen, self.violations)
    }
}

#[test]
fn batched_deliveries_keep_each_keys_order_through_activations_and_runs() {
    const STEPS: u64 = 20_000;
    let sys = system(2);
    // Keys living on shard 1, told from shard 0: every message crosses in a
    // batch, where the receiver looks targets up ahead of pushing.
    let keys: Vec<u64> = (0..)
        .filter(|k| sys.keyed::<KeyedOrder>(*k).shard().index() == 1)
        .take(40)
        .collect();
    let h = sys.handle();
    let rt = sys.runtime().clone();
    let ks = keys.clone();
    let sent = sys.block_on(async move {
        let producer = rt.spawn_on(ShardId::new(0), async move {
            let mut sent = vec![0u64; ks.len()];
            let mut x = 0x2545_f491_4f6c_dd1du64;
            for i in 0..STEPS {
                // Keys come into use gradually, so activations happen all
                // along the stream, between runs of one key and alternations.
                x = x
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                let in_use = 1 + (i as usize * ks.len()) / STEPS as usize;
                let idx = (x >> 33) as usize % in_use;
                let run = 1 + (x >> 61) % 3;
                for _ in 0..run {
                    let n = sent[idx];
                    h.keyed::<KeyedOrder>(ks[idx])
                        .tell(Seq { sender: 0, n })
                        .unwrap();
                    sent[idx] += 1;
                }
                if i % 1000 == 999 {
                    mailring_actors::mailring::yield_now().await;
                }
            }
            sent
        });
        producer.await.unwrap()
    });
    // The producer was joined: its tells were published before, so each
    // ask comes after them.
    for (key, n) in keys.iter().zip(sent) {
        let addr = sys.keyed::<KeyedOrder>(*key);
        let (seen, violations) = sys.block_on(async move { addr.ask(Check).await.unwrap() });
        assert_eq!((seen, violations), (n, 0), "key {key}");
    }
    sys.shutdown();
}

// ---------------------------------------------------------------- panics and supervision

#[derive(Actor, Default)]
#[actor(handles(Add, Get, Boom), max_restarts = 2, restart_window_ms = 60000)]
struct Fragile {
    total: u64,
}

#[derive(Message)]
#[message(reply = u64)]
struct Boom;

impl Handler<Add> for Fragile {
    async fn handle(&mut self, m: Add, _cx: &mut Ctx<Self>) {
        self.total += m.0;
    }
}

impl Handler<Get> for Fragile {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.total
    }
}

impl Handler<Boom> for Fragile {
    async fn handle(&mut self, _m: Boom, _cx: &mut Ctx<Self>) -> u64 {
        panic!("boom (expected by the test)");
    }
}

#[test]
fn panics_fail_the_ask_and_restart_with_fresh_state_within_budget() {
    let sys = system(2);
    let a = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Fragile::default);
    let out = sys.block_on(async move {
        a.tell(Add(5)).unwrap();
        assert_eq!(a.ask(Get).await, Ok(5));
        assert_eq!(a.ask(Boom).await, Err(AskError::Panicked));
        // Restarted: fresh state, same address, the shard survived.
        assert_eq!(a.ask(Get).await, Ok(0));
        assert_eq!(a.ask(Boom).await, Err(AskError::Panicked));
        assert_eq!(a.ask(Get).await, Ok(0));
        // Third panic in the window: over budget, the actor stops.
        assert_eq!(a.ask(Boom).await, Err(AskError::Panicked));
        let after = a.ask(Get).await;
        let tell = a.tell(Add(1));
        (after, tell.map_err(|e| matches!(e, TellError::Stopped(_))))
    });
    assert_eq!(out.0, Err(AskError::Stopped));
    let stats = sys.stats().by_type("Fragile").unwrap();
    assert_eq!(stats.panics, 3);
    assert_eq!(stats.restarts, 2);
    sys.shutdown();
}

#[derive(Actor, Default)]
#[actor(handles(Get, Boom), supervision = "stop")]
struct StopsOnPanic;

impl Handler<Get> for StopsOnPanic {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        1
    }
}

impl Handler<Boom> for StopsOnPanic {
    async fn handle(&mut self, _m: Boom, _cx: &mut Ctx<Self>) -> u64 {
        panic!("stop policy (expected by the test)");
    }
}

#[test]
fn stop_policy_stops_and_queued_asks_fail_instead_of_hanging() {
    let sys = system(2);
    let a = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), StopsOnPanic::default);
    let out = sys.block_on(async move {
        let boom = a.ask(Boom);
        // Queued behind the panicking message.
        let queued: Vec<_> = (0..10).map(|_| a.ask(Get)).collect();
        let mut results = vec![boom.await];
        for q in queued {
            results.push(q.await);
        }
        results
    });
    assert_eq!(out[0], Err(AskError::Panicked));
    assert!(
        out[1..].iter().all(|r| *r == Err(AskError::Stopped)),
        "{out:?}"
    );
    sys.shutdown();
}

// ---------------------------------------------------------------- passivation

type Store = Arc<Mutex<HashMap<u64, u64>>>;

#[derive(Actor)]
#[actor(key = u64, idle_timeout_ms = 50, handles(Deposit, Balance), hooks)]
struct Durable {
    key: u64,
    balance: u64,
    store: Store,
}

impl Hooks for Durable {
    async fn on_passivate(&mut self, _cx: &mut Ctx<Self>) {
        self.store.lock().unwrap().insert(self.key, self.balance);
    }
}

impl Handler<Deposit> for Durable {
    async fn handle(&mut self, m: Deposit, _cx: &mut Ctx<Self>) {
        self.balance += m.0;
    }
}

impl Handler<Balance> for Durable {
    async fn handle(&mut self, _m: Balance, _cx: &mut Ctx<Self>) -> (u64, u64) {
        (self.key, self.balance)
    }
}

#[test]
fn idle_keyed_actor_passivates_and_reactivates_with_persisted_state() {
    let sys = system(2);
    let store: Store = Arc::default();
    let s = store.clone();
    sys.register_factory::<Durable>(move |k| Durable {
        key: *k,
        balance: s.lock().unwrap().get(k).copied().unwrap_or(0),
        store: s.clone(),
    });
    let r = sys.keyed::<Durable>(9);
    let r2 = r.clone();
    sys.block_on(async move {
        r2.tell(Deposit(7)).unwrap();
        assert_eq!(r2.ask(Balance).await, Ok((9, 7)));
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        store.lock().unwrap().get(&9),
        Some(&7),
        "on_passivate persisted"
    );
    let stats = sys.stats().by_type("Durable").unwrap();
    assert_eq!(
        (stats.activations, stats.passivations, stats.active),
        (1, 1, 0)
    );
    let b = sys.block_on(async move {
        r.tell(Deposit(1)).unwrap();
        r.ask(Balance).await
    });
    assert_eq!(b, Ok((9, 8)), "re-activated from the persisted state");
    assert_eq!(sys.stats().by_type("Durable").unwrap().activations, 2);
    sys.shutdown();
}

/// What a `Heartbeat` did, seen from outside.
#[derive(Default)]
struct Beats {
    ticks: AtomicUsize,
    passivated: AtomicUsize,
}

/// A keyed actor with an idle timeout that ticks every 10 ms from `on_start`.
#[derive(Actor)]
#[actor(key = u64, idle_timeout_ms = 60, handles(Tick, Get), hooks)]
struct Heartbeat {
    beats: Arc<Beats>,
}

impl Hooks for Heartbeat {
    async fn on_start(&mut self, cx: &mut Ctx<Self>) {
        cx.run_interval(Duration::from_millis(10), || Tick);
    }

    async fn on_passivate(&mut self, _cx: &mut Ctx<Self>) {
        self.beats.passivated.fetch_add(1, Ordering::SeqCst);
        // Ticks arrive meanwhile: they do not keep it active either.
        mailring_actors::mailring::time::sleep(Duration::from_millis(25)).await;
    }
}

impl Handler<Tick> for Heartbeat {
    async fn handle(&mut self, _m: Tick, _cx: &mut Ctx<Self>) {
        self.beats.ticks.fetch_add(1, Ordering::SeqCst);
    }
}

impl Handler<Get> for Heartbeat {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.beats.ticks.load(Ordering::SeqCst) as u64
    }
}

#[test]
fn timer_ticks_do_not_keep_a_keyed_actor_from_passivating() {
    let sys = system(2);
    let beats = Arc::new(Beats::default());
    let b = beats.clone();
    sys.register_factory::<Heartbeat>(move |_| Heartbeat { beats: b.clone() });
    let r = sys.keyed::<Heartbeat>(1);
    let b = beats.clone();
    let (passivated, ticking, before, after) = sys.block_on(async move {
        r.ask(Get).await.unwrap();
        let passivated = eventually(Duration::from_secs(2), || {
            b.passivated.load(Ordering::SeqCst) > 0
        })
        .await;
        let ticking = b.ticks.load(Ordering::SeqCst);
        // Its interval ended with the activation: no tick, no reactivation.
        mailring_actors::mailring::time::sleep(Duration::from_millis(20)).await;
        let before = b.ticks.load(Ordering::SeqCst);
        mailring_actors::mailring::time::sleep(Duration::from_millis(50)).await;
        (passivated, ticking, before, b.ticks.load(Ordering::SeqCst))
    });
    assert!(
        passivated,
        "not passivated 2 s after its last message ({ticking} ticks, each taken as activity)"
    );
    assert!(ticking >= 3, "the interval ticked ({ticking}) while active");
    assert_eq!(after, before, "ticks after passivation");
    assert_eq!(
        beats.passivated.load(Ordering::SeqCst),
        1,
        "on_passivate ran again for ticks that came in while it ran"
    );
    let stats = sys.stats().by_type("Heartbeat").unwrap();
    assert_eq!(
        (stats.activations, stats.passivations, stats.active),
        (1, 1, 0)
    );
    sys.shutdown();
}

#[derive(Message)]
struct Remind;

#[derive(Message)]
struct Poke;

/// Counts reminders and pokes; asks for a reminder in 60 ms when poked
/// first; passivates after 20 ms idle, and takes 100 ms to.
#[derive(Actor)]
#[actor(key = u64, idle_timeout_ms = 20, handles(Remind, Poke, Get), hooks)]
struct Forgetful {
    beats: Arc<Beats>,
    pokes: u64,
}

impl Hooks for Forgetful {
    async fn on_passivate(&mut self, _cx: &mut Ctx<Self>) {
        self.beats.passivated.fetch_add(1, Ordering::SeqCst);
        mailring_actors::mailring::time::sleep(Duration::from_millis(100)).await;
    }
}

impl Handler<Poke> for Forgetful {
    async fn handle(&mut self, _m: Poke, cx: &mut Ctx<Self>) {
        self.pokes += 1;
        if self.pokes == 1 {
            cx.run_later(Duration::from_millis(60), Remind);
        }
    }
}

impl Handler<Remind> for Forgetful {
    async fn handle(&mut self, _m: Remind, _cx: &mut Ctx<Self>) {
        self.beats.ticks.fetch_add(1, Ordering::SeqCst);
    }
}

impl Handler<Get> for Forgetful {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.pokes
    }
}

/// A `run_later` message that comes while the actor passivates, a
/// passivation a message then calls off: the instance goes on, and gets
/// its message (it was dropped as if the actor had gone).
#[test]
fn a_run_later_message_that_comes_during_a_called_off_passivation_is_handled() {
    let sys = system(2);
    let beats = Arc::new(Beats::default());
    let b = beats.clone();
    sys.register_factory::<Forgetful>(move |_| Forgetful {
        beats: b.clone(),
        pokes: 0,
    });
    let r = sys.keyed::<Forgetful>(1);
    let b = beats.clone();
    let (pokes, reminded, passivations) = sys.block_on(async move {
        r.tell(Poke).unwrap();
        // Idle after 20 ms: passivating until about 120 ms; the reminder
        // comes at 60 ms, this poke at 80 ms (calling the passivation off).
        mailring_actors::mailring::time::sleep(Duration::from_millis(80)).await;
        r.tell(Poke).unwrap();
        mailring_actors::mailring::time::sleep(Duration::from_millis(100)).await;
        let pokes = r.ask(Get).await.unwrap();
        (
            pokes,
            b.ticks.load(Ordering::SeqCst),
            b.passivated.load(Ordering::SeqCst),
        )
    });
    assert!(passivations >= 1, "never passivated");
    assert_eq!(pokes, 2, "the same instance went on");
    assert_eq!(reminded, 1, "the reminder was lost");
    sys.shutdown();
}

/// A keyed actor that ticks every 2 ms from `on_start` and stops itself at
/// its third tick; its `on_passivate` takes a while, and ticks keep coming.
#[derive(Actor)]
#[actor(key = u64, handles(Tick, Get), hooks)]
struct Quitter {
    beats: Arc<Beats>,
}

impl Hooks for Quitter {
    async fn on_start(&mut self, cx: &mut Ctx<Self>) {
        cx.run_interval(Duration::from_millis(2), || Tick);
    }

    async fn on_passivate(&mut self, _cx: &mut Ctx<Self>) {
        self.beats.passivated.fetch_add(1, Ordering::SeqCst);
        mailring_actors::mailring::time::sleep(Duration::from_millis(25)).await;
    }
}

impl Handler<Tick> for Quitter {
    async fn handle(&mut self, _m: Tick, cx: &mut Ctx<Self>) {
        if self.beats.ticks.fetch_add(1, Ordering::SeqCst) + 1 == 3 {
            // Slow enough that the next ticks are queued behind this one.
            std::thread::sleep(Duration::from_millis(5));
            cx.stop();
        }
    }
}

impl Handler<Get> for Quitter {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.beats.ticks.load(Ordering::SeqCst) as u64
    }
}

/// Its timers end with the activation that stopped itself: ticks queued
/// behind the stop, or delivered while `on_passivate` runs, are dropped,
/// not handed to a fresh activation (which would start the timer again,
/// and the actor would never stay stopped).
#[test]
fn timer_ticks_do_not_bring_back_a_keyed_actor_that_stopped_itself() {
    let sys = system(2);
    let beats = Arc::new(Beats::default());
    let b = beats.clone();
    sys.register_factory::<Quitter>(move |_| Quitter { beats: b.clone() });
    let r = sys.keyed::<Quitter>(1);
    let b = beats.clone();
    let (stopped, at_stop, later) = sys.block_on(async move {
        r.ask(Get).await.unwrap();
        let stopped = eventually(Duration::from_secs(2), || {
            b.passivated.load(Ordering::SeqCst) > 0
        })
        .await;
        mailring_actors::mailring::time::sleep(Duration::from_millis(40)).await;
        let at_stop = b.ticks.load(Ordering::SeqCst);
        mailring_actors::mailring::time::sleep(Duration::from_millis(60)).await;
        (stopped, at_stop, b.ticks.load(Ordering::SeqCst))
    });
    assert!(stopped, "never stopped");
    assert_eq!(at_stop, 3, "ticks handled after the stop");
    assert_eq!(later, 3, "ticking again after the stop");
    let stats = sys.stats().by_type("Quitter").unwrap();
    assert_eq!(
        (stats.activations, stats.active),
        (1, 0),
        "a tick brought it back: {stats:?}"
    );
    sys.shutdown();
}

#[derive(Actor)]
#[actor(key = u64, activate = Lru::new, max_active = 2, pinned = 0, handles(Get))]
struct Lru;

impl Lru {
    fn new(_k: &u64) -> Self {
        Lru
    }
}

impl Handler<Get> for Lru {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        1
    }
}

#[test]
fn max_active_passivates_the_least_recently_used() {
    let sys = system(2);
    let h = sys.handle();
    sys.block_on(async move {
        for k in 0..5u64 {
            h.keyed::<Lru>(k).ask(Get).await.unwrap();
        }
        // Let the passivated ones finish.
        mailring_actors::mailring::time::sleep(Duration::from_millis(20)).await;
    });
    let stats = sys.stats().by_type("Lru").unwrap();
    assert_eq!(stats.activations, 5);
    assert_eq!(stats.passivations, 3);
    assert_eq!(stats.active, 2);
    sys.shutdown();
}

#[derive(Actor)]
#[actor(key = u64, activate = LruLocal::new, max_active = 2, pinned = 0, handles(Get))]
struct LruLocal;

impl LruLocal {
    fn new(_k: &u64) -> Self {
        LruLocal
    }
}

impl Handler<Get> for LruLocal {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        1
    }
}

#[test]
fn a_key_used_through_its_local_address_is_not_the_least_recently_used() {
    let sys = system(2);
    let h = sys.handle();
    sys.block_on_local(move || async move {
        h.keyed::<LruLocal>(0).ask(Get).await.unwrap();
        let zero = h.keyed::<LruLocal>(0).local().unwrap();
        h.keyed::<LruLocal>(1).ask(Get).await.unwrap();
        // Key 0 is used last, through its local address (a tell and an
        // ask): key 1 is the one a third key pushes out.
        zero.tell(Get).unwrap();
        zero.ask(Get).await.unwrap();
        h.keyed::<LruLocal>(2).ask(Get).await.unwrap();
        mailring_actors::mailring::time::sleep(Duration::from_millis(20)).await;
        zero.ask(Get).await.unwrap();
    });
    let stats = sys.stats().by_type("LruLocal").unwrap();
    assert_eq!(
        stats.activations, 3,
        "key 0 was passivated as least recently used and activated again"
    );
    sys.shutdown();
}

// ---------------------------------------------------------------- bounded mailboxes

#[derive(Actor, Default)]
#[actor(mailbox = 4, handles(Add, Get, Hold))]
struct Slow {
    total: u64,
}

#[derive(Message)]
struct Hold(Duration);

impl Handler<Add> for Slow {
    async fn handle(&mut self, m: Add, _cx: &mut Ctx<Self>) {
        self.total += m.0;
    }
}

impl Handler<Get> for Slow {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.total
    }
}

impl Handler<Hold> for Slow {
    async fn handle(&mut self, m: Hold, _cx: &mut Ctx<Self>) {
        mailring_actors::mailring::time::sleep(m.0).await;
    }
}

#[test]
fn bounded_mailbox_try_tell_gives_the_message_back_and_send_waits() {
    let sys = system(2);
    let a = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Slow::default);
    let out = sys.block_on(async move {
        // Occupy the actor so nothing is taken for a while.
        a.try_tell(Hold(Duration::from_millis(100))).unwrap();
        mailring_actors::mailring::time::sleep(Duration::from_millis(20)).await;
        let mut accepted = 0;
        let mut refused = Vec::new();
        for i in 0..10 {
            match a.try_tell(Add(i)) {
                Ok(()) => accepted += 1,
                Err(TellError::Full(Add(v))) => refused.push(v),
                Err(e) => panic!("unexpected {e}"),
            }
        }
        // send() waits for room instead of failing.
        let start = std::time::Instant::now();
        for i in 0..10 {
            a.send(Add(i)).await.unwrap();
        }
        let waited = start.elapsed();
        let total = a.ask(Get).await.unwrap();
        (accepted, refused, waited, total)
    });
    assert_eq!(out.0, 4, "four places");
    assert_eq!(
        out.1,
        vec![4, 5, 6, 7, 8, 9],
        "the refused messages come back"
    );
    assert!(
        out.2 >= Duration::from_millis(30),
        "send waited for room: {:?}",
        out.2
    );
    assert_eq!(out.3, (0..4).sum::<u64>() + (0..10).sum::<u64>());
    let stats = sys.stats().by_type("Slow").unwrap();
    assert!(stats.mailbox_high_water >= 4, "{stats:?}");
    assert_eq!(stats.handled, 1 + 4 + 10 + 1);
    sys.shutdown();
}

#[test]
fn an_actor_spawned_on_a_shard_takes_a_message_sent_at_once_from_an_outside_thread() {
    // The spawn's registration must reach the actor's shard before any
    // message sent by whoever got its address right away, even while the
    // spawning shard is still busy in the same tick.
    let sys = system(2);
    let (tx, rx) = std::sync::mpsc::channel();
    let asker = std::thread::spawn(move || {
        let a: Addr<Counter> = rx.recv().unwrap();
        block_on_thread(a.ask(Get))
    });
    let h = sys.handle();
    sys.block_on(async move {
        let a = h.spawn_actor(Placement::Pinned(ShardId::new(1)), Counter::default);
        tx.send(a).unwrap();
        // Busy in this tick: nothing this shard batched is published yet.
        std::thread::sleep(Duration::from_millis(100));
    });
    assert_eq!(asker.join().unwrap().ok(), Some(0));
    sys.shutdown();
}

#[test]
fn a_stopped_actor_s_bounded_mailbox_never_makes_a_sender_wait() {
    // Messages sent from another shard to a stopped unkeyed actor become
    // dead letters; the places they took are never freed by it. Its
    // senders must still not wait for room (forever) nor hear `Full`.
    let sys = system(2);
    let a = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Slow::default);
    let out = sys.block_on(async move {
        a.stop();
        a.stopped().await;
        for i in 0..8 {
            let _ = a.tell(Add(i));
        }
        let sent =
            mailring_actors::mailring::time::timeout(Duration::from_secs(2), a.send(Add(9))).await;
        let tried = a.try_tell(Add(10));
        (sent.is_ok(), matches!(tried, Err(TellError::Full(_))))
    });
    assert!(out.0, "send waited for room in a stopped actor's mailbox");
    assert!(!out.1, "try_tell said Full to a stopped actor");
    sys.shutdown();
}

#[derive(Actor, Default)]
#[actor(key = u64, mailbox = 4, activate = SlowKeyed::new, handles(Add, Get, Hold))]
struct SlowKeyed {
    total: u64,
}

impl SlowKeyed {
    fn new(_key: &u64) -> Self {
        SlowKeyed::default()
    }
}

impl Handler<Add> for SlowKeyed {
    async fn handle(&mut self, m: Add, _cx: &mut Ctx<Self>) {
        self.total += m.0;
    }
}

impl Handler<Get> for SlowKeyed {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.total
    }
}

impl Handler<Hold> for SlowKeyed {
    async fn handle(&mut self, m: Hold, _cx: &mut Ctx<Self>) {
        mailring_actors::mailring::time::sleep(m.0).await;
    }
}

#[test]
fn keyed_bounded_mailbox_frees_places_as_the_actor_takes_messages() {
    let sys = system(2);
    let h = sys.handle();
    let out = sys.block_on(async move {
        // Keys on both shards, so both the local and the remote path take
        // and free places.
        let (finished, totals) =
            send_rounds_from_every_shard::<SlowKeyed>(&h, 50, 4, Duration::from_secs(10)).await;
        // The bound still holds for a keyed actor that is busy.
        let busy = h.keyed::<SlowKeyed>(9);
        busy.try_tell(Hold(Duration::from_millis(100))).unwrap();
        mailring_actors::mailring::time::sleep(Duration::from_millis(20)).await;
        let accepted = (0..10).filter(|&i| busy.try_tell(Add(i)).is_ok()).count();
        (finished, totals, accepted)
    });
    assert!(out.0, "senders waited for places that were never freed");
    let per_key = 2 * (0..50u64).sum::<u64>();
    assert_eq!(out.1, vec![per_key; 4]);
    assert_eq!(out.2, 4, "four places in a busy keyed actor's mailbox");
    sys.shutdown();
}

#[test]
fn a_stopped_keyed_bounded_actor_hands_its_queue_and_places_to_the_next_activation() {
    let sys = system(2);
    let h = sys.handle();
    let out = sys.block_on(async move {
        let mut out = Vec::new();
        // One key homed on each shard: one stop is local, one remote.
        let keys = [0, 1].map(|shard| {
            (100..)
                .find(|&k| h.keyed::<SlowKeyed>(k).shard().index() == shard)
                .unwrap()
        });
        for key in keys {
            let a = h.keyed::<SlowKeyed>(key);
            // Busy, then four queued messages, then a stop: the queued ones
            // go to the next activation with their places.
            a.try_tell(Hold(Duration::from_millis(50))).unwrap();
            mailring_actors::mailring::time::sleep(Duration::from_millis(10)).await;
            for i in 0..4 {
                a.try_tell(Add(i)).unwrap();
            }
            a.stop();
            let total = a.ask(Get).await.unwrap();
            // Every place is free again: exactly four fit behind a busy actor.
            a.try_tell(Hold(Duration::from_millis(50))).unwrap();
            mailring_actors::mailring::time::sleep(Duration::from_millis(10)).await;
            let accepted = (0..6).filter(|&i| a.try_tell(Add(i)).is_ok()).count();
            out.push((total, accepted));
        }
        out
    });
    assert_eq!(out, vec![(6, 4), (6, 4)]);
    sys.shutdown();
}

/// Keyed and bounded, with no way to be built until a factory is registered.
#[derive(Actor, Default)]
#[actor(key = u64, mailbox = 2, handles(Add))]
struct Late;

impl Handler<Add> for Late {
    async fn handle(&mut self, _m: Add, _cx: &mut Ctx<Self>) {}
}

#[test]
fn a_keyed_bounded_mailbox_without_a_factory_refuses_at_the_sender_and_keeps_no_place() {
    let sys = system(2);
    let h = sys.handle();
    let out = sys.block_on(async move {
        // A key on the other shard: without a factory its sends fail at
        // once (they used to leave with a place taken and become dead
        // letters there).
        let key = (0..)
            .find(|&k| h.keyed::<Late>(k).shard().index() == 1)
            .unwrap();
        let a = h.keyed::<Late>(key);
        let refused = (0..2)
            .filter(|&i| matches!(a.try_tell(Add(i)), Err(TellError::NoFactory(_))))
            .count();
        h.register_factory::<Late>(|_| Late);
        // Both places are free.
        let after = (0..2).filter(|&i| a.try_tell(Add(i)).is_ok()).count();
        (refused, after)
    });
    assert_eq!(out, (2, 2), "a refused send kept its place");
    let stats = sys.stats().by_type("Late").unwrap();
    assert_eq!(stats.dead_letters, 0);
    sys.shutdown();
}

// ---------------------------------------------------------------- stop and asks

#[test]
fn stop_races_with_asks_and_every_ask_resolves() {
    let sys = system(2);
    for round in 0..20 {
        let a = sys.spawn_actor(Placement::Pinned(ShardId::new(round % 2)), Counter::default);
        let rt = sys.runtime().clone();
        let results = sys.block_on(async move {
            let mut joins = Vec::new();
            for shard in 0..2 {
                let a = a.clone();
                joins.push(rt.spawn_on(ShardId::new(shard), async move {
                    let mut out = Vec::new();
                    for i in 0..50 {
                        if shard == 1 && i == 25 {
                            a.stop();
                        }
                        out.push(a.ask(Get).timeout(Duration::from_secs(10)).await);
                    }
                    out
                }));
            }
            let mut all = Vec::new();
            for j in joins {
                all.extend(j.await.unwrap());
            }
            all
        });
        assert_eq!(results.len(), 100);
        for r in results {
            assert!(
                matches!(r, Ok(0) | Err(AskError::Stopped)),
                "round {round}: {r:?}"
            );
        }
    }
    sys.shutdown();
}

// ---------------------------------------------------------------- single activation

static SINGLE: AtomicUsize = AtomicUsize::new(0);
static SINGLE_STEAL: AtomicUsize = AtomicUsize::new(0);

#[derive(Actor)]
#[actor(key = u64, activate = Once::new, handles(Add, Get))]
struct Once {
    n: u64,
}

impl Once {
    fn new(_k: &u64) -> Self {
        SINGLE.fetch_add(1, Ordering::SeqCst);
        Once { n: 0 }
    }
}

impl Handler<Add> for Once {
    async fn handle(&mut self, m: Add, _cx: &mut Ctx<Self>) {
        self.n += m.0;
    }
}

impl Handler<Get> for Once {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.n
    }
}

#[derive(Actor)]
#[actor(key = u64, activate = OnceStealable::new, placement = "stealable", handles(Add, Get))]
struct OnceStealable {
    n: u64,
}

impl OnceStealable {
    fn new(_k: &u64) -> Self {
        SINGLE_STEAL.fetch_add(1, Ordering::SeqCst);
        OnceStealable { n: 0 }
    }
}

impl Handler<Add> for OnceStealable {
    async fn handle(&mut self, m: Add, _cx: &mut Ctx<Self>) {
        self.n += m.0;
    }
}

impl Handler<Get> for OnceStealable {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.n
    }
}

#[test]
fn concurrent_first_messages_from_every_shard_activate_once() {
    const KEYS: u64 = 200;
    const SHARDS: usize = 4;
    let sys = system(SHARDS);
    let h = sys.handle();
    // Every shard's task starts routing at once (a barrier), each from its
    // own quarter of the keys round: a shard that ran alone before the
    // others started would place every stealable key on itself, correctly
    // (the least loaded then) but proving nothing about the spread.
    let start = Arc::new(std::sync::Barrier::new(SHARDS));
    let (sticky, stealable) = sys.block_on(async move {
        let mut joins = Vec::new();
        for shard in 0..SHARDS {
            let h = h.clone();
            let start = start.clone();
            joins.push(
                h.runtime()
                    .clone()
                    .spawn_on(ShardId::new(shard), async move {
                        start.wait();
                        let first = shard as u64 * (KEYS / SHARDS as u64);
                        for i in 0..KEYS {
                            let k = (first + i) % KEYS;
                            h.keyed::<Once>(k).tell(Add(1)).unwrap();
                            h.keyed::<OnceStealable>(k).tell(Add(1)).unwrap();
                        }
                    }),
            );
        }
        for j in joins {
            j.await.unwrap();
        }
        let mut sticky = 0;
        let mut stealable = 0;
        for k in 0..KEYS {
            sticky += h.keyed::<Once>(k).ask(Get).await.unwrap();
            stealable += h.keyed::<OnceStealable>(k).ask(Get).await.unwrap();
        }
        (sticky, stealable)
    });
    assert_eq!(SINGLE.load(Ordering::SeqCst), KEYS as usize);
    assert_eq!(SINGLE_STEAL.load(Ordering::SeqCst), KEYS as usize);
    assert_eq!(sticky, KEYS * SHARDS as u64);
    assert_eq!(stealable, KEYS * SHARDS as u64);
    assert_eq!(sys.handle().directory_len::<OnceStealable>(), KEYS as usize);
    let stats = sys.stats();
    assert_eq!(stats.by_type("OnceStealable").unwrap().activations, KEYS);
    // Stealable keys spread over the shards rather than piling on one.
    let used = stats
        .active_by_shard("OnceStealable")
        .iter()
        .filter(|(_, n)| *n > 0)
        .count();
    assert!(used >= 2, "{:?}", stats.active_by_shard("OnceStealable"));
    sys.shutdown();
}

/// A balanced tenant: reports the shard its handler runs on.
#[derive(Actor)]
#[actor(key = String, activate = BalancedTenant::new, placement = "balanced", handles(HomeShard))]
struct BalancedTenant;

impl BalancedTenant {
    fn new(_k: &String) -> Self {
        BalancedTenant
    }
}

#[derive(Message)]
#[message(reply = Option<ShardId>)]
struct HomeShard;

impl Handler<HomeShard> for BalancedTenant {
    async fn handle(&mut self, _m: HomeShard, _cx: &mut Ctx<Self>) -> Option<ShardId> {
        mailring::current_shard()
    }
}

/// A keyed actor placed on the shard of its first sender: reports the
/// shard its handler runs on.
#[derive(Actor)]
#[actor(key = String, activate = FirstSenderKey::new, placement = "first_sender", handles(HomeShard))]
struct FirstSenderKey;

impl FirstSenderKey {
    fn new(_k: &String) -> Self {
        FirstSenderKey
    }
}

impl Handler<HomeShard> for FirstSenderKey {
    async fn handle(&mut self, _m: HomeShard, _cx: &mut Ctx<Self>) -> Option<ShardId> {
        mailring::current_shard()
    }
}

#[test]
fn first_sender_keys_live_on_the_shard_that_first_routed_them() {
    const SHARDS: usize = 3;
    let sys = system(SHARDS);
    let h = sys.handle();
    // Shard 1 routes keys a0..a9 first, shard 2 keys b0..b9: half by
    // `shard_of` (a session following the type), half by a first message.
    let first = sys.block_on({
        let h = h.clone();
        async move {
            let mut joins = Vec::new();
            for (shard, prefix) in [(1usize, "a"), (2, "b")] {
                let h = h.clone();
                joins.push(
                    h.runtime()
                        .clone()
                        .spawn_on(ShardId::new(shard), async move {
                            let mut seen = Vec::new();
                            for i in 0..10 {
                                let name = format!("{prefix}{i}");
                                let at = if i % 2 == 0 {
                                    h.shard_of::<FirstSenderKey>(&name)
                                } else {
                                    let at = h
                                        .keyed::<FirstSenderKey>(name.clone())
                                        .ask(HomeShard)
                                        .await;
                                    at.unwrap().expect("a handler runs on a shard")
                                };
                                seen.push((name, at));
                            }
                            seen
                        }),
                );
            }
            let mut all = Vec::new();
            for j in joins {
                all.extend(j.await.unwrap());
            }
            all
        }
    });
    for (name, at) in &first {
        let want = if name.starts_with('a') { 1 } else { 2 };
        assert_eq!(at.index(), want, "{name} lives where it was first routed");
    }
    // A key first routed off every shard goes where the fewest keys were
    // placed: shard 0 here, which has none.
    for i in 0..3 {
        assert_eq!(
            sys.shard_of::<FirstSenderKey>(&format!("off{i}")).index(),
            0
        );
    }
    // A key placed ahead of its first message lives there; placing it
    // again elsewhere keeps the first record. Types without a directory,
    // and shards the system lacks, are refused.
    assert_eq!(
        h.place::<FirstSenderKey>("p".to_owned(), ShardId::new(2)),
        Ok(ShardId::new(2))
    );
    assert_eq!(
        h.place::<FirstSenderKey>("p".to_owned(), ShardId::new(1)),
        Ok(ShardId::new(2))
    );
    assert_eq!(
        h.place::<FirstSenderKey>("a0".to_owned(), ShardId::new(0)),
        Ok(ShardId::new(1))
    );
    assert_eq!(
        h.place::<FirstSenderKey>("q".to_owned(), ShardId::new(SHARDS)),
        Err(PlaceError::NoSuchShard {
            shard: SHARDS,
            shards: SHARDS
        })
    );
    assert_eq!(
        h.place::<BalancedTenant>("t".to_owned(), ShardId::new(1)),
        Ok(ShardId::new(1))
    );
    assert_eq!(
        h.place::<Account>(7, ShardId::new(1)),
        Err(PlaceError::NotDirectoryPlaced {
            actor: std::any::type_name::<Account>()
        })
    );
    // Every key's actor runs where it was placed, asked from shard 0 (not
    // its first sender), before and after activation.
    sys.block_on(async move {
        let mut all = first;
        all.push(("p".to_owned(), ShardId::new(2)));
        all.extend((0..3).map(|i| (format!("off{i}"), ShardId::new(0))));
        for (name, shard) in all {
            for _ in 0..2 {
                let at = h
                    .runtime()
                    .clone()
                    .spawn_on(ShardId::new(0), {
                        let h = h.clone();
                        let name = name.clone();
                        async move { h.keyed::<FirstSenderKey>(name).ask(HomeShard).await }
                    })
                    .await
                    .unwrap();
                assert_eq!(at.unwrap(), Some(shard), "{name}");
            }
            assert_eq!(h.shard_of::<FirstSenderKey>(&name), shard, "{name}");
        }
        assert_eq!(h.directory_len::<FirstSenderKey>(), 24);
        // Where a key was placed, if it was, without placing it: from a
        // shard (its cache, then the directory) and off every shard.
        let (placed, unplaced) = h
            .runtime()
            .clone()
            .spawn_on(ShardId::new(1), {
                let h = h.clone();
                async move {
                    (
                        h.placed_shard::<FirstSenderKey>(&"b3".to_owned()),
                        h.placed_shard::<FirstSenderKey>(&"never".to_owned()),
                    )
                }
            })
            .await
            .unwrap();
        assert_eq!((placed, unplaced), (Some(ShardId::new(2)), None));
        assert_eq!(
            h.placed_shard::<FirstSenderKey>(&"p".to_owned()),
            Some(ShardId::new(2))
        );
        assert_eq!(h.placed_shard::<FirstSenderKey>(&"never".to_owned()), None);
        assert_eq!(
            h.directory_len::<FirstSenderKey>(),
            24,
            "nothing placed by asking"
        );
        // A sticky type's keys are placed by their hash: always known.
        assert_eq!(
            h.placed_shard::<Account>(&7),
            Some(h.shard_of::<Account>(&7))
        );
    });
    let h = sys.handle();
    sys.shutdown();
    assert_eq!(
        h.place::<FirstSenderKey>("late".to_owned(), ShardId::new(0)),
        Err(PlaceError::ShuttingDown)
    );
}

/// A first-sender actor keyed by bytes, as a server keys one by a name it
/// read off the wire; with a bounded mailbox (whose count is kept per key).
#[derive(Actor)]
#[actor(key = bytes::Bytes, activate = WireKeyed::new, placement = "first_sender", mailbox = 8, handles(HomeShard))]
struct WireKeyed;

impl WireKeyed {
    fn new(_k: &bytes::Bytes) -> Self {
        WireKeyed
    }
}

impl Handler<HomeShard> for WireKeyed {
    async fn handle(&mut self, _m: HomeShard, _cx: &mut Ctx<Self>) -> Option<ShardId> {
        mailring::current_shard()
    }
}

#[test]
fn keys_cut_from_a_frame_leave_the_frame_free_once_routed_and_active() {
    let sys = system(2);
    let h = sys.handle();
    let frame = bytes::Bytes::from(vec![b'k'; 64 << 10]);
    let back = sys.block_on({
        let frame = frame.clone();
        async move {
            h.runtime()
                .clone()
                .spawn_on(ShardId::new(1), async move {
                    // Routed (the directory and this shard's cache record
                    // it), then activated (the table, the cell, the actor).
                    let key = frame.slice(0..16);
                    let shard = h.shard_of::<WireKeyed>(&key);
                    let at = h.keyed::<WireKeyed>(key).ask(HomeShard).await.unwrap();
                    (shard, at)
                })
                .await
                .unwrap()
        }
    });
    assert_eq!(back, (ShardId::new(1), Some(ShardId::new(1))));
    let h = sys.handle();
    let live = sys.block_on(async move { h.live_keys::<WireKeyed>(ShardId::new(1)).await });
    assert_eq!(live, [bytes::Bytes::from(vec![b'k'; 16])], "still active");
    assert!(frame.is_unique(), "a table keeps a slice of the frame");
    sys.shutdown();
}

#[test]
fn balanced_keys_split_evenly_and_live_where_shard_of_says() {
    const KEYS: usize = 100;
    const SHARDS: usize = 4;
    let sys = system(SHARDS);
    let h = sys.handle();
    // The bench's tenant names: a hash splits them unevenly over 2 shards
    // (45/55); balanced placement gives each shard its share exactly.
    let names: Vec<String> = (0..KEYS).map(|i| format!("tenant-{i}")).collect();
    // Half the keys first placed by `shard_of` (as a session following the
    // type does), half by a first message; from two shards at once.
    let placed = sys.block_on({
        let (h, names) = (h.clone(), names.clone());
        async move {
            let mut joins = Vec::new();
            for part in 0..2usize {
                let (h, names) = (h.clone(), names.clone());
                joins.push(
                    h.runtime()
                        .clone()
                        .spawn_on(ShardId::new(part), async move {
                            let mut seen = Vec::new();
                            for name in names.iter().skip(part).step_by(2) {
                                let shard = if part == 0 {
                                    h.shard_of::<BalancedTenant>(name)
                                } else {
                                    let at = h
                                        .keyed::<BalancedTenant>(name.clone())
                                        .ask(HomeShard)
                                        .await;
                                    at.unwrap().expect("a handler runs on a shard")
                                };
                                seen.push((name.clone(), shard));
                            }
                            seen
                        }),
                );
            }
            let mut all = Vec::new();
            for j in joins {
                all.extend(j.await.unwrap());
            }
            all
        }
    });
    let mut per_shard = [0usize; SHARDS];
    for (_, shard) in &placed {
        per_shard[shard.index()] += 1;
    }
    assert_eq!(
        per_shard,
        [KEYS / SHARDS; SHARDS],
        "balanced keys per shard"
    );
    // Every key's actor runs where `shard_of` said, before and after
    // activation, and asking again does not move it.
    sys.block_on(async move {
        for (name, shard) in placed {
            assert_eq!(h.shard_of::<BalancedTenant>(&name), shard, "{name}");
            let at = h.keyed::<BalancedTenant>(name.clone()).ask(HomeShard).await;
            assert_eq!(at.unwrap(), Some(shard), "{name}");
        }
        assert_eq!(h.directory_len::<BalancedTenant>(), KEYS);
    });
    let stats = sys.stats();
    assert_eq!(
        stats.by_type("BalancedTenant").unwrap().activations,
        KEYS as u64
    );
    sys.shutdown();
}

// ---------------------------------------------------------------- reentrancy

#[derive(Actor, Default)]
#[actor(handles(AskSelf, AskPeer, Ping))]
struct Cyclic {
    peer: Option<mailring_actors::Addr<Cyclic>>,
}

#[derive(Message)]
#[message(reply = Result<u64, AskError>)]
struct AskSelf;

#[derive(Message)]
#[message(reply = Result<u64, AskError>)]
struct AskPeer(Option<mailring_actors::Addr<Cyclic>>);

#[derive(Message)]
#[message(reply = u64)]
struct Ping;

impl Handler<AskSelf> for Cyclic {
    async fn handle(&mut self, _m: AskSelf, cx: &mut Ctx<Self>) -> Result<u64, AskError> {
        cx.myself().ask(Ping).await
    }
}

impl Handler<AskPeer> for Cyclic {
    async fn handle(&mut self, m: AskPeer, cx: &mut Ctx<Self>) -> Result<u64, AskError> {
        match m.0 {
            // First hop: remember who to call back and ask the peer to ask us.
            Some(peer) => {
                self.peer = Some(peer.clone());
                peer.ask(AskPeer(Some(cx.myself()).filter(|_| false)))
                    .await
                    .and_then(|r| r)
            }
            // Second hop: ask back the actor that is waiting on us.
            None => match &self.peer {
                Some(p) => p.ask(Ping).await,
                None => Err(AskError::Stopped),
            },
        }
    }
}

impl Handler<Ping> for Cyclic {
    async fn handle(&mut self, _m: Ping, _cx: &mut Ctx<Self>) -> u64 {
        1
    }
}

#[test]
fn ask_cycles_fail_fast_instead_of_deadlocking() {
    let sys = system(2);
    let a = sys.spawn_actor(Placement::Pinned(ShardId::new(0)), Cyclic::default);
    let b = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Cyclic::default);
    let (a2, b2) = (a.clone(), b.clone());
    let out = sys.block_on(async move {
        let own = a2.ask(AskSelf).no_timeout().await;
        // b must know a to call it back: set b.peer = a by a first hop from b.
        let _ = b2.ask(AskPeer(Some(a2.clone()))).await;
        let cycle = a2.ask(AskPeer(Some(b2.clone()))).no_timeout().await;
        (own, cycle)
    });
    assert_eq!(
        out.0,
        Ok(Err(AskError::WouldDeadlock)),
        "an actor asking itself"
    );
    assert_eq!(
        out.1,
        Ok(Err(AskError::WouldDeadlock)),
        "a asks b, b asks a"
    );
    sys.shutdown();
}

// ---------------------------------------------------------------- lifecycle, timers, watch

#[derive(Actor)]
#[actor(handles(Tick, Get, Terminated, StopMe), hooks)]
struct Lifecycle {
    log: Arc<Mutex<Vec<String>>>,
    ticks: u64,
    // !Send state is fine: the actor is built on its shard.
    local: Rc<RefCell<u64>>,
}

impl Hooks for Lifecycle {
    async fn on_start(&mut self, cx: &mut Ctx<Self>) {
        self.log.lock().unwrap().push("start".into());
        cx.run_later(Duration::from_millis(5), Tick);
        cx.run_interval(Duration::from_millis(5), || Tick);
    }

    async fn on_stop(&mut self, _cx: &mut Ctx<Self>) {
        self.log
            .lock()
            .unwrap()
            .push(format!("stop after {} ticks", self.ticks.min(3)));
    }
}

#[derive(Message)]
struct Tick;

#[derive(Message)]
struct StopMe;

impl Handler<Tick> for Lifecycle {
    async fn handle(&mut self, _m: Tick, _cx: &mut Ctx<Self>) {
        self.ticks += 1;
        *self.local.borrow_mut() += 1;
    }
}

impl Handler<Get> for Lifecycle {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.ticks
    }
}

impl Handler<StopMe> for Lifecycle {
    async fn handle(&mut self, _m: StopMe, cx: &mut Ctx<Self>) {
        cx.stop();
    }
}

impl Handler<Terminated> for Lifecycle {
    async fn handle(&mut self, m: Terminated, _cx: &mut Ctx<Self>) {
        self.log
            .lock()
            .unwrap()
            .push(format!("terminated {:?}", m.reason));
    }
}

#[derive(Actor, Default)]
#[actor(handles(WatchIt, Get, Terminated))]
struct Watcher {
    seen: Vec<Terminated>,
}

#[derive(Message)]
struct WatchIt(mailring_actors::Addr<Lifecycle>);

impl Handler<WatchIt> for Watcher {
    async fn handle(&mut self, m: WatchIt, cx: &mut Ctx<Self>) {
        cx.watch(&m.0);
    }
}

impl Handler<Get> for Watcher {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.seen.len() as u64
    }
}

impl Handler<Terminated> for Watcher {
    async fn handle(&mut self, m: Terminated, _cx: &mut Ctx<Self>) {
        assert_eq!(m.reason, StopReason::Stopped);
        self.seen.push(m);
    }
}

#[test]
fn hooks_timers_stop_and_watch() {
    let sys = system(2);
    let log = Arc::new(Mutex::new(Vec::new()));
    let l = log.clone();
    let a = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), move || Lifecycle {
        log: l.clone(),
        ticks: 0,
        local: Rc::new(RefCell::new(0)),
    });
    let w = sys.spawn_actor(Placement::Pinned(ShardId::new(0)), Watcher::default);
    let out = sys.block_on(async move {
        w.tell(WatchIt(a.clone())).unwrap();
        mailring_actors::mailring::time::sleep(Duration::from_millis(40)).await;
        let ticks = a.ask(Get).await.unwrap();
        a.tell(StopMe).unwrap();
        mailring_actors::mailring::time::sleep(Duration::from_millis(20)).await;
        let after = a.ask(Get).await;
        let seen = w.ask(Get).await.unwrap();
        (ticks, after, seen)
    });
    assert!(
        out.0 >= 3,
        "run_later + run_interval delivered {} ticks",
        out.0
    );
    assert_eq!(out.1, Err(AskError::Stopped));
    assert_eq!(out.2, 1, "the watcher got one Terminated");
    let log = log.lock().unwrap().clone();
    assert_eq!(
        log,
        vec!["start".to_string(), "stop after 3 ticks".to_string()]
    );
    sys.shutdown();
}

/// Watching an actor again while its watch stands has no effect: an actor
/// that calls `cx.watch` in every handler keeps one watch on its target
/// (the target's list grew by one each time, and the watcher got one
/// `Terminated` per call), and a target watched after its end is watched
/// anew.
#[test]
fn watching_an_actor_again_while_its_watch_stands_has_no_effect() {
    let sys = system(2);
    let make = || Lifecycle {
        log: Arc::new(Mutex::new(Vec::new())),
        ticks: 0,
        local: Rc::new(RefCell::new(0)),
    };
    let a = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), make);
    let b = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), make);
    let w = sys.spawn_actor(Placement::Pinned(ShardId::new(0)), Watcher::default);
    let seen = sys.block_on(async move {
        for _ in 0..100 {
            w.tell(WatchIt(a.clone())).unwrap();
        }
        w.tell(WatchIt(b.clone())).unwrap();
        w.ask(Get).await.unwrap();
        a.tell(StopMe).unwrap();
        while a.ask(Get).await.is_ok() {
            mailring_actors::mailring::time::sleep(Duration::from_millis(1)).await;
        }
        // Watched after its end: told at once, once more.
        w.tell(WatchIt(a.clone())).unwrap();
        b.tell(StopMe).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let seen = w.ask(Get).await.unwrap();
            if seen >= 3 || std::time::Instant::now() > deadline {
                mailring_actors::mailring::time::sleep(Duration::from_millis(50)).await;
                break w.ask(Get).await.unwrap();
            }
            mailring_actors::mailring::time::sleep(Duration::from_millis(1)).await;
        }
    });
    assert_eq!(seen, 3, "one Terminated per standing watch");
    sys.shutdown();
}

/// Activations of [`PassingWatcher`] and the `Terminated`s it handled.
static PASSING_ACTIVATIONS: AtomicUsize = AtomicUsize::new(0);
static PASSING_TERMINATED: AtomicUsize = AtomicUsize::new(0);

/// A keyed actor that watches a `Lifecycle` and passivates when idle.
#[derive(Actor)]
#[actor(key = u64, activate = PassingWatcher::new, idle_timeout_ms = 20, handles(WatchLife, Terminated))]
struct PassingWatcher;

impl PassingWatcher {
    fn new(_key: &u64) -> Self {
        PASSING_ACTIVATIONS.fetch_add(1, Ordering::SeqCst);
        PassingWatcher
    }
}

#[derive(Message)]
struct WatchLife(mailring_actors::Addr<Lifecycle>);

impl Handler<WatchLife> for PassingWatcher {
    async fn handle(&mut self, m: WatchLife, cx: &mut Ctx<Self>) {
        cx.watch(&m.0);
    }
}

impl Handler<Terminated> for PassingWatcher {
    async fn handle(&mut self, _m: Terminated, _cx: &mut Ctx<Self>) {
        PASSING_TERMINATED.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn a_watch_ends_with_the_watching_activation() {
    // A keyed actor watched a target and passivated; the target stopped
    // after. The watch ended with the activation that made it: no
    // `Terminated` comes, and nothing wakes the key again to take one.
    let sys = system(2);
    let log = Arc::new(Mutex::new(Vec::new()));
    let target = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), move || Lifecycle {
        log: log.clone(),
        ticks: 0,
        local: Rc::new(RefCell::new(0)),
    });
    let watcher = sys.keyed::<PassingWatcher>(7);
    sys.block_on(async move {
        watcher.tell(WatchLife(target.clone())).unwrap();
        // Idle for 20 ms: passivated.
        mailring_actors::mailring::time::sleep(Duration::from_millis(150)).await;
        target.tell(StopMe).unwrap();
        mailring_actors::mailring::time::sleep(Duration::from_millis(100)).await;
    });
    assert_eq!(PASSING_ACTIVATIONS.load(Ordering::SeqCst), 1);
    assert_eq!(PASSING_TERMINATED.load(Ordering::SeqCst), 0);
    sys.shutdown();
}

// ---------------------------------------------------------------- timers and waits end with their actor

/// What a `Scheduler`'s timers and waits did, seen from outside the actor.
#[derive(Default)]
struct Probe {
    /// `Tick`s the actor handled.
    ticks: AtomicUsize,
    /// Delayed messages and `wait_for` continuations that ran.
    ran: AtomicUsize,
    /// [`Guard`]s dropped (held by timer messages, closures and futures).
    dropped: AtomicUsize,
}

/// Counts its drop in its probe.
struct Guard(Arc<Probe>);

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

#[derive(Actor)]
#[actor(handles(Tick, Ran, ArmTimers, ArmWaits, LaterThenStop, StopMe, Get))]
struct Scheduler {
    probe: Arc<Probe>,
}

#[derive(Message)]
struct Ran(Guard);

#[derive(Message)]
struct ArmTimers;

#[derive(Message)]
struct ArmWaits;

#[derive(Message)]
struct LaterThenStop;

impl Handler<Tick> for Scheduler {
    async fn handle(&mut self, _m: Tick, _cx: &mut Ctx<Self>) {
        self.probe.ticks.fetch_add(1, Ordering::SeqCst);
    }
}

impl Handler<Ran> for Scheduler {
    async fn handle(&mut self, m: Ran, _cx: &mut Ctx<Self>) {
        drop(m.0);
        self.probe.ran.fetch_add(1, Ordering::SeqCst);
    }
}

impl Handler<ArmTimers> for Scheduler {
    async fn handle(&mut self, _m: ArmTimers, cx: &mut Ctx<Self>) {
        cx.run_interval(Duration::from_millis(5), || Tick);
        // Timers far in the future: their tasks hold a guard until they end.
        let held = Guard(self.probe.clone());
        cx.run_interval(Duration::from_secs(3600), move || {
            let _ = &held;
            Tick
        });
        cx.run_later(Duration::from_secs(3600), Ran(Guard(self.probe.clone())));
    }
}

impl Handler<ArmWaits> for Scheduler {
    async fn handle(&mut self, _m: ArmWaits, cx: &mut Ctx<Self>) {
        // Never ready: the task holds its future (and guard) until it ends.
        let held = Guard(self.probe.clone());
        cx.wait_for(
            async move {
                let _held = held;
                std::future::pending::<()>().await
            },
            |this: &mut Scheduler, (), _cx| {
                this.probe.ran.fetch_add(1, Ordering::SeqCst);
            },
        );
        // Ready 30 ms from now, after the actor stopped.
        let held = Guard(self.probe.clone());
        cx.wait_for(
            async move {
                let _held = held;
                mailring_actors::mailring::time::sleep(Duration::from_millis(30)).await
            },
            |this: &mut Scheduler, (), _cx| {
                this.probe.ran.fetch_add(1, Ordering::SeqCst);
            },
        );
    }
}

impl Handler<LaterThenStop> for Scheduler {
    async fn handle(&mut self, _m: LaterThenStop, cx: &mut Ctx<Self>) {
        cx.run_later(Duration::from_millis(30), Ran(Guard(self.probe.clone())));
        cx.stop();
    }
}

impl Handler<StopMe> for Scheduler {
    async fn handle(&mut self, _m: StopMe, cx: &mut Ctx<Self>) {
        cx.stop();
    }
}

impl Handler<Get> for Scheduler {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.probe.ticks.load(Ordering::SeqCst) as u64
    }
}

/// Polls `done` every millisecond for up to `within`; whether it held.
async fn eventually(within: Duration, done: impl Fn() -> bool) -> bool {
    let deadline = std::time::Instant::now() + within;
    while !done() {
        if std::time::Instant::now() >= deadline {
            return false;
        }
        mailring_actors::mailring::time::sleep(Duration::from_millis(1)).await;
    }
    true
}

#[test]
fn run_interval_and_run_later_stop_with_their_actor() {
    let sys = system(2);
    let probe = Arc::new(Probe::default());
    let p = probe.clone();
    let a = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), move || Scheduler {
        probe: p.clone(),
    });
    let p = probe.clone();
    let (before, after, all_dropped) = sys.block_on(async move {
        a.tell(ArmTimers).unwrap();
        assert!(
            eventually(Duration::from_secs(2), || p.ticks.load(Ordering::SeqCst)
                >= 3)
            .await,
            "the 5 ms interval ticks"
        );
        // A 30 ms run_later just before the stop; the ask observes the stop.
        a.tell(LaterThenStop).unwrap();
        assert_eq!(a.ask(Get).await, Err(AskError::Stopped));
        let before = p.ticks.load(Ordering::SeqCst);
        mailring_actors::mailring::time::sleep(Duration::from_millis(50)).await;
        let after = p.ticks.load(Ordering::SeqCst);
        // The hour-long interval's closure and both delayed messages.
        let all_dropped = eventually(Duration::from_secs(1), || {
            p.dropped.load(Ordering::SeqCst) == 3
        })
        .await;
        (before, after, all_dropped)
    });
    assert_eq!(after, before, "the interval ticked after its actor stopped");
    assert_eq!(
        probe.ran.load(Ordering::SeqCst),
        0,
        "a run_later message was delivered after its actor stopped"
    );
    assert!(
        all_dropped,
        "timer tasks outlived their actor: {} of 3 guards dropped a second after the stop",
        probe.dropped.load(Ordering::SeqCst)
    );
    sys.shutdown();
}

/// Starts its first timer and wait in `on_stop`, after its tasks ended:
/// both far from ready, so only their end drops what they hold.
#[derive(Actor)]
#[actor(handles(Ran, StopMe), hooks)]
struct TimersInOnStop {
    probe: Arc<Probe>,
}

impl Hooks for TimersInOnStop {
    async fn on_stop(&mut self, cx: &mut Ctx<Self>) {
        cx.run_later(Duration::from_secs(3600), Ran(Guard(self.probe.clone())));
        let held = Guard(self.probe.clone());
        cx.wait_for(
            async move {
                let _held = held;
                std::future::pending::<()>().await
            },
            |this: &mut TimersInOnStop, (), _cx| {
                this.probe.ran.fetch_add(1, Ordering::SeqCst);
            },
        );
    }
}

impl Handler<Ran> for TimersInOnStop {
    async fn handle(&mut self, m: Ran, _cx: &mut Ctx<Self>) {
        drop(m.0);
        self.probe.ran.fetch_add(1, Ordering::SeqCst);
    }
}

impl Handler<StopMe> for TimersInOnStop {
    async fn handle(&mut self, _m: StopMe, cx: &mut Ctx<Self>) {
        cx.stop();
    }
}

#[test]
fn a_timer_or_wait_first_started_in_on_stop_ends_with_its_actor() {
    let sys = system(2);
    let probe = Arc::new(Probe::default());
    let p = probe.clone();
    let a = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), move || TimersInOnStop {
        probe: p.clone(),
    });
    let p = probe.clone();
    let all_dropped = sys.block_on(async move {
        a.tell(StopMe).unwrap();
        a.stopped().await;
        eventually(Duration::from_secs(1), || {
            p.dropped.load(Ordering::SeqCst) == 2
        })
        .await
    });
    assert_eq!(
        probe.ran.load(Ordering::SeqCst),
        0,
        "a timer or wait started in on_stop ran"
    );
    assert!(
        all_dropped,
        "tasks started in on_stop outlived their actor: {} of 2 guards dropped a second after",
        probe.dropped.load(Ordering::SeqCst)
    );
    sys.shutdown();
}

#[test]
fn wait_for_futures_end_with_their_actor_and_never_continue_into_it() {
    let sys = system(2);
    let probe = Arc::new(Probe::default());
    let p = probe.clone();
    let a = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), move || Scheduler {
        probe: p.clone(),
    });
    let p = probe.clone();
    let all_dropped = sys.block_on(async move {
        a.tell(ArmWaits).unwrap();
        a.tell(StopMe).unwrap();
        assert_eq!(a.ask(Get).await, Err(AskError::Stopped));
        // Past the 30 ms wait: its continuation had its chance to run.
        mailring_actors::mailring::time::sleep(Duration::from_millis(50)).await;
        eventually(Duration::from_secs(1), || {
            p.dropped.load(Ordering::SeqCst) == 2
        })
        .await
    });
    assert_eq!(
        probe.ran.load(Ordering::SeqCst),
        0,
        "a wait_for continuation ran after its actor stopped"
    );
    assert!(
        all_dropped,
        "a wait_for future outlived its actor: {} of 2 guards dropped a second after the stop",
        probe.dropped.load(Ordering::SeqCst)
    );
    sys.shutdown();
}

// ---------------------------------------------------------------- children

#[derive(Actor, Default)]
#[actor(handles(SpawnChild, Get), hooks)]
struct Parent {
    child: Option<mailring_actors::Addr<Child>>,
    /// Starts of this parent (each test its own count: tests run at once).
    starts: Arc<AtomicUsize>,
}

impl Hooks for Parent {
    async fn on_start(&mut self, _cx: &mut Ctx<Self>) {
        self.starts.fetch_add(1, Ordering::SeqCst);
    }
}

#[derive(Actor, Default)]
#[actor(handles(Get, Boom), supervision = "escalate")]
struct Child;

impl Handler<Get> for Child {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        7
    }
}

impl Handler<Boom> for Child {
    async fn handle(&mut self, _m: Boom, _cx: &mut Ctx<Self>) -> u64 {
        panic!("child failure (expected by the test)");
    }
}

#[derive(Message)]
#[message(reply = mailring_actors::Addr<Child>)]
struct SpawnChild;

impl Handler<SpawnChild> for Parent {
    async fn handle(&mut self, _m: SpawnChild, cx: &mut Ctx<Self>) -> mailring_actors::Addr<Child> {
        let c = cx.spawn_child(Placement::Pinned(ShardId::new(1)), Child::default);
        self.child = Some(c.clone());
        c
    }
}

impl Handler<Get> for Parent {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        u64::from(self.child.is_some())
    }
}

#[test]
fn escalation_restarts_the_parent_and_stops_its_children() {
    let sys = system(2);
    let starts = Arc::new(AtomicUsize::new(0));
    let counted = starts.clone();
    let p = sys.spawn_actor(Placement::Pinned(ShardId::new(0)), move || Parent {
        child: None,
        starts: counted.clone(),
    });
    let out = sys.block_on(async move {
        let child = p.ask(SpawnChild).await.unwrap();
        assert_eq!(child.ask(Get).await, Ok(7));
        assert_eq!(p.ask(Get).await, Ok(1));
        assert_eq!(child.ask(Boom).await, Err(AskError::Panicked));
        mailring_actors::mailring::time::sleep(Duration::from_millis(30)).await;
        // The parent restarted with fresh state (no child); the child is gone.
        (p.ask(Get).await, child.ask(Get).await)
    });
    assert_eq!(out, (Ok(0), Err(AskError::Stopped)));
    assert_eq!(starts.load(Ordering::SeqCst), 2);
    sys.shutdown();
}

#[test]
fn stopping_a_parent_stops_its_children() {
    let sys = system(2);
    let p = sys.spawn_actor(Placement::Pinned(ShardId::new(0)), Parent::default);
    let out = sys.block_on(async move {
        let child = p.ask(SpawnChild).await.unwrap();
        assert_eq!(child.ask(Get).await, Ok(7));
        p.stop();
        mailring_actors::mailring::time::sleep(Duration::from_millis(30)).await;
        child.ask(Get).await
    });
    assert_eq!(out, Err(AskError::Stopped));
    sys.shutdown();
}

/// Spawns short-lived children on demand and says how many it holds.
#[derive(Actor, Default)]
#[actor(handles(SpawnShortLived, CountChildren))]
struct Spawner;

#[derive(Message)]
#[message(reply = mailring_actors::Addr<Child>)]
struct SpawnShortLived;

#[derive(Message)]
#[message(reply = usize)]
struct CountChildren;

impl Handler<SpawnShortLived> for Spawner {
    async fn handle(
        &mut self,
        _m: SpawnShortLived,
        cx: &mut Ctx<Self>,
    ) -> mailring_actors::Addr<Child> {
        cx.spawn_child(Placement::Pinned(ShardId::new(1)), Child::default)
    }
}

impl Handler<CountChildren> for Spawner {
    async fn handle(&mut self, _m: CountChildren, cx: &mut Ctx<Self>) -> usize {
        cx.child_count()
    }
}

#[test]
fn a_parent_keeps_no_record_of_children_that_ended() {
    // One short-lived child per request, a thousand times: the parent
    // holds the live ones only.
    let sys = system(2);
    let p = sys.spawn_actor(Placement::Pinned(ShardId::new(0)), Spawner::default);
    let (live, after) = sys.block_on(async move {
        let mut kept = Vec::new();
        for i in 0..1000 {
            let child = p.ask(SpawnShortLived).await.unwrap();
            if i % 100 == 0 {
                kept.push(child);
            } else {
                child.stop();
            }
        }
        mailring_actors::mailring::time::sleep(Duration::from_millis(50)).await;
        let live = p.ask(CountChildren).await.unwrap();
        for child in &kept {
            child.stop();
        }
        mailring_actors::mailring::time::sleep(Duration::from_millis(50)).await;
        (live, p.ask(CountChildren).await.unwrap())
    });
    assert_eq!((live, after), (10, 0));
    sys.shutdown();
}

// ---------------------------------------------------------------- registry, dyn mailbox, shutdown

#[derive(Actor, Default)]
struct Dynamic {
    n: u64,
}

impl Handler<Add> for Dynamic {
    async fn handle(&mut self, m: Add, _cx: &mut Ctx<Self>) {
        self.n += m.0;
    }
}

impl Handler<Get> for Dynamic {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.n
    }
}

#[test]
fn registry_lookup_and_boxed_mailbox_without_handles_list() {
    let sys = system(2);
    let d = sys.spawn_actor(Placement::RoundRobin, Dynamic::default);
    let h = sys.handle();
    h.register_name("dynamic", d);
    assert!(h.lookup::<Counter>("dynamic").is_none(), "wrong type");
    assert!(h.lookup::<Dynamic>("nope").is_none());
    let found = h.lookup::<Dynamic>("dynamic").unwrap();
    let n = sys.block_on(async move {
        found.tell(Add(3)).unwrap();
        found.ask(Get).await
    });
    assert_eq!(n, Ok(3));
    assert!(h.unregister_name("dynamic"));
    sys.shutdown();
}

static STOPS_AT_SHUTDOWN: AtomicUsize = AtomicUsize::new(0);

#[derive(Actor, Default)]
#[actor(handles(Get), hooks)]
struct ShutdownWatcher;

impl Hooks for ShutdownWatcher {
    async fn on_stop(&mut self, _cx: &mut Ctx<Self>) {
        STOPS_AT_SHUTDOWN.fetch_add(1, Ordering::SeqCst);
    }
}

impl Handler<Get> for ShutdownWatcher {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        mailring_actors::mailring::time::sleep(Duration::from_secs(3600)).await;
        0
    }
}

#[test]
fn shutdown_runs_on_stop_and_fails_pending_asks() {
    let sys = ActorSystem::start_with(
        Runtime::builder().shards(2),
        SystemConfig {
            shutdown_grace: Duration::from_millis(200),
            ..SystemConfig::default()
        },
    )
    .unwrap();
    let addrs: Vec<_> = (0..4)
        .map(|i| {
            sys.spawn_actor(
                Placement::Pinned(ShardId::new(i % 2)),
                ShutdownWatcher::default,
            )
        })
        .collect();
    // Idle actors stop at once; the busy one is dropped after the grace period.
    let pending = addrs[0].ask(Get).no_timeout();
    std::thread::sleep(Duration::from_millis(20));
    sys.shutdown();
    assert_eq!(STOPS_AT_SHUTDOWN.load(Ordering::SeqCst), 3);
    assert!(
        block_on_thread(pending).is_err(),
        "a pending ask fails, never hangs"
    );
}

/// An actor whose `Nap` keeps it busy far past any shutdown grace.
#[derive(Actor, Default)]
#[actor(handles(LongNap, Get))]
struct Napper;

#[derive(Message)]
struct LongNap;

impl Handler<LongNap> for Napper {
    async fn handle(&mut self, _m: LongNap, _cx: &mut Ctx<Self>) {
        mailring_actors::mailring::time::sleep(Duration::from_secs(3600)).await;
    }
}

impl Handler<Get> for Napper {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        0
    }
}

#[test]
fn shutdown_reports_stopped_and_abandoned_actors_and_handler_panics() {
    let sys = ActorSystem::start_with(
        Runtime::builder().shards(2),
        SystemConfig {
            shutdown_grace: Duration::from_millis(100),
            ..SystemConfig::default()
        },
    )
    .unwrap();
    let busy = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Napper::default);
    let flaky = sys.spawn_actor(Placement::Pinned(ShardId::new(0)), Fragile::default);
    let idle = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Counter::default);
    sys.block_on(async move {
        assert_eq!(busy.ask(Get).await, Ok(0), "started");
        busy.tell(LongNap).unwrap();
        assert_eq!(flaky.ask(Boom).await, Err(AskError::Panicked));
        assert_eq!(flaky.ask(Get).await, Ok(0), "restarted");
        // Behind the nap on the same shard: the nap has begun.
        assert_eq!(idle.ask(Get).await, Ok(0));
    });
    let report = sys.shutdown();
    assert_eq!(report.actors_stopped, 2, "{report:?}");
    assert_eq!(report.actors_abandoned, 1, "the napper, {report:?}");
    assert_eq!(report.actor_panics, 1, "{report:?}");
    assert!(
        report.runtime.tasks_cancelled >= 1,
        "the napper's task was dropped with the runtime: {report:?}"
    );
    assert!(!report.is_clean());
}

#[test]
fn a_shutdown_with_every_actor_stopped_in_time_reports_clean() {
    let sys = system(2);
    let c = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Counter::default);
    sys.block_on(async move { c.ask(Get).await }).unwrap();
    let report = sys.shutdown();
    assert_eq!(
        (
            report.actors_stopped,
            report.actors_abandoned,
            report.actor_panics
        ),
        (1, 0, 0),
        "{report:?}"
    );
    assert!(report.is_clean(), "{report:?}");
}

/// Counts its `on_stop` in a flag shared with the test.
#[derive(Actor)]
#[actor(handles(Get), hooks)]
struct StopFlag {
    stopped: Arc<AtomicUsize>,
}

impl Hooks for StopFlag {
    async fn on_stop(&mut self, _cx: &mut Ctx<Self>) {
        self.stopped.fetch_add(1, Ordering::SeqCst);
    }
}

impl Handler<Get> for StopFlag {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        0
    }
}

#[test]
fn dropping_the_system_inside_one_of_its_own_tasks_shuts_it_down_without_panicking() {
    let sys = system(2);
    let stopped = Arc::new(AtomicUsize::new(0));
    let s = stopped.clone();
    let a = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), move || StopFlag {
        stopped: s.clone(),
    });
    assert_eq!(sys.block_on(async move { a.ask(Get).await }), Ok(0));
    let (went_on, after_drop) = std::sync::mpsc::channel();
    let rt = sys.runtime().clone();
    rt.spawn_on(ShardId::new(0), async move {
        drop(sys);
        let _ = went_on.send(());
    })
    .detach();
    assert_eq!(
        after_drop.recv_timeout(Duration::from_secs(10)),
        Ok(()),
        "the task that dropped the system did not go on (it panicked in the drop)"
    );
    // The shutdown went on without the task: the actor was stopped gracefully.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while stopped.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(stopped.load(Ordering::SeqCst), 1, "on_stop ran");
}

// ---------------------------------------------------------------- !Send messages on the actor's shard

#[derive(Actor, Default)]
#[actor(handles(ShareRc, Get))]
struct RcHolder {
    sum: u64,
}

/// A message that cannot cross threads.
#[derive(Message)]
struct ShareRc(Rc<RefCell<u64>>);

impl Handler<ShareRc> for RcHolder {
    async fn handle(&mut self, m: ShareRc, _cx: &mut Ctx<Self>) {
        *m.0.borrow_mut() += 1;
        self.sum += *m.0.borrow();
    }
}

impl Handler<Get> for RcHolder {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.sum
    }
}

#[test]
fn local_addr_sends_non_send_messages_on_the_actors_shard() {
    let sys = system(2);
    let a = sys.spawn_actor(Placement::Pinned(ShardId::new(0)), RcHolder::default);
    let other = a.clone();
    let out = sys.block_on_local(move || async move {
        // block_on_local runs on shard 0, the actor's shard.
        let local = a.local().expect("on the actor's shard");
        let shared = Rc::new(RefCell::new(0));
        for _ in 0..3 {
            local.tell(ShareRc(shared.clone())).unwrap();
        }
        let sum = local.ask(Get).await.unwrap();
        let seen = *shared.borrow();
        (sum, seen)
    });
    assert_eq!(out, (1 + 2 + 3, 3));
    // Off the actor's shard there is no LocalAddr.
    let wrong = sys.block_on(async move {
        let h = other.system().runtime().clone();
        h.spawn_on(ShardId::new(1), async move { other.local().err() })
            .await
            .unwrap()
    });
    assert_eq!(wrong, Some(AskError::WrongShard));
    let stats = sys.stats().by_type("RcHolder").unwrap();
    assert_eq!(stats.handled, 4);
    sys.shutdown();
}

// ---------------------------------------------------------------- causality through join

#[test]
fn tells_are_delivered_before_the_senders_join_completes() {
    // A task tells an actor on another shard and finishes; whoever joins it
    // and then asks that actor must find every tell handled.
    let sys = system(2);
    let c = sys.spawn_actor(Placement::Pinned(ShardId::new(0)), Counter::default);
    let rt = sys.runtime().clone();
    let short = sys.block_on(async move {
        let mut short = 0;
        for round in 1..=300u64 {
            let c2 = c.clone();
            let n = 1 + round % 97;
            let remote = rt.spawn_on(ShardId::new(1), async move {
                for _ in 0..n {
                    c2.tell(Add(1)).unwrap();
                }
            });
            // Publish the spawn, then keep this shard busy while the remote
            // task runs, so that its handle is polled right after it
            // completes rather than woken.
            mailring_actors::mailring::time::sleep(Duration::from_micros(1)).await;
            let start = std::time::Instant::now();
            while !remote.is_finished() && start.elapsed() < Duration::from_millis(50) {
                std::hint::spin_loop();
            }
            remote.await.unwrap();
            let expected: u64 = (1..=round).map(|r| 1 + r % 97).sum();
            if c.ask(Get).await.unwrap() != expected {
                short += 1;
            }
        }
        short
    });
    assert_eq!(short, 0, "rounds where the join overtook the tells");
    sys.shutdown();
}

// ---------------------------------------------------------------- wait_for: messages interleave while a handler waits

#[derive(Actor, Default)]
#[actor(handles(SlowWork, Get, AskPeerLater))]
struct Patient {
    done: u64,
}

#[derive(Message)]
struct SlowWork(Duration);

#[derive(Message)]
struct AskPeerLater(mailring_actors::Addr<Patient>);

impl Handler<SlowWork> for Patient {
    async fn handle(&mut self, m: SlowWork, cx: &mut Ctx<Self>) {
        cx.wait_for(
            mailring_actors::mailring::time::sleep(m.0),
            |this, (), _cx| {
                this.done += 1;
            },
        );
    }
}

impl Handler<Get> for Patient {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.done
    }
}

impl Handler<AskPeerLater> for Patient {
    async fn handle(&mut self, m: AskPeerLater, cx: &mut Ctx<Self>) {
        // Asking from inside a handler while the peer may ask us back: with
        // wait_for the ask runs off the actor, so no cycle can form.
        let peer = m.0;
        cx.wait_for(async move { peer.ask(Get).await }, |this, got, _cx| {
            this.done += 10 + got.unwrap_or(100);
        });
    }
}

#[test]
fn wait_for_lets_other_messages_interleave() {
    let sys = system(2);
    let a = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Patient::default);
    let b = sys.spawn_actor(Placement::Pinned(ShardId::new(0)), Patient::default);
    let out = sys.block_on(async move {
        a.tell(SlowWork(Duration::from_millis(50))).unwrap();
        // Handled while the slow work is pending.
        let during = a.ask(Get).await.unwrap();
        mailring_actors::mailring::time::sleep(Duration::from_millis(100)).await;
        let after = a.ask(Get).await.unwrap();
        a.tell(AskPeerLater(b.clone())).unwrap();
        b.tell(AskPeerLater(a.clone())).unwrap();
        mailring_actors::mailring::time::sleep(Duration::from_millis(20)).await;
        (
            during,
            after,
            a.ask(Get).await.unwrap(),
            b.ask(Get).await.unwrap(),
        )
    });
    assert_eq!(out.0, 0, "the ask was answered while the work was pending");
    assert_eq!(out.1, 1, "the continuation ran afterwards, with &mut self");
    // Each asked the other while being asked: no deadlock, both continued.
    assert!(out.2 >= 11 && out.3 >= 10, "{out:?}");
    sys.shutdown();
}

// ---------------------------------------------------------------- keyed stop: queued messages are not lost

static KEYED_SEEN: AtomicUsize = AtomicUsize::new(0);
static KEYED_STARTS: AtomicUsize = AtomicUsize::new(0);

#[derive(Actor)]
#[actor(key = u64, activate = Restartable::new, handles(Add, StopMe, Get))]
struct Restartable;

impl Restartable {
    fn new(_k: &u64) -> Self {
        KEYED_STARTS.fetch_add(1, Ordering::SeqCst);
        Restartable
    }
}

impl Handler<Add> for Restartable {
    async fn handle(&mut self, _m: Add, _cx: &mut Ctx<Self>) {
        KEYED_SEEN.fetch_add(1, Ordering::SeqCst);
    }
}

impl Handler<StopMe> for Restartable {
    async fn handle(&mut self, _m: StopMe, cx: &mut Ctx<Self>) {
        cx.stop();
    }
}

impl Handler<Get> for Restartable {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        KEYED_SEEN.load(Ordering::SeqCst) as u64
    }
}

#[test]
fn a_stopped_keyed_actor_hands_its_queued_messages_to_the_next_activation() {
    let sys = system(2);
    let r = sys.keyed::<Restartable>(5);
    let seen = sys.block_on(async move {
        for i in 0..200 {
            r.tell(Add(1)).unwrap();
            if i == 50 {
                r.tell(StopMe).unwrap();
            }
        }
        r.ask(Get).await.unwrap()
    });
    assert_eq!(
        seen, 200,
        "every message handled across the two activations"
    );
    assert_eq!(KEYED_STARTS.load(Ordering::SeqCst), 2);
    let stats = sys.stats().by_type("Restartable").unwrap();
    assert_eq!((stats.activations, stats.passivations), (2, 1));
    sys.shutdown();
}

// ---------------------------------------------------------------- ask cells under races

#[derive(Message)]
#[message(reply = Arc<()>)]
struct Echo(Arc<()>, u64);

#[derive(Actor, Default)]
#[actor(handles(Echo))]
struct Echoer;

impl Handler<Echo> for Echoer {
    async fn handle(&mut self, m: Echo, _cx: &mut Ctx<Self>) -> Arc<()> {
        if m.1 % 3 == 0 {
            mailring_actors::mailring::time::sleep(Duration::from_micros(m.1 % 200)).await;
        }
        m.0
    }
}

#[test]
fn asks_given_up_dropped_or_answered_across_shards_leak_nothing() {
    // Every message and every answer holds a clone of `token`; asks time out
    // while the answer is on its way, replies are dropped unawaited, and the
    // actors stop while asks are queued. When all is over, the token's count
    // is back to one: each ask's cell freed what it held, exactly once.
    let token = Arc::new(());
    let sys = system(2);
    let actors: Vec<_> = (0..8)
        .map(|i| sys.spawn_actor(Placement::Pinned(ShardId::new(i % 2)), Echoer::default))
        .collect();
    let rt = sys.runtime().clone();
    let (t, a) = (token.clone(), actors.clone());
    let (answered, timed_out, stopped) = sys.block_on(async move {
        let mut joins = Vec::new();
        for task in 0..4u64 {
            let (t, a) = (t.clone(), a.clone());
            joins.push(rt.spawn_on(ShardId::new(task as usize % 2), async move {
                let mut counts = (0, 0, 0);
                for i in 0..1500u64 {
                    let n = i * 4 + task;
                    let actor = &a[(n % 8) as usize];
                    if i == 1200 && task == 3 {
                        a[5].stop();
                    }
                    let reply = actor.ask(Echo(t.clone(), n));
                    if n % 7 == 0 {
                        drop(reply);
                        continue;
                    }
                    match reply.timeout(Duration::from_micros(n % 150)).await {
                        Ok(echoed) => {
                            assert!(Arc::ptr_eq(&echoed, &t));
                            counts.0 += 1;
                        }
                        Err(AskError::Timeout) => counts.1 += 1,
                        Err(AskError::Stopped) => counts.2 += 1,
                        Err(e) => panic!("ask {n}: {e:?}"),
                    }
                }
                counts
            }));
        }
        let mut total = (0, 0, 0);
        for j in joins {
            let c = j.await.unwrap();
            total = (total.0 + c.0, total.1 + c.1, total.2 + c.2);
        }
        total
    });
    assert!(
        answered > 0 && timed_out > 0,
        "{answered} answered, {timed_out} timed out"
    );
    assert!(stopped > 0, "no ask met the stopped actor");
    for a in &actors {
        a.stop();
    }
    drop(actors);
    sys.shutdown();
    assert_eq!(
        Arc::strong_count(&token),
        1,
        "an ask cell leaked its message or answer"
    );
}

#[derive(Message)]
#[message(reply = ())]
struct Nap(u64);

#[derive(Actor, Default)]
#[actor(handles(Nap))]
struct Sleeper;

impl Handler<Nap> for Sleeper {
    async fn handle(&mut self, m: Nap, _cx: &mut Ctx<Self>) {
        mailring_actors::mailring::time::sleep(Duration::from_millis(m.0)).await;
    }
}

/// An ask for a nap of `nap_ms` with `timeout`, polled once on shard 0
/// (which arms the deadline's timer there) and handed out unawaited.
fn armed_on_shard_0(
    sys: &ActorSystem,
    a: mailring_actors::Addr<Sleeper>,
    nap_ms: u64,
    timeout: Duration,
) -> mailring_actors::Reply<()> {
    let reply = sys.block_on(async move {
        let mut reply = a.ask(Nap(nap_ms)).timeout(timeout);
        std::future::poll_fn(|cx| {
            assert!(std::future::Future::poll(std::pin::Pin::new(&mut reply), cx).is_pending());
            std::task::Poll::Ready(())
        })
        .await;
        // Wrapped: the block hands the reply over rather than awaiting it.
        Some(reply)
    });
    reply.expect("the reply")
}

#[test]
fn a_reply_armed_on_a_shard_still_times_out_on_an_outside_thread() {
    let sys = system(2);
    let a = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Sleeper::default);
    let reply = armed_on_shard_0(&sys, a, 300, Duration::from_millis(20));
    // Polled from here on, off every shard: no panic, and the deadline holds
    // (without it the answer would come, as `Ok`, after the 300 ms nap).
    assert_eq!(block_on_thread(reply), Err(AskError::Timeout));
    sys.shutdown();
}

#[test]
fn references_made_on_shards_work_anywhere_and_outlive_the_system() {
    // A reference built on a shard counts on that shard's replica of the
    // system; it must work from other shards and outside threads, clone
    // anywhere, and fail cleanly once the system is gone.
    let sys = system(2);
    let h = sys.handle();
    let rt = sys.runtime().clone();
    let refs = sys.block_on(async move {
        let made_on_1 = rt
            .spawn_on(ShardId::new(1), {
                let h = h.clone();
                async move {
                    (0..8u64)
                        .map(|k| h.keyed::<Account>(1000 + k))
                        .collect::<Vec<_>>()
                }
            })
            .await
            .unwrap();
        // Used (and cloned) on shard 0.
        for (i, r) in made_on_1.iter().enumerate() {
            r.clone().tell(Deposit(i as u64 + 1)).unwrap();
        }
        made_on_1
    });
    // Asked from a thread outside the runtime.
    let outside = std::thread::spawn(move || {
        refs.iter()
            .map(|r| block_on_thread(r.ask(Balance)).unwrap().1)
            .sum::<u64>()
    });
    let refs_after: Vec<_> = (0..2)
        .map(|k| sys.handle().keyed::<Account>(1000 + k))
        .collect();
    assert_eq!(outside.join().unwrap(), (1..=8).sum::<u64>());
    sys.shutdown();
    for r in refs_after {
        assert!(matches!(
            r.tell(Deposit(1)),
            Err(TellError::ShuttingDown(_))
        ));
    }
}

// ---------------------------------------------------------------- deadlines off a shard

/// Polls `fut` on this thread and parks until its waker is called: nothing
/// but a wake polls it again (as a Tokio task or a `futures` executor).
fn block_on_wakes_only<F: std::future::Future>(fut: F) -> F::Output {
    use std::sync::atomic::AtomicBool;
    use std::task::{Context, Poll, Wake, Waker};
    struct Flag(std::thread::Thread, AtomicBool);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.1.store(true, Ordering::Release);
            self.0.unpark();
        }
    }
    let flag = Arc::new(Flag(std::thread::current(), AtomicBool::new(false)));
    let waker = Waker::from(flag.clone());
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        while !flag.1.swap(false, Ordering::Acquire) {
            std::thread::park();
        }
    }
}

/// Awaits `reply` on a thread of its own (see [`block_on_wakes_only`]) and
/// gives its outcome, or `None` when it has not resolved within `within`.
fn await_off_shard<T: Send + 'static>(
    reply: impl std::future::Future<Output = T> + Send + 'static,
    within: Duration,
) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(block_on_wakes_only(reply));
    });
    rx.recv_timeout(within).ok()
}

fn napping_system(config: SystemConfig) -> ActorSystem {
    ActorSystem::start_with(
        Runtime::builder().shards(2),
        SystemConfig {
            // The nappers are dropped, not waited for.
            shutdown_grace: Duration::from_millis(50),
            ..config
        },
    )
    .expect("io_uring available")
}

#[test]
fn an_ask_timeout_fires_when_the_reply_is_awaited_off_a_shard() {
    let sys = napping_system(SystemConfig::default());
    let a = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Sleeper::default);
    let reply = a.ask(Nap(10_000)).timeout(Duration::from_millis(50));
    let outcome = await_off_shard(reply, Duration::from_secs(2));
    assert_eq!(outcome, Some(Err(AskError::Timeout)));
    sys.shutdown();
}

#[test]
fn the_default_ask_timeout_fires_when_the_reply_is_awaited_off_a_shard() {
    let sys = napping_system(SystemConfig {
        ask_timeout: Some(Duration::from_millis(50)),
        ..SystemConfig::default()
    });
    let a = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Sleeper::default);
    let outcome = await_off_shard(a.ask(Nap(10_000)), Duration::from_secs(2));
    assert_eq!(outcome, Some(Err(AskError::Timeout)));
    sys.shutdown();
}

#[test]
fn a_reply_before_the_deadline_arrives_off_a_shard() {
    let sys = napping_system(SystemConfig::default());
    let a = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Sleeper::default);
    let reply = a.ask(Nap(10)).timeout(Duration::from_secs(1));
    let outcome = await_off_shard(reply, Duration::from_secs(2));
    assert_eq!(outcome, Some(Ok(())));
    // Many at once, each with a deadline the answer beats.
    let replies: Vec<_> = (0..64)
        .map(|_| a.ask(Nap(0)).timeout(Duration::from_secs(1)))
        .collect();
    let outcome = await_off_shard(
        async move {
            let mut all = Vec::new();
            for r in replies {
                all.push(r.await);
            }
            all
        },
        Duration::from_secs(2),
    );
    assert_eq!(outcome, Some(vec![Ok(()); 64]));
    sys.shutdown();
}

#[test]
fn a_reply_armed_on_a_shard_times_out_when_then_awaited_off_it() {
    let sys = napping_system(SystemConfig::default());
    let a = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Sleeper::default);
    let reply = armed_on_shard_0(&sys, a, 10_000, Duration::from_millis(50));
    let outcome = await_off_shard(reply, Duration::from_secs(2));
    assert_eq!(outcome, Some(Err(AskError::Timeout)));
    sys.shutdown();
}

#[test]
fn an_armed_reply_dropped_off_its_shard_releases_its_timer() {
    let sys = napping_system(SystemConfig::default());
    let a = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Sleeper::default);
    let armed = |sys: &ActorSystem| sys.runtime().stats().shards[0].timers_armed;
    let reply = sys.block_on(async move {
        let mut reply = a.ask(Nap(10_000)).timeout(Duration::from_secs(3600));
        // One poll on shard 0 arms the deadline's timer there.
        std::future::poll_fn(|cx| {
            assert!(std::future::Future::poll(std::pin::Pin::new(&mut reply), cx).is_pending());
            std::task::Poll::Ready(())
        })
        .await;
        Some(reply)
    });
    let wait_for = |want: u64| {
        let start = std::time::Instant::now();
        while armed(&sys) != want && start.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(1));
        }
        armed(&sys)
    };
    assert_eq!(wait_for(1), 1, "armed on shard 0");
    // Given up on this thread, outside the runtime.
    drop(reply);
    assert_eq!(wait_for(0), 0, "the timer stays until its deadline");
    sys.shutdown();
}

/// At most one active per shard, with a passivation that takes 50 ms.
#[derive(Actor)]
#[actor(key = u64, activate = LruSlow::new, max_active = 1, pinned = 0, handles(Get), hooks)]
struct LruSlow;

impl LruSlow {
    fn new(_k: &u64) -> Self {
        LruSlow
    }
}

impl Hooks for LruSlow {
    async fn on_passivate(&mut self, _cx: &mut Ctx<Self>) {
        mailring_actors::mailring::time::sleep(Duration::from_millis(50)).await;
    }
}

impl Handler<Get> for LruSlow {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        1
    }
}

#[test]
fn the_active_limit_passes_over_an_actor_already_passivating() {
    let sys = system(2);
    let h = sys.handle().clone();
    sys.block_on(async move {
        // Key 1 pushes key 0 out; key 2 comes while key 0 still
        // passivates, and must push key 1 out (not pick key 0 again).
        for k in 0..3u64 {
            h.keyed::<LruSlow>(k).ask(Get).await.unwrap();
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while sys.stats().by_type("LruSlow").unwrap().active > 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            sys.stats().by_type("LruSlow")
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(sys.stats().by_type("LruSlow").unwrap().passivations, 2);
    sys.shutdown();
}

#[derive(Message)]
struct Load;

/// A keyed cache that loads in the background (80 ms), with a 20 ms idle
/// timeout.
#[derive(Actor)]
#[actor(key = u64, activate = SlowCache::new, idle_timeout_ms = 20, handles(Load, Get))]
struct SlowCache {
    value: u64,
}

impl SlowCache {
    fn new(_k: &u64) -> Self {
        SlowCache { value: 0 }
    }
}

impl Handler<Load> for SlowCache {
    async fn handle(&mut self, _m: Load, cx: &mut Ctx<Self>) {
        cx.wait_for(
            async {
                mailring_actors::mailring::time::sleep(Duration::from_millis(80)).await;
                42
            },
            |me: &mut Self, v: u64, _: &mut Ctx<Self>| {
                me.value = v;
                LOADED.store(v, std::sync::atomic::Ordering::SeqCst);
            },
        );
    }
}

impl Handler<Get> for SlowCache {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.value
    }
}

/// What `SlowCache`'s continuation loaded.
static LOADED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

#[test]
fn an_actor_waiting_for_something_is_not_idle() {
    let sys = system(2);
    let k = sys.handle().keyed::<SlowCache>(1);
    sys.block_on(async move {
        k.tell(Load).unwrap();
        // Well past the idle timeout and the load: it stayed active while
        // it waited, and its continuation ran on it (it passivates after).
        mailring_actors::mailring::time::sleep(Duration::from_millis(200)).await;
    });
    assert_eq!(
        LOADED.load(std::sync::atomic::Ordering::SeqCst),
        42,
        "it passivated mid-wait and lost what it waited for"
    );
    let stats = sys.stats().by_type("SlowCache").unwrap();
    assert_eq!((stats.activations, stats.passivations), (1, 1), "{stats:?}");
    sys.shutdown();
}

/// Keys passivated by the active limit, in order.
static LRU_MODEL_GONE: Mutex<Vec<u64>> = Mutex::new(Vec::new());

#[derive(Actor)]
#[actor(key = u64, activate = LruModel::new, max_active = 4, pinned = 0, handles(Get), hooks)]
struct LruModel(u64);

impl LruModel {
    fn new(k: &u64) -> Self {
        LruModel(*k)
    }
}

impl Hooks for LruModel {
    async fn on_passivate(&mut self, _cx: &mut Ctx<Self>) {
        LRU_MODEL_GONE.lock().unwrap().push(self.0);
    }
}

impl Handler<Get> for LruModel {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.0
    }
}

/// Over a long mixed run of uses and new keys, the active limit passivates
/// exactly the key a model LRU list says, each time.
#[test]
fn the_active_limit_passivates_exactly_what_a_model_lru_says() {
    let sys = system(1);
    let h = sys.handle().clone();
    let expected = sys.block_on(async move {
        let mut model: Vec<u64> = Vec::new(); // least recently used first
        let mut gone = Vec::new();
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..400 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Mostly the few hot keys, sometimes one of many cold ones.
            let k = if x % 3 == 0 { x % 40 } else { x % 6 };
            let new = !model.contains(&k);
            model.retain(|&m| m != k);
            model.push(k);
            if new && model.len() > 4 {
                gone.push(model.remove(0));
            }
            assert_eq!(h.keyed::<LruModel>(k).ask(Get).await.unwrap(), k);
            if new {
                // The victim passivates on its next turn.
                mailring_actors::mailring::time::sleep(Duration::from_millis(1)).await;
            }
        }
        // A burst of new keys, told without a wait between them: the
        // victims cannot leave meanwhile, and each new key still pushes
        // out the least recently used of those that stay (they run their
        // `on_passivate` once the burst is over, in the order their tasks
        // come: compared as a set).
        let mut burst = Vec::new();
        for k in 100..110u64 {
            model.push(k);
            burst.push(model.remove(0));
            h.keyed::<LruModel>(k).tell(Get).unwrap();
        }
        mailring_actors::mailring::time::sleep(Duration::from_millis(20)).await;
        (gone, burst)
    });
    let (expected, mut burst) = expected;
    assert!(expected.len() > 50, "the run passivated {}", expected.len());
    let seen = LRU_MODEL_GONE.lock().unwrap().clone();
    assert_eq!(seen[..expected.len()], expected[..]);
    let mut seen_in_burst = seen[expected.len()..].to_vec();
    seen_in_burst.sort_unstable();
    burst.sort_unstable();
    assert_eq!(seen_in_burst, burst, "passivated in the burst");
    sys.shutdown();
}
