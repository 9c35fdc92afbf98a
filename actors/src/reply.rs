//! The shared cell of an `ask`: the message on its way to the actor and the
//! one-shot reply slot, in one block that the asker's [`Reply`] and the
//! envelope in the actor's mailbox both point to.
//!
//! The reply slot takes one outcome: the handler's answer, or the error of an
//! envelope dropped unanswered (the actor stopped, or the handler panicked,
//! which `std::thread::panicking()` tells apart); the first one wins and the
//! asker takes it once. A `tell` carries no cell at all.
//!
//! The cell is a [`Header`] (reference count, reply slot, ask chain, and the
//! function that frees the cell) followed by the message. Both halves hold a
//! thin pointer to the header, so neither needs the message type; the block
//! comes from `mailring::pool`, whose per-thread caches make a burst of asks
//! allocation-free after its first round. This module owns the cell's
//! `unsafe` code.

use std::alloc::Layout;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::mem::{self, MaybeUninit};
use std::pin::Pin;
use std::ptr::{self, NonNull};
use std::sync::atomic::{fence, AtomicUsize, Ordering};
use std::task::{Context, Poll};

use mailring::sync::Slot;
use std::time::{Duration, Instant};

use crate::actor::Message;
use crate::error::AskError;
use crate::runner::Chain;

/// The part of an ask's cell both halves use, whatever the message type.
#[repr(C)]
struct Header<R> {
    /// Live handles in the low bits: the asker's [`Reply`], the envelope
    /// half ([`Asked`], then [`ReplyTo`]) and, while a handler awaits the
    /// reply, its actor's [`Waited`] entry. The last one to let go frees the
    /// cell. The top bits are flags of ask-cycle detection ([`WAITED`],
    /// [`ASKER_CLAIM`], [`TARGET_CLAIM`]), kept here so the cell stays one
    /// cache line.
    refs: AtomicUsize,
    /// The first outcome wins: the handler's answer, or the reason it never came.
    reply: Slot<Result<R, AskError>>,
    /// The actors waiting on this ask, outermost first (deadlock detection).
    chain: Option<Chain>,
    /// Drops the header's fields and frees the cell (it knows the message type).
    free: unsafe fn(NonNull<Header<R>>),
}

/// One ask's block: the header first (`repr(C)`), so a pointer to the cell is
/// a pointer to its header.
#[repr(C)]
struct AskCell<M: Message> {
    header: Header<M::Reply>,
    /// Owned by the envelope half: moved out when the ask is opened, dropped
    /// in place when the envelope is dropped unopened. Gone before the cell
    /// is freed, because the envelope half deals with it before letting go.
    msg: MaybeUninit<M>,
}

/// Flag of [`Header::refs`]: a handler awaits this reply (its actor is
/// blocked on it). Set with the [`Waited`] entry's handle, cleared by the
/// [`Reply`] when it lets go (in the same subtraction as its handle).
const WAITED: usize = 1 << (usize::BITS - 1);
/// Flag of [`Header::refs`]: the asking actor refused an ask of a cycle
/// whose arbiter is this ask (see [`Waited::claim`]).
const ASKER_CLAIM: usize = 1 << (usize::BITS - 2);
/// Flag of [`Header::refs`]: the asked actor refused an ask of a cycle
/// whose arbiter is this ask.
const TARGET_CLAIM: usize = 1 << (usize::BITS - 3);
/// The handle count of [`Header::refs`] (at most 3 live).
const COUNT: usize = TARGET_CLAIM - 1;

/// Frees a cell of message type `M` whose last handle let go.
///
/// # Safety
///
/// `header` points to the header of a live `AskCell<M>` from [`Asked::new`],
/// with no handle left and the message already moved out or dropped.
unsafe fn free_cell<M: Message>(header: NonNull<Header<M::Reply>>) {
    let cell = header.cast::<AskCell<M>>();
    // SAFETY: (caller) the cell is live and unreachable from anywhere else;
    // the header is initialised, the message is not (nothing to drop there).
    unsafe {
        ptr::drop_in_place(ptr::addr_of_mut!((*cell.as_ptr()).header));
        mailring::pool::dealloc(cell.cast(), Layout::new::<AskCell<M>>());
    }
}

