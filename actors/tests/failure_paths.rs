//! Failure paths of the actor layer found by review: each test is bounded
//! (a would-be hang fails by timeout) and goes through the public API.

use std::sync::{Arc, Mutex};
use std::time::Duration;

mod common;

use common::{Add, Get};
use mailring_actors::mailring::panic::CallbackKind;
use mailring_actors::mailring::time::{sleep, timeout};
use mailring_actors::{
    Actor, ActorSystem, Addr, AskError, Ctx, Handler, Hooks, Message, Placement, Runtime, ShardId,
    StopReason, SystemConfig, TellError, Terminated,
};

const S1: ShardId = ShardId::new(1);

fn system(shards: usize) -> ActorSystem {
    ActorSystem::start(Runtime::builder().shards(shards)).expect("io_uring available")
}

/// Two shards, and a shutdown that waits `grace` for actors.
fn system_with_grace(grace: Duration) -> ActorSystem {
    let config = SystemConfig {
        shutdown_grace: grace,
        ..SystemConfig::default()
    };
    ActorSystem::start_with(Runtime::builder().shards(2), config).expect("io_uring available")
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

// ---------------------------------------------------------------- an actor whose Drop panics

/// Panics in its handler of [`Explode`] (a restart drops it) and in its
/// `Drop`.
#[derive(Actor, Default)]
#[actor(handles(Explode, Get))]
struct DropPanics {
    n: u64,
}

#[derive(Message)]
struct Explode;

impl Handler<Explode> for DropPanics {
    async fn handle(&mut self, _m: Explode, _cx: &mut Ctx<Self>) {
        panic!("handler panics");
    }
}

impl Handler<Get> for DropPanics {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.n
    }
}

impl Drop for DropPanics {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            panic!("DropPanics::drop panics");
        }
    }
}

/// A restart whose old actor's `Drop` panics still restarts (or stops)
/// the actor: an ask sent after the panic resolves, never hangs.
#[test]
fn a_drop_panicking_at_restart_leaves_no_zombie_actor() {
    let sys = system(2);
    let a = sys.spawn_actor(Placement::Pinned(S1), DropPanics::default);
    let out = sys.block_on(async move {
        a.tell(Explode).unwrap();
        let first = timeout(Duration::from_secs(2), a.ask(Get)).await;
        let second = timeout(Duration::from_secs(2), a.ask(Get)).await;
        (first, second)
    });
    let first = out.0.expect("the ask after the panic never resolved");
    let second = out.1.expect("a second ask never resolved");
    assert_eq!(first, Ok(0), "the actor restarted with fresh state");
    assert_eq!(second, Ok(0));
    let drop_panics: u64 = sys
        .runtime()
        .stats()
        .shards
        .iter()
        .map(|s| s.panics.get(CallbackKind::Drop))
        .sum();
    assert_eq!(drop_panics, 1, "the Drop's panic is reported as one");
    sys.shutdown();
}

/// Watches an actor and records the [`Terminated`] it gets.
#[derive(Actor)]
#[actor(handles(WatchAndStop, Terminated))]
struct Watcher {
    seen: Arc<Mutex<Vec<Terminated>>>,
}

#[derive(Message)]
struct WatchAndStop(Addr<DropPanics>);

impl Handler<WatchAndStop> for Watcher {
    async fn handle(&mut self, m: WatchAndStop, cx: &mut Ctx<Self>) {
        cx.watch(&m.0);
        m.0.stop();
    }
}

impl Handler<Terminated> for Watcher {
    async fn handle(&mut self, m: Terminated, _cx: &mut Ctx<Self>) {
        self.seen.lock().unwrap().push(m);
    }
}

