//! Tasks: the cell that holds a future, its state word, and its waker.
//!
//! A task is an `Arc<Task<F>>`, seen by the scheduler as a [`TaskRef`]
//! (`Arc<dyn Runnable>`) and by its joiner as a `JoinHandle`. Its waker is the
//! same `Arc`, so waking costs no allocation.
//!
//! # State word
//!
//! | bit | set when | cleared when |
//! | --- | --- | --- |
//! | `SCHEDULED` | a reference sits in a run queue, deque or inbox (or the task was woken while running) | the shard starts polling it |
//! | `RUNNING` | a shard is polling it | the poll returns |
//! | `COMPLETE` | the future finished, panicked or was cancelled and has been dropped | never |
//! | `CANCELLED` | `abort()` or shutdown asked for it to stop | never |
//! | `STARTED` | its first run began (on its home shard) | never |
//!
//! Transitions:
//!
//! 1. spawn: the cell starts `SCHEDULED` and one reference goes to a queue.
//! 2. run: `SCHEDULED → RUNNING`. On its first run the task records the running
//!    shard as its home and registers in that shard's owned-task table; from
//!    then on it never changes shard.
//! 3. wake while idle: set `SCHEDULED`, send a reference to the home shard (its
//!    local queue if the waker runs there, else its inbox).
//! 4. wake while running: set `SCHEDULED` only; the runner re-queues it after the poll.
//! 5. finish: drop the future, set `COMPLETE`, hand the output to the join cell.
//!
//! # Thread safety
//!
//! The future of a `spawn_local` task is not `Send`, yet its waker may be used
//! from any thread. That is sound because the future is only touched by the
//! task's home shard: it is polled there (a started task never migrates), and
//! it is dropped there, either when it finishes or when the shard shuts down and
//! drops every task in its owned-task table. Other threads only touch the state
//! word, the home index and the join cell, which are all synchronised.

pub(crate) mod join;

use std::cell::{Cell, UnsafeCell};
use std::future::Future;
use std::mem::ManuallyDrop;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use self::join::{JoinCell, JoinError, Joinable};
use crate::panic::{drop_payload, CallbackKind};
use crate::runtime::Shared;
use crate::shard::{with_current, Shard};

const SCHEDULED: u32 = 1;
const RUNNING: u32 = 1 << 1;
const COMPLETE: u32 = 1 << 2;
const CANCELLED: u32 = 1 << 3;
const STARTED: u32 = 1 << 4;

const NO_SLOT: usize = usize::MAX;

/// A task as the scheduler sees it.
pub(crate) type TaskRef = Arc<dyn Runnable>;

/// The scheduler's view of a task.
pub(crate) trait Runnable: Send + Sync {
    /// Polls the task once; must run on a shard thread of the task's runtime.
    fn run(self: Arc<Self>, shard: &Shard);
    /// Drops the future without polling it and resolves the joiner with
    /// `Cancelled`. Must run on the home shard once the task has started.
    /// Returns whether it stopped an unfinished task.
    fn shutdown(&self, shard: Option<&Shard>) -> bool;
    /// A queue refused this reference (its shard is shut down). A task that
    /// never started is dropped here (the refused reference was its only
    /// queued one, so nobody else can start it); a started task is left to
    /// its home shard, which drops every task it owns. Returns whether it
    /// stopped an unfinished task.
    fn refuse(&self) -> bool;
}

/// The cell of one spawned future. `repr(C)` keeps the fields every poll
/// reads (state, home, owned slot) in the cell's first cache line, next to
/// the start of the future, instead of after a future that may be a
/// kilobyte long: one line fewer to fetch when a cold task runs.
#[repr(C)]
pub(crate) struct Task<F: Future> {
    state: AtomicU32,
    /// The shard the task runs on; fixed at its first poll.
    home: AtomicUsize,
    /// Key in the home shard's owned-task table; home thread only.
    owned_slot: Cell<usize>,
    shared: Arc<Shared>,
    /// Touched only by the home shard's thread (see the module docs).
    future: UnsafeCell<Option<F>>,
    join: JoinCell<F::Output>,
}

// SAFETY: the future and `owned_slot` of a started task are only accessed on
// the home shard's thread (module docs, "Thread safety"). A task that never
// started is dropped by whoever holds its one queued reference (`refuse`, the
// injector's drain at shutdown); its future is then a `Send` one (a `spawn`
// future, or a `LocalFactory` still holding its `Send` factory: `spawn_local`
// tasks are queued only on their own shard). Everything else is atomic or
// behind the join cell's mutex. The output crosses threads only through a
// `JoinHandle<T>`, which is itself `Send` only when `T: Send`.
unsafe impl<F: Future> Send for Task<F> {}
// SAFETY: as for `Send`: shared access from other threads touches only
// synchronised fields.
unsafe impl<F: Future> Sync for Task<F> {}

