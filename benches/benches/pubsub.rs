//! Publish/subscribe: `PUBLISHES` messages published to `SUBSCRIBERS`
//! subscribers spread over the threads, timed until the last subscriber has
//! handled the last message.
//!
//! - mailring: a `Topic<Quote>` on 2 shards, the subscribers unkeyed actors
//!   placed round robin, the publisher a task on shard 0 (one hand-over per
//!   shard and publish, then local tells).
//! - Tokio: a `broadcast` channel with room for every message (so no
//!   receiver lags or loses any), one task per subscriber on a 2-worker
//!   multi-thread runtime, the publisher a task.
//!
//! Run: `cargo bench -p mailring-bench --bench pubsub`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use mailring_actors::{
    Actor, ActorSystem, Ctx, Handler, Message, Placement, Runtime, ShardId, Topic,
};

const SUBSCRIBERS: usize = 10_000;
const PUBLISHES: u64 = 100;
const THREADS: usize = 2;

/// Counts subscribers done with a round; the last one signals.
struct Done {
    left: AtomicUsize,
    signal: Mutex<mpsc::Sender<()>>,
}

impl Done {
    fn new() -> (Arc<Done>, mpsc::Receiver<()>) {
        let (tx, rx) = mpsc::channel();
        let done = Arc::new(Done {
            left: AtomicUsize::new(SUBSCRIBERS),
            signal: Mutex::new(tx),
        });
        (done, rx)
    }

    fn one_finished(&self) {
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.left.store(SUBSCRIBERS, Ordering::Release);
            let _ = self.signal.lock().unwrap().send(());
        }
    }
}

#[derive(Message, Clone, Debug)]
struct Quote(#[allow(dead_code)] u64);

#[derive(Actor)]
#[actor(handles(Quote))]
struct Subscriber {
    seen: u64,
    done: Arc<Done>,
}

impl Handler<Quote> for Subscriber {
    async fn handle(&mut self, _q: Quote, _cx: &mut Ctx<Self>) {
        self.seen += 1;
        if self.seen % PUBLISHES == 0 {
            self.done.one_finished();
        }
    }
}

struct MailringPubSub {
    system: ActorSystem,
    topic: Topic<Quote>,
    finished: mpsc::Receiver<()>,
}

impl MailringPubSub {
    fn new() -> Self {
        let system =
            ActorSystem::start(Runtime::builder().shards(THREADS)).expect("io_uring available");
        let (done, finished) = Done::new();
        let topic = system.handle().topic();
        for _ in 0..SUBSCRIBERS {
            let done = done.clone();
            let a = system.spawn_actor(Placement::RoundRobin, move || Subscriber {
                seen: 0,
                done: done.clone(),
            });
            topic.subscribe(a);
        }
        MailringPubSub {
            system,
            topic,
            finished,
        }
    }

    fn round(&self) -> Duration {
        let start = Instant::now();
        let topic = self.topic.clone();
        self.system
            .runtime()
            .spawn_on(ShardId::new(0), async move {
                for i in 0..PUBLISHES {
                    topic.publish(Quote(i));
                }
            })
            .detach();
        self.finished.recv().expect("subscribers finish");
        start.elapsed()
    }
}

struct TokioBroadcast {
    rt: tokio::runtime::Runtime,
    tx: tokio::sync::broadcast::Sender<Quote>,
    finished: mpsc::Receiver<()>,
}

impl TokioBroadcast {
    fn new() -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(THREADS)
            .build()
            .expect("tokio runtime");
        let (tx, _) = tokio::sync::broadcast::channel(PUBLISHES as usize);
        let (done, finished) = Done::new();
        for _ in 0..SUBSCRIBERS {
            let mut rx = tx.subscribe();
            let done = done.clone();
            rt.spawn(async move {
                let mut seen = 0u64;
                loop {
                    match rx.recv().await {
                        Ok(_) => {
                            seen += 1;
                            if seen % PUBLISHES == 0 {
                                done.one_finished();
                            }
                        }
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                        Err(e) => panic!("a subscriber lost messages: {e}"),
                    }
                }
            });
        }
        TokioBroadcast { rt, tx, finished }
    }

    fn round(&self) -> Duration {
        let start = Instant::now();
        let tx = self.tx.clone();
        self.rt.spawn(async move {
            for i in 0..PUBLISHES {
                tx.send(Quote(i)).expect("subscribers present");
            }
        });
        self.finished.recv().expect("subscribers finish");
        start.elapsed()
    }
}

fn pubsub(c: &mut Criterion) {
    let mut g = c.benchmark_group("pubsub");
    g.throughput(Throughput::Elements(SUBSCRIBERS as u64 * PUBLISHES));
    g.sample_size(20);
    g.measurement_time(Duration::from_secs(10));
    {
        let m = MailringPubSub::new();
        g.bench_function("mailring_topic", |b| {
            b.iter_custom(|iters| (0..iters).map(|_| m.round()).sum())
        });
        m.system.shutdown();
    }
    {
        let t = TokioBroadcast::new();
        g.bench_function("tokio_broadcast", |b| {
            b.iter_custom(|iters| (0..iters).map(|_| t.round()).sum())
        });
        drop(t.tx);
        t.rt.shutdown_timeout(Duration::from_secs(5));
    }
    g.finish();
}

criterion_group!(benches, pubsub);
criterion_main!(benches);