/// Lets go of one handle on the cell, freeing it if that was the last.
///
/// # Safety
///
/// `header` is a live cell's header and the caller owns one of its handles,
/// which it does not use again.
unsafe fn release<R>(header: NonNull<Header<R>>) {
    // SAFETY: (caller) as ours.
    unsafe { release_with(header, 1) }
}

/// [`release`], subtracting `sub` (one handle, and flags the caller owns
/// and knows are set).
///
/// # Safety
///
/// As [`release`]; the flags in `sub` are set.
unsafe fn release_with<R>(header: NonNull<Header<R>>, sub: usize) {
    // SAFETY: (caller) the handle keeps the cell alive until this decrement.
    let h = unsafe { header.as_ref() };
    // Release: this side's uses of the cell happen before the free; the
    // Acquire fence below makes the freeing side see them (as `Arc` does).
    if (h.refs.fetch_sub(sub, Ordering::Release) - sub) & COUNT == 0 {
        fence(Ordering::Acquire);
        let free = h.free;
        // SAFETY: the count reached zero, so no other handle exists; `free`
        // is the cell's own function, and the message is gone (see `AskCell::msg`).
        unsafe { free(header) };
    }
}

/// Why an ask dropped right now goes unanswered.
fn drop_reason() -> AskError {
    if std::thread::panicking() {
        AskError::Panicked
    } else {
        DROP_REASON
            .try_with(std::cell::Cell::get)
            .ok()
            .flatten()
            .unwrap_or(AskError::Stopped)
    }
}

/// An asked message on its way to (or in) an actor's mailbox. Dropping it
/// unopened fails the ask with the reason (stopped, panicked, shutting down).
pub struct Asked<M: Message> {
    cell: NonNull<AskCell<M>>,
    _owns: PhantomData<M>,
}

// SAFETY: an `Asked` owns the message (it moves with the envelope to the
// actor's shard, so `M: Send`) and one handle on the reply slot, whose value
// is sent from the actor's shard to the asker (`M::Reply: Send`; `Slot` is
// `Sync` for `Send` values). The count is atomic.
unsafe impl<M: Message + Send> Send for Asked<M> where M::Reply: Send {}

impl<M: Message> fmt::Debug for Asked<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Asked")
    }
}

impl<M> Asked<M>
where
    M: Message + Send,
    M::Reply: Send,
{
    /// A new ask of `msg`: the envelope half and the asker's reply.
    #[cfg(test)]
    pub(crate) fn new(msg: M, chain: Option<Chain>) -> (Asked<M>, Reply<M::Reply>) {
        Self::asking(msg, chain, None, None)
    }

    /// [`new`](Self::new) with the reply's final fields, built in place
    /// (the ask path moves no finished `Reply` around to amend it): the
    /// actor `target` a handler asks (the first poll from that handler
    /// records the wait on its actor, see [`Waited`]) and the default
    /// timeout.
    #[inline]
    pub(crate) fn asking(
        msg: M,
        chain: Option<Chain>,
        target: Option<u64>,
        timeout: Option<Duration>,
    ) -> (Asked<M>, Reply<M::Reply>) {
        let timer = match timeout {
            None => Timer::None,
            Some(t) => match mailring::time::now().checked_add(t) {
                Some(deadline) => Timer::At(deadline),
                None => Timer::None,
            },
        };
        let wait = match target {
            Some(t) => Wait::Target(t),
            None => Wait::No,
        };
        let cell = mailring::pool::alloc(Layout::new::<AskCell<M>>()).cast::<AskCell<M>>();
        // SAFETY: the block is fresh, sized and aligned for an `AskCell<M>`.
        unsafe {
            cell.as_ptr().write(AskCell {
                header: Header {
                    refs: AtomicUsize::new(2),
                    reply: Slot::new(),
                    chain,
                    free: free_cell::<M>,
                },
                msg: MaybeUninit::new(msg),
            });
        }
        (
            Asked {
                cell,
                _owns: PhantomData,
            },
            Reply {
                inner: ReplyInner::Pending(cell.cast()),
                timer,
                wait,
            },
        )
    }
}

