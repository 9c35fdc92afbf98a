//! `Addr::run_now` / `LocalAddr::run_now`: a closure run on an idle actor
//! in the caller's task, between two of its messages. It runs only when
//! the actor is active on the calling shard with nothing queued and no
//! handler or hook running; otherwise the closure comes back. A panic in
//! it goes through the actor's supervision like a handler's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use mailring_actors::mailring::panic::{CallbackKind, PanicEvent};
use mailring_actors::{Actor, ActorSystem, Ctx, Handler, Message, RunNowError, Runtime, ShardId};

mod common;
use common::{check_each_senders_order, first_random, next_random, Log, Note, Seen};

#[derive(Actor, Default)]
#[actor(key = u64, activate = Tally::new, idle_timeout_ms = 500, handles(Add, Get, Hold, CallSelf))]
struct Tally {
    total: u64,
}

impl Tally {
    fn new(_key: &u64) -> Self {
        Tally::default()
    }
}

#[derive(Message)]
struct Add(u64);

#[derive(Message)]
#[message(reply = u64)]
struct Get;

/// Sets the flag, then holds the actor for the duration.
#[derive(Message)]
struct Hold(Arc<AtomicBool>, Duration);

/// The handler calls `run_now` on its own actor: whether it came back.
#[derive(Message)]
#[message(reply = bool)]
struct CallSelf;

impl Handler<Add> for Tally {
    async fn handle(&mut self, m: Add, _cx: &mut Ctx<Self>) {
        self.total += m.0;
    }
}

impl Handler<Get> for Tally {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.total
    }
}

impl Handler<Hold> for Tally {
    async fn handle(&mut self, m: Hold, _cx: &mut Ctx<Self>) {
        m.0.store(true, Ordering::Release);
        mailring_actors::mailring::time::sleep(m.1).await;
    }
}

impl Handler<CallSelf> for Tally {
    async fn handle(&mut self, _m: CallSelf, cx: &mut Ctx<Self>) -> bool {
        matches!(
            cx.myself().run_now(|t| t.total += 1000),
            Err(RunNowError::NotIdle(_))
        )
    }
}

/// A keyed actor that lives on shard 1.
#[derive(Actor, Default)]
#[actor(key = u64, activate = Far::new, pinned = 1, handles(Get))]
struct Far {
    total: u64,
}

impl Far {
    fn new(_key: &u64) -> Self {
        Far::default()
    }
}

impl Handler<Get> for Far {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.total
    }
}

/// On shard 1: runs a closure on `Far` key 1 from there.
#[derive(Actor, Default)]
#[actor(key = u64, activate = Near::new, pinned = 1, handles(Get))]
struct Near;

impl Near {
    fn new(_key: &u64) -> Self {
        Near
    }
}

impl Handler<Get> for Near {
    async fn handle(&mut self, _m: Get, cx: &mut Ctx<Self>) -> u64 {
        let far = cx.system().keyed::<Far>(1);
        far.run_now(|f| {
            f.total += 5;
            f.total
        })
        .unwrap_or(u64::MAX)
    }
}

fn one_shard() -> ActorSystem {
    ActorSystem::start(Runtime::builder().shards(1)).expect("io_uring")
}

#[test]
fn an_idle_actor_runs_the_closure_at_once_and_its_next_message_sees_the_change() {
    let sys = one_shard();
    let h = sys.handle();
    let (ran, got) = sys.block_on(async move {
        let t = h.keyed::<Tally>(1);
        t.tell(Add(2)).unwrap();
        assert_eq!(t.ask(Get).await, Ok(2));
        let ran = t.run_now(|t| {
            t.total *= 10;
            t.total
        });
        (ran.ok(), t.ask(Get).await)
    });
    assert_eq!(ran, Some(20));
    assert_eq!(got, Ok(20));
    let stats = sys.stats().by_type("Tally").unwrap();
    assert_eq!(stats.ran_now, 1);
    assert_eq!(stats.handled, 4, "three messages and the closure");
    sys.shutdown();
}

