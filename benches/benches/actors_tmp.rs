//! Actor benchmarks: mailring-actors (2 shards) against a plain Tokio task +
//! mpsc/oneshot baseline, kameo, ractor and actix, all in one run.
//!
//! Run: `cargo bench -p mailring-bench --bench actors` (filter by name as
//! usual, e.g. `-- tell_same`).
//!
//! Every criterion iteration is one whole batch (see the constants in the
//! bench lib): ping-pong and asks 100k round trips, tells 2M messages plus
//! one confirming ask, Zipf 1M tells from one producer per thread over 10k
//! lazily activated keys plus a count check, fan-out 200 rounds of 1k asks.
//! CPU time (whole process, user+sys) is printed per bench next to wall time.

#[path = "actors/mailring_impl.rs"]
mod mailring_impl;
#[path = "actors/tokio_impl.rs"]
mod tokio_impl;

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use mailring_bench::{
    Meter, ACTOR_RTT_ROUNDS, ACTOR_TELLS, FANOUT_ACTORS, FANOUT_ROUNDS, ZIPF_KEYS, ZIPF_S,
    ZIPF_TELLS,
};

/// The workloads every contender implements.
trait Contender {
    fn pingpong(&mut self, rounds: u64) -> Duration;
    fn tell_same(&mut self, msgs: u64) -> Duration;
    fn tell_cross(&mut self, msgs: u64) -> Duration;
    fn ask_cross(&mut self, asks: u64) -> Duration;
    fn zipf(&mut self, producers: &[Vec<u32>], n_keys: u32) -> Duration;
    fn fanout(&mut self, actors: usize, rounds: usize) -> Duration;
}

macro_rules! contender {
    ($t:ty) => {
        impl Contender for $t {
            fn pingpong(&mut self, rounds: u64) -> Duration {
                <$t>::pingpong(self, rounds)
            }
            fn tell_same(&mut self, msgs: u64) -> Duration {
                <$t>::tell_same(self, msgs)
            }
            fn tell_cross(&mut self, msgs: u64) -> Duration {
                <$t>::tell_cross(self, msgs)
            }
            fn ask_cross(&mut self, asks: u64) -> Duration {
                <$t>::ask_cross(self, asks)
            }
            fn zipf(&mut self, producers: &[Vec<u32>], n_keys: u32) -> Duration {
                <$t>::zipf(self, producers, n_keys)
            }
            fn fanout(&mut self, actors: usize, rounds: usize) -> Duration {
                <$t>::fanout(self, actors, rounds)
            }
        }
    };
}

contender!(mailring_impl::Bench);
contender!(tokio_impl::Bench);

type Make = fn() -> Box<dyn Contender>;

fn contenders() -> Vec<(&'static str, Make)> {
    let all: Vec<(&'static str, Make)> = vec![
        ("mailring", || Box::new(mailring_impl::Bench::new())),
        ("tokio", || Box::new(tokio_impl::Bench::new())),
    ];
    // MAILRING_BENCH_ONLY=mailring,tokio restricts the contenders.
    match std::env::var("MAILRING_BENCH_ONLY") {
        Ok(only) => all
            .into_iter()
            .filter(|(n, _)| only.split(',').any(|o| o == *n))
            .collect(),
        Err(_) => all,
    }
}

fn workload(
    c: &mut Criterion,
    group: &str,
    elements: u64,
    mut run: impl FnMut(&mut dyn Contender) -> Duration,
) {
    let mut g = c.benchmark_group(group);
    g.sample_size(10);
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(3));
    g.throughput(Throughput::Elements(elements));
    for (name, make) in contenders() {
        let mut contender = make();
        let mut meter = Meter::default();
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| meter.record(elements, || run(contender.as_mut())))
                    .sum()
            })
        });
        meter.report(&format!("{group}/{name}"));
        drop(contender);
    }
    g.finish();
}

fn benches(c: &mut Criterion) {
    workload(c, "actor_pingpong_rtt", ACTOR_RTT_ROUNDS, |x| {
        x.pingpong(ACTOR_RTT_ROUNDS)
    });
    workload(c, "actor_tell_same", ACTOR_TELLS, |x| {
        x.tell_same(ACTOR_TELLS)
    });
    workload(c, "actor_tell_cross", ACTOR_TELLS, |x| {
        x.tell_cross(ACTOR_TELLS)
    });
    workload(c, "actor_ask_cross", ACTOR_RTT_ROUNDS, |x| {
        x.ask_cross(ACTOR_RTT_ROUNDS)
    });
    let producers: Vec<Vec<u32>> = (0..2)
        .map(|p| mailring_bench::zipf_keys(ZIPF_KEYS, ZIPF_TELLS / 2, ZIPF_S, 42 + p))
        .collect();
    workload(c, "actor_zipf_keyed", ZIPF_TELLS, |x| {
        x.zipf(&producers, ZIPF_KEYS)
    });
    let asks = (FANOUT_ACTORS * FANOUT_ROUNDS) as u64;
    workload(c, "actor_fanout", asks, |x| {
        x.fanout(FANOUT_ACTORS, FANOUT_ROUNDS)
    });
}

criterion_group!(actors, benches);
criterion_main!(actors);
