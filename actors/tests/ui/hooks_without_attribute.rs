use mailring_actors::{Actor, Ctx, Handler, Hooks, Message};

#[derive(Actor, Default)]
#[actor(handles(Ping))]
struct Counter;

#[derive(Message)]
struct Ping;

impl Handler<Ping> for Counter {
    async fn handle(&mut self, _m: Ping, _cx: &mut Ctx<Self>) {}
}

impl Hooks for Counter {
    async fn on_start(&mut self, _cx: &mut Ctx<Self>) {}
}

fn main() {}
