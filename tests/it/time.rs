//! Timers: sleep, timeout, interval, reset, and idle CPU use.

use std::future::Future;
use std::time::{Duration, Instant};

use mailring::time::{interval, sleep, sleep_until, timeout};
use mailring::ShardId;

use crate::rt2;

#[test]
fn sleep_waits_at_least_its_duration() {
    let rt = rt2();
    let elapsed = rt.block_on(async {
        let start = Instant::now();
        sleep(Duration::from_millis(20)).await;
        start.elapsed()
    });
    assert!(elapsed >= Duration::from_millis(20), "{elapsed:?}");
}

#[test]
fn many_timers_fire_in_deadline_order() {
    let rt = rt2();
    let order = rt.block_on(async {
        let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut handles = Vec::new();
        for i in (0..10u64).rev() {
            let order = order.clone();
            handles.push(mailring::spawn_on(ShardId::new(1), async move {
                sleep(Duration::from_millis(2 * i + 1)).await;
                order.lock().unwrap().push(i);
            }));
        }
        for h in handles {
            h.await.unwrap();
        }
        let v = order.lock().unwrap().clone();
        v
    });
    assert_eq!(order, (0..10).collect::<Vec<_>>());
}

#[test]
fn timeout_elapses_and_passes_through() {
    let rt = rt2();
    rt.block_on(async {
        let slow = timeout(Duration::from_millis(5), std::future::pending::<()>()).await;
        assert!(slow.is_err());
        let fast = timeout(Duration::from_secs(5), async { 3 }).await;
        assert_eq!(fast, Ok(3));
    });
}

#[test]
fn reset_moves_a_sleep_both_ways() {
    let rt = rt2();
    rt.block_on(async {
        let start = Instant::now();
        let mut s = sleep(Duration::from_secs(3600));
        // Register it, then pull it in.
        assert!(timeout(Duration::from_millis(1), &mut s).await.is_err());
        s.reset(Instant::now() + Duration::from_millis(10));
        (&mut s).await;
        assert!(start.elapsed() < Duration::from_secs(60));
        // Push a completed sleep out again: it must wait again.
        s.reset(Instant::now() + Duration::from_millis(10));
        let again = Instant::now();
        (&mut s).await;
        assert!(again.elapsed() >= Duration::from_millis(10));
    });
}

#[test]
fn a_sleep_moved_later_completes_at_its_new_deadline_only() {
    let rt = rt2();
    rt.block_on(async {
        let mut s = sleep(Duration::from_millis(10));
        // Registered at +10 ms, then pushed back several times (each lazily).
        assert!(timeout(Duration::from_millis(1), &mut s).await.is_err());
        let start = Instant::now();
        for extra in [20, 30, 40] {
            s.reset(start + Duration::from_millis(extra));
        }
        (&mut s).await;
        assert!(
            start.elapsed() >= Duration::from_millis(40),
            "{:?}",
            start.elapsed()
        );
        // Pushed later, then pulled in again before the old timer fires.
        let mut s = sleep(Duration::from_millis(200));
        assert!(timeout(Duration::from_millis(1), &mut s).await.is_err());
        let start = Instant::now();
        s.reset(start + Duration::from_secs(3600));
        s.reset(start + Duration::from_millis(5));
        (&mut s).await;
        // Pulled in from an hour away: it did not wait for the hour.
        assert!(start.elapsed() >= Duration::from_millis(5));
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{:?}",
            start.elapsed()
        );
    });
}

#[test]
fn dropped_timers_cost_nothing_and_leave_no_entry() {
    let rt = rt2();
    rt.block_on(async {
        for _ in 0..10_000 {
            let mut s = sleep(Duration::from_secs(60));
            let _ = timeout(Duration::ZERO, &mut s).await;
            s.reset(Instant::now() + Duration::from_secs(120));
        }
    });
    // Gauges are published on the shard's idle passes (and every 16th busy
    // one), which may come just after `block_on` returns: give the shard a
    // moment to publish.
    let mut stats = rt.stats();
    for _ in 0..100 {
        if stats.shards[0].timers_armed == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
        stats = rt.stats();
    }
    assert_eq!(stats.shards[0].timers_armed, 0, "{stats:?}");
}

