//! `Addr::run_in_order`: a closure run on the actor's shard at its place
//! in the sender's order (after what the sending shard sent to actors of
//! the type there before, before what it sends after); on the actor's own
//! shard, now. With `run_now` inside and a message sent from there when
//! the actor is busy, work reaches an actor on another shard without a
//! turn of its task and without overtaking the sender's messages.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use mailring_actors::mailring::panic::{CallbackKind, PanicEvent};
use mailring_actors::mailring::sync::oneshot;
use mailring_actors::{Actor, ActorSystem, Ctx, Handler, RunNowError, Runtime, ShardId};

mod common;
use common::{check_each_senders_order, first_random, next_random, FarLog, Note, Seen};

/// A keyed type pinned to a shard the test systems do not have.
#[derive(Actor, Default)]
#[actor(key = u64, activate = Nowhere::new, pinned = 7, handles(Seen))]
struct Nowhere;

impl Nowhere {
    fn new(_key: &u64) -> Self {
        Nowhere
    }
}

impl Handler<Seen> for Nowhere {
    async fn handle(&mut self, _m: Seen, _cx: &mut Ctx<Self>) -> Vec<(u32, u32)> {
        Vec::new()
    }
}

/// Notes `note` on `log` from its own shard: at once when it is idle, a
/// tell from there otherwise. Returns whether it ran at once.
fn note_there(log: &mailring_actors::Addr<FarLog>, note: (u32, u32)) -> bool {
    match log.run_now(|l| l.seen.push(note)) {
        Ok(()) => true,
        Err(RunNowError::NotIdle(_)) => {
            log.tell(Note(note.0, note.1)).unwrap();
            false
        }
        Err(RunNowError::Panicked) => unreachable!("the closure does not panic"),
    }
}

/// A panic the runtime reported: its kind, shard and message.
type Caught = (CallbackKind, Option<ShardId>, String);

fn two_shards() -> ActorSystem {
    ActorSystem::start(Runtime::builder().shards(2)).expect("io_uring")
}

#[test]
fn the_closure_runs_on_the_actors_shard_between_the_senders_messages() {
    let sys = two_shards();
    let h = sys.handle();
    let (seen, shard) = sys.block_on(async move {
        let log = h.keyed::<FarLog>(1);
        // Active and idle on shard 1 first.
        log.tell(Note(0, 0)).unwrap();
        assert_eq!(log.ask(Seen).await.unwrap(), [(0, 0)]);
        let (tx, rx) = oneshot::channel();
        log.tell(Note(0, 1)).unwrap();
        let there = log.clone();
        log.run_in_order(move || {
            // At once or as a tell from shard 1: the note keeps its place.
            note_there(&there, (0, 2));
            let _ = tx.send(mailring_actors::mailring::current_shard());
        });
        log.tell(Note(0, 3)).unwrap();
        let shard = rx.await.unwrap();
        (log.ask(Seen).await.unwrap(), shard)
    });
    assert_eq!(shard, Some(ShardId::new(1)));
    assert_eq!(seen, [(0, 1), (0, 2), (0, 3)]);
    sys.shutdown();
}

#[test]
fn an_idle_actor_on_another_shard_runs_the_closure_without_a_message() {
    let sys = two_shards();
    let h = sys.handle();
    let (at_once, seen) = sys.block_on(async move {
        let log = h.keyed::<FarLog>(2);
        log.tell(Note(1, 0)).unwrap();
        assert_eq!(log.ask(Seen).await.unwrap(), [(1, 0)]);
        let (tx, rx) = oneshot::channel();
        let there = log.clone();
        log.run_in_order(move || {
            let _ = tx.send(note_there(&there, (1, 1)));
        });
        let at_once = rx.await.unwrap();
        (at_once, log.ask(Seen).await.unwrap())
    });
    assert!(at_once, "the idle actor was sent a message");
    assert_eq!(seen, [(1, 1)]);
    let stats = sys.stats().by_type("FarLog").unwrap();
    assert_eq!(stats.ran_now, 1);
    sys.shutdown();
}

