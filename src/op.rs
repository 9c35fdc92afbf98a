//! In-flight operations: the per-shard op table and the [`Op`] future.
//!
//! Every native I/O operation is one SQE on the current shard's ring and one
//! slot in that shard's [`OpTable`]. The SQE's `user_data` is the slot key (low
//! 32 bits) and the slot's generation (bits 32..56), so a CQE for a slot that
//! was freed and reused can never complete the wrong operation.
//!
//! # Slot states
//!
//! 1. `Waiting(waker)`: submitted; the `Op` future owns its resources
//!    (buffer, path, fd) and waits.
//! 2. `Done(res, flags)`: the CQE arrived before the future looked; the next
//!    poll takes the result and frees the slot.
//! 3. `Abandoned(resources)`: the future was dropped before its CQE. Its
//!    resources moved into the slot and an `ASYNC_CANCEL` was queued; when the
//!    CQE arrives (cancelled or not) the resources are dropped, the optional
//!    clean-up runs on the result (an `openat` that succeeded anyway has its fd
//!    closed), and the slot is freed. For a multishot operation this happens
//!    for every CQE, and the slot is freed by the last (no `IORING_CQE_F_MORE`).
//! 4. `Multishot(results)`: a multishot operation ([`MultishotOp`]) queues
//!    each CQE's result; the op is live while CQEs carry `IORING_CQE_F_MORE`.
//!
//! So whatever the user drops, memory handed to the kernel lives until the
//! kernel is done with it.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::io;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use io_uring::squeue;
use slab::Slab;

use crate::shard::{with_current, Shard};

const GENERATION_MASK: u64 = (1 << 24) - 1;

/// What runs on the result of an abandoned operation.
/// What runs on each CQE of an abandoned operation (and on results nobody
/// took): the result, the CQE flags, and the operation's resources.
pub(crate) type Cleanup = fn(i32, u32, &dyn Any);

enum SlotState {
    Waiting(Option<Waker>),
    /// A zero-copy send returned its result; its buffer is in use until the
    /// notification CQE (`IORING_CQE_F_NOTIF`).
    AwaitingNotif {
        res: i32,
        waker: Option<Waker>,
    },
    Done {
        res: i32,
        flags: u32,
    },
    Abandoned {
        resources: Box<dyn Any>,
        cleanup: Option<Cleanup>,
    },
    Multishot {
        results: std::collections::VecDeque<(i32, u32)>,
        wakers: Vec<Waker>,
        live: bool,
    },
}

struct Slot {
    generation: u32,
    state: SlotState,
    /// Counted in [`OpTable::offloaded`] until the kernel is done with it.
    offloaded: bool,
}

impl SlotState {
    /// Whether the kernel may still post a CQE for this slot (and so may
    /// still use the memory its operation lent it).
    fn awaits_kernel(&self) -> bool {
        match self {
            SlotState::Waiting(_)
            | SlotState::AwaitingNotif { .. }
            | SlotState::Abandoned { .. } => true,
            SlotState::Multishot { live, .. } => *live,
            SlotState::Done { .. } => false,
        }
    }
}

/// The wakers a completion released, woken by the caller once the table's
/// borrow has ended.
pub(crate) enum Woken {
    None,
    One(Waker),
    /// Every task waiting on a multishot operation.
    Many(Vec<Waker>),
    /// The last completion of an abandoned operation: its cleanup to run
    /// on the result, then its resources to drop (the kernel is done with
    /// them), outside the table's borrow (a buffer's `Drop` is anyone's
    /// code, and may submit or drop an operation itself).
    Released {
        resources: Box<dyn Any>,
        cleanup: Option<Cleanup>,
        res: i32,
        flags: u32,
    },
    /// A completion of an abandoned operation with more to come: its
    /// cleanup to run on the result outside the table's borrow (it may
    /// wake anyone: a buffer it gives back wakes the receives waiting for
    /// one), on the resources lent for it, which then go back to their slot
    /// with [`OpTable::give_back`] (the kernel still uses the memory they
    /// own, which lending them does not move).
    Lent {
        user_data: u64,
        resources: Box<dyn Any>,
        cleanup: Cleanup,
        res: i32,
        flags: u32,
    },
}

/// The in-flight operations of one shard.
#[derive(Default)]
pub(crate) struct OpTable {
    slots: Slab<Slot>,
    next_generation: u32,
    /// Operations in flight that the kernel most likely runs on one of its
    /// io-wq worker threads (file writes, syncs, path operations): see
    /// [`OpTable::offloaded`].
    offloaded: usize,
}

impl fmt::Debug for OpTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpTable")
            .field("in_flight", &self.slots.len())
            .finish()
    }
}

/// The slot key and generation a [`user_data`] names.
fn slot_of(user_data: u64) -> (usize, u32) {
    (
        (user_data & 0xffff_ffff) as usize,
        ((user_data >> 32) & GENERATION_MASK) as u32,
    )
}

fn user_data(key: usize, generation: u32) -> u64 {
    ((u64::from(generation) & GENERATION_MASK) << 32) | key as u64
}

