//! Panic injection in the actor layer: a panic in a handler, a lifecycle
//! hook, a factory or a message's `Drop` is caught on the actor's shard,
//! reported to the runtime (its stats per kind, the `on_panic` hook, the
//! shutdown report) and dealt with by supervision; other actors, on this
//! shard and the other, keep working.

use std::sync::{Arc, Mutex};
use std::time::Duration;

mod common;

use common::{Add, Counter, Get, WhereAmI};
use mailring_actors::mailring::panic::{CallbackKind, PanicEvent};
use mailring_actors::{
    Actor, ActorSystem, AskError, Ctx, Handler, Hooks, Message, Placement, Runtime, ShardId,
};

const S1: ShardId = ShardId::new(1);

type Seen = Arc<Mutex<Vec<(CallbackKind, String)>>>;

fn system_with_hook() -> (ActorSystem, Seen) {
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let builder = Runtime::builder()
        .shards(2)
        .on_panic(move |e: &PanicEvent<'_>| {
            log.lock().unwrap().push((e.kind, e.message.to_owned()))
        });
    (ActorSystem::start(builder).expect("io_uring"), seen)
}

/// Actors on both shards still answer.
fn assert_actors_work(sys: &ActorSystem) {
    let a = sys.spawn_actor(Placement::Pinned(ShardId::new(0)), Counter::default);
    let b = sys.spawn_actor(Placement::Pinned(S1), Counter::default);
    let (x, y) = sys.block_on(async move {
        a.tell(Add(2)).unwrap();
        b.tell(Add(3)).unwrap();
        (a.ask(Get).await, b.ask(WhereAmI).await)
    });
    assert_eq!((x, y), (Ok(2), Ok(1)));
}

fn runtime_panics(sys: &ActorSystem, kind: CallbackKind) -> u64 {
    sys.runtime()
        .stats()
        .shards
        .iter()
        .map(|s| s.panics.get(kind))
        .sum()
}

#[derive(Actor, Default)]
#[actor(handles(Explode, Get))]
struct Volatile {
    n: u64,
}

#[derive(Message)]
#[message(reply = u64)]
struct Explode;

impl Handler<Explode> for Volatile {
    async fn handle(&mut self, _m: Explode, _cx: &mut Ctx<Self>) -> u64 {
        panic!("handler boom");
    }
}

impl Handler<Get> for Volatile {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.n
    }
}

#[test]
fn a_handler_panic_is_reported_to_the_runtime_and_supervised() {
    let (sys, seen) = system_with_hook();
    let a = sys.spawn_actor(Placement::Pinned(S1), Volatile::default);
    let (boom, after) = sys.block_on(async move { (a.ask(Explode).await, a.ask(Get).await) });
    assert_eq!(boom, Err(AskError::Panicked));
    assert_eq!(after, Ok(0), "restarted with fresh state");
    assert_eq!(runtime_panics(&sys, CallbackKind::Handler), 1);
    assert!(seen
        .lock()
        .unwrap()
        .contains(&(CallbackKind::Handler, "handler boom".to_owned())));
    assert_actors_work(&sys);
    let report = sys.shutdown();
    assert_eq!(report.runtime.panics.handler, 1);
}

#[derive(Actor, Default)]
#[actor(handles(Get), hooks)]
struct BadStart;

impl Hooks for BadStart {
    async fn on_start(&mut self, _cx: &mut Ctx<Self>) {
        panic!("on_start boom");
    }
}

impl Handler<Get> for BadStart {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        1
    }
}

#[test]
fn a_lifecycle_hook_panic_is_reported_and_the_shard_goes_on() {
    let (sys, seen) = system_with_hook();
    let a = sys.spawn_actor(Placement::Pinned(S1), BadStart::default);
    let asked = sys.block_on(async move {
        mailring_actors::mailring::time::timeout(Duration::from_secs(5), a.ask(Get)).await
    });
    assert!(asked.expect("answered").is_err());
    assert!(runtime_panics(&sys, CallbackKind::LifecycleHook) >= 1);
    assert!(seen
        .lock()
        .unwrap()
        .iter()
        .any(|(k, m)| *k == CallbackKind::LifecycleHook && m == "on_start boom"));
    assert_actors_work(&sys);
}

