//! Tells for instruction counting, from the actor's shard
//! (`valgrind --tool=callgrind target/release/examples/actor_tell 2000000`) or
//! from the other shard (`... actor_tell 2000000 cross`). A last argument
//! picks the reference: `local` (a `LocalAddr`, the same-shard default),
//! `addr` (an `Addr`, the cross-shard default) or `recipient` (a
//! `Recipient<Inc>`), e.g. `... actor_tell 2000000 cross recipient`; `generic`
//! sends through an `Addr` of `GenericCounter<u8>` instead of `Counter`.
//! The shard spins instead of parking (valgrind stalls on a blocking
//! `io_uring_enter`).

use std::time::Duration;

use mailring::IdlePolicy;
use mailring_actors::{ActorSystem, Placement, Recipient, Runtime, ShardId};
use mailring_bench::counters::{Counter, GenericCounter, Get, Inc};

#[derive(Clone, Copy, PartialEq)]
enum Via {
    Local,
    Addr,
    Recipient,
    Generic,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let msgs: u64 = args
        .first()
        .and_then(|a| a.parse().ok())
        .unwrap_or(2_000_000);
    let cross = args.iter().any(|a| a == "cross");
    let via = if args.iter().any(|a| a == "recipient") {
        Via::Recipient
    } else if args.iter().any(|a| a == "generic") {
        Via::Generic
    } else if cross || args.iter().any(|a| a == "addr") {
        Via::Addr
    } else {
        Via::Local
    };
    let builder = Runtime::builder()
        .shards(if cross { 2 } else { 1 })
        .idle_policy(IdlePolicy::Spin(Duration::from_secs(3600)));
    let sys = ActorSystem::start(builder).expect("io_uring available");
    let home = ShardId::new(usize::from(cross));
    let counter = sys.spawn_actor(Placement::Pinned(home), Counter::default);
    let generic = sys.spawn_actor(Placement::Pinned(home), GenericCounter::<u8>::default);
    let n = sys.block_on_local(move || async move {
        match via {
            Via::Local => {
                let local = counter.local().expect("on the actor's shard");
                for i in 0..msgs {
                    local.tell(Inc(1)).expect("running");
                    if i % 256 == 255 {
                        mailring::yield_now().await;
                    }
                }
            }
            Via::Addr => {
                for i in 0..msgs {
                    counter.tell(Inc(1)).expect("running");
                    if i % 256 == 255 {
                        mailring::yield_now().await;
                    }
                }
            }
            Via::Generic => {
                for i in 0..msgs {
                    generic.tell(Inc(1)).expect("running");
                    if i % 256 == 255 {
                        mailring::yield_now().await;
                    }
                }
                return generic.ask(Get).await.expect("running");
            }
            Via::Recipient => {
                let recipient: Recipient<Inc> = counter.recipient();
                for i in 0..msgs {
                    recipient.tell(Inc(1)).expect("running");
                    if i % 256 == 255 {
                        mailring::yield_now().await;
                    }
                }
            }
        }
        counter.ask(Get).await.expect("running")
    });
    assert_eq!(n, msgs);
    sys.shutdown();
}
