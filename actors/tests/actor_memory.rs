//! What an idle keyed actor costs in heap, measured with a counting global
//! allocator (live heap bytes), in a binary with this one test so nothing
//! else allocates meanwhile.
//!
//! An activation keeps its actor in its cell; its task's message loop
//! borrows it there. Moved out into the task instead, the task's future
//! would keep room for the actor beside the cell's for the activation's
//! whole life: twice the actor's size for every idle actor (a broker's
//! streams, a gateway's sessions).

use mailring_actors::{Actor, ActorSystem, Ctx, Handler, Message, Runtime, ShardId};

#[path = "../../transports/tests/support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::live;

const STATE: usize = 16 << 10;
const ACTORS: u64 = 500;

#[derive(Actor)]
#[actor(key = u64, activate = Big::new, handles(Touch))]
struct Big {
    state: [u8; STATE],
}

impl Big {
    fn new(key: &u64) -> Self {
        Big {
            state: [*key as u8; STATE],
        }
    }
}

#[derive(Message)]
#[message(reply = u8)]
struct Touch;

impl Handler<Touch> for Big {
    async fn handle(&mut self, _m: Touch, _cx: &mut Ctx<Self>) -> u8 {
        self.state[STATE - 1]
    }
}

#[test]
fn an_idle_actor_holds_its_state_once() {
    let sys = ActorSystem::start(Runtime::builder().shards(1)).expect("io_uring available");
    let h = sys.handle();
    let rt = sys.runtime().clone();
    let per_actor = sys.block_on(async move {
        rt.spawn_on(ShardId::new(0), async move {
            // The shard's tables warmed up before the count starts.
            for key in 0..ACTORS {
                h.keyed::<Big>(key).ask(Touch).await.expect("answered");
            }
            let before = live();
            for key in ACTORS..2 * ACTORS {
                assert_eq!(
                    h.keyed::<Big>(key).ask(Touch).await.expect("answered"),
                    key as u8
                );
            }
            // A second message each, the actors idle in between.
            for key in ACTORS..2 * ACTORS {
                h.keyed::<Big>(key).ask(Touch).await.expect("answered");
            }
            (live() - before) / ACTORS as isize
        })
        .await
        .expect("the asking task")
    });
    eprintln!("an idle actor of {STATE} bytes of state grew the heap by {per_actor} bytes");
    assert!(
        per_actor < (STATE + STATE / 4) as isize,
        "an idle actor of {STATE} bytes of state grew the heap by {per_actor} bytes"
    );
    sys.shutdown();
}
