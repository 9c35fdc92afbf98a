//! The task that runs one actor activation on its shard.
//!
//! Life of an activation:
//! 1. build the actor (factory or `Actor::activate`), run `on_start`;
//! 2. take envelopes one at a time and await their handlers (one message at a
//!    time: `&mut self` is never shared), yielding to the shard every
//!    [`YIELD_EVERY`] messages;
//! 3. a panic (caught per poll) goes to the supervision policy: restart
//!    builds a fresh actor and goes back to 1 with the same mailbox, within
//!    the restart budget; stop ends; escalate ends and fails the parent;
//! 4. a stop request, `cx.stop()` or (keyed) the idle timeout or LRU limit
//!    ends the loop; a passivating keyed actor runs `on_passivate` and stays
//!    active if messages arrived meanwhile;
//! 5. teardown: end the activation's timers and `wait_for` tasks, `on_stop`,
//!    leave the shard's table, close the mailbox (a keyed actor's leftovers
//!    are re-delivered, so they activate a fresh one; an unkeyed actor's
//!    fail their asks), stop children, notify watchers.
//!
//! Ask-cycle detection: while an actor's future is polled, [`FRAME`] names the
//! actor and the chain of actors waiting on the message it handles; an ask
//! made then carries the chain one link longer, and an ask to any actor on
//! the chain fails at once with `AskError::WouldDeadlock`.
//! A reply first polled then records, on the actor's cell (the frame's
//! `site`), that its handler is blocked on it: see `cycle` for the cycles
//! between handlers that this catches where chains do not.

use std::cell::Cell;
use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::panic::{catch_unwind, AssertUnwindSafe};

use mailring::panic::CallbackKind;
use std::rc::Rc;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use mailring::{Placement, ShardId};

use crate::actor::{Actor, Envelope, SupervisionPolicy};
use crate::addr::Addr;
use crate::capacity::Capacity;
use crate::ctx::Ctx;
use crate::error::{AskError, StopReason};
use crate::flow::ShardFlow;
use crate::local::{self, Delivery, TargetId, TypeState};
use crate::mailbox::{ActorCell, Batch};
use crate::reply;
use crate::system::{SystemRef, SystemShared};
use crate::Terminated;

/// Logs a lifecycle event (with the `tracing` feature).
macro_rules! lifecycle {
    ($event:literal, $cell:expr, $ts:expr) => {
        #[cfg(feature = "tracing")]
        tracing::debug!(
            actor = std::any::type_name::<A>(),
            id = $cell.uid,
            shard = $ts.shard,
            $event
        );
    };
}

/// Messages handled before the actor yields its shard to other tasks.
const YIELD_EVERY: u32 = 1024;

/// The actors waiting on an ask, outermost first. A thin pointer, so that an
/// ask's shared cell stays within one cache line.
pub(crate) type Chain = Arc<Vec<u64>>;

/// The actor being polled and what its current message waits on.
pub(crate) struct Frame {
    pub(crate) uid: u64,
    /// The chain of the ask being handled (`None` for a tell).
    pub(crate) chain: Cell<Option<Chain>>,
    /// The chain of asks made while handling it (`chain` plus this actor),
    /// built by the first such ask and shared by the others.
    pub(crate) outgoing: Cell<Option<Chain>>,
    /// Where the actor records the asks its handler is blocked on (its cell).
    pub(crate) site: Option<Rc<dyn crate::cycle::BlockSite>>,
}

thread_local! {
    static FRAME: Cell<Option<Rc<Frame>>> = const { Cell::new(None) };
}

/// The frame of the actor being polled on this thread, if any.
#[inline]
pub(crate) fn current_frame() -> Option<Rc<Frame>> {
    FRAME
        .try_with(|f| {
            let frame = f.take();
            f.set(frame.clone());
            frame
        })
        .ok()
        .flatten()
}

