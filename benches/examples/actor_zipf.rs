//! The keyed Zipf workload for instruction counting:
//! `valgrind --tool=callgrind target/release/examples/actor_zipf 1`.
//! Shards spin instead of parking (valgrind stalls on a blocking
//! `io_uring_enter`).

use std::time::Duration;

use mailring::IdlePolicy;
use mailring_actors::{ActorSystem, Runtime, ShardId};
use mailring_bench::counters::{Get, Inc, KeyCounter};
use mailring_bench::{histogram, zipf_keys, ZIPF_KEYS, ZIPF_S, ZIPF_TELLS};

fn main() {
    let rounds: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1);
    let producers: Vec<Vec<u32>> = (0..2)
        .map(|p| zipf_keys(ZIPF_KEYS, ZIPF_TELLS / 2, ZIPF_S, 42 + p))
        .collect();
    let expected = histogram(ZIPF_KEYS, &producers);
    let builder = Runtime::builder()
        .shards(2)
        .idle_policy(IdlePolicy::Spin(Duration::from_secs(3600)));
    let sys = ActorSystem::start(builder).expect("io_uring available");
    for round in 0..rounds {
        let h = sys.handle();
        let producers = producers.clone();
        let expected = expected.clone();
        let base = round << 32;
        sys.block_on(async move {
            let mut joins = Vec::new();
            for (i, keys) in producers.into_iter().enumerate() {
                let h = h.clone();
                joins.push(h.runtime().clone().spawn_on(ShardId::new(i), async move {
                    for k in keys {
                        h.keyed::<KeyCounter>(base | u64::from(k))
                            .tell(Inc(1))
                            .expect("running");
                    }
                }));
            }
            for j in joins {
                j.await.expect("producer");
            }
            for k in 0..ZIPF_KEYS {
                if expected[k as usize] > 0 {
                    let n = h.keyed::<KeyCounter>(base | u64::from(k)).ask(Get).await;
                    assert_eq!(n.expect("running"), expected[k as usize]);
                }
            }
            // As the criterion bench does: the round's actors stop.
            for k in 0..ZIPF_KEYS {
                h.keyed::<KeyCounter>(base | u64::from(k)).stop();
            }
            mailring::time::sleep(Duration::from_millis(20)).await;
        });
    }
    sys.shutdown();
}