impl<M: Message> Asked<M> {
    /// Takes the message out, with the slot its reply goes to.
    pub fn open(self) -> (M, ReplyTo<M::Reply>) {
        let cell = self.cell;
        mem::forget(self);
        // SAFETY: this `Asked` owned the message, which is initialised (it is
        // moved out only here, and dropped only by `Drop`, which is skipped).
        let msg = unsafe { ptr::addr_of!((*cell.as_ptr()).msg).read().assume_init() };
        (
            msg,
            ReplyTo {
                header: Some(cell.cast()),
            },
        )
    }
}

impl<M: Message> Asked<M> {
    /// What ask-cycle detection reads of an ask on its way to an actor.
    #[doc(hidden)]
    pub fn __probe(&self) -> AskProbe<'_> {
        let header: NonNull<Header<M::Reply>> = self.cell.cast();
        // SAFETY: our handle keeps the cell alive for the borrow of `self`;
        // the chain is never written after the cell is made.
        let h = unsafe { header.as_ref() };
        AskProbe {
            refs: &h.refs,
            sender: h.chain.as_ref().and_then(|c| c.last().copied()),
        }
    }
}

/// An ask on its way to an actor, as ask-cycle detection sees it: the
/// actor that asked (if a handler of one did) and the cell's shared word.
#[doc(hidden)]
#[derive(Debug)]
pub struct AskProbe<'a> {
    refs: &'a AtomicUsize,
    sender: Option<u64>,
}

impl AskProbe<'_> {
    /// The asking actor, when the ask was made by one of its handlers (the
    /// last link of the ask chain).
    pub(crate) fn sender(&self) -> Option<u64> {
        self.sender
    }

    /// Claims the refusal of a cycle whose arbiter is this ask, as the actor
    /// it is asked of (see [`Waited::claim`]).
    pub(crate) fn claim_as_target(&self) -> bool {
        claim(self.refs, TARGET_CLAIM, ASKER_CLAIM)
    }
}

/// Sets `mine` in an arbiter's word unless `theirs` is set; whether it did.
/// A side that loses leaves no mark: a later claim of the winner's side
/// (a new ask of the cycle) still wins.
fn claim(word: &AtomicUsize, mine: usize, theirs: usize) -> bool {
    word.fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
        (w & theirs == 0).then_some(w | mine)
    })
    .is_ok()
}

/// A handler's wait on a reply, kept by its actor for ask-cycle detection:
/// the target asked and a handle on the ask's cell (so the cell outlives
/// the entry wherever the [`Reply`] goes). Lives on the actor's shard.
pub(crate) struct Waited {
    refs: NonNull<AtomicUsize>,
    /// Lets go of the handle (knows the reply type).
    release: unsafe fn(NonNull<AtomicUsize>),
    target: u64,
}

impl fmt::Debug for Waited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Waited")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

/// Lets go of a [`Waited`] entry's handle.
///
/// # Safety
///
/// `refs` is the first field of a live `Header<R>` whose handle the caller
/// owns and does not use again.
unsafe fn release_waited<R>(refs: NonNull<AtomicUsize>) {
    // SAFETY: (caller) `refs` starts the `repr(C)` header, so it is the header.
    unsafe { release::<R>(refs.cast()) }
}

impl Waited {
    /// The actor whose answer the handler awaits.
    pub(crate) fn target(&self) -> u64 {
        self.target
    }

    fn word(&self) -> &AtomicUsize {
        // SAFETY: the entry's handle keeps the cell alive.
        unsafe { self.refs.as_ref() }
    }

    /// Whether the handler still awaits it (its [`Reply`] is pending).
    pub(crate) fn is_waited(&self) -> bool {
        self.word().load(Ordering::Acquire) & WAITED != 0
    }

    /// Whether this entry is the one of `reply`'s cell.
    pub(crate) fn is_of(&self, cell: NonNull<AtomicUsize>) -> bool {
        self.refs == cell
    }