#[test]
fn a_factory_panic_is_reported_and_the_ask_fails() {
    let (sys, _seen) = system_with_hook();
    let a = sys.spawn_actor(Placement::Pinned(S1), || -> Counter {
        panic!("factory boom")
    });
    let asked = sys.block_on(async move {
        mailring_actors::mailring::time::timeout(Duration::from_secs(5), a.ask(Get)).await
    });
    assert!(asked.expect("answered").is_err());
    assert_eq!(runtime_panics(&sys, CallbackKind::Factory), 1);
    assert_actors_work(&sys);
}

/// A message whose `Drop` panics.
#[derive(Message)]
struct Grenade;

impl Drop for Grenade {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            panic!("message drop boom");
        }
    }
}

#[derive(Actor, Default)]
#[actor(handles(Grenade, Add, Get))]
struct Sink {
    total: u64,
}

impl Handler<Grenade> for Sink {
    async fn handle(&mut self, m: Grenade, _cx: &mut Ctx<Self>) {
        std::mem::forget(m);
    }
}

impl Handler<Add> for Sink {
    async fn handle(&mut self, m: Add, _cx: &mut Ctx<Self>) {
        self.total += m.0;
    }
}

impl Handler<Get> for Sink {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.total
    }
}

/// Dead letters whose `Drop` panics are dropped by the delivery of a
/// cross-shard batch that carries other actors' messages too: those must
/// still be delivered.
#[test]
fn a_dead_letter_whose_drop_panics_does_not_lose_the_rest_of_its_batch() {
    let (sys, _seen) = system_with_hook();
    let dead = sys.spawn_actor(Placement::Pinned(S1), Sink::default);
    let live = sys.spawn_actor(Placement::Pinned(S1), Sink::default);
    let total = sys.block_on(async move {
        dead.stop();
        // Wait until the stop took effect (asks fail once it has).
        while dead.ask(Get).await.is_ok() {
            mailring_actors::mailring::time::sleep(Duration::from_millis(1)).await;
        }
        // One batch from shard 0 to shard 1: dead letters between live messages.
        for i in 0..10 {
            live.tell(Add(1)).unwrap();
            if i % 3 == 0 {
                let _ = dead.tell(Grenade);
            }
        }
        live.ask(Get).await
    });
    assert_eq!(total, Ok(10), "every live message of the batch arrived");
    assert!(runtime_panics(&sys, CallbackKind::Drop) >= 1);
    assert_actors_work(&sys);
}

/// A keyed total whose `on_passivate` half-writes its state, waits, then
/// panics (its persistence failed, say).
#[derive(Actor)]
#[actor(key = u64, activate = Brittle::new, handles(Add, Get), idle_timeout_ms = 20, hooks)]
struct Brittle {
    total: u64,
}

impl Brittle {
    fn new(_key: &u64) -> Self {
        Brittle { total: 0 }
    }
}

/// Set once `Brittle`'s passivation has begun.
static PASSIVATING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `Brittle`'s `on_stop` calls.
static BRITTLE_STOPS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

impl Hooks for Brittle {
    async fn on_stop(&mut self, _cx: &mut Ctx<Self>) {
        BRITTLE_STOPS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    async fn on_passivate(&mut self, _cx: &mut Ctx<Self>) {
        PASSIVATING.store(true, std::sync::atomic::Ordering::SeqCst);
        self.total = 1000;
        mailring_actors::mailring::time::sleep(Duration::from_millis(50)).await;
        panic!("persisting failed (the test's own)");
    }
}

impl Handler<Add> for Brittle {
    async fn handle(&mut self, m: Add, _cx: &mut Ctx<Self>) {
        self.total += m.0;
    }
}

impl Handler<Get> for Brittle {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.total
    }
}

