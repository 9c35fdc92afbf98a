use mailring_actors::{Actor, Ctx, Handler, Message};

#[derive(Actor, Default)]
#[actor(handles(Get))]
struct Counter {
    n: u64,
}

#[derive(Message)]
struct Get;

impl Handler<Get> for Counter {
    async fn handle(&mut self, _m: Get, _cx: &mut Ctx<Self>) -> u64 {
        self.n
    }
}

fn main() {}
