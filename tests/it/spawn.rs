//! Spawning, placement, join handles, panics, abort, stealing.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use mailring::{current_shard, sticky_shard, Placement, ShardId};

use crate::rt2;

#[test]
fn block_on_returns_output() {
    let rt = rt2();
    assert_eq!(rt.block_on(async { 40 + 2 }), 42);
}

#[test]
fn spawn_on_runs_on_that_shard() {
    let rt = rt2();
    let shards = rt.block_on(async {
        let a = mailring::spawn_on(ShardId::new(0), async { current_shard() });
        let b = mailring::spawn_on(ShardId::new(1), async { current_shard() });
        (a.await.unwrap(), b.await.unwrap())
    });
    assert_eq!(shards, (Some(ShardId::new(0)), Some(ShardId::new(1))));
}

#[test]
fn sticky_placement_follows_the_hash() {
    let rt = rt2();
    rt.block_on(async {
        for key in 0..64u64 {
            let ran_on =
                mailring::spawn_with(Placement::Sticky(key), async { current_shard().unwrap() })
                    .await
                    .unwrap();
            assert_eq!(ran_on, sticky_shard(&key, 2), "key {key}");
        }
    });
}

#[test]
fn round_robin_alternates() {
    let rt = rt2();
    let shards = rt.block_on(async {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.push(
                mailring::spawn_with(Placement::RoundRobin, async {
                    current_shard().unwrap().index()
                })
                .await
                .unwrap(),
            );
        }
        v
    });
    assert_eq!(shards[0] ^ shards[1], 1);
    assert_eq!(shards[0], shards[2]);
}

#[test]
fn spawn_from_outside_thread_runs() {
    let rt = rt2();
    let h = rt.handle().spawn(async { 7 });
    assert_eq!(mailring_block(h), 7);
    let h = rt
        .handle()
        .spawn_on(ShardId::new(1), async { current_shard() });
    assert_eq!(mailring_block(h), Some(ShardId::new(1)));
}

fn mailring_block<T: Send + 'static>(h: mailring::JoinHandle<T>) -> T {
    let rt = mailring::Runtime::builder().shards(1).build().unwrap();
    rt.block_on(async move { h.await.unwrap() })
}

#[test]
fn spawn_local_accepts_non_send_futures() {
    let rt = rt2();
    let n = rt.block_on_local(|| async {
        let state = Rc::new(RefCell::new(0));
        let mut handles = Vec::new();
        for i in 0..10 {
            let state = state.clone();
            handles.push(mailring::spawn_local(async move {
                mailring::yield_now().await;
                *state.borrow_mut() += i;
                current_shard()
            }));
        }
        for h in handles {
            assert_eq!(h.await.unwrap(), Some(ShardId::new(0)));
        }
        let v = *state.borrow();
        v
    });
    assert_eq!(n, 45);
}

#[test]
fn spawn_local_on_builds_the_future_on_the_target_shard() {
    let rt = rt2();
    let h = rt.handle().spawn_local_on(ShardId::new(1), || {
        let rc = Rc::new(5);
        async move {
            mailring::yield_now().await;
            (*rc, current_shard())
        }
    });
    let out = rt.block_on(async move { h.await.unwrap() });
    assert_eq!(out, (5, Some(ShardId::new(1))));
}

#[test]
fn panicking_task_reports_to_its_joiner_and_the_shard_survives() {
    let rt = rt2();
    rt.block_on(async {
        let h = mailring::spawn_on(ShardId::new(1), async {
            panic!("boom");
        });
        let err = h.await.unwrap_err();
        assert!(err.is_panic());
        assert!(err.to_string().contains("boom"), "{err}");
        let after = mailring::spawn_on(ShardId::new(1), async { 1 })
            .await
            .unwrap();
        assert_eq!(after, 1);
    });
}

