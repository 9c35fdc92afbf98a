//! Actor systems started on a runtime built elsewhere: one set of threads,
//! several systems, each with its own credit tags.

use mailring_actors::mailring::{Handle, Runtime as Rt};
use mailring_actors::{
    Actor, ActorSystem, Ctx, Handler, Message, Placement, Runtime, ShardId, SystemConfig,
};

/// Replies whether it runs on a shard of the runtime it is given.
#[derive(Message)]
#[message(reply = bool)]
struct OnRuntime(Handle);

#[derive(Message)]
struct Bump;

#[derive(Message)]
#[message(reply = u64)]
struct Total;

#[derive(Actor, Default)]
#[actor(handles(OnRuntime, Bump, Total))]
struct Probe {
    n: u64,
}

impl Handler<OnRuntime> for Probe {
    async fn handle(&mut self, m: OnRuntime, _cx: &mut Ctx<Self>) -> bool {
        m.0.local_shard().is_some()
    }
}

impl Handler<Bump> for Probe {
    async fn handle(&mut self, _m: Bump, _cx: &mut Ctx<Self>) {
        self.n += 1;
    }
}

impl Handler<Total> for Probe {
    async fn handle(&mut self, _m: Total, _cx: &mut Ctx<Self>) -> u64 {
        self.n
    }
}

fn runtime() -> Rt {
    Runtime::builder()
        .shards(2)
        .build()
        .expect("io_uring available")
}

fn small_window() -> SystemConfig {
    SystemConfig {
        cross_shard_window: 4,
        ..SystemConfig::default()
    }
}

#[test]
fn a_system_started_on_a_runtime_runs_its_actors_on_that_runtimes_shards() {
    let rt = runtime();
    let sys = ActorSystem::start_on(rt.handle(), SystemConfig::default()).unwrap();
    let p = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Probe::default);
    let h = rt.handle().clone();
    assert_eq!(
        sys.block_on(async move { p.ask(OnRuntime(h)).await }),
        Ok(true)
    );
    let report = sys.shutdown();
    assert_eq!(report.actors_stopped, 1);
    // The runtime is the caller's, and still runs.
    assert_eq!(rt.block_on(async { 5 }), 5);
    assert!(rt.shutdown().is_clean());
}

#[test]
fn two_systems_on_one_runtime_keep_their_credit_windows_apart() {
    let rt = runtime();
    let systems: Vec<_> = (0..2)
        .map(|_| ActorSystem::start_on(rt.handle(), small_window()).unwrap())
        .collect();
    // Each system's producer on shard 0 waits for credit (a window of 4)
    // to its actor on shard 1, both at once: credits returned to one
    // system must not be taken by the other.
    let joins: Vec<_> = systems
        .iter()
        .map(|sys| {
            let p = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Probe::default);
            rt.handle().spawn_on(ShardId::new(0), async move {
                for _ in 0..2_000 {
                    p.send(Bump).await.unwrap();
                }
                p.ask(Total).await.unwrap()
            })
        })
        .collect();
    let totals: Vec<u64> = joins.into_iter().map(|j| rt.block_on(j).unwrap()).collect();
    assert_eq!(totals, [2_000, 2_000]);
    for sys in systems {
        assert_eq!(sys.shutdown().actors_stopped, 1);
    }
    rt.shutdown();
}

#[test]
fn a_system_dropped_on_its_runtimes_shard_stops_its_actors_and_leaves_the_runtime() {
    let rt = runtime();
    let h = rt.handle().clone();
    let stopped = rt.block_on(async move {
        let sys = ActorSystem::start_on(&h, SystemConfig::default()).unwrap();
        let p = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Probe::default);
        p.tell(Bump).unwrap();
        let watch = p.stopped();
        drop(sys); // On shard 0: finishes on a thread of its own.
        watch.await.reason
    });
    assert_eq!(stopped, mailring_actors::StopReason::Shutdown);
    assert_eq!(rt.block_on(async { 1 }), 1);
}

#[derive(Message)]
struct Stall(std::time::Duration);

#[derive(Actor, Default)]
#[actor(handles(Stall))]
struct Staller;

impl Handler<Stall> for Staller {
    async fn handle(&mut self, m: Stall, _cx: &mut Ctx<Self>) {
        // A handler that never yields: its shard runs nothing meanwhile.
        std::thread::sleep(m.0);
    }
}

