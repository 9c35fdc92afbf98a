//! What stop, graceful stop, passivation and restart mean for `stopped()`,
//! `is_alive()` and queued messages, for unkeyed and keyed actors (the
//! table in docs/actors.md, one test per cell group).

use std::future::poll_fn;
use std::sync::Arc;
use std::time::Duration;

use mailring_actors::mailring::sync::Slot;
use mailring_actors::mailring::time::timeout;
use mailring_actors::{
    Actor, ActorSystem, Addr, AskError, Ctx, Handler, Message, Placement, Runtime, ShardId,
    StopReason,
};

const S1: ShardId = ShardId::new(1);

fn system() -> ActorSystem {
    ActorSystem::start(Runtime::builder().shards(2)).expect("io_uring available")
}

/// Holds its handler until the slot is filled.
#[derive(Message)]
struct Hold(Arc<Slot<()>>);

/// Counts as handled; replies with the count so far.
#[derive(Message)]
#[message(reply = u32)]
struct Count;

#[derive(Message)]
struct Boom;

#[derive(Actor, Default)]
#[actor(handles(Hold, Count, Boom))]
struct Worker {
    handled: u32,
}

#[derive(Actor)]
#[actor(key = u32, activate = KeyedWorker::new, handles(Hold, Count, Boom))]
struct KeyedWorker {
    handled: u32,
}

impl KeyedWorker {
    fn new(_key: &u32) -> Self {
        KeyedWorker { handled: 0 }
    }
}

/// A keyed worker that passivates after 30 ms without messages.
#[derive(Actor)]
#[actor(key = u32, activate = Napper::new, handles(Hold, Count, Boom), idle_timeout_ms = 30)]
struct Napper {
    handled: u32,
}

impl Napper {
    fn new(_key: &u32) -> Self {
        Napper { handled: 0 }
    }
}

macro_rules! handlers {
    ($t:ty) => {
        impl Handler<Hold> for $t {
            async fn handle(&mut self, m: Hold, _cx: &mut Ctx<Self>) {
                let _ = poll_fn(|cx| m.0.poll_take(cx)).await;
            }
        }
        impl Handler<Count> for $t {
            async fn handle(&mut self, _m: Count, _cx: &mut Ctx<Self>) -> u32 {
                self.handled += 1;
                self.handled
            }
        }
        impl Handler<Boom> for $t {
            async fn handle(&mut self, _m: Boom, _cx: &mut Ctx<Self>) {
                panic!("injected: Boom");
            }
        }
    };
}
handlers!(Worker);
handlers!(KeyedWorker);
handlers!(Napper);

/// How an activation ended, as [`queued_behind`] saw it.
struct Ending {
    /// The three queued asks' outcomes.
    outcomes: Vec<Result<u32, AskError>>,
    reason: StopReason,
    alive_after: bool,
}

/// Holds `addr`'s handler, queues three `Count` asks behind it, watches
/// it, applies `stop`, releases the handler (once an `is_alive` round trip
/// proves the watch and the stop arrived) and returns how it ended.
fn queued_behind<A>(sys: &ActorSystem, addr: Addr<A>, stop: fn(&Addr<A>)) -> Ending
where
    A: Actor + mailring_actors::Accepts<Hold> + mailring_actors::Accepts<Count>,
    A::Envelope: Send,
{
    sys.block_on(async move {
        let gate = Arc::new(Slot::new());
        addr.tell(Hold(gate.clone())).unwrap();
        let asks: Vec<_> = (0..3).map(|_| addr.ask(Count)).collect();
        let stopped = addr.stopped();
        stop(&addr);
        // A round trip behind the watch and the stop: both have arrived.
        assert!(addr.is_alive().await, "running while it holds");
        gate.send(()).unwrap();
        let mut outcomes = Vec::new();
        for a in asks {
            outcomes.push(a.await);
        }
        let end = timeout(Duration::from_secs(5), stopped)
            .await
            .expect("stopped resolves");
        Ending {
            outcomes,
            reason: end.reason,
            alive_after: addr.is_alive().await,
        }
    })
}

const HANDLED: [Result<u32, AskError>; 3] = [Ok(1), Ok(2), Ok(3)];
const DROPPED: [Result<u32, AskError>; 3] = [Err(AskError::Stopped); 3];

