use mailring_actors::Actor;

#[derive(Actor)]
struct Holder<'a> {
    value: &'a str,
}

fn main() {}
