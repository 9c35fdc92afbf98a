//! Signals as futures, in a binary of their own (`harness = false`): the
//! handlers are process-wide, so no other test shares this process.

use std::time::{Duration, Instant};

use mailring::signal::{ctrl_c, signal, SignalKind};

fn main() {
    if std::env::var_os("MAILRING_SIGNAL_CHILD").is_some() {
        // A program that never asks for signals: SIGINT ends it as usual.
        // SAFETY: raising a signal in our own process.
        unsafe { libc::raise(libc::SIGINT) };
        std::thread::sleep(Duration::from_secs(5));
        std::process::exit(0); // not reached
    }
    if std::env::var_os("MAILRING_SIGNAL_CHILD_CTRL_C").is_some() {
        // `ctrl_c()` made, not yet awaited: Ctrl-C is taken from then on.
        let stop = ctrl_c();
        // SAFETY: raising a signal in our own process.
        unsafe { libc::raise(libc::SIGINT) };
        let rt = mailring::Runtime::builder().shards(1).build().unwrap();
        let done = rt
            .block_on(async move { mailring::time::timeout(Duration::from_secs(10), stop).await });
        std::process::exit(if matches!(done, Ok(Ok(()))) { 0 } else { 3 });
    }
    a_program_that_never_asks_keeps_its_default_ctrl_c();
    ctrl_c_takes_ctrl_c_from_its_call_not_its_first_poll();
    refused_signals_are_an_error_not_a_handler();
    a_delivery_before_the_wait_is_not_lost();
    ctrl_c_wakes_a_task_on_a_shard();
    sigterm_wakes_every_listener();
    a_wait_dropped_leaves_no_waker_behind();
    a_panicking_waker_does_not_end_the_deliveries();
    a_delivery_wakes_only_the_waits_on_its_own_signal();
    println!("signals: 9 tests passed");
}

/// This test binary run again as a child with `mode` set in its
/// environment, SIGINT at its default (as from an interactive shell: a
/// test runner started in the background of a script inherits SIGINT
/// ignored, and exec keeps an ignored signal ignored); how it ended.
fn run_child(mode: &str) -> std::process::ExitStatus {
    use std::os::unix::process::CommandExt;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap());
    child.env(mode, "1");
    // SAFETY: `signal` is async-signal-safe; nothing else runs in the child
    // between fork and exec.
    unsafe {
        child.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        });
    }
    child.status().unwrap()
}

fn a_program_that_never_asks_keeps_its_default_ctrl_c() {
    use std::os::unix::process::ExitStatusExt;
    let status = run_child("MAILRING_SIGNAL_CHILD");
    assert_eq!(status.signal(), Some(libc::SIGINT), "{status:?}");
}

/// A program that makes `ctrl_c()` during its start and awaits it later
/// is not ended by a Ctrl-C in between: the handler is installed by the
/// call, and the future completes for that Ctrl-C.
fn ctrl_c_takes_ctrl_c_from_its_call_not_its_first_poll() {
    use std::os::unix::process::ExitStatusExt;
    let status = run_child("MAILRING_SIGNAL_CHILD_CTRL_C");
    assert_eq!(
        (status.code(), status.signal()),
        (Some(0), None),
        "{status:?}"
    );
}

fn refused_signals_are_an_error_not_a_handler() {
    for raw in [
        libc::SIGKILL,
        libc::SIGSTOP,
        libc::SIGSEGV,
        libc::SIGSYS,
        libc::SIGTRAP,
        libc::SIGABRT,
        0,
        65,
        -1,
    ] {
        let err = signal(SignalKind::from_raw(raw)).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{raw}");
    }
}

fn a_delivery_before_the_wait_is_not_lost() {
    let rt = mailring::Runtime::builder().shards(1).build().unwrap();
    let mut usr1 = signal(SignalKind::user_defined1()).unwrap();
    // SAFETY: raising a signal whose handler is now installed.
    unsafe { libc::raise(libc::SIGUSR1) };
    let done =
        rt.block_on(
            async move { mailring::time::timeout(Duration::from_secs(10), usr1.recv()).await },
        );
    assert!(done.is_ok(), "the earlier delivery completes the wait");
    rt.shutdown();
}

/// Sends `sig` to this process until `done` says it was seen (the waiting
/// future may not be polled yet when the first one arrives).
fn send_until(sig: libc::c_int, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "signal {sig} never seen");
        // SAFETY: signalling our own process; a handler is installed.
        unsafe { libc::kill(libc::getpid(), sig) };
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn ctrl_c_wakes_a_task_on_a_shard() {
    let rt = mailring::Runtime::builder().shards(2).build().unwrap();
    let task = rt.handle().spawn_on(mailring::ShardId::new(1), async {
        ctrl_c().await.unwrap();
        mailring::current_shard().map(|s| s.index())
    });
    // Make sure the handler is installed before the first SIGINT (before
    // it, SIGINT would end this process).
    let _installed = signal(SignalKind::interrupt()).unwrap();
    send_until(libc::SIGINT, || task.is_finished());
    assert_eq!(rt.block_on(task).unwrap(), Some(1));
    rt.shutdown();
}