/// The chain a new ask carries and its target's id (when an actor's
/// future makes it), or `WouldDeadlock` if `target` is on the chain.
pub(crate) fn ask_chain(target: impl FnOnce() -> u64) -> Result<Option<(Chain, u64)>, AskError> {
    let Some(frame) = current_frame() else {
        return Ok(None);
    };
    let target = target();
    // Plain cells, taken and put back (nothing in between can panic).
    let chain = frame.chain.take();
    if target == frame.uid || chain.as_ref().is_some_and(|c| c.contains(&target)) {
        frame.chain.set(chain);
        return Err(AskError::WouldDeadlock);
    }
    let links = frame.outgoing.take().unwrap_or_else(|| {
        let mut links = chain.as_ref().map(|c| c.to_vec()).unwrap_or_default();
        links.push(frame.uid);
        Arc::new(links)
    });
    frame.outgoing.set(Some(links.clone()));
    frame.chain.set(chain);
    Ok(Some((links, target)))
}

/// Polls `fut` with the actor's frame installed, catching panics.
///
/// A named future rather than an `async fn`: an `async fn` keeps its
/// argument and the pinned copy it moves into as two fields of its state,
/// which made the actor task twice the size of its message loop (536 bytes
/// for a 248-byte loop).
///
/// A caught panic is reported to the runtime as one of `kind` (the shard's
/// stats, the `on_panic` hook, the shutdown report) before supervision
/// deals with it.
fn guarded<'a, F: Future>(frame: &'a Rc<Frame>, kind: CallbackKind, fut: F) -> Guarded<'a, F> {
    Guarded { frame, kind, fut }
}

pin_project_lite::pin_project! {
    /// The future of [`guarded`].
    struct Guarded<'a, F> {
        frame: &'a Rc<Frame>,
        kind: CallbackKind,
        #[pin]
        fut: F,
    }
}

impl<F: Future> Future for Guarded<'_, F> {
    type Output = Result<F::Output, ()>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let prev = FRAME.replace(Some(this.frame.clone()));
        let mut fut = this.fut;
        let polled = catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx)));
        FRAME.set(prev);
        match polled {
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(payload) => {
                mailring::panic::report_caught(*this.kind, &*payload);
                mailring::panic::drop_payload(payload);
                Poll::Ready(Err(()))
            }
        }
    }
}

/// How a child reaches its parent when it escalates a failure.
pub(crate) struct ParentLink {
    escalate: Box<dyn FnOnce() + Send>,
}

impl ParentLink {
    pub(crate) fn new<P: Actor>(parent: &Addr<P>) -> Self
    where
        P::Envelope: Send,
    {
        let parent = parent.clone();
        ParentLink {
            escalate: Box::new(move || {
                local::send_delivery(
                    parent.system.arc(),
                    parent.home(),
                    parent.target_id(),
                    Delivery::Stop(StopReason::Panicked),
                )
            }),
        }
    }
}

enum Outcome {
    Panicked,
    Stop(StopReason),
}

/// Spawns the task of a new activation on the calling shard.
pub(crate) fn start<A: Actor>(
    ts: Rc<TypeState<A>>,
    cell: Rc<ActorCell<A>>,
    make: Box<dyn FnMut() -> Option<A>>,
    parent: Option<ParentLink>,
) {
    let myself = if cell.uid >> 63 == 1 {
        Addr::unkeyed(
            SystemRef::here(&ts.system),
            ts.shard,
            cell.uid,
            cell.capacity.clone(),
        )
    } else {
        Addr::keyed(SystemRef::here(&ts.system), cell.key.clone())
    };
    let cx = Ctx::new(myself, cell.clone(), ts.clone());
    mailring::spawn_local(run(ts, cell, make, cx, parent)).detach();
}