#[test]
fn a_queued_message_makes_the_actor_busy_and_runs_first() {
    let sys = one_shard();
    let h = sys.handle();
    let (first, after) = sys.block_on(async move {
        let t = h.keyed::<Tally>(2);
        assert_eq!(t.ask(Get).await, Ok(0));
        // Queued, not yet handled: the closure must not overtake it.
        t.tell(Add(1)).unwrap();
        let first = match t.run_now(|t| t.total) {
            Err(RunNowError::NotIdle(f)) => Some(f),
            _ => None,
        };
        assert!(first.is_some(), "ran with a message queued");
        assert_eq!(t.ask(Get).await, Ok(1));
        let after = t.run_now(first.unwrap()).ok();
        (true, after)
    });
    assert!(first);
    assert_eq!(after, Some(1), "the closure given back runs once idle");
    sys.shutdown();
}

#[test]
fn an_actor_awaiting_in_its_handler_is_busy() {
    let sys = one_shard();
    let h = sys.handle();
    let (during, after) = sys.block_on(async move {
        let t = h.keyed::<Tally>(3);
        let started = Arc::new(AtomicBool::new(false));
        let held = t.ask(Hold(started.clone(), Duration::from_millis(100)));
        while !started.load(Ordering::Acquire) {
            mailring_actors::mailring::yield_now().await;
        }
        let during = t.run_now(|t| t.total += 1).is_ok();
        held.await.unwrap();
        let after = t.run_now(|t| t.total += 1).is_ok();
        (during, after)
    });
    assert!(!during, "ran while a handler held the actor");
    assert!(after);
    sys.shutdown();
}

#[test]
fn a_call_from_the_actors_own_handler_comes_back() {
    let sys = one_shard();
    let h = sys.handle();
    let (came_back, total) = sys.block_on(async move {
        let t = h.keyed::<Tally>(4);
        let came_back = t.ask(CallSelf).await.unwrap();
        (came_back, t.ask(Get).await.unwrap())
    });
    assert!(came_back);
    assert_eq!(total, 0, "the closure did not run");
    sys.shutdown();
}

#[test]
fn run_now_as_taken_leaves_what_other_threads_delivered_since_for_later() {
    // Another thread tells the idle actor while its shard is held in this
    // task: `run_now_as_taken` sees the shard as last taken in (idle, the
    // message not yet in the mailbox) and runs; `run_now` takes the
    // message in first, so the actor is busy until it is handled.
    let sys = one_shard();
    let h = sys.handle();
    let outside = sys.keyed::<Tally>(9);
    let (as_taken, taking, total) = sys.block_on(async move {
        let t = h.keyed::<Tally>(9);
        assert_eq!(t.ask(Get).await, Ok(0));
        std::thread::spawn(move || outside.tell(Add(5)).unwrap())
            .join()
            .unwrap();
        let as_taken = t.run_now_as_taken(|t| t.total += 1).is_ok();
        let taking = matches!(t.run_now(|t| t.total += 1), Err(RunNowError::NotIdle(_)));
        (as_taken, taking, t.ask(Get).await.unwrap())
    });
    assert!(as_taken, "did not run on the idle actor");
    assert!(taking, "run_now overtook the message from the other thread");
    assert_eq!(total, 6);
    sys.shutdown();
}

#[test]
fn an_inactive_keyed_actor_is_not_activated() {
    let sys = one_shard();
    let h = sys.handle();
    let not_idle = sys.block_on(async move {
        matches!(
            h.keyed::<Tally>(5).run_now(|t| t.total),
            Err(RunNowError::NotIdle(_))
        )
    });
    assert!(not_idle);
    let activations = sys.stats().by_type("Tally").map_or(0, |s| s.activations);
    assert_eq!(activations, 0);
    sys.shutdown();
}

