//! Unix signals as futures: [`ctrl_c`], and [`signal`] for SIGTERM, SIGHUP
//! and the others a program may catch.
//!
//! Nothing is installed until a program asks: a program that never calls
//! these keeps its default Ctrl-C. The first call for a signal installs a
//! `sigaction` handler for it (process-wide, once, never removed; no signal
//! mask is changed). The handler only counts the delivery and writes to an
//! eventfd; a thread started with the first handler reads that eventfd and
//! wakes the waiting futures, wherever they are polled (on a shard or off
//! every runtime, e.g. in `Runtime::block_on`). Deliveries that come before
//! a future is polled count: a [`Signal`] completes once for each batch of
//! deliveries since it was made or last completed.
//!
//! ```no_run
//! let rt = mailring::Runtime::new()?;
//! rt.block_on(async {
//!     // ... start serving ...
//!     mailring::signal::ctrl_c().await?;
//!     println!("Ctrl-C: shutting down");
//!     Ok::<_, std::io::Error>(())
//! })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::future::poll_fn;
use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::task::{Poll, Waker};

use crate::sync::{WaitKey, WaitList};

/// Signal numbers below this are catchable here (Linux has 64 signals).
const SIGNALS: usize = 65;

/// Deliveries per signal, counted by the handler.
static DELIVERED: [AtomicU64; SIGNALS] = [const { AtomicU64::new(0) }; SIGNALS];

/// The eventfd the handler writes (-1 until the first install).
static EVENTFD: AtomicI32 = AtomicI32::new(-1);

/// Installed signals and the futures waiting on each.
struct Registry {
    installed: [bool; SIGNALS],
    /// Per signal, the wakers of the waits in progress, each under its
    /// wait's key (the wait takes it back when dropped).
    waiters: Vec<WaitList>,
}

fn registry() -> &'static Mutex<Registry> {
    static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        Mutex::new(Registry {
            installed: [false; SIGNALS],
            waiters: (0..SIGNALS).map(|_| WaitList::new()).collect(),
        })
    })
}

fn lock() -> std::sync::MutexGuard<'static, Registry> {
    registry().lock().unwrap_or_else(|p| p.into_inner())
}

/// The handler: async-signal-safe (two atomics and a `write`), and it
/// leaves `errno` as it found it.
extern "C" fn on_signal(signum: libc::c_int) {
    // SAFETY: `__errno_location` returns this thread's errno slot, valid
    // for the thread's life; the handler restores what `write` may change.
    let errno = unsafe { *libc::__errno_location() };
    if let Some(count) = usize::try_from(signum).ok().and_then(|s| DELIVERED.get(s)) {
        count.fetch_add(1, Ordering::SeqCst);
    }
    let fd = EVENTFD.load(Ordering::SeqCst);
    if fd >= 0 {
        let one: u64 = 1;
        // SAFETY: `fd` is the eventfd, open for the life of the process;
        // the 8 bytes are a local. The reader empties the counter at each
        // wake, so it never nears its limit (2^64 - 2), past which this
        // blocking write would wait.
        unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Creates the eventfd and starts the thread that reads it (once).
fn start_reader() -> io::Result<()> {
    if EVENTFD.load(Ordering::SeqCst) >= 0 {
        return Ok(());
    }
    // SAFETY: a plain syscall; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    std::thread::Builder::new()
        .name("mailring-signals".into())
        .spawn(move || {
            // Each signal's deliveries as of the last wake: only the waits
            // of a signal that came are woken (a flood of one signal does
            // not wake every wait on the others).
            let mut woke_at = [0u64; SIGNALS];
            let mut woken: Vec<Waker> = Vec::new();
            loop {
                let mut value = 0u64;
                // SAFETY: reads 8 bytes into a local from the eventfd, which
                // is never closed.
                let n = unsafe { libc::read(fd, (&mut value as *mut u64).cast(), 8) };
                if n < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                    return;
                }
                {
                    let mut registry = lock();
                    for (signum, seen) in woke_at.iter_mut().enumerate() {
                        // Loaded under the lock a wait registers under and
                        // then looks again: either it sees this delivery,
                        // or it is listed here and woken.
                        let now = DELIVERED[signum].load(Ordering::SeqCst);
                        if now != *seen {
                            *seen = now;
                            registry.waiters[signum].drain_into(&mut woken);
                        }
                    }
                }
                for waker in woken.drain(..) {
                    // A waker that panics (a user's) must not end this
                    // thread: every later delivery would go unread.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| waker.wake()));
                }
            }
        })
        .inspect_err(|_| {
            // SAFETY: `fd` was created above and given to nobody.
            unsafe { libc::close(fd) };
        })?;
    EVENTFD.store(fd, Ordering::SeqCst);
    Ok(())
}

fn install(signum: usize) -> io::Result<()> {
    let mut reg = lock();
    if reg.installed[signum] {
        return Ok(());
    }
    start_reader()?;
    // SAFETY: a zeroed `sigaction` is a valid value to fill in; the handler
    // is an `extern "C" fn(c_int)` that is async-signal-safe; SA_RESTART
    // keeps other threads' interrupted syscalls going.
    let rc = unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(signum as libc::c_int, &action, std::ptr::null_mut())
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    reg.installed[signum] = true;
    Ok(())
}

/// Which signal: the common ones by name, others by number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SignalKind(libc::c_int);

impl SignalKind {
    /// SIGINT (Ctrl-C).
    pub const fn interrupt() -> Self {
        SignalKind(libc::SIGINT)
    }
    /// SIGTERM (what `kill` and service managers send).
    pub const fn terminate() -> Self {
        SignalKind(libc::SIGTERM)
    }
    /// SIGHUP.
    pub const fn hangup() -> Self {
        SignalKind(libc::SIGHUP)
    }
    /// SIGQUIT.
    pub const fn quit() -> Self {
        SignalKind(libc::SIGQUIT)
    }
    /// SIGUSR1.
    pub const fn user_defined1() -> Self {
        SignalKind(libc::SIGUSR1)
    }
    /// SIGUSR2.
    pub const fn user_defined2() -> Self {
        SignalKind(libc::SIGUSR2)
    }
    /// Any signal by number; [`signal`] refuses the ones that cannot or
    /// must not be caught.
    pub const fn from_raw(signum: libc::c_int) -> Self {
        SignalKind(signum)
    }
    /// The signal's number.
    pub const fn as_raw(self) -> libc::c_int {
        self.0
    }
}

/// A wait's place among a signal's wakers, taken back on drop.
struct Registered {
    signum: usize,
    key: Option<WaitKey>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        if self.key.is_none() {
            return;
        }
        // The waker leaves the registry under its lock and is dropped after
        // it: its drop may end a task whose own waits lock the registry.
        let mine = lock().waiters[self.signum].remove(&mut self.key);
        drop(mine);
    }
}