    /// Claims the refusal of a cycle whose arbiter is this ask, as the actor
    /// that asked it.
    ///
    /// Two actors blocked on each other (A awaits its ask `a` to B, B its
    /// ask `b` to A) may each see the other's ask arrive at once, on two
    /// shards. Each refuses the ask it receives only after claiming one
    /// arbiter, the same for both: the ask made by the actor of the lower
    /// id. The first claim by either side wins (a single read-modify-write
    /// on the arbiter's word); the other side sees it and lets its incoming
    /// ask through, whose answer comes once the refused handler returns. So
    /// exactly one ask of the pair fails. A side's own earlier claim does
    /// not stop it, only the other side's does, and a losing claim leaves
    /// no mark.
    pub(crate) fn claim_as_asker(&self) -> bool {
        claim(self.word(), ASKER_CLAIM, TARGET_CLAIM)
    }
}

impl Drop for Waited {
    fn drop(&mut self) {
        // SAFETY: the entry's handle, not used again; `release` matches the
        // cell's reply type.
        unsafe { (self.release)(self.refs) }
    }
}

impl<M: Message> Drop for Asked<M> {
    fn drop(&mut self) {
        // SAFETY: unopened, so the message is still there and ours to move out.
        let msg = unsafe {
            ptr::addr_of!((*self.cell.as_ptr()).msg)
                .read()
                .assume_init()
        };
        let header: NonNull<Header<M::Reply>> = self.cell.cast();
        // SAFETY: our handle keeps the cell alive; it is let go of just after.
        let _ = unsafe { header.as_ref() }.reply.send(Err(drop_reason()));
        // SAFETY: our handle, not used again.
        unsafe { release(header) };
        // The message last: a panicking drop cannot leak the cell.
        drop(msg);
    }
}

/// Where the reply to a message goes: nowhere for a `tell`, the asker's
/// slot for an `ask`. Dropping it unanswered fails the ask.
pub struct ReplyTo<R> {
    header: Option<NonNull<Header<R>>>,
}

// SAFETY: a `ReplyTo` is one handle on the reply slot; sending through it
// from any thread moves an `R` to the asker (`Slot` is `Sync` for `Send`
// values, and the count is atomic).
unsafe impl<R: Send> Send for ReplyTo<R> {}

impl<R> fmt::Debug for ReplyTo<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplyTo")
            .field("ask", &self.header.is_some())
            .finish()
    }
}

impl<R> ReplyTo<R> {
    /// No one waits for the reply (a `tell`).
    #[inline]
    pub const fn none() -> Self {
        ReplyTo { header: None }
    }

    /// Whether someone waits for the reply.
    #[inline]
    pub fn is_ask(&self) -> bool {
        self.header.is_some()
    }

    /// Answers the asker, if any.
    pub fn send(mut self, value: R) {
        self.complete(Ok(value));
    }

    #[inline]
    fn complete(&mut self, outcome: Result<R, AskError>) {
        if let Some(header) = self.header.take() {
            // SAFETY: our handle keeps the cell alive; it is let go of just
            // after. A second outcome (none can come: the handle is gone)
            // would find the slot taken.
            let _ = unsafe { header.as_ref() }.reply.send(outcome);
            // SAFETY: our handle, not used again.
            unsafe { release(header) };
        }
    }

    /// The actors waiting (transitively) on this message's reply.
    pub(crate) fn chain(&self) -> Option<Chain> {
        // SAFETY: our handle keeps the cell alive.
        self.header
            .and_then(|h| unsafe { h.as_ref() }.chain.clone())
    }
}

thread_local! {
    /// Why envelopes dropped right now go unanswered (see [`drop_with_reason`]).
    static DROP_REASON: std::cell::Cell<Option<AskError>> = const { std::cell::Cell::new(None) };
}

/// Drops `value` (envelopes) so that the asks inside fail with `reason`
/// rather than the generic [`AskError::Stopped`].
pub(crate) fn drop_with_reason<T>(reason: AskError, value: T) {
    /// Puts the previous reason back, even if a drop unwinds.
    struct Restore(Option<AskError>);
    impl Drop for Restore {
        fn drop(&mut self) {
            DROP_REASON.set(self.0);
        }
    }
    let _restore = Restore(DROP_REASON.replace(Some(reason)));
    // A message whose `Drop` panics is reported (a dead letter is dropped
    // by a delivery job that carries other actors' messages too, which
    // must go on) and the shard carries on.
    if let Err(payload) =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(value)))
    {
        mailring::panic::report_caught(mailring::panic::CallbackKind::Drop, &*payload);
        mailring::panic::drop_payload(payload);
    }
}