impl OpTable {
    /// A new waiting slot; `offloaded` counts it in [`OpTable::offloaded`]
    /// until its last CQE.
    fn insert(&mut self, offloaded: bool) -> (usize, u32) {
        self.next_generation = self.next_generation.wrapping_add(1) & GENERATION_MASK as u32;
        let generation = self.next_generation;
        let key = self.slots.insert(Slot {
            generation,
            state: SlotState::Waiting(None),
            offloaded,
        });
        self.offloaded += usize::from(offloaded);
        (key, generation)
    }

    fn slot_mut(&mut self, key: usize, generation: u32) -> Option<&mut Slot> {
        self.slots
            .get_mut(key)
            .filter(|s| s.generation == generation)
    }

    /// Files a CQE; returns the wakers to wake (outside the table's borrow).
    pub(crate) fn complete(&mut self, user_data: u64, res: i32, flags: u32) -> Woken {
        let (key, generation) = slot_of(user_data);
        let Some(slot) = self
            .slots
            .get_mut(key)
            .filter(|s| s.generation == generation)
        else {
            return Woken::None;
        };
        let one = |w: Option<Waker>| w.map_or(Woken::None, Woken::One);
        if slot.offloaded && !io_uring::cqueue::more(flags) {
            // Its last CQE: the worker that ran it is done.
            slot.offloaded = false;
            self.offloaded -= 1;
        }
        match &mut slot.state {
            SlotState::Waiting(waker) if io_uring::cqueue::more(flags) => {
                // Zero-copy send: the result now, the buffer's release later.
                let waker = waker.take();
                slot.state = SlotState::AwaitingNotif { res, waker };
                Woken::None
            }
            SlotState::Waiting(waker) => {
                let waker = waker.take();
                slot.state = SlotState::Done { res, flags };
                one(waker)
            }
            SlotState::AwaitingNotif { res: first, waker } => {
                let waker = waker.take();
                slot.state = SlotState::Done { res: *first, flags };
                one(waker)
            }
            SlotState::Abandoned { .. } if !io_uring::cqueue::more(flags) => {
                // The last: the slot goes, its resources are released by
                // the caller.
                let SlotState::Abandoned { resources, cleanup } = self.slots.remove(key).state
                else {
                    unreachable!("matched above");
                };
                Woken::Released {
                    resources,
                    cleanup,
                    res,
                    flags,
                }
            }
            SlotState::Abandoned { cleanup, resources } => match *cleanup {
                // More to come: the kernel still uses the resources; they
                // are lent to the cleanup, a placeholder (no allocation)
                // in the slot meanwhile.
                Some(cleanup) => Woken::Lent {
                    user_data,
                    resources: std::mem::replace(resources, Box::new(())),
                    cleanup,
                    res,
                    flags,
                },
                None => Woken::None,
            },
            SlotState::Multishot {
                results,
                wakers,
                live,
            } => {
                results.push_back((res, flags));
                if !io_uring::cqueue::more(flags) {
                    *live = false;
                }
                match wakers.len() {
                    0 => Woken::None,
                    1 => one(wakers.pop()),
                    _ => Woken::Many(std::mem::take(wakers)),
                }
            }
            // A second CQE for a single-shot op cannot happen; keep the first.
            SlotState::Done { .. } => Woken::None,
        }
    }