// The actor's borrow is held across each hook's and handler's await on
// purpose: it is what tells `run_now` (a `try_borrow_mut`) that the actor
// is busy. Nothing else borrows it. (`manual_async_fn`: see below.)
#[allow(clippy::await_holding_refcell_ref, clippy::manual_async_fn)]
fn run<A: Actor>(
    ts: Rc<TypeState<A>>,
    cell: Rc<ActorCell<A>>,
    mut make: Box<dyn FnMut() -> Option<A>>,
    mut cx: Ctx<A>,
    parent: Option<ParentLink>,
) -> impl Future<Output = ()> {
    // An `async` block over the arguments rather than an `async fn`: an
    // `async fn` moves each argument into a local of its own at its first
    // poll, and its future keeps room for both (rust-lang/rust#62958),
    // about 200 bytes (the `Ctx` alone is 150) in every actor's task.
    async move {
        // Dropped before its teardown (its task cancelled): the actor goes with
        // it, and no `run_now` reaches it meanwhile.
        let _orphaned = OrphanGuard(&cell);
        let frame = cx.frame.clone();
        let keyed = cell.uid >> 63 == 0;
        let supervision = A::CONFIG.supervision;
        let mut restarts: VecDeque<Instant> = VecDeque::new();
        // Envelopes taken from the mailbox and not yet handled; they survive a
        // restart (the one that panicked is gone).
        let mut batch: Batch<A::Envelope> = Batch::new();
        let mut idle = IdleMark::default();
        lifecycle!("actor activated", cell, ts);
        // The actor lives in its cell (`ActorCell::actor`), borrowed for each
        // hook and message, so that `run_now` may reach it between messages.
        let made = guarded(&frame, CallbackKind::Factory, async { make() })
            .await
            .ok()
            .flatten();
        *cell.actor.borrow_mut() = made;
        let mut needs_start = true;
        // Whether `on_start` asked to stop: the activation is turned down.
        let mut refused = false;
        // Whether `on_passivate` panicked: its instance gets no `on_stop`.
        let mut hook_panicked = false;
        // Whether the factory panicked making the actor again for a
        // restart: one more failure for the supervision.
        let mut remade_in_vain = false;
        let reason = loop {
            if cell.actor.borrow().is_none() && !remade_in_vain {
                break StopReason::Panicked;
            }
            let started = if remade_in_vain {
                false
            } else if needs_start {
                needs_start = false;
                let mut slot = cell.actor.borrow_mut();
                let a = slot.as_mut().expect("checked above");
                let asked_before = cx.stop_requested.is_some();
                let ok = guarded(&frame, CallbackKind::LifecycleHook, a.__on_start(&mut cx))
                    .await
                    .is_ok();
                // A stop asked for in `on_start` turns the activation down: the
                // messages that brought it are refused, not handed to the next
                // activation, which would turn them down the same way for ever.
                // (One a handler asked for before it panicked, on a restart,
                // stops the actor as before.)
                refused = ok && !asked_before && cx.stop_requested.is_some();
                ok
            } else {
                true
            };
            let outcome = if remade_in_vain {
                remade_in_vain = false;
                Outcome::Panicked
            } else if started {
                let looped = process(&mut cx, &cell, &ts, keyed, &mut batch, &mut idle);
                match guarded(&frame, CallbackKind::Handler, looped).await {
                    Ok(outcome) => outcome,
                    Err(()) => {
                        cx.leave_message();
                        // The message that panicked was taken too: what
                        // decides whether only timer messages are left
                        // counts it (unseen, a message from elsewhere
                        // behind it could be taken for a timer's).
                        idle.handled += 1;
                        Outcome::Panicked
                    }
                }
            } else {
                Outcome::Panicked
            };
            match outcome {
                Outcome::Panicked => {
                    lifecycle!("actor panicked", cell, ts);
                    bump(&ts.counters.panics);
                    // A stop was asked for besides the panic (or before
                    // it, still waiting for its turn: a shutdown, a parent
                    // that stopped): it ends here, with no restart to run
                    // on after it (a factory and `on_start` run during a
                    // shutdown).
                    let stop_waiting = matches!(
                        cell.stop_request.get(),
                        Some(StopReason::ParentStopped | StopReason::Shutdown)
                    );
                    // (The handler's own `cx.stop()` before its panic is
                    // not such a request: the panic goes through
                    // supervision, and the restarted actor serves on.)
                    if cell.stop_after_panic.take().is_some() || stop_waiting {
                        break StopReason::Panicked;
                    }
                    let now = Instant::now();
                    while restarts
                        .front()
                        .is_some_and(|t| now.duration_since(*t) > supervision.within)
                    {
                        restarts.pop_front();
                    }
                    let within_budget = (restarts.len() as u32) < supervision.max_restarts;
                    match supervision.policy {
                        SupervisionPolicy::Restart if within_budget => {
                            restarts.push_back(now);
                            lifecycle!("actor restarting", cell, ts);
                            bump(&ts.counters.restarts);
                            cx.stop_children();
                            cx.restart_tasks();
                            idle.restarted();
                            let old = cell.actor.borrow_mut().take();
                            drop_actor(old);
                            // A factory that panics is supervised as a
                            // handler that does; one that has no actor to
                            // give ends it.
                            *cell.actor.borrow_mut() =
                                guarded(&frame, CallbackKind::Factory, async { make() })
                                    .await
                                    .unwrap_or_else(|()| {
                                        remade_in_vain = true;
                                        None
                                    });
                            needs_start = true;
                            // The shard's other work goes first: an actor
                            // that fails its `on_start` before any await,
                            // with a budget that does not run out, would
                            // restart without end and hold the shard.
                            mailring::yield_now().await;
                            continue;
                        }
                        SupervisionPolicy::Escalate => {
                            if let Some(p) = parent {
                                (p.escalate)();
                            }
                            break StopReason::Panicked;
                        }
                        _ => break StopReason::Panicked,
                    }
                }
                Outcome::Stop(reason) => {
                    cell.leaving.set(true);
                    if keyed && matches!(reason, StopReason::Passivated | StopReason::Stopped) {
                        let timer_before = cx.timer_sends_so_far();
                        let mut slot = cell.actor.borrow_mut();
                        let a = slot.as_mut().expect("checked at the loop's top");
                        let passivated = guarded(
                            &frame,
                            CallbackKind::LifecycleHook,
                            a.__on_passivate(&mut cx),
                        )
                        .await
                        .is_ok();
                        drop(slot);
                        if !passivated {
                            // Its state may be half changed: this instance
                            // serves nothing more (nor runs `on_stop`); what
                            // came meanwhile goes to a fresh activation.
                            lifecycle!("actor panicked", cell, ts);
                            bump(&ts.counters.panics);
                            hook_panicked = true;
                        }
                        if passivated
                            && reason == StopReason::Passivated
                            && cell.stop_request.get().is_none()
                        {
                            let queued = cell.len();
                            // Everything the timers delivered meanwhile is still queued.
                            let from_timers = (cx.timer_sends_so_far() - timer_before) as usize;
                            if !batch.is_empty() || queued > from_timers {
                                // Messages came in while passivating: stay active.
                                cell.leaving.set(false);
                                ts.lru_victim_done(&cell);
                                continue;
                            }
                            if queued > 0 {
                                // Only timer messages, which are not activity:
                                // they end with the timers instead of activating
                                // the actor again.
                                cx.end_tasks();
                                let mut ticks = Batch::new();
                                cell.refill(&mut ticks, &ts.flow);
                                reply::drop_each_with_reason(
                                    AskError::Stopped,
                                    ticks.into_ordered(),
                                );
                            }
                        }
                        if passivated && reason == StopReason::Stopped {
                            // Asked to stop with only timer messages behind
                            // the stop: they end with the timers, as above,
                            // rather than activate it again (and start its
                            // timers again). Messages from elsewhere among
                            // them, which are not told apart from the
                            // timers', all go to a fresh activation.
                            let left = batch.len() + cell.len();
                            if left > 0 && idle.only_timers_left(&cx, left) {
                                cx.end_tasks();
                                let mut ticks = std::mem::replace(&mut batch, Batch::new());
                                if ticks.is_empty() {
                                    cell.refill(&mut ticks, &ts.flow);
                                } else {
                                    cell.take_all(&mut ticks, &ts.flow);
                                }
                                reply::drop_each_with_reason(
                                    AskError::Stopped,
                                    ticks.into_ordered(),
                                );
                            }
                        }
                        lifecycle!("actor passivated", cell, ts);
                        bump(&ts.counters.passivations);
                    }
                    break reason;
                }
            }
        };
        // Timers and waits end with the activation, before `on_stop` (one
        // started there never runs): no timer message joins the leftovers.
        cx.end_tasks();
        if reason != StopReason::Panicked && !hook_panicked {
            let mut slot = cell.actor.borrow_mut();
            if let Some(a) = slot.as_mut() {
                let _ = guarded(&frame, CallbackKind::LifecycleHook, a.__on_stop(&mut cx)).await;
            }
        }
        if reason == StopReason::Stopped && !keyed {
            bump(&ts.counters.stops);
        }
        ts.remove(&cell);
        let mut rest = cell.close(&ts.flow);
        if !keyed {
            // Gone for good: its bounded mailbox never frees a place again
            // (messages still on their way become dead letters), so no sender
            // may wait for one.
            if let Some(c) = &cell.capacity {
                c.close();
            }
        }
        if !batch.is_empty() {
            let mut ordered = batch.into_ordered();
            ordered.append(&mut rest);
            rest = ordered;
        }
        // What was queued goes on before anything that may run the shard's
        // pending deliveries on the spot (stopping a child here, the actor's
        // `Drop`, a watcher's notice all may send): a later message of the same
        // sender that activated the key first would overtake them.
        let redeliver =
            keyed && !refused && matches!(reason, StopReason::Passivated | StopReason::Stopped);
        if redeliver && !rest.is_empty() {
            // Their places were freed (at the take, or by the close): they
            // hold them again in the key's count until the next activation
            // takes them, or a dead letter frees them.
            cell.retake_places(rest.len());
            let target = TargetId::Key(cell.key.clone());
            for env in rest {
                ts.deliver_or_drop(&target, env);
            }
        } else {
            let why = if reason == StopReason::Shutdown {
                AskError::ShuttingDown
            } else {
                AskError::Stopped
            };
            reply::drop_each_with_reason(why, rest);
        }
        cx.stop_children();
        let gone = cell.actor.borrow_mut().take();
        drop_actor(gone);
        let id = crate::ActorId(cell.uid);
        // A watch ends with the activation that made it: a watcher gone
        // (passivated, stopped) is not told, nor woken to be told.
        for watcher in cell.take_watchers() {
            if watcher.wanted() {
                watcher.notify(Terminated { id, reason });
            }
        }
    }
}

