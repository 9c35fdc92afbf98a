//! What `send`s given up while a window is spent leave behind, measured
//! with a counting global allocator (live heap bytes), in a binary with
//! this one test so nothing else allocates meanwhile.
//!
//! A `send` waiting for credits lists its task's waker (in the window's
//! list and the credit counter's); one given up (its future dropped under
//! a timeout) cannot take it back, and the waker holds its task. Past a
//! bound the lists are swept, so many senders that give up do not pile up
//! their tasks until the credits return.

use std::time::Duration;

use mailring_actors::mailring;
use mailring_actors::{
    Actor, ActorSystem, Ctx, Handler, Message, Placement, Runtime, ShardId, SystemConfig,
};

#[path = "../../transports/tests/support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::live;

#[derive(Message)]
struct Note;

#[derive(Actor, Default)]
#[actor(handles(Note))]
struct Sink;

impl Handler<Note> for Sink {
    async fn handle(&mut self, _m: Note, _cx: &mut Ctx<Self>) {}
}

const SENDERS: usize = 20_000;

#[test]
fn sends_given_up_while_the_window_is_spent_leave_no_task_behind() {
    let config = SystemConfig {
        cross_shard_window: 4,
        ..SystemConfig::default()
    };
    let sys =
        ActorSystem::start_with(Runtime::builder().shards(2), config).expect("io_uring available");
    let sink = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Sink::default);
    // Shard 1 takes nothing for a while: the window from shard 0 is spent.
    let started = std::sync::Arc::new(std::sync::Barrier::new(2));
    let s = started.clone();
    drop(sys.runtime().spawn_on(ShardId::new(1), async move {
        s.wait();
        std::thread::sleep(Duration::from_secs(3));
    }));
    started.wait();
    let rt = sys.runtime().clone();
    let grown = sys.block_on(async move {
        rt.spawn_on(ShardId::new(0), async move {
            for _ in 0..4 {
                sink.send(Note).await.expect("within the window");
            }
            let before = live();
            let mut tasks = Vec::with_capacity(SENDERS);
            for _ in 0..SENDERS {
                let sink = sink.clone();
                tasks.push(mailring::spawn_local(async move {
                    let _ =
                        mailring::time::timeout(Duration::from_millis(1), sink.send(Note)).await;
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
            live().saturating_sub(before)
        })
        .await
        .unwrap()
    });
    sys.shutdown();
    // Each task given up and still listed held about 570 bytes: 20,000 of
    // them 11.4 MB when nothing swept the lists. Swept at 1,024 waiters,
    // at most that many (about 1.1 MB).
    assert!(
        grown < 2 << 20,
        "{grown} bytes left by {SENDERS} sends given up"
    );
}
