//! Actors and messages shared by the integration tests.

#![allow(dead_code)] // each test crate uses some of them

use mailring_actors::{Actor, Ctx, Handler, Message};

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