/// Ends an activation whose task was dropped unfinished: the cell stops
/// offering its actor to `run_now`, and the actor is dropped (at a normal
/// end the teardown has taken it already).
struct OrphanGuard<'c, A: Actor>(&'c ActorCell<A>);

impl<A: Actor> Drop for OrphanGuard<'_, A> {
    fn drop(&mut self) {
        self.0.stop_waiting();
        let actor = self
            .0
            .actor
            .try_borrow_mut()
            .ok()
            .and_then(|mut a| a.take());
        drop_actor(actor);
    }
}

/// Drops an actor (the one a restart replaces, or at teardown), catching
/// a panic of its `Drop`: reported as a `Drop` panic, and the restart or
/// teardown goes on (an unwind out of the actor's task would leave its cell
/// registered and open, taking messages no one handles).
fn drop_actor<A>(actor: Option<A>) {
    if let Err(payload) = catch_unwind(AssertUnwindSafe(move || drop(actor))) {
        mailring::panic::report_caught(CallbackKind::Drop, &*payload);
        mailring::panic::drop_payload(payload);
    }
}

fn bump(c: &std::cell::Cell<u64>) {
    c.set(c.get() + 1);
}

enum Next {
    Msg,
    Signal,
    Idle,
}

/// The message loop of step 2 (a panic unwinds out of it, to [`guarded`]).
async fn process<A: Actor>(
    cx: &mut Ctx<A>,
    cell: &Rc<ActorCell<A>>,
    ts: &Rc<TypeState<A>>,
    keyed: bool,
    batch: &mut Batch<A::Envelope>,
    idle_mark: &mut IdleMark,
) -> Outcome {
    let idle = if keyed { A::CONFIG.idle_timeout } else { None };
    // Handled messages are counted here and added to the type's counter in
    // one step when the mailbox runs empty, at each yield, and when the loop
    // ends (even by a panic): one local increment per message, which also
    // paces the yields.
    let mut handled = HandledCount {
        total: &ts.counters.handled,
        pending: 0,
        idle: idle_mark,
    };
    // The actor's borrow, held while messages are handled and let go
    // while the task waits for mail, when `run_now` may reach it.
    let mut held = Held::take(cell);
    loop {
        // The batches taken until the mailbox runs empty, with the actor
        // at hand; then a wait with its borrow let go.
        let actor = held.actor().expect("an activation's actor is in its cell");
        loop {
            if cx.stop_requested.is_some() || cell.stop_request.get().is_some() {
                if let Some(r) = cx.stop_requested.take() {
                    return Outcome::Stop(r);
                }
                if let Some(r) = cell.stop_request.take() {
                    return match r {
                        StopReason::Panicked => Outcome::Panicked,
                        r => Outcome::Stop(r),
                    };
                }
            }
            let env = match batch.next() {
                Some(env) => env,
                None if cell.refill(batch, &ts.flow) == 0 => break,
                None => continue,
            };
            // With the `tracing` feature, each message runs in an
            // `actor.message` span; without it, nothing is added (not even
            // a future layer).
            #[cfg(feature = "tracing")]
            {
                use tracing::Instrument;
                let span = tracing::trace_span!(
                    "actor.message",
                    actor = std::any::type_name::<A>(),
                    id = cell.uid,
                    shard = ts.shard
                );
                crate::finish::Finish::new(env.handle(actor, cx))
                    .instrument(span)
                    .await;
            }
            // `Finish`: the handled message's finished future is not
            // dropped (it owns nothing then; see `finish`).
            #[cfg(not(feature = "tracing"))]
            crate::finish::Finish::new(env.handle(actor, cx)).await;
            handled.pending += 1;
            if handled.pending == YIELD_EVERY {
                handled.flush();
                mailring::yield_now().await;
            }
        }
        handled.flush();
        let active = handled.idle.emptied(cx, cell);
        let deadline = idle.and_then(|after| handled.idle.deadline(active, after));
        held.put_back();
        let next = next_batch(cell, batch, &ts.flow, deadline).await;
        held.take_again();
        match next {
            Next::Msg | Next::Signal => {}
            // Closures run on it meanwhile were activity: the deadline is
            // computed again from now.
            Next::Idle if handled.idle.ran_now_since(cell) => {}
            // Waiting for something (`wait_for`) is not idleness: a fresh
            // idle period starts, and what it waited for comes as a
            // message.
            Next::Idle if cx.waits_pending() => handled.idle.restarted(),
            Next::Idle => return Outcome::Stop(StopReason::Passivated),
        }
    }
}

