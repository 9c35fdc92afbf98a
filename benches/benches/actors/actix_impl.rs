//! actix 0.13 contender of the actor benches.
//!
//! Actors implement `Actor` (`Context<Self>`) and one `Handler<M>` per
//! `#[derive(Message)]` message. Tells are `Addr::do_send` (fire-and-forget;
//! it always queues, ignoring the mailbox capacity, which is 16 by default;
//! actix has no unbounded mailbox option), asks are `Addr::send(m).await`.
//!
//! Threads: `Bench::new` starts a dedicated system thread (`System::new()` +
//! `SystemRunner::run`) that creates two `Arbiter`s (one OS thread with a
//! single-threaded Tokio runtime each). Benchmark futures are sent to an
//! arbiter with `Arbiter::spawn_fn` + `actix::spawn`, results come back over a
//! std channel. Placement is explicit:
//! * ping-pong: A on arbiter 0, B on arbiter 1;
//! * tell_same: producer and actor on arbiter 0;
//! * tell_cross / ask_cross: producer / caller on arbiter 0, actor on
//!   arbiter 1;
//! * zipf: producer i on arbiter i % 2, each creates its keys' actors on its
//!   own arbiter (`Actor::start`), the count check runs on arbiter 0;
//! * fanout: worker i on arbiter i % 2, the coordinator on arbiter 0.
//!
//! Tell producers yield (`tokio::task::yield_now`, the arbiter is a Tokio
//! current-thread runtime + `LocalSet`) every `PRODUCER_BURST` sends, like
//! every other contender.
//!
//! Actors stop when their last `Addr` is dropped (the ping-pong pair, which
//! holds each other's address, stops itself after the last pong).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use futures::future::join_all;
use mailring_bench::PRODUCER_BURST;

// ------------------------------------------------------------------ actors

/// Counts the messages it receives and sums the `Tell` payloads.
#[derive(Default)]
struct Counter {
    count: u64,
    sum: u64,
}

impl Actor for Counter {
    type Context = Context<Self>;
}

/// Fire-and-forget message carrying a payload.
#[derive(Message)]
#[rtype(result = "()")]
struct Tell(u64);

/// Keyed-routing increment.
#[derive(Message)]
#[rtype(result = "()")]
struct Inc;

/// Asks a [`Counter`] for `(count, sum)`.
#[derive(Message)]
#[rtype(result = "(u64, u64)")]
struct Get;

impl Handler<Tell> for Counter {
    type Result = ();

    fn handle(&mut self, msg: Tell, _ctx: &mut Context<Self>) {
        self.count += 1;
        self.sum += msg.0;
    }
}

impl Handler<Inc> for Counter {
    type Result = ();

    fn handle(&mut self, _msg: Inc, _ctx: &mut Context<Self>) {
        self.count += 1;
    }
}

impl Handler<Get> for Counter {
    type Result = MessageResult<Get>;

    fn handle(&mut self, _msg: Get, _ctx: &mut Context<Self>) -> Self::Result {
        MessageResult((self.count, self.sum))
    }
}

/// Answers `Query(q)` with `id + q` (ask latency and fan-out).
struct Worker {
    id: u64,
}

impl Actor for Worker {
    type Context = Context<Self>;
}

/// Request of a [`Worker`].
#[derive(Message)]
#[rtype(result = "u64")]
struct Query(u64);

impl Handler<Query> for Worker {
    type Result = u64;

    fn handle(&mut self, msg: Query, _ctx: &mut Context<Self>) -> Self::Result {
        self.id + msg.0
    }
}

/// Ping-pong side A: starts the exchange, times it, then stops itself.
struct Pinger {
    ponger: Option<Addr<Ponger>>,
    left: u64,
    started: Instant,
    done: Option<mpsc::Sender<Duration>>,
}

impl Actor for Pinger {
    type Context = Context<Self>;
}

/// Ping-pong side B: answers every `Ping` with a `Pong`.
struct Ponger {
    pinger: Addr<Pinger>,
}

impl Actor for Ponger {
    type Context = Context<Self>;
}

/// Starts `rounds` round trips; the elapsed time goes to `done`.
#[derive(Message)]
#[rtype(result = "()")]
struct Start {
    ponger: Addr<Ponger>,
    rounds: u64,
    done: mpsc::Sender<Duration>,
}

/// A -> B.
#[derive(Message)]
#[rtype(result = "()")]
struct Ping(u64);

/// B -> A.
#[derive(Message)]
#[rtype(result = "()")]
struct Pong(u64);

impl Handler<Start> for Pinger {
    type Result = ();

