//! Tells for instruction counting, from the actor's shard
//! (`valgrind --tool=callgrind target/release/examples/actor_tell 2000000`) or
//! from the other shard (`... actor_tell 2000000 cross`).
//! The shard spins instead of parking (valgrind stalls on a blocking
//! `io_uring_enter`).

use std::time::Duration;

use mailring::IdlePolicy;
use mailring_actors::{ActorSystem, Placement, Runtime, ShardId};
use mailring_bench::counters::{Counter, Get, Inc};

fn main() {
    let msgs: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2_000_000);
    let cross = std::env::args().nth(2).as_deref() == Some("cross");
    let builder = Runtime::builder()
        .shards(if cross { 2 } else { 1 })
        .idle_policy(IdlePolicy::Spin(Duration::from_secs(3600)));
    let sys = ActorSystem::start(builder).expect("io_uring available");
    let home = ShardId::new(usize::from(cross));
    let counter = sys.spawn_actor(Placement::Pinned(home), Counter::default);
    let n = sys.block_on_local(move || async move {
        if cross {
            for i in 0..msgs {
                counter.tell(Inc(1)).expect("running");
                if i % 256 == 255 {
                    mailring::yield_now().await;
                }
            }
        } else {
            let local = counter.local().expect("on the actor's shard");
            for i in 0..msgs {
                local.tell(Inc(1)).expect("running");
                if i % 256 == 255 {
                    mailring::yield_now().await;
                }
            }
        }
        counter.ask(Get).await.expect("running")
    });
    assert_eq!(n, msgs);
    sys.shutdown();
}
