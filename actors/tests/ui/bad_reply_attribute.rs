use mailring_actors::Message;

#[derive(Message)]
#[message(response = u64)]
struct Get;

fn main() {}
