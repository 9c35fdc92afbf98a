//! ractor 0.16 contender of the actor benches (`default-features = false`,
//! `features = ["tokio_runtime"]`, so the `Actor` trait uses native
//! `async fn`, no `#[async_trait]`).
//!
//! Actors implement `ractor::Actor` (message enum + separate state, built in
//! `pre_start`) and are spawned with `Actor::spawn(None, handler, args).await`.
//! Ractor mailboxes are always unbounded. Tells are `ActorRef::cast` (the
//! non-blocking `cast!`), asks are `ractor::call!` (an `RpcReplyPort` in the
//! message, no timeout).
//!
//! Threads: `rt` is a Tokio multi-thread runtime with 2 workers, `local` a
//! current-thread runtime (same-thread tells). Ractor actors are Tokio tasks,
//! so Tokio decides where they run:
//! * ping-pong: both actors are spawned on `rt`; a task woken from a worker
//!   lands in that worker's LIFO slot, so the pair usually ends up on one
//!   worker (Tokio gives no pinning; this is what `Actor::spawn` does).
//! * tell_cross / ask_cross / zipf / fanout: as in the Tokio baseline, the
//!   driver (producer, caller, coordinator) is a task spawned on `rt`, never
//!   the bench thread; the actors are spawned from the bench thread (inject
//!   queue) or, in zipf, from the producer tasks. Whether the two sides of a
//!   "cross" bench really sit on different workers is up to Tokio's work
//!   stealing.
//!
//! Tell producers yield (`tokio::task::yield_now`) every `PRODUCER_BURST`
//! sends, like every other contender.

use std::collections::hash_map;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use mailring_bench::PRODUCER_BURST;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::runtime::{Builder, Runtime};
use tokio::sync::{oneshot, Mutex};
use tokio::task::JoinHandle;

// ------------------------------------------------------------------ actors

/// Counts the messages it receives and sums the `Tell` payloads.
struct Counter;

/// Messages of [`Counter`].
enum CounterMsg {
    /// Fire-and-forget message carrying a payload.
    Tell(u64),
    /// Keyed-routing increment.
    Inc,
    /// Replies `(count, sum)`.
    Get(RpcReplyPort<(u64, u64)>),
}

/// State of [`Counter`].
#[derive(Default)]
struct CounterState {
    count: u64,
    sum: u64,
}

impl Actor for Counter {
    type Msg = CounterMsg;
    type State = CounterState;
    type Arguments = ();

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        _args: (),
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(CounterState::default())
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            CounterMsg::Tell(v) => {
                state.count += 1;
                state.sum += v;
            }
            CounterMsg::Inc => state.count += 1,
            CounterMsg::Get(reply) => reply.send((state.count, state.sum))?,
        }
        Ok(())
    }
}

/// Answers `Query(q)` with `id + q` (ask latency and fan-out); the state is
/// the id.
struct Worker;

/// Messages of [`Worker`].
enum WorkerMsg {
    /// Replies `id + q`.
    Query(u64, RpcReplyPort<u64>),
}

impl Actor for Worker {
    type Msg = WorkerMsg;
    type State = u64;
    type Arguments = u64;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        id: u64,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(id)
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let WorkerMsg::Query(q, reply) = message;
        reply.send(*state + q)?;
        Ok(())
    }
}

/// Ping-pong side A: starts the exchange and times it.
struct Pinger;

/// Messages of [`Pinger`].
enum PingerMsg {
    /// Starts `rounds` round trips with the given ponger; the elapsed time
    /// goes to the sender.
    Start(ActorRef<PongerMsg>, u64, oneshot::Sender<Duration>),
    /// B -> A.
    Pong(u64),
}

/// State of [`Pinger`].
struct PingerState {
    ponger: Option<ActorRef<PongerMsg>>,
    left: u64,
    started: Instant,
    done: Option<oneshot::Sender<Duration>>,
}