#[test]
fn off_the_actors_shard_the_closure_comes_back_and_on_it_runs() {
    let sys = ActorSystem::start(Runtime::builder().shards(2)).expect("io_uring");
    let h = sys.handle();
    let far = sys.keyed::<Far>(1);
    assert_eq!(far.shard(), ShardId::new(1));
    let f2 = far.clone();
    let (from_shard_0, from_shard_1, total) = sys.block_on(async move {
        assert_eq!(f2.ask(Get).await, Ok(0));
        let from_shard_0 = matches!(f2.run_now(|f| f.total += 1), Err(RunNowError::NotIdle(_)));
        let from_shard_1 = h.keyed::<Near>(1).ask(Get).await.unwrap();
        (from_shard_0, from_shard_1, f2.ask(Get).await.unwrap())
    });
    assert!(from_shard_0);
    assert_eq!(from_shard_1, 5, "run on its own shard");
    assert_eq!(total, 5);
    // From a thread that is no shard at all.
    assert!(matches!(
        far.run_now(|f| f.total += 1),
        Err(RunNowError::NotIdle(_))
    ));
    sys.shutdown();
}

#[test]
fn a_panicking_closure_sends_the_actor_through_its_supervision() {
    let seen: Arc<Mutex<Vec<(CallbackKind, String)>>> = Arc::default();
    let log = seen.clone();
    // The panic hook tries to run a closure on the actor that panicked.
    let target: Arc<OnceLock<mailring_actors::Addr<Tally>>> = Arc::default();
    let from_hook: Arc<Mutex<Option<bool>>> = Arc::default();
    let (t2, h2) = (target.clone(), from_hook.clone());
    let builder = Runtime::builder()
        .shards(1)
        .on_panic(move |e: &PanicEvent<'_>| {
            log.lock().unwrap().push((e.kind, e.message.to_owned()));
            if let Some(t) = t2.get() {
                *h2.lock().unwrap() = Some(t.run_now(|t| t.total = 5).is_ok());
            }
        });
    let sys = ActorSystem::start(builder).expect("io_uring");
    let h = sys.handle();
    let (panicked, busy_after, total) = sys.block_on(async move {
        let t = h.keyed::<Tally>(6);
        target.set(t.clone()).ok().unwrap();
        t.tell(Add(7)).unwrap();
        assert_eq!(t.ask(Get).await, Ok(7));
        let panicked = matches!(
            t.run_now(|t| {
                t.total = 999;
                panic!("half changed");
            }),
            Err(RunNowError::Panicked)
        );
        // Until its task has dealt with the panic, nothing runs on it.
        let busy_after = matches!(t.run_now(|t| t.total), Err(RunNowError::NotIdle(_)));
        (panicked, busy_after, t.ask(Get).await)
    });
    assert!(panicked);
    assert_eq!(
        *from_hook.lock().unwrap(),
        Some(false),
        "a closure ran on the half-changed actor from the panic hook"
    );
    assert!(busy_after);
    assert_eq!(total, Ok(0), "a fresh actor, not the half-changed one");
    let stats = sys.stats().by_type("Tally").unwrap();
    assert_eq!((stats.panics, stats.restarts), (1, 1));
    assert!(seen
        .lock()
        .unwrap()
        .iter()
        .any(|(k, m)| *k == CallbackKind::Handler && m.contains("half changed")));
    sys.shutdown();
}

#[test]
fn closures_keep_an_idle_actor_from_passivating() {
    // `Tally` passivates 500 ms after its last activity; closures every
    // 100 ms for 1.2 s are activity.
    let sys = one_shard();
    let h = sys.handle();
    let all_ran = sys.block_on(async move {
        let t = h.keyed::<Tally>(7);
        assert_eq!(t.ask(Get).await, Ok(0));
        let mut all_ran = true;
        for _ in 0..12 {
            mailring_actors::mailring::time::sleep(Duration::from_millis(100)).await;
            all_ran &= t.run_now(|t| t.total += 1).is_ok();
        }
        all_ran
    });
    assert!(all_ran, "passivated while closures ran on it");
    let stats = sys.stats().by_type("Tally").unwrap();
    assert_eq!((stats.passivations, stats.ran_now), (0, 12));
    // Without them it passivates.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(sys.stats().by_type("Tally").unwrap().passivations, 1);
    sys.shutdown();
}

