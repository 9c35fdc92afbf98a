//! Cross-shard actor ping-pong, for profiling the round trip next to the
//! runtime's own (`pingpong`): two actors on shards 0 and 1 tell each other
//! `n` times (`actor_pingpong [n] [ask]`; `ask` makes a task on shard 0 ask
//! a counter on shard 1 instead, one ask at a time).
//! `MAILRING_SPIN_US` sets the idle spin as in `pingpong`.

use std::time::{Duration, Instant};

use mailring::IdlePolicy;
use mailring_actors::{ActorSystem, Placement, Runtime, ShardId};
use mailring_bench::counters::{Counter, Get, Inc, PingSide, PongSide, Start};

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200_000);
    let ask = std::env::args().nth(2).as_deref() == Some("ask");
    let mut builder = Runtime::builder().shards(2);
    if let Some(us) = std::env::var("MAILRING_SPIN_US")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        builder = builder.idle_policy(IdlePolicy::Spin(Duration::from_micros(us)));
    }
    let sys = ActorSystem::start(builder).expect("io_uring available");
    let ping = sys.spawn_actor(Placement::Pinned(ShardId::new(0)), PingSide::default);
    let p = ping.clone();
    let pong = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), move || PongSide {
        peer: p.clone(),
    });
    let counter = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Counter::default);
    let took = sys.block_on(async move {
        let t0 = Instant::now();
        if ask {
            counter.tell(Inc(1)).expect("the counter runs");
            for _ in 0..n {
                assert_eq!(counter.ask(Get).await, Ok(1));
            }
        } else {
            let (tx, rx) = tokio::sync::oneshot::channel();
            ping.tell(Start {
                peer: pong,
                rounds: n,
                done: tx,
            })
            .expect("the ping side runs");
            rx.await.expect("the last pong arrives");
        }
        t0.elapsed()
    });
    let what = if ask { "asks" } else { "round trips" };
    println!("{n} {what}: {:?} each", took / n as u32);
    sys.shutdown();
}
