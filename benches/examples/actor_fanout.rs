//! A fixed actor fan-out workload for instruction counting:
//! `valgrind --tool=callgrind target/release/examples/actor_fanout 20`
//! (`actor_fanout 2000 default` runs with the default idle policy;
//! `FANOUT_SHARD=0` or `=1` puts every actor on that shard, to count a local
//! or a remote ask alone; with `default`, `MAILRING_SPIN_US` sets the spin
//! budget; `FANOUT_REPEAT=n,ms` times n runs, each after a pause of ms,
//! and `FANOUT_FRESH=1` spawns new actors for each run, as the bench does).
//! Shards spin instead of parking (valgrind stalls on a blocking
//! `io_uring_enter`).

use std::time::Duration;

use mailring::IdlePolicy;
use mailring_actors::{Actor, ActorSystem, Ctx, Handler, Message, Placement, Runtime, ShardId};

#[derive(Actor, Default)]
#[actor(handles(Get))]
struct Worker;

#[derive(Message)]
#[message(reply = u64)]
struct Get;

impl Handler<Get> for Worker {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        1
    }
}

fn main() {
    let rounds: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20);
    // Second argument `default`: the runtime's own idle policy (what the
    // criterion bench runs with) instead of spinning.
    let spin = std::env::args().nth(2).as_deref() != Some("default");
    let mut builder = Runtime::builder().shards(2);
    if spin {
        builder = builder.idle_policy(IdlePolicy::Spin(Duration::from_secs(3600)));
    } else if let Some(us) = std::env::var("MAILRING_SPIN_US")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        // `default` with MAILRING_SPIN_US: that spin budget instead.
        builder = builder.idle_policy(IdlePolicy::Spin(Duration::from_micros(us)));
    }
    let sys = ActorSystem::start(builder).expect("io_uring available");
    let workers: Vec<_> = (0..1000)
        .map(|i| {
            let shard = match std::env::var("FANOUT_SHARD")
                .ok()
                .and_then(|s| s.parse().ok())
            {
                Some(s) => s,
                None => i % 2,
            };
            sys.spawn_actor(Placement::Pinned(ShardId::new(shard)), Worker::default)
        })
        .collect();
    // FANOUT_REPEAT=n,ms: n timed runs, each after a pause of ms (as the
    // bench's paired runs do), printing each run's time.
    let (repeat, pause_ms) = std::env::var("FANOUT_REPEAT")
        .ok()
        .and_then(|v| {
            let (n, ms) = v.split_once(',')?;
            Some((n.parse().ok()?, ms.parse().ok()?))
        })
        .unwrap_or((1u32, 0u64));
    let fresh = std::env::var("FANOUT_FRESH").is_ok();
    for _ in 0..repeat {
        std::thread::sleep(Duration::from_millis(pause_ms));
        let w = if fresh {
            (0..1000)
                .map(|i| sys.spawn_actor(Placement::Pinned(ShardId::new(i % 2)), Worker::default))
                .collect()
        } else {
            workers.clone()
        };
        let stop = w.clone();
        let t0 = std::time::Instant::now();
        let sum = sys.block_on(async move {
            let mut sum = 0;
            for _ in 0..rounds {
                let replies: Vec<_> = w.iter().map(|w| w.ask(Get)).collect();
                for r in replies {
                    sum += r.await.unwrap();
                }
            }
            sum
        });
        assert_eq!(sum, rounds * 1000);
        if repeat > 1 {
            println!("{:?}", t0.elapsed());
        }
        if fresh {
            stop.iter().for_each(|w| w.stop());
        }
    }
    sys.shutdown();
}