#[test]
fn on_the_actors_own_shard_the_closure_runs_now_in_the_caller() {
    let sys = two_shards();
    let h = sys.handle();
    let ran = sys.block_on_local(move || async move {
        // This task runs on shard 0; `FarLog` lives on shard 1: ask from there.
        let (tx, rx) = oneshot::channel();
        let h2 = h.clone();
        h.runtime().run_on(ShardId::new(1), move || {
            let log = h2.keyed::<FarLog>(3);
            let ran = Arc::new(AtomicBool::new(false));
            let r = ran.clone();
            log.run_in_order(move || r.store(true, Ordering::Release));
            let _ = tx.send(ran.load(Ordering::Acquire));
        });
        rx.await.unwrap()
    });
    assert!(
        ran,
        "on its own shard the closure did not run before the call returned"
    );
    sys.shutdown();
}

#[test]
fn a_closure_for_a_shard_that_does_not_exist_is_dropped_unrun() {
    let sys = two_shards();
    let h = sys.handle();
    let got = sys.block_on(async move {
        let (tx, rx) = oneshot::channel::<()>();
        h.keyed::<Nowhere>(1).run_in_order(move || {
            let _ = tx.send(());
        });
        rx.await
    });
    assert!(got.is_err(), "the closure ran for a shard the system lacks");
    sys.shutdown();
}

#[test]
fn a_panicking_closure_is_reported_and_the_deliveries_after_it_go_on() {
    let seen: Arc<Mutex<Vec<Caught>>> = Arc::default();
    let log_panics = seen.clone();
    let builder = Runtime::builder()
        .shards(2)
        .on_panic(move |e: &PanicEvent<'_>| {
            log_panics
                .lock()
                .unwrap()
                .push((e.kind, e.shard, e.message.to_owned()));
        });
    let sys = ActorSystem::start(builder).expect("io_uring");
    let h = sys.handle();
    let notes = sys.block_on(async move {
        let log = h.keyed::<FarLog>(4);
        log.tell(Note(2, 0)).unwrap();
        log.run_in_order(|| panic!("closure in order"));
        log.tell(Note(2, 1)).unwrap();
        log.ask(Seen).await.unwrap()
    });
    assert_eq!(notes, [(2, 0), (2, 1)]);
    assert!(seen
        .lock()
        .unwrap()
        .iter()
        .any(|(k, shard, m)| *k == CallbackKind::RunOn
            && *shard == Some(ShardId::new(1))
            && m.contains("closure in order")));
    sys.shutdown();
}

#[test]
fn closures_and_messages_from_many_tasks_keep_each_senders_order_across_shards() {
    // Tasks on shard 0 send notes to keyed actors on shard 1 as tells, as
    // asks, or as closures in order (at once there when the actor is
    // idle, a tell from there otherwise), yielding at random: every actor
    // must see each task's notes in the order the task made them, none
    // lost or doubled.
    const TASKS: u32 = 8;
    const NOTES: u32 = 400;
    const KEYS: u64 = 3;
    let sys = two_shards();
    let h = sys.handle();
    let at_once = Arc::new(AtomicU32::new(0));
    let counted = at_once.clone();
    let seen = sys.block_on_local(move || async move {
        let mut tasks = Vec::new();
        for task in 0..TASKS {
            let h = h.clone();
            let counted = counted.clone();
            tasks.push(mailring_actors::mailring::spawn_local(async move {
                let mut x = first_random(task);
                for n in 0..NOTES {
                    let x = next_random(&mut x);
                    let log = h.keyed::<FarLog>(u64::from(x) % KEYS);
                    match x % 4 {
                        0 => log.tell(Note(task, n)).unwrap(),
                        1 => log.ask(Note(task, n)).await.unwrap(),
                        _ => {
                            let there = log.clone();
                            let counted = counted.clone();
                            log.run_in_order(move || {
                                if note_there(&there, (task, n)) {
                                    counted.fetch_add(1, Ordering::Relaxed);
                                }
                            });
                        }
                    }
                    if x % 3 == 0 {
                        mailring_actors::mailring::yield_now().await;
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let mut seen = Vec::new();
        for key in 0..KEYS {
            seen.push(h.keyed::<FarLog>(key).ask(Seen).await.unwrap());
        }
        seen
    });
    check_each_senders_order(&seen, TASKS, NOTES);
    assert!(
        at_once.load(Ordering::Relaxed) > 0,
        "no closure ran at once"
    );
    sys.shutdown();
}
