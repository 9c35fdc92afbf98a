//! The actor cell: mailbox, wake-up and status of one activation, owned by
//! the actor's shard (no atomics on the unbounded path).
//!
//! States of a cell: open while its actor task runs (and, within that,
//! blocked while its handler awaits an ask: see `cycle`); closed once the
//! task has decided to stop, after which same-shard senders
//! get their message back and remote deliveries become dead letters (keyed
//! actors: the next message activates a new cell instead). A closed cell is
//! never reopened.
//!
//! Bounded mailboxes add a [`Capacity`] shared with senders on every shard:
//! `depth` counts messages sent and not yet taken by the actor.

use std::cell::{Cell, RefCell};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use crate::actor::{Actor, Envelope};
use crate::capacity::Capacity;
use crate::cycle::{BlockSite, Verdict, Waits};
use crate::error::{AskError, RunNowError, StopReason};
use crate::flow::{RemoteCounts, ShardFlow};
use crate::Terminated;

/// Envelopes an emptied mailbox buffer may keep room for. A `Vec` keeps
/// its peak capacity: after a burst of a million messages an actor would
/// hold two 16 MB buffers (its queue and its task's batch trade places)
/// for as long as it lives. An emptied batch above this size is given back
/// when the actor refills it ([`ActorCell::refill`]: a compare per refill,
/// not per message).
const KEEP_AFTER_BURST: usize = 1024;

/// Room for one more envelope in a full buffer: room for one only in an
/// empty buffer. A `Vec`'s first growth makes room for four, and the
/// queue and the task's batch trade buffers at each take, so an actor
/// sent a message now and then (most keyed actors, at rest) would keep
/// eight envelopes' room for as long as it lives; it keeps two this way.
/// A burst grows the buffer as before.
#[cold]
#[inline(never)]
fn make_room<E>(buffer: &mut Vec<E>) {
    if buffer.capacity() == 0 {
        buffer.reserve_exact(1);
    } else {
        buffer.reserve(1);
    }
}

/// Replaces an emptied, oversized buffer with none (the next take brings
/// the queue's).
#[cold]
fn release_burst<E>(buffer: &mut Batch<E>) {
    *buffer = Batch(Vec::new());
}

/// Envelopes an actor's task took from its mailbox and has not handled yet,
/// kept in reverse order: the next one is the last element, so taking it is
/// a `Vec::pop` (the mailbox, a plain `Vec`, trades buffers with it whole
/// and is reversed once per take, which costs less per message than a
/// `VecDeque`'s ring arithmetic on both the push and the pop).
pub(crate) struct Batch<E>(Vec<E>);

impl<E> Batch<E> {
    pub(crate) const fn new() -> Self {
        Batch(Vec::new())
    }

    /// The next envelope to handle.
    #[inline]
    pub(crate) fn next(&mut self) -> Option<E> {
        self.0.pop()
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    pub(crate) fn capacity(&self) -> usize {
        self.0.capacity()
    }

    /// What is left to handle, in order.
    pub(crate) fn into_ordered(self) -> Vec<E> {
        let mut v = self.0;
        v.reverse();
        v
    }
}

/// Watchers a cell keeps before it first drops those nobody waits for.
const WATCHERS_BEFORE_PRUNING: usize = 16;

/// [`ActorCell::state`]: the cell takes messages.
const OPEN: u8 = 1;
/// [`ActorCell::state`]: the actor's handler awaits an ask (see `cycle`).
const BLOCKED: u8 = 2;

/// Told once of the actor's end.
pub(crate) struct Watcher {
    notify: Box<dyn FnOnce(Terminated) + Send>,
    /// Held by whoever waits for the notice (a `stopped()` future): once
    /// it is gone, the watcher is dropped untold, so a caller that polls
    /// `stopped()` under a timeout again and again leaves nothing behind.
    /// `None`: told whatever happens (an actor watching another).
    waiter: Option<std::sync::Weak<()>>,
}

impl Watcher {
    /// A watcher told whatever happens.
    pub(crate) fn new(notify: Box<dyn FnOnce(Terminated) + Send>) -> Self {
        Watcher {
            notify,
            waiter: None,
        }
    }

