//! kameo 0.22 contender of the actor benches.
//!
//! Actors are `#[derive(Actor)]` structs with one `impl Message<M>` per
//! message, spawned with `Spawn::spawn_with_mailbox(.., mailbox::unbounded())`
//! (kameo's default mailbox is bounded to 64; the benches ask for unbounded
//! ones). Tells are `actor_ref.tell(m).try_send()` (the non-blocking send; it
//! never waits on an unbounded mailbox), asks are `actor_ref.ask(m).await`
//! (`.send()` where a plain `Future` is needed for `join_all`).
//!
//! Threads: `rt` is a Tokio multi-thread runtime with 2 workers, `local` a
//! current-thread runtime (same-thread tells). Kameo actors are Tokio tasks,
//! so Tokio decides where they run:
//! * ping-pong: both actors are spawned on `rt`; a task woken from a worker
//!   lands in that worker's LIFO slot, so the pair usually ends up on one
//!   worker (Tokio gives no pinning; this is what the docs' `spawn` does).
//! * tell_cross / ask_cross / zipf / fanout: as in the Tokio baseline, the
//!   driver (producer, caller, coordinator) is a task spawned on `rt`, never
//!   the bench thread; the actors are spawned from the bench thread (inject
//!   queue) or, in zipf, from the producer tasks. Whether the two sides of a
//!   "cross" bench really sit on different workers is up to Tokio's work
//!   stealing.
//!
//! Tell producers yield (`tokio::task::yield_now`) every `PRODUCER_BURST`
//! sends, like every other contender.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::join_all;
use kameo::actor::{ActorRef, Spawn};
use kameo::mailbox;
use kameo::message::{Context, Message};
use kameo::Actor;
use mailring_bench::PRODUCER_BURST;
use tokio::runtime::{Builder, Runtime};
use tokio::sync::oneshot;

// ------------------------------------------------------------------ actors

/// Counts the messages it receives and sums the `Tell` payloads.
#[derive(Actor, Default)]
struct Counter {
    count: u64,
    sum: u64,
}

/// Fire-and-forget message carrying a payload.
struct Tell(u64);

/// Keyed-routing increment.
struct Inc;

/// Asks a [`Counter`] for `[count, sum]`.
struct Get;

impl Message<Tell> for Counter {
    type Reply = ();

    async fn handle(&mut self, msg: Tell, _ctx: &mut Context<Self, Self::Reply>) -> Self::Reply {
        self.count += 1;
        self.sum += msg.0;
    }
}

impl Message<Inc> for Counter {
    type Reply = ();

    async fn handle(&mut self, _msg: Inc, _ctx: &mut Context<Self, Self::Reply>) -> Self::Reply {
        self.count += 1;
    }
}

impl Message<Get> for Counter {
    type Reply = [u64; 2];

    async fn handle(&mut self, _msg: Get, _ctx: &mut Context<Self, Self::Reply>) -> Self::Reply {
        [self.count, self.sum]
    }
}

/// Answers `Query(q)` with `id + q` (ask latency and fan-out).
#[derive(Actor)]
struct Worker {
    id: u64,
}

/// Request of a [`Worker`].
struct Query(u64);

impl Message<Query> for Worker {
    type Reply = u64;

    async fn handle(&mut self, msg: Query, _ctx: &mut Context<Self, Self::Reply>) -> Self::Reply {
        self.id + msg.0
    }
}

/// Ping-pong side A: starts the exchange and times it.
#[derive(Actor)]
struct Pinger {
    ponger: Option<ActorRef<Ponger>>,
    left: u64,
    started: Instant,
    done: Option<oneshot::Sender<Duration>>,
}

/// Ping-pong side B: answers every `Ping` with a `Pong`.
#[derive(Actor)]
struct Ponger {
    pinger: ActorRef<Pinger>,
}

/// Starts `rounds` round trips; the elapsed time goes to `done`.
struct Start {
    ponger: ActorRef<Ponger>,
    rounds: u64,
    done: oneshot::Sender<Duration>,
}

/// A -> B.
struct Ping(u64);

/// B -> A.
struct Pong(u64);

impl Message<Start> for Pinger {
    type Reply = ();

    async fn handle(&mut self, msg: Start, _ctx: &mut Context<Self, Self::Reply>) -> Self::Reply {
        self.left = msg.rounds;
        self.done = Some(msg.done);
        self.started = Instant::now();
        msg.ponger.tell(Ping(0)).try_send().unwrap();
        self.ponger = Some(msg.ponger);
    }
}