impl<F> Task<F>
where
    F: Future + 'static,
    F::Output: 'static,
{
    /// A new, scheduled task whose first run will happen on `home`.
    pub(crate) fn new(future: F, shared: Arc<Shared>, home: usize) -> Arc<Self> {
        Arc::new(Task {
            state: AtomicU32::new(SCHEDULED),
            home: AtomicUsize::new(home),
            shared,
            future: UnsafeCell::new(Some(future)),
            owned_slot: Cell::new(NO_SLOT),
            join: JoinCell::new(),
        })
    }

    /// Registers a task that starts on the current shard (a `spawn_local`
    /// task is owned from birth, since its future may not leave this thread).
    pub(crate) fn register_owned(self: &Arc<Self>, shard: &Shard) {
        let key = shard.own_task(self.clone());
        self.owned_slot.set(key);
    }

    fn schedule(self: Arc<Self>) {
        let home = self.home.load(Ordering::Acquire);
        let runtime = self.shared.id;
        // From a shard of this runtime: straight into its queue or batch,
        // without touching the runtime's shared reference count (a cache
        // line every shard would otherwise bounce on every wake).
        let mut task = Some(self);
        with_current(|shard| {
            if shard.runtime_id() == runtime {
                if let Some(t) = task.take() {
                    shard.send_task(home, t);
                }
            }
        });
        if let Some(task) = task {
            let shared = task.shared.clone();
            shared.schedule_task(task, home);
        }
    }

    /// Sets `SCHEDULED`; returns whether the caller must enqueue the task.
    fn transition_to_scheduled(&self) -> bool {
        let mut cur = self.state.load(Ordering::Acquire);
        loop {
            if cur & (COMPLETE | SCHEDULED) != 0 {
                return false;
            }
            match self.state.compare_exchange_weak(
                cur,
                cur | SCHEDULED,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return cur & RUNNING == 0,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Drops the future and resolves the joiner. Home thread only.
    ///
    /// Neither the future's `Drop` nor the output's (a detached task's
    /// output is dropped here) may unwind into the shard: both are caught
    /// and reported as [`CallbackKind::Drop`].
    fn finish(&self, shard: Option<&Shard>, result: Result<F::Output, JoinError>) {
        let shard_index = shard.map(Shard::index);
        // The future is dropped where it lies: it was pinned there from its
        // first poll, and a suspended `async fn` may hold references into
        // itself that its locals' `Drop` follows (moving it out first, as
        // `Option::take` would, leaves them pointing at its old place).
        let slot = self.future.get();
        let drop_result = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: called on the home thread for a started task, never
            // while the future is being polled; for a task that never
            // started, by the holder of its only queued reference, so nobody
            // else can reach the future (and it is `Send`, see the `Send`
            // impl). `EmptyAfter` marks the slot empty once the drop ends,
            // by unwinding too, so the future is never dropped twice.
            unsafe {
                if let Some(future) = (*slot).as_mut() {
                    let _empty = EmptyAfter(slot);
                    std::ptr::drop_in_place(future);
                }
            }
        }));
        self.state.fetch_or(COMPLETE, Ordering::AcqRel);
        self.state.fetch_and(!RUNNING, Ordering::AcqRel);
        let result = match (result, drop_result) {
            (r, Err(p)) => {
                self.shared
                    .report_panic(shard_index, CallbackKind::Drop, &*p);
                match r {
                    Ok(v) => {
                        self.shared
                            .guard(shard_index, CallbackKind::Drop, move || drop(v));
                        Err(JoinError::Panicked(p))
                    }
                    Err(e) => {
                        drop_payload(p);
                        Err(e)
                    }
                }
            }
            (r, Ok(())) => r,
        };
        self.shared.guard(shard_index, CallbackKind::Drop, || {
            self.join.complete(result)
        });
        let key = self.owned_slot.replace(NO_SLOT);
        if key != NO_SLOT {
            if let Some(shard) = shard {
                // Dropped outside the table's borrow: it may be the last reference.
                let removed = shard.disown_task(key);
                drop(removed);
            }
        }
    }
}

/// Marks a task's future slot empty without dropping what it holds (its
/// future was just dropped in place).
struct EmptyAfter<F>(*mut Option<F>);

impl<F> Drop for EmptyAfter<F> {
    fn drop(&mut self) {
        // SAFETY: the slot is valid for writes (the task's own cell, reached
        // only by its home thread here), and the future it held was dropped
        // in place, so overwriting it without a drop is what must happen.
        unsafe { std::ptr::write(self.0, None) };
    }
}