    /// A watcher for as long as `waiter`'s `Arc` lives.
    pub(crate) fn while_awaited(
        notify: Box<dyn FnOnce(Terminated) + Send>,
        waiter: std::sync::Weak<()>,
    ) -> Self {
        Watcher {
            notify,
            waiter: Some(waiter),
        }
    }

    /// Whether anybody still waits for the notice.
    pub(crate) fn wanted(&self) -> bool {
        self.waiter.as_ref().is_none_or(|w| w.strong_count() > 0)
    }

    /// Tells it.
    pub(crate) fn notify(self, end: Terminated) {
        (self.notify)(end);
    }
}

/// One activation of an actor on its shard.
///
/// Laid out for senders: what a send reads and writes (the open flag, the
/// wake flag, the queue and the LRU stamp) comes first, and the cell is
/// aligned to a cache line, so a send to a cold actor fetches one line of
/// its cell (the reference counts sit on the line before, which a send that
/// does not clone the `Rc` never touches).
#[repr(C, align(64))]
pub(crate) struct ActorCell<A: Actor> {
    /// [`OPEN`] while the task runs, with [`BLOCKED`] while its handler
    /// awaits an ask: a push compares it to `OPEN` alone and takes the
    /// checked path otherwise.
    state: Cell<u8>,
    /// The actor's task waits for a message (its waker is in `waker`).
    waiting: Cell<bool>,
    queue: RefCell<Vec<A::Envelope>>,
    /// The type's activation clock value at the last delivery (LRU).
    pub(crate) last_used: Cell<u64>,
    /// Queued messages from other shards, whose credits a take hands back
    /// (its counts share the senders' line; its list, rarely used, does not).
    pub(crate) remote: RemoteCounts,
    pub(crate) uid: u64,
    pub(crate) key: A::Key,
    waker: Cell<Option<Waker>>,
    /// Asked to passivate (LRU) or stop (parent, system); read by its task.
    pub(crate) stop_request: Cell<Option<crate::error::StopReason>>,
    /// Asked to passivate by its type's active limit, and not ended (nor
    /// called it off) yet: counted in the type's `lru_victims`.
    pub(crate) lru_victim: Cell<bool>,
    /// A stop asked for while a panic's request (`stop_request`) was
    /// there, or before it: the actor then ends instead of restarting.
    pub(crate) stop_after_panic: Cell<Option<crate::error::StopReason>>,
    /// Its task is stopping or passivating it (its request taken): the
    /// active limit looks past it.
    pub(crate) leaving: Cell<bool>,
    /// `Ctx::wait_for`s whose future is not done: the actor is not idle.
    pub(crate) pending_waits: Cell<usize>,
    pub(crate) capacity: Option<Arc<Capacity>>,
    watchers: RefCell<Vec<Watcher>>,
    /// At this many watchers, those nobody waits for are dropped.
    prune_watchers_at: Cell<usize>,
    pub(crate) high_water: Cell<usize>,
    /// The asks its handler awaits (ask-cycle detection, see `cycle`).
    waits: Waits,
    /// Attached streams waiting for the mailbox to drain below their window
    /// (see `Ctx::attach_stream`); `has_take_waiters` spares the take a
    /// look at the list when there are none.
    take_waiters: RefCell<Vec<Waker>>,
    has_take_waiters: Cell<bool>,
    /// Closures run on the actor between its messages
    /// ([`ActorCell::run_now`]): activity for its idle timeout.
    pub(crate) ran_now: Cell<u64>,
    /// The actor itself, while its activation lives: borrowed by its task
    /// for each message and hook, and by [`ActorCell::run_now`] while the
    /// task waits for mail (last: what a send touches comes first).
    pub(crate) actor: RefCell<Option<A>>,
}

impl<A: Actor> ActorCell<A> {
    /// Asks the actor's task to stop for `reason` (`Panicked`: to go
    /// through its supervision). The first request stands, but a panic's
    /// goes first: a stop asked for before or after it is kept beside it,
    /// and ends the actor instead of a restart.
    pub(crate) fn request_stop(&self, reason: crate::error::StopReason) {
        use crate::error::StopReason::Panicked;
        match self.stop_request.get() {
            None => self.stop_request.set(Some(reason)),
            Some(Panicked) if reason != Panicked => {
                if self.stop_after_panic.get().is_none() {
                    self.stop_after_panic.set(Some(reason));
                }
            }
            Some(earlier) if reason == Panicked && earlier != Panicked => {
                self.stop_after_panic.set(Some(earlier));
                self.stop_request.set(Some(Panicked));
            }
            Some(_) => {}
        }
    }

