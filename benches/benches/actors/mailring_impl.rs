//! The workloads on mailring-actors: 2 shards, typed mailboxes (`handles`).

use std::time::{Duration, Instant};

use mailring_actors::{ActorSystem, Addr, Placement, Runtime, ShardId, SystemConfig};
use mailring_bench::counters::{Counter, Get, Inc, KeyCounter, PingSide, PongSide, Start};
use mailring_bench::{PRODUCER_BURST, SEND_WINDOW};
use tokio::sync::oneshot;

/// A 2-shard actor system kept for the whole bench function.
pub struct Bench {
    sys: ActorSystem,
    /// A second system whose credit window is [`SEND_WINDOW`], for the
    /// backpressured sends (made on first use; its shards park meanwhile).
    windowed: Option<ActorSystem>,
    generation: u64,
}

const S0: ShardId = ShardId::new(0);
const S1: ShardId = ShardId::new(1);

impl Bench {
    /// Starts the system, its shards pinned to CPUs 0 and 1 as the runtime
    /// guide recommends for a dedicated machine. Unpinned, a shard that was
    /// parked is often woken onto its waker's CPU, and the two shards share
    /// one CPU until the scheduler moves one: the paired fan-out runs (after
    /// a pause each) measured a median of 22.9 ms unpinned against 20.5 ms
    /// pinned, with criterion's back-to-back figures unchanged.
    pub fn new() -> Bench {
        Bench {
            sys: ActorSystem::start(Runtime::builder().shards(2).pin_threads(true)).unwrap(),
            windowed: None,
            generation: 0,
        }
    }

    /// Two actors on different shards bounce a message `rounds` times.
    pub fn pingpong(&mut self, rounds: u64) -> Duration {
        let ping = self
            .sys
            .spawn_actor(Placement::Pinned(S0), PingSide::default);
        let p = ping.clone();
        let pong = self
            .sys
            .spawn_actor(Placement::Pinned(S1), move || PongSide { peer: p.clone() });
        let (pong2, ping2) = (pong.clone(), ping.clone());
        let took = self.sys.block_on(async move {
            let (tx, rx) = oneshot::channel();
            let t0 = Instant::now();
            ping2
                .tell(Start {
                    peer: pong2,
                    rounds,
                    done: tx,
                })
                .unwrap();
            rx.await.unwrap();
            t0.elapsed()
        });
        ping.stop();
        pong.stop();
        took
    }

    fn tells(&mut self, producer: ShardId, msgs: u64) -> Duration {
        timed_stream(&self.sys, producer, msgs, move |c| async move {
            // On the actor's shard, the shard-pinned reference skips the lookup.
            match c.local() {
                Ok(local) if std::env::var_os("MAILRING_BENCH_ADDR").is_none() => {
                    for i in 0..msgs {
                        local.tell(Inc(1)).unwrap();
                        if i % PRODUCER_BURST == PRODUCER_BURST - 1 {
                            mailring_actors::mailring::yield_now().await;
                        }
                    }
                }
                _ => {
                    for i in 0..msgs {
                        c.tell(Inc(1)).unwrap();
                        if i % PRODUCER_BURST == PRODUCER_BURST - 1 {
                            mailring_actors::mailring::yield_now().await;
                        }
                    }
                }
            }
        })
    }

    /// `msgs` tells from a task on the actor's shard, then one ask.
    pub fn tell_same(&mut self, msgs: u64) -> Duration {
        self.tells(S1, msgs)
    }

    /// `msgs` tells from a task on the other shard, then one ask.
    pub fn tell_cross(&mut self, msgs: u64) -> Duration {
        self.tells(S0, msgs)
    }