/// An actor whose `Drop` panics at its stop still ends: its watchers get
/// `Terminated`, and later asks fail instead of hanging.
#[test]
fn a_drop_panicking_at_stop_still_notifies_watchers() {
    let sys = system(2);
    let target = sys.spawn_actor(Placement::Pinned(S1), DropPanics::default);
    let seen: Arc<Mutex<Vec<Terminated>>> = Arc::default();
    let s = seen.clone();
    let w = sys.spawn_actor(Placement::Pinned(ShardId::new(0)), move || Watcher {
        seen: s.clone(),
    });
    let (notified, after) = sys.block_on(async move {
        w.tell(WatchAndStop(target.clone())).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while seen.lock().unwrap().is_empty() && std::time::Instant::now() < deadline {
            sleep(Duration::from_millis(1)).await;
        }
        let notified = seen
            .lock()
            .unwrap()
            .iter()
            .map(|t| t.reason)
            .collect::<Vec<_>>();
        let after = timeout(Duration::from_secs(2), target.ask(Get)).await;
        (notified, after)
    });
    assert_eq!(
        notified,
        vec![StopReason::Stopped],
        "the watcher was not told"
    );
    assert_eq!(
        after.expect("an ask to the stopped actor never resolved"),
        Err(AskError::Stopped)
    );
    sys.shutdown();
}

// ---------------------------------------------------------------- a full bounded mailbox at shutdown

/// A bounded actor (one place) whose handler naps.
#[derive(Actor, Default)]
#[actor(mailbox = 1, handles(Nap))]
struct Napper;

#[derive(Message)]
struct Nap(Duration);

impl Handler<Nap> for Napper {
    async fn handle(&mut self, m: Nap, _cx: &mut Ctx<Self>) {
        sleep(m.0).await;
    }
}

/// A sender (on a thread of another runtime) waiting for room in a full
/// bounded mailbox whose actor never takes another message: the system's
/// shutdown abandons the actor, and the send resolves with `ShuttingDown`
/// instead of waiting forever.
#[test]
fn a_send_waiting_for_room_resolves_when_the_system_shuts_down() {
    let sys = system_with_grace(Duration::from_millis(50));
    let a = sys.spawn_actor(Placement::Pinned(S1), Napper::default);
    let (queued_tx, queued_rx) = std::sync::mpsc::channel();
    let sender = std::thread::spawn(move || {
        let rt = Runtime::builder().shards(1).build().expect("io_uring");
        let out = rt.block_on(async move {
            timeout(Duration::from_secs(5), async move {
                let mut sent = 0u32;
                loop {
                    match a.send(Nap(Duration::from_secs(3600))).await {
                        Ok(()) => sent += 1,
                        Err(e) => return (sent, matches!(e, TellError::ShuttingDown(_))),
                    }
                    if sent == 2 {
                        // One handled (napping), one queued: the next waits.
                        let _ = queued_tx.send(());
                    }
                }
            })
            .await
        });
        rt.shutdown();
        out
    });
    queued_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the first two sends went through");
    std::thread::sleep(Duration::from_millis(20));
    let report = sys.shutdown();
    assert_eq!(report.actors_abandoned, 1, "{report:?}");
    let out = sender.join().expect("the sender thread");
    let (sent, shutting_down) = out.expect("the send waiting for room never resolved");
    assert_eq!(sent, 2);
    assert!(shutting_down, "the waiting send failed with ShuttingDown");
}

// ---------------------------------------------------------------- pinned to a shard the system lacks

/// A keyed actor pinned to shard 5.
#[derive(Actor, Default)]
#[actor(key = u64, pinned = 5, activate = PinnedFar::new, handles(Add, Get))]
struct PinnedFar {
    total: u64,
}

impl PinnedFar {
    fn new(_key: &u64) -> Self {
        PinnedFar::default()
    }
}

impl Handler<Add> for PinnedFar {
    async fn handle(&mut self, m: Add, _cx: &mut Ctx<Self>) {
        self.total += m.0;
    }
}

impl Handler<Get> for PinnedFar {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.total
    }
}

