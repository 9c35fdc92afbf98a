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
