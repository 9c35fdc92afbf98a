//! Cross-shard credit windows (`SystemConfig::cross_shard_window`), through
//! the public API: what a spent window does to `try_tell`, `send`, `tell`,
//! and that every message's credit comes back, whether its actor takes it,
//! stops with it queued, or is gone when it arrives.

use std::time::{Duration, Instant};

mod common;

use common::{send_rounds_from_every_shard, Add, Counter, Get, KeyedCounter};
use mailring_actors::mailring::time;
use mailring_actors::{
    Actor, ActorSystem, Ctx, Handler, Message, Placement, Runtime, ShardId, SystemConfig, TellError,
};

fn system(shards: usize, window: u32) -> ActorSystem {
    let config = SystemConfig {
        cross_shard_window: window,
        ..SystemConfig::default()
    };
    ActorSystem::start_with(Runtime::builder().shards(shards), config).expect("io_uring available")
}

/// Work that takes `.0` microseconds of the actor's shard.
#[derive(Message)]
struct Work(u64);

/// How many `Work` messages were handled.
#[derive(Message)]
#[message(reply = u64)]
struct Done;

#[derive(Actor, Default)]
#[actor(handles(Work, Done))]
struct Busy {
    handled: u64,
}

impl Handler<Work> for Busy {
    async fn handle(&mut self, m: Work, _cx: &mut Ctx<Self>) {
        let until = Instant::now() + Duration::from_micros(m.0);
        while Instant::now() < until {
            std::hint::spin_loop();
        }
        self.handled += 1;
    }
}

impl Handler<Done> for Busy {
    async fn handle(&mut self, _m: Done, _cx: &mut Ctx<Self>) -> u64 {
        self.handled
    }
}

/// Keeps `shard`'s thread from running anything (its actors take nothing)
/// for `pause`, starting now.
fn block_shard(sys: &ActorSystem, shard: usize, pause: Duration) {
    let started = std::sync::Arc::new(std::sync::Barrier::new(2));
    let s = started.clone();
    drop(sys.runtime().spawn_on(ShardId::new(shard), async move {
        s.wait();
        std::thread::sleep(pause);
    }));
    started.wait();
}

#[test]
fn a_spent_window_refuses_try_tell_holds_send_and_never_tell() {
    let sys = system(2, 8);
    let a = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Counter::default);
    let rt = sys.runtime().clone();
    block_shard(&sys, 1, Duration::from_millis(150));
    let out = sys.block_on(async move {
        rt.spawn_on(ShardId::new(0), async move {
            let mut refused = Vec::new();
            for i in 0..20 {
                match a.try_tell(Add(i)) {
                    Ok(()) => {}
                    Err(TellError::Full(Add(v))) => refused.push(v),
                    Err(e) => panic!("unexpected {e}"),
                }
            }
            // tell never waits, window or not.
            for _ in 0..10 {
                a.tell(Add(100)).unwrap();
            }
            // send waits until the blocked shard's actor takes messages and
            // the credits come back.
            let start = Instant::now();
            let sends = async {
                for i in 0..20 {
                    a.send(Add(i)).await.unwrap();
                }
            };
            time::timeout(Duration::from_secs(10), sends)
                .await
                .expect("send never got credit");
            let waited = start.elapsed();
            let total = a.ask(Get).await.unwrap();
            (refused, waited, total)
        })
        .await
        .unwrap()
    });
    assert_eq!(out.0, (8..20).collect::<Vec<_>>(), "8 credits, then Full");
    assert!(
        out.1 >= Duration::from_millis(50),
        "send did not wait: {:?}",
        out.1
    );
    assert_eq!(out.2, (0..8).sum::<u64>() + 1000 + (0..20).sum::<u64>());
    sys.shutdown();
}