/// `pinned = 5` on a two-shard system: sends fail with `NoSuchShard` (from
/// an outside thread and from each shard), nothing panics.
#[test]
fn a_keyed_actor_pinned_past_the_last_shard_fails_its_sends() {
    let sys = system(2);
    let a = sys.keyed::<PinnedFar>(7);
    // From this thread (not a shard of the system).
    assert!(matches!(
        a.tell(Add(1)),
        Err(TellError::NoSuchShard(Add(1)))
    ));
    assert!(matches!(a.try_tell(Add(1)), Err(TellError::NoSuchShard(_))));
    for shard in 0..2 {
        let a = a.clone();
        let out = sys.block_on(sys.runtime().spawn_on(ShardId::new(shard), async move {
            let told = matches!(a.tell(Add(1)), Err(TellError::NoSuchShard(_)));
            let sent = matches!(
                timeout(Duration::from_secs(2), a.send(Add(1))).await,
                Ok(Err(TellError::NoSuchShard(_)))
            );
            let asked = timeout(Duration::from_secs(2), a.ask(Get)).await;
            a.stop();
            (told, sent, asked)
        }));
        let (told, sent, asked) = out.expect("the sending task did not panic");
        assert!(told, "tell on shard {shard}");
        assert!(sent, "send on shard {shard}");
        assert_eq!(
            asked,
            Ok(Err(AskError::NoSuchShard)),
            "ask on shard {shard}"
        );
    }
    let panics: u64 = sys
        .runtime()
        .stats()
        .shards
        .iter()
        .map(|s| s.panics.total())
        .sum();
    assert_eq!(panics, 0);
    sys.shutdown();
}

// ---------------------------------------------------------------- dropped on another runtime's shard

/// Says when its `on_stop` runs.
#[derive(Actor)]
#[actor(handles(Get), hooks)]
struct StopSignal {
    stopped: std::sync::mpsc::Sender<()>,
}

impl Hooks for StopSignal {
    async fn on_stop(&mut self, _cx: &mut Ctx<Self>) {
        let _ = self.stopped.send(());
    }
}

impl Handler<Get> for StopSignal {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        1
    }
}

/// An `ActorSystem` dropped in a task of another mailring runtime shuts
/// down without panicking (blocking on its runtime there would), and its
/// actors get `on_stop`.
#[test]
fn a_system_dropped_on_another_runtimes_shard_shuts_down_cleanly() {
    let sys = system(2);
    let (tx, rx) = std::sync::mpsc::channel();
    let a = sys.spawn_actor(Placement::Pinned(S1), move || StopSignal {
        stopped: tx.clone(),
    });
    assert_eq!(sys.block_on(async move { a.ask(Get).await }), Ok(1));
    let other = Runtime::builder().shards(1).build().expect("io_uring");
    let dropped = other.block_on(other.handle().spawn_on(ShardId::new(0), async move {
        drop(sys);
    }));
    assert!(dropped.is_ok(), "dropping the system panicked: {dropped:?}");
    assert!(
        rx.recv_timeout(Duration::from_secs(5)).is_ok(),
        "the system's actor never ran on_stop"
    );
    other.shutdown();
}

// ---------------------------------------------------------------- a zero interval

#[derive(Actor, Default)]
#[actor(handles(StartZero, Get))]
struct ZeroTicker {
    total: u64,
}

#[derive(Message)]
#[message(reply = ())]
struct StartZero;

impl Handler<StartZero> for ZeroTicker {
    async fn handle(&mut self, _m: StartZero, cx: &mut Ctx<Self>) {
        cx.run_interval(Duration::ZERO, || Get);
    }
}

impl Handler<Get> for ZeroTicker {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.total
    }
}

/// A zero-period interval fails the handler that asked for it (its ask
/// says `Panicked`, supervision restarts the actor, the runtime counts a
/// handler panic) instead of panicking later inside the timer's own task,
/// where nothing supervised noticed.
#[test]
fn a_zero_interval_fails_the_handler_that_asks_for_it() {
    let sys = system(2);
    let a = sys.spawn_actor(Placement::Pinned(S1), ZeroTicker::default);
    let (started, after) = sys.block_on(async move {
        let started = timeout(Duration::from_secs(5), a.ask(StartZero)).await;
        let after = timeout(Duration::from_secs(5), a.ask(Get)).await;
        (started, after)
    });
    assert_eq!(started.expect("answered"), Err(AskError::Panicked));
    assert_eq!(after.expect("answered"), Ok(0), "restarted and answering");
    let stats = sys.runtime().stats();
    let handler: u64 = stats
        .shards
        .iter()
        .map(|s| s.panics.get(CallbackKind::Handler))
        .sum();
    let task: u64 = stats
        .shards
        .iter()
        .map(|s| s.panics.get(CallbackKind::Task))
        .sum();
    assert_eq!((handler, task), (1, 0));
}