    pub(crate) fn new(uid: u64, key: A::Key, capacity: Option<Arc<Capacity>>) -> Rc<Self> {
        Rc::new(ActorCell {
            uid,
            key,
            // Room comes with the first message, and grows with the
            // bursts the actor gets: a keyed type may have a million
            // activations at rest, and an envelope may be 100 bytes or more.
            queue: RefCell::new(Vec::new()),
            waiting: Cell::new(false),
            waker: Cell::new(None),
            state: Cell::new(OPEN),
            stop_request: Cell::new(None),
            lru_victim: Cell::new(false),
            stop_after_panic: Cell::new(None),
            leaving: Cell::new(false),
            pending_waits: Cell::new(0),
            last_used: Cell::new(0),
            remote: RemoteCounts::default(),
            capacity,
            watchers: RefCell::new(Vec::new()),
            prune_watchers_at: Cell::new(WATCHERS_BEFORE_PRUNING),
            high_water: Cell::new(0),
            waits: Waits::default(),
            take_waiters: RefCell::new(Vec::new()),
            has_take_waiters: Cell::new(false),
            ran_now: Cell::new(0),
            actor: RefCell::new(None),
        })
    }

    #[inline]
    pub(crate) fn is_open(&self) -> bool {
        self.state.get() & OPEN != 0
    }

    /// Open and not blocked: a [`push`](Self::push) right after this takes
    /// its fast path (the same compare, which the compiler merges).
    #[inline]
    pub(crate) fn takes_plain_push(&self) -> bool {
        self.state.get() == OPEN
    }

    /// Enqueues and wakes the actor's task if it waits. A closed cell gives
    /// the envelope back (`Stopped`); an actor whose handler is blocked on
    /// an ask to the actor that made this ask refuses it (`WouldDeadlock`).
    #[inline(always)]
    pub(crate) fn push(&self, env: A::Envelope) -> Result<(), (AskError, A::Envelope)> {
        if self.state.get() != OPEN {
            return self.push_checked(env);
        }
        self.enqueue(env);
        Ok(())
    }

    /// [`ActorCell::push`] of a message the actor sends itself (a timer's,
    /// a `wait_for` continuation): it takes a place in a bounded mailbox
    /// like any sender's message (past the bound, as `tell` does), since
    /// the actor's take frees a place for every message it takes.
    pub(crate) fn push_own(&self, env: A::Envelope) -> Result<(), (AskError, A::Envelope)> {
        if let Some(c) = &self.capacity {
            c.force_acquire();
        }
        self.push(env).inspect_err(|_| self.free_place())
    }

    /// [`ActorCell::push`] to a closed cell or a blocked actor.
    #[cold]
    #[inline(never)]
    fn push_checked(&self, env: A::Envelope) -> Result<(), (AskError, A::Envelope)> {
        if !self.is_open() {
            return Err((AskError::Stopped, env));
        }
        let verdict = env
            .__ask_probe()
            .map(|probe| self.waits.check(self.uid, &probe));
        match verdict {
            Some(Verdict::Refuse) => return Err((AskError::WouldDeadlock, env)),
            Some(Verdict::Unblocked) => self.state.set(OPEN),
            Some(Verdict::Queue) | None => {}
        }
        self.enqueue(env);
        Ok(())
    }

    #[inline(always)]
    fn enqueue(&self, env: A::Envelope) {
        let mut queue = self.queue.borrow_mut();
        // (The push's own check for room, which this one spares it.)
        if queue.len() == queue.capacity() {
            make_room(&mut queue);
        }
        queue.push(env);
        drop(queue);
        if self.waiting.get() {
            self.wake();
        }
    }

