//! Panic injection: a panic in any user code a shard runs is caught where it
//! runs, counted per kind in the shard's stats, passed to the `on_panic`
//! hook and kept for the `ShutdownReport`; the shard, its tasks and its
//! in-flight operations carry on.

use std::cell::Cell;
use std::future::Future;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::task::{Context, Wake, Waker};
use std::time::Duration;

use mailring::panic::PanicEvent;
use mailring::{CallbackKind, Runtime, ShardId, ShardJob, TickEndHook};

const S0: ShardId = ShardId::new(0);
const S1: ShardId = ShardId::new(1);

type Seen = Arc<Mutex<Vec<(Option<ShardId>, CallbackKind, String)>>>;

/// A two-shard runtime whose panic hook records every event.
fn rt_with_hook() -> (Runtime, Seen) {
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let rt = Runtime::builder()
        .shards(2)
        .on_panic(move |e: &PanicEvent<'_>| {
            log.lock()
                .unwrap()
                .push((e.shard, e.kind, e.message.to_owned()))
        })
        .build()
        .expect("io_uring runtime");
    (rt, seen)
}

/// Both shards still run tasks, timers and cross-shard wakes.
fn assert_shards_work(rt: &Runtime) {
    let h = rt.handle().clone();
    let sum = rt.block_on(async move {
        let a = h.spawn_on(S0, async {
            mailring::time::sleep(Duration::from_millis(1)).await;
            1
        });
        let b = h.spawn_on(S1, async {
            mailring::time::sleep(Duration::from_millis(1)).await;
            2
        });
        a.await.unwrap() + b.await.unwrap()
    });
    assert_eq!(sum, 3);
}

fn panics_of(rt: &Runtime, shard: ShardId, kind: CallbackKind) -> u64 {
    rt.stats().shards[shard.index()].panics.get(kind)
}

/// Waits (bounded) until `cond` holds.
fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_panicking_run_on_closure_is_counted_and_the_shard_goes_on() {
    let (rt, seen) = rt_with_hook();
    // A task on shard 1 waiting across the panic must still finish.
    let waiter = rt.handle().spawn_on(S1, async {
        mailring::time::sleep(Duration::from_millis(30)).await;
        7
    });
    rt.handle().run_on(S1, || panic!("closure boom"));
    eventually("the panic is counted", || {
        panics_of(&rt, S1, CallbackKind::RunOn) == 1
    });
    assert_eq!(rt.block_on(waiter).unwrap(), 7);
    assert_shards_work(&rt);
    assert_eq!(
        seen.lock().unwrap().as_slice(),
        &[(Some(S1), CallbackKind::RunOn, "closure boom".to_owned())]
    );
    let report = rt.shutdown();
    assert_eq!(report.panics.run_on, 1);
    assert_eq!(report.panic_records.len(), 1);
    assert_eq!(report.panic_records[0].message, "closure boom");
}

struct PanickingJob;

impl ShardJob for PanickingJob {
    fn run(self: Box<Self>) {
        panic!("job boom");
    }
}

#[test]
fn a_panicking_shard_job_is_counted_and_the_shard_goes_on() {
    let (rt, seen) = rt_with_hook();
    rt.handle().send_job(S0, Box::new(PanickingJob));
    eventually("the panic is counted", || {
        panics_of(&rt, S0, CallbackKind::Job) == 1
    });
    assert_shards_work(&rt);
    assert_eq!(seen.lock().unwrap()[0].1, CallbackKind::Job);
    assert_eq!(rt.shutdown().panics.job, 1);
}

struct PanickingHook(Rc<Cell<usize>>);

impl TickEndHook for PanickingHook {
    fn at_tick_end(&self, arg: usize) {
        self.0.set(self.0.get() + 1);
        if arg == 1 {
            panic!("hook boom");
        }
    }
}

#[test]
fn panicking_tick_end_callbacks_do_not_stop_the_ones_after_them() {
    let (rt, _seen) = rt_with_hook();
    let ran = rt.block_on_local(|| async {
        let ran = Rc::new(Cell::new(0));
        let hook: Rc<dyn TickEndHook> = Rc::new(PanickingHook(ran.clone()));
        assert!(mailring::defer_to_tick_end(|| panic!("closure at tick end")).is_ok());
        assert!(mailring::defer_hook_to_tick_end(hook.clone(), 1).is_ok());
        assert!(mailring::defer_hook_to_tick_end(hook, 2).is_ok());
        mailring::time::sleep(Duration::from_millis(2)).await;
        ran.get()
    });
    assert_eq!(ran, 2, "both hooks ran, the one after the panic too");
    assert_eq!(panics_of(&rt, S0, CallbackKind::TickEnd), 2);
    assert_shards_work(&rt);
    assert_eq!(rt.shutdown().panics.tick_end, 2);
}

