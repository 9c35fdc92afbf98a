//! `spawn_blocking`: a small pool of threads, off the shards, for work that blocks.
//!
//! Threads start on demand up to a maximum and exit after ten idle seconds.
//! At shutdown queued jobs are dropped (their handles resolve to `Cancelled`)
//! and running ones are waited for up to a grace period; the threads of jobs
//! still running after it are detached (they finish on their own, and their
//! handles resolve when the job ends) and counted as abandoned.
//!
//! No user code unwinds through a pool thread: a job's closure runs inside a
//! `catch_unwind` (its panic goes to its `JoinHandle`), and what can still
//! panic around it (the `Drop` of an output nobody awaits, of a closure
//! dropped unrun, the joiner's waker) is caught too and reported to the
//! runtime as a [`CallbackKind::Drop`] panic off the shards. A pool thread
//! keeps its count in the pool exact whatever happens, so the pool never
//! believes in threads that are gone.

use std::any::Any;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll};
use std::thread;
use std::time::{Duration, Instant};

use crate::panic::{drop_payload, CallbackKind};
use crate::runtime::Shared;
use crate::task::join::{JoinCell, JoinError, JoinHandle, Joinable};

const KEEP_ALIVE: Duration = Duration::from_secs(10);

type Job = Box<dyn FnOnce(bool) + Send>;

#[derive(Debug)]
pub(crate) struct BlockingPool {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    state: Mutex<State>,
    /// Wakes idle threads (a job queued, or shutdown).
    cond: Condvar,
    /// Wakes shutdown when a job ends.
    done: Condvar,
    max_threads: usize,
    name: String,
    /// The CPUs a pool thread runs on (empty: whatever it inherited). A
    /// thread started from a pinned shard would otherwise stay on that
    /// shard's CPU.
    cpus: Vec<usize>,
    /// The runtime, for reporting panics. Weak: the runtime owns the pool.
    owner: Weak<Shared>,
    /// Panics caught once the runtime was gone (nothing to report them to).
    unreported_panics: AtomicU64,
}

struct State {
    queue: VecDeque<Job>,
    threads: usize,
    idle: usize,
    /// Jobs taken off the queue whose call has not returned yet.
    running: usize,
    shutdown: bool,
    handles: Vec<thread::JoinHandle<()>>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("queued", &self.queue.len())
            .field("threads", &self.threads)
            .field("idle", &self.idle)
            .field("running", &self.running)
            .field("shutdown", &self.shutdown)
            .finish()
    }
}

struct BlockingTask<T> {
    join: JoinCell<T>,
    aborted: AtomicBool,
}

impl<T: Send> Joinable<T> for BlockingTask<T> {
    fn poll_join(&self, cx: &mut Context<'_>) -> Poll<Result<T, JoinError>> {
        self.join.poll(cx)
    }
    fn detach(&self) {
        self.join.detach();
    }
    fn abort(self: Arc<Self>) {
        self.aborted.store(true, Ordering::Release);
    }
    fn is_finished(&self) -> bool {
        self.join.is_finished()
    }
}