#[test]
fn a_panic_in_on_passivate_is_counted_and_the_broken_instance_serves_nothing_more() {
    let (sys, _seen) = system_with_hook();
    let k = sys.handle().keyed::<Brittle>(1);
    let got = sys.block_on(async move {
        k.tell(Add(1)).unwrap();
        // Idle: it starts passivating; two messages then arrive meanwhile
        // (its hook waits 50 ms before it panics).
        while !PASSIVATING.load(std::sync::atomic::Ordering::SeqCst) {
            mailring_actors::mailring::time::sleep(Duration::from_millis(1)).await;
        }
        k.tell(Add(1)).unwrap();
        k.ask(Get).await
    });
    let stats = sys.stats().by_type("Brittle").unwrap();
    assert!(stats.panics >= 1, "on_passivate's panic was not counted");
    // A fresh activation took the message that came meanwhile, not the
    // instance its failed hook left half-written (1000 + 1).
    assert_eq!(got, Ok(1));
    // Nor does the broken instance run `on_stop`.
    assert_eq!(BRITTLE_STOPS.load(std::sync::atomic::Ordering::SeqCst), 0);
    sys.shutdown();
}

/// Set when a continuation ran.
static CONTINUED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

#[derive(Message)]
struct WaitThenPanic;

/// Waits for something in the background, stays busy, then panics: the
/// continuation is queued by then.
#[derive(Actor, Default)]
#[actor(handles(WaitThenPanic, Get))]
struct Waiter;

impl Handler<WaitThenPanic> for Waiter {
    async fn handle(&mut self, _m: WaitThenPanic, cx: &mut Ctx<Self>) {
        cx.wait_for(
            mailring_actors::mailring::time::sleep(Duration::from_millis(1)),
            |_: &mut Self, (), _: &mut Ctx<Self>| {
                CONTINUED.store(true, std::sync::atomic::Ordering::SeqCst)
            },
        );
        mailring_actors::mailring::time::sleep(Duration::from_millis(30)).await;
        panic!("busy, then failed (the test's own)");
    }
}

impl Handler<Get> for Waiter {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        7
    }
}

#[test]
fn a_continuation_queued_before_a_restart_does_not_run_on_the_fresh_instance() {
    let (sys, _seen) = system_with_hook();
    let a = sys.spawn_actor(Placement::Pinned(S1), Waiter::default);
    let got = sys.block_on(async move {
        a.tell(WaitThenPanic).unwrap();
        mailring_actors::mailring::time::sleep(Duration::from_millis(60)).await;
        a.ask(Get).await
    });
    // Restarted (its default policy), and serving.
    assert_eq!(got, Ok(7));
    assert!(
        !CONTINUED.load(std::sync::atomic::Ordering::SeqCst),
        "the old instance's continuation ran on the new one"
    );
    sys.shutdown();
}

#[derive(Message)]
struct Arm(u8);

#[derive(Message)]
struct Tick;

/// A panic in a stream's `poll_next` (the test's own).
struct BrittleStream;

impl mailring_actors::Stream for BrittleStream {
    type Item = u64;
    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<u64>> {
        panic!("stream boom");
    }
}

/// Holds a number, and starts background work of its own that fails: a
/// `wait_for` future, a timer's message factory, an attached stream.
#[derive(Actor, Default)]
#[actor(handles(Arm, Tick, Get, mailring_actors::StreamMessage<u64>))]
struct Armed {
    n: u64,
}

impl Handler<Arm> for Armed {
    async fn handle(&mut self, m: Arm, cx: &mut Ctx<Self>) {
        self.n = 5;
        match m.0 {
            0 => cx.wait_for(async { panic!("wait boom") }, |_: &mut Self, (): (), _| {}),
            1 => {
                cx.run_interval(Duration::from_millis(5), || -> Tick { panic!("tick boom") });
            }
            _ => {
                cx.attach_stream(BrittleStream);
            }
        }
    }
}

impl Handler<Tick> for Armed {
    async fn handle(&mut self, _m: Tick, _cx: &mut Ctx<Self>) {}
}

impl Handler<mailring_actors::StreamMessage<u64>> for Armed {
    async fn handle(&mut self, _m: mailring_actors::StreamMessage<u64>, _cx: &mut Ctx<Self>) {}
}

impl Handler<Get> for Armed {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.n
    }
}

