//! Actor benchmarks: mailring-actors (2 shards) against a plain Tokio task +
//! mpsc/oneshot baseline, kameo, ractor and actix, all in one run.
//!
//! Run: `cargo bench -p mailring-bench --bench actors` (filter by name as
//! usual, e.g. `-- tell_same`).
//!
//! Every criterion iteration is one whole batch (see the constants in the
//! bench lib): ping-pong and asks 100k round trips, tells 2M messages plus
//! one confirming ask, Zipf 1M tells from one producer per thread over 10k
//! lazily activated keys plus a count check, fan-out 200 rounds of 1k asks,
//! and (mailring and Tokio only) 2M backpressured sends to another thread:
//! mailring's `send().await` within a 1024-message cross-shard credit window
//! against a Tokio bounded channel of 1024 places.
//! CPU time (whole process, user+sys) is printed per bench next to wall time.
//! After the criterion groups, `[paired]` lines give mailring's ratio to the
//! Tokio baseline from alternating iterations (see [`paired`]).

mod actix_impl;
mod kameo_impl;
mod mailring_impl;
mod ractor_impl;
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
    /// Backpressured cross-thread sends (`None`: not measured for this
    /// contender).
    fn send_cross(&mut self, _msgs: u64) -> Option<Duration> {
        None
    }
}

macro_rules! contender {
    ($t:ty, send_cross) => {
        contender!($t, {
            fn send_cross(&mut self, msgs: u64) -> Option<Duration> {
                Some(<$t>::send_cross(self, msgs))
            }
        });
    };
    ($t:ty) => {
        contender!($t, {});
    };
    ($t:ty, { $($extra:tt)* }) => {
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
            $($extra)*
        }
    };
}

contender!(mailring_impl::Bench, send_cross);
contender!(tokio_impl::Bench, send_cross);
contender!(kameo_impl::Bench);
contender!(ractor_impl::Bench);
contender!(actix_impl::Bench);

type Make = fn() -> Box<dyn Contender>;

fn contenders() -> Vec<(&'static str, Make)> {
    let all: Vec<(&'static str, Make)> = vec![
        ("mailring", || Box::new(mailring_impl::Bench::new())),
        ("tokio", || Box::new(tokio_impl::Bench::new())),
        ("kameo", || Box::new(kameo_impl::Bench::new())),
        ("ractor", || Box::new(ractor_impl::Bench::new())),
        ("actix", || Box::new(actix_impl::Bench::new())),
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
    has: impl Fn(&str) -> bool,
    mut run: impl FnMut(&mut dyn Contender) -> Option<Duration>,
) {
    let mut g = c.benchmark_group(group);
    g.sample_size(10);
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(3));
    g.throughput(Throughput::Elements(elements));
    for (name, make) in contenders() {
        if !has(name) {
            continue;
        }
        let mut contender = make();
        let mut meter = Meter::default();
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| {
                        meter.record(elements, || {
                            run(contender.as_mut()).expect("the contender has the workload")
                        })
                    })
                    .sum()
            })
        });
        meter.report(&format!("{group}/{name}"));
        drop(contender);
    }
    g.finish();
}

/// The workloads by name, as closures over a contender (for [`paired`]).
type Workload<'a> = (
    &'static str,
    Box<dyn Fn(&mut dyn Contender) -> Duration + 'a>,
);