/// Deliveries of one signal; see the module docs.
#[derive(Debug)]
pub struct Signal {
    signum: usize,
    seen: u64,
}

impl Signal {
    /// Completes at the next delivery (or at once if one came since this
    /// `Signal` was made or last completed).
    pub async fn recv(&mut self) {
        let signum = self.signum;
        // Dropped with the wait (completed, or abandoned in a `select`):
        // its waker goes with it.
        let mut registered = Registered { signum, key: None };
        poll_fn(|cx| {
            if self.take() {
                return Poll::Ready(());
            }
            let replaced = lock().waiters[signum].register(&mut registered.key, cx.waker());
            // Dropped with the lock released.
            drop(replaced);
            // A delivery between the check and the registration.
            if self.take() {
                return Poll::Ready(());
            }
            Poll::Pending
        })
        .await
    }

    fn take(&mut self) -> bool {
        let now = DELIVERED[self.signum].load(Ordering::SeqCst);
        if now > self.seen {
            self.seen = now;
            return true;
        }
        false
    }
}

/// Starts listening for `kind`, installing its handler on first use.
///
/// # Errors
///
/// `InvalidInput` for SIGKILL, SIGSTOP (uncatchable), SIGSEGV, SIGBUS,
/// SIGILL, SIGFPE, SIGSYS, SIGTRAP (raised by the thread's own faulting
/// instruction or call: catching them hides crashes, or a seccomp refusal,
/// or a debugger's breakpoint), SIGABRT (`abort` ends the process after
/// the handler whatever it does) and numbers out of range; the OS error of
/// `sigaction` or of the eventfd.
pub fn signal(kind: SignalKind) -> io::Result<Signal> {
    let forbidden = [
        libc::SIGKILL,
        libc::SIGSTOP,
        libc::SIGSEGV,
        libc::SIGBUS,
        libc::SIGILL,
        libc::SIGFPE,
        libc::SIGSYS,
        libc::SIGTRAP,
        libc::SIGABRT,
    ];
    let signum = usize::try_from(kind.0)
        .ok()
        .filter(|s| (1..SIGNALS).contains(s) && !forbidden.contains(&kind.0))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("signal {} cannot be listened for", kind.0),
            )
        })?;
    // Counted before the handler goes in: a signal that comes while it is
    // installed is one from this call on, not taken as seen.
    let seen = DELIVERED[signum].load(Ordering::SeqCst);
    install(signum)?;
    Ok(Signal { signum, seen })
}

/// Completes at the next Ctrl-C (SIGINT) from this call on. The call
/// installs the handler (not the future's first poll): from then on,
/// Ctrl-C no longer ends the process by itself, also before the future
/// is awaited, and one that comes before is not lost.
///
/// # Errors
///
/// As [`signal`].
pub fn ctrl_c() -> impl Future<Output = io::Result<()>> + Send {
    let installed = signal(SignalKind::interrupt());
    async move {
        installed?.recv().await;
        Ok(())
    }
}
