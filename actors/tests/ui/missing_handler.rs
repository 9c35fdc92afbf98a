use mailring_actors::{Actor, Ctx, Handler, Message};

#[derive(Actor, Default)]
#[actor(handles(Ping, Pong))]
struct Counter;

#[derive(Message)]
struct Ping;

#[derive(Message)]
struct Pong;

impl Handler<Ping> for Counter {
    async fn handle(&mut self, _m: Ping, _cx: &mut Ctx<Self>) {}
}

fn main() {}