    #[cold]
    fn wake(&self) {
        self.waiting.set(false);
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    /// Moves every queued envelope behind those already in `into` (the actor
    /// task's own batch), freeing their places in a bounded mailbox and
    /// crediting other shards' windows in `flow` for theirs.
    #[inline]
    pub(crate) fn take_all(&self, into: &mut Batch<A::Envelope>, flow: &ShardFlow) -> usize {
        let mut q = self.queue.borrow_mut();
        let n = q.len();
        if n == 0 {
            return 0;
        }
        // Between two takes the queue only grows: its length now is its peak.
        if n > self.high_water.get() {
            self.high_water.set(n);
        }
        if into.0.is_empty() {
            std::mem::swap(&mut *q, &mut into.0);
            into.0.reverse();
        } else {
            // Not on the message loop's path (it takes into an empty
            // batch): put the batch in order, append, reverse again.
            into.0.reverse();
            into.0.append(&mut q);
            into.0.reverse();
        }
        drop(q);
        if self.has_take_waiters.get() {
            self.wake_take_waiters();
        }
        self.remote.settle(flow);
        if let Some(c) = &self.capacity {
            c.release(n);
        }
        n
    }

    /// [`ActorCell::take_all`] into the actor task's emptied batch, first
    /// giving back the batch's buffer if a burst left it oversized (the
    /// queue receives that buffer next, so both are kept in check).
    #[inline]
    pub(crate) fn refill(&self, batch: &mut Batch<A::Envelope>, flow: &ShardFlow) -> usize {
        debug_assert!(batch.is_empty());
        if batch.capacity() > KEEP_AFTER_BURST {
            release_burst(batch);
        }
        self.take_all(batch, flow)
    }

    pub(crate) fn len(&self) -> usize {
        self.queue.borrow().len()
    }

    /// Ready once fewer than `limit` messages are queued; else wakes `cx`
    /// at the actor's next take (an attached stream's backpressure).
    pub(crate) fn poll_below(&self, limit: usize, cx: &mut Context<'_>) -> Poll<()> {
        if self.len() < limit || !self.is_open() {
            return Poll::Ready(());
        }
        let mut waiters = self.take_waiters.borrow_mut();
        if !waiters.iter().any(|w| w.will_wake(cx.waker())) {
            waiters.push(cx.waker().clone());
        }
        self.has_take_waiters.set(true);
        Poll::Pending
    }

    #[cold]
    fn wake_take_waiters(&self) {
        self.has_take_waiters.set(false);
        let waiters = std::mem::take(&mut *self.take_waiters.borrow_mut());
        waiters.into_iter().for_each(Waker::wake);
    }

    /// Takes the queued envelopes into `into`, or registers the task's waker.
    pub(crate) fn poll_take(
        &self,
        into: &mut Batch<A::Envelope>,
        flow: &ShardFlow,
        cx: &mut Context<'_>,
    ) -> Poll<()> {
        if self.take_all(into, flow) > 0 {
            return Poll::Ready(());
        }
        self.waker.set(Some(cx.waker().clone()));
        self.waiting.set(true);
        Poll::Pending
    }

    /// Gives back the bounded-mailbox place of a message that did not stay
    /// here (a dead letter).
    pub(crate) fn free_place(&self) {
        if let Some(c) = &self.capacity {
            c.release(1);
        }
    }

    /// Takes places again for `n` messages this cell gave back at its close
    /// and that go to its key's next activation.
    pub(crate) fn retake_places(&self, n: usize) {
        if let Some(c) = &self.capacity {
            c.force_acquire_n(n);
        }
    }

    /// Wakes the task without a message (stop and passivation requests).
    pub(crate) fn nudge(&self) {
        self.wake();
    }

    /// The task no longer waits for mail (it was polled for another
    /// reason: its idle deadline, a stop request).
    pub(crate) fn stop_waiting(&self) {
        self.waiting.set(false);
    }

    /// Runs `f` on the actor now, in the caller's task, if the actor is
    /// idle: open, its task waiting for mail with nothing queued and no
    /// stop asked, and the actor not borrowed (no handler or hook of it
    /// running, which also refuses a call from the actor's own handler).
    /// Otherwise `f` comes back untouched.
    ///
    /// A panic in `f` is caught here, reported as a handler's, and the
    /// task is told to treat it as one (its supervision policy decides):
    /// the actor's state may be half changed, so nothing runs on it again
    /// before that.
    pub(crate) fn run_now<R, F: FnOnce(&mut A) -> R>(
        &self,
        ts: &crate::local::TypeState<A>,
        f: F,
    ) -> Result<R, RunNowError<F>> {
        if !(self.waiting.get()
            && self.state.get() == OPEN
            && self.stop_request.get().is_none()
            && self.queue.borrow().is_empty())
        {
            return Err(RunNowError::NotIdle(f));
        }
        let Ok(mut slot) = self.actor.try_borrow_mut() else {
            return Err(RunNowError::NotIdle(f));
        };
        let Some(actor) = slot.as_mut() else {
            return Err(RunNowError::NotIdle(f));
        };
        self.ran_now.set(self.ran_now.get() + 1);
        ts.touch(self);
        let counters = &ts.counters;
        match catch_unwind(AssertUnwindSafe(|| f(actor))) {
            Ok(r) => {
                counters.handled.set(counters.handled.get() + 1);
                counters.ran_now.set(counters.ran_now.get() + 1);
                Ok(r)
            }
            Err(payload) => {
                // Marked failed before any more user code runs (the panic
                // hook, the payload's `Drop`): a `run_now` from there finds
                // the actor busy. The task goes through its supervision at
                // its next poll.
                self.stop_request.set(Some(StopReason::Panicked));
                self.wake();
                drop(slot);
                mailring::panic::report_caught(mailring::panic::CallbackKind::Handler, &*payload);
                mailring::panic::drop_payload(payload);
                Err(RunNowError::Panicked)
            }
        }
    }

    /// Closes the cell: later pushes fail; queued envelopes are returned
    /// (and credited in `flow`: the caller drops them).
    pub(crate) fn close(&self, flow: &ShardFlow) -> Vec<A::Envelope> {
        self.state.set(0);
        self.waits.clear();
        self.waiting.set(false);
        self.waker.take();
        let rest = std::mem::take(&mut *self.queue.borrow_mut());
        self.remote.settle(flow);
        if let Some(c) = &self.capacity {
            if !rest.is_empty() {
                c.release(rest.len());
            }
        }
        rest
    }

    pub(crate) fn add_watcher(&self, watcher: Watcher) {
        let mut watchers = self.watchers.borrow_mut();
        // Amortised: a pass over the list each time it doubles.
        if watchers.len() >= self.prune_watchers_at.get() {
            watchers.retain(Watcher::wanted);
            self.prune_watchers_at
                .set((watchers.len() * 2).max(WATCHERS_BEFORE_PRUNING));
        }
        watchers.push(watcher);
    }

    pub(crate) fn take_watchers(&self) -> Vec<Watcher> {
        std::mem::take(&mut *self.watchers.borrow_mut())
    }
}

impl<A: Actor> BlockSite for ActorCell<A> {
    fn register(&self, waited: crate::reply::Waited) {
        self.waits.register(waited);
        if self.is_open() {
            self.state.set(OPEN | BLOCKED);
        }
    }

