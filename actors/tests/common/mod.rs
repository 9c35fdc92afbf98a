//! Actors and messages shared by the integration tests.

#![allow(dead_code)] // each test crate uses some of them

use std::time::Duration;

use mailring_actors::testkit::on_every_shard;
use mailring_actors::{Accepts, Actor, Ctx, Handler, Message, SystemHandle};

/// An unkeyed counter.
#[derive(Actor, Default)]
#[actor(handles(Add, Get, WhereAmI))]
pub(crate) struct Counter {
    pub(crate) total: u64,
}

#[derive(Message)]
pub(crate) struct Add(pub(crate) u64);

#[derive(Message)]
#[message(reply = u64)]
pub(crate) struct Get;

#[derive(Message)]
#[message(reply = usize)]
pub(crate) struct WhereAmI;

impl Handler<Add> for Counter {
    async fn handle(&mut self, m: Add, _cx: &mut Ctx<Self>) {
        self.total += m.0;
    }
}

impl Handler<Get> for Counter {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.total
    }
}

impl Handler<WhereAmI> for Counter {
    async fn handle(&mut self, _m: WhereAmI, cx: &mut Ctx<Self>) -> usize {
        assert_eq!(Some(cx.shard()), mailring_actors::mailring::current_shard());
        cx.shard().index()
    }
}

/// A keyed counter.
#[derive(Actor, Default)]
#[actor(key = u64, activate = KeyedCounter::new, handles(Add, Get))]
pub(crate) struct KeyedCounter {
    pub(crate) total: u64,
}

impl KeyedCounter {
    fn new(_key: &u64) -> Self {
        KeyedCounter::default()
    }
}

impl Handler<Add> for KeyedCounter {
    async fn handle(&mut self, m: Add, _cx: &mut Ctx<Self>) {
        self.total += m.0;
    }
}

impl Handler<Get> for KeyedCounter {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.total
    }
}

/// Every shard sends `Add(round)` to keys `0..keys` of `A` for `rounds`
/// rounds with `send().await`, through a fresh reference per send (as a
/// gateway makes one per request); then asks each key for its total.
/// Returns whether every shard finished within `within`, and the totals.
pub(crate) async fn send_rounds_from_every_shard<A>(
    h: &SystemHandle,
    rounds: u64,
    keys: u64,
    within: Duration,
) -> (bool, Vec<u64>)
where
    A: Actor<Key = u64> + Accepts<Add> + Accepts<Get>,
    A::Envelope: Send,
{
    let sent = on_every_shard(h, within, |_| {
        let h = h.clone();
        async move {
            for round in 0..rounds {
                for key in 0..keys {
                    h.keyed::<A>(key).send(Add(round)).await.unwrap();
                }
            }
        }
    })
    .await;
    let mut totals = Vec::new();
    for key in 0..keys {
        totals.push(h.keyed::<A>(key).ask(Get).await.unwrap());
    }
    (sent.is_some(), totals)
}

/// Polls a future to completion on this (non-shard) thread.
pub(crate) fn block_on_thread<F: std::future::Future>(fut: F) -> F::Output {
    use std::task::{Context, Poll, Wake, Waker};
    struct ThreadWaker(std::thread::Thread);
    impl Wake for ThreadWaker {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(std::sync::Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park_timeout(Duration::from_millis(10));
    }
}

/// Records what reached it, in order: (sender, sequence number).
#[derive(Actor, Default)]
#[actor(key = u64, activate = Log::new, handles(Note, Seen))]
pub(crate) struct Log {
    pub(crate) seen: Vec<(u32, u32)>,
}

impl Log {
    fn new(_key: &u64) -> Self {
        Log::default()
    }
}

/// As [`Log`], living on shard 1.
#[derive(Actor, Default)]
#[actor(key = u64, activate = FarLog::new, pinned = 1, handles(Note, Seen))]
pub(crate) struct FarLog {
    pub(crate) seen: Vec<(u32, u32)>,
}

impl FarLog {
    fn new(_key: &u64) -> Self {
        FarLog::default()
    }
}

/// A note: (sender, sequence number).
#[derive(Message)]
pub(crate) struct Note(pub(crate) u32, pub(crate) u32);

/// Takes the notes seen so far.
#[derive(Message)]
#[message(reply = Vec<(u32, u32)>)]
pub(crate) struct Seen;

impl Handler<Note> for Log {
    async fn handle(&mut self, m: Note, _cx: &mut Ctx<Self>) {
        self.seen.push((m.0, m.1));
    }
}

impl Handler<Seen> for Log {
    async fn handle(&mut self, _m: Seen, _cx: &mut Ctx<Self>) -> Vec<(u32, u32)> {
        std::mem::take(&mut self.seen)
    }
}

impl Handler<Note> for FarLog {
    async fn handle(&mut self, m: Note, _cx: &mut Ctx<Self>) {
        self.seen.push((m.0, m.1));
    }
}

impl Handler<Seen> for FarLog {
    async fn handle(&mut self, _m: Seen, _cx: &mut Ctx<Self>) -> Vec<(u32, u32)> {
        std::mem::take(&mut self.seen)
    }
}

/// A sender's own random sequence (xorshift), the same each run: start
/// with [`first_random`].
pub(crate) fn next_random(x: &mut u32) -> u32 {
    *x ^= *x << 13;
    *x ^= *x >> 17;
    *x ^= *x << 5;
    *x
}

/// The seed of sender `task`'s sequence.
pub(crate) fn first_random(task: u32) -> u32 {
    0x9e37_79b9_u32 ^ (task + 1).wrapping_mul(0x85eb_ca6b)
}

/// Checks that every log saw each of `tasks` senders' notes in the order
/// they were made, and `tasks * notes` notes in all (none lost or doubled).
pub(crate) fn check_each_senders_order(logs: &[Vec<(u32, u32)>], tasks: u32, notes: u32) {
    let mut total = 0;
    for log in logs {
        for task in 0..tasks {
            let order: Vec<u32> = log
                .iter()
                .filter(|(t, _)| *t == task)
                .map(|(_, n)| *n)
                .collect();
            assert!(
                order.windows(2).all(|w| w[0] < w[1]),
                "task {task}'s notes out of order: {order:?}"
            );
            total += order.len();
        }
    }
    assert_eq!(total, (tasks * notes) as usize, "notes lost or doubled");
}