    /// Puts back the resources a [`Woken::Lent`] lent. Were their slot
    /// gone (nothing ends an abandoned slot but its last CQE, which the
    /// same reaping thread files only after this), the kernel might still
    /// use their memory: they are leaked, never freed.
    pub(crate) fn give_back(&mut self, user_data: u64, resources: Box<dyn Any>) {
        let (key, generation) = slot_of(user_data);
        match self.slot_mut(key, generation).map(|slot| &mut slot.state) {
            Some(SlotState::Abandoned {
                resources: lent, ..
            }) => *lent = resources,
            _ => std::mem::forget(resources),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// How many operations in flight were submitted with
    /// [`Op::submit_offloaded`]: while
    /// one is, a kernel worker thread needs a CPU to finish it, so an idle
    /// shard parks at once instead of spinning (a spin on the CPU the worker
    /// was woken on delays it until the spin ends: measured on 2 cores, a
    /// 50 µs spin made each `O_DSYNC` append 50-60 µs slower).
    pub(crate) fn offloaded(&self) -> usize {
        self.offloaded
    }

    /// Operations the kernel may still complete (see [`SlotState::awaits_kernel`]):
    /// what shutdown waits for. A finished slot nobody looked at (a future
    /// forgotten with `mem::forget`) does not count.
    pub(crate) fn awaiting_kernel(&self) -> usize {
        self.slots
            .iter()
            .filter(|(_, s)| s.state.awaits_kernel())
            .count()
    }

    /// Empties the table at the end of shutdown. Slots the kernel may still
    /// complete have what their operation lent it leaked, never freed
    /// (abandoned resources are forgotten; a waiting future's resources
    /// are in the future, which was forgotten or leaked with its task);
    /// the rest are dropped. Returns how many were leaked.
    pub(crate) fn leak_pending(&mut self) -> usize {
        let mut leaked = 0;
        self.offloaded = 0;
        for (_, slot) in std::mem::take(&mut self.slots) {
            if slot.state.awaits_kernel() {
                leaked += 1;
                std::mem::forget(slot);
            }
        }
        leaked
    }
}

/// An operation submitted on the current shard, owning what the kernel uses.
///
/// Resolves to the CQE's result (`Ok(res)` for `res >= 0`, else the errno)
/// and gives back the resources. Dropping it before completion cancels the
/// operation and keeps the resources alive until the kernel lets go of them.
pub(crate) struct Op<T: 'static> {
    key: usize,
    generation: u32,
    runtime: u64,
    shard: usize,
    resources: Option<T>,
    cleanup: Option<Cleanup>,
    /// Set once the op was polled off its shard: the home shard hands the
    /// result over through it (see [`RemoteResult`]).
    remote: Option<std::sync::Arc<RemoteResult>>,
    _not_sync: PhantomData<std::cell::Cell<()>>,
}

/// The hand-over of an operation's result to a poller on another thread.
///
/// An `Op` moved off its shard after submission (a future polled by hand
/// on another thread) cannot look at the op table, which only its shard's
/// thread touches. Its first poll there sends a call to the home shard
/// that takes the result if the CQE already came, or else puts a
/// [`RemoteTaker`] in the slot as its waker, which takes it when the CQE
/// comes. Either way the home shard removes the slot, stores the result
/// here and wakes the poller. The kernel's writes into the op's buffers
/// happen before its CQE is reaped on the home shard, which happens before
/// the mutex hands the result over: the poller may then read them.
#[derive(Default)]
pub(crate) struct RemoteResult {
    state: std::sync::Mutex<RemoteState>,
}

#[derive(Default)]
struct RemoteState {
    result: Option<(i32, u32)>,
    waker: Option<Waker>,
    requested: bool,
    /// The home shard found no slot (its runtime shut down and dropped it).
    lost: bool,
}

impl RemoteResult {
    fn lock(&self) -> std::sync::MutexGuard<'_, RemoteState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn finish(&self, outcome: Option<(i32, u32)>) {
        let waker = {
            let mut state = self.lock();
            match outcome {
                Some(r) => state.result = Some(r),
                None => state.lost = true,
            }
            state.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// The waker a home shard leaves in the slot of an op polled elsewhere:
/// woken by the op's CQE on the home shard, it takes the result over.
struct RemoteTaker {
    key: usize,
    generation: u32,
    remote: std::sync::Arc<RemoteResult>,
}

impl std::task::Wake for RemoteTaker {
    fn wake(self: std::sync::Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        take_for_remote(self.key, self.generation, &self.remote);
    }
}

/// On the home shard: moves a finished op's result to `remote`, or leaves a
/// [`RemoteTaker`] in its slot to do so when it finishes.
fn take_for_remote(key: usize, generation: u32, remote: &std::sync::Arc<RemoteResult>) {
    let outcome = with_current(|shard| {
        let mut ops = shard.ops_mut();
        let Some(slot) = ops.slot_mut(key, generation) else {
            return Some(None);
        };
        match &mut slot.state {
            SlotState::Done { res, flags } => {
                let done = (*res, *flags);
                ops.slots.remove(key);
                Some(Some(done))
            }
            SlotState::Waiting(waker) | SlotState::AwaitingNotif { waker, .. } => {
                *waker = Some(Waker::from(std::sync::Arc::new(RemoteTaker {
                    key,
                    generation,
                    remote: remote.clone(),
                })));
                None
            }
            SlotState::Abandoned { .. } | SlotState::Multishot { .. } => Some(None),
        }
    });
    if let Some(outcome) = outcome.flatten() {
        remote.finish(outcome);
    }
}

impl<T: 'static> fmt::Debug for Op<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Op")
            .field("key", &self.key)
            .field("shard", &self.shard)
            .finish()
    }
}

/// The error of an operation used on a thread that is not its shard.
pub(crate) fn wrong_shard() -> io::Error {
    io::Error::other("mailring: this I/O object belongs to another shard (or no shard runs this thread); use it from the shard that opened it")
}

impl<T: 'static> Op<T> {
    /// Submits the SQE that `build` makes from the resources, on the current shard.
    ///
    /// # Safety
    ///
    /// The entry may refer only to memory owned by `resources` whose address
    /// does not change when `resources` is moved (heap buffers, `CString`s),
    /// and to fds that stay open while the operation is in flight.
    pub(crate) unsafe fn submit(
        resources: T,
        cleanup: Option<Cleanup>,
        build: impl FnOnce(&mut T) -> squeue::Entry,
    ) -> io::Result<Op<T>> {
        // SAFETY: the caller's contract, passed on.
        unsafe { Self::submit_as(false, resources, cleanup, build) }
    }