    fn handle(&mut self, msg: Start, _ctx: &mut Context<Self>) {
        self.left = msg.rounds;
        self.done = Some(msg.done);
        self.started = Instant::now();
        msg.ponger.do_send(Ping(0));
        self.ponger = Some(msg.ponger);
    }
}

impl Handler<Pong> for Pinger {
    type Result = ();

    fn handle(&mut self, msg: Pong, ctx: &mut Context<Self>) {
        self.left -= 1;
        if self.left > 0 {
            if let Some(ponger) = &self.ponger {
                ponger.do_send(Ping(msg.0 + 1));
            }
            return;
        }
        if let Some(done) = self.done.take() {
            let _ = done.send(self.started.elapsed());
        }
        // Break the address cycle: B stops once its last address is gone.
        self.ponger = None;
        ctx.stop();
    }
}

impl Handler<Ping> for Ponger {
    type Result = ();

    fn handle(&mut self, msg: Ping, _ctx: &mut Context<Self>) {
        self.pinger.do_send(Pong(msg.0));
    }
}

// ------------------------------------------------------------------ helpers

/// Key -> actor map shared by the Zipf producers.
type Registry = Mutex<HashMap<u32, Addr<Counter>>>;

/// The actor of `key`, started on the calling arbiter by whoever gets there
/// first.
fn activate(registry: &Registry, key: u32) -> Addr<Counter> {
    registry
        .lock()
        .unwrap()
        .entry(key)
        .or_insert_with(Counter::start_default)
        .clone()
}

/// Sum of `0..msgs` (the payloads of the tell benches).
fn tell_sum(msgs: u64) -> u64 {
    msgs * msgs.saturating_sub(1) / 2
}

/// Runs the future built by `make` on `arbiter`'s thread and blocks the
/// calling thread until it returns its output.
fn run_on<T, F, Fut>(arbiter: &Arbiter, make: F) -> T
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T> + 'static,
{
    let (tx, rx) = mpsc::channel();
    let sent = arbiter.spawn_fn(move || {
        actix::spawn(async move {
            let _ = tx.send(make().await);
        });
    });
    assert!(sent, "the arbiter is gone");
    rx.recv()
        .expect("the benchmark future panicked on its arbiter")
}

/// `msgs` tells to `counter` from the calling arbiter, then one ask.
async fn tell_run(counter: Addr<Counter>, msgs: u64) -> Duration {
    // Untimed: makes sure the actor has started.
    counter.send(Get).await.unwrap();
    let t0 = Instant::now();
    for i in 0..msgs {
        counter.do_send(Tell(i));
        if i % PRODUCER_BURST == PRODUCER_BURST - 1 {
            tokio::task::yield_now().await;
        }
    }
    let (count, sum) = counter.send(Get).await.unwrap();
    let elapsed = t0.elapsed();
    assert_eq!(count, msgs);
    assert_eq!(sum, tell_sum(msgs));
    elapsed
}

/// One fan-out round: ask every worker concurrently, sum the replies.
async fn fan_round(workers: &[Addr<Worker>], q: u64) -> u64 {
    join_all(workers.iter().map(|w| w.send(Query(q))))
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .sum()
}

// ------------------------------------------------------------------ bench

/// The actix contender: a System on its own thread and two Arbiters, built
/// once; dropping it stops and joins them all.
pub struct Bench {
    system: System,
    arbiters: Vec<Arbiter>,
    system_thread: Option<std::thread::JoinHandle<()>>,
}

impl Default for Bench {
    fn default() -> Self {
        Self::new()
    }
}

impl Bench {
    /// Starts the System thread and the two Arbiters (outside any timing).
    pub fn new() -> Bench {
        let (tx, rx) = mpsc::channel();
        let system_thread = std::thread::Builder::new()
            .name("actix-system".into())
            .spawn(move || {
                let runner = System::new();
                let arbiters = vec![Arbiter::new(), Arbiter::new()];
                tx.send((System::current(), arbiters)).unwrap();
                runner.run().unwrap();
            })
            .unwrap();
        let (system, arbiters) = rx.recv().unwrap();
        Bench {
            system,
            arbiters,
            system_thread: Some(system_thread),
        }
    }

    /// Ping-pong between an actor on arbiter 0 and one on arbiter 1,
    /// `rounds` round trips; returns the time from the first ping to the last
    /// pong.
    pub fn pingpong(&mut self, rounds: u64) -> Duration {
        assert!(rounds > 0, "ping-pong needs at least one round");
        let pinger = Pinger::start_in_arbiter(&self.arbiters[0].handle(), |_| Pinger {
            ponger: None,
            left: 0,
            started: Instant::now(),
            done: None,
        });
        let for_ponger = pinger.clone();
        let ponger = Ponger::start_in_arbiter(&self.arbiters[1].handle(), move |_| Ponger {
            pinger: for_ponger,
        });
        let (tx, rx) = mpsc::channel();
        pinger.do_send(Start {
            ponger,
            rounds,
            done: tx,
        });
        rx.recv().unwrap()
    }