/// The actor's borrow held by the message loop across its messages (one
/// borrow per batch of messages, not one per message), let go while the
/// loop waits for mail and when it ends, by a return or a handler's panic.
/// While it is held, `run_now` (a `try_borrow_mut`) finds the actor busy.
///
/// (The actor stays in its cell: moving it out into the task and back
/// would keep room for it in both, the task's future and the cell, for
/// as long as the activation lives, and copy it twice per wait.)
struct Held<'c, A: Actor> {
    cell: &'c ActorCell<A>,
    slot: Option<std::cell::RefMut<'c, Option<A>>>,
}

impl<'c, A: Actor> Held<'c, A> {
    fn take(cell: &'c ActorCell<A>) -> Self {
        Held {
            cell,
            slot: Some(cell.actor.borrow_mut()),
        }
    }

    /// The actor, while the borrow is held and the activation has one.
    fn actor(&mut self) -> Option<&mut A> {
        self.slot.as_mut().and_then(|slot| slot.as_mut())
    }

    fn put_back(&mut self) {
        self.slot = None;
    }

    fn take_again(&mut self) {
        self.slot = Some(self.cell.actor.borrow_mut());
    }
}

/// Messages handled by a message loop and not yet added to the type's counter.
struct HandledCount<'a> {
    total: &'a std::cell::Cell<u64>,
    pending: u32,
    /// The activation's count, for its idle deadline.
    idle: &'a mut IdleMark,
}

