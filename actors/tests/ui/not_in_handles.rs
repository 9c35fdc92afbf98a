use mailring_actors::{Actor, ActorSystem, Ctx, Handler, Message, Runtime};

#[derive(Actor, Default)]
#[actor(handles(Ping, Stop))]
struct Counter;

#[derive(Message)]
struct Ping;

#[derive(Message)]
struct Pong;

#[derive(Message)]
struct Stop;

impl Handler<Stop> for Counter {
    async fn handle(&mut self, _m: Stop, _cx: &mut Ctx<Self>) {}
}

impl Handler<Ping> for Counter {
    async fn handle(&mut self, _m: Ping, _cx: &mut Ctx<Self>) {}
}

impl Handler<Pong> for Counter {
    async fn handle(&mut self, _m: Pong, _cx: &mut Ctx<Self>) {}
}

fn main() {
    let system = ActorSystem::start(Runtime::builder()).unwrap();
    let c = system.spawn_actor(mailring_actors::Placement::RoundRobin, Counter::default);
    let _ = c.tell(Pong);
}
