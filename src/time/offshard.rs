//! Timers polled off every shard: one process-wide queue and the thread
//! that fires it.
//!
//! A shard's timers live in its wheel (`queue`) and fire from its loop. A
//! thread outside every runtime (a plain thread, a `futures` executor, a
//! Tokio worker) has no such loop, so a [`Sleep`](super::Sleep) (and an
//! actor's ask deadline, which is one) polled there registers here instead.
//!
//! State: a [`Key`] → waker map ordered by deadline, behind one `Mutex`, and
//! the timer thread, started on first use and kept for the life of the
//! process (with nothing registered it parks without a timeout: no wake-ups,
//! no CPU).
//!
//! 1. Registering takes a fresh sequence number and inserts the entry; if it
//!    is now the earliest, the thread is unparked to shorten its park.
//! 2. Polling a registered timer again swaps the stored waker (unless the
//!    new one would wake the same task).
//! 3. Cancelling (the `Sleep` is dropped, moved earlier, completes, or moves
//!    to a shard) removes the entry, waker included, at once.
//! 4. The thread locks the map, removes every entry due by now, unlocks, and
//!    wakes them (a panicking waker is caught; the thread goes on); then it
//!    parks until the earliest remaining deadline. An unpark that comes
//!    between its unlock and its park is kept by the thread's park token,
//!    so a new earlier deadline is never slept past.
//!
//! Deadlines here are on the real monotonic clock (off a shard there is no
//! runtime clock to advance). Cost: a lock per registration, poll and
//! cancellation of a timer off the shards; nothing on a shard.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::task::Waker;
use std::thread::{self, Thread};
use std::time::Instant;

/// One registered timer: its deadline, then a sequence number that keeps
/// equal deadlines apart (and makes a key of a removed entry match nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Key {
    at: Instant,
    seq: u64,
}

#[derive(Debug)]
struct Queue {
    entries: BTreeMap<Key, Waker>,
    next_seq: u64,
}

static QUEUE: Mutex<Queue> = Mutex::new(Queue {
    entries: BTreeMap::new(),
    next_seq: 0,
});

/// The timer thread, once started.
static THREAD: OnceLock<Thread> = OnceLock::new();

fn queue() -> MutexGuard<'static, Queue> {
    // Nothing user-supplied runs under the lock (wakers are woken and
    // dropped after it), so a poisoned lock still holds a consistent map.
    QUEUE.lock().unwrap_or_else(|p| p.into_inner())
}

/// The timer thread, started on first use.
///
/// # Panics
///
/// When the thread cannot be spawned.
fn timer_thread() -> &'static Thread {
    THREAD.get_or_init(|| {
        thread::Builder::new()
            .name("mailring-timer".into())
            .spawn(run)
            .expect("mailring: could not start the off-shard timer thread")
            .thread()
            .clone()
    })
}

/// Registers `waker` to be woken at `at`.
///
/// # Panics
///
/// When the timer thread cannot be started.
pub(crate) fn insert(at: Instant, waker: Waker) -> Key {
    let thread = timer_thread();
    let mut q = queue();
    let key = Key {
        at,
        seq: q.next_seq,
    };
    q.next_seq += 1;
    q.entries.insert(key, waker);
    let earliest = q.entries.first_key_value().is_some_and(|(k, _)| *k == key);
    drop(q);
    if earliest {
        thread.unpark();
    }
    key
}

/// Makes `waker` the one woken for `key`; `false` when the entry is gone
/// (it fired or was removed).
pub(crate) fn set_waker(key: Key, waker: &Waker) -> bool {
    let mut q = queue();
    let Some(stored) = q.entries.get_mut(&key) else {
        return false;
    };
    if stored.will_wake(waker) {
        return true;
    }
    let old = std::mem::replace(stored, waker.clone());
    drop(q);
    drop(old);
    true
}

/// Moves the entry of `key` to `at`, keeping its waker: the new key, or
/// `None` when the entry is gone.
pub(crate) fn reset(key: Key, at: Instant) -> Option<Key> {
    let mut q = queue();
    let waker = q.entries.remove(&key)?;
    let new = Key { at, seq: key.seq };
    q.entries.insert(new, waker);
    let earliest = q.entries.first_key_value().is_some_and(|(k, _)| *k == new);
    drop(q);
    if earliest {
        timer_thread().unpark();
    }
    Some(new)
}

/// Cancels the entry of `key`, if it is still there.
pub(crate) fn remove(key: Key) {
    let removed = queue().entries.remove(&key);
    drop(removed);
}

/// The timer thread's loop (step 4 of the module docs).
fn run() {
    let mut due = Vec::new();
    loop {
        let next = {
            let mut q = queue();
            let now = Instant::now();
            while let Some(entry) = q.entries.first_entry() {
                if entry.key().at > now {
                    break;
                }
                due.push(entry.remove());
            }
            q.entries.first_key_value().map(|(k, _)| k.at)
        };
        for waker in due.drain(..) {
            // A waker is user code: its panic must not stop every other
            // off-shard timer.
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| waker.wake())) {
                crate::panic::drop_payload(payload);
            }
        }
        match next {
            Some(at) => thread::park_timeout(at.saturating_duration_since(Instant::now())),
            None => thread::park(),
        }
    }
}
