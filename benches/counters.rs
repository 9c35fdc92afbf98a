//! The counter actors the mailring workloads share (the actor bench and the
//! callgrind examples): `Inc` adds, `Get` asks for the total.

use mailring_actors::{Actor, Ctx, Handler, Message};

/// Adds its value to the count.
#[derive(Message)]
pub struct Inc(pub u64);

/// Asks for the count.
#[derive(Message)]
#[message(reply = u64)]
pub struct Get;

/// An unkeyed counter with a typed mailbox.
#[derive(Actor, Default)]
#[actor(handles(Inc, Get))]
pub struct Counter {
    n: u64,
}

impl Handler<Inc> for Counter {
    async fn handle(&mut self, m: Inc, _cx: &mut Ctx<Self>) {
        self.n += m.0;
    }
}

impl Handler<Get> for Counter {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.n
    }
}

/// A keyed counter, activated on its first message.
#[derive(Actor)]
#[actor(key = u64, activate = KeyCounter::new, handles(Inc, Get))]
pub struct KeyCounter {
    n: u64,
}

impl KeyCounter {
    fn new(_key: &u64) -> Self {
        KeyCounter { n: 0 }
    }
}

impl Handler<Inc> for KeyCounter {
    async fn handle(&mut self, m: Inc, _cx: &mut Ctx<Self>) {
        self.n += m.0;
    }
}

impl Handler<Get> for KeyCounter {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.n
    }
}