/// A shard stuck in a handler that never yields sends no figures within
/// the grace period (and the second after it): the report says so and
/// is not clean, with the other shards' figures, rather than an empty
/// report that reads as a clean stop.
#[test]
fn a_shutdown_whose_figures_do_not_come_in_time_is_not_clean() {
    let rt = runtime();
    let config = SystemConfig {
        shutdown_grace: std::time::Duration::from_millis(100),
        ..SystemConfig::default()
    };
    let sys = ActorSystem::start_on(rt.handle(), config).unwrap();
    let _idle = sys.spawn_actor(Placement::Pinned(ShardId::new(0)), Probe::default);
    let stuck = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Staller::default);
    stuck
        .tell(Stall(std::time::Duration::from_secs(3)))
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50));
    let report = sys.shutdown();
    assert!(!report.is_clean(), "{report:?}");
    // Shard 0's idle actor stopped; shard 1 said nothing.
    assert_eq!(
        (report.actors_stopped, report.shards_unreported),
        (1, 1),
        "{report:?}"
    );
    drop(rt);
}

/// Sets its flag when dropped.
struct DropFlag(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

#[derive(Actor)]
#[actor(key = u32, handles(Bump))]
struct Late;

impl Handler<Bump> for Late {
    async fn handle(&mut self, _m: Bump, _cx: &mut Ctx<Self>) {}
}

/// A handle kept past the system's shutdown (the runtime goes on serving):
/// what it registers then is not kept, so a factory holding the system's
/// handle, a named `Addr` or a named topic cannot keep the system alive
/// for ever.
#[test]
fn what_is_registered_after_shutdown_is_not_kept() {
    let rt = runtime();
    let sys = ActorSystem::start_on(rt.handle(), SystemConfig::default()).unwrap();
    let handle = sys.handle();
    let probe = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Probe::default);
    sys.shutdown();
    let dropped = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = DropFlag(dropped.clone());
    let held = handle.clone();
    handle.register_factory::<Late>(move |_| {
        let _ = (&flag, &held);
        Late
    });
    assert!(
        dropped.load(std::sync::atomic::Ordering::SeqCst),
        "the factory (and the handle it holds) was kept"
    );
    handle.register_name("probe", probe);
    assert!(handle.lookup::<Probe>("probe").is_none());
    drop(handle);
    assert!(rt.shutdown().is_clean());
}

/// Systems started on a runtime and shut down give their credit tags
/// back: a runtime with room for two systems' tags at a time runs any
/// number of them one after another. Credits still on their way when a
/// system ends, and sends through an address the ended system left
/// behind, never reach the next owner of its tags (a window credited
/// twice, or robbed, would let its sender past the window or hold it for
/// good).
#[test]
fn systems_started_and_shut_down_in_turn_reuse_their_credit_tags() {
    let rt = runtime();
    // Every dynamic tag but six taken: room for three 2-shard systems
    // (the last tag, `u16::MAX`, is never handed out), so a release that
    // finishes after its shutdown stopped waiting for it does not fail
    // the next start.
    let all = u16::MAX - mailring_actors::mailring::hot::DYNAMIC_HOT_TAGS;
    rt.handle().register_hot_tags(all - 6).unwrap();
    let mut left_behind: Option<mailring_actors::Addr<Probe>> = None;
    for round in 0..12 {
        let sys = ActorSystem::start_on(rt.handle(), small_window())
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        let p = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Probe::default);
        let old = left_behind.take();
        let total = rt
            .block_on(rt.handle().spawn_on(ShardId::new(0), async move {
                for i in 0..500 {
                    // The ended system's address, used now and then.
                    if let Some(old) = &old {
                        if i % 50 == 0 {
                            let _ = old.tell(Bump);
                            let _ = old.send(Bump).await;
                        }
                    }
                    p.send(Bump).await.unwrap();
                }
                let total = p.ask(Total).await.unwrap();
                // Messages left in flight as the system ends.
                for _ in 0..3 {
                    let _ = p.tell(Bump);
                }
                (total, p)
            }))
            .unwrap();
        assert_eq!(total.0, 500, "round {round}");
        left_behind = Some(total.1);
        let report = sys.shutdown();
        assert!(report.is_clean(), "round {round}: {report:?}");
    }
    assert!(rt.shutdown().is_clean());
}