/// Drops each of `items` (envelopes) as [`drop_with_reason`] does, one at
/// a time: a message whose `Drop` panics is reported on its own, and the
/// rest are dropped after it. (Dropped together, a second panicking `Drop`
/// would come while the first unwinds through the collection's own drop:
/// the process aborts.)
pub(crate) fn drop_each_with_reason<I: IntoIterator>(reason: AskError, items: I) {
    for item in items {
        drop_with_reason(reason, item);
    }
}

impl<R> Drop for ReplyTo<R> {
    #[inline]
    fn drop(&mut self) {
        if self.header.is_some() {
            self.complete(Err(drop_reason()));
        }
    }
}

enum ReplyInner<R> {
    /// Our handle on the ask's cell.
    Pending(NonNull<Header<R>>),
    Failed(AskError),
    Done,
}

/// The deadline of a [`Reply`], and its timer once one is armed (at the
/// first poll that finds no outcome, on whatever thread polls).
enum Timer {
    None,
    At(Instant),
    Armed(mailring::time::Sleep),
}

/// The reply to an `ask`: a future resolving to the handler's return value or
/// an [`AskError`]. It never hangs on a dead actor; a deadline (the system's
/// default ask timeout, or [`Reply::timeout`]) bounds waiting on a live one,
/// wherever the reply is awaited: on a shard, its timer is in the shard's
/// wheel; elsewhere (a plain thread, a Tokio task) the off-shard timer
/// thread of `mailring::time` wakes it.
#[must_use = "an ask does nothing useful unless its reply is awaited"]
pub struct Reply<R> {
    inner: ReplyInner<R>,
    timer: Timer,
    wait: Wait,
}

/// Whether a handler awaits a [`Reply`] (ask-cycle detection).
#[derive(Clone, Copy)]
enum Wait {
    /// Made outside any actor's handler, or polled first outside one (a
    /// `wait_for` future, a task): no actor is blocked on it.
    No,
    /// Made by a handler, not polled yet: asks `target`.
    Target(u64),
    /// A handler awaits it; its actor keeps a [`Waited`] entry (the
    /// [`WAITED`] flag is set).
    Registered,
}

// SAFETY: a `Reply` is one handle on the reply slot, whose value arrives from
// the actor's shard (`Slot` is `Sync` for `Send` values; the count is
// atomic; the chain is an `Arc<Vec<u64>>`). The rest is `Send` on its own:
// the deadline's `Sleep` (polled and dropped on any thread) and the wait
// marker (its `Waited` entry stays with the actor, which a drop elsewhere
// leaves to the actor's next check).
unsafe impl<R: Send> Send for Reply<R> {}
// SAFETY: `&Reply` reaches nothing but the deadline (`Debug`).
unsafe impl<R: Send> Sync for Reply<R> {}

impl<R> fmt::Debug for Reply<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let deadline = match &self.timer {
            Timer::None => None,
            Timer::At(at) => Some(*at),
            Timer::Armed(sleep) => Some(sleep.deadline()),
        };
        f.debug_struct("Reply")
            .field("deadline", &deadline)
            .finish_non_exhaustive()
    }
}

impl<R> Reply<R> {
    pub(crate) fn failed(err: AskError) -> Self {
        Reply {
            inner: ReplyInner::Failed(err),
            timer: Timer::None,
            wait: Wait::No,
        }
    }

    /// At a poll that found no outcome: records that the handler being
    /// polled (if any) awaits this reply.
    #[cold]
    #[inline(never)]
    fn register_wait(&mut self, header: NonNull<Header<R>>, target: u64) {
        self.wait = Wait::No;
        let Some(frame) = crate::runner::current_frame() else {
            return;
        };
        let Some(site) = frame.site.as_ref() else {
            return;
        };
        site.register(self.new_waited(header, target));
    }

