//! Runtime benchmarks: mailring (2 shards) vs tokio (multi-thread, 2 workers) vs
//! spargio 0.5.13 (2 shards), all in one run.
//!
//! Run: `cargo bench -p mailring-bench --bench runtime`.
//!
//! Reporting convention (be explicit): every criterion "iteration" is ONE BATCH:
//!   pingpong_rtt        : 100_000 round trips            (Throughput::Elements = 100k)
//!   oneway_send_drain   : 100_000 u64 msgs + 1 barrier   (Throughput::Elements = 100k)
//!   fanout_fanin_*      : 1_000 spawned tasks + gather   (Throughput::Elements = 1k)
//!   pingpong_rtt_across_threads : as pingpong_rtt, tokio with one task per thread
//!   timer_storm         : 100_000 timers create+reset+drop (Throughput::Elements = 100k)
//!   timer_deadline_rounds : 100 rounds of 256 deadlines + a 1 us sleep (Elements = 100)
//! so criterion's "time" is per batch; divide by the element count (or read the
//! elem/s line) for per-op cost.
//!
//! Each runtime is built once per bench function (outside the timed region) and
//! torn down at the end of that function, so spargio's busy-polling shards never
//! overlap with the tokio measurements.  CPU time (getrusage RUSAGE_SELF, user+sys,
//! whole process) is accumulated over all iter_custom calls and printed once per
//! bench function.

use criterion::measurement::WallTime;
use criterion::{
    black_box, criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput,
};
use futures::executor::block_on;
use futures::StreamExt;
use mailring::{hot, ShardId};
use mailring_bench::process_cpu;
use spargio::{Event, ShardCtx};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

const RTT_ROUNDS: u64 = 100_000;
const ONEWAY_MSGS: u64 = 100_000;
const FANOUT_TASKS: u64 = 1_000;
const LIGHT_ITERS: u32 = 200; // ~0.3us of dependent arithmetic
const HEAVY_ITERS: u32 = LIGHT_ITERS * 50; // skewed: every 10th task
const TIMERS: usize = 100_000;
const EXTERNAL_ROUNDS: u64 = 1_000;
// Deadlines are far beyond the whole run, so no timer ever fires during the
// measurement (the "idle timeout that keeps getting pushed back, then is
// cancelled" case).  spargio cannot cancel: every dropped/reset Sleep leaves an
// io_uring Timeout armed in the kernel, so its in-flight count grows by 2*TIMERS
// per batch; the runtime is shut down right after measuring (closing the rings
// discards them).  Short deadlines made spargio wedge (CQ overflow, see below).
const TIMER_D1: Duration = Duration::from_secs(30);
const TIMER_D2: Duration = Duration::from_secs(60);

// spargio msg_ring tags (u16); payload is u32
const T_PING: u16 = 1;
const T_PONG: u16 = 2;
const T_DATA: u16 = 3;
const T_ACK: u16 = 4;
const T_STOP: u16 = 9;

// ---------------------------------------------------------------- watchdog

static PROGRESS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static CURRENT: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

fn epoch_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A lost message would hang a barrier forever; abort loudly instead.
fn start_watchdog(label: &str) {
    *CURRENT.lock().unwrap() = label.to_owned();
    PROGRESS.store(epoch_secs(), std::sync::atomic::Ordering::Relaxed);
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::thread::spawn(|| loop {
            std::thread::sleep(Duration::from_secs(5));
            let last = PROGRESS.load(std::sync::atomic::Ordering::Relaxed);
            if epoch_secs().saturating_sub(last) > 60 {
                eprintln!(
                    "WATCHDOG: no progress for 60s in {}",
                    CURRENT.lock().unwrap()
                );
                dump_uring_fdinfo();
                std::process::exit(3);
            }
        });
    });
}

/// For post-mortems: SQ/CQ heads/tails and CQ-overflow-list length of every
/// io_uring fd in this process.
fn dump_uring_fdinfo() {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    for e in dir.flatten() {
        let is_uring = std::fs::read_link(e.path())
            .map(|l| l.to_string_lossy().contains("io_uring"))
            .unwrap_or(false);
        if !is_uring {
            continue;
        }
        let fd = e.file_name().to_string_lossy().into_owned();
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).unwrap_or_default();
        let keep: Vec<&str> = info
            .lines()
            .filter(|l| {
                ["SqHead", "SqTail", "CqHead", "CqTail"]
                    .iter()
                    .any(|k| l.starts_with(k))
            })
            .collect();
        let overflow = info.lines().filter(|l| l.contains("user_data=")).count();
        eprintln!(
            "  io_uring fd {fd}: {} cq_overflow_list={overflow}",
            keep.join(" ")
        );
    }
}

fn spargio_stats(id: &str, h: &spargio::RuntimeHandle) {
    let s = h.stats_snapshot();
    eprintln!(
        "[spargio-stats] {id}: ring_msgs submitted={} completed={} failed={} backpressure(silently dropped)={} \
         stealable executed={} stolen={} backpressure={}",
        s.ring_msgs_submitted, s.ring_msgs_completed, s.ring_msgs_failed, s.ring_msgs_backpressure,
        s.stealable_executed, s.stealable_stolen, s.stealable_backpressure
    );
}

// ---------------------------------------------------------------- CPU meter

#[derive(Default)]
struct Meter {
    wall: Duration,
    cpu: Duration,
    batches: u64,
}

impl Meter {
    /// Times `f` (wall + process CPU), returns its wall time for iter_custom.
    fn measure(&mut self, batches: u64, f: impl FnOnce()) -> Duration {
        let c0 = process_cpu();
        let t0 = Instant::now();
        f();
        let wall = t0.elapsed();
        self.cpu += process_cpu() - c0;
        self.wall += wall;
        self.batches += batches;
        PROGRESS.store(epoch_secs(), std::sync::atomic::Ordering::Relaxed);
        wall
    }

