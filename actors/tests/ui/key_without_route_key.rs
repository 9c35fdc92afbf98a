use mailring_actors::{Actor, Ctx, Handler, Message};

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct TenantId(u64);

#[derive(Message)]
struct Ping;

#[derive(Actor)]
#[actor(key = TenantId, handles(Ping))]
struct Tenant;

impl Handler<Ping> for Tenant {
    async fn handle(&mut self, _m: Ping, _cx: &mut Ctx<Self>) {}
}

fn main() {}