fn sigterm_wakes_every_listener() {
    let rt = mailring::Runtime::builder().shards(2).build().unwrap();
    let _installed = signal(SignalKind::terminate()).unwrap();
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            rt.spawn(async {
                signal(SignalKind::terminate()).unwrap().recv().await;
            })
        })
        .collect();
    send_until(libc::SIGTERM, || tasks.iter().all(|t| t.is_finished()));
    // And one waiting off every shard, in block_on.
    let mut off = signal(SignalKind::terminate()).unwrap();
    let waiter = std::thread::spawn(move || {
        let rt = mailring::Runtime::builder().shards(1).build().unwrap();
        rt.block_on(async move { off.recv().await });
    });
    send_until(libc::SIGTERM, || waiter.is_finished());
    waiter.join().unwrap();
    rt.shutdown();
}

/// A waker that counts its clones (through its `Arc`), and may panic
/// when woken.
struct Probe {
    panics: bool,
}

impl std::task::Wake for Probe {
    fn wake(self: std::sync::Arc<Self>) {
        assert!(!self.panics, "a waker that panics on purpose");
    }
}

fn a_wait_dropped_leaves_no_waker_behind() {
    use std::future::Future;
    let mut hup = signal(SignalKind::hangup()).unwrap();
    let probe = std::sync::Arc::new(Probe { panics: false });
    let waker = std::task::Waker::from(probe.clone());
    let mut cx = std::task::Context::from_waker(&waker);
    // A loop of `select`s, each polling a fresh `recv` once and dropping
    // it: nothing is kept of them.
    for _ in 0..1000 {
        let recv = std::pin::pin!(hup.recv());
        assert!(recv.poll(&mut cx).is_pending());
    }
    drop(waker);
    assert_eq!(std::sync::Arc::strong_count(&probe), 1, "wakers were kept");
}

fn a_panicking_waker_does_not_end_the_deliveries() {
    use std::future::Future;
    let mut usr2 = signal(SignalKind::user_defined2()).unwrap();
    // The waker's panic is expected: kept off the test's output.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let bad = std::task::Waker::from(std::sync::Arc::new(Probe { panics: true }));
    let mut cx = std::task::Context::from_waker(&bad);
    {
        let mut recv = std::pin::pin!(usr2.recv());
        assert!(recv.as_mut().poll(&mut cx).is_pending());
        // The reader thread wakes the panicking waker (kept while this
        // wait lives).
        // SAFETY: raising a signal whose handler is installed.
        unsafe { libc::raise(libc::SIGUSR2) };
        std::thread::sleep(Duration::from_millis(100));
    }
    std::panic::set_hook(hook);
    // Deliveries still wake waiters afterwards.
    let mut again = signal(SignalKind::user_defined2()).unwrap();
    let rt = mailring::Runtime::builder().shards(1).build().unwrap();
    let waited = std::thread::spawn(move || {
        rt.block_on(
            async move { mailring::time::timeout(Duration::from_secs(5), again.recv()).await },
        )
    });
    std::thread::sleep(Duration::from_millis(50));
    send_until(libc::SIGUSR2, || waited.is_finished());
    assert!(waited.join().unwrap().is_ok(), "a later delivery was seen");
}

/// A waker that counts its wakes.
struct Counting(std::sync::atomic::AtomicUsize);

impl std::task::Wake for Counting {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A delivery of one signal wakes the waits on it, not every wait on every
/// signal (thousands of connections waiting on SIGTERM would each be woken
/// and polled again by every SIGCHLD).
fn a_delivery_wakes_only_the_waits_on_its_own_signal() {
    use std::future::Future;
    let mut winch = signal(SignalKind::from_raw(libc::SIGWINCH)).unwrap();
    let mut quit = signal(SignalKind::quit()).unwrap();
    let quiet = std::sync::Arc::new(Counting(Default::default()));
    let heard = std::sync::Arc::new(Counting(Default::default()));
    let quiet_waker = std::task::Waker::from(quiet.clone());
    let heard_waker = std::task::Waker::from(heard.clone());
    let mut on_quit = std::pin::pin!(quit.recv());
    let mut on_winch = std::pin::pin!(winch.recv());
    assert!(on_quit
        .as_mut()
        .poll(&mut std::task::Context::from_waker(&quiet_waker))
        .is_pending());
    assert!(on_winch
        .as_mut()
        .poll(&mut std::task::Context::from_waker(&heard_waker))
        .is_pending());
    send_until(libc::SIGWINCH, || {
        heard.0.load(std::sync::atomic::Ordering::SeqCst) > 0
    });
    assert_eq!(
        quiet.0.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "a SIGQUIT wait was woken"
    );
}