// ---------------------------------------------------------------- nothing kept alive after shutdown

/// A name registered for an actor made a cycle (the named `Addr` holds the
/// system, which holds the names) that kept the system's and the runtime's
/// shared state alive after shutdown, with everything they hold: here, the
/// panic hook and what it captured.
#[test]
fn a_registered_name_does_not_keep_the_system_alive_after_shutdown() {
    let token = Arc::new(());
    let held = token.clone();
    let builder = Runtime::builder().shards(2).on_panic(move |_| {
        let _ = &held;
    });
    let sys = ActorSystem::start(builder).expect("io_uring available");
    let a = sys.spawn_actor(Placement::Pinned(S1), common::Counter::default);
    sys.handle().register_name("counter", a);
    assert_eq!(Arc::strong_count(&token), 2);
    sys.shutdown();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while Arc::strong_count(&token) > 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the system's shared state outlived its shutdown"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

// ---------------------------------------------------------------- a key whose Hash panics

/// A key whose `Hash` panics for the value 13 on shard 1 (where its actors
/// live); it routes as its number.
#[derive(Clone, Debug, PartialEq, Eq, mailring_actors::RouteKey)]
struct TrapKey(u64);

impl std::hash::Hash for TrapKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        if self.0 == 13 && mailring_actors::mailring::current_shard() == Some(S1) {
            panic!("injected: hashing key 13 on shard 1");
        }
        self.0.hash(state);
    }
}

#[derive(Actor)]
#[actor(key = TrapKey, pinned = 1, activate = Trapped::new, handles(Add, Get))]
struct Trapped {
    total: u64,
}

impl Trapped {
    fn new(_key: &TrapKey) -> Self {
        Trapped { total: 0 }
    }
}

impl Handler<Add> for Trapped {
    async fn handle(&mut self, m: Add, _cx: &mut Ctx<Self>) {
        self.total += m.0;
    }
}

impl Handler<Get> for Trapped {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.total
    }
}

#[test]
fn a_key_hash_panicking_mid_batch_gives_the_batch_credits_back() {
    let window = 16;
    let config = SystemConfig {
        cross_shard_window: window,
        ..SystemConfig::default()
    };
    let sys = ActorSystem::start_with(Runtime::builder().shards(2), config).expect("io_uring");
    let h = sys.handle();
    let total = sys.block_on(async move {
        mailring_actors::mailring::spawn_on(ShardId::new(0), async move {
            // One tick, one batch: the trapped key first, then the rest of a
            // full window. The receiving shard panics looking up the first.
            h.keyed::<Trapped>(TrapKey(13)).tell(Add(1)).unwrap();
            for k in 1..window as u64 {
                h.keyed::<Trapped>(TrapKey(k)).tell(Add(1)).unwrap();
            }
            // The window's credits must come back though the batch was lost
            // to the panic: a window's worth of sends that wait for credit.
            let one = h.keyed::<Trapped>(TrapKey(1));
            for _ in 0..2 * window {
                let sent = timeout(Duration::from_secs(5), one.send(Add(1))).await;
                sent.expect("credit returned").unwrap();
            }
            h.keyed::<Trapped>(TrapKey(1)).ask(Get).await
        })
        .await
        .unwrap()
    });
    assert!(total.unwrap() >= 2 * window as u64);
    let stats = sys.runtime().stats();
    assert!(stats.shards[1].panics.total() >= 1, "{stats:?}");
    sys.shutdown();
}

/// [`Trapped`] with a bounded mailbox: each message holds a place until
/// its actor takes it.
#[derive(Actor)]
#[actor(key = TrapKey, pinned = 1, mailbox = 4, activate = BoundedTrapped::new, handles(Add, Get))]
struct BoundedTrapped {
    total: u64,
}

impl BoundedTrapped {
    fn new(_key: &TrapKey) -> Self {
        BoundedTrapped { total: 0 }
    }
}