impl Actor for Pinger {
    type Msg = PingerMsg;
    type State = PingerState;
    type Arguments = ();

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        _args: (),
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(PingerState {
            ponger: None,
            left: 0,
            started: Instant::now(),
            done: None,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            PingerMsg::Start(ponger, rounds, done) => {
                state.left = rounds;
                state.done = Some(done);
                state.started = Instant::now();
                ponger.cast(PongerMsg::Ping(0))?;
                state.ponger = Some(ponger);
            }
            PingerMsg::Pong(n) => {
                state.left -= 1;
                if state.left == 0 {
                    if let Some(done) = state.done.take() {
                        let _ = done.send(state.started.elapsed());
                    }
                } else if let Some(ponger) = &state.ponger {
                    ponger.cast(PongerMsg::Ping(n + 1))?;
                }
            }
        }
        Ok(())
    }
}

/// Ping-pong side B: answers every `Ping` with a `Pong`; the state is the
/// pinger.
struct Ponger;

/// Messages of [`Ponger`].
enum PongerMsg {
    /// A -> B.
    Ping(u64),
}

impl Actor for Ponger {
    type Msg = PongerMsg;
    type State = ActorRef<PingerMsg>;
    type Arguments = ActorRef<PingerMsg>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        pinger: ActorRef<PingerMsg>,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(pinger)
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let PongerMsg::Ping(n) = message;
        state.cast(PingerMsg::Pong(n))?;
        Ok(())
    }
}

// ------------------------------------------------------------------ helpers

/// A spawned actor and the handle of its processing loop.
type Spawned<M> = (ActorRef<M>, JoinHandle<()>);

/// Key -> actor map shared by the Zipf producers (an async mutex: spawning
/// awaits `pre_start`).
type Registry = Mutex<HashMap<u32, Spawned<CounterMsg>>>;

/// The actor of `key`, spawned by whoever gets there first.
async fn activate(registry: &Registry, key: u32) -> ActorRef<CounterMsg> {
    let mut map = registry.lock().await;
    if let Some((actor, _)) = map.get(&key) {
        return actor.clone();
    }
    let (actor, handle) = Actor::spawn(None, Counter, ()).await.unwrap();
    map.insert(key, (actor.clone(), handle));
    actor
}

/// Sum of `0..msgs` (the payloads of the tell benches).
fn tell_sum(msgs: u64) -> u64 {
    msgs * msgs.saturating_sub(1) / 2
}

