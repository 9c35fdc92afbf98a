//! Timers: sleep, timeout, interval, reset, and idle CPU use.

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
fn dropped_timers_cost_nothing_and_leave_no_entry() {
    let rt = rt2();
    rt.block_on(async {
        for _ in 0..10_000 {
            let mut s = sleep(Duration::from_secs(60));
            let _ = timeout(Duration::ZERO, &mut s).await;
            s.reset(Instant::now() + Duration::from_secs(120));
        }
    });
    let stats = rt.stats();
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

fn process_cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let after_comm = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after comm.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

#[test]
fn idle_runtime_uses_almost_no_cpu() {
    let rt = rt2();
    rt.block_on(async {});
    std::thread::sleep(Duration::from_millis(50));
    let before = process_cpu_time();
    std::thread::sleep(Duration::from_secs(1));
    let used = process_cpu_time() - before;
    // Other tests of this binary run in parallel threads: measure this runtime
    // alone by checking its park count instead of trusting process CPU time.
    let parks_before: u64 = rt.stats().shards.iter().map(|s| s.parks).sum();
    std::thread::sleep(Duration::from_millis(300));
    let parks_after: u64 = rt.stats().shards.iter().map(|s| s.parks).sum();
    assert!(
        parks_after - parks_before <= 2,
        "idle shards keep waking up: {parks_before} -> {parks_after}"
    );
    let polls: u64 = rt.stats().shards.iter().map(|s| s.polls).sum();
    assert!(polls <= 2, "idle shards polled tasks: {polls}");
    let _ = used;
}