impl Handler<Add> for BoundedTrapped {
    async fn handle(&mut self, m: Add, _cx: &mut Ctx<Self>) {
        self.total += m.0;
    }
}

impl Handler<Get> for BoundedTrapped {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.total
    }
}

#[test]
fn a_key_hash_panicking_mid_batch_frees_the_mailbox_places_of_what_it_dropped() {
    let sys = system(2);
    let h = sys.handle();
    let (sent, total) = sys.block_on(async move {
        mailring_actors::mailring::spawn_on(ShardId::new(0), async move {
            // One batch: the trapped key, then a full mailbox's worth for
            // key 1, lost with it.
            h.keyed::<BoundedTrapped>(TrapKey(13)).tell(Add(1)).unwrap();
            let one = h.keyed::<BoundedTrapped>(TrapKey(1));
            for _ in 0..4 {
                one.tell(Add(1)).unwrap();
            }
            // Their places come back: a send finds room.
            let sent = timeout(Duration::from_secs(5), one.send(Add(1))).await;
            (sent, one.ask(Get).await)
        })
        .await
        .unwrap()
    });
    assert!(
        matches!(sent, Ok(Ok(()))),
        "the send waited for places a lost batch still holds: {sent:?}"
    );
    assert_eq!(total, Ok(1), "the lost batch's four, then the send's one");
    let dead = sys.stats().by_type("BoundedTrapped").unwrap().dead_letters;
    assert!(dead >= 4, "the lost tells are dead letters: {dead}");
    sys.shutdown();
}

#[test]
fn live_keys_of_a_shard_the_system_has_not_are_none_not_a_panic() {
    let sys = system(2);
    let h = sys.handle().clone();
    let keys = sys.block_on(async move { h.live_keys::<Trapped>(ShardId::new(9)).await });
    assert!(keys.is_empty());
    sys.shutdown();
}

#[test]
#[should_panic(expected = "shard 5 does not exist: the system has 2 shards")]
fn spawning_an_actor_pinned_past_the_last_shard_panics_at_the_call() {
    let sys = system(2);
    let _ = sys.spawn_actor(Placement::Pinned(ShardId::new(5)), common::Counter::default);
}

// ---------------------------------------------------------------- a handler that never yields

/// Blocks its shard's thread in its handler until `release` is set.
#[derive(Actor)]
#[actor(handles(Block))]
struct Blocker {
    release: Arc<std::sync::atomic::AtomicBool>,
    entered: Arc<std::sync::atomic::AtomicBool>,
}

#[derive(Message)]
struct Block;

impl Handler<Block> for Blocker {
    async fn handle(&mut self, _m: Block, _cx: &mut Ctx<Self>) {
        use std::sync::atomic::Ordering;
        self.entered.store(true, Ordering::SeqCst);
        while !self.release.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

#[test]
fn a_handler_that_never_yields_does_not_hang_system_shutdown() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let sys = system_with_grace(Duration::from_millis(100));
    let release = Arc::new(AtomicBool::new(false));
    let entered = Arc::new(AtomicBool::new(false));
    let (r, e) = (release.clone(), entered.clone());
    let blocker = sys.spawn_actor(Placement::Pinned(S1), move || Blocker {
        release: r.clone(),
        entered: e.clone(),
    });
    let counter = sys.spawn_actor(Placement::Pinned(ShardId::new(0)), common::Counter::default);
    blocker.tell(Block).unwrap();
    while !entered.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(1));
    }
    // Shard 0 still works while shard 1 is stuck.
    counter.tell(Add(2)).unwrap();
    assert_eq!(sys.block_on(async move { counter.ask(Get).await }), Ok(2));
    let started = std::time::Instant::now();
    let report = sys.shutdown();
    // A hang check, not a timing claim: unbounded, this never returned.
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(report.runtime.shards_abandoned >= 1, "{report:?}");
    assert!(!report.is_clean());
    release.store(true, Ordering::SeqCst);
}

// ---------------------------------------------------------------- a keyed type that cannot be built

/// Keyed, without `activate`: built only by a registered factory.
#[derive(Actor)]
#[actor(key = u64, handles(Add, Get))]
struct Unbuildable {
    total: u64,
}