    /// [`Op::submit`] for an operation the kernel most likely hands to an
    /// io-wq worker thread (a file write, a sync, a path operation): it is
    /// counted in [`OpTable::offloaded`] while in flight.
    ///
    /// # Safety
    ///
    /// As [`Op::submit`].
    pub(crate) unsafe fn submit_offloaded(
        resources: T,
        cleanup: Option<Cleanup>,
        build: impl FnOnce(&mut T) -> squeue::Entry,
    ) -> io::Result<Op<T>> {
        // SAFETY: the caller's contract, passed on.
        unsafe { Self::submit_as(true, resources, cleanup, build) }
    }

    /// # Safety
    ///
    /// As [`Op::submit`].
    unsafe fn submit_as(
        offloaded: bool,
        mut resources: T,
        cleanup: Option<Cleanup>,
        build: impl FnOnce(&mut T) -> squeue::Entry,
    ) -> io::Result<Op<T>> {
        let entry = build(&mut resources);
        with_current(move |shard| {
            let (key, generation) = shard.ops_mut().insert(offloaded);
            let entry = entry.user_data(user_data(key, generation));
            // SAFETY: the entry refers only to memory `resources` owns at a
            // stable address (caller). `resources` is never freed before this
            // op's CQE is reaped on this shard: the `Op` holds it (and gives it
            // up only after the result was taken here, or handed over by this
            // shard after the CQE, see `RemoteResult`); dropped here, it moves
            // into the `Abandoned` slot until the CQE; dropped off this shard,
            // it is forgotten; still in flight at the end of shutdown, it is
            // leaked with its slot (`leak_pending`).
            unsafe { shard.push_op(&entry) };
            Op {
                key,
                generation,
                runtime: shard.runtime_id(),
                shard: shard.index(),
                resources: Some(resources),
                cleanup,
                remote: None,
                _not_sync: PhantomData,
            }
        })
        .ok_or_else(wrong_shard)
    }

    fn on_own_shard(&self, shard: &Shard) -> bool {
        shard.runtime_id() == self.runtime && shard.index() == self.shard
    }
}

// The kernel only sees memory that `T` owns at stable addresses (see
// `Op::submit`), never `T` itself, so moving an `Op` is harmless.
impl<T: 'static> Unpin for Op<T> {}

impl<T: 'static> Future for Op<T> {
    type Output = (io::Result<(u32, u32)>, T);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let polled = if this.remote.is_some() {
            None
        } else {
            with_current(|shard| {
                this.on_own_shard(shard)
                    .then(|| this.poll_on_shard(shard, cx))
            })
            .flatten()
        };
        let outcome = match polled {
            Some(p) => p,
            // Off its shard (or handed over before): the home shard passes
            // the result on.
            None => this.poll_remote(cx),
        };
        let (res, flags) = match outcome {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(r) => r,
        };
        this.cleanup = None;
        let result = if res < 0 {
            Err(io::Error::from_raw_os_error(-res))
        } else {
            Ok((res as u32, flags))
        };
        this.key = usize::MAX;
        let resources = this.resources.take().expect("Op polled after completion");
        Poll::Ready((result, resources))
    }
}