/// A waker whose `wake` panics (and counts its calls).
struct PanickingWaker(AtomicUsize);

impl Wake for PanickingWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
        panic!("waker boom");
    }
}

#[test]
fn a_panicking_waker_woken_by_a_timer_is_caught_and_other_timers_fire() {
    let (rt, _seen) = rt_with_hook();
    let wakes = rt.block_on_local(|| async {
        let bad = Arc::new(PanickingWaker(AtomicUsize::new(0)));
        let waker = Waker::from(bad.clone());
        // Register the panicking waker on a timer, then keep the timer alive.
        let mut sleep = Box::pin(mailring::time::sleep(Duration::from_millis(1)));
        let mut cx = Context::from_waker(&waker);
        assert!(sleep.as_mut().poll(&mut cx).is_pending());
        // A timer of our own, due after it, still fires.
        mailring::time::sleep(Duration::from_millis(10)).await;
        drop(sleep);
        bad.0.load(Ordering::SeqCst)
    });
    assert_eq!(wakes, 1);
    assert_eq!(panics_of(&rt, S0, CallbackKind::Waker), 1);
    assert_shards_work(&rt);
}

/// Something whose `Drop` panics.
struct PanicOnDrop(&'static str);

impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            panic!("{}", self.0);
        }
    }
}

#[test]
fn a_detached_task_whose_output_panics_on_drop_is_caught() {
    let (rt, _seen) = rt_with_hook();
    let h = rt.handle().clone();
    rt.block_on(async move {
        h.spawn_on(S1, async { PanicOnDrop("output drop") })
            .detach();
        mailring::time::sleep(Duration::from_millis(10)).await;
    });
    eventually("the output's drop panic is counted", || {
        panics_of(&rt, S1, CallbackKind::Drop) == 1
    });
    assert_shards_work(&rt);
}

#[test]
fn an_aborted_task_whose_future_panics_on_drop_resolves_and_is_counted() {
    let (rt, _seen) = rt_with_hook();
    let h = rt.handle().clone();
    let err = rt.block_on(async move {
        let task = h.spawn_on(S1, async {
            let _guard = PanicOnDrop("future drop");
            std::future::pending::<()>().await
        });
        mailring::time::sleep(Duration::from_millis(2)).await;
        task.abort();
        task.await.unwrap_err()
    });
    assert!(err.is_cancelled());
    assert_eq!(panics_of(&rt, S1, CallbackKind::Drop), 1);
    assert_shards_work(&rt);
}

#[test]
fn a_task_panic_is_counted_and_reported_as_well_as_returned() {
    let (rt, seen) = rt_with_hook();
    let h = rt.handle().clone();
    let err = rt.block_on(async move {
        h.spawn_on(S1, async { panic!("task boom") })
            .await
            .unwrap_err()
    });
    assert!(err.is_panic());
    assert_eq!(panics_of(&rt, S1, CallbackKind::Task), 1);
    assert_eq!(
        seen.lock().unwrap().as_slice(),
        &[(Some(S1), CallbackKind::Task, "task boom".to_owned())]
    );
}

#[test]
fn a_panicking_hook_does_not_take_the_shard_down() {
    let rt = Runtime::builder()
        .shards(2)
        .on_panic(|_| panic!("the hook itself"))
        .build()
        .unwrap();
    rt.handle().run_on(S0, || panic!("first"));
    eventually("the panic is counted", || {
        panics_of(&rt, S0, CallbackKind::RunOn) == 1
    });
    assert_shards_work(&rt);
}

/// The original crash: a panic on a shard with an operation in flight. The
/// shard must keep its ring and op table: the read completes later.
#[test]
fn a_panic_on_a_shard_with_io_in_flight_keeps_the_io_working() {
    let (rt, _seen) = rt_with_hook();
    let (started_tx, started_rx) = mpsc::channel();
    let (peer_tx, peer_rx) = mpsc::channel();
    let reader = rt.handle().spawn_local_on(S1, move || async move {
        let (a, b) = mailring::net::UnixStream::pair().unwrap();
        let b = b.into_std_for_test();
        peer_tx.send(b).unwrap();
        started_tx.send(()).unwrap();
        let (res, buf) = a.recv(vec![0u8; 16]).await;
        let n = res.unwrap();
        buf[..n].to_vec()
    });
    started_rx.recv_timeout(Duration::from_secs(5)).unwrap();
    std::thread::sleep(Duration::from_millis(5));
    rt.handle().run_on(S1, || panic!("mid-read"));
    eventually("the panic is counted", || {
        panics_of(&rt, S1, CallbackKind::RunOn) == 1
    });
    use std::io::Write;
    let mut peer = peer_rx.recv().unwrap();
    peer.write_all(b"still here").unwrap();
    assert_eq!(rt.block_on(reader).unwrap(), b"still here");
    let report = rt.shutdown();
    assert_eq!(report.ops_leaked, 0);
}

