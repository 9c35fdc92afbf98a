use mailring_actors::Actor;

#[derive(Actor)]
#[actor(key = u64, mailbox_size = 10)]
struct Counter;

fn main() {}
