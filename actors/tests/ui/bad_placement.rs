use mailring_actors::Actor;

#[derive(Actor)]
#[actor(key = u64, placement = "everywhere")]
struct Counter;

fn main() {}
