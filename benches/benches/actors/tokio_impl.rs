//! The baseline: plain Tokio tasks with mpsc mailboxes and oneshot replies.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mailring_bench::{PRODUCER_BURST, SEND_WINDOW};
use tokio::sync::{mpsc, oneshot};

enum Msg {
    Inc(u64),
    Get(oneshot::Sender<u64>),
}

/// An "actor": a task owning a count, fed by an unbounded channel.
fn spawn_counter(rt: &tokio::runtime::Handle) -> mpsc::UnboundedSender<Msg> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    rt.spawn(async move {
        let mut n = 0u64;
        while let Some(m) = rx.recv().await {
            handle(&mut n, m);
        }
    });
    tx
}

/// The counter's handler.
fn handle(n: &mut u64, m: Msg) {
    match m {
        Msg::Inc(d) => *n += d,
        Msg::Get(r) => {
            let _ = r.send(*n);
        }
    }
}

async fn get(tx: &mpsc::UnboundedSender<Msg>) -> u64 {
    let (r, rx) = oneshot::channel();
    tx.send(Msg::Get(r)).unwrap();
    rx.await.unwrap()
}

/// A 2-worker multi-thread runtime and a current-thread one.
pub struct Bench {
    multi: tokio::runtime::Runtime,
    single: tokio::runtime::Runtime,
}

impl Bench {
    /// Builds the runtimes.
    pub fn new() -> Bench {
        Bench {
            multi: tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap(),
            single: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
        }
    }

    /// Two tasks bounce a message through two channels.
    pub fn pingpong(&mut self, rounds: u64) -> Duration {
        let (to_b, mut b_rx) = mpsc::unbounded_channel::<u64>();
        let (to_a, mut a_rx) = mpsc::unbounded_channel::<u64>();
        self.multi.spawn(async move {
            while let Some(n) = b_rx.recv().await {
                if to_a.send(n).is_err() {
                    return;
                }
            }
        });
        self.multi.block_on(async move {
            self::spawn_and_wait(async move {
                let t0 = Instant::now();
                to_b.send(0).unwrap();
                while let Some(n) = a_rx.recv().await {
                    if n + 1 == rounds {
                        break;
                    }
                    to_b.send(n + 1).unwrap();
                }
                t0.elapsed()
            })
            .await
        })
    }

    /// Producer and actor on one current-thread runtime.
    pub fn tell_same(&mut self, msgs: u64) -> Duration {
        self.single.block_on(async move {
            let tx = spawn_counter(&tokio::runtime::Handle::current());
            let t0 = Instant::now();
            for i in 0..msgs {
                tx.send(Msg::Inc(1)).unwrap();
                if i % PRODUCER_BURST == PRODUCER_BURST - 1 {
                    tokio::task::yield_now().await;
                }
            }
            assert_eq!(get(&tx).await, msgs);
            t0.elapsed()
        })
    }

    /// Producer and actor tasks on the multi-thread runtime.
    pub fn tell_cross(&mut self, msgs: u64) -> Duration {
        let tx = spawn_counter(self.multi.handle());
        self.multi.block_on(spawn_and_wait(async move {
            let t0 = Instant::now();
            for i in 0..msgs {
                tx.send(Msg::Inc(1)).unwrap();
                if i % PRODUCER_BURST == PRODUCER_BURST - 1 {
                    tokio::task::yield_now().await;
                }
            }
            assert_eq!(get(&tx).await, msgs);
            t0.elapsed()
        }))
    }

    /// `msgs` sends into a channel of [`SEND_WINDOW`] places, each waiting
    /// for room, from a task to an actor task on the multi-thread runtime.
    pub fn send_cross(&mut self, msgs: u64) -> Duration {
        let (tx, mut rx) = mpsc::channel::<Msg>(SEND_WINDOW as usize);
        self.multi.spawn(async move {
            let mut n = 0u64;
            while let Some(m) = rx.recv().await {
                handle(&mut n, m);
            }
        });
        self.multi.block_on(spawn_and_wait(async move {
            let t0 = Instant::now();
            for _ in 0..msgs {
                tx.send(Msg::Inc(1)).await.unwrap();
            }
            let (r, reply) = oneshot::channel();
            tx.send(Msg::Get(r)).await.unwrap();
            assert_eq!(reply.await.unwrap(), msgs);
            t0.elapsed()
        }))
    }

    /// Sequential asks.
    pub fn ask_cross(&mut self, asks: u64) -> Duration {
        let tx = spawn_counter(self.multi.handle());
        self.multi.block_on(spawn_and_wait(async move {
            let t0 = Instant::now();
            for _ in 0..asks {
                get(&tx).await;
            }
            t0.elapsed()
        }))
    }

    /// Two producers, actors spawned on first use.
    pub fn zipf(&mut self, producers: &[Vec<u32>], n_keys: u32) -> Duration {
        let expected = mailring_bench::histogram(n_keys, producers);
        let producers = producers.to_vec();
        let rt = self.multi.handle().clone();
        self.multi.block_on(spawn_and_wait(async move {
            let map: Arc<Mutex<HashMap<u32, mpsc::UnboundedSender<Msg>>>> = Arc::default();
            let t0 = Instant::now();
            let mut joins = Vec::new();
            for keys in producers {
                let map = map.clone();
                let rt = rt.clone();
                joins.push(tokio::spawn(async move {
                    let mut cache: HashMap<u32, mpsc::UnboundedSender<Msg>> = HashMap::new();
                    for k in keys {
                        let tx = cache.entry(k).or_insert_with(|| {
                            map.lock()
                                .unwrap()
                                .entry(k)
                                .or_insert_with(|| spawn_counter(&rt))
                                .clone()
                        });
                        tx.send(Msg::Inc(1)).unwrap();
                    }
                }));
            }
            for j in joins {
                j.await.unwrap();
            }
            let actors: Vec<_> = map.lock().unwrap().drain().collect();
            let mut replies = Vec::new();
            for (k, tx) in &actors {
                let (r, rx) = oneshot::channel();
                tx.send(Msg::Get(r)).unwrap();
                replies.push((*k, rx));
            }
            for (k, rx) in replies {
                assert_eq!(rx.await.unwrap(), expected[k as usize]);
            }
            t0.elapsed()
        }))
    }

    /// A coordinator task asks every actor task, `rounds` times.
    pub fn fanout(&mut self, actors: usize, rounds: usize) -> Duration {
        let txs: Vec<_> = (0..actors)
            .map(|_| spawn_counter(self.multi.handle()))
            .collect();
        self.multi.block_on(spawn_and_wait(async move {
            let t0 = Instant::now();
            for _ in 0..rounds {
                let mut replies = Vec::with_capacity(txs.len());
                for tx in &txs {
                    let (r, rx) = oneshot::channel();
                    tx.send(Msg::Get(r)).unwrap();
                    replies.push(rx);
                }
                let mut sum = 0;
                for rx in replies {
                    sum += rx.await.unwrap();
                }
                assert_eq!(sum, 0);
            }
            t0.elapsed()
        }))
    }
}

/// Runs `f` as a worker task (not on the blocking caller's thread).
async fn spawn_and_wait<F>(f: F) -> F::Output
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(f).await.unwrap()
}
