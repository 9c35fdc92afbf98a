//! The smallest mailring program: `cargo run --example hello`.

use mailring::{Placement, ShardId};

#[mailring::main(shards = 2)]
async fn main() {
    // A task pinned to shard 1, and one placed by key.
    let a = mailring::spawn_on(ShardId::new(1), async { mailring::current_shard() });
    let b = mailring::spawn_with(Placement::Sticky(42), async { "tenant 42" });
    println!("{:?} {}", a.await.unwrap(), b.await.unwrap());
    mailring::time::sleep(std::time::Duration::from_millis(10)).await;
}