#[test]
fn abort_cancels_a_pending_task() {
    let rt = rt2();
    rt.block_on(async {
        let dropped = Arc::new(AtomicUsize::new(0));
        struct Guard(Arc<AtomicUsize>);
        impl Drop for Guard {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let g = Guard(dropped.clone());
        let h = mailring::spawn_on(ShardId::new(1), async move {
            let _g = g;
            std::future::pending::<()>().await;
        });
        mailring::time::sleep(std::time::Duration::from_millis(5)).await;
        h.abort();
        let err = h.await.unwrap_err();
        assert!(err.is_cancelled());
        assert_eq!(dropped.load(Ordering::SeqCst), 1, "the future was dropped");
    });
}

#[test]
fn outputs_of_detached_and_unread_handles_are_dropped() {
    // An output whose handle was detached before or after the task finished,
    // or never awaited, is dropped, never leaked.
    let rt = rt2();
    let output = Arc::new(());
    let o = output.clone();
    rt.block_on(async move {
        for i in 0..200 {
            let value = o.clone();
            let h = mailring::spawn_on(ShardId::new(i % 2), async move { value });
            if i % 3 == 0 {
                // Likely before it finished.
                h.detach();
            } else {
                while !h.is_finished() {
                    mailring::yield_now().await;
                }
                if i % 3 == 1 {
                    h.detach();
                } else {
                    drop(h);
                }
            }
        }
    });
    for _ in 0..1000 {
        if Arc::strong_count(&output) == 1 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(Arc::strong_count(&output), 1, "an output leaked");
}

#[test]
fn detached_tasks_still_run() {
    let rt = rt2();
    let hits = Arc::new(AtomicUsize::new(0));
    let h2 = hits.clone();
    rt.block_on(async move {
        for _ in 0..100 {
            let h = h2.clone();
            mailring::spawn(async move {
                h.fetch_add(1, Ordering::SeqCst);
            })
            .detach();
        }
        while h2.load(Ordering::SeqCst) < 100 {
            mailring::yield_now().await;
        }
    });
    assert_eq!(hits.load(Ordering::SeqCst), 100);
}

#[test]
fn cross_shard_wakes_reach_the_home_shard() {
    // A task on shard 1 waits on a channel fed from shard 0: every wake crosses shards.
    let rt = rt2();
    rt.block_on(async {
        let (tx, mut rx) = futures_channel();
        let consumer = mailring::spawn_on(ShardId::new(1), async move {
            let mut sum = 0u64;
            while let Some(v) = rx.recv().await {
                assert_eq!(current_shard(), Some(ShardId::new(1)));
                sum += v;
            }
            sum
        });
        for i in 0..10_000u64 {
            tx.send(i);
            if i % 100 == 0 {
                mailring::yield_now().await;
            }
        }
        drop(tx);
        assert_eq!(consumer.await.unwrap(), (0..10_000u64).sum::<u64>());
    });
}

#[test]
fn idle_shards_steal_unstarted_tasks() {
    let rt = rt2();
    let ran_on = rt.block_on(async {
        // Queue many stealable tasks on shard 0 while shard 0 is busy.
        let handles: Vec<_> = (0..200)
            .map(|_| {
                mailring::spawn_with(Placement::StealablePreferred(ShardId::new(0)), async {
                    let start = std::time::Instant::now();
                    while start.elapsed() < std::time::Duration::from_micros(200) {
                        std::hint::spin_loop();
                    }
                    current_shard().unwrap().index()
                })
            })
            .collect();
        let mut per_shard = [0usize; 2];
        for h in handles {
            per_shard[h.await.unwrap()] += 1;
        }
        per_shard
    });
    assert!(ran_on[1] > 0, "shard 1 stole nothing: {ran_on:?}");
    let stats = rt.stats();
    assert!(stats.shards[1].steal_successes > 0, "{stats:?}");
}

#[test]
fn blocking_pool_runs_off_the_shards() {
    let rt = rt2();
    let (on_shard, v) = rt.block_on(async {
        mailring::spawn_blocking(|| (mailring::current_shard(), 9))
            .await
            .unwrap()
    });
    assert_eq!(on_shard, None);
    assert_eq!(v, 9);
    let err = rt.block_on(async {
        mailring::spawn_blocking(|| panic!("blocking boom"))
            .await
            .unwrap_err()
    });
    assert!(err.is_panic());
}

/// Two dependent blocking jobs spawned back to back onto a pool with one idle
/// thread: the first waits for the second. The pool used to count the idle
/// thread it had just notified as still idle, so the second job started no
/// thread and waited behind the first for good.
#[test]
fn dependent_blocking_jobs_do_not_deadlock_on_one_idle_thread() {
    for round in 0..3 {
        let rt = mailring::Runtime::builder()
            .shards(1)
            .blocking_threads(4)
            .build()
            .expect("io_uring runtime");
        let handle = rt.handle().clone();
        // One pool thread, idle: it ran a job and is back waiting for work.
        rt.block_on(handle.spawn_blocking(|| ())).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));

        let (tx, rx) = std::sync::mpsc::channel::<u64>();
        let a = handle.spawn_blocking(move || rx.recv_timeout(std::time::Duration::from_secs(5)));
        let b = handle.spawn_blocking(move || tx.send(7).is_ok());
        let (a, b) = rt.block_on(async move { (a.await.unwrap(), b.await.unwrap()) });
        assert_eq!(
            a,
            Ok(7),
            "round {round}: the job waiting on the other never heard from it"
        );
        assert!(b, "round {round}");
    }
}