#[test]
fn a_stop_request_makes_the_actor_busy() {
    let sys = one_shard();
    let h = sys.handle();
    let stopped_busy = sys.block_on(async move {
        let t = h.keyed::<Tally>(8);
        assert_eq!(t.ask(Get).await, Ok(0));
        t.stop();
        matches!(t.run_now(|t| t.total), Err(RunNowError::NotIdle(_)))
    });
    assert!(stopped_busy);
    sys.shutdown();
}

#[test]
fn a_local_addr_runs_the_closure_without_the_lookup() {
    let sys = one_shard();
    let h = sys.handle();
    let got = sys.block_on_local(move || async move {
        let t = h.keyed::<Tally>(9);
        assert_eq!(t.ask(Get).await, Ok(0));
        let local = t.local().unwrap();
        let ran = local.run_now(|t| {
            t.total += 3;
            t.total
        });
        (ran.ok(), local.ask(Get).await)
    });
    assert_eq!(got, (Some(3), Ok(3)));
    sys.shutdown();
}

#[test]
fn a_local_addr_finds_the_next_activation_after_its_actor_ended() {
    let sys = one_shard();
    let h = sys.handle();
    let got = sys.block_on_local(move || async move {
        let t = h.keyed::<Tally>(10);
        assert_eq!(t.ask(Get).await, Ok(0));
        let local = t.local().unwrap();
        t.stop();
        assert!(t.stopped().await.reason == mailring_actors::StopReason::Stopped);
        // Not active: nothing runs, nothing is activated.
        assert!(local.run_now(|t| t.total).is_err());
        // Activated again by another sender: the local reference finds it.
        assert_eq!(h.keyed::<Tally>(10).ask(Get).await, Ok(0));
        local
            .run_now(|t| {
                t.total += 4;
                t.total
            })
            .ok()
    });
    assert_eq!(got, Some(4));
    sys.shutdown();
}

#[test]
fn closures_and_messages_from_many_tasks_keep_each_senders_order() {
    // Tasks on one shard each send notes to a few keyed actors, as tells,
    // as asks, or as closures run at once when the actor is idle (a tell
    // otherwise), yielding at random: every actor must see each task's
    // notes in the order the task made them, none lost or doubled.
    const TASKS: u32 = 8;
    const NOTES: u32 = 400;
    const KEYS: u64 = 3;
    let sys = ActorSystem::start(Runtime::builder().shards(2)).expect("io_uring");
    let h = sys.handle();
    let (seen, ran_now) = sys.block_on_local(move || async move {
        let mut tasks = Vec::new();
        for task in 0..TASKS {
            let h = h.clone();
            tasks.push(mailring_actors::mailring::spawn_local(async move {
                let mut ran_now = 0u32;
                // A small xorshift: the mix differs per task, the same each run.
                let mut x = first_random(task);
                for n in 0..NOTES {
                    let x = next_random(&mut x);
                    let log = h.keyed::<Log>(u64::from(x) % KEYS);
                    match x % 4 {
                        0 => log.tell(Note(task, n)).unwrap(),
                        1 => log.ask(Note(task, n)).await.unwrap(),
                        _ => match log.run_now(|l| l.seen.push((task, n))) {
                            Ok(()) => ran_now += 1,
                            Err(RunNowError::NotIdle(_)) => log.tell(Note(task, n)).unwrap(),
                            Err(RunNowError::Panicked) => {
                                unreachable!("the closure does not panic")
                            }
                        },
                    }
                    if x % 3 == 0 {
                        mailring_actors::mailring::yield_now().await;
                    }
                }
                ran_now
            }));
        }
        let mut ran_now = 0;
        for t in tasks {
            ran_now += t.await.unwrap();
        }
        let mut seen = Vec::new();
        for key in 0..KEYS {
            seen.push(h.keyed::<Log>(key).ask(Seen).await.unwrap());
        }
        (seen, ran_now)
    });
    check_each_senders_order(&seen, TASKS, NOTES);
    assert!(ran_now > 0, "no closure ran at once");
    sys.shutdown();
}