    /// The entry of a handler's wait on this pending reply (a new handle).
    fn new_waited(&mut self, header: NonNull<Header<R>>, target: u64) -> Waited {
        // SAFETY: our handle keeps the cell alive; the new handle is the
        // entry's (Relaxed, as `Arc::clone`: we already hold one).
        unsafe { header.as_ref() }
            .refs
            .fetch_add(1 | WAITED, Ordering::Relaxed);
        self.wait = Wait::Registered;
        Waited {
            refs: header.cast(),
            release: release_waited::<R>,
            target,
        }
    }

    /// What a handler's first poll of this reply records on its actor, for
    /// tests of the cycle check.
    #[cfg(test)]
    pub(crate) fn waited_for_test(&mut self, target: u64) -> Waited {
        let ReplyInner::Pending(header) = self.inner else {
            panic!("a pending reply")
        };
        self.new_waited(header, target)
    }

    /// Gives up with [`AskError::Timeout`] after `duration`; a duration too
    /// long for an `Instant` (`Duration::MAX`) sets no deadline.
    #[inline]
    pub fn timeout(self, duration: Duration) -> Self {
        match mailring::time::now().checked_add(duration) {
            Some(deadline) => self.deadline(deadline),
            None => self.no_timeout(),
        }
    }

    /// Gives up with [`AskError::Timeout`] at `deadline`.
    #[inline]
    pub fn deadline(mut self, deadline: Instant) -> Self {
        self.timer = Timer::At(deadline);
        self
    }

    /// Waits for as long as it takes (no deadline; a dead actor still fails
    /// the ask at once).
    #[inline]
    pub fn no_timeout(mut self) -> Self {
        self.timer = Timer::None;
        self
    }

    /// Lets go of the cell (the outcome was taken, or the wait given up).
    #[inline]
    fn finish(&mut self) {
        if let ReplyInner::Pending(header) = mem::replace(&mut self.inner, ReplyInner::Done) {
            let sub = match self.wait {
                Wait::Registered => self.end_wait(header),
                _ => 1,
            };
            // SAFETY: the handle was ours and is gone from `inner`; the
            // flag, when in `sub`, was set by our registration.
            unsafe { release_with(header, sub) };
        }
    }

    /// A handler awaited this reply and no longer does: the [`WAITED`] flag
    /// goes with our handle (the returned decrement), and the entry goes
    /// now if this is its actor's shard (else at its actor's next check).
    /// Kept out of line: most replies are never awaited by a handler.
    #[cold]
    #[inline(never)]
    fn end_wait(&mut self, header: NonNull<Header<R>>) -> usize {
        self.wait = Wait::No;
        if let Some(site) = crate::runner::current_frame().and_then(|f| f.site.clone()) {
            site.unregister(header.cast());
        }
        1 | WAITED
    }
}

impl<R> Drop for Reply<R> {
    fn drop(&mut self) {
        self.finish();
    }
}

impl<R> Unpin for Reply<R> {}