/// A minimal unbounded channel so the tests depend on nothing but mailring.
fn futures_channel() -> (Tx, Rx) {
    let inner = Arc::new(std::sync::Mutex::new(Chan {
        items: Default::default(),
        waker: None,
        closed: false,
    }));
    (Tx(inner.clone()), Rx(inner))
}

struct Chan {
    items: std::collections::VecDeque<u64>,
    waker: Option<std::task::Waker>,
    closed: bool,
}
struct Tx(Arc<std::sync::Mutex<Chan>>);
struct Rx(Arc<std::sync::Mutex<Chan>>);

impl Tx {
    fn send(&self, v: u64) {
        let mut c = self.0.lock().unwrap();
        c.items.push_back(v);
        if let Some(w) = c.waker.take() {
            w.wake();
        }
    }
}
impl Drop for Tx {
    fn drop(&mut self) {
        let mut c = self.0.lock().unwrap();
        c.closed = true;
        if let Some(w) = c.waker.take() {
            w.wake();
        }
    }
}
impl Rx {
    async fn recv(&mut self) -> Option<u64> {
        std::future::poll_fn(|cx| {
            let mut c = self.0.lock().unwrap();
            if let Some(v) = c.items.pop_front() {
                return std::task::Poll::Ready(Some(v));
            }
            if c.closed {
                return std::task::Poll::Ready(None);
            }
            c.waker = Some(cx.waker().clone());
            std::task::Poll::Pending
        })
        .await
    }
}

#[test]
fn a_burst_rings_one_doorbell_per_batch_not_per_message() {
    let rt = mailring::Runtime::builder()
        .shards(2)
        .idle_policy(mailring::IdlePolicy::Block)
        .build()
        .unwrap();
    let before = rt.stats().shards[0].doorbells_sent;
    rt.block_on(async {
        // Let shard 1 fall asleep.
        mailring::time::sleep(std::time::Duration::from_millis(20)).await;
        // 1000 spawns in one tick: one batch, one doorbell.
        let handles: Vec<_> = (0..1000u64)
            .map(|i| mailring::spawn_on(ShardId::new(1), async move { i }))
            .collect();
        let mut sum = 0;
        for h in handles {
            sum += h.await.unwrap();
        }
        assert_eq!(sum, 999 * 1000 / 2);
    });
    let stats = rt.stats();
    let rung = stats.shards[0].doorbells_sent - before;
    // The batch is flushed every 128 items: at most one doorbell per flush (8),
    // plus a few for wake-ups while joining; far from one per message.
    assert!(rung <= 11, "{rung} doorbells for one burst: {stats:?}");
    assert_eq!(stats.shards[1].inbox_items, 1000, "{stats:?}");
}

/// Five idle periods of 10 ms, each followed by a spawn on shard 1; returns
/// the runtime's stats after a clean shutdown.
fn idle_rounds_under(policy: mailring::IdlePolicy) -> mailring::RuntimeStats {
    let rt = mailring::Runtime::builder()
        .shards(2)
        .idle_policy(policy)
        .build()
        .unwrap();
    let started = std::time::Instant::now();
    let sum = rt.block_on(async {
        let mut sum = 0u64;
        for round in 0..5u64 {
            // Idle far past any spin budget: a `Spin` shard parks here.
            mailring::time::sleep(std::time::Duration::from_millis(10)).await;
            // The idle peer still takes a message at once.
            sum += mailring::spawn_on(ShardId::new(1), async move { round })
                .await
                .unwrap();
        }
        sum
    });
    assert_eq!(sum, 10);
    assert!(started.elapsed() >= std::time::Duration::from_millis(50));
    let stats = rt.stats();
    // Shutdown ends the poll.
    let report = rt.shutdown();
    assert!(report.is_clean(), "{report:?}");
    stats
}