/// `SystemHandle::run_now_keyed`: `Addr::run_now` by key, with no `Addr`.
#[test]
fn a_closure_by_key_runs_on_an_idle_local_actor_and_comes_back_otherwise() {
    let sys = one_shard();
    let h = sys.handle();
    let (ran, got, queued, inactive) = sys.block_on(async move {
        let t = h.keyed::<Tally>(11);
        assert_eq!(t.ask(Get).await, Ok(0));
        let ran = h.run_now_keyed::<Tally, _, _>(&11, |t| {
            t.total += 6;
            t.total
        });
        let got = t.ask(Get).await;
        // A queued message runs first: the closure comes back.
        t.tell(Add(1)).unwrap();
        let queued = matches!(
            h.run_now_keyed::<Tally, _, _>(&11, |t| t.total),
            Err(RunNowError::NotIdle(_))
        );
        assert_eq!(t.ask(Get).await, Ok(7));
        // A key never sent to: not activated by the call.
        let inactive = matches!(
            h.run_now_keyed::<Tally, _, _>(&12, |t| t.total),
            Err(RunNowError::NotIdle(_))
        );
        (ran.ok(), got, queued, inactive)
    });
    assert_eq!(ran, Some(6));
    assert_eq!(got, Ok(6), "the next message sees the change");
    assert!(queued, "ran with a message queued");
    assert!(inactive);
    let stats = sys.stats().by_type("Tally").unwrap();
    assert_eq!(stats.activations, 1, "key 12 was not activated");
    assert_eq!(stats.ran_now, 1);
    // From a thread that is no shard.
    assert!(matches!(
        sys.handle().run_now_keyed::<Tally, _, _>(&11, |t| t.total),
        Err(RunNowError::NotIdle(_))
    ));
    sys.shutdown();
}

/// On shard 1: runs a closure on `Far` key 2 by key from there.
#[derive(Actor, Default)]
#[actor(key = u64, activate = NearByKey::new, pinned = 1, handles(Get))]
struct NearByKey;

impl NearByKey {
    fn new(_key: &u64) -> Self {
        NearByKey
    }
}

impl Handler<Get> for NearByKey {
    async fn handle(&mut self, _m: Get, cx: &mut Ctx<Self>) -> u64 {
        cx.system()
            .run_now_keyed::<Far, _, _>(&2, |f| {
                f.total += 5;
                f.total
            })
            .unwrap_or(u64::MAX)
    }
}

#[test]
fn a_closure_by_key_runs_only_on_the_actors_own_shard() {
    let sys = ActorSystem::start(Runtime::builder().shards(2)).expect("io_uring");
    let h = sys.handle();
    let far = sys.keyed::<Far>(2);
    let (from_shard_0, from_shard_1, total) = sys.block_on(async move {
        assert_eq!(far.ask(Get).await, Ok(0));
        let from_shard_0 = matches!(
            h.run_now_keyed::<Far, _, _>(&2, |f| f.total += 1),
            Err(RunNowError::NotIdle(_))
        );
        let from_shard_1 = h.keyed::<NearByKey>(1).ask(Get).await.unwrap();
        (from_shard_0, from_shard_1, far.ask(Get).await.unwrap())
    });
    assert!(from_shard_0);
    assert_eq!(from_shard_1, 5, "run on its own shard");
    assert_eq!(total, 5);
    sys.shutdown();
}

#[test]
fn a_panicking_closure_by_key_sends_the_actor_through_its_supervision() {
    let sys = one_shard();
    let h = sys.handle();
    let (panicked, after) = sys.block_on(async move {
        let t = h.keyed::<Tally>(13);
        t.tell(Add(3)).unwrap();
        assert_eq!(t.ask(Get).await, Ok(3));
        let panicked = matches!(
            h.run_now_keyed::<Tally, _, _>(&13, |_| -> u64 { panic!("closure by key") }),
            Err(RunNowError::Panicked)
        );
        // Restarted by its supervision: a fresh state answers.
        (panicked, t.ask(Get).await)
    });
    assert!(panicked);
    assert_eq!(after, Ok(0), "restarted after the panic");
    sys.shutdown();
}