    fn report(&self, id: &str, ops_per_batch: u64) {
        let b = self.batches.max(1) as f64;
        let ops = b * ops_per_batch as f64;
        eprintln!(
            "[cpu] {id}: batches={} wall/batch={:.3}ms cpu/batch={:.3}ms cpu/wall={:.2} cores, \
             wall/op={:.1}ns cpu/op={:.1}ns",
            self.batches,
            self.wall.as_secs_f64() * 1e3 / b,
            self.cpu.as_secs_f64() * 1e3 / b,
            self.cpu.as_secs_f64() / self.wall.as_secs_f64().max(1e-12),
            self.wall.as_secs_f64() * 1e9 / ops,
            self.cpu.as_secs_f64() * 1e9 / ops,
        );
    }
}

// ---------------------------------------------------------------- runtimes

fn tokio_rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn spargio_rt() -> spargio::Runtime {
    spargio::Runtime::builder()
        .shards(2)
        .ring_entries(4096)
        .build()
        .expect("spargio runtime (needs io_uring)")
}

fn spargio_shutdown(mut rt: spargio::Runtime) {
    // Runtime::shutdown is async; Drop would also do a blocking shutdown.
    block_on(rt.shutdown());
}

fn synthetic_work(seed: u64, iterations: u32) -> u64 {
    let mut x = seed ^ 0x9E37_79B9_7F4A_7C15;
    for i in 0..iterations {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407 ^ u64::from(i));
        x ^= x >> 29;
    }
    x
}

fn work_iters(task: u64, skewed: bool) -> u32 {
    if skewed && task % 10 == 0 {
        HEAVY_ITERS
    } else {
        LIGHT_ITERS
    }
}

/// Workaround for a spargio 0.5.13 wedge: once a shard's CQ overflows (e.g. a
/// receiver that falls > 2*ring_entries msg_ring CQEs behind), the kernel parks
/// further CQEs in its overflow list, which is only flushed by io_uring_enter;
/// spargio only enters when it has SQEs to submit, so a pure receiver waits
/// forever.  Before parking, push a Nop (ctx.flush) so the next submit enters
/// the kernel (io-uring sets GETEVENTS when IORING_SQ_CQ_OVERFLOW is set).
async fn next_event_unwedged(ctx: &ShardCtx) -> Event {
    let mut fut = ctx.next_event();
    if let Poll::Ready(ev) = poll_noop(Pin::new(&mut fut)) {
        return ev;
    }
    let _ = ctx.flush();
    fut.await
}

fn next_ring_msg(ev: Event) -> (u16, u32) {
    let Event::RingMsg { tag, val, .. } = ev;
    (tag, val)
}

// ---------------------------------------------------------------- pingpong_rtt