impl<F> Runnable for Task<F>
where
    F: Future + 'static,
    F::Output: 'static,
{
    fn run(self: Arc<Self>, shard: &Shard) {
        let mut cur = self.state.load(Ordering::Acquire);
        loop {
            if cur & COMPLETE != 0 {
                return;
            }
            let next = (cur & !SCHEDULED) | RUNNING | STARTED;
            match self
                .state
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(actual) => cur = actual,
            }
        }
        if self.owned_slot.get() == NO_SLOT {
            // First run: this shard becomes home for good.
            self.home.store(shard.index(), Ordering::Release);
            self.register_owned(shard);
        }
        if cur & CANCELLED != 0 {
            self.finish(Some(shard), Err(JoinError::Cancelled));
            return;
        }
        // A waker that borrows this reference instead of taking its own: no
        // count is added for the poll and none dropped after it (two atomic
        // operations per poll saved). Clones of it count as usual.
        // SAFETY: `self` holds a count for the whole poll, so the task outlives
        // the borrowed `Arc`; wrapping the waker in `ManuallyDrop` means the
        // count it pretends to own is never released.
        let waker = ManuallyDrop::new(Waker::from(unsafe { Arc::from_raw(Arc::as_ptr(&self)) }));
        let mut cx = Context::from_waker(&waker);
        let polled = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: we are on the home thread, the task is RUNNING so no one
            // else polls or drops the future, and it stays pinned inside the
            // `Arc` allocation until `finish` drops it in place.
            let future = unsafe { &mut *self.future.get() };
            match future.as_mut() {
                // SAFETY: see above; the future never moves out of the cell.
                Some(f) => unsafe { Pin::new_unchecked(f) }.poll(&mut cx),
                None => Poll::Pending,
            }
        }));
        match polled {
            Ok(Poll::Ready(output)) => {
                // What the task sent must be published before anyone can see
                // it finished (a joiner on another shard may poll the handle
                // before this tick ends).
                shard.publish_pending();
                self.finish(Some(shard), Ok(output))
            }
            Err(panic) => {
                self.shared
                    .report_panic(Some(shard.index()), CallbackKind::Task, &*panic);
                shard.publish_pending();
                self.finish(Some(shard), Err(JoinError::Panicked(panic)))
            }
            Ok(Poll::Pending) => {
                let prev = self.state.fetch_and(!RUNNING, Ordering::AcqRel);
                if prev & SCHEDULED != 0 {
                    // Woken (or aborted) while running: go round again.
                    shard.push_local(self);
                }
            }
        }
    }

    fn shutdown(&self, shard: Option<&Shard>) -> bool {
        if self.state.fetch_or(CANCELLED, Ordering::AcqRel) & COMPLETE != 0 {
            return false;
        }
        self.finish(shard, Err(JoinError::Cancelled));
        true
    }

    fn refuse(&self) -> bool {
        self.state.load(Ordering::Acquire) & STARTED == 0 && self.shutdown(None)
    }
}

impl<F> Wake for Task<F>
where
    F: Future + 'static,
    F::Output: 'static,
{
    fn wake(self: Arc<Self>) {
        if self.transition_to_scheduled() {
            self.schedule();
        }
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.transition_to_scheduled() {
            self.clone().schedule();
        }
    }
}

impl<F> Joinable<F::Output> for Task<F>
where
    F: Future + 'static,
    F::Output: 'static,
{
    fn poll_join(&self, cx: &mut Context<'_>) -> Poll<Result<F::Output, JoinError>> {
        self.join.poll(cx)
    }

    fn detach(&self) {
        self.join.detach();
    }

    fn abort(self: Arc<Self>) {
        let prev = self.state.fetch_or(CANCELLED, Ordering::AcqRel);
        if prev & (COMPLETE | CANCELLED) != 0 {
            return;
        }
        // An idle task must be scheduled so that its home shard drops it.
        let mut cur = prev | CANCELLED;
        loop {
            if cur & (COMPLETE | SCHEDULED) != 0 {
                return;
            }
            match self.state.compare_exchange_weak(
                cur,
                cur | SCHEDULED,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(actual) => cur = actual,
            }
        }
        if cur & RUNNING != 0 {
            return;
        }
        self.schedule();
    }

    fn is_finished(&self) -> bool {
        self.join.is_finished()
    }
}

/// A future built on its shard by a `Send` factory.
///
/// Before its first poll it holds only the factory (which is `Send`); the
/// future it builds is created, polled and dropped on the shard that first
/// polls it. Only pinned placement may carry it, so it never migrates.
pub(crate) enum LocalFactory<G, Fut> {
    Factory(Option<G>),
    Running(Fut),
}

// SAFETY: only the `Factory` state (which holds a `Send` factory) may be sent to
// another thread. The runtime spawns a `LocalFactory` with pinned placement, so
// it is first polled, and its `Running` future is created, on the target shard,
// and a started task is never moved or dropped anywhere else (see
// "Thread safety" above).
unsafe impl<G: Send, Fut> Send for LocalFactory<G, Fut> {}

impl<G, Fut> Future for LocalFactory<G, Fut>
where
    G: FnOnce() -> Fut,
    Fut: Future,
{
    type Output = Fut::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Fut::Output> {
        // SAFETY: we never move the `Running` future out of the pinned `self`;
        // the state is only overwritten while it is `Factory` (nothing pinned yet).
        let this = unsafe { self.get_unchecked_mut() };
        if let LocalFactory::Factory(g) = this {
            let g = g
                .take()
                .expect("LocalFactory polled after a panic in its factory");
            *this = LocalFactory::Running(g());
        }
        match this {
            // SAFETY: `this` is pinned and the future stays in place until dropped.
            LocalFactory::Running(f) => unsafe { Pin::new_unchecked(f) }.poll(cx),
            LocalFactory::Factory(_) => unreachable!("factory state replaced above"),
        }
    }
}