/// One row of the table: how `stop` ends a worker holding three asks, and
/// what a message after it gets.
fn row<A>(
    sys: &ActorSystem,
    addr: Addr<A>,
    stop: fn(&Addr<A>),
    queued: [Result<u32, AskError>; 3],
    alive: bool,
    later: Result<u32, AskError>,
) where
    A: Actor + mailring_actors::Accepts<Hold> + mailring_actors::Accepts<Count>,
    A::Envelope: Send,
{
    let end = queued_behind(sys, addr.clone(), stop);
    assert_eq!(end.outcomes, queued);
    assert_eq!(end.reason, StopReason::Stopped);
    assert_eq!(end.alive_after, alive);
    let after = sys.block_on(async move { addr.ask(Count).await });
    assert_eq!(after, later);
}

#[test]
fn unkeyed_stop_drops_what_is_queued() {
    let sys = system();
    let w = sys.spawn_actor(Placement::Pinned(S1), Worker::default);
    // An unkeyed actor never comes back: later sends fail.
    row(
        &sys,
        w,
        |a| a.stop(),
        DROPPED,
        false,
        Err(AskError::Stopped),
    );
    sys.shutdown();
}

#[test]
fn unkeyed_graceful_stop_handles_what_is_queued_first() {
    let sys = system();
    let w = sys.spawn_actor(Placement::Pinned(S1), Worker::default);
    row(
        &sys,
        w,
        |a| a.stop_gracefully(),
        HANDLED,
        false,
        Err(AskError::Stopped),
    );
    sys.shutdown();
}

#[test]
fn keyed_stop_passivates_and_the_queued_messages_reach_a_fresh_activation() {
    let sys = system();
    // The activation ends after the held message; what it had queued is
    // re-delivered and activates the key again (a fresh count, alive after).
    row(
        &sys,
        sys.keyed::<KeyedWorker>(1),
        |a| a.stop(),
        HANDLED,
        true,
        Ok(4),
    );
    sys.shutdown();
}

#[test]
fn keyed_graceful_stop_handles_the_queue_then_passivates() {
    let sys = system();
    // The key lives on: the next message activates it afresh.
    row(
        &sys,
        sys.keyed::<KeyedWorker>(2),
        |a| a.stop_gracefully(),
        HANDLED,
        false,
        Ok(1),
    );
    sys.shutdown();
}

#[test]
fn keyed_passivation_ends_the_activation_and_the_next_message_starts_another() {
    let sys = system();
    let k = sys.keyed::<Napper>(3);
    let (first, reason, alive, again) = sys.block_on(async move {
        let first = k.ask(Count).await;
        // Idle for 30 ms: passivated.
        let end = timeout(Duration::from_secs(5), k.stopped())
            .await
            .expect("passivates");
        let alive = k.is_alive().await;
        (first, end.reason, alive, k.ask(Count).await)
    });
    assert_eq!(first, Ok(1));
    assert_eq!(reason, StopReason::Passivated);
    assert!(!alive);
    assert_eq!(again, Ok(1), "a fresh activation");
    sys.shutdown();
}

#[test]
fn a_restart_is_not_a_stop_and_keeps_the_queue() {
    let sys = system();
    let w = sys.spawn_actor(Placement::Pinned(S1), Worker::default);
    let (before, after, alive, stopped_early) = sys.block_on(async move {
        let before = w.ask(Count).await;
        let stopped = w.stopped();
        w.tell(Boom).unwrap();
        let after = w.ask(Count).await;
        let alive = w.is_alive().await;
        // `stopped()` must not have resolved: a restart is the same actor.
        let early = timeout(Duration::from_millis(50), stopped).await.is_ok();
        (before, after, alive, early)
    });
    assert_eq!(before, Ok(1));
    assert_eq!(
        after,
        Ok(1),
        "the restarted actor is fresh and took the queued ask"
    );
    assert!(alive);
    assert!(!stopped_early);
    sys.shutdown();
}

#[test]
fn stopped_and_is_alive_of_an_actor_that_is_not_running_answer_at_once() {
    let sys = system();
    let k = sys.keyed::<KeyedWorker>(4);
    let (reason, alive) = sys.block_on(async move {
        let end = timeout(Duration::from_secs(5), k.stopped())
            .await
            .expect("at once");
        (end.reason, k.is_alive().await)
    });
    assert_eq!(reason, StopReason::Passivated);
    assert!(!alive, "asking does not activate it");
    sys.shutdown();
}

#[test]
fn stopped_resolves_with_shutdown_when_the_system_shuts_down() {
    let sys = system();
    let w = sys.spawn_actor(Placement::Pinned(S1), Worker::default);
    let stopped = w.stopped();
    // Proves the watch arrived before the shutdown starts.
    assert_eq!(sys.block_on(async move { w.ask(Count).await }), Ok(1));
    let waiter = std::thread::spawn(move || {
        let rt = Runtime::builder().shards(1).build().unwrap();
        rt.block_on(stopped)
    });
    sys.shutdown();
    assert_eq!(waiter.join().unwrap().reason, StopReason::Shutdown);
}