fn pingpong_tokio(g: &mut BenchmarkGroup<WallTime>) {
    let rt = tokio_rt();
    let mut m = Meter::default();
    start_watchdog("pingpong_rtt/tokio");
    g.bench_function("tokio", |b| {
        b.iter_custom(|iters| {
            let n = iters * RTT_ROUNDS;
            m.measure(iters, || {
                let (to_pong, mut pong_rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
                let (to_ping, mut ping_rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
                rt.spawn(async move {
                    while let Some(v) = pong_rx.recv().await {
                        if to_ping.send(v).is_err() {
                            break;
                        }
                    }
                });
                let pinger = rt.spawn(async move {
                    let mut sum = 0u64;
                    for i in 0..n {
                        to_pong.send(i).unwrap();
                        sum = sum.wrapping_add(ping_rx.recv().await.unwrap());
                    }
                    sum
                });
                black_box(rt.block_on(pinger).unwrap());
            })
        })
    });
    m.report("pingpong_rtt/tokio", RTT_ROUNDS);
}

/// spargio native: msg_ring (tag,u32) events between a local task pinned on
/// shard 0 and one pinned on shard 1 (one event consumer per shard).
fn pingpong_spargio(g: &mut BenchmarkGroup<WallTime>) {
    let rt = spargio_rt();
    let h = rt.handle();
    let mut m = Meter::default();
    start_watchdog("pingpong_rtt/spargio");
    g.bench_function("spargio", |b| {
        b.iter_custom(|iters| {
            let n = iters * RTT_ROUNDS;
            m.measure(iters, || {
                let ponger = h
                    .spawn_local_on(1, |ctx: ShardCtx| async move {
                        loop {
                            let (tag, val) = next_ring_msg(ctx.next_event().await);
                            match tag {
                                T_PING => ctx.send_raw_nowait(0, T_PONG, val).unwrap(),
                                T_STOP => break,
                                _ => {}
                            }
                        }
                    })
                    .unwrap();
                let pinger = h
                    .spawn_local_on(0, move |ctx: ShardCtx| async move {
                        let mut sum = 0u64;
                        for i in 0..n {
                            ctx.send_raw_nowait(1, T_PING, i as u32).unwrap();
                            loop {
                                let (tag, val) = next_ring_msg(ctx.next_event().await);
                                if tag == T_PONG {
                                    sum = sum.wrapping_add(u64::from(val));
                                    break;
                                }
                            }
                        }
                        ctx.send_raw_nowait(1, T_STOP, 0).unwrap();
                        sum
                    })
                    .unwrap();
                black_box(block_on(pinger).unwrap());
                block_on(ponger).unwrap();
            })
        })
    });
    m.report("pingpong_rtt/spargio", RTT_ROUNDS);
    spargio_stats("pingpong_rtt/spargio", &h);
    spargio_shutdown(rt);
}

/// spargio tasks pinned on shards 0/1, but messaging via futures::channel::mpsc
/// (spargio has no general-purpose typed cross-shard channel).
fn pingpong_spargio_chan(g: &mut BenchmarkGroup<WallTime>) {
    let rt = spargio_rt();
    let h = rt.handle();
    let mut m = Meter::default();
    start_watchdog("pingpong_rtt/spargio_chan");
    g.bench_function("spargio_chan", |b| {
        b.iter_custom(|iters| {
            let n = iters * RTT_ROUNDS;
            m.measure(iters, || {
                let (to_pong, mut pong_rx) = futures::channel::mpsc::unbounded::<u64>();
                let (to_ping, mut ping_rx) = futures::channel::mpsc::unbounded::<u64>();
                let ponger = h
                    .spawn_pinned(1, async move {
                        while let Some(v) = pong_rx.next().await {
                            if to_ping.unbounded_send(v).is_err() {
                                break;
                            }
                        }
                    })
                    .unwrap();
                let pinger = h
                    .spawn_pinned(0, async move {
                        let mut sum = 0u64;
                        for i in 0..n {
                            to_pong.unbounded_send(i).unwrap();
                            sum = sum.wrapping_add(ping_rx.next().await.unwrap());
                        }
                        sum
                    })
                    .unwrap();
                black_box(block_on(pinger).unwrap());
                block_on(ponger).unwrap();
            })
        })
    });
    m.report("pingpong_rtt/spargio_chan", RTT_ROUNDS);
    spargio_stats("pingpong_rtt/spargio_chan", &h);
    spargio_shutdown(rt);
}

// ---------------------------------------------------------------- mailring

fn mailring_rt() -> mailring::Runtime {
    mailring::Runtime::builder()
        .shards(2)
        .coalesced_hot_tag(T_DATA)
        .build()
        .expect("mailring runtime (needs io_uring)")
}

/// mailring, same channel as the tokio peer (tokio's runtime-agnostic mpsc):
/// one task pinned on each shard.
/// `group` names the criterion group it runs in (for the CPU report).
fn pingpong_mailring(g: &mut BenchmarkGroup<WallTime>, group: &str) {
    let rt = mailring_rt();
    let h = rt.handle().clone();
    let mut m = Meter::default();
    let id = format!("{group}/mailring");
    start_watchdog(&id);
    g.bench_function("mailring", |b| {
        b.iter_custom(|iters| {
            let n = iters * RTT_ROUNDS;
            m.measure(iters, || {
                let (to_pong, mut pong_rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
                let (to_ping, mut ping_rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
                h.spawn_on(ShardId::new(1), async move {
                    while let Some(v) = pong_rx.recv().await {
                        if to_ping.send(v).is_err() {
                            break;
                        }
                    }
                })
                .detach();
                let pinger = h.spawn_on(ShardId::new(0), async move {
                    let mut sum = 0u64;
                    for i in 0..n {
                        to_pong.send(i).unwrap();
                        sum = sum.wrapping_add(ping_rx.recv().await.unwrap());
                    }
                    sum
                });
                black_box(block_on(pinger).unwrap());
            })
        })
    });
    m.report(&id, RTT_ROUNDS);
    rt.shutdown();
}

/// mailring with both tasks on shard 0 (what tokio's scheduler tends to do
/// with a ping-pong pair): no cross-core traffic at all.
fn pingpong_mailring_same_shard(g: &mut BenchmarkGroup<WallTime>) {
    let rt = mailring_rt();
    let h = rt.handle().clone();
    let mut m = Meter::default();
    start_watchdog("pingpong_rtt/mailring_same_shard");
    g.bench_function("mailring_same_shard", |b| {
        b.iter_custom(|iters| {
            let n = iters * RTT_ROUNDS;
            m.measure(iters, || {
                let (to_pong, mut pong_rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
                let (to_ping, mut ping_rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
                h.spawn_on(ShardId::new(0), async move {
                    while let Some(v) = pong_rx.recv().await {
                        if to_ping.send(v).is_err() {
                            break;
                        }
                    }
                })
                .detach();
                let pinger = h.spawn_on(ShardId::new(0), async move {
                    let mut sum = 0u64;
                    for i in 0..n {
                        to_pong.send(i).unwrap();
                        sum = sum.wrapping_add(ping_rx.recv().await.unwrap());
                    }
                    sum
                });
                black_box(block_on(pinger).unwrap());
            })
        })
    });
    m.report("pingpong_rtt/mailring_same_shard", RTT_ROUNDS);
    rt.shutdown();
}

/// mailring native: the value rides in the MSG_RING completion (tiny messages).
fn pingpong_mailring_tiny(g: &mut BenchmarkGroup<WallTime>) {
    let rt = mailring_rt();
    let h = rt.handle().clone();
    let mut m = Meter::default();
    start_watchdog("pingpong_rtt/mailring_tiny");
    g.bench_function("mailring_tiny", |b| {
        b.iter_custom(|iters| {
            let n = iters * RTT_ROUNDS;
            m.measure(iters, || {
                let ponger = h.spawn_on(ShardId::new(1), async move {
                    loop {
                        let msg = hot::next_tiny(T_PING).await;
                        if msg.value == u32::MAX {
                            break;
                        }
                        hot::send_tiny(ShardId::new(0), T_PONG, msg.value);
                    }
                });
                let pinger = h.spawn_on(ShardId::new(0), async move {
                    let mut sum = 0u64;
                    for i in 0..n {
                        hot::send_tiny(ShardId::new(1), T_PING, (i % 1_000_000) as u32);
                        sum = sum.wrapping_add(u64::from(hot::next_tiny(T_PONG).await.value));
                    }
                    hot::send_tiny(ShardId::new(1), T_PING, u32::MAX);
                    sum
                });
                black_box(block_on(pinger).unwrap());
                block_on(ponger).unwrap();
            })
        })
    });
    m.report("pingpong_rtt/mailring_tiny", RTT_ROUNDS);
    rt.shutdown();
}

/// mailring, same channel as the tokio peer, 100k u64 one way, then an ack.
fn oneway_mailring(g: &mut BenchmarkGroup<WallTime>) {
    let rt = mailring_rt();
    let h = rt.handle().clone();
    let mut m = Meter::default();
    start_watchdog("oneway_send_drain/mailring");
    g.bench_function("mailring", |b| {
        b.iter_custom(|iters| {
            m.measure(iters, || {
                for _ in 0..iters {
                    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
                    let (ack_tx, ack_rx) = tokio::sync::oneshot::channel::<u64>();
                    h.spawn_on(ShardId::new(1), async move {
                        let mut sum = 0u64;
                        let mut got = 0;
                        while got < ONEWAY_MSGS {
                            sum = sum.wrapping_add(rx.recv().await.unwrap());
                            got += 1;
                        }
                        let _ = ack_tx.send(sum);
                    })
                    .detach();
                    let sender = h.spawn_on(ShardId::new(0), async move {
                        for i in 0..ONEWAY_MSGS {
                            tx.send(i).unwrap();
                        }
                        ack_rx.await.unwrap()
                    });
                    black_box(block_on(sender).unwrap());
                }
            })
        })
    });
    m.report("oneway_send_drain/mailring", ONEWAY_MSGS);
    rt.shutdown();
}

/// mailring native: 100k increments of a coalesced hot counter (tiny messages
/// summed per destination on the sender and into a counter on the receiver).
fn oneway_mailring_hot(g: &mut BenchmarkGroup<WallTime>) {
    let rt = mailring_rt();
    let h = rt.handle().clone();
    let mut m = Meter::default();
    start_watchdog("oneway_send_drain/mailring_hot");
    g.bench_function("mailring_hot", |b| {
        b.iter_custom(|iters| {
            m.measure(iters, || {
                for _ in 0..iters {
                    let receiver = h.spawn_on(ShardId::new(1), async move {
                        let mut got = 0u64;
                        while got < ONEWAY_MSGS {
                            got += hot::next_hot_count(T_DATA).await;
                        }
                        got
                    });
                    let sender = h.spawn_on(ShardId::new(0), async move {
                        for _ in 0..ONEWAY_MSGS {
                            hot::send_tiny(ShardId::new(1), T_DATA, 1);
                        }
                        receiver.await.unwrap()
                    });
                    black_box(block_on(sender).unwrap());
                }
            })
        })
    });
    m.report("oneway_send_drain/mailring_hot", ONEWAY_MSGS);
    rt.shutdown();
}

fn fanout_mailring(g: &mut BenchmarkGroup<WallTime>, group: &str, skewed: bool) {
    let rt = mailring_rt();
    let h = rt.handle().clone();
    let mut m = Meter::default();
    let id = format!("{group}/mailring");
    start_watchdog(&id);
    g.bench_function("mailring", |b| {
        b.iter_custom(|iters| {
            m.measure(iters, || {
                for _ in 0..iters {
                    let coordinator = h.spawn_on(ShardId::new(0), async move {
                        let handles: Vec<_> = (0..FANOUT_TASKS)
                            .map(|t| {
                                mailring::spawn(
                                    async move { synthetic_work(t, work_iters(t, skewed)) },
                                )
                            })
                            .collect();
                        let mut acc = 0u64;
                        for jh in handles {
                            acc = acc.wrapping_add(jh.await.unwrap());
                        }
                        acc
                    });
                    black_box(block_on(coordinator).unwrap());
                }
            })
        })
    });
    m.report(&id, FANOUT_TASKS);
    rt.shutdown();
}

fn timers_mailring(g: &mut BenchmarkGroup<WallTime>) {
    let rt = mailring_rt();
    let h = rt.handle().clone();
    let mut m = Meter::default();
    start_watchdog("timer_storm/mailring");
    g.bench_function("mailring", |b| {
        b.iter_custom(|iters| {
            m.measure(iters, || {
                let task = h.spawn_on(ShardId::new(0), async move {
                    let mut pending = 0usize;
                    for _ in 0..iters {
                        let now = Instant::now();
                        let mut v: Vec<mailring::time::Sleep> = Vec::with_capacity(TIMERS);
                        for i in 0..TIMERS {
                            if i % YIELD_EVERY == YIELD_EVERY - 1 {
                                mailring::yield_now().await;
                            }
                            let mut s = mailring::time::sleep_until(now + TIMER_D1 + jitter(i));
                            if poll_noop(Pin::new(&mut s)).is_pending() {
                                pending += 1;
                            }
                            v.push(s);
                        }
                        for (i, s) in v.iter_mut().enumerate() {
                            if i % YIELD_EVERY == YIELD_EVERY - 1 {
                                mailring::yield_now().await;
                            }
                            s.reset(now + TIMER_D2 + jitter(i));
                        }
                        drop(v);
                    }
                    pending
                });
                let pending = block_on(task).unwrap();
                assert_eq!(
                    pending as u64,
                    iters * TIMERS as u64,
                    "mailring timers not registered"
                );
            })
        })
    });
    m.report("timer_storm/mailring", TIMERS as u64);
    rt.shutdown();
}

/// The placement mailring's shards have, given to tokio: each task alone on a
/// single-threaded runtime on its own thread, so every round trip crosses
/// threads (the multi-thread runtime above mostly keeps both tasks on one
/// worker through its LIFO slot). A thread with nothing to run parks, as tokio
/// does, and the other wakes it.
fn pingpong_tokio_two_threads(g: &mut BenchmarkGroup<WallTime>) {
    let mut m = Meter::default();
    start_watchdog("pingpong_rtt_across_threads/tokio_two_threads");
    g.bench_function("tokio_two_threads", |b| {
        b.iter_custom(|iters| {
            let n = iters * RTT_ROUNDS;
            let (to_pong, mut pong_rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
            let (to_ping, mut ping_rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
            let ponger = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .expect("tokio runtime");
                rt.block_on(async move {
                    while let Some(v) = pong_rx.recv().await {
                        if to_ping.send(v).is_err() {
                            break;
                        }
                    }
                });
            });
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("tokio runtime");
            let wall = m.measure(iters, || {
                black_box(rt.block_on(async move {
                    let mut sum = 0u64;
                    for i in 0..n {
                        to_pong.send(i).unwrap();
                        sum = sum.wrapping_add(ping_rx.recv().await.unwrap());
                    }
                    sum
                }));
            });
            ponger.join().unwrap();
            wall
        })
    });
    m.report("pingpong_rtt_across_threads/tokio_two_threads", RTT_ROUNDS);
}

/// Ping-pong where both sides are known to run on different cores: mailring's
/// two shards against tokio with one task per thread (at about 12 µs a round
/// trip it takes ~1.2 s a batch, so this group takes fewer samples).
fn bench_pingpong_across_threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("pingpong_rtt_across_threads");
    g.throughput(Throughput::Elements(RTT_ROUNDS));
    g.sample_size(10);
    pingpong_mailring(&mut g, "pingpong_rtt_across_threads");
    pingpong_tokio_two_threads(&mut g);
    g.finish();
}

fn bench_pingpong(c: &mut Criterion) {
    let mut g = c.benchmark_group("pingpong_rtt");
    g.throughput(Throughput::Elements(RTT_ROUNDS));
    pingpong_mailring(&mut g, "pingpong_rtt");
    pingpong_mailring_same_shard(&mut g);
    pingpong_mailring_tiny(&mut g);
    pingpong_tokio(&mut g);
    pingpong_spargio(&mut g);
    pingpong_spargio_chan(&mut g);
    g.finish();
}

// ---------------------------------------------------------------- oneway_send_drain

fn oneway_tokio(g: &mut BenchmarkGroup<WallTime>) {
    let rt = tokio_rt();
    let mut m = Meter::default();
    start_watchdog("oneway_send_drain/tokio");
    g.bench_function("tokio", |b| {
        b.iter_custom(|iters| {
            m.measure(iters, || {
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
                let (ack_tx, mut ack_rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
                rt.spawn(async move {
                    for _ in 0..iters {
                        let mut sum = 0u64;
                        for _ in 0..ONEWAY_MSGS {
                            sum = sum.wrapping_add(rx.recv().await.unwrap());
                        }
                        ack_tx.send(sum).unwrap();
                    }
                });
                let sender = rt.spawn(async move {
                    let mut acc = 0u64;
                    for _ in 0..iters {
                        for i in 0..ONEWAY_MSGS {
                            tx.send(i).unwrap();
                        }
                        acc = acc.wrapping_add(ack_rx.recv().await.unwrap()); // barrier
                    }
                    acc
                });
                black_box(rt.block_on(sender).unwrap());
            })
        })
    });
    m.report("oneway_send_drain/tokio", ONEWAY_MSGS);
}

/// msg_ring oneway.  `batch == false`: one `ctx.send_raw_direct_nowait` per
/// message (one MsgRingData SQE each, no intermediate queue).  `batch == true`:
/// a single `ctx.send_many_raw_nowait` (payload queue + one doorbell SQE), which
/// needs `msg_ring_queue_capacity >= N` -- with the default 4096 the overflow is
/// SILENTLY dropped (only `ring_msgs_backpressure` counts it) and the barrier hangs.
/// Payload is u32 not u64: msg_ring carries a 16-bit tag + 32-bit value.
fn oneway_spargio(g: &mut BenchmarkGroup<WallTime>, batch: bool) {
    let id = if batch { "spargio_batch" } else { "spargio" };
    let rt = if batch {
        spargio::Runtime::builder()
            .shards(2)
            .ring_entries(4096)
            .msg_ring_queue_capacity(ONEWAY_MSGS as usize * 2)
            .build()
            .expect("spargio runtime")
    } else {
        spargio_rt()
    };
    let h = rt.handle();
    let label = format!("oneway_send_drain/{id}");
    let mut m = Meter::default();
    start_watchdog(&label);
    g.bench_function(id, |b| {
        b.iter_custom(|iters| {
            m.measure(iters, || {
                let receiver = h
                    .spawn_local_on(1, move |ctx: ShardCtx| async move {
                        for _ in 0..iters {
                            let mut sum = 0u64;
                            let mut got = 0u64;
                            while got < ONEWAY_MSGS {
                                let (tag, val) = next_ring_msg(next_event_unwedged(&ctx).await);
                                if tag == T_DATA {
                                    sum = sum.wrapping_add(u64::from(val));
                                    got += 1;
                                }
                            }
                            ctx.send_raw_nowait(0, T_ACK, sum as u32).unwrap();
                        }
                    })
                    .unwrap();
                let sender = h
                    .spawn_local_on(0, move |ctx: ShardCtx| async move {
                        let mut acc = 0u64;
                        for _ in 0..iters {
                            if batch {
                                ctx.send_many_raw_nowait(
                                    1,
                                    (0..ONEWAY_MSGS).map(|i| (T_DATA, i as u32)),
                                )
                                .unwrap();
                            } else {
                                for i in 0..ONEWAY_MSGS {
                                    ctx.send_raw_direct_nowait(1, T_DATA, i as u32).unwrap();
                                }
                            }
                            loop {
                                let (tag, val) = next_ring_msg(ctx.next_event().await);
                                if tag == T_ACK {
                                    acc = acc.wrapping_add(u64::from(val));
                                    break;
                                }
                            }
                        }
                        acc
                    })
                    .unwrap();
                black_box(block_on(sender).unwrap());
                block_on(receiver).unwrap();
            })
        })
    });
    m.report(&label, ONEWAY_MSGS);
    spargio_stats(&label, &h);
    spargio_shutdown(rt);
}

fn oneway_spargio_chan(g: &mut BenchmarkGroup<WallTime>) {
    let rt = spargio_rt();
    let h = rt.handle();
    let mut m = Meter::default();
    start_watchdog("oneway_send_drain/spargio_chan");
    g.bench_function("spargio_chan", |b| {
        b.iter_custom(|iters| {
            m.measure(iters, || {
                let (tx, mut rx) = futures::channel::mpsc::unbounded::<u64>();
                let (ack_tx, mut ack_rx) = futures::channel::mpsc::unbounded::<u64>();
                let receiver = h
                    .spawn_pinned(1, async move {
                        for _ in 0..iters {
                            let mut sum = 0u64;
                            for _ in 0..ONEWAY_MSGS {
                                sum = sum.wrapping_add(rx.next().await.unwrap());
                            }
                            ack_tx.unbounded_send(sum).unwrap();
                        }
                    })
                    .unwrap();
                let sender = h
                    .spawn_pinned(0, async move {
                        let mut acc = 0u64;
                        for _ in 0..iters {
                            for i in 0..ONEWAY_MSGS {
                                tx.unbounded_send(i).unwrap();
                            }
                            acc = acc.wrapping_add(ack_rx.next().await.unwrap());
                        }
                        acc
                    })
                    .unwrap();
                black_box(block_on(sender).unwrap());
                block_on(receiver).unwrap();
            })
        })
    });
    m.report("oneway_send_drain/spargio_chan", ONEWAY_MSGS);
    spargio_stats("oneway_send_drain/spargio_chan", &h);
    spargio_shutdown(rt);
}

fn bench_oneway(c: &mut Criterion) {
    let mut g = c.benchmark_group("oneway_send_drain");
    g.throughput(Throughput::Elements(ONEWAY_MSGS));
    oneway_mailring(&mut g);
    oneway_mailring_hot(&mut g);
    oneway_tokio(&mut g);
    oneway_spargio(&mut g, false);
    oneway_spargio(&mut g, true);
    oneway_spargio_chan(&mut g);
    g.finish();
}

// ---------------------------------------------------------------- fanout_fanin

fn fanout_tokio(g: &mut BenchmarkGroup<WallTime>, group: &str, skewed: bool) {
    let rt = tokio_rt();
    let mut m = Meter::default();
    start_watchdog(&format!("{group}/tokio"));
    g.bench_function("tokio", |b| {
        b.iter_custom(|iters| {
            m.measure(iters, || {
                let coord = rt.spawn(async move {
                    let mut sum = 0u64;
                    for _ in 0..iters {
                        let mut joins = Vec::with_capacity(FANOUT_TASKS as usize);
                        for t in 0..FANOUT_TASKS {
                            let w = work_iters(t, skewed);
                            joins.push(tokio::spawn(async move { synthetic_work(t, w) }));
                        }
                        for j in joins {
                            sum = sum.wrapping_add(j.await.unwrap());
                        }
                    }
                    sum
                });
                black_box(rt.block_on(coord).unwrap());
            })
        })
    });
    m.report(&format!("{group}/tokio"), FANOUT_TASKS);
}

/// Coordinator pinned on shard 0, children via RuntimeHandle::spawn_stealable.
fn fanout_spargio(g: &mut BenchmarkGroup<WallTime>, group: &str, skewed: bool) {
    let rt = spargio_rt();
    let h = rt.handle();
    let mut m = Meter::default();
    start_watchdog(&format!("{group}/spargio"));
    g.bench_function("spargio", |b| {
        b.iter_custom(|iters| {
            m.measure(iters, || {
                let h2 = h.clone();
                let coord = h
                    .spawn_pinned(0, async move {
                        let mut sum = 0u64;
                        for _ in 0..iters {
                            let mut joins = Vec::with_capacity(FANOUT_TASKS as usize);
                            for t in 0..FANOUT_TASKS {
                                let w = work_iters(t, skewed);
                                joins.push(
                                    h2.spawn_stealable(async move { synthetic_work(t, w) })
                                        .expect("spawn_stealable"),
                                );
                            }
                            for j in joins {
                                sum = sum.wrapping_add(j.await.unwrap());
                            }
                        }
                        sum
                    })
                    .unwrap();
                black_box(block_on(coord).unwrap());
            })
        })
    });
    m.report(&format!("{group}/spargio"), FANOUT_TASKS);
    spargio_stats(&format!("{group}/spargio"), &h);
    spargio_shutdown(rt);
}

fn bench_fanout(c: &mut Criterion) {
    for (group, skewed) in [
        ("fanout_fanin_balanced", false),
        ("fanout_fanin_skewed", true),
    ] {
        let mut g = c.benchmark_group(group);
        g.throughput(Throughput::Elements(FANOUT_TASKS));
        fanout_mailring(&mut g, group, skewed);
        fanout_tokio(&mut g, group, skewed);
        fanout_spargio(&mut g, group, skewed);
        g.finish();
    }
}

// ---------------------------------------------------------------- timer_storm

/// Deadlines spread over 100ms (distinct wheel slots / hrtimer keys) rather
/// than 100k identical deadlines.
fn jitter(i: usize) -> Duration {
    Duration::from_micros((i * 7 % 100_000) as u64)
}

/// Both storms give their scheduler a turn every YIELD_EVERY timers: tokio via a
/// self-waking yield, spargio via `ctx.flush().await` (a Nop round trip through
/// the ring -- a self-waking future would NOT return to spargio's shard loop,
/// because futures' LocalPool::run_until_stalled re-polls it immediately).
/// Without giving the shard loop turns, spargio queues all 200k SQEs and only
/// submits/reaps at the end of the batch; with short deadlines a burst of
/// more than 2*ring_entries timer CQEs then overflowed the CQ and the runtime wedged
/// (completions parked in the kernel overflow list, which spargio never flushes
/// when it has nothing to submit).
const YIELD_EVERY: usize = 1024;

/// Polls once with a noop waker (Context built per call so it is never held
/// across an await; keeps the tokio future Send).
fn poll_noop<F: Future + ?Sized>(f: Pin<&mut F>) -> Poll<F::Output> {
    f.poll(&mut Context::from_waker(futures::task::noop_waker_ref()))
}

struct YieldNow(bool);
impl Future for YieldNow {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// tokio: 100k boxed Sleeps, each polled once with a noop waker (registers it
/// in the wheel), then Sleep::reset to a later deadline (re-registers in place),
/// then all dropped (deregistered).  Runs under task::unconstrained so the coop
/// budget does not turn polls into no-ops after 128 polls.
fn timers_tokio(g: &mut BenchmarkGroup<WallTime>) {
    let rt = tokio_rt();
    let mut m = Meter::default();
    start_watchdog("timer_storm/tokio");
    g.bench_function("tokio", |b| {
        b.iter_custom(|iters| {
            m.measure(iters, || {
                let task = rt.spawn(tokio::task::unconstrained(async move {
                    let mut pending = 0usize;
                    for _ in 0..iters {
                        let now = tokio::time::Instant::now();
                        let mut v: Vec<Pin<Box<tokio::time::Sleep>>> = Vec::with_capacity(TIMERS);
                        for i in 0..TIMERS {
                            if i % YIELD_EVERY == YIELD_EVERY - 1 {
                                YieldNow(false).await;
                            }
                            let mut s =
                                Box::pin(tokio::time::sleep_until(now + TIMER_D1 + jitter(i)));
                            if poll_noop(s.as_mut()).is_pending() {
                                pending += 1;
                            }
                            v.push(s);
                        }
                        for (i, s) in v.iter_mut().enumerate() {
                            if i % YIELD_EVERY == YIELD_EVERY - 1 {
                                YieldNow(false).await;
                            }
                            s.as_mut().reset(now + TIMER_D2 + jitter(i));
                        }
                        drop(v);
                    }
                    pending
                }));
                let pending = rt.block_on(task).unwrap();
                assert_eq!(
                    pending as u64,
                    iters * TIMERS as u64,
                    "tokio timers not registered"
                );
            })
        })
    });
    m.report("timer_storm/tokio", TIMERS as u64);
}

/// spargio: spargio::Sleep (resettable).  First poll enqueues an io_uring
/// Timeout SQE; reset() only swaps the inner future, so each Sleep is polled
/// again after reset to arm the new deadline (a second SQE); drop cannot cancel
/// the kernel timeout (no TimeoutRemove) -- it fires later and its CQE is
/// discarded.  `ctx.flush().await` every YIELD_EVERY timers and at
/// the end of each batch makes sure all SQEs are submitted inside the timed region.
fn timers_spargio(g: &mut BenchmarkGroup<WallTime>) {
    // max SQ size; CQ = 65536, headroom for the orphaned timeouts' completions
    let rt = spargio::Runtime::builder()
        .shards(2)
        .ring_entries(32768)
        .build()
        .expect("spargio runtime");
    let h = rt.handle();
    let mut m = Meter::default();
    start_watchdog("timer_storm/spargio");
    g.bench_function("spargio", |b| {
        b.iter_custom(|iters| {
            m.measure(iters, || {
                let task = h
                    .spawn_local_on(0, move |ctx: ShardCtx| async move {
                        let mut pending = 0usize;
                        for _ in 0..iters {
                            let now = Instant::now();
                            let mut v: Vec<spargio::Sleep> = Vec::with_capacity(TIMERS);
                            for i in 0..TIMERS {
                                if i % YIELD_EVERY == YIELD_EVERY - 1 {
                                    ctx.flush().unwrap().await.unwrap();
                                }
                                let mut s = spargio::Sleep::until(now + TIMER_D1 + jitter(i));
                                if poll_noop(Pin::new(&mut s)).is_pending() {
                                    pending += 1;
                                }
                                v.push(s);
                            }
                            for (i, s) in v.iter_mut().enumerate() {
                                if i % YIELD_EVERY == YIELD_EVERY - 1 {
                                    ctx.flush().unwrap().await.unwrap();
                                }
                                s.reset(now + TIMER_D2 + jitter(i));
                                let _ = poll_noop(Pin::new(s));
                            }
                            drop(v);
                            ctx.flush().unwrap().await.unwrap();
                        }
                        pending
                    })
                    .unwrap();
                let pending = block_on(task).unwrap();
                assert_eq!(
                    pending as u64,
                    iters * TIMERS as u64,
                    "spargio timers not registered"
                );
            })
        })
    });
    m.report("timer_storm/spargio", TIMERS as u64);
    spargio_stats("timer_storm/spargio", &h);
    eprintln!(
        "[spargio-stats] timer_storm/spargio: kernel timeouts still armed at shutdown = {}",
        h.stats_snapshot().pending_native_ops
    );
    spargio_shutdown(rt);
}

fn bench_timers(c: &mut Criterion) {
    let mut g = c.benchmark_group("timer_storm");
    g.throughput(Throughput::Elements(TIMERS as u64));
    timers_mailring(&mut g);
    timers_tokio(&mut g);
    timers_spargio(&mut g);
    g.finish();
}

// ---------------------------------------------------------------- timer_deadline_rounds

/// The shape of the seed's `timer_cancel_reschedule_storm`: rounds of
/// DEADLINE_BATCH request deadlines, each created, registered, pushed back and
/// cancelled, with a 1 µs pause between rounds. It measures timer bookkeeping
/// and timer resolution together: tokio's wheel counts whole milliseconds, so
/// its 1 µs sleep lasts until the next millisecond tick.
const DEADLINE_ROUNDS: usize = 100;
const DEADLINE_BATCH: usize = 256;
const DEADLINE_PAUSE: Duration = Duration::from_micros(1);

fn deadline_rounds_mailring(g: &mut BenchmarkGroup<WallTime>) {
    let rt = mailring_rt();
    let h = rt.handle().clone();
    let mut m = Meter::default();
    start_watchdog("timer_deadline_rounds/mailring");
    g.bench_function("mailring", |b| {
        b.iter_custom(|iters| {
            m.measure(iters, || {
                let task = h.spawn_on(ShardId::new(0), async move {
                    let mut pending = 0usize;
                    for _ in 0..iters {
                        for _ in 0..DEADLINE_ROUNDS {
                            let now = mailring::time::now();
                            for i in 0..DEADLINE_BATCH {
                                pending += usize::from(mailring_deadline(now, i));
                            }
                            mailring::time::sleep(DEADLINE_PAUSE).await;
                        }
                    }
                    pending
                });
                let pending = block_on(task).unwrap();
                assert_eq!(
                    pending as u64,
                    iters * (DEADLINE_ROUNDS * DEADLINE_BATCH) as u64
                );
            })
        })
    });
    m.report("timer_deadline_rounds/mailring", DEADLINE_ROUNDS as u64);
    rt.shutdown();
}

fn deadline_rounds_tokio(g: &mut BenchmarkGroup<WallTime>) {
    let rt = tokio_rt();
    let mut m = Meter::default();
    start_watchdog("timer_deadline_rounds/tokio");
    g.bench_function("tokio", |b| {
        b.iter_custom(|iters| {
            m.measure(iters, || {
                let task = rt.spawn(tokio::task::unconstrained(async move {
                    let mut pending = 0usize;
                    for _ in 0..iters {
                        for _ in 0..DEADLINE_ROUNDS {
                            let now = tokio::time::Instant::now();
                            for i in 0..DEADLINE_BATCH {
                                pending += usize::from(tokio_deadline(now, i));
                            }
                            tokio::time::sleep(DEADLINE_PAUSE).await;
                        }
                    }
                    pending
                }));
                let pending = rt.block_on(task).unwrap();
                assert_eq!(
                    pending as u64,
                    iters * (DEADLINE_ROUNDS * DEADLINE_BATCH) as u64
                );
            })
        })
    });
    m.report("timer_deadline_rounds/tokio", DEADLINE_ROUNDS as u64);
}

fn bench_deadline_rounds(c: &mut Criterion) {
    let mut g = c.benchmark_group("timer_deadline_rounds");
    g.throughput(Throughput::Elements(DEADLINE_ROUNDS as u64));
    g.sample_size(20);
    deadline_rounds_mailring(&mut g);
    deadline_rounds_tokio(&mut g);
    g.finish();
}

// ---------------------------------------------------------------- external_wake

/// A thread outside the runtime wakes a sleeping shard (idle policy `Block`)
/// by spawning a trivial task on it and waits for the result: one external wake
/// per round trip, by `IORING_REGISTER_SEND_MSG_RING` or by eventfd.
fn external_wake_mailring(
    g: &mut BenchmarkGroup<WallTime>,
    name: &str,
    mode: mailring::ExternalWake,
) {
    let rt = mailring::Runtime::builder()
        .shards(2)
        .idle_policy(mailring::IdlePolicy::Block)
        .external_wake(mode)
        .build()
        .expect("mailring runtime");
    let h = rt.handle().clone();
    let mut m = Meter::default();
    let id = format!("external_wake/{name}");
    start_watchdog(&id);
    g.bench_function(name, |b| {
        b.iter_custom(|iters| {
            m.measure(iters, || {
                for _ in 0..iters * EXTERNAL_ROUNDS {
                    black_box(block_on(h.spawn_on(ShardId::new(1), async { 1u64 })).unwrap());
                }
            })
        })
    });
    m.report(&id, EXTERNAL_ROUNDS);
    eprintln!(
        "[mailring-stats] {id}: {:?}, external wakes {}",
        rt.stats().external_wake,
        rt.stats().external_wakes
    );
    rt.shutdown();
}

/// The same round trip into a tokio runtime (its workers park on a futex).
fn external_wake_tokio(g: &mut BenchmarkGroup<WallTime>) {
    let rt = tokio_rt();
    let mut m = Meter::default();
    start_watchdog("external_wake/tokio");
    g.bench_function("tokio", |b| {
        b.iter_custom(|iters| {
            m.measure(iters, || {
                for _ in 0..iters * EXTERNAL_ROUNDS {
                    black_box(block_on(rt.spawn(async { 1u64 })).unwrap());
                }
            })
        })
    });
    m.report("external_wake/tokio", EXTERNAL_ROUNDS);
}

fn bench_external_wake(c: &mut Criterion) {
    let mut g = c.benchmark_group("external_wake");
    g.throughput(Throughput::Elements(EXTERNAL_ROUNDS));
    external_wake_mailring(
        &mut g,
        "mailring_send_msg_ring",
        mailring::ExternalWake::SendMsgRing,
    );
    external_wake_mailring(&mut g, "mailring_eventfd", mailring::ExternalWake::EventFd);
    external_wake_tokio(&mut g);
    g.finish();
}

// ---------------------------------------------------------------- one deadline

/// One request deadline on mailring: created, registered, pushed back and
/// dropped (the churn and deadline-rounds step); `true` if it registered.
#[inline]
fn mailring_deadline(now: Instant, i: usize) -> bool {
    let mut s = mailring::time::sleep_until(now + TIMER_D1 + jitter(i));
    let registered = poll_noop(Pin::new(&mut s)).is_pending();
    s.reset(now + TIMER_D2 + jitter(i));
    drop(black_box(s));
    registered
}

/// The same step on tokio (its `Sleep` is `!Unpin`: pinned on the stack).
#[inline]
fn tokio_deadline(now: tokio::time::Instant, i: usize) -> bool {
    let mut s = std::pin::pin!(tokio::time::sleep_until(now + TIMER_D1 + jitter(i)));
    let registered = poll_noop(s.as_mut()).is_pending();
    s.as_mut().reset(now + TIMER_D2 + jitter(i));
    registered
}

// ---------------------------------------------------------------- timer_churn

/// The per-request timeout pattern: one timer at a time is created, registered,
/// pushed back, and cancelled when the "request" finishes; 100k in a row.
/// spargio is left out: its `Sleep` cannot be cancelled (each would leave two
/// kernel timeouts armed), so the batch would measure a leak, not a cancel.
fn churn_mailring(g: &mut BenchmarkGroup<WallTime>) {
    let rt = mailring_rt();
    let h = rt.handle().clone();
    let mut m = Meter::default();
    start_watchdog("timer_churn/mailring");
    g.bench_function("mailring", |b| {
        b.iter_custom(|iters| {
            m.measure(iters, || {
                let task = h.spawn_on(ShardId::new(0), async move {
                    let mut pending = 0usize;
                    for _ in 0..iters {
                        let now = Instant::now();
                        for i in 0..TIMERS {
                            if i % YIELD_EVERY == YIELD_EVERY - 1 {
                                mailring::yield_now().await;
                            }
                            pending += usize::from(mailring_deadline(now, i));
                        }
                    }
                    pending
                });
                let pending = block_on(task).unwrap();
                assert_eq!(
                    pending as u64,
                    iters * TIMERS as u64,
                    "mailring timers not registered"
                );
            })
        })
    });
    m.report("timer_churn/mailring", TIMERS as u64);
    rt.shutdown();
}

fn churn_tokio(g: &mut BenchmarkGroup<WallTime>) {
    let rt = tokio_rt();
    let mut m = Meter::default();
    start_watchdog("timer_churn/tokio");
    g.bench_function("tokio", |b| {
        b.iter_custom(|iters| {
            m.measure(iters, || {
                let task = rt.spawn(tokio::task::unconstrained(async move {
                    let mut pending = 0usize;
                    for _ in 0..iters {
                        let now = tokio::time::Instant::now();
                        for i in 0..TIMERS {
                            if i % YIELD_EVERY == YIELD_EVERY - 1 {
                                YieldNow(false).await;
                            }
                            pending += usize::from(tokio_deadline(now, i));
                        }
                    }
                    pending
                }));
                let pending = rt.block_on(task).unwrap();
                assert_eq!(
                    pending as u64,
                    iters * TIMERS as u64,
                    "tokio timers not registered"
                );
            })
        })
    });
    m.report("timer_churn/tokio", TIMERS as u64);
}

fn bench_timer_churn(c: &mut Criterion) {
    let mut g = c.benchmark_group("timer_churn");
    g.throughput(Throughput::Elements(TIMERS as u64));
    churn_mailring(&mut g);
    churn_tokio(&mut g);
    g.finish();
}

criterion_group!(
    benches,
    bench_pingpong,
    bench_pingpong_across_threads,
    bench_oneway,
    bench_fanout,
    bench_timers,
    bench_timer_churn,
    bench_deadline_rounds,
    bench_external_wake
);
criterion_main!(benches);
