//! A test kit: start a system with N shards in a test, move its clock to
//! drive timers, idle timeouts and ask deadlines without waiting, and check
//! where actors run.
//!
//! ```
//! use std::time::Duration;
//! use mailring_actors::testkit::TestSystem;
//! use mailring_actors::{Actor, Ctx, Handler, Message};
//!
//! #[derive(Actor, Default)]
//! #[actor(key = u32, activate = Session::new, idle_timeout_ms = 60000, handles(Touch))]
//! struct Session;
//! impl Session { fn new(_: &u32) -> Self { Session } }
//!
//! #[derive(Message)]
//! struct Touch;
//! impl Handler<Touch> for Session {
//!     async fn handle(&mut self, _m: Touch, _cx: &mut Ctx<Self>) {}
//! }
//!
//! let kit = TestSystem::start(2);
//! let s = kit.keyed::<Session>(7);
//! s.tell(Touch).unwrap();
//! assert_eq!(kit.active_on(&s), Some(s.shard()));
//! kit.advance(Duration::from_secs(61)); // the idle timeout passes at once
//! assert_eq!(kit.active_on(&s), None);
//! ```

use std::ops::Deref;
use std::time::Duration;

use mailring::{Runtime, ShardId};

use crate::actor::Actor;
use crate::addr::Addr;
use crate::local;
use crate::system::{ActorSystem, SystemConfig, SystemHandle};

/// An [`ActorSystem`] for tests; it derefs to the system.
#[derive(Debug)]
pub struct TestSystem {
    system: ActorSystem,
}

impl Deref for TestSystem {
    type Target = ActorSystem;

    fn deref(&self) -> &ActorSystem {
        &self.system
    }
}

impl TestSystem {
    /// Starts a system with `shards` shards (actors still running a handler
    /// at the end of the test get half a second to stop).
    ///
    /// # Panics
    ///
    /// When io_uring is unavailable (the message names the cause and remedy).
    pub fn start(shards: usize) -> TestSystem {
        let config = SystemConfig {
            shutdown_grace: Duration::from_millis(500),
            ..SystemConfig::default()
        };
        match ActorSystem::start_with(Runtime::builder().shards(shards), config) {
            Ok(system) => TestSystem { system },
            Err(e) => panic!("cannot start the test actor system: {e}"),
        }
    }

    /// The system.
    pub fn system(&self) -> &ActorSystem {
        &self.system
    }

    /// Moves the system's clock forward by `by` and lets every shard fire
    /// what became due (timers, idle timeouts, ask deadlines) and run what
    /// that woke. Work those handlers start in turn may still be running:
    /// synchronise on it with an `ask`.
    pub fn advance(&self, by: Duration) {
        self.system.runtime().advance_clock(by);
        self.settle();
    }

    /// Lets every shard run what is ready now (a few rounds of its loop).
    pub fn settle(&self) {
        for _ in 0..3 {
            let rt = self.system.runtime().clone();
            self.system.block_on(async move {
                let joins: Vec<_> = (0..rt.shards())
                    .map(|i| {
                        rt.spawn_on(ShardId::new(i), async {
                            mailring::yield_now().await;
                        })
                    })
                    .collect();
                for j in joins {
                    let _ = j.await;
                }
            });
        }
    }

    /// The shard on which `addr`'s actor is active now, if it is.
    pub fn active_on<A: Actor>(&self, addr: &Addr<A>) -> Option<ShardId> {
        self.settle();
        let rt = self.system.runtime().clone();
        let system = addr.system.arc().clone();
        let target = addr.target_id();
        self.system.block_on(async move {
            for i in 0..rt.shards() {
                let system = system.clone();
                let target = target.clone();
                let found = rt
                    .spawn_on(ShardId::new(i), async move {
                        local::type_state::<A>(&system)
                            .and_then(|ts| ts.find(&target))
                            .is_some_and(|c| c.is_open())
                    })
                    .await
                    .unwrap_or(false);
                if found {
                    return Some(ShardId::new(i));
                }
            }
            None
        })
    }
}

/// Runs `make(shard)`'s future on every shard of `system` at once and waits
/// for all of them, for at most `within` (`None` once it has passed: a
/// test of something that must finish fails instead of hanging). Call it
/// from a task of the system (`block_on`).
///
/// ```
/// use std::time::Duration;
/// use mailring_actors::testkit::{on_every_shard, TestSystem};
///
/// let kit = TestSystem::start(2);
/// let handle = kit.handle();
/// let shards = kit.block_on(async move {
///     on_every_shard(&handle, Duration::from_secs(5), |shard| async move { shard.index() }).await
/// });
/// assert_eq!(shards, Some(vec![0, 1]));
/// ```
pub async fn on_every_shard<F, Fut>(
    system: &SystemHandle,
    within: Duration,
    mut make: F,
) -> Option<Vec<Fut::Output>>
where
    F: FnMut(ShardId) -> Fut,
    Fut: std::future::Future + Send + 'static,
    Fut::Output: Send + 'static,
{
    let rt = system.runtime();
    let joins: Vec<_> = (0..rt.shards())
        .map(|i| rt.spawn_on(ShardId::new(i), make(ShardId::new(i))))
        .collect();
    let all = async move {
        let mut out = Vec::with_capacity(joins.len());
        for j in joins {
            out.push(j.await.expect("a task on every shard panicked"));
        }
        out
    };
    mailring::time::timeout(within, all).await.ok()
}