/// `SystemHandle::local_actors`: the shard's own table, taken once for
/// many closures by key.
#[test]
fn the_local_table_runs_closures_by_key_and_exists_only_on_a_shard() {
    let sys = ActorSystem::start(Runtime::builder().shards(2)).expect("io_uring");
    let h = sys.handle();
    assert!(
        h.local_actors::<Tally>().is_none(),
        "a thread that is no shard has no table"
    );
    let far = sys.keyed::<Far>(3);
    let (ran, inactive, elsewhere, got) = sys.block_on_local(move || async move {
        let t = h.keyed::<Tally>(14);
        assert_eq!(t.ask(Get).await, Ok(0));
        assert_eq!(far.ask(Get).await, Ok(0));
        let tallies = h.local_actors::<Tally>().expect("on shard 0");
        let ran: Vec<_> = (0..3)
            .map(|_| {
                tallies
                    .run_now(&14, |t| {
                        t.total += 2;
                        t.total
                    })
                    .ok()
            })
            .collect();
        let inactive = matches!(
            tallies.run_now(&15, |t| t.total),
            Err(RunNowError::NotIdle(_))
        );
        // `Far` lives on shard 1: shard 0's table does not hold it.
        let fars = h.local_actors::<Far>().expect("on shard 0");
        let elsewhere = matches!(fars.run_now(&3, |f| f.total), Err(RunNowError::NotIdle(_)));
        (ran, inactive, elsewhere, t.ask(Get).await)
    });
    assert_eq!(ran, [Some(2), Some(4), Some(6)]);
    assert!(inactive);
    assert!(elsewhere);
    assert_eq!(got, Ok(6));
    assert_eq!(sys.stats().by_type("Tally").unwrap().activations, 1);
    sys.shutdown();
}

/// A table taken before its actor stopped finds nothing while none is
/// active (and activates nothing), then the next activation.
#[test]
fn a_local_table_kept_across_its_actors_stop_finds_the_next_activation() {
    let sys = one_shard();
    let h = sys.handle();
    let got = sys.block_on_local(move || async move {
        let t = h.keyed::<Tally>(16);
        assert_eq!(t.ask(Get).await, Ok(0));
        let tallies = h.local_actors::<Tally>().unwrap();
        t.stop();
        assert!(t.stopped().await.reason == mailring_actors::StopReason::Stopped);
        let while_stopped = tallies.run_now(&16, |t| t.total).is_err();
        assert_eq!(h.keyed::<Tally>(16).ask(Get).await, Ok(0));
        let after = tallies.run_now(&16, |t| {
            t.total += 9;
            t.total
        });
        (while_stopped, after.ok())
    });
    assert_eq!(got, (true, Some(9)));
    assert_eq!(sys.stats().by_type("Tally").unwrap().activations, 2);
    sys.shutdown();
}

#[test]
fn a_stop_asked_for_after_a_panicking_closure_is_not_lost_to_the_restart() {
    // A closure panicked (the actor is due to go through its supervision:
    // a restart here), and a stop came before the actor's task dealt with
    // it: the actor stops instead of restarting and running on. The stop
    // used to be dropped, the panic's request being already there.
    let sys = one_shard();
    let h = sys.handle();
    sys.block_on(async move {
        let t = h.keyed::<Tally>(9);
        t.tell(Add(7)).unwrap();
        assert_eq!(t.ask(Get).await, Ok(7));
        assert!(matches!(
            t.run_now(|_| panic!("mid-change")),
            Err(RunNowError::Panicked)
        ));
        t.stop();
        mailring_actors::mailring::time::sleep(Duration::from_millis(50)).await;
    });
    let stats = sys.stats().by_type("Tally").unwrap();
    assert_eq!(stats.restarts, 0, "stopped, not restarted");
    assert_eq!(stats.activations, 1);
    assert_eq!(stats.panics, 1);
    sys.shutdown();
}