impl Message<Pong> for Pinger {
    type Reply = ();

    async fn handle(&mut self, msg: Pong, _ctx: &mut Context<Self, Self::Reply>) -> Self::Reply {
        self.left -= 1;
        if self.left == 0 {
            if let Some(done) = self.done.take() {
                let _ = done.send(self.started.elapsed());
            }
        } else if let Some(ponger) = &self.ponger {
            ponger.tell(Ping(msg.0 + 1)).try_send().unwrap();
        }
    }
}

impl Message<Ping> for Ponger {
    type Reply = ();

    async fn handle(&mut self, msg: Ping, _ctx: &mut Context<Self, Self::Reply>) -> Self::Reply {
        self.pinger.tell(Pong(msg.0)).try_send().unwrap();
    }
}

// ------------------------------------------------------------------ helpers

/// Key -> actor map shared by the Zipf producers.
type Registry = Mutex<HashMap<u32, ActorRef<Counter>>>;

fn spawn_counter() -> ActorRef<Counter> {
    Counter::spawn_with_mailbox(Counter::default(), mailbox::unbounded())
}

fn spawn_worker(id: u64) -> ActorRef<Worker> {
    Worker::spawn_with_mailbox(Worker { id }, mailbox::unbounded())
}

/// The actor of `key`, spawned by whoever gets there first.
fn activate(registry: &Registry, key: u32) -> ActorRef<Counter> {
    registry
        .lock()
        .unwrap()
        .entry(key)
        .or_insert_with(spawn_counter)
        .clone()
}

/// Sum of `0..msgs` (the payloads of the tell benches).
fn tell_sum(msgs: u64) -> u64 {
    msgs * msgs.saturating_sub(1) / 2
}

/// Stops the actors gracefully and waits until they are gone.
async fn stop_all<A: Actor>(actors: &[ActorRef<A>]) {
    for actor in actors {
        actor.stop_gracefully().await.unwrap();
    }
    for actor in actors {
        actor.wait_for_shutdown().await;
    }
}

/// Runs `f` as a task on the runtime's workers (not on the bench thread).
async fn on_worker<F>(f: F) -> F::Output
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(f).await.unwrap()
}

/// The timed part of the tell benches: `msgs` tells to `counter` from the
/// calling task, then one confirming ask.
async fn tell_run(counter: &ActorRef<Counter>, msgs: u64) -> Duration {
    let t0 = Instant::now();
    for i in 0..msgs {
        counter.tell(Tell(i)).try_send().unwrap();
        if i % PRODUCER_BURST == PRODUCER_BURST - 1 {
            tokio::task::yield_now().await;
        }
    }
    let [count, sum] = counter.ask(Get).await.unwrap();
    let elapsed = t0.elapsed();
    assert_eq!(count, msgs);
    assert_eq!(sum, tell_sum(msgs));
    elapsed
}

/// One fan-out round: ask every worker concurrently, sum the replies.
async fn fan_round(workers: &[ActorRef<Worker>], q: u64) -> u64 {
    join_all(workers.iter().map(|w| w.ask(Query(q)).send()))
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .sum()
}

// ------------------------------------------------------------------ bench

/// The kameo contender: a 2-worker multi-thread runtime and a current-thread
/// runtime, built once.
pub struct Bench {
    rt: Runtime,
    local: Runtime,
}

impl Default for Bench {
    fn default() -> Self {
        Self::new()
    }
}

impl Bench {
    /// Builds the runtimes (outside any timing).
    pub fn new() -> Bench {
        let rt = Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("kameo-worker")
            .enable_all()
            .build()
            .unwrap();
        let local = Builder::new_current_thread().enable_all().build().unwrap();
        Bench { rt, local }
    }

    /// Ping-pong of two actors on the 2-worker runtime, `rounds` round trips;
    /// returns the time from the first ping to the last pong.
    pub fn pingpong(&mut self, rounds: u64) -> Duration {
        assert!(rounds > 0, "ping-pong needs at least one round");
        self.rt.block_on(async move {
            let pinger = Pinger::spawn_with_mailbox(
                Pinger {
                    ponger: None,
                    left: 0,
                    started: Instant::now(),
                    done: None,
                },
                mailbox::unbounded(),
            );
            let ponger = Ponger::spawn_with_mailbox(
                Ponger {
                    pinger: pinger.clone(),
                },
                mailbox::unbounded(),
            );
            pinger.wait_for_startup().await;
            ponger.wait_for_startup().await;
            let (tx, rx) = oneshot::channel();
            pinger
                .tell(Start {
                    ponger: ponger.clone(),
                    rounds,
                    done: tx,
                })
                .try_send()
                .unwrap();
            let elapsed = rx.await.unwrap();
            stop_all(&[pinger]).await;
            stop_all(&[ponger]).await;
            elapsed
        })
    }