#[test]
fn interval_ticks_on_schedule() {
    let rt = rt2();
    rt.block_on(async {
        let start = Instant::now();
        let mut iv = interval(Duration::from_millis(5));
        let first = iv.tick().await;
        assert!(first <= Instant::now());
        for _ in 0..4 {
            iv.tick().await;
        }
        assert!(start.elapsed() >= Duration::from_millis(20));
    });
}

#[test]
fn sleep_until_in_the_past_is_ready() {
    let rt = rt2();
    rt.block_on(async { sleep_until(Instant::now() - Duration::from_millis(1)).await });
}

/// CPU time used so far by the threads whose name starts with `prefix`.
fn threads_cpu_time(prefix: &str) -> Duration {
    let mut ticks = 0u64;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        if !stat[open + 1..close].starts_with(prefix) {
            continue;
        }
        let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        // utime and stime: fields 14 and 15 of the line, 12th and 13th after the name.
        ticks += fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    }
    // SAFETY: sysconf has no memory arguments.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_micros(ticks * 1_000_000 / hz)
}

#[test]
fn idle_runtime_uses_almost_no_cpu() {
    // Thread names are cut to 15 bytes: keep the prefix short and unique.
    let rt = mailring::Runtime::builder()
        .shards(2)
        .thread_name("mr-idle")
        .build()
        .unwrap();
    rt.block_on(async {});
    std::thread::sleep(Duration::from_millis(50));
    let parks_before: u64 = rt.stats().shards.iter().map(|s| s.parks).sum();
    let before = threads_cpu_time("mr-idle");
    std::thread::sleep(Duration::from_secs(1));
    let used = threads_cpu_time("mr-idle") - before;
    let parks_after: u64 = rt.stats().shards.iter().map(|s| s.parks).sum();
    // Clock ticks are 10 ms: a spinning shard would show ~1 s here.
    assert!(
        used <= Duration::from_millis(20),
        "idle shards used {used:?} of CPU in 1 s"
    );
    assert!(
        parks_after - parks_before <= 2,
        "idle shards keep waking up: {parks_before} -> {parks_after}"
    );
}

#[test]
fn advancing_the_clock_fires_long_timers_at_once_on_every_shard() {
    let rt = rt2();
    let h = rt.handle().clone();
    let real = Instant::now();
    let out = rt.block_on(async move {
        let hour = Duration::from_secs(3600);
        let a = mailring::spawn_on(ShardId::new(0), sleep(hour));
        let b = mailring::spawn_on(ShardId::new(1), async move {
            timeout(2 * hour, std::future::pending::<()>()).await
        });
        let c = mailring::spawn_on(ShardId::new(1), async move {
            let mut ticks = interval(Duration::from_secs(60));
            ticks.tick().await; // the first tick is immediate
            ticks.tick().await;
            ticks.tick().await;
        });
        sleep(Duration::from_millis(5)).await;
        let before = mailring::time::now();
        h.advance_clock(hour);
        a.await.unwrap();
        c.await.unwrap();
        assert!(mailring::time::now() >= before + hour);
        h.advance_clock(hour);
        b.await.unwrap()
    });
    assert!(out.is_err(), "the 2 h timeout elapsed on the moved clock");
    assert!(real.elapsed() < Duration::from_secs(60), "no real waiting");
}

// Durations too long for an `Instant` saturate to a far-future deadline
// instead of overflowing (which panicked).

#[test]
fn timeout_of_duration_max_passes_the_value_through() {
    let rt = rt2();
    assert_eq!(rt.block_on(timeout(Duration::MAX, async { 5 })), Ok(5));
}

#[test]
fn sleep_of_duration_max_loses_to_a_short_timeout() {
    let rt = rt2();
    let raced = rt.block_on(async {
        // Polled once (registered in the timer queue) and dropped.
        timeout(Duration::from_millis(10), sleep(Duration::MAX)).await
    });
    assert!(raced.is_err(), "the 10 ms timeout wins");
}

#[test]
fn interval_with_a_huge_period_ticks_once_then_waits() {
    let rt = rt2();
    let (second, after_reset) = rt.block_on(async {
        let mut ticker = interval(Duration::MAX);
        ticker.tick().await;
        let second = timeout(Duration::from_millis(10), ticker.tick()).await;
        ticker.reset();
        let after_reset = timeout(Duration::from_millis(10), ticker.tick()).await;
        (second, after_reset)
    });
    assert!(second.is_err(), "no second tick within 10 ms");
    assert!(after_reset.is_err(), "no tick within 10 ms of a reset");
}