impl<T: 'static> Op<T> {
    fn poll_on_shard(&mut self, shard: &Shard, cx: &mut Context<'_>) -> Poll<(i32, u32)> {
        let mut ops = shard.ops_mut();
        let slot = ops
            .slot_mut(self.key, self.generation)
            .expect("an op's slot lives until the op takes its result or is dropped");
        match &mut slot.state {
            SlotState::Done { res, flags } => {
                let (res, flags) = (*res, *flags);
                ops.slots.remove(self.key);
                Poll::Ready((res, flags))
            }
            SlotState::Waiting(waker) | SlotState::AwaitingNotif { waker, .. } => {
                match waker {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    _ => *waker = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
            SlotState::Abandoned { .. } | SlotState::Multishot { .. } => {
                unreachable!("a live op's slot is never abandoned or multishot")
            }
        }
    }

    /// Polled on another thread than its shard's: asks the home shard
    /// (once) to hand the result over (see [`RemoteResult`]).
    #[cold]
    fn poll_remote(&mut self, cx: &mut Context<'_>) -> Poll<(i32, u32)> {
        let remote = self.remote.get_or_insert_with(Default::default).clone();
        {
            let mut state = remote.lock();
            if let Some(done) = state.result.take() {
                return Poll::Ready(done);
            }
            assert!(
                !state.lost,
                "mailring: the runtime that owns this I/O operation shut down before it completed"
            );
            state.waker = Some(cx.waker().clone());
            if state.requested {
                return Poll::Pending;
            }
            state.requested = true;
        }
        let Some(shared) = crate::runtime::Shared::find(self.runtime) else {
            panic!(
                "mailring: the runtime that owns this I/O operation shut down before it completed"
            );
        };
        let request = RemoteRequest {
            key: self.key,
            generation: self.generation,
            remote: Some(remote),
        };
        shared.deliver(
            self.shard,
            crate::shard::InboxItem::Call(Box::new(move || request.run())),
        );
        Poll::Pending
    }
}

/// The call that asks a home shard for an op's result; one that no shard
/// runs (the runtime shut down) tells the poller the result is lost
/// instead of leaving it waiting.
struct RemoteRequest {
    key: usize,
    generation: u32,
    remote: Option<std::sync::Arc<RemoteResult>>,
}

impl RemoteRequest {
    fn run(mut self) {
        if let Some(remote) = self.remote.take() {
            take_for_remote(self.key, self.generation, &remote);
        }
    }
}

impl Drop for RemoteRequest {
    fn drop(&mut self) {
        if let Some(remote) = self.remote.take() {
            remote.finish(None);
        }
    }
}

impl<T: 'static> Drop for Op<T> {
    fn drop(&mut self) {
        if self.key == usize::MAX {
            return;
        }
        // Forgotten, not freed, if anything below unwinds (a waker's or a
        // cleanup's panic): the kernel may still use them.
        let mut guard = ForgetOnUnwind(Some(self.resources.take()));
        let resources = guard.0.as_mut().expect("just filled");
        let (key, generation, cleanup) = (self.key, self.generation, self.cleanup.take());
        let (runtime, home) = (self.runtime, self.shard);
        if let Some(remote) = &self.remote {
            let handed_over = remote.lock().result.take();
            if let Some((res, flags)) = handed_over {
                // Handed over and never looked at: the kernel is done with
                // the resources; undo what the op produced.
                if let Some(cleanup) = cleanup {
                    cleanup(res, flags, &*resources);
                }
                return;
            }
        }
        // `Some(true)`: the resources may be dropped here (the kernel is done with them).
        let released = with_current(|shard| {
            if shard.runtime_id() != runtime || shard.index() != home {
                return false;
            }
            let mut ops = shard.ops_mut();
            let Some(slot) = ops.slot_mut(key, generation) else {
                return true;
            };
            if let SlotState::Done { res, flags } = slot.state {
                // Completed but never looked at: undo what it produced.
                if let Some(cleanup) = cleanup {
                    cleanup(res, flags, &*resources);
                }
                ops.slots.remove(key);
                return true;
            }
            slot.state = SlotState::Abandoned {
                resources: Box::new(resources.take()),
                cleanup,
            };
            drop(ops);
            shard.cancel_op(user_data(key, generation));
            true
        });
        if released != Some(true) {
            // Dropped off its shard (only possible by moving an in-flight future
            // between threads by hand): the kernel may still write into the
            // resources, so they are leaked rather than freed.
            std::mem::forget(resources.take());
        }
    }
}

/// Holds what an op lent the kernel while its drop runs code that may
/// unwind (wakers, cleanups, a borrowed table): an unwind forgets it
/// instead of freeing memory the kernel may still write.
struct ForgetOnUnwind<T>(Option<T>);

impl<T> Drop for ForgetOnUnwind<T> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            std::mem::forget(self.0.take());
        }
    }
}

/// A descriptor that belongs to one shard: its operations go to that shard's
/// ring, and in-flight operations keep it open through the shared `Arc`.
#[derive(Debug)]
pub(crate) struct ShardFd {
    pub(crate) fd: std::sync::Arc<std::os::fd::OwnedFd>,
    runtime: u64,
    shard: usize,
}

impl ShardFd {
    /// Adopts `fd` on the current shard.
    pub(crate) fn adopt(fd: std::os::fd::OwnedFd) -> io::Result<ShardFd> {
        let (runtime, shard) =
            with_current(|s| (s.runtime_id(), s.index())).ok_or_else(wrong_shard)?;
        Ok(ShardFd {
            fd: std::sync::Arc::new(fd),
            runtime,
            shard,
        })
    }

    /// `Ok` when the caller runs on the owning shard.
    pub(crate) fn check(&self) -> io::Result<()> {
        match with_current(|s| s.runtime_id() == self.runtime && s.index() == self.shard) {
            Some(true) => Ok(()),
            _ => Err(wrong_shard()),
        }
    }

    /// Gives the descriptor up, for moving it to another shard; fails (giving
    /// `self` back) while an abandoned operation still holds it.
    pub(crate) fn into_owned(self) -> Result<std::os::fd::OwnedFd, ShardFd> {
        self.into_owned_if(|| true)
    }

    /// As [`into_owned`](Self::into_owned), and only if `free()` holds once
    /// no abandoned operation holds the descriptor: it is asked after, so
    /// it sees what such an operation did before it let go (the release of
    /// its reference, acquired by the unwrap).
    pub(crate) fn into_owned_if(
        self,
        free: impl FnOnce() -> bool,
    ) -> Result<std::os::fd::OwnedFd, ShardFd> {
        let ShardFd { fd, runtime, shard } = self;
        match std::sync::Arc::try_unwrap(fd) {
            Ok(owned) if free() => Ok(owned),
            Ok(owned) => Err(ShardFd {
                fd: std::sync::Arc::new(owned),
                runtime,
                shard,
            }),
            Err(fd) => Err(ShardFd { fd, runtime, shard }),
        }
    }

    pub(crate) fn raw(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.fd.as_raw_fd()
    }
}

