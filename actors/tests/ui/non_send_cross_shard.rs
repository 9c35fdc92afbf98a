use std::rc::Rc;

use mailring_actors::{Actor, ActorSystem, Ctx, Handler, Message, Runtime};

#[derive(Actor, Default)]
#[actor(handles(Shared))]
struct Holder;

#[derive(Message)]
struct Shared(Rc<u64>);

impl Handler<Shared> for Holder {
    async fn handle(&mut self, _m: Shared, _cx: &mut Ctx<Self>) {}
}

fn main() {
    let system = ActorSystem::start(Runtime::builder()).unwrap();
    let h = system.spawn_actor(mailring_actors::Placement::RoundRobin, Holder::default);
    // An Addr may cross shards, so its messages must be Send.
    let _ = h.tell(Shared(Rc::new(1)));
}