impl<R> Future for Reply<R> {
    type Output = Result<R, AskError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let polled = match &this.inner {
            // SAFETY: our handle keeps the cell alive, and it is the slot's
            // only taker (the envelope half only sends; `&mut self` keeps
            // two polls apart), as `poll_take_single` requires. `None`: the
            // outcome was already taken, which only this handle does.
            ReplyInner::Pending(header) => unsafe { header.as_ref().reply.poll_take_single(cx) }
                .map(|outcome| outcome.unwrap_or(Err(AskError::Stopped))),
            ReplyInner::Failed(e) => Poll::Ready(Err(*e)),
            ReplyInner::Done => panic!("Reply polled after completion"),
        };
        if let Poll::Ready(outcome) = polled {
            this.finish();
            return Poll::Ready(outcome);
        }
        // A `Sleep` fires wherever it is polled: from the shard's wheel on a
        // shard, from the off-shard timer thread elsewhere (a plain thread, a
        // Tokio task), and it follows the reply when it moves between them.
        let timed_out = match &mut this.timer {
            Timer::None => false,
            Timer::At(deadline) => {
                let mut sleep = mailring::time::sleep_until(*deadline);
                let elapsed = Pin::new(&mut sleep).poll(cx).is_ready();
                this.timer = Timer::Armed(sleep);
                elapsed
            }
            Timer::Armed(sleep) => Pin::new(sleep).poll(cx).is_ready(),
        };
        if timed_out {
            this.finish();
            return Poll::Ready(Err(AskError::Timeout));
        }
        if let (Wait::Target(target), ReplyInner::Pending(header)) = (this.wait, &this.inner) {
            let header = *header;
            this.register_wait(header, target);
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;
    use std::task::Waker;

    /// Counts its drops in the counter it points to.
    struct Tracked(Arc<AtomicUsize>);

    impl Drop for Tracked {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    struct Question(#[allow(dead_code)] Tracked);

    impl Message for Question {
        type Reply = Tracked;
    }

    fn poll_now<R>(reply: &mut Reply<R>) -> Poll<Result<R, AskError>> {
        Pin::new(reply).poll(&mut Context::from_waker(Waker::noop()))
    }

    struct Ping;

    impl Message for Ping {
        type Reply = u64;
    }

    #[test]
    fn the_cell_of_a_small_ask_fits_one_cache_line() {
        // Both shards touch the whole cell: one line moves each way, not two
        // (a message without fields and a word-sized reply).
        assert!(std::mem::size_of::<AskCell<Ping>>() <= 64);
    }

    fn ask(drops: &Arc<AtomicUsize>) -> (Asked<Question>, Reply<Tracked>) {
        Asked::new(Question(Tracked(drops.clone())), None)
    }

    #[test]
    fn an_answered_ask_hands_over_the_reply_and_drops_everything_once() {
        let drops = Arc::new(AtomicUsize::new(0));
        let (asked, mut reply) = ask(&drops);
        assert!(poll_now(&mut reply).is_pending());
        let (msg, to) = asked.open();
        drop(msg);
        assert_eq!(drops.load(Ordering::Relaxed), 1);
        to.send(Tracked(drops.clone()));
        let Poll::Ready(Ok(answer)) = poll_now(&mut reply) else {
            panic!("the answer should be there");
        };
        drop(answer);
        drop(reply);
        assert_eq!(drops.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn an_envelope_dropped_unopened_fails_the_ask_and_drops_the_message() {
        let drops = Arc::new(AtomicUsize::new(0));
        let (asked, mut reply) = ask(&drops);
        drop_with_reason(AskError::ShuttingDown, asked);
        assert_eq!(drops.load(Ordering::Relaxed), 1);
        assert!(matches!(
            poll_now(&mut reply),
            Poll::Ready(Err(AskError::ShuttingDown))
        ));
    }

    #[test]
    fn an_unread_answer_is_dropped_with_the_last_handle() {
        let drops = Arc::new(AtomicUsize::new(0));
        // The asker gives up first; the actor answers into the void.
        let (asked, reply) = ask(&drops);
        drop(reply);
        let (msg, to) = asked.open();
        drop(msg);
        to.send(Tracked(drops.clone()));
        assert_eq!(drops.load(Ordering::Relaxed), 2);
        // The actor answers first; the asker never reads it.
        let (asked, reply) = ask(&drops);
        let (msg, to) = asked.open();
        drop(msg);
        to.send(Tracked(drops.clone()));
        assert_eq!(drops.load(Ordering::Relaxed), 3);
        drop(reply);
        assert_eq!(drops.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn a_reply_slot_dropped_unanswered_fails_the_ask() {
        let drops = Arc::new(AtomicUsize::new(0));
        let (asked, mut reply) = ask(&drops);
        let (_msg, to) = asked.open();
        drop(to);
        assert!(matches!(
            poll_now(&mut reply),
            Poll::Ready(Err(AskError::Stopped))
        ));
    }

    #[test]
    fn handles_on_two_threads_free_the_cell_once() {
        let drops = Arc::new(AtomicUsize::new(0));
        for _ in 0..2_000 {
            let (asked, mut reply) = ask(&drops);
            let d = drops.clone();
            let actor = std::thread::spawn(move || {
                let (msg, to) = asked.open();
                drop(msg);
                to.send(Tracked(d));
            });
            let answer = loop {
                if let Poll::Ready(r) = poll_now(&mut reply) {
                    break r;
                }
                std::hint::spin_loop();
            };
            drop(answer.ok());
            actor.join().unwrap();
        }
        assert_eq!(drops.load(Ordering::Relaxed), 4_000);
    }
}