impl Handler<Add> for Unbuildable {
    async fn handle(&mut self, m: Add, _cx: &mut Ctx<Self>) {
        self.total += m.0;
    }
}

impl Handler<Get> for Unbuildable {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.total
    }
}

#[test]
fn a_keyed_type_without_activate_or_factory_fails_the_send_not_silently() {
    let sys = system(2);
    let h = sys.handle();
    // From outside, and from each shard (one of them the key's).
    assert!(matches!(
        sys.keyed::<Unbuildable>(1).tell(Add(1)),
        Err(TellError::NoFactory(_))
    ));
    for shard in 0..2 {
        let h = h.clone();
        let (told, asked) = sys
            .block_on(sys.runtime().spawn_on(ShardId::new(shard), async move {
                let k = h.keyed::<Unbuildable>(1);
                (
                    matches!(k.tell(Add(1)), Err(TellError::NoFactory(_))),
                    k.ask(Get).await,
                )
            }))
            .unwrap();
        assert!(told);
        assert_eq!(asked, Err(AskError::NoFactory));
    }
    // Registered, it is built on demand.
    sys.register_factory::<Unbuildable>(|_key| Unbuildable { total: 0 });
    let k = sys.keyed::<Unbuildable>(1);
    k.tell(Add(5)).unwrap();
    assert_eq!(sys.block_on(async move { k.ask(Get).await }), Ok(5));
    sys.shutdown();
}

// ---------------------------------------------------------------- a restart loop yields

/// Fails its `on_start` every time, before any await, with a restart
/// budget that never runs out.
#[derive(Actor, Default)]
#[actor(handles(Get), hooks, max_restarts = 4294967295, restart_window_ms = 1)]
struct NeverStarts;

impl Hooks for NeverStarts {
    async fn on_start(&mut self, _cx: &mut Ctx<Self>) {
        panic!("a database that cannot be reached");
    }
}

impl Handler<Get> for NeverStarts {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        0
    }
}

#[test]
fn an_actor_restarting_without_end_leaves_its_shard_serving_the_others() {
    // Each restart ran the factory and `on_start` at once, with no await
    // between: the shard never ran anything else again.
    let sys = system_with_grace(Duration::from_millis(300));
    let _stuck = sys.spawn_actor(Placement::Pinned(S1), NeverStarts::default);
    let counter = sys.spawn_actor(Placement::Pinned(S1), common::Counter::default);
    let answered = sys.block_on(async move {
        timeout(Duration::from_secs(5), async {
            counter.tell(Add(2)).unwrap();
            counter.ask(Get).await
        })
        .await
    });
    assert_eq!(answered, Ok(Ok(2)), "the shard's other actor answers");
    sys.shutdown();
}

// ---------------------------------------------------------------- a send to itself on a full mailbox

/// A bounded actor (two places) that sends itself `Add`s from a handler.
#[derive(Actor, Default)]
#[actor(mailbox = 2, handles(Add, Get, SendSelf))]
struct SelfSender {
    total: u64,
}

#[derive(Message)]
struct SendSelf(u64);

impl Handler<SendSelf> for SelfSender {
    async fn handle(&mut self, m: SendSelf, cx: &mut Ctx<Self>) {
        let me = cx.myself();
        for _ in 0..m.0 {
            me.send(Add(1)).await.unwrap();
        }
    }
}

impl Handler<Add> for SelfSender {
    async fn handle(&mut self, m: Add, _cx: &mut Ctx<Self>) {
        self.total += m.0;
    }
}

impl Handler<Get> for SelfSender {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.total
    }
}

#[test]
fn a_handler_sending_to_its_own_full_mailbox_goes_on() {
    // Only this actor frees its places, and not while its handler waits:
    // a send to itself takes a place past the bound, as a timer's does.
    let sys = system(2);
    let a = sys.spawn_actor(Placement::Pinned(S1), SelfSender::default);
    let total = sys.block_on(async move {
        timeout(Duration::from_secs(5), async {
            a.ask(SendSelf(10)).await.unwrap();
            a.ask(Get).await
        })
        .await
    });
    assert_eq!(total, Ok(Ok(10)));
    sys.shutdown();
}