impl HandledCount<'_> {
    fn flush(&mut self) {
        self.total.set(self.total.get() + u64::from(self.pending));
        self.idle.handled += u64::from(self.pending);
        self.pending = 0;
    }
}

/// When an idle keyed actor passivates: `idle_timeout` after the last time
/// its mailbox ran empty having handled a message that was not its timers'.
///
/// Timer messages are not activity (Orleans does not count its timers
/// either), or an actor with a `run_interval` shorter than its idle timeout
/// would never passivate. They are not told apart in the mailbox (that
/// would cost every send); instead, when the mailbox runs empty, every
/// message delivered so far has been handled, so the messages handled
/// since the last empty mailbox, less the timer messages delivered since,
/// are the others.
#[derive(Default)]
struct IdleMark {
    /// Messages this activation handled, as of the last flush.
    handled: u64,
    /// `handled` when the mailbox last ran empty.
    seen_handled: u64,
    /// The actor's timer deliveries when the mailbox last ran empty.
    seen_timer: u64,
    /// Closures run on it by `run_now` when the mailbox last ran empty.
    seen_ran_now: u64,
    /// The deadline; `None` until the first empty mailbox of a (re)started
    /// actor, `Some(None)` for a timeout too long for an `Instant`.
    deadline: Option<Option<Instant>>,
}

