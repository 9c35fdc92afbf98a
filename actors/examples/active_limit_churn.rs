//! Activations of a keyed type under `max_active`, against the same type
//! without the limit: 60,000 keys asked once each on one shard, so past
//! the first 20,000 every activation passivates the least recently used.
//!
//! `cargo run --release -p mailring-actors --example active_limit_churn [keys]`;
//! with `BURST=1`, each 10,000 keys are told in one go (no wait between
//! them, so the limit's victims cannot leave meanwhile), then one asked.

use std::time::{Duration, Instant};

use mailring_actors::{Actor, ActorSystem, Ctx, Handler, Message, Runtime, SystemHandle};

#[derive(Message)]
#[message(reply = u64)]
struct Get;

#[derive(Actor)]
#[actor(key = u64, activate = Capped::new, max_active = 20000, pinned = 0, handles(Get))]
struct Capped;

impl Capped {
    fn new(_k: &u64) -> Self {
        Capped
    }
}

impl Handler<Get> for Capped {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        1
    }
}

#[derive(Actor)]
#[actor(key = u64, activate = Unbounded::new, pinned = 0, handles(Get))]
struct Unbounded;

impl Unbounded {
    fn new(_k: &u64) -> Self {
        Unbounded
    }
}

impl Handler<Get> for Unbounded {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        1
    }
}

/// Asks keys `0..n` of `A` once each; the time per activation of each
/// 10,000.
async fn churn<A>(h: SystemHandle, n: u64) -> Vec<Duration>
where
    A: Actor<Key = u64> + mailring_actors::Accepts<Get>,
    A::Envelope: Send,
{
    let burst = std::env::var_os("BURST").is_some();
    let mut parts = Vec::new();
    let mut last = Instant::now();
    for k in 0..n {
        if burst && (k + 1) % 10_000 != 0 {
            // Told without a wait: the victims cannot leave meanwhile.
            h.keyed::<A>(k).tell(Get).unwrap();
        } else {
            h.keyed::<A>(k).ask(Get).await.unwrap();
        }
        if (k + 1) % 10_000 == 0 {
            parts.push(last.elapsed() / 10_000);
            last = Instant::now();
        }
    }
    parts
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(60_000);
    let sys = ActorSystem::start(Runtime::builder().shards(1)).expect("io_uring available");
    for (name, capped) in [("max_active = 20000", true), ("no limit", false)] {
        let h = sys.handle().clone();
        let parts = sys.block_on(async move {
            if capped {
                churn::<Capped>(h, n).await
            } else {
                churn::<Unbounded>(h, n).await
            }
        });
        let shown: Vec<String> = parts
            .iter()
            .map(|d| format!("{:.2}", d.as_secs_f64() * 1e6))
            .collect();
        println!(
            "{name}: us per activation, each 10,000 keys: {}",
            shown.join(" ")
        );
    }
    sys.shutdown();
}