    /// `msgs` tells to an actor on the same thread (current-thread runtime),
    /// plus one confirming ask.
    pub fn tell_same(&mut self, msgs: u64) -> Duration {
        self.local.block_on(async move {
            let counter = spawn_counter();
            counter.wait_for_startup().await;
            let elapsed = tell_run(&counter, msgs).await;
            stop_all(&[counter]).await;
            elapsed
        })
    }

    /// `msgs` tells from a producer task to an actor, both on the 2-worker
    /// runtime, plus one confirming ask.
    pub fn tell_cross(&mut self, msgs: u64) -> Duration {
        self.rt.block_on(async move {
            let counter = spawn_counter();
            counter.wait_for_startup().await;
            let (elapsed, counter) = on_worker(async move {
                let elapsed = tell_run(&counter, msgs).await;
                (elapsed, counter)
            })
            .await;
            stop_all(&[counter]).await;
            elapsed
        })
    }

    /// `asks` sequential asks from a task to an actor, both on the 2-worker
    /// runtime.
    pub fn ask_cross(&mut self, asks: u64) -> Duration {
        self.rt.block_on(async move {
            let worker = spawn_worker(0);
            worker.wait_for_startup().await;
            let (elapsed, worker) = on_worker(async move {
                let t0 = Instant::now();
                for i in 0..asks {
                    assert_eq!(worker.ask(Query(i)).await.unwrap(), i);
                }
                (t0.elapsed(), worker)
            })
            .await;
            stop_all(&[worker]).await;
            elapsed
        })
    }

    /// Keyed routing: one producer task per key list, actors spawned on the
    /// first message to their key, then a driver task checks every actor's
    /// count.
    pub fn zipf(&mut self, producers: &[Vec<u32>], n_keys: u32) -> Duration {
        let expected = mailring_bench::histogram(n_keys, producers);
        let lists: Vec<Vec<u32>> = producers.to_vec();
        self.rt.block_on(on_worker(async move {
            let registry: Arc<Registry> = Arc::default();
            let t0 = Instant::now();
            let tasks: Vec<_> = lists
                .into_iter()
                .map(|keys| {
                    let registry = Arc::clone(&registry);
                    tokio::spawn(async move {
                        // Per-producer cache; the shared map is only locked
                        // on a producer's first message to a key.
                        let mut cache: HashMap<u32, ActorRef<Counter>> = HashMap::new();
                        for key in keys {
                            cache
                                .entry(key)
                                .or_insert_with(|| activate(&registry, key))
                                .tell(Inc)
                                .try_send()
                                .unwrap();
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.unwrap();
            }
            let actors: Vec<(u32, ActorRef<Counter>)> = registry.lock().unwrap().drain().collect();
            let replies = join_all(actors.iter().map(|(_, a)| a.ask(Get).send())).await;
            for ((key, _), reply) in actors.iter().zip(replies) {
                assert_eq!(reply.unwrap()[0], expected[*key as usize], "key {key}");
            }
            assert_eq!(actors.len(), expected.iter().filter(|&&c| c > 0).count());
            let elapsed = t0.elapsed();
            let refs: Vec<ActorRef<Counter>> = actors.into_iter().map(|(_, a)| a).collect();
            stop_all(&refs).await;
            elapsed
        }))
    }

    /// Fan-out/fan-in: `actors` workers on the runtime, one coordinator task
    /// asks them all concurrently for `rounds` rounds (after one untimed
    /// warm-up round).
    pub fn fanout(&mut self, actors: usize, rounds: usize) -> Duration {
        self.rt.block_on(async move {
            let workers: Vec<ActorRef<Worker>> = (0..actors as u64).map(spawn_worker).collect();
            let coordinator = tokio::spawn(async move {
                let n = workers.len() as u64;
                let base = n * n.saturating_sub(1) / 2;
                fan_round(&workers, 0).await;
                let t0 = Instant::now();
                for round in 1..=rounds as u64 {
                    assert_eq!(fan_round(&workers, round).await, base + n * round);
                }
                (t0.elapsed(), workers)
            });
            let (elapsed, workers) = coordinator.await.unwrap();
            stop_all(&workers).await;
            elapsed
        })
    }
}