/// A panic in the actor's own background work (its `wait_for` future, its
/// timer's factory, its attached stream) is the actor's panic: reported as a
/// handler's, and supervision restarts the actor (fresh state), as it would
/// for a panic in the handler that started the work.
#[test]
fn a_panic_in_an_actors_background_work_reaches_its_supervision() {
    for (which, message) in [(0u8, "wait boom"), (1, "tick boom"), (2, "stream boom")] {
        let (sys, seen) = system_with_hook();
        let a = sys.spawn_actor(Placement::Pinned(S1), Armed::default);
        let (armed, after) = sys.block_on(async move {
            a.tell(Arm(which)).unwrap();
            let armed = a.ask(Get).await;
            mailring_actors::mailring::time::sleep(Duration::from_millis(50)).await;
            (armed, a.ask(Get).await)
        });
        assert_eq!(armed, Ok(5), "{message}");
        assert_eq!(after, Ok(0), "{message}: the actor was not restarted");
        assert_eq!(runtime_panics(&sys, CallbackKind::Handler), 1, "{message}");
        assert_eq!(runtime_panics(&sys, CallbackKind::Task), 0, "{message}");
        assert!(
            seen.lock()
                .unwrap()
                .contains(&(CallbackKind::Handler, message.to_owned())),
            "{message}: {:?}",
            seen.lock().unwrap()
        );
        let stats = sys.stats().by_type("Armed").unwrap();
        assert_eq!(stats.restarts, 1, "{message}");
        assert_actors_work(&sys);
        sys.shutdown();
    }
}

/// A message whose `Drop` panics whatever is going on (even while
/// another panic unwinds).
#[derive(Message)]
struct Bomb;

impl Drop for Bomb {
    fn drop(&mut self) {
        panic!("message drop boom, always");
    }
}

/// Holds its shard's attention for a while, then stops itself.
#[derive(Message)]
struct HoldThenStop;

#[derive(Actor, Default)]
#[actor(handles(Bomb, HoldThenStop))]
struct Bunker;

impl Handler<Bomb> for Bunker {
    async fn handle(&mut self, m: Bomb, _cx: &mut Ctx<Self>) {
        std::mem::forget(m);
    }
}

impl Handler<HoldThenStop> for Bunker {
    async fn handle(&mut self, _m: HoldThenStop, cx: &mut Ctx<Self>) {
        mailring_actors::mailring::time::sleep(Duration::from_millis(50)).await;
        cx.stop();
    }
}

/// Several queued messages whose `Drop` panics, left behind by an actor
/// that stops: each is dropped and reported on its own. (Dropped together,
/// the second panicked while the first unwound through the collection's
/// drop: the process aborted.)
#[test]
fn messages_whose_drops_panic_left_behind_by_a_stop_are_each_reported() {
    let (sys, _seen) = system_with_hook();
    let a = sys.spawn_actor(Placement::Pinned(S1), Bunker::default);
    let stopped = a.stopped();
    sys.block_on(async move {
        a.tell(HoldThenStop).unwrap();
        for _ in 0..3 {
            let _ = a.tell(Bomb);
        }
        stopped.await
    });
    assert!(runtime_panics(&sys, CallbackKind::Drop) >= 3);
    assert_actors_work(&sys);
}

/// `Fuse`s made (by its factory).
static FUSES_MADE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Waits a while, then panics.
#[derive(Message)]
struct Burn;

/// Restarted on a panic (the default supervision).
#[derive(Actor)]
#[actor(handles(Burn))]
struct Fuse;

impl Handler<Burn> for Fuse {
    async fn handle(&mut self, _m: Burn, _cx: &mut Ctx<Self>) {
        mailring_actors::mailring::time::sleep(Duration::from_millis(100)).await;
        panic!("burnt out (the test's own)");
    }
}

/// A handler that panics while a shutdown waits for it ends its actor:
/// no restart (its factory and `on_start` again) during the shutdown.
#[test]
fn a_panic_while_a_shutdown_waits_ends_the_actor_without_a_restart() {
    let (sys, _seen) = system_with_hook();
    let a = sys.spawn_actor(Placement::Pinned(S1), || {
        FUSES_MADE.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Fuse
    });
    a.tell(Burn).unwrap();
    // The handler is under way.
    std::thread::sleep(Duration::from_millis(30));
    let report = sys.shutdown();
    assert_eq!(report.actors_abandoned, 0, "{report:?}");
    assert_eq!(
        FUSES_MADE.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "made again during the shutdown"
    );
}

/// `Phoenix`es the factory was asked for.
static PHOENIX_CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Panics on `Burn`; counts what it was sent (`Add`) otherwise.
#[derive(Actor, Default)]
#[actor(handles(Burn, Get))]
struct Phoenix;

