use mailring_actors::{Actor, ActorSystem, Ctx, Handler, Message, Placement, Runtime};

#[derive(Actor, Default)]
#[actor(handles(Ping))]
struct Counter;

#[derive(Message)]
struct Ping;

#[derive(Message)]
struct Pong;

impl Handler<Ping> for Counter {
    async fn handle(&mut self, _m: Ping, _cx: &mut Ctx<Self>) {}
}

impl Handler<Pong> for Counter {
    async fn handle(&mut self, _m: Pong, _cx: &mut Ctx<Self>) {}
}

fn main() {
    let system = ActorSystem::start(Runtime::builder().shards(1)).unwrap();
    let c = system.spawn_actor(Placement::RoundRobin, Counter::default);
    let _ = c.tell(Pong);
}
