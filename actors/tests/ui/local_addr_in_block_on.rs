use mailring_actors::{Actor, ActorSystem, Ctx, Handler, Message, Placement, Runtime, ShardId};

#[derive(Actor, Default)]
#[actor(handles(Ping))]
struct Pinger;

#[derive(Message)]
#[message(reply = u8)]
struct Ping;

impl Handler<Ping> for Pinger {
    async fn handle(&mut self, _m: Ping, _cx: &mut Ctx<Self>) -> u8 {
        1
    }
}

fn main() {
    let system = ActorSystem::start(Runtime::builder()).unwrap();
    let p = system.spawn_actor(Placement::Pinned(ShardId::new(0)), Pinger::default);
    // A LocalAddr is `!Send`: held across an await, the future is `!Send`
    // too, and `block_on` needs a `Send` future (`block_on_local` does not).
    let _ = system.block_on(async move {
        let local = p.local().unwrap();
        local.ask(Ping).await
    });
}
