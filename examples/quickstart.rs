//! The shortest complete keyed-actor program: a counter per key, placed on
//! shards by a stable hash of the key, activated by its first message.
//!
//! Run: `cargo run --release -p mailring-actors --example quickstart`

use mailring_actors::{Actor, ActorSystem, Ctx, Handler, Message, Runtime};

/// One counter per key; lives on the shard its key hashes to.
#[derive(Actor, Default)]
#[actor(key = String, activate = Counter::new, handles(Add))]
struct Counter {
    total: u64,
}

impl Counter {
    fn new(_key: &String) -> Self {
        Counter::default()
    }
}

/// Adds to the counter; the reply is the new total.
#[derive(Message)]
#[message(reply = u64)]
struct Add(u64);

impl Handler<Add> for Counter {
    async fn handle(&mut self, msg: Add, _cx: &mut Ctx<Self>) -> u64 {
        self.total += msg.0;
        self.total
    }
}

fn main() -> Result<(), mailring_actors::mailring::BuildError> {
    let system = ActorSystem::start(Runtime::builder().shards(2))?;
    let handle = system.handle();
    let totals = system.block_on(async move {
        let mut totals = Vec::new();
        for tenant in ["alpha", "beta", "gamma"] {
            let counter = handle.keyed::<Counter>(tenant.to_string());
            counter.tell(Add(10)).expect("system running"); // fire and forget
            let total = counter.ask(Add(1)).await.expect("counter replies"); // request/response
            totals.push((tenant, counter.shard().index(), total));
        }
        totals
    });
    for (tenant, shard, total) in totals {
        println!("{tenant}: total {total} on shard {shard}");
    }
    system.shutdown();
    Ok(())
}