/// A file an operation names: a descriptor ([`ShardFd`]) or a slot of the
/// ring's direct-descriptor table (`net::DirectStream`).
pub(crate) trait OpFile {
    /// What the SQE names (`RawFd`, or the slot).
    type Raw: Copy;
    /// What the op keeps alive until its CQE.
    type Keep: 'static;
    /// Whether `Raw` is a slot of the ring's table (`IOSQE_FIXED_FILE`).
    const FIXED: bool;

    /// `entry` with the fixed-file flag when the file is a slot.
    fn finish(entry: squeue::Entry) -> squeue::Entry {
        if Self::FIXED {
            entry.flags(squeue::Flags::FIXED_FILE)
        } else {
            entry
        }
    }
    /// `Ok` on the file's shard.
    fn check(&self) -> io::Result<()>;
    fn raw(&self) -> Self::Raw;
    fn keep(&self) -> Self::Keep;
    /// A plain non-blocking `send` of what the socket takes at once
    /// (`MSG_DONTWAIT | MSG_NOSIGNAL`), for a file with a process
    /// descriptor; `None` for one without (a direct descriptor is known to
    /// its ring alone).
    fn send_now(&self, _buf: &[u8]) -> Option<io::Result<usize>> {
        None
    }
    /// A plain non-blocking `recv` into `buf` (`MSG_DONTWAIT`), for a file
    /// with a process descriptor; `None` for one without.
    fn recv_now(&self, _buf: &mut [std::mem::MaybeUninit<u8>]) -> Option<io::Result<usize>> {
        None
    }
    /// A plain non-blocking `recv` that leaves the bytes queued
    /// (`MSG_PEEK | MSG_DONTWAIT`), for a file with a process descriptor;
    /// `None` for one without.
    fn peek_now(&self, _buf: &mut [u8]) -> Option<io::Result<usize>> {
        None
    }
}

impl OpFile for ShardFd {
    type Raw = std::os::fd::RawFd;
    type Keep = std::sync::Arc<std::os::fd::OwnedFd>;
    const FIXED: bool = false;

    fn check(&self) -> io::Result<()> {
        ShardFd::check(self)
    }
    fn raw(&self) -> std::os::fd::RawFd {
        ShardFd::raw(self)
    }
    fn keep(&self) -> Self::Keep {
        self.fd.clone()
    }
    fn send_now(&self, buf: &[u8]) -> Option<io::Result<usize>> {
        Some(
            socket2::SockRef::from(&*self.fd)
                .send_with_flags(buf, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL),
        )
    }
    fn recv_now(&self, buf: &mut [std::mem::MaybeUninit<u8>]) -> Option<io::Result<usize>> {
        Some(socket2::SockRef::from(&*self.fd).recv_with_flags(buf, libc::MSG_DONTWAIT))
    }
    fn peek_now(&self, buf: &mut [u8]) -> Option<io::Result<usize>> {
        Some(socket2::SockRef::from(&*self.fd).recv_with_flags(
            initialised_as_spare(buf),
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        ))
    }
}

/// `buf` as the spare room a `recv` takes, for a receive into bytes that
/// are initialised already.
pub(crate) fn initialised_as_spare(buf: &mut [u8]) -> &mut [std::mem::MaybeUninit<u8>] {
    // SAFETY: `[u8]` and `[MaybeUninit<u8>]` have the same layout, and the
    // only writer given the result, `recv`, writes initialised bytes into
    // it (it never de-initialises one), so `buf` stays fully initialised.
    unsafe { &mut *(std::ptr::from_mut(buf) as *mut [std::mem::MaybeUninit<u8>]) }
}

/// Submits a read-like operation on `fd`'s shard: the kernel writes into
/// `buf` from byte `from` up to its capacity; afterwards the buffer's
/// initialised length is `from` plus the byte count (the first `from` bytes
/// must already be initialised).
///
/// # Safety
///
/// `build(fd, ptr, len)` must make an SQE that writes at most `len` bytes at
/// `ptr` and uses no other memory.
pub(crate) async unsafe fn submit_read<B: crate::buf::IoBufMut, F: OpFile>(
    fd: &F,
    mut buf: B,
    from: usize,
    build: impl FnOnce(F::Raw, *mut u8, u32) -> squeue::Entry,
) -> (io::Result<usize>, B) {
    if let Err(e) = fd.check() {
        return (Err(e), buf);
    }
    let keep = fd.keep();
    let raw = fd.raw();
    let total = buf.bytes_total();
    let from = from.min(total);
    let len = (total - from).min(u32::MAX as usize) as u32;
    // SAFETY: the SQE writes into the buffer's heap memory from `from <= total`
    // on (stable across moves, `IoBufMut` contract; caller's contract on
    // `build`) and uses the fd kept open by `keep`; both live in the op until
    // its CQE.
    let op = unsafe {
        Op::submit((buf, keep), None, |(b, _)| {
            F::finish(build(raw, b.stable_mut_ptr().add(from), len))
        })
    };
    let op = op.expect("checked to be on the descriptor's shard");
    let (res, (mut buf, _)) = op.await;
    match res {
        Ok((n, _)) => {
            // SAFETY: the first `from` bytes were initialised before (caller)
            // and the kernel wrote `n <= len` bytes right after them.
            unsafe { buf.set_init(from + n as usize) };
            (Ok(n as usize), buf)
        }
        Err(e) => (Err(e), buf),
    }
}

