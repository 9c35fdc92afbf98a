use mailring_actors::Actor;

#[derive(Actor)]
struct Holder<T: 'static> {
    value: T,
}

fn main() {}