impl IdleMark {
    /// Notes that the mailbox ran empty; whether anything but timer
    /// messages came since it last did (activity).
    fn emptied<A: Actor>(&mut self, cx: &Ctx<A>, cell: &ActorCell<A>) -> bool {
        let timer = cx.timer_sends_so_far();
        let others = (self.handled - self.seen_handled).saturating_sub(timer - self.seen_timer);
        let ran_now = cell.ran_now.get();
        let others = others + (ran_now - self.seen_ran_now);
        self.seen_ran_now = ran_now;
        self.seen_handled = self.handled;
        self.seen_timer = timer;
        others > 0
    }

    /// The idle deadline, with the mailbox empty now and `active` what
    /// [`emptied`](Self::emptied) said.
    fn deadline(&mut self, active: bool, after: Duration) -> Option<Instant> {
        if active || self.deadline.is_none() {
            self.deadline = Some(mailring::time::now().checked_add(after));
        }
        self.deadline.flatten()
    }

    /// Whether `left`, the messages still queued, can only be timer
    /// messages: every message delivered since the mailbox last ran empty
    /// (those handled and those left) came from the actor's timers.
    fn only_timers_left<A: Actor>(&self, cx: &Ctx<A>, left: usize) -> bool {
        let timer = cx.timer_sends_so_far() - self.seen_timer;
        (self.handled - self.seen_handled) + left as u64 <= timer
    }

    /// Whether closures ran on the actor since its deadline was computed.
    fn ran_now_since<A: Actor>(&self, cell: &ActorCell<A>) -> bool {
        cell.ran_now.get() != self.seen_ran_now
    }

    /// A restarted actor starts a fresh idle period.
    fn restarted(&mut self) {
        self.deadline = None;
    }
}