/// Submits a write-like operation (the kernel reads `buf[from..]`) on `fd`'s shard.
///
/// # Safety
///
/// `build(fd, ptr, len)` must make an SQE that reads at most `len` bytes at
/// `ptr` and uses no other memory.
///
/// `offloaded`: the kernel most likely runs it on an io-wq worker (a write
/// to a regular file), see [`Op::submit_offloaded`]. `hold` stays in the
/// op's resources until its CQE (dropped then, or with the result).
pub(crate) async unsafe fn submit_write<B: crate::buf::IoBuf, F: OpFile, H: 'static>(
    fd: &F,
    buf: B,
    from: usize,
    offloaded: bool,
    hold: H,
    build: impl FnOnce(F::Raw, *const u8, u32) -> squeue::Entry,
) -> (io::Result<usize>, B) {
    if let Err(e) = fd.check() {
        return (Err(e), buf);
    }
    let keep = fd.keep();
    let raw = fd.raw();
    let init = buf.bytes_init();
    let from = from.min(init);
    let len = (init - from).min(u32::MAX as usize) as u32;
    // SAFETY: the SQE reads the buffer's heap memory from `from <= bytes_init`
    // on (stable, `IoBuf` contract; caller's contract on `build`) and uses the
    // fd kept open by `keep`; both live in the op until its CQE.
    let op = unsafe {
        Op::submit_as(offloaded, (buf, keep, hold), None, |(b, _, _)| {
            F::finish(build(raw, b.stable_ptr().add(from), len))
        })
    };
    let op = op.expect("checked to be on the descriptor's shard");
    let (res, (buf, _, _)) = op.await;
    (res.map(|(n, _)| n as usize), buf)
}

/// A multishot operation (e.g. multishot accept): one SQE, many CQEs, each
/// result queued in the op table until taken.
///
/// Dropping it cancels the operation; results still queued or still arriving
/// go through `cleanup` (an accepted fd is closed), so nothing leaks.
#[derive(Debug)]
pub(crate) struct MultishotOp {
    key: usize,
    generation: u32,
    runtime: u64,
    shard: usize,
    keep: Option<Box<dyn Any + Send>>,
    cleanup: Cleanup,
    /// To send the op home when it is dropped on another thread.
    shared: std::sync::Arc<crate::runtime::Shared>,
}

impl MultishotOp {
    /// Submits a multishot SQE on the current shard.
    ///
    /// # Safety
    ///
    /// The entry may refer only to resources `keep` owns (the fd, a buffer
    /// ring), and a buffer group it names must be one registered on the
    /// current shard (group ids repeat across shards).
    pub(crate) unsafe fn submit(
        keep: Box<dyn Any + Send>,
        cleanup: Cleanup,
        entry: squeue::Entry,
    ) -> io::Result<MultishotOp> {
        with_current(move |shard| {
            let (key, generation) = shard.ops_mut().insert(false);
            if let Some(slot) = shard.ops_mut().slot_mut(key, generation) {
                slot.state = SlotState::Multishot {
                    results: Default::default(),
                    wakers: Vec::new(),
                    live: true,
                };
            }
            let entry = entry.user_data(user_data(key, generation));
            // SAFETY: the entry refers only to what `keep` owns (the fd, and
            // for a receive the buffer ring of this shard's group named in
            // it; caller's contract). `keep` is never freed before the op's
            // last CQE is reaped here: the `MultishotOp` holds it, its drop
            // here moves it into the `Abandoned` slot (freed on the CQE
            // without `IORING_CQE_F_MORE`), a drop elsewhere sends the op home
            // or, once shutting down, forgets `keep`, and shutdown leaks a
            // slot still live (`leak_pending`).
            unsafe { shard.push_op(&entry) };
            MultishotOp {
                key,
                generation,
                runtime: shard.runtime_id(),
                shard: shard.index(),
                keep: Some(keep),
                cleanup,
                shared: shard.shared.clone(),
            }
        })
        .ok_or_else(wrong_shard)
    }

    /// The next result; `Ready(None)` once the operation ended (re-arm it).
    pub(crate) fn poll_next(&self, cx: &mut Context<'_>) -> Poll<io::Result<Option<(i32, u32)>>> {
        let polled = with_current(|shard| {
            if shard.runtime_id() != self.runtime || shard.index() != self.shard {
                return Poll::Ready(Err(wrong_shard()));
            }
            let mut ops = shard.ops_mut();
            let Some(slot) = ops.slot_mut(self.key, self.generation) else {
                return Poll::Ready(Ok(None));
            };
            let SlotState::Multishot {
                results,
                wakers,
                live,
            } = &mut slot.state
            else {
                return Poll::Ready(Ok(None));
            };
            if let Some(res) = results.pop_front() {
                return Poll::Ready(Ok(Some(res)));
            }
            if !*live {
                return Poll::Ready(Ok(None));
            }
            if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
                wakers.push(cx.waker().clone());
            }
            Poll::Pending
        });
        polled.unwrap_or_else(|| Poll::Ready(Err(wrong_shard())))
    }
}