#[test]
fn send_keeps_a_slow_actors_mailbox_within_the_window() {
    const WINDOW: u32 = 16;
    let sys = system(2, WINDOW);
    let busy = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Busy::default);
    let rt = sys.runtime().clone();
    let stream = |by_send: bool| {
        let busy = busy.clone();
        sys.block_on(rt.spawn_on(ShardId::new(0), async move {
            let stream = async {
                for _ in 0..3000 {
                    if by_send {
                        busy.send(Work(2)).await.unwrap();
                    } else {
                        busy.tell(Work(2)).unwrap();
                    }
                }
            };
            time::timeout(Duration::from_secs(20), stream)
                .await
                .expect("send never got credit");
            // Asked after the stream: every message was handled.
            busy.ask(Done).await.unwrap()
        }))
        .unwrap()
    };
    let high_water = || sys.stats().by_type("Busy").unwrap().mailbox_high_water;
    assert_eq!(stream(true), 3000);
    let by_send = high_water();
    // The window's messages, and the final ask, which is counted but not
    // held back.
    assert!(
        by_send <= WINDOW as usize + 1,
        "{by_send} queued, window {WINDOW}"
    );
    // The control: the same stream with tell, which the window does not
    // hold back, piles up in the mailbox.
    assert_eq!(stream(false), 6000);
    let by_tell = high_water();
    assert!(by_tell > WINDOW as usize, "{by_tell} queued");
    sys.shutdown();
}

#[test]
fn credits_of_dropped_messages_come_back() {
    let sys = system(2, 4);
    let doomed = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Counter::default);
    let other = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Counter::default);
    let rt = sys.runtime().clone();
    block_shard(&sys, 1, Duration::from_millis(50));
    let out = sys.block_on(async move {
        rt.spawn_on(ShardId::new(0), async move {
            // 50 messages queued behind a stop: the actor closes with them
            // in its mailbox and drops them.
            for i in 0..50 {
                doomed.tell(Add(i)).unwrap();
            }
            doomed.stop();
            // These arrive after it stopped: dead letters.
            time::sleep(Duration::from_millis(100)).await;
            for i in 0..10 {
                doomed.tell(Add(i)).unwrap();
            }
            // Without the credits of all 60, the window (4) stays spent.
            let sends = async {
                for i in 0..40 {
                    other.send(Add(i)).await.unwrap();
                }
            };
            let finished = time::timeout(Duration::from_secs(10), sends).await.is_ok();
            (finished, other.ask(Get).await.unwrap())
        })
        .await
        .unwrap()
    });
    assert!(out.0, "send waited for credits that never came back");
    assert_eq!(out.1, (0..40).sum::<u64>());
    sys.shutdown();
}

#[test]
fn windows_between_every_pair_of_shards_return_all_their_credits() {
    let sys = system(3, 4);
    let h = sys.handle();
    // Every shard sends to keys homed on every shard, so mailboxes hold
    // messages from several sources at once.
    let totals = sys.block_on(async move {
        send_rounds_from_every_shard::<KeyedCounter>(&h, 300, 12, Duration::from_secs(20)).await
    });
    assert!(totals.0, "a window ran out of credits");
    assert_eq!(totals.1, vec![3 * (0..300u64).sum::<u64>(); 12]);
    sys.shutdown();
}

#[test]
fn credits_taken_by_try_tell_still_wake_a_waiting_send() {
    // A wake threshold far above the credits that come back: arriving
    // credits wake no waiter of the hot counter by themselves.
    let builder = Runtime::builder()
        .shards(2)
        .hot_counter_wake_threshold(1000);
    let config = SystemConfig {
        cross_shard_window: 4,
        ..SystemConfig::default()
    };
    let sys = ActorSystem::start_with(builder, config).expect("io_uring available");
    let a = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Counter::default);
    let rt = sys.runtime().clone();
    block_shard(&sys, 1, Duration::from_millis(100));
    let total = sys.block_on(async move {
        let waiter = {
            let a = a.clone();
            rt.spawn_on(ShardId::new(0), async move {
                // Four fill the window; the fifth waits for credit.
                for i in 0..5 {
                    a.send(Add(i)).await.unwrap();
                }
            })
        };
        let spinner = {
            let a = a.clone();
            rt.spawn_on(ShardId::new(0), async move {
                // Keeps shard 0 busy (it never idles, so nothing flushes the
                // counter's waiters) and takes the credits as they arrive.
                while a.try_tell(Add(100)).is_err() {
                    mailring_actors::mailring::yield_now().await;
                }
            })
        };
        let both = async {
            spinner.await.unwrap();
            waiter.await.unwrap();
        };
        time::timeout(Duration::from_secs(10), both)
            .await
            .expect("the waiting send was never woken");
        a.ask(Get).await.unwrap()
    });
    assert_eq!(total, (0..5).sum::<u64>() + 100);
    sys.shutdown();
}