#[test]
fn a_spinning_shard_blocks_at_once_while_threads_wait_for_cpus() {
    if std::fs::read_to_string("/proc/pressure/cpu").is_err() {
        eprintln!("SKIPPED: this kernel keeps no CPU pressure figure (PSI)");
        return;
    }
    // More busy threads than the machine has CPUs, for the test's length.
    // SAFETY: sysconf only reads a system setting.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hogs: Vec<_> = (0..=online)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    let rt = mailring::Runtime::builder()
        .shards(1)
        .idle_policy(mailring::IdlePolicy::Spin(
            std::time::Duration::from_micros(50),
        ))
        .build()
        .unwrap();
    rt.block_on(async {
        for _ in 0..100 {
            mailring::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    });
    stop.store(true, Ordering::Relaxed);
    for hog in hogs {
        hog.join().unwrap();
    }
    let stats = rt.stats();
    assert!(
        stats.shards[0].spins_skipped > 0,
        "the shard spun beside {} busy threads on {online} CPUs: {stats:?}",
        online + 1
    );
}

#[test]
fn idle_shards_stop_spinning_once_the_cpu_pressure_figure_shows_threads_waiting() {
    let path = std::env::temp_dir().join(format!("mailring-psi-{}", std::process::id()));
    let figure = |total: u64| {
        std::fs::write(
            &path,
            format!(
                "some avg10=0.00 avg60=0.00 avg300=0.00 total={total}\n\
                 full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
            ),
        )
        .unwrap()
    };
    figure(0);
    let mut faults = mailring::FaultInjection::default();
    faults.cpu_pressure_path = Some(path.clone());
    let rt = mailring::Runtime::builder()
        .shards(1)
        .idle_policy(mailring::IdlePolicy::Spin(
            std::time::Duration::from_micros(50),
        ))
        .fault_injection(faults)
        .build()
        .unwrap();
    let idle_periods = |n: usize| {
        rt.block_on(async move {
            for _ in 0..n {
                mailring::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        })
    };
    // Nobody waits: two windows and more, every idle period spins.
    idle_periods(120);
    assert_eq!(rt.stats().shards[0].spins_skipped, 0, "{:?}", rt.stats());
    // Threads waited for CPUs far more than a tenth of any window.
    figure(10_000_000_000);
    idle_periods(120);
    let skipped = rt.stats().shards[0].spins_skipped;
    assert!(skipped > 0, "{:?}", rt.stats());
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_polling_shard_never_parks_yet_fires_timers_takes_messages_and_shuts_down() {
    let stats = idle_rounds_under(mailring::IdlePolicy::Poll);
    for shard in &stats.shards {
        assert_eq!(shard.parks, 0, "a polling shard parked: {stats:?}");
    }
}

#[test]
fn a_polling_runtime_runs_file_io_and_blocking_jobs_and_outlives_a_panicking_task() {
    let rt = mailring::Runtime::builder()
        .shards(2)
        .idle_policy(mailring::IdlePolicy::Poll)
        .build()
        .unwrap();
    let path = std::env::temp_dir().join(format!("mailring-poll-{}", std::process::id()));
    let p = path.clone();
    let read = rt.block_on(async move {
        // File writes and the flush go through a kernel worker: the shard
        // blocks for them (the exception to polling) and must wake again.
        let file = mailring::fs::File::create(&p).await.unwrap();
        for i in 0..20u64 {
            let (r, _) = file.write_all_at(vec![i as u8; 4096], i * 4096).await;
            r.unwrap();
            file.sync_data().await.unwrap();
        }
        // A blocking job's result comes back from another thread.
        let n = mailring::spawn_blocking(|| 41 + 1).await.unwrap();
        assert_eq!(n, 42);
        // A task that panics on the other shard fails its handle only.
        let panicked = mailring::spawn_on(ShardId::new(1), async { panic!("user code") }).await;
        assert!(panicked.is_err());
        let (r, buf) = file.read_at(vec![0u8; 4096], 19 * 4096).await;
        assert_eq!(r.unwrap(), 4096);
        buf[0]
    });
    assert_eq!(read, 19);
    let stats = rt.stats();
    assert_eq!(stats.shards[1].parks, 0, "the idle shard parked: {stats:?}");
    let report = rt.shutdown();
    assert_eq!(report.panics.task, 1, "{report:?}");
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_spin_budget_of_duration_max_spins_and_shuts_down() {
    // No deadline is computed from the budget (`now + Duration::MAX` would
    // overflow): the shard spins, takes its messages and stops.
    let stats = idle_rounds_under(mailring::IdlePolicy::Spin(std::time::Duration::MAX));
    for shard in &stats.shards {
        // It parks only when it skipped a spin because threads were
        // waiting for CPUs (tests beside this one keep them busy).
        assert!(shard.parks <= shard.spins_skipped, "{stats:?}");
    }
}

#[test]
fn a_finished_tasks_deliveries_are_published_before_its_completion() {
    // A task on shard 1 hands closures to shard 0 and finishes. A task on
    // shard 0 that sees it finished (polling, not woken) and then applies
    // its inbox finds every closure run.
    let rt = rt2();
    let h = rt.handle().clone();
    let misses = rt.block_on(async move {
        let ran = Arc::new(AtomicUsize::new(0));
        let mut misses = 0;
        for round in 1..=200usize {
            let (h2, ran2) = (h.clone(), ran.clone());
            let sender = h.spawn_on(ShardId::new(1), async move {
                for _ in 0..round % 7 + 1 {
                    let ran = ran2.clone();
                    h2.run_on(ShardId::new(0), move || {
                        ran.fetch_add(1, Ordering::SeqCst);
                    });
                }
            });
            // Publish the spawn, then spin on this shard until it finished.
            mailring::time::sleep(std::time::Duration::from_micros(1)).await;
            while !sender.is_finished() {
                std::hint::spin_loop();
            }
            mailring::receive_pending();
            let expected: usize = (1..=round).map(|r| r % 7 + 1).sum();
            if ran.load(Ordering::SeqCst) != expected {
                misses += 1;
            }
            sender.await.unwrap();
        }
        misses
    });
    assert_eq!(misses, 0);
}

#[test]
fn prewake_rings_a_sleeping_shard_while_the_tick_goes_on() {
    let rt = mailring::Runtime::builder()
        .shards(2)
        .idle_policy(mailring::IdlePolicy::Block)
        .build()
        .unwrap();
    let h = rt.handle().clone();
    let (prewakes, woke_mid_tick) = rt.block_on(async move {
        // Let shard 1 fall asleep.
        mailring::time::sleep(std::time::Duration::from_millis(20)).await;
        let parks = h.stats().shards[1].parks;
        // On the same shard: nothing to do.
        mailring::prewake(ShardId::new(0));
        mailring::prewake(ShardId::new(1));
        // Without yielding: shard 1 wakes on the doorbell, finds nothing and
        // parks again, all while this tick runs.
        let t0 = std::time::Instant::now();
        let mut woke = false;
        while t0.elapsed() < std::time::Duration::from_secs(10) {
            if h.stats().shards[1].parks > parks {
                woke = true;
                break;
            }
            std::thread::yield_now();
        }
        (h.stats().shards[0].prewakes, woke)
    });
    assert!(woke_mid_tick, "shard 1 never woke during the tick");
    assert_eq!(prewakes, 1);
}

#[test]
fn a_pending_probe_sees_and_applies_what_another_shard_delivered() {
    let rt = rt2();
    let h = rt.handle().clone();
    let applied = rt.block_on(async move {
        assert_eq!(current_shard(), Some(ShardId::new(0)));
        let probe = mailring::PendingProbe::current().expect("on a shard");
        assert!(!probe.has_pending());
        let ran = Arc::new(AtomicUsize::new(0));
        let (h2, ran2) = (h.clone(), ran.clone());
        // A thread outside the runtime delivers a closure here while this
        // task keeps shard 0 busy.
        let sender = std::thread::spawn(move || {
            h2.run_on(ShardId::new(0), move || {
                ran2.fetch_add(1, Ordering::SeqCst);
            });
        });
        let t0 = std::time::Instant::now();
        while !probe.has_pending() && t0.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::yield_now();
        }
        sender.join().unwrap();
        assert!(probe.has_pending(), "the delivery never showed");
        assert_eq!(ran.load(Ordering::SeqCst), 0, "applied without a drain");
        probe.receive_pending();
        ran.load(Ordering::SeqCst)
    });
    assert_eq!(applied, 1);
    assert!(mailring::PendingProbe::current().is_none(), "off a shard");
}

/// A job that counts its runs on the shard it reached and goes back to the
/// sender's list, as a recycling layer would use it.
struct Recycled {
    runs_on: Arc<std::sync::Mutex<Vec<Option<ShardId>>>>,
    // Boxes on purpose: the test checks that the same allocation comes back.
    #[allow(clippy::vec_box)]
    spares: Arc<std::sync::Mutex<Vec<Box<Recycled>>>>,
}

impl mailring::ShardJob for Recycled {
    fn run(self: Box<Self>) {
        self.runs_on.lock().unwrap().push(current_shard());
        let spares = self.spares.clone();
        spares.lock().unwrap().push(self);
    }
}

#[test]
fn a_job_runs_on_its_shard_and_keeps_its_box() {
    let rt = rt2();
    let h = rt.handle().clone();
    let runs_on = Arc::new(std::sync::Mutex::new(Vec::new()));
    let spares = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (r2, s2) = (runs_on.clone(), spares.clone());
    let first_box = rt.block_on(async move {
        let job = Box::new(Recycled {
            runs_on: r2,
            spares: s2.clone(),
        });
        let first_box = &*job as *const Recycled as usize;
        h.send_job(ShardId::new(1), job);
        // The same box goes round again, from shard 0 each time.
        for _ in 0..10 {
            let job = loop {
                if let Some(job) = s2.lock().unwrap().pop() {
                    break job;
                }
                mailring::time::sleep(std::time::Duration::from_micros(50)).await;
            };
            h.send_job(ShardId::new(1), job);
        }
        first_box
    });
    // The last job records its run, then puts itself back: wait for both.
    let t0 = std::time::Instant::now();
    while (runs_on.lock().unwrap().len() < 11 || spares.lock().unwrap().is_empty())
        && t0.elapsed() < std::time::Duration::from_secs(10)
    {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(*runs_on.lock().unwrap(), vec![Some(ShardId::new(1)); 11]);
    let back = spares.lock().unwrap().pop().expect("the box came back");
    assert_eq!(&*back as *const Recycled as usize, first_box);
}

/// Counts its drops.
struct Dropped(Arc<AtomicUsize>, Arc<AtomicUsize>);

impl mailring::ShardJob for Dropped {
    fn run(self: Box<Self>) {
        self.1.fetch_add(1, Ordering::SeqCst);
    }
}

impl Drop for Dropped {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn a_job_sent_after_shutdown_is_dropped_unrun() {
    let rt = rt2();
    let h = rt.handle().clone();
    rt.shutdown();
    let (drops, runs) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    h.send_job(
        ShardId::new(1),
        Box::new(Dropped(drops.clone(), runs.clone())),
    );
    assert_eq!(drops.load(Ordering::SeqCst), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// Records each call in a shared log.
struct Logger(RefCell<Vec<usize>>);

impl mailring::TickEndHook for Logger {
    fn at_tick_end(&self, arg: usize) {
        self.0.borrow_mut().push(arg);
    }
}

#[test]
fn tick_end_hooks_run_once_per_queueing_in_order_with_closures() {
    let rt = rt2();
    let log = rt.block_on_local(|| async {
        let log = Rc::new(Logger(RefCell::new(Vec::new())));
        let hook: Rc<dyn mailring::TickEndHook> = log.clone();
        assert!(mailring::defer_hook_to_tick_end(hook.clone(), 1).is_ok());
        let l2 = log.clone();
        assert!(mailring::defer_to_tick_end(move || l2.0.borrow_mut().push(2)).is_ok());
        assert!(mailring::defer_hook_to_tick_end(hook.clone(), 3).is_ok());
        assert!(log.0.borrow().is_empty(), "ran before the tick ended");
        mailring::time::sleep(std::time::Duration::from_millis(1)).await;
        // A later tick reuses the list: its hooks run once, not again.
        assert!(mailring::defer_hook_to_tick_end(hook, 4).is_ok());
        mailring::time::sleep(std::time::Duration::from_millis(1)).await;
        let out = log.0.borrow().clone();
        out
    });
    assert_eq!(log, vec![1, 2, 3, 4]);
    // Off a shard the hook comes back.
    let hook: Rc<dyn mailring::TickEndHook> = Rc::new(Logger(RefCell::new(Vec::new())));
    assert!(mailring::defer_hook_to_tick_end(hook, 0).is_err());
}

thread_local! {
    /// The last round a `set` closure stored on this thread (shard 2 below).
    static LAST_SET: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Sends `check` for `round` to shard 2: it counts a miss unless the `set`
/// for that round ran there first.
fn send_check(
    h: &mailring::Handle,
    round: usize,
    checks: Arc<AtomicUsize>,
    misses: Arc<AtomicUsize>,
) {
    h.run_on(ShardId::new(2), move || {
        if LAST_SET.get() != round {
            misses.fetch_add(1, Ordering::SeqCst);
        }
        checks.fetch_add(1, Ordering::SeqCst);
    });
}

fn send_set(h: &mailring::Handle, round: usize) {
    h.run_on(ShardId::new(2), move || LAST_SET.set(round));
}

#[test]
fn deliveries_to_a_shard_keep_causal_order_whoever_sends_them() {
    // A `set` reaches shard 2 one way, then a `check` another way from a
    // sender that knew the `set` was sent; the check must find it applied.
    // The ways in are the locked queue (from outside a shard) and each
    // peer shard's ring, which a drain reads one after the other.
    let rt = mailring::Runtime::builder()
        .shards(3)
        .build()
        .expect("io_uring runtime");
    let h = rt.handle().clone();
    let checks = Arc::new(AtomicUsize::new(0));
    let misses = Arc::new(AtomicUsize::new(0));
    let mut round = 0;
    // One round at a time: a later round's set must not overtake a check.
    let wait_for = |n: usize| {
        while checks.load(Ordering::SeqCst) < n {
            std::thread::yield_now();
        }
    };
    for _ in 0..300 {
        // Outside (queue), then shard 0 (ring 0).
        round += 1;
        send_set(&h, round);
        let (h2, c, m) = (h.clone(), checks.clone(), misses.clone());
        h.run_on(ShardId::new(0), move || send_check(&h2, round, c, m));
        wait_for(round);
        // Shard 1 (ring 1), then shard 0 (ring 0, which a drain reads first).
        round += 1;
        let (h2, c, m) = (h.clone(), checks.clone(), misses.clone());
        h.run_on(ShardId::new(1), move || {
            send_set(&h2, round);
            let h3 = h2.clone();
            h2.run_on(ShardId::new(0), move || send_check(&h3, round, c, m));
        });
        wait_for(round);
        // Shard 0 (ring 0), then outside (queue) once the task that sent it
        // finished (its deliveries are published before its completion).
        round += 1;
        let h2 = h.clone();
        mailring_block(h.spawn_on(ShardId::new(0), async move { send_set(&h2, round) }));
        send_check(&h, round, checks.clone(), misses.clone());
        wait_for(round);
    }
    assert_eq!(misses.load(Ordering::SeqCst), 0);
}

#[test]
fn publish_now_delivers_a_batch_before_the_tick_ends() {
    // A task batches a closure for shard 1, then spins without yielding:
    // the tick cannot end, so only `publish_now` gets the closure there.
    let rt = rt2();
    let h = rt.handle().clone();
    let ran = rt.block_on(async move {
        let h2 = h.clone();
        h.spawn_on(ShardId::new(0), async move {
            let ran = Arc::new(AtomicUsize::new(0));
            let r = ran.clone();
            h2.run_on(ShardId::new(1), move || {
                r.fetch_add(1, Ordering::SeqCst);
            });
            mailring::publish_now();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while ran.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < deadline {
                std::hint::spin_loop();
            }
            ran.load(Ordering::SeqCst)
        })
        .await
        .unwrap()
    });
    assert_eq!(ran, 1);
}

// Misuse outside a runtime: the panic names the call the user made, not an
// internal one.

#[test]
#[should_panic(expected = "mailring::spawn called outside a mailring shard")]
fn spawn_outside_a_runtime_names_spawn() {
    drop(mailring::spawn(async {}));
}

#[test]
#[should_panic(expected = "mailring::spawn_on called outside a mailring shard")]
fn spawn_on_outside_a_runtime_names_spawn_on() {
    drop(mailring::spawn_on(ShardId::new(0), async {}));
}

#[test]
#[should_panic(expected = "mailring::spawn_with called outside a mailring shard")]
fn spawn_with_outside_a_runtime_names_spawn_with() {
    drop(mailring::spawn_with(Placement::Stealable, async {}));
}

#[test]
#[should_panic(expected = "mailring::spawn_blocking called outside a mailring shard")]
fn spawn_blocking_outside_a_runtime_names_spawn_blocking() {
    drop(mailring::spawn_blocking(|| ()));
}

#[test]
fn a_spawn_to_another_shard_runs_while_this_shard_works_through_its_queue() {
    use std::sync::atomic::AtomicBool;
    use std::time::{Duration, Instant};
    let rt = rt2();
    let ran = Arc::new(AtomicBool::new(false));
    let seen_while_busy = rt.block_on_local({
        let ran = ran.clone();
        move || async move {
            // Local work queued behind this task: it holds shard 0 until
            // it sees shard 1's task run (or gives up after 5 s).
            let busy = mailring::spawn_local({
                let ran = ran.clone();
                async move {
                    let give_up = Instant::now() + Duration::from_secs(5);
                    while !ran.load(Ordering::Acquire) && Instant::now() < give_up {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    ran.load(Ordering::Acquire)
                }
            });
            // A task for shard 1, sent in the same poll.
            let remote = mailring::spawn_with(Placement::Pinned(ShardId::new(1)), async move {
                ran.store(true, Ordering::Release);
            });
            let seen = busy.await.unwrap();
            remote.await.unwrap();
            seen
        }
    });
    // Shard 1 got its task when this task's poll ended, not at the end of
    // shard 0's tick, behind the queued work that waited for it.
    assert!(seen_while_busy, "shard 1 ran only after shard 0's queue");
    assert!(ran.load(Ordering::Acquire));
}

/// A guard inside a future that borrows another of the future's locals,
/// as any `async fn` may (`let a = ..; let b = Guard(&a); x.await`): it
/// checks, when dropped, that it still sits where it was when the future
/// was first polled, relative to what it borrows. A future moved after
/// that (pinning forbids it) would leave the borrow pointing at its old
/// place.
struct SelfBorrow<'a> {
    target: &'a u64,
    offset: std::cell::Cell<Option<isize>>,
    moved: Arc<AtomicUsize>,
}

impl SelfBorrow<'_> {
    fn offset_now(&self) -> isize {
        std::ptr::from_ref(self) as isize - std::ptr::from_ref(self.target) as isize
    }
}

impl Drop for SelfBorrow<'_> {
    fn drop(&mut self) {
        if self.offset.get() != Some(self.offset_now()) {
            self.moved.fetch_add(1, Ordering::SeqCst);
        }
    }
}

async fn borrows_itself(moved: Arc<AtomicUsize>, polled: Arc<AtomicUsize>) {
    let value = 7u64;
    let guard = SelfBorrow {
        target: &value,
        offset: std::cell::Cell::new(None),
        moved,
    };
    guard.offset.set(Some(guard.offset_now()));
    polled.fetch_add(1, Ordering::SeqCst);
    std::future::pending::<()>().await;
    drop(guard);
}

#[test]
fn a_future_cancelled_or_dropped_at_shutdown_is_dropped_where_it_was_pinned() {
    let moved = Arc::new(AtomicUsize::new(0));
    let polled = Arc::new(AtomicUsize::new(0));
    let rt = rt2();
    let (m, p) = (moved.clone(), polled.clone());
    rt.block_on(async move {
        let aborted = mailring::spawn_on(ShardId::new(1), borrows_itself(m.clone(), p.clone()));
        while p.load(Ordering::SeqCst) == 0 {
            mailring::yield_now().await;
        }
        aborted.abort();
        assert!(aborted.await.unwrap_err().is_cancelled());
        // Left pending for the shutdown to drop.
        drop(mailring::spawn_on(
            ShardId::new(0),
            borrows_itself(m, p.clone()),
        ));
        while p.load(Ordering::SeqCst) < 2 {
            mailring::yield_now().await;
        }
    });
    drop(rt);
    assert_eq!(polled.load(Ordering::SeqCst), 2);
    assert_eq!(
        moved.load(Ordering::SeqCst),
        0,
        "a future was moved before its drop"
    );
}

#[test]
fn closures_sent_to_a_shard_whose_thread_was_held_all_run_after() {
    // Shard 1's thread is held by a task (blocking code) while shard 0
    // sends it closures; once free, it must run every one, and the ones
    // sent after, however the doorbells were coalesced meanwhile.
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    for round in 0..20 {
        let rt = crate::rt2();
        let h = rt.handle().clone();
        let ran = Arc::new(AtomicUsize::new(0));
        let held = Arc::new(AtomicBool::new(false));
        let release = Arc::new(AtomicBool::new(false));
        let (hd, rl) = (held.clone(), release.clone());
        let holder = h.spawn_on(mailring::ShardId::new(1), async move {
            hd.store(true, Ordering::SeqCst);
            while !rl.load(Ordering::SeqCst) {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        });
        while !held.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        let (h2, r2) = (h.clone(), ran.clone());
        let sender = h.spawn_on(mailring::ShardId::new(0), async move {
            for _ in 0..8 {
                let r = r2.clone();
                h2.run_on(mailring::ShardId::new(1), move || {
                    r.fetch_add(1, Ordering::SeqCst);
                });
                mailring::time::sleep(std::time::Duration::from_millis(2)).await;
            }
        });
        rt.block_on(sender).unwrap();
        release.store(true, Ordering::SeqCst);
        rt.block_on(holder).unwrap();
        let wait = |want: usize| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while ran.load(Ordering::SeqCst) < want {
                assert!(
                    std::time::Instant::now() < deadline,
                    "round {round}: {} of {want} closures ran: {:#?}",
                    ran.load(Ordering::SeqCst),
                    rt.stats()
                );
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        };
        wait(8);
        // And later ones, sent from shard 0 again.
        let (h2, r2) = (h.clone(), ran.clone());
        rt.block_on(h.spawn_on(mailring::ShardId::new(0), async move {
            let r = r2.clone();
            h2.run_on(mailring::ShardId::new(1), move || {
                r.fetch_add(1, Ordering::SeqCst);
            });
        }))
        .unwrap();
        wait(9);
    }
}
