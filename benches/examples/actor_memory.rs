//! Heap per idle actor: mailring's keyed actors against kameo, ractor and
//! actix actors, each made, asked once, then left idle.
//!
//! ```text
//! cargo run --release -p mailring-bench --example actor_memory -- [actors]
//! ```
//!
//! Each contender runs in a process of its own (this program started
//! again with the contender's name), with a counting global allocator:
//! the figure is live heap bytes (not RSS) grown by `actors` actors (default
//! 100,000) past 1,000 made first, divided by their count. The actors hold
//! one `u64`. A mailring keyed actor needs no reference kept (its key finds
//! it); the others' references (`ActorRef`, `Addr`) are kept, as a program
//! must to reach them again, in a `Vec` sized before the count starts.
//! kameo's actors get its default mailbox (bounded, 64).

use std::process::Command;

#[path = "../../transports/tests/support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::live;

/// Actors made before the count starts (tables and pools warmed up).
const WARM: u64 = 1_000;

const CONTENDERS: [&str; 4] = ["mailring", "kameo", "ractor", "actix"];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(contender) = args.first().filter(|a| CONTENDERS.contains(&a.as_str())) {
        let actors: u64 = args.get(1).and_then(|n| n.parse().ok()).unwrap_or(100_000);
        let grown = match contender.as_str() {
            "mailring" => with_mailring::grown(actors),
            "kameo" => with_kameo::grown(actors),
            "ractor" => with_ractor::grown(actors),
            _ => with_actix::grown(actors),
        };
        println!("{}", grown / actors as isize);
        return;
    }
    let actors: u64 = args.first().and_then(|n| n.parse().ok()).unwrap_or(100_000);
    let exe = std::env::current_exe().expect("own path");
    println!("# heap per idle actor ({actors} actors, each asked once; counting allocator)");
    println!("| contender | bytes per actor |");
    println!("| --- | --- |");
    for contender in CONTENDERS {
        let out = Command::new(&exe)
            .args([contender, &actors.to_string()])
            .output()
            .expect("run a contender");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{contender} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        println!("| {contender} | {} |", text.trim());
    }
}

/// Heap grown by `actors` actors that `make` makes (each asked once), their
/// references kept, after `WARM` made first.
async fn kept<T, F: std::future::Future<Output = T>>(actors: u64, make: impl Fn() -> F) -> isize {
    let mut warm = Vec::with_capacity(WARM as usize);
    for _ in 0..WARM {
        warm.push(make().await);
    }
    let mut kept = Vec::with_capacity(actors as usize);
    let before = live();
    for _ in 0..actors {
        kept.push(make().await);
    }
    live() - before
}

/// Runs `f` on a current-thread Tokio runtime (kameo's and ractor's actors
/// are Tokio tasks).
fn on_tokio(f: impl std::future::Future<Output = isize>) -> isize {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime")
        .block_on(f)
}

mod with_mailring {
    use mailring_actors::{Actor, ActorSystem, Ctx, Handler, Message, Runtime, ShardId};

    #[derive(Actor)]
    #[actor(key = u64, activate = Idle::new, handles(Ping))]
    struct Idle {
        asked: u64,
    }

    impl Idle {
        fn new(_key: &u64) -> Self {
            Idle { asked: 0 }
        }
    }

    #[derive(Message)]
    #[message(reply = u64)]
    struct Ping;

    impl Handler<Ping> for Idle {
        async fn handle(&mut self, _m: Ping, _cx: &mut Ctx<Self>) -> u64 {
            self.asked += 1;
            self.asked
        }
    }

    pub(super) fn grown(actors: u64) -> isize {
        let sys = ActorSystem::start(Runtime::builder().shards(1)).expect("io_uring available");
        let h = sys.handle();
        let rt = sys.runtime().clone();
        let grown = sys.block_on(async move {
            rt.spawn_on(ShardId::new(0), async move {
                for key in 0..super::WARM {
                    h.keyed::<Idle>(key).ask(Ping).await.expect("answered");
                }
                let before = super::live();
                for key in super::WARM..super::WARM + actors {
                    h.keyed::<Idle>(key).ask(Ping).await.expect("answered");
                }
                super::live() - before
            })
            .await
            .expect("the asking task")
        });
        sys.shutdown();
        grown
    }
}

mod with_kameo {
    use kameo::actor::{ActorRef, Spawn};
    use kameo::message::{Context, Message};
    use kameo::Actor;

    #[derive(Actor, Default)]
    struct Idle {
        asked: u64,
    }

    struct Ping;

    impl Message<Ping> for Idle {
        type Reply = u64;

        async fn handle(&mut self, _m: Ping, _ctx: &mut Context<Self, Self::Reply>) -> u64 {
            self.asked += 1;
            self.asked
        }
    }

    async fn make() -> ActorRef<Idle> {
        let actor = Idle::spawn(Idle::default());
        actor.ask(Ping).await.expect("answered");
        actor
    }

    pub(super) fn grown(actors: u64) -> isize {
        super::on_tokio(super::kept(actors, make))
    }
}

mod with_ractor {
    use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

    struct Idle;

    enum IdleMsg {
        Ping(RpcReplyPort<u64>),
    }

    impl Actor for Idle {
        type Msg = IdleMsg;
        type State = u64;
        type Arguments = ();

        async fn pre_start(
            &self,
            _myself: ActorRef<Self::Msg>,
            _args: (),
        ) -> Result<u64, ActorProcessingErr> {
            Ok(0)
        }

        async fn handle(
            &self,
            _myself: ActorRef<Self::Msg>,
            message: Self::Msg,
            asked: &mut u64,
        ) -> Result<(), ActorProcessingErr> {
            let IdleMsg::Ping(reply) = message;
            *asked += 1;
            reply.send(*asked)?;
            Ok(())
        }
    }

    async fn make() -> (ActorRef<IdleMsg>, tokio::task::JoinHandle<()>) {
        let (actor, handle) = Actor::spawn(None, Idle, ()).await.expect("spawned");
        ractor::call!(actor, IdleMsg::Ping).expect("answered");
        (actor, handle)
    }

    pub(super) fn grown(actors: u64) -> isize {
        super::on_tokio(super::kept(actors, make))
    }
}

mod with_actix {
    use actix::prelude::*;

    struct Idle {
        asked: u64,
    }

    impl Actor for Idle {
        type Context = Context<Self>;
    }

    #[derive(Message)]
    #[rtype(result = "u64")]
    struct Ping;

    impl Handler<Ping> for Idle {
        type Result = u64;

        fn handle(&mut self, _m: Ping, _ctx: &mut Context<Self>) -> u64 {
            self.asked += 1;
            self.asked
        }
    }

    async fn make() -> Addr<Idle> {
        let actor = Idle { asked: 0 }.start();
        actor.send(Ping).await.expect("answered");
        actor
    }

    pub(super) fn grown(actors: u64) -> isize {
        System::new().block_on(super::kept(actors, make))
    }
}