    /// `msgs` `send().await`s from shard 0 to an actor on shard 1 within a
    /// credit window of [`SEND_WINDOW`] messages, then one ask.
    pub fn send_cross(&mut self, msgs: u64) -> Duration {
        let sys = self.windowed.get_or_insert_with(|| {
            let config = SystemConfig {
                cross_shard_window: SEND_WINDOW,
                ..SystemConfig::default()
            };
            ActorSystem::start_with(Runtime::builder().shards(2).pin_threads(true), config).unwrap()
        });
        timed_stream(sys, S0, msgs, move |c| async move {
            for _ in 0..msgs {
                c.send(Inc(1)).await.unwrap();
            }
        })
    }

    /// Sequential asks from shard 0 to an actor on shard 1.
    pub fn ask_cross(&mut self, asks: u64) -> Duration {
        let c = self
            .sys
            .spawn_actor(Placement::Pinned(S1), Counter::default);
        let c2 = c.clone();
        let took = self.sys.block_on(async move {
            let t0 = Instant::now();
            for _ in 0..asks {
                c2.ask(Get).await.unwrap();
            }
            t0.elapsed()
        });
        c.stop();
        took
    }

    /// One producer per shard tells keyed actors (activated lazily), then
    /// every key's count is checked.
    pub fn zipf(&mut self, producers: &[Vec<u32>], n_keys: u32) -> Duration {
        self.generation += 1;
        let base = self.generation << 32;
        let expected = mailring_bench::histogram(n_keys, producers);
        let h = self.sys.handle();
        let producers = producers.to_vec();
        let took = self.sys.block_on(async move {
            let t0 = Instant::now();
            let mut joins = Vec::new();
            for (i, keys) in producers.into_iter().enumerate() {
                let h = h.clone();
                joins.push(h.runtime().clone().spawn_on(ShardId::new(i), async move {
                    for k in keys {
                        h.keyed::<KeyCounter>(base | u64::from(k))
                            .tell(Inc(1))
                            .unwrap();
                    }
                }));
            }
            for j in joins {
                j.await.unwrap();
            }
            let replies: Vec<_> = (0..n_keys)
                .filter(|k| expected[*k as usize] > 0)
                .map(|k| (k, h.keyed::<KeyCounter>(base | u64::from(k)).ask(Get)))
                .collect();
            for (k, r) in replies {
                assert_eq!(r.await.unwrap(), expected[k as usize]);
            }
            let took = t0.elapsed();
            for k in 0..n_keys {
                h.keyed::<KeyCounter>(base | u64::from(k)).stop();
            }
            took
        });
        took
    }

    /// A coordinator on shard 0 asks `actors` actors on both shards, `rounds` times.
    pub fn fanout(&mut self, actors: usize, rounds: usize) -> Duration {
        let addrs: Vec<Addr<Counter>> = (0..actors)
            .map(|i| {
                self.sys
                    .spawn_actor(Placement::Pinned(ShardId::new(i % 2)), Counter::default)
            })
            .collect();
        let a2 = addrs.clone();
        let took = self.sys.block_on(async move {
            let t0 = Instant::now();
            for _ in 0..rounds {
                let replies: Vec<_> = a2.iter().map(|a| a.ask(Get)).collect();
                let mut sum = 0;
                for r in replies {
                    sum += r.await.unwrap();
                }
                assert_eq!(sum, 0);
            }
            t0.elapsed()
        });
        for a in addrs {
            a.stop();
        }
        took
    }
}

/// Runs `produce` on shard `producer` against a fresh counter on shard 1 of
/// `sys`, then asks the counter whether all `msgs` arrived; the time of both.
fn timed_stream<F, Fut>(sys: &ActorSystem, producer: ShardId, msgs: u64, produce: F) -> Duration
where
    F: FnOnce(Addr<Counter>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let c = sys.spawn_actor(Placement::Pinned(S1), Counter::default);
    let c2 = c.clone();
    let rt = sys.runtime().clone();
    let took = sys.block_on(async move {
        rt.spawn_local_on(producer, move || async move {
            let t0 = Instant::now();
            produce(c2.clone()).await;
            assert_eq!(c2.ask(Get).await.unwrap(), msgs);
            t0.elapsed()
        })
        .await
        .unwrap()
    });
    c.stop();
    took
}
