//! The workloads on mailring-actors: 2 shards, typed mailboxes (`handles`).

use std::time::{Duration, Instant};

use mailring_actors::{ActorSystem, Addr, Placement, Runtime, ShardId};
use mailring_bench::counters::{Counter, Get, Inc, KeyCounter, PingSide, PongSide, Start};
use mailring_bench::PRODUCER_BURST;
use tokio::sync::oneshot;

/// A 2-shard actor system kept for the whole bench function.
pub struct Bench {
    sys: ActorSystem,
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
        let c = self
            .sys
            .spawn_actor(Placement::Pinned(S1), Counter::default);
        let c2 = c.clone();
        let rt = self.sys.runtime().clone();
        let took = self.sys.block_on(async move {
            rt.spawn_local_on(producer, move || async move {
                let t0 = Instant::now();
                // On the actor's shard, the shard-pinned reference skips the lookup.
                match c2.local() {
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
                            c2.tell(Inc(1)).unwrap();
                            if i % PRODUCER_BURST == PRODUCER_BURST - 1 {
                                mailring_actors::mailring::yield_now().await;
                            }
                        }
                    }
                }
                assert_eq!(c2.ask(Get).await.unwrap(), msgs);
                t0.elapsed()
            })
            .await
            .unwrap()
        });
        c.stop();
        took
    }

    /// `msgs` tells from a task on the actor's shard, then one ask.
    pub fn tell_same(&mut self, msgs: u64) -> Duration {
        self.tells(S1, msgs)
    }

    /// `msgs` tells from a task on the other shard, then one ask.
    pub fn tell_cross(&mut self, msgs: u64) -> Duration {
        self.tells(S0, msgs)
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