/// mailring against the Tokio baseline in alternating iterations, after the
/// criterion groups: both then see the same phase of a machine whose speed
/// for cross-core traffic changes from minute to minute (this VM's does, by
/// up to 3x), and the median of the per-pair ratios is robust to it. Prints
/// `[paired]` lines; `MAILRING_BENCH_PAIRS` sets the pairs per workload
/// (default 15, 0 skips), and the usual name filter applies.
fn paired(_c: &mut Criterion) {
    let pairs: usize = std::env::var("MAILRING_BENCH_PAIRS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(15);
    let names: Vec<&str> = contenders().iter().map(|(n, _)| *n).collect();
    if pairs == 0 || !names.contains(&"mailring") || !names.contains(&"tokio") {
        return;
    }
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let producers: Vec<Vec<u32>> = (0..2)
        .map(|p| mailring_bench::zipf_keys(ZIPF_KEYS, ZIPF_TELLS / 2, ZIPF_S, 42 + p))
        .collect();
    let workloads: Vec<Workload<'_>> = vec![
        (
            "actor_pingpong_rtt",
            Box::new(|x| x.pingpong(ACTOR_RTT_ROUNDS)),
        ),
        ("actor_tell_same", Box::new(|x| x.tell_same(ACTOR_TELLS))),
        ("actor_tell_cross", Box::new(|x| x.tell_cross(ACTOR_TELLS))),
        (
            "actor_ask_cross",
            Box::new(|x| x.ask_cross(ACTOR_RTT_ROUNDS)),
        ),
        (
            "actor_zipf_keyed",
            Box::new(|x| x.zipf(&producers, ZIPF_KEYS)),
        ),
        (
            "actor_fanout",
            Box::new(|x| x.fanout(FANOUT_ACTORS, FANOUT_ROUNDS)),
        ),
        (
            "actor_send_cross",
            Box::new(|x| {
                x.send_cross(ACTOR_TELLS)
                    .expect("mailring and tokio have it")
            }),
        ),
    ];
    let mut mailring = mailring_impl::Bench::new();
    let mut tokio = tokio_impl::Bench::new();
    for (name, run) in workloads {
        // Criterion's filter is a regex; alternatives (`a|b`) and plain
        // substrings cover how it is used here.
        let wanted = filters.is_empty()
            || filters
                .iter()
                .flat_map(|f| f.split('|'))
                .any(|f| name.contains(f));
        if !wanted {
            continue;
        }
        // One untimed round each (activation, allocator warm-up).
        run(&mut mailring);
        run(&mut tokio);
        std::thread::sleep(Duration::from_millis(20));
        // Each run leaves work behind (actors stopping, tasks ending): a
        // pause lets it finish before the other contender's timed run.
        let settle = || std::thread::sleep(Duration::from_millis(20));
        let mut times = (Vec::new(), Vec::new());
        let mut ratios: Vec<f64> = (0..pairs)
            .map(|_| {
                let m = run(&mut mailring).as_secs_f64();
                settle();
                let t = run(&mut tokio).as_secs_f64();
                settle();
                times.0.push(m);
                times.1.push(t);
                t / m
            })
            .collect();
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2] * 1e3
        };
        ratios.sort_by(f64::total_cmp);
        let at = |q: f64| ratios[((ratios.len() - 1) as f64 * q).round() as usize];
        println!(
            "[paired] {name}: tokio time / mailring time, median {:.2} (quartiles {:.2}-{:.2}, range {:.2}-{:.2}) over {pairs} alternating pairs; median run {:.2} ms mailring, {:.2} ms tokio",
            at(0.5),
            at(0.25),
            at(0.75),
            ratios[0],
            ratios[ratios.len() - 1],
            median(&mut times.0),
            median(&mut times.1),
        );
    }
}

fn benches(c: &mut Criterion) {
    workload(
        c,
        "actor_pingpong_rtt",
        ACTOR_RTT_ROUNDS,
        |_| true,
        |x| Some(x.pingpong(ACTOR_RTT_ROUNDS)),
    );
    workload(
        c,
        "actor_tell_same",
        ACTOR_TELLS,
        |_| true,
        |x| Some(x.tell_same(ACTOR_TELLS)),
    );
    workload(
        c,
        "actor_tell_cross",
        ACTOR_TELLS,
        |_| true,
        |x| Some(x.tell_cross(ACTOR_TELLS)),
    );
    workload(
        c,
        "actor_ask_cross",
        ACTOR_RTT_ROUNDS,
        |_| true,
        |x| Some(x.ask_cross(ACTOR_RTT_ROUNDS)),
    );
    let producers: Vec<Vec<u32>> = (0..2)
        .map(|p| mailring_bench::zipf_keys(ZIPF_KEYS, ZIPF_TELLS / 2, ZIPF_S, 42 + p))
        .collect();
    workload(
        c,
        "actor_zipf_keyed",
        ZIPF_TELLS,
        |_| true,
        |x| Some(x.zipf(&producers, ZIPF_KEYS)),
    );
    let asks = (FANOUT_ACTORS * FANOUT_ROUNDS) as u64;
    workload(
        c,
        "actor_fanout",
        asks,
        |_| true,
        |x| Some(x.fanout(FANOUT_ACTORS, FANOUT_ROUNDS)),
    );
    let has_send_cross = |name: &str| matches!(name, "mailring" | "tokio");
    workload(c, "actor_send_cross", ACTOR_TELLS, has_send_cross, |x| {
        x.send_cross(ACTOR_TELLS)
    });
}

criterion_group!(actors, benches, paired);
criterion_main!(actors);