    /// `msgs` tells to an actor on the same arbiter as the producer, plus one
    /// confirming ask.
    pub fn tell_same(&mut self, msgs: u64) -> Duration {
        run_on(&self.arbiters[0], move || {
            tell_run(Counter::start_default(), msgs)
        })
    }

    /// `msgs` tells from arbiter 0 to an actor on arbiter 1, plus one
    /// confirming ask.
    pub fn tell_cross(&mut self, msgs: u64) -> Duration {
        let counter = Counter::start_in_arbiter(&self.arbiters[1].handle(), |_| Counter::default());
        run_on(&self.arbiters[0], move || tell_run(counter, msgs))
    }

    /// `asks` sequential asks from arbiter 0 to an actor on arbiter 1.
    pub fn ask_cross(&mut self, asks: u64) -> Duration {
        let worker = Worker::start_in_arbiter(&self.arbiters[1].handle(), |_| Worker { id: 0 });
        run_on(&self.arbiters[0], move || async move {
            // Untimed: makes sure the actor has started.
            worker.send(Query(0)).await.unwrap();
            let t0 = Instant::now();
            for i in 0..asks {
                assert_eq!(worker.send(Query(i)).await.unwrap(), i);
            }
            t0.elapsed()
        })
    }

    /// Keyed routing: producer i runs on arbiter i % 2, actors are started
    /// on the first message to their key, then every actor's count is
    /// checked (from arbiter 0).
    pub fn zipf(&mut self, producers: &[Vec<u32>], n_keys: u32) -> Duration {
        let expected = mailring_bench::histogram(n_keys, producers);
        let lists: Vec<Vec<u32>> = producers.to_vec();
        let registry: Arc<Registry> = Arc::default();
        let (tx, rx) = mpsc::channel();
        let t0 = Instant::now();
        for (arbiter, keys) in self.arbiters.iter().cycle().zip(lists) {
            let registry = Arc::clone(&registry);
            let tx = tx.clone();
            let sent = arbiter.spawn_fn(move || {
                // Per-producer cache; the shared map is only locked on a
                // producer's first message to a key.
                let mut cache: HashMap<u32, Addr<Counter>> = HashMap::new();
                for key in keys {
                    cache
                        .entry(key)
                        .or_insert_with(|| activate(&registry, key))
                        .do_send(Inc);
                }
                tx.send(()).unwrap();
            });
            assert!(sent, "the arbiter is gone");
        }
        drop(tx);
        assert_eq!(rx.iter().count(), producers.len(), "a producer panicked");
        let actors: Vec<(u32, Addr<Counter>)> = registry.lock().unwrap().drain().collect();
        let counts: Vec<(u32, u64)> = run_on(&self.arbiters[0], move || async move {
            let replies = join_all(actors.iter().map(|(_, a)| a.send(Get))).await;
            actors
                .iter()
                .zip(replies)
                .map(|((key, _), reply)| (*key, reply.unwrap().0))
                .collect::<Vec<_>>()
        });
        for (key, count) in &counts {
            assert_eq!(*count, expected[*key as usize], "key {key}");
        }
        assert_eq!(counts.len(), expected.iter().filter(|&&c| c > 0).count());
        t0.elapsed()
    }

    /// Fan-out/fan-in: `actors` workers spread over both arbiters, one
    /// coordinator on arbiter 0 asks them all concurrently for `rounds`
    /// rounds (after one untimed warm-up round).
    pub fn fanout(&mut self, actors: usize, rounds: usize) -> Duration {
        let handles: Vec<ArbiterHandle> = self.arbiters.iter().map(Arbiter::handle).collect();
        let workers: Vec<Addr<Worker>> = (0..actors)
            .map(|i| {
                Worker::start_in_arbiter(&handles[i % handles.len()], move |_| Worker {
                    id: i as u64,
                })
            })
            .collect();
        run_on(&self.arbiters[0], move || async move {
            let n = workers.len() as u64;
            let base = n * n.saturating_sub(1) / 2;
            fan_round(&workers, 0).await;
            let t0 = Instant::now();
            for round in 1..=rounds as u64 {
                assert_eq!(fan_round(&workers, round).await, base + n * round);
            }
            t0.elapsed()
        })
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        // Stops every registered arbiter and ends `SystemRunner::run`.
        self.system.stop();
        for arbiter in self.arbiters.drain(..) {
            arbiter.stop();
            let _ = arbiter.join();
        }
        if let Some(thread) = self.system_thread.take() {
            let _ = thread.join();
        }
    }
}
