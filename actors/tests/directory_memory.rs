//! What a directory-placed key costs once routed: its record (and each
//! shard's cached copy of it) stays as long as the system, so it must not
//! hold the key's bytes. A server whose keys come from clients (stream
//! names of up to 64 KiB in the broker) would otherwise keep every name
//! any client ever named, once in the directory and once per shard cache.
//!
//! One test in its own binary: it reads the process's resident memory.

use mailring_actors::{Actor, ActorSystem, Ctx, Handler, Message, Runtime, ShardId};

#[derive(Actor)]
#[actor(key = String, activate = Named::new, placement = "first_sender", handles(Touch))]
struct Named;

impl Named {
    fn new(_k: &String) -> Self {
        Named
    }
}

#[derive(Message)]
#[message(reply = ())]
struct Touch;

impl Handler<Touch> for Named {
    async fn handle(&mut self, _m: Touch, cx: &mut Ctx<Self>) {
        // Nothing to keep: the activation ends, its record stays.
        cx.stop();
    }
}

/// The process's resident memory, in bytes.
fn resident() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("procfs");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("statm's resident field");
    pages * 4096
}

#[test]
fn routed_keys_leave_records_that_do_not_hold_their_bytes() {
    const KEYS: usize = 400;
    const KEY_BYTES: usize = 256 << 10;
    let sys = ActorSystem::start(Runtime::builder().shards(2)).expect("io_uring available");
    let h = sys.handle();
    let before = resident();
    // Each key routed from shard 1 (cached there) and from shard 0 (cached
    // there too), its actor asked once; the keys themselves are dropped.
    let rt = sys.runtime().clone();
    sys.block_on(async move {
        for shard in [1, 0] {
            let h = h.clone();
            rt.spawn_on(ShardId::new(shard), async move {
                for i in 0..KEYS {
                    let mut name = format!("{i:08}");
                    name.push_str(&"k".repeat(KEY_BYTES));
                    assert_eq!(h.shard_of::<Named>(&name).index(), 1);
                    h.keyed::<Named>(name).ask(Touch).await.expect("answered");
                }
            })
            .await
            .expect("routing task");
        }
    });
    let grown = resident().saturating_sub(before);
    assert_eq!(sys.handle().directory_len::<Named>(), KEYS);
    // 400 keys of 256 KiB are 100 MiB a copy: kept, they would show as
    // 100 MiB (the directory) plus 100 MiB per shard's cache.
    assert!(
        grown < 16 << 20,
        "resident memory grew by {} MiB after routing {KEYS} keys of {} KiB",
        grown >> 20,
        KEY_BYTES >> 10
    );
    sys.shutdown();
}