trait IntoStdForTest {
    fn into_std_for_test(self) -> std::os::unix::net::UnixStream;
}

impl IntoStdForTest for mailring::net::UnixStream {
    fn into_std_for_test(self) -> std::os::unix::net::UnixStream {
        use std::os::fd::{AsRawFd, FromRawFd};
        // The mailring stream is leaked on purpose: its fd is handed over.
        let fd = self.as_raw_fd();
        std::mem::forget(self);
        // SAFETY: the fd is open and owned by nobody else from here on.
        unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) }
    }
}

/// A closure and a job sent after shutdown are dropped unrun; a `Drop` that
/// panics there is caught too, off the shards.
#[test]
fn closures_refused_after_shutdown_are_dropped_and_their_drop_panics_caught() {
    let (rt, seen) = rt_with_hook();
    let handle = rt.handle().clone();
    rt.shutdown();
    let guard = PanicOnDrop("refused closure");
    handle.run_on(S0, move || drop(guard));
    let last = seen.lock().unwrap().last().cloned();
    assert_eq!(
        last,
        Some((None, CallbackKind::Drop, "refused closure".to_owned()))
    );
}

#[test]
fn a_runtime_that_ran_cleanly_reports_a_clean_shutdown() {
    let rt = Runtime::builder().shards(1).build().unwrap();
    assert_eq!(rt.block_on(async { 1 }), 1);
    assert!(rt.shutdown().is_clean());
}

#[test]
fn a_panicking_waker_on_a_direct_arrival_loses_no_other_completion() {
    // Two shards with direct-descriptor tables, panics recorded.
    let rt = Runtime::builder()
        .shards(2)
        .direct_descriptors(16)
        .on_panic(|_: &PanicEvent<'_>| {})
        .build()
        .expect("io_uring runtime");
    let (tickets_tx, tickets_rx) =
        mpsc::channel::<(mailring::net::DirectTicket, mailring::net::DirectTicket)>();
    let (block_tx, block_rx) = mpsc::channel::<()>();
    // Shard 1 blocks its thread while both moves are sent, so both
    // arrivals are reaped in one batch once it goes on.
    let target = rt.handle().spawn_on(S1, async move {
        block_rx.recv().unwrap();
        let (first, second) = tickets_rx.recv().unwrap();
        // The first arrival is awaited by a panicking waker (its future
        // kept), the second as usual: it must still come.
        let bad = Arc::new(PanickingWaker(AtomicUsize::new(0)));
        let waker = Waker::from(bad.clone());
        let mut first = Box::pin(first.receive());
        assert!(first
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_pending());
        let second = mailring::time::timeout(Duration::from_secs(5), second.receive()).await;
        // The first arrived as well: its slot is there to take.
        let first = first.await;
        (
            second.map(|s| s.is_ok()),
            first.is_ok(),
            bad.0.load(Ordering::SeqCst),
        )
    });
    let moved = rt.block_on(async move {
        let listener = mailring::net::TcpListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr();
        let clients = std::thread::spawn(move || {
            let a = std::net::TcpStream::connect(addr).unwrap();
            let b = std::net::TcpStream::connect(addr).unwrap();
            (a, b)
        });
        let mut direct = Vec::new();
        for _ in 0..2 {
            let (stream, _) = listener.accept().await.unwrap();
            match mailring::net::DirectStream::from_tcp(stream).await {
                Ok(d) => direct.push(d),
                Err((e, _)) => {
                    eprintln!("skipped: no direct descriptors here ({e})");
                    return None;
                }
            }
        }
        let second = direct.pop().unwrap();
        let first = direct.pop().unwrap();
        block_tx.send(()).unwrap();
        // Shard 1 is blocked from here on.
        mailring::time::sleep(Duration::from_millis(20)).await;
        let first = first.send_to_shard(S1).await.map_err(|(e, _)| e);
        let second = second.send_to_shard(S1).await.map_err(|(e, _)| e);
        match (first, second) {
            (Ok(a), Ok(b)) => {
                tickets_tx.send((a, b)).unwrap();
                Some(clients.join().unwrap())
            }
            (Err(e), _) | (_, Err(e)) => {
                eprintln!("skipped: no moves between rings here ({e})");
                None
            }
        }
    });
    let Some(_clients) = moved else {
        // Shard 1's task found its channels closed (its panic is the
        // join's error).
        let _ = rt.block_on(target);
        return;
    };
    let (second, first, wakes) = rt.block_on(target).unwrap();
    assert_eq!(second, Ok(true), "the second arrival was lost");
    assert!(first, "the first arrival was lost");
    assert_eq!(wakes, 1);
    assert_eq!(panics_of(&rt, S1, CallbackKind::Waker), 1);
    assert_eq!(panics_of(&rt, S1, CallbackKind::Runtime), 0);
    rt.shutdown();
}