impl Handler<Get> for Phoenix {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        7
    }
}

impl Handler<Burn> for Phoenix {
    async fn handle(&mut self, _m: Burn, _cx: &mut Ctx<Self>) {
        panic!("burnt (the test's own)");
    }
}

/// A factory that panics on a restart is one more failure for the
/// supervision, within its budget: the actor is restarted again (its
/// factory asked once more), not stopped for good with restarts left.
#[test]
fn a_factory_that_panics_on_a_restart_counts_against_the_budget_not_as_the_end() {
    let (sys, _seen) = system_with_hook();
    let a = sys.spawn_actor(Placement::Pinned(S1), || {
        if PHOENIX_CALLS.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 1 {
            panic!("the factory fails once (the test's own)");
        }
        Phoenix
    });
    let got = sys.block_on(async move {
        a.tell(Burn).unwrap();
        mailring_actors::mailring::time::timeout(Duration::from_secs(5), a.ask(Get)).await
    });
    assert_eq!(got.expect("answered"), Ok(7));
    assert_eq!(PHOENIX_CALLS.load(std::sync::atomic::Ordering::SeqCst), 3);
    assert_eq!(runtime_panics(&sys, CallbackKind::Factory), 1);
}

/// `Metronome` ticks handled, and whether its `Note` came through.
static METRONOME_TICKS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
static METRONOME_NOTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static METRONOME_FIRST_TICK: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

#[derive(Message)]
struct Beat;

#[derive(Message)]
struct Note;

/// A keyed actor ticking every millisecond: its first tick panics after a
/// while, its second asks to stop.
#[derive(Actor)]
#[actor(key = u8, activate = Metronome::new, handles(Beat, Note), hooks)]
struct Metronome;

impl Metronome {
    fn new(_key: &u8) -> Self {
        Metronome
    }
}

impl Hooks for Metronome {
    async fn on_start(&mut self, cx: &mut Ctx<Self>) {
        cx.run_interval(Duration::from_millis(1), || Beat);
    }
}

impl Handler<Beat> for Metronome {
    async fn handle(&mut self, _m: Beat, cx: &mut Ctx<Self>) {
        match METRONOME_TICKS.fetch_add(1, std::sync::atomic::Ordering::SeqCst) {
            0 => {
                METRONOME_FIRST_TICK.store(true, std::sync::atomic::Ordering::SeqCst);
                mailring_actors::mailring::time::sleep(Duration::from_millis(30)).await;
                panic!("the first beat fails (the test's own)");
            }
            1 => cx.stop(),
            _ => {}
        }
    }
}

impl Handler<Note> for Metronome {
    async fn handle(&mut self, _m: Note, _cx: &mut Ctx<Self>) {
        METRONOME_NOTED.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A message from elsewhere queued among timer messages behind a stop is
/// not taken for one of them (and dropped) because the tick before it
/// panicked: the panicked tick counts among those handled, and the note
/// goes to a fresh activation.
#[test]
fn a_message_behind_a_panicked_tick_and_a_stop_is_not_dropped_as_a_timers() {
    let (sys, _seen) = system_with_hook();
    let k = sys.handle().keyed::<Metronome>(1);
    let noted = sys.block_on(async move {
        // Activates it; its ticks start.
        let _ = k.tell(Note);
        while !METRONOME_FIRST_TICK.load(std::sync::atomic::Ordering::SeqCst) {
            mailring_actors::mailring::time::sleep(Duration::from_millis(1)).await;
        }
        // Behind a few ticks, while the first one runs.
        mailring_actors::mailring::time::sleep(Duration::from_millis(5)).await;
        METRONOME_NOTED.store(false, std::sync::atomic::Ordering::SeqCst);
        k.tell(Note).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(3);
        while !METRONOME_NOTED.load(std::sync::atomic::Ordering::SeqCst)
            && std::time::Instant::now() < deadline
        {
            mailring_actors::mailring::time::sleep(Duration::from_millis(2)).await;
        }
        METRONOME_NOTED.load(std::sync::atomic::Ordering::SeqCst)
    });
    assert!(noted, "the note was dropped with the timer messages");
    sys.shutdown();
}