#[test]
fn waiting_for_a_shutdown_request_ends_at_the_request_or_the_limit() {
    let sys = system();
    assert!(!sys.wait_for_shutdown_request(Some(Duration::from_millis(10))));
    let h = sys.handle();
    let requester = std::thread::spawn(move || h.request_shutdown());
    assert!(sys.wait_for_shutdown_request(None));
    requester.join().unwrap();
    // A request seen once stays: asking again answers at once.
    assert!(sys.wait_for_shutdown_request(Some(Duration::ZERO)));
    sys.shutdown();
}

// ---------------------------------------------------------------- hooks without an attribute

use std::sync::Mutex;

/// Records its lifecycle; implements `Hooks` with no `#[actor(hooks)]`.
#[derive(Actor)]
#[actor(handles(Count))]
struct Recorder<T: Send> {
    log: Arc<Mutex<Vec<&'static str>>>,
    _tag: std::marker::PhantomData<T>,
}

impl<T: Send + 'static> Handler<Count> for Recorder<T> {
    async fn handle(&mut self, _m: Count, _cx: &mut Ctx<Self>) -> u32 {
        self.log.lock().unwrap().push("message");
        1
    }
}

impl<T: Send + 'static> mailring_actors::Hooks for Recorder<T> {
    async fn on_start(&mut self, _cx: &mut Ctx<Self>) {
        self.log.lock().unwrap().push("start");
    }

    async fn on_stop(&mut self, _cx: &mut Ctx<Self>) {
        self.log.lock().unwrap().push("stop");
    }
}

#[test]
fn hooks_run_from_an_impl_alone_and_a_type_without_one_runs_none() {
    let sys = system();
    let log = Arc::new(Mutex::new(Vec::new()));
    let l = log.clone();
    let r = sys.spawn_actor(Placement::Pinned(S1), move || Recorder::<u8> {
        log: l.clone(),
        _tag: std::marker::PhantomData,
    });
    // `Worker` has no `Hooks` impl: it starts and stops all the same.
    let w = sys.spawn_actor(Placement::Pinned(S1), Worker::default);
    let (a, b) = sys.block_on(async move {
        let a = r.ask(Count).await;
        let b = w.ask(Count).await;
        r.stop();
        w.stop();
        r.stopped().await;
        w.stopped().await;
        (a, b)
    });
    assert_eq!((a, b), (Ok(1), Ok(1)));
    assert_eq!(*log.lock().unwrap(), ["start", "message", "stop"]);
    sys.shutdown();
}

#[test]
fn a_stop_from_the_actor_s_shard_follows_the_spawn_delivered_there_before_it() {
    // An outside thread spawns an actor on shard 0 (the spawn waits in
    // shard 0's inbox) and hands its address to a task already running
    // there, which asks whether it is alive and stops it: the spawn is
    // applied first, as it would be for a message.
    let sys = system();
    let (tx, rx) = std::sync::mpsc::channel::<Addr<Worker>>();
    let task = sys.runtime().spawn_on(ShardId::new(0), async move {
        // Holds shard 0 (its inbox unread) until the address comes.
        let addr = rx.recv_timeout(Duration::from_secs(5)).expect("an address");
        let alive = addr.is_alive().await;
        addr.stop();
        let end = timeout(Duration::from_secs(5), addr.stopped())
            .await
            .expect("the stop ends it");
        (alive, end.reason)
    });
    std::thread::sleep(Duration::from_millis(50));
    let addr = sys.spawn_actor(Placement::Pinned(ShardId::new(0)), Worker::default);
    tx.send(addr.clone()).unwrap();
    let (alive, reason) = sys.block_on(task).unwrap();
    assert!(alive, "a spawned actor taken for dead");
    assert_eq!(reason, StopReason::Stopped, "the stop was lost");
    assert!(sys.block_on(async move { addr.ask(Count).await }).is_err());
    sys.shutdown();
}

/// A keyed actor that turns its activation down in `on_start` (its key
/// names nothing, say).
#[derive(Actor)]
#[actor(key = u32, activate = Refuser::new, handles(Count), hooks)]
struct Refuser;

impl Refuser {
    fn new(_key: &u32) -> Self {
        Refuser
    }
}

impl mailring_actors::Hooks for Refuser {
    async fn on_start(&mut self, cx: &mut Ctx<Self>) {
        cx.stop();
    }
}

impl Handler<Count> for Refuser {
    async fn handle(&mut self, _m: Count, _cx: &mut Ctx<Self>) -> u32 {
        1
    }
}