    fn unregister(&self, cell: std::ptr::NonNull<std::sync::atomic::AtomicUsize>) {
        if self.waits.unregister(cell) && self.is_open() {
            self.state.set(OPEN);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Accepts, Ctx, Handler, Message};

    #[derive(crate::Actor, Default)]
    #[actor(handles(Ping))]
    struct Quiet;

    #[derive(crate::Actor, Default)]
    #[actor(handles(Num))]
    struct Numbers;

    #[derive(Message)]
    struct Num(u32);

    impl Handler<Num> for Numbers {
        async fn handle(&mut self, _m: Num, _cx: &mut Ctx<Self>) {}
    }

    /// The number a told envelope carries.
    fn number(env: __MailringEnvelopeNumbers) -> u32 {
        match env {
            __MailringEnvelopeNumbers::T0(Num(n)) => n,
            _ => panic!("a tell was expected"),
        }
    }

    /// The numbers of the envelopes left in `batch`, in delivery order.
    fn drain_numbers(batch: &mut Batch<__MailringEnvelopeNumbers>) -> Vec<u32> {
        let mut out = Vec::new();
        while let Some(env) = batch.next() {
            out.push(number(env));
        }
        out
    }

    #[test]
    fn a_take_into_a_non_empty_batch_queues_behind_it_in_order() {
        let cell = ActorCell::<Numbers>::new(1, (), None);
        let num = |n| <Numbers as Accepts<Num>>::envelope(Num(n));
        for n in 0..3 {
            assert!(cell.push(num(n)).is_ok());
        }
        let mut batch = Batch::new();
        let flow = ShardFlow::new(0, 1, 8, mailring::hot::DYNAMIC_HOT_TAGS, Default::default());
        assert_eq!(cell.take_all(&mut batch, &flow), 3);
        // Consume one, leaving 1 and 2 in the batch, then queue 3..6.
        assert_eq!(batch.next().map(number), Some(0));
        for n in 3..6 {
            assert!(cell.push(num(n)).is_ok());
        }
        assert_eq!(cell.take_all(&mut batch, &flow), 3);
        assert_eq!(drain_numbers(&mut batch), vec![1, 2, 3, 4, 5]);
        assert_eq!(cell.high_water.get(), 3);
    }

    #[derive(Message)]
    struct Ping;

    impl Handler<Ping> for Quiet {
        async fn handle(&mut self, _m: Ping, _cx: &mut Ctx<Self>) {}
    }

    #[test]
    fn watchers_nobody_waits_for_are_dropped_as_more_come() {
        let cell = ActorCell::<Quiet>::new(1, (), None);
        let told = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let tell = |told: &std::sync::Arc<std::sync::atomic::AtomicUsize>| {
            let told = told.clone();
            Box::new(move |_: Terminated| {
                told.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }) as Box<dyn FnOnce(Terminated) + Send>
        };
        // One kept for good, one waited for throughout, and 100,000 whose
        // waiters went at once.
        cell.add_watcher(Watcher::new(tell(&told)));
        let waiting = std::sync::Arc::new(());
        cell.add_watcher(Watcher::while_awaited(
            tell(&told),
            std::sync::Arc::downgrade(&waiting),
        ));
        for _ in 0..100_000 {
            let gone = std::sync::Arc::new(());
            cell.add_watcher(Watcher::while_awaited(
                tell(&told),
                std::sync::Arc::downgrade(&gone),
            ));
        }
        assert!(cell.watchers.borrow().len() <= 2 * WATCHERS_BEFORE_PRUNING);
        for w in cell.take_watchers() {
            w.notify(Terminated {
                id: crate::ActorId(1),
                reason: crate::StopReason::Stopped,
            });
        }
        // The two that were wanted were told (and at most a few not yet
        // pruned besides).
        let n = told.load(std::sync::atomic::Ordering::SeqCst);
        assert!((2..=2 * WATCHERS_BEFORE_PRUNING).contains(&n), "{n}");
        drop(waiting);
    }

    #[test]
    fn a_burst_leaves_no_oversized_buffer_behind() {
        let cell = ActorCell::<Quiet>::new(1, (), None);
        for _ in 0..100_000 {
            assert!(cell.push(<Quiet as Accepts<Ping>>::envelope(Ping)).is_ok());
        }
        let mut batch = Batch::new();
        let flow = ShardFlow::new(0, 1, 8, mailring::hot::DYNAMIC_HOT_TAGS, Default::default());
        assert_eq!(cell.refill(&mut batch, &flow), 100_000);
        assert!(batch.capacity() >= 100_000);
        batch.0.clear();
        // The next refill, empty or not, gives the burst's buffer back; the
        // queue was handed the batch's small one by the first refill.
        assert!(cell.push(<Quiet as Accepts<Ping>>::envelope(Ping)).is_ok());
        assert_eq!(cell.refill(&mut batch, &flow), 1);
        batch.0.clear();
        assert_eq!(cell.refill(&mut batch, &flow), 0);
        assert!(batch.capacity() <= KEEP_AFTER_BURST, "{}", batch.capacity());
        assert!(cell.queue.borrow().capacity() <= KEEP_AFTER_BURST);
        assert_eq!(cell.high_water.get(), 100_000);
    }
}
