use mailring_actors::Actor;

#[derive(Actor)]
#[actor(activate = Counter::new)]
struct Counter;

impl Counter {
    fn new(_k: &u64) -> Self {
        Counter
    }
}

fn main() {}
