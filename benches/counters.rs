//! The actors the mailring workloads share (the actor bench and the
//! profiling examples): counters (`Inc` adds, `Get` asks for the total) and
//! the two sides of a ping-pong.

use mailring_actors::{Actor, Addr, Ctx, Handler, Message};
use tokio::sync::oneshot;

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

/// The ping side's message: the round trip number.
#[derive(Message)]
pub struct Ping(pub u64);

/// The pong side's answer.
#[derive(Message)]
pub struct Pong(pub u64);

/// Starts a ping-pong of `rounds` round trips with `peer`; `done` fires
/// after the last.
#[derive(Message)]
pub struct Start {
    /// The other side.
    pub peer: Addr<PongSide>,
    /// Round trips to make.
    pub rounds: u64,
    /// Fires after the last round trip.
    pub done: oneshot::Sender<()>,
}

/// The side that counts the round trips.
#[derive(Actor, Default)]
#[actor(handles(Pong, Start))]
pub struct PingSide {
    peer: Option<Addr<PongSide>>,
    rounds: u64,
    done: Option<oneshot::Sender<()>>,
}

impl Handler<Start> for PingSide {
    async fn handle(&mut self, m: Start, _cx: &mut Ctx<Self>) {
        m.peer.tell(Ping(0)).expect("the pong side runs");
        self.peer = Some(m.peer);
        self.rounds = m.rounds;
        self.done = Some(m.done);
    }
}

impl Handler<Pong> for PingSide {
    async fn handle(&mut self, m: Pong, _cx: &mut Ctx<Self>) {
        let n = m.0 + 1;
        if n == self.rounds {
            if let Some(done) = self.done.take() {
                let _ = done.send(());
            }
        } else if let Some(peer) = &self.peer {
            peer.tell(Ping(n)).expect("the pong side runs");
        }
    }
}

/// The side that answers each ping.
#[derive(Actor)]
#[actor(handles(Ping))]
pub struct PongSide {
    /// Where the pongs go.
    pub peer: Addr<PingSide>,
}

impl Handler<Ping> for PongSide {
    async fn handle(&mut self, m: Ping, _cx: &mut Ctx<Self>) {
        self.peer.tell(Pong(m.0)).expect("the ping side runs");
    }
}

/// The same counter as a generic type (its registry slot and shard cache
/// are found by `TypeId`, where a non-generic type has statics): for the
/// generic-vs-plain tell comparison of `actor_tell ... generic`.
#[derive(Actor)]
#[actor(handles(Inc, Get))]
pub struct GenericCounter<T: Send> {
    n: u64,
    _tag: std::marker::PhantomData<T>,
}

impl<T: Send> Default for GenericCounter<T> {
    fn default() -> Self {
        GenericCounter {
            n: 0,
            _tag: std::marker::PhantomData,
        }
    }
}

impl<T: Send + 'static> Handler<Inc> for GenericCounter<T> {
    async fn handle(&mut self, m: Inc, _cx: &mut Ctx<Self>) {
        self.n += m.0;
    }
}

impl<T: Send + 'static> Handler<Get> for GenericCounter<T> {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.n
    }
}
