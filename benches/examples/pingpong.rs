//! Cross-shard ping-pong for profiling: `cargo run --release -p mailring-bench --example pingpong`.
use std::time::Instant;

use mailring::ShardId;

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200_000);
    // MAILRING_SPIN_US=0 blocks at once; unset uses the default policy.
    let mut builder = mailring::Runtime::builder().shards(2);
    if let Some(us) = std::env::var("MAILRING_SPIN_US")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        builder = builder.idle_policy(if us == 0 {
            mailring::IdlePolicy::Block
        } else {
            mailring::IdlePolicy::Spin(std::time::Duration::from_micros(us))
        });
    }
    let rt = builder.build().unwrap();
    let h = rt.handle().clone();
    let (to_pong, mut pong_rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
    let (to_ping, mut ping_rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
    h.spawn_on(ShardId::new(1), async move {
        while let Some(v) = pong_rx.recv().await {
            if to_ping.send(v).is_err() {
                break;
            }
        }
    })
    .detach();
    let start = Instant::now();
    let pinger = h.spawn_on(ShardId::new(0), async move {
        let mut sum = 0u64;
        for i in 0..n {
            to_pong.send(i).unwrap();
            sum = sum.wrapping_add(ping_rx.recv().await.unwrap());
        }
        sum
    });
    let sum = futures::executor::block_on(pinger).unwrap();
    let el = start.elapsed();
    println!("{n} round trips: {:?} per RTT (sum {sum})", el / n as u32);
    let stats = rt.stats();
    let parks: u64 = stats.shards.iter().map(|s| s.parks).sum();
    let doorbells: u64 = stats.shards.iter().map(|s| s.doorbells_sent).sum();
    println!("parks {parks}, doorbells {doorbells}");
}