impl Drop for HandledCount<'_> {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Waits for messages (taken into `batch`), a stop request, or the idle deadline.
async fn next_batch<A: Actor>(
    cell: &ActorCell<A>,
    batch: &mut Batch<A::Envelope>,
    flow: &ShardFlow,
    idle_deadline: Option<Instant>,
) -> Next {
    let mut sleep = idle_deadline.map(mailring::time::sleep_until);
    let next = poll_fn(|cx| {
        if cell.stop_request.get().is_some() {
            return Poll::Ready(Next::Signal);
        }
        if cell.poll_take(batch, flow, cx).is_ready() {
            return Poll::Ready(Next::Msg);
        }
        if let Some(s) = sleep.as_mut() {
            if std::pin::Pin::new(s).poll(cx).is_ready() {
                return Poll::Ready(Next::Idle);
            }
        }
        Poll::Pending
    })
    .await;
    // Woken by its deadline or a stop request, the task is no longer idle.
    cell.stop_waiting();
    next
}

/// Spawns an unkeyed actor (see `SystemHandle::spawn_actor`).
pub(crate) fn spawn_unkeyed<A, F>(
    shared: &Arc<SystemShared>,
    placement: Placement,
    mut factory: F,
    parent: Option<ParentLink>,
) -> Addr<A>
where
    A: Actor<Key = ()>,
    F: FnMut() -> A + Send + 'static,
{
    let n = shared.handle.shards();
    let dest = match placement {
        Placement::Pinned(s) => {
            assert!(
                s.index() < n,
                "{s} does not exist: the system has {n} shards"
            );
            s.index()
        }
        Placement::Sticky(k) => mailring::sticky_shard(&k, n).index(),
        Placement::RoundRobin => shared.next_round_robin(n),
        _ => shared.handle.least_loaded_shard().index(),
    };
    let uid = shared.next_uid();
    let capacity = A::CONFIG.mailbox.map(Capacity::new);
    let addr = Addr::unkeyed(SystemRef::here(shared), dest, uid, capacity.clone());
    let s = shared.clone();
    shared.handle.run_on(ShardId::new(dest), move || {
        if let Some(ts) = local::type_state::<A>(&s) {
            ts.spawn_unkeyed(uid, Box::new(move || Some(factory())), capacity, parent);
        }
    });
    if mailring::current_shard().is_some_and(|here| here.index() != dest) {
        // Published now, not at the tick's end: the address may reach
        // another thread at once, and whatever it sends from there must
        // find the actor registered (deliveries keep their causal order
        // only once published).
        mailring::publish_now();
    }
    addr
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guarded_future_adds_only_its_frame_reference() {
        let frame = Rc::new(Frame {
            uid: 7,
            chain: Cell::new(None),
            outgoing: Cell::new(None),
            site: None,
        });
        let big = [0u8; 256];
        let inner = async move { big.len() };
        let inner_size = std::mem::size_of_val(&inner);
        let g = guarded(&frame, CallbackKind::Handler, inner);
        // Not two copies of the inner future (what an `async fn` kept).
        assert!(std::mem::size_of_val(&g) <= inner_size + 16);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let seen = guarded(&frame, CallbackKind::Handler, async {
            FRAME.with(|f| {
                let current = f.take();
                let uid = current.as_ref().map(|c| c.uid);
                f.set(current);
                uid
            })
        });
        let seen = std::pin::pin!(seen).poll(&mut cx);
        let len = std::pin::pin!(g).poll(&mut cx);
        let panicked = std::pin::pin!(guarded(&frame, CallbackKind::Handler, async {
            panic!("expected by the test")
        }))
        .poll(&mut cx);
        assert_eq!(seen, Poll::Ready(Ok(Some(7))), "the frame is installed");
        assert_eq!(len, Poll::Ready(Ok(256)));
        assert_eq!(panicked, Poll::Ready(Err(())), "a panic is caught");
    }
}
