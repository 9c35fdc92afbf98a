//! Tiny messages carried by MSG_RING completions, and coalesced hot counters.

use mailring::{hot, Placement, ShardId};

const HOT: u16 = 11;
const PLAIN: u16 = 12;

#[test]
fn hot_counter_sums_values_across_shards() {
    let rt = mailring::Runtime::builder()
        .shards(2)
        .coalesced_hot_tag(HOT)
        .build()
        .unwrap();
    let total = rt.block_on(async {
        let consumer = mailring::spawn_with(Placement::Pinned(ShardId::new(1)), async {
            let mut sum = 0u64;
            let mut wakeups = 0u64;
            while sum < 100_000 {
                sum += hot::next_hot_count(HOT).await;
                wakeups += 1;
            }
            (sum, wakeups)
        });
        for _ in 0..100_000 {
            hot::send_tiny(ShardId::new(1), HOT, 1);
        }
        consumer.await.unwrap()
    });
    assert_eq!(total.0, 100_000);
    // Sent from one task in one tick: summed into very few completions.
    assert!(total.1 < 100, "{} wakeups for 100k increments", total.1);
    let stats = rt.stats();
    assert!(stats.shards[0].tiny_sent < 100, "{stats:?}");
}

#[test]
fn plain_tiny_messages_keep_order_and_sender() {
    let rt = mailring::Runtime::builder().shards(2).build().unwrap();
    let got = rt.block_on(async {
        let consumer = mailring::spawn_on(ShardId::new(1), async {
            let mut v = Vec::new();
            for _ in 0..100 {
                v.push(hot::next_tiny(PLAIN).await);
            }
            v
        });
        for i in 0..100 {
            hot::send_tiny(ShardId::new(1), PLAIN, i);
            if i % 10 == 0 {
                mailring::yield_now().await;
            }
        }
        consumer.await.unwrap()
    });
    let values: Vec<u32> = got.iter().map(|m| m.value).collect();
    assert_eq!(values, (0..100).collect::<Vec<_>>());
    assert!(got
        .iter()
        .all(|m| m.from == Some(ShardId::new(0)) && m.tag == PLAIN));
}

#[test]
fn tiny_messages_from_outside_threads_arrive() {
    let rt = mailring::Runtime::builder()
        .shards(2)
        .coalesced_hot_tag(HOT)
        .build()
        .unwrap();
    let consumer = rt.handle().spawn_on(ShardId::new(1), async {
        let mut sum = 0;
        while sum < 10 {
            sum += hot::next_hot_count(HOT).await;
        }
        let m = hot::next_tiny(PLAIN).await;
        (sum, m)
    });
    for _ in 0..10 {
        rt.handle().send_tiny(ShardId::new(1), HOT, 1);
    }
    rt.handle().send_tiny(ShardId::new(1), PLAIN, 99);
    let (sum, m) = rt.block_on(async move { consumer.await.unwrap() });
    assert_eq!(sum, 10);
    assert_eq!((m.from, m.value), (None, 99));
}

#[test]
fn wake_threshold_batches_wakeups() {
    let rt = mailring::Runtime::builder()
        .shards(2)
        .coalesced_hot_tag(HOT)
        .hot_counter_wake_threshold(1_000)
        .build()
        .unwrap();
    let (sum, first) = rt.block_on(async {
        let consumer = mailring::spawn_on(ShardId::new(1), async {
            let first = hot::next_hot_count(HOT).await;
            let mut sum = first;
            while sum < 5 {
                sum += hot::next_hot_count(HOT).await;
            }
            (sum, first)
        });
        // Below the threshold the consumer still wakes once the shard idles.
        for _ in 0..5 {
            hot::send_tiny(ShardId::new(1), HOT, 1);
        }
        consumer.await.unwrap()
    });
    assert_eq!(sum, 5);
    assert!(first >= 1);
}

#[test]
fn try_take_hot_count_does_not_wait() {
    let rt = mailring::Runtime::builder()
        .shards(1)
        .coalesced_hot_tag(HOT)
        .build()
        .unwrap();
    rt.block_on(async {
        assert_eq!(hot::try_take_hot_count(HOT), None);
        hot::send_tiny(ShardId::new(0), HOT, 4);
        hot::send_tiny(ShardId::new(0), HOT, 5);
        assert_eq!(hot::try_take_hot_count(HOT), Some(9));
        assert_eq!(hot::try_take_hot_count(HOT), None);
    });
}