impl BlockingPool {
    pub(crate) fn new(
        max_threads: usize,
        name: String,
        cpus: Vec<usize>,
        owner: Weak<Shared>,
    ) -> Self {
        // "mailring-shard" → "mailring-blocking": a name that does not pass
        // for a shard's (the kernel keeps 15 bytes of it).
        let base = name.strip_suffix("-shard").unwrap_or(&name);
        let name = format!("{base}-blocking");
        BlockingPool {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    queue: VecDeque::new(),
                    threads: 0,
                    idle: 0,
                    running: 0,
                    shutdown: false,
                    handles: Vec::new(),
                }),
                cond: Condvar::new(),
                done: Condvar::new(),
                max_threads,
                name,
                cpus,
                owner,
                unreported_panics: AtomicU64::new(0),
            }),
        }
    }

    pub(crate) fn spawn<F, T>(&self, f: F) -> JoinHandle<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let task = Arc::new(BlockingTask {
            join: JoinCell::new(),
            aborted: AtomicBool::new(false),
        });
        let cell = task.clone();
        let job: Job = Box::new(move |run| {
            if !run || cell.aborted.load(Ordering::Acquire) {
                cell.join.complete(Err(JoinError::Cancelled));
                return;
            }
            let result = catch_unwind(AssertUnwindSafe(f)).map_err(JoinError::Panicked);
            cell.join.complete(result);
        });
        let mut state = self.inner.lock();
        if state.shutdown {
            drop(state);
            self.inner.cancel(job);
        } else {
            state.queue.push_back(job);
            if state.idle > 0 {
                self.inner.cond.notify_one();
            }
            // An idle thread stays counted idle until it wakes and takes a
            // job, so a notified one may already be spoken for: start a thread
            // whenever the queued jobs outnumber the idle threads, or two jobs
            // spawned before that thread wakes (one waiting on the other) would
            // share it and deadlock.
            if state.queue.len() > state.idle && state.threads < self.inner.max_threads {
                let orphans = self.start_thread(&mut state);
                // Dropped with the lock released: their `Drop` may spawn.
                drop(state);
                for job in orphans {
                    self.inner.cancel(job);
                }
            }
        }
        JoinHandle::new(task)
    }

    /// Starts a thread; when none can be started and none runs, returns the
    /// queued jobs, for the caller to cancel once it released the lock.
    #[must_use]
    fn start_thread(&self, state: &mut State) -> VecDeque<Job> {
        state.handles.retain(|h| !h.is_finished());
        let inner = self.inner.clone();
        let spawned = thread::Builder::new()
            .name(self.inner.name.clone())
            .spawn(move || {
                if !inner.cpus.is_empty() {
                    // Best effort: a thread left on the shard's CPU still works.
                    let _ = crate::shard::set_affinity(&inner.cpus);
                }
                inner.work()
            });
        match spawned {
            Ok(h) => {
                state.threads += 1;
                state.handles.push(h);
                VecDeque::new()
            }
            // Leave the job queued: a running thread will take it.
            Err(_) if state.threads > 0 => VecDeque::new(),
            // No thread at all: run nothing, resolve everything as cancelled.
            Err(_) => std::mem::take(&mut state.queue),
        }
    }

    /// Drops queued jobs (their handles resolve to `Cancelled`) and waits up
    /// to `grace` for running ones. Returns how many were still running then
    /// (not counting the caller's own, when a job shuts the runtime down):
    /// their threads are detached, not joined.
    pub(crate) fn shutdown(&self, grace: Duration) -> u64 {
        let (jobs, handles) = {
            let mut state = self.inner.lock();
            state.shutdown = true;
            (
                std::mem::take(&mut state.queue),
                std::mem::take(&mut state.handles),
            )
        };
        self.inner.cond.notify_all();
        // Each dropped with the lock released (a `Drop` may spawn) and on
        // its own: one that panics stops none of the others.
        for job in jobs {
            self.inner.cancel(job);
        }
        let me = thread::current().id();
        // A job that shuts the runtime down cannot be waited for.
        let own = usize::from(handles.iter().any(|h| h.thread().id() == me));
        let deadline = Instant::now() + grace;
        let abandoned = {
            let mut state = self.inner.lock();
            while state.running > own {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                state = self
                    .inner
                    .done
                    .wait_timeout(state, left)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            state.running.saturating_sub(own)
        };
        for h in handles {
            // With no job left running every other thread is on its way
            // out; otherwise only the finished ones are joined, and the
            // rest detached (dropping the handle).
            if h.thread().id() != me && (abandoned == 0 || h.is_finished()) {
                let _ = h.join();
            }
        }
        abandoned as u64
    }
}

/// Keeps a pool thread counted until it decides to leave (under the lock,
/// with the decision) or, however else it ends, until it is gone.
struct Counted<'a> {
    inner: &'a Inner,
    counted: bool,
}

impl Counted<'_> {
    /// The thread leaves: no longer counted, in the same critical section
    /// as the decision, so a `spawn` that finds it gone starts another
    /// rather than queueing a job for a thread on its way out.
    fn leave(&mut self, state: &mut State) {
        state.threads -= 1;
        self.counted = false;
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        if self.counted {
            self.inner.lock().threads -= 1;
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Drops a job unrun: its handle resolves to `Cancelled`; a panic in
    /// the `Drop` of what it captured is caught and reported.
    fn cancel(&self, job: Job) {
        if let Err(p) = catch_unwind(AssertUnwindSafe(move || job(false))) {
            self.report(p);
        }
    }

    /// Reports a panic caught around a job (a `Drop` or a waker, the job's
    /// own closure being caught inside it) to the runtime, off the shards.
    #[cold]
    fn report(&self, payload: Box<dyn Any + Send>) {
        match self.owner.upgrade() {
            Some(shared) => shared.report_panic(None, CallbackKind::Drop, &*payload),
            None => {
                self.unreported_panics.fetch_add(1, Ordering::Relaxed);
            }
        }
        drop_payload(payload);
    }

    fn work(&self) {
        let mut counted = Counted {
            inner: self,
            counted: true,
        };
        let mut state = self.lock();
        loop {
            if let Some(job) = state.queue.pop_front() {
                state.running += 1;
                drop(state);
                if let Err(p) = catch_unwind(AssertUnwindSafe(move || job(true))) {
                    self.report(p);
                }
                state = self.lock();
                state.running -= 1;
                if state.shutdown {
                    self.done.notify_all();
                }
                continue;
            }
            if state.shutdown {
                counted.leave(&mut state);
                break;
            }
            state.idle += 1;
            let (next, timeout) = self
                .cond
                .wait_timeout(state, KEEP_ALIVE)
                .unwrap_or_else(|p| p.into_inner());
            state = next;
            state.idle -= 1;
            if timeout.timed_out() && state.queue.is_empty() {
                counted.leave(&mut state);
                break;
            }
        }
        drop(state);
    }
}
