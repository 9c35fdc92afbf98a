//! `sync::oneshot` and `sync::Slot` between shards and outside threads.

use std::sync::Arc;

use mailring::sync::oneshot::{self, RecvError};
use mailring::sync::Slot;
use mailring::ShardId;

use crate::rt2;

#[test]
fn replies_cross_shards_in_both_directions() {
    let rt = rt2();
    let total = rt.block_on(async {
        let mut sum = 0u64;
        for i in 0..2_000u64 {
            let (tx, rx) = oneshot::channel();
            // Alternate the answering shard: half the replies cross shards.
            mailring::spawn_on(ShardId::new((i % 2) as usize), async move {
                tx.send(i).unwrap();
            })
            .detach();
            sum += rx.await.unwrap();
        }
        sum
    });
    assert_eq!(total, (0..2_000u64).sum());
}

#[test]
fn a_sender_dropped_on_another_shard_fails_the_receiver() {
    let rt = rt2();
    let got = rt.block_on(async {
        let (tx, rx) = oneshot::channel::<String>();
        mailring::spawn_on(ShardId::new(1), async move {
            mailring::time::sleep(std::time::Duration::from_millis(2)).await;
            drop(tx);
        })
        .detach();
        rx.await
    });
    let err: RecvError = got.unwrap_err();
    assert_eq!(err.to_string(), "the sender was dropped without sending");
}

#[test]
fn a_slot_in_shared_state_wakes_its_waiter_from_an_outside_thread() {
    let rt = rt2();
    let slot = Arc::new(Slot::new());
    let filler = slot.clone();
    let waiter = rt.handle().spawn_on(ShardId::new(0), async move {
        std::future::poll_fn(|cx| slot.poll_take(cx)).await
    });
    let outside = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(5));
        filler.send(7u32).unwrap();
    });
    assert_eq!(rt.block_on(async move { waiter.await.unwrap() }), Some(7));
    outside.join().unwrap();
}