/// Stops the actors and waits for their processing loops to end.
async fn stop_all<M: ractor::Message>(actors: Vec<Spawned<M>>) {
    for (actor, _) in &actors {
        actor.stop(None);
    }
    for (_, handle) in actors {
        handle.await.unwrap();
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

/// The timed part of the tell benches: `msgs` casts to `counter` from the
/// calling task, then one confirming call.
async fn tell_run(counter: &ActorRef<CounterMsg>, msgs: u64) -> Duration {
    let t0 = Instant::now();
    for i in 0..msgs {
        counter.cast(CounterMsg::Tell(i)).unwrap();
        if i % PRODUCER_BURST == PRODUCER_BURST - 1 {
            tokio::task::yield_now().await;
        }
    }
    let (count, sum) = ractor::call!(counter, CounterMsg::Get).unwrap();
    let elapsed = t0.elapsed();
    assert_eq!(count, msgs);
    assert_eq!(sum, tell_sum(msgs));
    elapsed
}

/// One fan-out round: call every worker concurrently, sum the replies.
async fn fan_round(workers: &[ActorRef<WorkerMsg>], q: u64) -> u64 {
    join_all(
        workers
            .iter()
            .map(|w| async move { ractor::call!(w, WorkerMsg::Query, q).unwrap() }),
    )
    .await
    .into_iter()
    .sum()
}

// ------------------------------------------------------------------ bench

/// The ractor contender: a 2-worker multi-thread runtime and a
/// current-thread runtime, built once.
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
            .thread_name("ractor-worker")
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
            let (pinger, pinger_handle) = Actor::spawn(None, Pinger, ()).await.unwrap();
            let (ponger, ponger_handle) = Actor::spawn(None, Ponger, pinger.clone()).await.unwrap();
            let (tx, rx) = oneshot::channel();
            pinger
                .cast(PingerMsg::Start(ponger.clone(), rounds, tx))
                .unwrap();
            let elapsed = rx.await.unwrap();
            stop_all(vec![(pinger, pinger_handle)]).await;
            stop_all(vec![(ponger, ponger_handle)]).await;
            elapsed
        })
    }

    /// `msgs` casts to an actor on the same thread (current-thread runtime),
    /// plus one confirming call.
    pub fn tell_same(&mut self, msgs: u64) -> Duration {
        self.local.block_on(async move {
            let (counter, handle) = Actor::spawn(None, Counter, ()).await.unwrap();
            let elapsed = tell_run(&counter, msgs).await;
            stop_all(vec![(counter, handle)]).await;
            elapsed
        })
    }

    /// `msgs` casts from a producer task to an actor, both on the 2-worker
    /// runtime, plus one confirming call.
    pub fn tell_cross(&mut self, msgs: u64) -> Duration {
        self.rt.block_on(async move {
            let (counter, handle) = Actor::spawn(None, Counter, ()).await.unwrap();
            let (elapsed, counter) = on_worker(async move {
                let elapsed = tell_run(&counter, msgs).await;
                (elapsed, counter)
            })
            .await;
            stop_all(vec![(counter, handle)]).await;
            elapsed
        })
    }

    /// `asks` sequential calls from a task to an actor, both on the 2-worker
    /// runtime.
    pub fn ask_cross(&mut self, asks: u64) -> Duration {
        self.rt.block_on(async move {
            let (worker, handle) = Actor::spawn(None, Worker, 0).await.unwrap();
            let (elapsed, worker) = on_worker(async move {
                let t0 = Instant::now();
                for i in 0..asks {
                    assert_eq!(ractor::call!(worker, WorkerMsg::Query, i).unwrap(), i);
                }
                (t0.elapsed(), worker)
            })
            .await;
            stop_all(vec![(worker, handle)]).await;
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
                        let mut cache: HashMap<u32, ActorRef<CounterMsg>> = HashMap::new();
                        for key in keys {
                            let actor = match cache.entry(key) {
                                hash_map::Entry::Occupied(e) => e.into_mut(),
                                hash_map::Entry::Vacant(e) => {
                                    e.insert(activate(&registry, key).await)
                                }
                            };
                            actor.cast(CounterMsg::Inc).unwrap();
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.unwrap();
            }
            let actors: Vec<(u32, Spawned<CounterMsg>)> =
                std::mem::take(&mut *registry.lock().await)
                    .into_iter()
                    .collect();
            let replies = join_all(
                actors
                    .iter()
                    .map(|(_, (a, _))| async move { ractor::call!(a, CounterMsg::Get).unwrap() }),
            )
            .await;
            for ((key, _), (count, _)) in actors.iter().zip(replies) {
                assert_eq!(count, expected[*key as usize], "key {key}");
            }
            assert_eq!(actors.len(), expected.iter().filter(|&&c| c > 0).count());
            let elapsed = t0.elapsed();
            stop_all(actors.into_iter().map(|(_, s)| s).collect()).await;
            elapsed
        }))
    }

    /// Fan-out/fan-in: `actors` workers on the runtime, one coordinator task
    /// calls them all concurrently for `rounds` rounds (after one untimed
    /// warm-up round).
    pub fn fanout(&mut self, actors: usize, rounds: usize) -> Duration {
        self.rt.block_on(async move {
            let mut spawned = Vec::with_capacity(actors);
            for id in 0..actors as u64 {
                spawned.push(Actor::spawn(None, Worker, id).await.unwrap());
            }
            let workers: Vec<ActorRef<WorkerMsg>> =
                spawned.iter().map(|(a, _)| a.clone()).collect();
            let coordinator = tokio::spawn(async move {
                let n = workers.len() as u64;
                let base = n * n.saturating_sub(1) / 2;
                fan_round(&workers, 0).await;
                let t0 = Instant::now();
                for round in 1..=rounds as u64 {
                    assert_eq!(fan_round(&workers, round).await, base + n * round);
                }
                t0.elapsed()
            });
            let elapsed = coordinator.await.unwrap();
            stop_all(spawned).await;
            elapsed
        })
    }
}