#[test]
fn advancing_the_clock_saturates_instead_of_wrapping() {
    let rt = mailring::Runtime::builder()
        .shards(1)
        .build()
        .expect("io_uring runtime");
    let h = rt.handle().clone();
    let before = h.now();
    h.advance_clock(Duration::MAX);
    let advanced = h.now();
    assert!(advanced >= before);
    h.advance_clock(Duration::MAX);
    h.advance_clock(Duration::from_secs(3600));
    let after = h.now();
    assert!(after >= advanced, "the clock went back");
    // Timers still work on a clock this far ahead.
    let raced =
        rt.block_on(async { timeout(Duration::from_millis(10), sleep(Duration::MAX)).await });
    assert!(raced.is_err());
}

/// Polls `fut` on a thread of its own, outside every runtime, parking until
/// its waker is called (nothing else polls it again); its output, or `None`
/// when it has not finished within `within`.
fn off_shard<T: Send + 'static>(
    fut: impl std::future::Future<Output = T> + Send + 'static,
    within: Duration,
) -> Option<T> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};
    struct Flag(std::thread::Thread, AtomicBool);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.1.store(true, Ordering::Release);
            self.0.unpark();
        }
    }
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let flag = Arc::new(Flag(std::thread::current(), AtomicBool::new(false)));
        let waker = Waker::from(flag.clone());
        let mut cx = Context::from_waker(&waker);
        let mut fut = std::pin::pin!(fut);
        let out = loop {
            if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
                break v;
            }
            while !flag.1.swap(false, Ordering::Acquire) {
                std::thread::park();
            }
        };
        let _ = tx.send(out);
    });
    rx.recv_timeout(within).ok()
}

