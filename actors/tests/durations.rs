//! Durations too long for an `Instant` (`Duration::MAX`) given to the actor
//! layer mean "no deadline" or "never", not an overflow panic.
//!
//! Its own test binary: one test installs a panic hook.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

mod common;

use common::{Counter, Get};
use mailring_actors::mailring::time;
use mailring_actors::{
    Actor, ActorSystem, Ctx, Handler, Message, Placement, Runtime, ShardId, SystemConfig,
    TimerHandle,
};

fn system(config: SystemConfig) -> ActorSystem {
    ActorSystem::start_with(Runtime::builder().shards(2), config).expect("io_uring available")
}

#[test]
fn an_ask_with_a_timeout_of_duration_max_waits_for_the_reply() {
    let sys = system(SystemConfig::default());
    let c = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Counter::default);
    let got = sys.block_on(async move {
        time::timeout(Duration::from_secs(5), c.ask(Get).timeout(Duration::MAX)).await
    });
    assert_eq!(got, Ok(Ok(0)));
    sys.shutdown();
}

#[test]
fn a_default_ask_timeout_of_duration_max_waits_for_the_reply() {
    let sys = system(SystemConfig {
        ask_timeout: Some(Duration::MAX),
        ..SystemConfig::default()
    });
    let c = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Counter::default);
    let got = sys.block_on(async move { time::timeout(Duration::from_secs(5), c.ask(Get)).await });
    assert_eq!(got, Ok(Ok(0)));
    sys.shutdown();
}

#[test]
fn a_shutdown_grace_of_duration_max_shuts_down() {
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        let sys = system(SystemConfig {
            shutdown_grace: Duration::MAX,
            ..SystemConfig::default()
        });
        let _c = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Counter::default);
        sys.shutdown();
        let _ = done.send(());
    });
    assert_eq!(
        finished.recv_timeout(Duration::from_secs(10)),
        Ok(()),
        "shutdown panicked or did not finish"
    );
}

/// Starts a `run_interval` of `Duration::MAX` and counts its ticks.
#[derive(Actor, Default)]
#[actor(handles(StartTicking, Tick, Ticks))]
struct Ticker {
    ticks: u64,
    timer: Option<TimerHandle>,
}

#[derive(Message)]
struct StartTicking;

#[derive(Message)]
struct Tick;

#[derive(Message)]
#[message(reply = u64)]
struct Ticks;

impl Handler<StartTicking> for Ticker {
    async fn handle(&mut self, _m: StartTicking, cx: &mut Ctx<Self>) {
        self.timer = Some(cx.run_interval(Duration::MAX, || Tick));
    }
}

impl Handler<Tick> for Ticker {
    async fn handle(&mut self, _m: Tick, _cx: &mut Ctx<Self>) {
        self.ticks += 1;
    }
}

impl Handler<Ticks> for Ticker {
    async fn handle(&mut self, _m: Ticks, _cx: &mut Ctx<Self>) -> u64 {
        self.ticks
    }
}

#[test]
fn run_interval_of_duration_max_never_ticks_and_does_not_panic() {
    // The interval runs in a task of its own: its panic reaches no caller,
    // only the panic hook.
    let overflows = Arc::new(AtomicUsize::new(0));
    let seen = overflows.clone();
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if info.to_string().contains("overflow") {
            seen.fetch_add(1, Ordering::SeqCst);
        }
        previous(info);
    }));

    let sys = system(SystemConfig::default());
    let t = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Ticker::default);
    let ticks = sys.block_on(async move {
        time::timeout(Duration::from_secs(5), async move {
            t.ask(StartTicking).await.expect("started");
            time::sleep(Duration::from_millis(20)).await;
            t.ask(Ticks).await.expect("asked")
        })
        .await
    });
    sys.shutdown();
    assert_eq!(ticks, Ok(0));
    assert_eq!(
        overflows.load(Ordering::SeqCst),
        0,
        "the interval's task panicked"
    );
}