impl Drop for MultishotOp {
    fn drop(&mut self) {
        let (key, generation, cleanup) = (self.key, self.generation, self.cleanup);
        let Some(keep) = self.keep.take() else { return };
        // What the op lent the kernel is forgotten, not freed, if a cleanup
        // below unwinds (a buffer's return wakes user wakers).
        let mut keep = ForgetOnUnwind(Some(keep));
        let (runtime, home) = (self.runtime, self.shard);
        // 1. Take the results nobody will read, outside of which no user
        //    code runs with the op table borrowed.
        let queued = with_current(|shard| {
            if shard.runtime_id() != runtime || shard.index() != home {
                return None;
            }
            let mut ops = shard.ops_mut();
            let results = match ops.slot_mut(key, generation).map(|s| &mut s.state) {
                Some(SlotState::Multishot { results, .. }) => std::mem::take(results),
                _ => Default::default(),
            };
            Some(results)
        })
        .flatten();
        let handled = queued.map(|queued| {
            // 2. Undo them (close accepted fds, give buffers back).
            let resources: &dyn Any = keep.0.as_deref().expect("present");
            for (res, flags) in queued {
                cleanup(res, flags, resources);
            }
            // 3. A live op keeps its resources in its slot until its last CQE.
            with_current(|shard| {
                let mut ops = shard.ops_mut();
                let Some(slot) = ops.slot_mut(key, generation) else {
                    return;
                };
                let SlotState::Multishot { live, .. } = &slot.state else {
                    return;
                };
                if !*live {
                    ops.slots.remove(key);
                    return;
                }
                let resources: Box<dyn Any> = keep.0.take().expect("present");
                slot.state = SlotState::Abandoned {
                    resources,
                    cleanup: Some(cleanup),
                };
                drop(ops);
                shard.cancel_op(user_data(key, generation));
            });
            true
        });
        if handled == Some(true) {
            return;
        }
        // Dropped off its shard (a listener moved to another thread): the
        // op goes home and is dropped there, which cancels it and, once the
        // kernel lets go, closes what it kept (a listening socket stops
        // accepting). A runtime that is shutting down cannot take it: its
        // shutdown cancels every operation, and the resources are leaked
        // rather than freed under the kernel.
        let keep = keep.0.take();
        if self.shared.is_shutting_down() {
            std::mem::forget(keep);
            return;
        }
        let home_op = MultishotOp {
            key,
            generation,
            runtime,
            shard: home,
            keep,
            cleanup,
            shared: self.shared.clone(),
        };
        let shared = self.shared.clone();
        shared.deliver(
            home,
            crate::shard::InboxItem::Call(Box::new(move || drop(home_op))),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    thread_local! {
        static CLEANUPS: Cell<u32> = const { Cell::new(0) };
    }

    fn count_cleanup(_res: i32, _flags: u32, resources: &dyn Any) {
        assert_eq!(
            resources.downcast_ref::<u64>(),
            Some(&7),
            "its own resources"
        );
        CLEANUPS.with(|c| c.set(c.get() + 1));
    }

    #[test]
    fn an_abandoned_operation_s_cleanup_runs_outside_the_table_on_lent_resources() {
        let mut table = OpTable::default();
        let (key, generation) = table.insert(false);
        let ud = user_data(key, generation);
        table.slot_mut(key, generation).unwrap().state = SlotState::Abandoned {
            resources: Box::new(7u64),
            cleanup: Some(count_cleanup),
        };
        // A completion with more to come: nothing runs inside the table;
        // the cleanup and its resources are handed out.
        let more = 1 << 1; // IORING_CQE_F_MORE
        let Woken::Lent {
            user_data: lent_for,
            resources,
            cleanup,
            res,
            flags,
        } = table.complete(ud, 3, more)
        else {
            panic!("lent")
        };
        assert_eq!(CLEANUPS.with(Cell::get), 0);
        assert_eq!((lent_for, res, flags), (ud, 3, more));
        cleanup(res, flags, &*resources);
        assert_eq!(CLEANUPS.with(Cell::get), 1);
        assert_eq!(table.awaiting_kernel(), 1);
        table.give_back(ud, resources);
        // The last completion releases the same resources.
        let Woken::Released { resources, .. } = table.complete(ud, 0, 0) else {
            panic!("released")
        };
        assert_eq!(resources.downcast_ref::<u64>(), Some(&7));
        assert_eq!(table.len(), 0);
        // Given back to a slot that is gone: leaked, not dropped.
        struct Loud;
        impl Drop for Loud {
            fn drop(&mut self) {
                panic!("freed while the kernel may use it");
            }
        }
        table.give_back(ud, Box::new(Loud));
    }
}
