//! Entry points: `#[mailring::main]`, `mailring::run`, runtime knobs.

use std::rc::Rc;

use mailring::{ExternalWake, ExternalWakeMode, IdlePolicy, ShardId};

#[mailring::main(shards = 2, ring_entries = 64)]
async fn macro_main(handle: mailring::Handle) -> (usize, Option<ShardId>) {
    // The body may hold `!Send` state: it runs on shard 0 only.
    let local = Rc::new(1);
    mailring::yield_now().await;
    (handle.shards() + *local - 1, mailring::current_shard())
}

#[test]
fn main_attribute_runs_the_body_on_shard_zero() {
    assert_eq!(macro_main(), (2, Some(ShardId::new(0))));
}

#[test]
fn run_builds_runs_and_shuts_down() {
    let out = mailring::run(|handle| async move {
        let h = handle.spawn(async { 5 });
        h.await.unwrap() + 1
    })
    .unwrap();
    assert_eq!(out, 6);
}

#[test]
fn both_external_wake_modes_deliver() {
    for mode in [ExternalWake::EventFd, ExternalWake::SendMsgRing] {
        let rt = mailring::Runtime::builder()
            .shards(2)
            .external_wake(mode)
            .idle_policy(IdlePolicy::Block)
            .build()
            .unwrap();
        let stats = rt.stats();
        if mode == ExternalWake::EventFd {
            assert_eq!(stats.external_wake, ExternalWakeMode::EventFd);
        }
        // Let both shards fall asleep, then wake them from this thread many times.
        for i in 0..200u64 {
            let h = rt
                .handle()
                .spawn_on(ShardId::new((i % 2) as usize), async move { i });
            let rt2 = mailring::Runtime::builder().shards(1).build().unwrap();
            assert_eq!(rt2.block_on(async move { h.await.unwrap() }), i);
        }
        assert!(rt.stats().external_wakes > 0, "{mode:?}");
    }
}

#[test]
fn pinned_threads_run_on_their_cpu() {
    let rt = mailring::Runtime::builder()
        .shards(2)
        .pin_threads(true)
        .build()
        .unwrap();
    let cpus = std::thread::available_parallelism().unwrap().get();
    let h = rt.handle().spawn_on(ShardId::new(1), async {
        // SAFETY: sched_getcpu takes no arguments and touches no memory of ours.
        unsafe { libc::sched_getcpu() }
    });
    let cpu = rt.block_on(async move { h.await.unwrap() });
    assert_eq!(cpu as usize, 1 % cpus);
}

/// The CPUs the calling thread may run on.
fn affinity() -> Vec<usize> {
    // SAFETY: sched_getaffinity fills at most `size_of::<cpu_set_t>()` bytes
    // of a zeroed cpu_set_t; CPU_ISSET reads within it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(
            libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set),
            0
        );
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// Restricts the calling thread to `cpu`.
fn restrict_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t filled by CPU_SET within its size;
    // sched_setaffinity reads exactly that many bytes.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
            0
        );
    }
}

/// Each shard's affinity, read on its own thread.
fn shard_affinities(rt: &mailring::Runtime, shards: usize) -> Vec<Vec<usize>> {
    (0..shards)
        .map(|i| {
            let h = rt.handle().spawn_on(ShardId::new(i), async { affinity() });
            rt.block_on(async move { h.await.unwrap() })
        })
        .collect()
}

#[test]
fn pin_to_cpus_puts_each_shard_on_the_cpu_asked_for() {
    let allowed = affinity();
    if allowed.len() < 2 {
        eprintln!("SKIPPED: one CPU only ({allowed:?})");
        return;
    }
    let (a, b) = (allowed[0], allowed[1]);
    let rt = mailring::Runtime::builder()
        .shards(3)
        .pin_to_cpus([b, a])
        .build()
        .unwrap();
    assert_eq!(shard_affinities(&rt, 3), [vec![b], vec![a], vec![b]]);
}

#[test]
fn blocking_threads_of_a_pinned_runtime_are_not_pinned_with_the_shard_that_starts_them() {
    let allowed = affinity();
    if allowed.len() < 2 {
        eprintln!("SKIPPED: one CPU only ({allowed:?})");
        return;
    }
    let rt = mailring::Runtime::builder()
        .shards(1)
        .pin_to_cpus([allowed[1]])
        .build()
        .unwrap();
    // Started from the pinned shard, the pool's thread would inherit its
    // CPU and its name.
    let (cpus, name) = rt.block_on(async {
        mailring::spawn_on(ShardId::new(0), async {
            mailring::spawn_blocking(|| {
                let name = std::fs::read_to_string("/proc/thread-self/comm").unwrap();
                (affinity(), name.trim().to_owned())
            })
            .await
            .unwrap()
        })
        .await
        .unwrap()
    });
    assert_eq!(cpus, allowed, "the process's CPUs, not the shard's");
    assert!(!name.starts_with("mailring-shard"), "{name}");
}

#[test]
fn pinned_shards_stay_within_the_cpus_the_process_may_use() {
    let allowed = affinity();
    if allowed.len() < 2 {
        eprintln!("SKIPPED: one CPU only ({allowed:?})");
        return;
    }
    let last = *allowed.last().unwrap();
    // As under `taskset -c <last>`: a thread of its own, so the test
    // harness's threads keep their affinity.
    std::thread::spawn(move || {
        restrict_to(last);
        let rt = mailring::Runtime::builder()
            .shards(2)
            .pin_threads(true)
            .build()
            .unwrap();
        // Not CPU 0 for shard 0: every shard on the one CPU allowed.
        assert_eq!(shard_affinities(&rt, 2), [vec![last], vec![last]]);
        // Naming a CPU outside the affinity is refused, with the CPU named.
        let first = allowed[0];
        let err = mailring::Runtime::builder()
            .shards(1)
            .pin_to_cpus([first])
            .build()
            .unwrap_err();
        assert!(
            matches!(&err, mailring::BuildError::Config(m) if m.contains(&format!("CPU {first}"))),
            "{err:?}"
        );
    })
    .join()
    .unwrap();
}

#[test]
fn pinning_to_no_cpu_or_to_one_past_the_machine_is_refused() {
    let err = mailring::Runtime::builder()
        .shards(1)
        .pin_to_cpus([])
        .build()
        .unwrap_err();
    assert!(matches!(err, mailring::BuildError::Config(_)), "{err:?}");
    let err = mailring::Runtime::builder()
        .shards(1)
        .pin_to_cpus([usize::MAX])
        .build()
        .unwrap_err();
    assert!(
        matches!(&err, mailring::BuildError::Config(m) if m.contains(&usize::MAX.to_string())),
        "{err:?}"
    );
}

#[test]
fn dropping_the_runtime_inside_a_task_does_not_deadlock() {
    let rt = mailring::Runtime::builder().shards(1).build().unwrap();
    let slot = std::sync::Arc::new(std::sync::Mutex::new(Some(rt)));
    let handle = slot.lock().unwrap().as_ref().unwrap().handle().clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let s2 = slot.clone();
    handle.spawn_on(ShardId::new(0), async move {
        let rt = s2.lock().unwrap().take();
        drop(rt); // shuts down from another thread once this task returns
        tx.send(()).unwrap();
    });
    rx.recv_timeout(std::time::Duration::from_secs(10))
        .expect("task ran");
}