#[test]
fn timers_fire_when_polled_off_the_shards() {
    let start = Instant::now();
    let slept = off_shard(
        async move {
            sleep(Duration::from_millis(30)).await;
            start.elapsed()
        },
        Duration::from_secs(2),
    );
    let slept = slept.expect("a sleep polled off the shards completes");
    assert!(slept >= Duration::from_millis(30), "{slept:?}");
    let timed_out = off_shard(
        timeout(Duration::from_millis(20), std::future::pending::<()>()),
        Duration::from_secs(2),
    );
    assert!(matches!(timed_out, Some(Err(_))), "{timed_out:?}");
    // Many, each woken at its own deadline; one moved from 10 s to now.
    let late = off_shard(
        async move {
            let start = Instant::now();
            let mut sleeps: Vec<_> = (0..8u64)
                .map(|i| sleep(Duration::from_millis(5 * i + 5)))
                .collect();
            let mut far = sleep(Duration::from_secs(10));
            // Registered at 10 s, then moved earlier.
            std::future::poll_fn(|cx| {
                assert!(std::pin::Pin::new(&mut far).poll(cx).is_pending());
                std::task::Poll::Ready(())
            })
            .await;
            far.reset(Instant::now() + Duration::from_millis(10));
            sleeps.push(far);
            let deadlines: Vec<_> = sleeps.iter().map(|s| s.deadline()).collect();
            let mut done = vec![None; sleeps.len()];
            std::future::poll_fn(|cx| {
                for (i, s) in sleeps.iter_mut().enumerate() {
                    if done[i].is_none() && std::pin::Pin::new(s).poll(cx).is_ready() {
                        done[i] = Some(Instant::now());
                    }
                }
                if done.iter().all(Option::is_some) {
                    std::task::Poll::Ready(())
                } else {
                    std::task::Poll::Pending
                }
            })
            .await;
            let early: Vec<_> = (0..done.len())
                .filter(|&i| done[i].unwrap() < deadlines[i])
                .collect();
            (early, start.elapsed())
        },
        Duration::from_secs(2),
    );
    let (early, took) = late.expect("every sleep fires, the moved one at its new deadline");
    assert!(early.is_empty(), "fired before their deadlines: {early:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[test]
fn a_sleep_registered_on_a_shard_fires_when_then_polled_off_the_shards() {
    let rt = rt2();
    let s = rt.block_on(async {
        let mut s = sleep(Duration::from_millis(50));
        // One poll registers it in shard 0's wheel.
        std::future::poll_fn(|cx| {
            assert!(std::pin::Pin::new(&mut s).poll(cx).is_pending());
            std::task::Poll::Ready(())
        })
        .await;
        Some(s)
    });
    let s = s.expect("the sleep");
    assert_eq!(off_shard(s, Duration::from_secs(2)), Some(()));
}

/// A waker that counts nothing: its `Arc`'s strong count tells whether a
/// timer entry still holds it.
struct Held;

impl std::task::Wake for Held {
    fn wake(self: std::sync::Arc<Self>) {}
}

/// A one-hour sleep polled once on `shard` of `rt` with a waker of `held`.
fn sleep_registered_on(
    rt: &mailring::Runtime,
    shard: usize,
    held: &std::sync::Arc<Held>,
) -> mailring::time::Sleep {
    let waker = std::task::Waker::from(held.clone());
    on_shard(rt, shard, async move {
        let mut s = sleep(Duration::from_secs(3600));
        let mut cx = std::task::Context::from_waker(&waker);
        assert!(std::pin::Pin::new(&mut s).poll(&mut cx).is_pending());
        Some(s)
    })
    .expect("the sleep")
}

/// Runs `fut` on `shard` of `rt` and waits for its output.
fn on_shard<T: Send + 'static>(
    rt: &mailring::Runtime,
    shard: usize,
    fut: impl Future<Output = T> + Send + 'static,
) -> T {
    rt.block_on(async move { mailring::spawn_on(ShardId::new(shard), fut).await })
        .expect("the task")
}

/// Waits (bounded) until `done` holds; whether it did.
fn eventually(mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    done()
}

fn armed(rt: &mailring::Runtime, shard: usize) -> u64 {
    rt.stats().shards[shard].timers_armed
}

/// Shard 0's wheel lets go of the entry and its waker soon (not at the
/// one-hour deadline).
fn assert_released(rt: &mailring::Runtime, held: &std::sync::Arc<Held>) {
    assert!(
        eventually(|| armed(rt, 0) == 0 && std::sync::Arc::strong_count(held) == 1),
        "entry or waker kept until the deadline: {} armed, waker count {}",
        armed(rt, 0),
        std::sync::Arc::strong_count(held)
    );
}

#[test]
fn a_sleep_dropped_off_its_shard_releases_its_entry_and_waker() {
    let rt = rt2();
    let held = std::sync::Arc::new(Held);
    let s = sleep_registered_on(&rt, 0, &held);
    assert!(eventually(|| armed(&rt, 0) == 1), "registered on shard 0");
    assert_eq!(
        std::sync::Arc::strong_count(&held),
        2,
        "the entry holds the waker"
    );
    // Dropped here, on a thread outside the runtime.
    drop(s);
    assert_released(&rt, &held);
}

#[test]
fn a_sleep_dropped_on_another_shard_releases_its_entry_and_waker() {
    let rt = rt2();
    let held = std::sync::Arc::new(Held);
    let s = sleep_registered_on(&rt, 0, &held);
    on_shard(&rt, 1, async move { drop(s) });
    assert_released(&rt, &held);
}

#[test]
fn a_sleep_moved_between_runtimes_and_threads_keeps_each_wheel_consistent() {
    let (a, b) = (rt2(), rt2());
    let held = std::sync::Arc::new(Held);
    let s = sleep_registered_on(&a, 0, &held);
    // Polled on another runtime's shard: it registers there and its entry
    // in the first runtime's wheel goes.
    let waker = std::task::Waker::from(held.clone());
    let s = on_shard(&b, 0, async move {
        let mut s = s;
        let mut cx = std::task::Context::from_waker(&waker);
        assert!(std::pin::Pin::new(&mut s).poll(&mut cx).is_pending());
        Some(s)
    })
    .expect("the sleep");
    assert!(
        eventually(|| armed(&a, 0) == 0 && armed(&b, 0) == 1),
        "a: {}, b: {}",
        armed(&a, 0),
        armed(&b, 0)
    );
    // Polled off the shards, then dropped after its last wheel's runtime is gone.
    let mut s = s;
    let waker = std::task::Waker::from(held.clone());
    let mut cx = std::task::Context::from_waker(&waker);
    assert!(std::pin::Pin::new(&mut s).poll(&mut cx).is_pending());
    drop(waker);
    assert!(eventually(|| armed(&b, 0) == 0), "b: {}", armed(&b, 0));
    drop(a);
    drop(b);
    drop(s);
    assert!(
        eventually(|| std::sync::Arc::strong_count(&held) == 1),
        "a waker kept: count {}",
        std::sync::Arc::strong_count(&held)
    );
}

#[test]
fn a_sleep_moved_earlier_from_another_thread_wakes_at_its_new_deadline() {
    use std::sync::{Arc, Mutex};
    // The sleep is polled (registered) on shard 0 for 30 s; the test's
    // thread then moves it to 50 ms from now.
    let rt = rt2();
    let sleep_cell = Arc::new(Mutex::new(Box::pin(sleep(Duration::from_secs(30)))));
    let polled = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (s, p) = (sleep_cell.clone(), polled.clone());
    let task = rt.handle().spawn_on(ShardId::new(0), async move {
        std::future::poll_fn(|cx| {
            let ready = s.lock().unwrap().as_mut().poll(cx);
            p.store(true, std::sync::atomic::Ordering::SeqCst);
            ready
        })
        .await;
    });
    while !polled.load(std::sync::atomic::Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let started = Instant::now();
    sleep_cell
        .lock()
        .unwrap()
        .as_mut()
        .reset(Instant::now() + Duration::from_millis(50));
    rt.block_on(async move { timeout(Duration::from_secs(10), task).await })
        .expect("the sleep completed at its new deadline")
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// A timeout's duration counts from the call, as a sleep's does: one made,
/// left unpolled past its duration, gives up at its first poll.
#[test]
fn a_timeout_counts_from_its_call_not_its_first_poll() {
    let rt = crate::rt2();
    let waited = rt.block_on(async {
        let t = mailring::time::timeout(Duration::from_millis(200), std::future::pending::<()>());
        mailring::time::sleep(Duration::from_millis(300)).await;
        let started = std::time::Instant::now();
        assert!(t.await.is_err());
        started.elapsed()
    });
    // Counted from the first poll, it would wait 200 ms more.
    assert!(
        waited < Duration::from_millis(150),
        "waited {waited:?} more"
    );
}

/// An interval whose shard was held up for several periods: by default
/// the missed ticks fire back to back (`Burst`); `Delay` starts the
/// schedule again a period after the late tick; `Skip` goes on at the
/// next tick of the original schedule still to come. Each late tick
/// itself completes at once.
#[test]
fn an_interval_that_missed_ticks_catches_up_as_its_behaviour_says() {
    use mailring::time::MissedTickBehavior;
    let rt = rt2();
    let period = Duration::from_millis(10);
    for behaviour in [
        MissedTickBehavior::Burst,
        MissedTickBehavior::Delay,
        MissedTickBehavior::Skip,
    ] {
        let (first, late, next, resumed_at) = rt.block_on(async move {
            let mut iv = interval(period);
            iv.set_missed_tick_behavior(behaviour);
            assert_eq!(iv.missed_tick_behavior(), behaviour);
            let first = iv.tick().await;
            // The shard is held up for five and a half periods.
            std::thread::sleep(Duration::from_millis(55));
            let late = iv.tick().await;
            let resumed_at = mailring::time::now();
            let next = iv.tick().await;
            (first, late, next, resumed_at)
        });
        assert_eq!(late, first + period, "{behaviour:?}: the first late tick");
        match behaviour {
            MissedTickBehavior::Burst => assert_eq!(next, first + 2 * period),
            MissedTickBehavior::Skip => {
                // On the schedule's phase, the first of it after the hold.
                let since = (next - first).as_nanos();
                assert_eq!(since % period.as_nanos(), 0, "{behaviour:?}: off phase");
                assert!(
                    next >= resumed_at && next < resumed_at + period,
                    "{behaviour:?}"
                );
                assert!(
                    next >= first + 6 * period,
                    "{behaviour:?}: {:?}",
                    next - first
                );
            }
            MissedTickBehavior::Delay => {
                assert!(
                    next >= resumed_at + period - Duration::from_millis(1),
                    "{behaviour:?}"
                );
                assert!(
                    next > first + 5 * period,
                    "{behaviour:?}: {:?}",
                    next - first
                );
            }
        }
    }
}
