//! `spawn_blocking`: a small pool of threads, off the shards, for work that blocks.
//!
//! Threads start on demand up to a maximum and exit after ten idle seconds.
//! At shutdown queued jobs are dropped (their handles resolve to `Cancelled`)
//! and running ones are waited for.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::thread;
use std::time::Duration;

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
    cond: Condvar,
    max_threads: usize,
    name: String,
}

struct State {
    queue: VecDeque<Job>,
    threads: usize,
    idle: usize,
    shutdown: bool,
    handles: Vec<thread::JoinHandle<()>>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("queued", &self.queue.len())
            .field("threads", &self.threads)
            .field("idle", &self.idle)
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
    pub(crate) fn new(max_threads: usize, name: String) -> Self {
        BlockingPool {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    queue: VecDeque::new(),
                    threads: 0,
                    idle: 0,
                    shutdown: false,
                    handles: Vec::new(),
                }),
                cond: Condvar::new(),
                max_threads,
                name,
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
            job(false);
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
                self.start_thread(&mut state);
            }
        }
        JoinHandle::new(task)
    }

    fn start_thread(&self, state: &mut State) {
        state.handles.retain(|h| !h.is_finished());
        let inner = self.inner.clone();
        let spawned = thread::Builder::new()
            .name(format!("{}-blocking", self.inner.name))
            .spawn(move || inner.work());
        match spawned {
            Ok(h) => {
                state.threads += 1;
                state.handles.push(h);
            }
            // Leave the job queued: a running thread will take it.
            Err(_) if state.threads > 0 => {}
            Err(_) => {
                // No thread at all: run nothing, resolve everything as cancelled.
                for job in state.queue.drain(..) {
                    job(false);
                }
            }
        }
    }

    /// Drops queued jobs and waits for running ones.
    pub(crate) fn shutdown(&self) {
        let (jobs, handles) = {
            let mut state = self.inner.lock();
            state.shutdown = true;
            (
                std::mem::take(&mut state.queue),
                std::mem::take(&mut state.handles),
            )
        };
        self.inner.cond.notify_all();
        for job in jobs {
            job(false);
        }
        let me = thread::current().id();
        for h in handles {
            if h.thread().id() != me {
                let _ = h.join();
            }
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn work(&self) {
        let mut state = self.lock();
        loop {
            if let Some(job) = state.queue.pop_front() {
                drop(state);
                job(true);
                state = self.lock();
                continue;
            }
            if state.shutdown {
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
                break;
            }
        }
        state.threads -= 1;
    }
}