#[test]
fn a_keyed_actor_that_stops_in_on_start_refuses_its_messages_instead_of_bouncing_them() {
    let sys = system();
    let k = sys.handle().keyed::<Refuser>(7);
    let again = k.clone();
    let (first, second) = sys.block_on(async move {
        let first = timeout(Duration::from_secs(5), k.ask(Count)).await;
        // The next message activates it again, and is refused again.
        let second = timeout(Duration::from_secs(5), again.ask(Count)).await;
        (first, second)
    });
    assert!(
        matches!(first, Ok(Err(AskError::Stopped))),
        "the ask was bounced from activation to activation: {first:?}"
    );
    assert!(matches!(second, Ok(Err(AskError::Stopped))), "{second:?}");
    sys.shutdown();
}

/// The order a keyed actor's messages were handled in, across
/// activations.
static SEEN: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());

#[derive(Message)]
struct Seq(u32);

#[derive(Message)]
struct Quit;

/// Pinned to shard 1, with a child there: stopping it stops the child,
/// which runs the shard's pending deliveries on the spot.
#[derive(Actor)]
#[actor(key = u32, activate = Ledger::new, pinned = 1, handles(Seq, Quit, Count), hooks)]
struct Ledger {
    _kid: Option<Addr<Kid>>,
}

impl Ledger {
    fn new(_key: &u32) -> Self {
        Ledger { _kid: None }
    }
}

#[derive(Actor, Default)]
#[actor(handles(Seq))]
struct Kid;

impl Handler<Seq> for Kid {
    async fn handle(&mut self, _m: Seq, _cx: &mut Ctx<Self>) {}
}

impl mailring_actors::Hooks for Ledger {
    async fn on_start(&mut self, cx: &mut Ctx<Self>) {
        self._kid = Some(cx.spawn_child(Placement::Pinned(S1), Kid::default));
    }

    async fn on_stop(&mut self, _cx: &mut Ctx<Self>) {
        // The sender's next message lands in shard 1's inbox meanwhile.
        std::thread::sleep(Duration::from_millis(30));
    }
}

impl Handler<Seq> for Ledger {
    async fn handle(&mut self, m: Seq, _cx: &mut Ctx<Self>) {
        SEEN.lock().unwrap().push(m.0);
    }
}

impl Handler<Count> for Ledger {
    async fn handle(&mut self, _m: Count, _cx: &mut Ctx<Self>) -> u32 {
        0
    }
}

impl Handler<Quit> for Ledger {
    async fn handle(&mut self, _m: Quit, cx: &mut Ctx<Self>) {
        cx.stop();
    }
}

#[test]
fn a_stopped_keyed_actor_s_queue_stays_ahead_of_later_messages_from_the_same_sender() {
    let sys = system();
    let h = sys.handle().clone();
    sys.block_on(async move {
        mailring_actors::mailring::spawn_on(ShardId::new(0), async move {
            let k = h.keyed::<Ledger>(1);
            k.tell(Quit).unwrap();
            k.tell(Seq(1)).unwrap();
            k.tell(Seq(2)).unwrap();
            mailring_actors::mailring::time::sleep(Duration::from_millis(10)).await;
            k.tell(Seq(3)).unwrap();
            // Behind the three, from the same sender.
            k.ask(Count).await.unwrap();
        })
        .await
        .unwrap()
    });
    assert_eq!(*SEEN.lock().unwrap(), [1, 2, 3], "per-sender order");
    sys.shutdown();
}

#[derive(Message)]
struct StopThenPanic;

/// A keyed actor whose handler asks to stop and then panics.
#[derive(Actor)]
#[actor(key = u32, activate = Quitter::new, handles(StopThenPanic, Count))]
struct Quitter;

impl Quitter {
    fn new(_key: &u32) -> Self {
        Quitter
    }
}

impl Handler<StopThenPanic> for Quitter {
    async fn handle(&mut self, _m: StopThenPanic, cx: &mut Ctx<Self>) {
        cx.stop();
        panic!("after asking to stop (the test's own)");
    }
}

impl Handler<Count> for Quitter {
    async fn handle(&mut self, _m: Count, _cx: &mut Ctx<Self>) -> u32 {
        1
    }
}

#[test]
fn a_stop_asked_before_a_panic_does_not_turn_the_restarted_activation_down() {
    let sys = system();
    let k = sys.handle().keyed::<Quitter>(3);
    let got = sys.block_on(async move {
        k.tell(StopThenPanic).unwrap();
        timeout(Duration::from_secs(5), k.ask(Count)).await
    });
    assert!(matches!(got, Ok(Ok(1))), "{got:?}");
    sys.shutdown();
}