#[test]
fn more_completions_than_cq_entries_lose_no_message() {
    // A small ring (CQ of 1024 entries) receives 5000 plain tiny messages posted
    // in one tick while it sleeps. Depending on the kernel, the surplus waits in
    // deferred task work or in the CQ overflow list, which the shard flushes.
    let rt = mailring::Runtime::builder()
        .shards(2)
        .ring_entries(4)
        .idle_policy(mailring::IdlePolicy::Block)
        .build()
        .unwrap();
    const N: u32 = 5_000;
    let got = rt.block_on(async {
        let consumer = mailring::spawn_on(ShardId::new(1), async {
            let mut v = Vec::with_capacity(N as usize);
            while v.len() < N as usize {
                v.push(hot::next_tiny(PLAIN).await.value);
            }
            v
        });
        // Let shard 1 start the consumer and fall asleep.
        mailring::time::sleep(std::time::Duration::from_millis(20)).await;
        for i in 0..N {
            hot::send_tiny(ShardId::new(1), PLAIN, i);
        }
        consumer.await.unwrap()
    });
    assert_eq!(got, (0..N).collect::<Vec<_>>());
    let stats = rt.stats();
    assert!(stats.shards[1].ring.cq_entries < N, "{stats:?}");
}

#[test]
fn unconsumed_tiny_messages_are_bounded_per_tag_and_the_excess_is_counted() {
    let rt = mailring::Runtime::builder().shards(2).build().unwrap();
    let extra = 100;
    let total = (hot::TINY_QUEUE_LIMIT + extra) as u64;
    rt.block_on(async move {
        // Nobody consumes the tag on shard 1 while these arrive.
        for v in 0..total {
            hot::send_tiny(ShardId::new(1), PLAIN, v as u32);
            if v % 1024 == 0 {
                mailring::yield_now().await;
            }
        }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while rt.stats().shards[1].tiny_received < total {
        assert!(std::time::Instant::now() < deadline, "{:?}", rt.stats());
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let stats = rt.stats();
    assert_eq!(stats.shards[1].tiny_dropped, extra as u64, "{stats:?}");
    // What was kept is the oldest, in order; the queue takes arrivals again
    // once drained.
    let (first, kept) = rt.block_on(async {
        mailring::spawn_with(Placement::Pinned(ShardId::new(1)), async {
            let first = hot::try_next_tiny(PLAIN).map(|m| m.value);
            let mut kept = 1;
            while hot::try_next_tiny(PLAIN).is_some() {
                kept += 1;
            }
            (first, kept)
        })
        .await
        .unwrap()
    });
    assert_eq!(first, Some(0));
    assert_eq!(kept, hot::TINY_QUEUE_LIMIT);
}

#[test]
fn tags_registered_after_build_are_disjoint_skip_the_builders_and_run_out() {
    let first = hot::DYNAMIC_HOT_TAGS;
    let rt = mailring::Runtime::builder()
        .shards(1)
        .coalesced_hot_tag(first)
        .coalesced_hot_tag(first + 5)
        .build()
        .unwrap();
    let h = rt.handle();
    let a = h.register_hot_tags(4).unwrap();
    let b = h.register_hot_tags(4).unwrap();
    assert_eq!(a, first + 1..first + 5);
    assert_eq!(b, first + 6..first + 10);
    assert_eq!(
        h.register_hot_tags(u16::MAX),
        Err(hot::HotTagError::Exhausted { asked: u16::MAX })
    );
    // What is left is still handed out.
    assert_eq!(h.register_hot_tags(1).unwrap(), first + 10..first + 11);
}

/// Tags given back are handed out again, without what their counters
/// held; a tag never handed out, or given back twice, is refused.
#[test]
fn tags_given_back_are_handed_out_again_with_nothing_left_on_them() {
    let rt = mailring::Runtime::builder().shards(2).build().unwrap();
    let h = rt.handle().clone();
    let tags = h.register_hot_tags(2).unwrap();
    let tag = tags.start;
    let h2 = h.clone();
    let again = rt.block_on(async move {
        // Counts left on both shards, one of them still on its way.
        hot::send_tiny(ShardId::new(0), tag, 5);
        hot::send_tiny(ShardId::new(1), tag, 7);
        h2.release_hot_tags(tags.clone()).await.unwrap();
        assert_eq!(
            h2.release_hot_tags(tags.clone()).await,
            Err(hot::HotTagError::NotRegistered { tag })
        );
        let unissued = tags.end + 10;
        assert_eq!(
            h2.release_hot_tags(unissued..unissued + 1).await,
            Err(hot::HotTagError::NotRegistered { tag: unissued })
        );
        let again = h2.register_hot_tags(1).unwrap();
        assert_eq!(again, tag..tag + 1, "a run given back is taken first");
        assert_eq!(hot::try_take_hot_count(tag), None, "nothing left here");
        again
    });
    let left_on_1 = rt
        .block_on(h.spawn_on(ShardId::new(1), async move {
            hot::try_take_hot_count(again.start)
        }))
        .unwrap();
    assert_eq!(left_on_1, None, "nothing left on the other shard");
    // The rest of the run given back comes next.
    assert_eq!(h.register_hot_tags(1).unwrap(), tag + 1..tag + 2);
    assert_eq!(h.register_hot_tags(1).unwrap(), tag + 2..tag + 3);
}

#[test]
fn a_tag_registered_after_build_is_summed_like_a_builders() {
    let rt = mailring::Runtime::builder().shards(2).build().unwrap();
    let tag = rt.handle().register_hot_tags(1).unwrap().start;
    let (sum, wakeups) = rt.block_on(async move {
        let consumer = mailring::spawn_with(Placement::Pinned(ShardId::new(1)), async move {
            let mut sum = 0u64;
            let mut wakeups = 0u64;
            while sum < 100_000 {
                sum += hot::next_hot_count(tag).await;
                wakeups += 1;
            }
            (sum, wakeups)
        });
        for _ in 0..100_000 {
            hot::send_tiny(ShardId::new(1), tag, 1);
        }
        consumer.await.unwrap()
    });
    assert_eq!(sum, 100_000);
    assert!(wakeups < 100, "{wakeups} wakeups: not summed");
    assert!(rt.stats().shards[0].tiny_sent < 100, "{:?}", rt.stats());
}

/// A waker that counts nothing; its `Arc`'s count says who holds it.
struct Spy;

impl std::task::Wake for Spy {
    fn wake(self: std::sync::Arc<Self>) {}
}

/// Polls `fut` once with a waker of its own, drops it: whether it was
/// pending, and how many references to that waker are held elsewhere.
fn poll_once_then_drop<F: std::future::Future>(fut: F) -> (bool, usize) {
    let spy = std::sync::Arc::new(Spy);
    let waker = std::task::Waker::from(spy.clone());
    let mut cx = std::task::Context::from_waker(&waker);
    let pending = std::pin::pin!(fut).as_mut().poll(&mut cx).is_pending();
    drop(waker);
    (pending, std::sync::Arc::strong_count(&spy) - 1)
}

/// Waits given up (a timeout, a `select!`) take their wakers back from
/// the tag's waiters: a counter or a queue nobody feeds holds no task of
/// theirs; a `HotWait` polled again lists one waker, not one per poll;
/// and a wait still listed is woken by the next value.
#[test]
fn waits_given_up_on_hot_counters_and_tiny_queues_hold_no_waker() {
    let rt = mailring::Runtime::builder()
        .shards(1)
        .coalesced_hot_tag(HOT)
        .build()
        .unwrap();
    rt.block_on(async {
        for _ in 0..3 {
            assert_eq!(poll_once_then_drop(hot::next_hot_count(HOT)), (true, 0));
            assert_eq!(poll_once_then_drop(hot::next_tiny(PLAIN)), (true, 0));
        }
        let mut wait = hot::HotWait::new(HOT);
        let got = std::future::poll_fn(|cx| {
            for _ in 0..10 {
                assert!(wait.poll_count(cx).is_pending());
            }
            std::task::Poll::Ready(())
        });
        got.await;
        hot::send_tiny(ShardId::new(0), HOT, 5);
        assert_eq!(std::future::poll_fn(|cx| wait.poll_count(cx)).await, 5);
    });
}

/// A wait on a plain tag's queue, given up after the tag became hot (a tag
/// registered after `build()`), still takes its waker back from the queue.
#[test]
fn a_queue_wait_given_up_after_its_tag_became_hot_holds_no_waker() {
    let rt = mailring::Runtime::builder().shards(1).build().unwrap();
    let h = rt.handle().clone();
    let held = rt.block_on(async move {
        let tag = mailring::hot::DYNAMIC_HOT_TAGS;
        let spy = std::sync::Arc::new(Spy);
        let waker = std::task::Waker::from(spy.clone());
        let mut cx = std::task::Context::from_waker(&waker);
        let mut wait = hot::HotWait::new(tag);
        assert!(wait.poll_tiny(&mut cx).is_pending());
        assert_eq!(h.register_hot_tags(1).unwrap(), tag..tag + 1);
        // The shard adopts the tag as hot when it next meets it.
        assert_eq!(hot::try_take_hot_count(tag), None);
        drop(wait);
        drop(waker);
        std::sync::Arc::strong_count(&spy) - 1
    });
    assert_eq!(held, 0);
}
