//! [`Ctx`]: what a handler can do besides changing its actor's state — who
//! am I, stop, timers, watches, children.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::fmt;
use std::future::{poll_fn, Future};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::Duration;

use mailring::panic::CallbackKind;
use mailring::{JoinHandle, Placement, ShardId};

use crate::actor::{Accepts, Actor, Continuation, Message};
use crate::addr::{ActorId, Addr};
use crate::error::StopReason;
use crate::local::TypeState;
use crate::mailbox::ActorCell;
use crate::runner::{Chain, Frame, ParentLink};
use crate::system::SystemHandle;
use crate::Terminated;

/// The context of a running actor, passed to every handler and hook.
pub struct Ctx<A: Actor> {
    myself: Addr<A>,
    cell: Rc<ActorCell<A>>,
    ts: Rc<TypeState<A>>,
    pub(crate) frame: Rc<Frame>,
    pub(crate) stop_requested: Option<StopReason>,
    /// The tasks of `run_later`, `run_interval` and `wait_for`: ended when
    /// the actor stops or restarts. Made with the first (most actors start
    /// none: a keyed type may have a million activations at rest).
    tasks: Option<Rc<Scope>>,
    /// This activation's tasks were ended (it stops): one started later
    /// never runs.
    tasks_ended: bool,
    /// This instance of the actor (new at each activation and restart):
    /// a continuation queued for another instance does not run.
    epoch: u64,
    /// Messages the actor's timers delivered (not activity: see
    /// [`Ctx::run_interval`]); survives restarts. Made with the first timer.
    timer_sends: Option<Rc<Cell<u64>>>,
    /// Children spawned and not known to have ended: a flag the child's
    /// end sets, and how to stop it.
    children: Vec<Child>,
    /// `children`' length at which ended children are dropped from it.
    prune_children_at: usize,
    /// Lives as long as this activation: a target it watches drops the
    /// watch once it is gone. Made with the first watch.
    alive: Option<Arc<()>>,
    /// The watches standing, by target (its type and id): each flag is set
    /// once the target has told its end. Made with the first watch.
    watching: Option<Box<Watching>>,
}

/// A `Ctx`'s standing watches (see [`Ctx::watch`]).
#[derive(Default)]
struct Watching {
    by_target: std::collections::HashMap<(std::any::TypeId, u64), Arc<AtomicBool>>,
    /// `by_target`'s size at which told watches are dropped from it.
    prune_at: usize,
}

/// A child of [`Ctx::spawn_child`].
struct Child {
    ended: Arc<AtomicBool>,
    stop: Box<dyn FnOnce()>,
}

impl<A: Actor> fmt::Debug for Ctx<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ctx")
            .field("actor", &self.myself)
            .finish_non_exhaustive()
    }
}

/// How many messages an actor's mailbox may hold before the streams
/// attached to it ([`Ctx::attach_stream`]) stop being polled.
pub const STREAM_WINDOW: usize = 64;

/// What a stream attached with [`Ctx::attach_stream`] delivers: each item,
/// then the end. List it in `handles(StreamMessage<Item>)` and implement
/// `Handler<StreamMessage<Item>>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamMessage<T> {
    /// The stream's next item.
    Item(T),
    /// The stream ended (after its last item).
    End,
}

impl<T: 'static> Message for StreamMessage<T> {
    type Reply = ();
}

/// A timer started by [`Ctx::run_later`] or [`Ctx::run_interval`], or a
/// stream attached by [`Ctx::attach_stream`]; they also end when their
/// actor stops or restarts (their tasks are dropped then, with what they
/// hold). Dropping the handle leaves the timer or stream running.
#[derive(Debug)]
pub struct TimerHandle {
    join: JoinHandle<()>,
}

impl TimerHandle {
    /// Cancels the timer or stream (a message already sent stays sent).
    pub fn cancel(self) {
        self.join.abort();
    }
}

impl<A: Actor> Ctx<A> {
    pub(crate) fn new(myself: Addr<A>, cell: Rc<ActorCell<A>>, ts: Rc<TypeState<A>>) -> Self {
        let frame = Rc::new(Frame {
            uid: cell.uid,
            chain: Cell::new(None),
            outgoing: Cell::new(None),
            site: Some(cell.clone()),
        });
        Ctx {
            myself,
            cell,
            ts,
            frame,
            stop_requested: None,
            tasks: None,
            tasks_ended: false,
            epoch: next_epoch(),
            timer_sends: None,
            children: Vec::new(),
            prune_children_at: 16,
            alive: None,
            watching: None,
        }
    }

    /// This actor's key (`&()` for unkeyed actors).
    pub fn key(&self) -> &A::Key {
        &self.cell.key
    }

    /// This actor's identity.
    pub fn id(&self) -> ActorId {
        ActorId(self.cell.uid)
    }

    /// A reference to this actor.
    pub fn myself(&self) -> Addr<A> {
        self.myself.clone()
    }

    /// The shard this actor runs on.
    pub fn shard(&self) -> ShardId {
        ShardId::new(self.ts.shard)
    }

    /// The actor system.
    pub fn system(&self) -> SystemHandle {
        self.myself.system()
    }

    /// Messages waiting in this actor's mailbox.
    pub fn mailbox_len(&self) -> usize {
        self.cell.len()
    }

    /// Stops this actor once the current handler returns. A keyed actor
    /// passivates (`on_passivate`, `on_stop`) and comes back on its next message.
    /// Called in `on_start`, it turns the activation down: no message is
    /// handled, and those waiting (the ones that activated it) are refused
    /// (`AskError::Stopped`) rather than handed to a next activation; the
    /// next message sent activates the key again.
    pub fn stop(&mut self) {
        self.stop_requested = Some(StopReason::Stopped);
    }

    pub(crate) fn enter_message(&mut self, chain: Option<Chain>) {
        self.frame.chain.set(chain);
        self.frame.outgoing.set(None);
    }

    pub(crate) fn leave_message(&mut self) {
        self.frame.chain.set(None);
        self.frame.outgoing.set(None);
    }

    /// Sends `msg` to this actor after `delay` (the message need not be `Send`).
    ///
    /// The timer ends with the actor: if the actor stops or restarts first,
    /// the message is dropped then, never delivered. Like
    /// [`run_interval`](Ctx::run_interval)'s, the message is not activity:
    /// it does not put off a keyed actor's idle passivation.
    pub fn run_later<M>(&mut self, delay: Duration, msg: M) -> TimerHandle
    where
        A: Accepts<M>,
        M: Message,
    {
        let cell = self.cell.clone();
        let sends = self.timer_sends();
        let failed = self.panic_sink();
        let join = self.scope().spawn(failed, async move {
            mailring::time::sleep(delay).await;
            // Queued even while the actor passivates: a passivation that
            // messages call off goes on with this instance, which the
            // message is for (one that does not drops it with the other
            // timer messages).
            if cell.push_own(A::envelope(msg)).is_ok() {
                sends.set(sends.get() + 1);
            }
        });
        TimerHandle { join }
    }

    /// Sends `make()` to this actor every `period`, starting one period from now.
    ///
    /// The timer ends with the actor: when the actor stops or restarts, the
    /// task ends and `make` is dropped.
    ///
    /// Ticks are not activity (as Orleans treats its timers): a keyed actor
    /// with an `idle_timeout` passivates once that long has passed without
    /// another message, whatever its timers deliver meanwhile, and its
    /// timers end with that activation (start them again in `on_start` if
    /// the next activation needs them); ticks that arrive while
    /// `on_passivate` runs do not keep it active, and are dropped; so are
    /// ticks queued behind a stop with nothing else since the mailbox last
    /// ran empty (a keyed actor that stops itself stays stopped). Handling
    /// a tick is otherwise a message like any other. A `wait_for`
    /// continuation is activity.
    ///
    /// # Panics
    ///
    /// When `period` is zero, here, in the caller (a handler or hook, whose
    /// panic supervision deals with), not later in the timer's task. A
    /// panic in `make` ends the timer and is the actor's, in its turn (see
    /// [`wait_for`](Ctx::wait_for)).
    #[track_caller]
    pub fn run_interval<M, F>(&mut self, period: Duration, mut make: F) -> TimerHandle
    where
        A: Accepts<M>,
        M: Message,
        F: FnMut() -> M + 'static,
    {
        assert!(
            !period.is_zero(),
            "Ctx::run_interval needs a non-zero period (use run_later for a single message)"
        );
        let cell = self.cell.clone();
        let sends = self.timer_sends();
        let failed = self.panic_sink();
        let join = self.scope().spawn(failed, async move {
            // A period too long for an `Instant` (`Duration::MAX`) never ticks.
            let Some(first) = mailring::time::now().checked_add(period) else {
                return;
            };
            let mut ticks = mailring::time::interval_at(first, period);
            loop {
                ticks.tick().await;
                if cell.leaving.get() {
                    // Passivating or stopping: not activity, and dropped (a
                    // passivation that messages call off ticks on).
                    continue;
                }
                if cell.push_own(A::envelope(make())).is_err() {
                    return;
                }
                sends.set(sends.get() + 1);
            }
        });
        TimerHandle { join }
    }

    /// Messages this actor's timers have delivered so far.
    pub(crate) fn timer_sends_so_far(&self) -> u64 {
        self.timer_sends.as_ref().map_or(0, |sends| sends.get())
    }

    /// The count this actor's timers add to, made with the first timer.
    fn timer_sends(&mut self) -> Rc<Cell<u64>> {
        self.timer_sends.get_or_insert_with(Rc::default).clone()
    }

    /// Where a panic in this instance's background work (a `wait_for`
    /// future, a timer's message factory, an attached stream, a message's
    /// `Drop`) goes: to the actor itself, as a continuation that raises it
    /// again in the actor's turn, so that it is reported as a handler's panic
    /// and supervision deals with it as with a panic in the handler that
    /// started the work. An instance gone by then (restarted, stopped) has
    /// it reported and dropped.
    fn panic_sink(&self) -> impl FnOnce(Box<dyn Any + Send>) + 'static {
        let cell = self.cell.clone();
        let epoch = self.epoch;
        move |payload| {
            // A closed actor, or one leaving (its `on_passivate` runs):
            // queued, the panic would be handed to a fresh activation with
            // the rest (a keyed actor that stopped itself would come back
            // to report it).
            if !cell.is_open() || cell.leaving.get() {
                report_and_drop(payload);
                return;
            }
            let mut unraised = Unraised(Some(payload));
            let raise = Continuation::new(move |_: &mut A, cx: &mut Ctx<A>| {
                let payload = unraised.0.take().expect("raised once");
                if cx.epoch == epoch {
                    std::panic::resume_unwind(payload);
                }
                // Its instance was replaced before its turn came.
                report_and_drop(payload);
            });
            // Open, and a continuation is never refused as an ask may be.
            let _ = cell.push_own(A::__continuation(raise));
        }
    }

    /// The scope of this activation's tasks, made with the first (closed
    /// if the activation's tasks were ended already).
    fn scope(&mut self) -> &Rc<Scope> {
        let ended = self.tasks_ended;
        self.tasks.get_or_insert_with(|| {
            let scope = Rc::new(Scope::default());
            if ended {
                scope.close();
            }
            scope
        })
    }

    /// Ends the tasks of this activation's timers and waits (the actor
    /// stops): each is dropped at its next turn on this shard, and any
    /// started later (in `on_stop`) never runs.
    pub(crate) fn end_tasks(&mut self) {
        self.tasks_ended = true;
        if let Some(tasks) = &self.tasks {
            tasks.close();
        }
    }

    /// Whether a [`wait_for`](Self::wait_for) is still waiting: the actor
    /// does not passivate for idleness meanwhile.
    pub(crate) fn waits_pending(&self) -> bool {
        self.cell.pending_waits.get() > 0
    }

    /// Ends the tasks of the actor before a restart; the restarted actor
    /// starts its own.
    pub(crate) fn restart_tasks(&mut self) {
        if let Some(tasks) = self.tasks.take() {
            tasks.close();
        }
        self.epoch = next_epoch();
    }

    /// Waits for `future` without holding up the actor: other messages are
    /// handled meanwhile, and once `future` is ready, `then` runs on the actor
    /// (with `&mut self`) in its turn, like a message. This is the opt-in way
    /// for a handler to await something slow (I/O, an ask to an actor that may
    /// ask back) and let messages interleave. `future` runs on this shard and
    /// need not be `Send`; its output must be. If the actor stops or
    /// restarts first, `future` is dropped then (it is not polled again) and
    /// `then` never runs, even if `future` was ready and `then` queued
    /// already: it runs only on the instance that waited. A keyed actor
    /// does not passivate for idleness while a wait is pending. A panic in
    /// `future` is the actor's: supervision deals with it, in the actor's
    /// turn, as with a panic in a handler.
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use mailring_actors::{Actor, ActorSystem, Addr, Ctx, Handler, Message, Placement, Runtime};
    ///
    /// /// The slow source of values.
    /// #[derive(Actor, Default)]
    /// #[actor(handles(Load))]
    /// struct Store;
    ///
    /// #[derive(Message)]
    /// #[message(reply = String)]
    /// struct Load(u32);
    ///
    /// impl Handler<Load> for Store {
    ///     async fn handle(&mut self, m: Load, _cx: &mut Ctx<Self>) -> String {
    ///         format!("value {}", m.0)
    ///     }
    /// }
    ///
    /// /// A cache that refreshes from the store without holding up its mailbox.
    /// #[derive(Actor)]
    /// #[actor(handles(Refresh, Read))]
    /// struct Cache {
    ///     source: Addr<Store>,
    ///     entries: HashMap<u32, String>,
    /// }
    ///
    /// #[derive(Message)]
    /// struct Refresh(u32);
    ///
    /// #[derive(Message)]
    /// #[message(reply = Option<String>)]
    /// struct Read(u32);
    ///
    /// impl Handler<Refresh> for Cache {
    ///     async fn handle(&mut self, m: Refresh, cx: &mut Ctx<Self>) {
    ///         let (source, key) = (self.source.clone(), m.0);
    ///         cx.wait_for(async move { source.ask(Load(key)).await }, move |this, loaded, _cx| {
    ///             if let Ok(v) = loaded {
    ///                 this.entries.insert(key, v);
    ///             }
    ///         });
    ///     }
    /// }
    ///
    /// impl Handler<Read> for Cache {
    ///     async fn handle(&mut self, m: Read, _cx: &mut Ctx<Self>) -> Option<String> {
    ///         self.entries.get(&m.0).cloned()
    ///     }
    /// }
    ///
    /// let system = ActorSystem::start(Runtime::builder().shards(2))?;
    /// let source = system.spawn_actor(Placement::RoundRobin, Store::default);
    /// let cache = system.spawn_actor(Placement::RoundRobin, move || Cache {
    ///     source: source.clone(),
    ///     entries: HashMap::new(),
    /// });
    /// cache.tell(Refresh(7)).unwrap();
    /// let value = system.block_on(async move {
    ///     loop {
    ///         if let Some(v) = cache.ask(Read(7)).await.unwrap() {
    ///             return v;
    ///         }
    ///         mailring::time::sleep(std::time::Duration::from_millis(1)).await;
    ///     }
    /// });
    /// assert_eq!(value, "value 7");
    /// # system.shutdown();
    /// # Ok::<(), mailring::BuildError>(())
    /// ```
    pub fn wait_for<F, T>(
        &mut self,
        future: F,
        then: impl FnOnce(&mut A, T, &mut Ctx<A>) + Send + 'static,
    ) where
        F: std::future::Future<Output = T> + 'static,
        T: Send + 'static,
    {
        let cell = self.cell.clone();
        let epoch = self.epoch;
        // Counted until the future is done (or dropped with the instance).
        let pending = WaitPending::new(self.cell.clone());
        let failed = self.panic_sink();
        self.scope()
            .spawn(failed, async move {
                let out = future.await;
                drop(pending);
                // Queued, it may outlive this instance (a restart, a keyed
                // stop that hands the queue to a fresh activation): then it
                // is dropped, as if the wait had ended with the instance.
                let resume = Continuation::new(move |actor: &mut A, cx: &mut Ctx<A>| {
                    if cx.epoch == epoch {
                        then(actor, out, cx);
                    }
                });
                let _ = cell.push_own(A::__continuation(resume));
            })
            .detach();
    }

    /// Delivers each item of `stream` to this actor as a
    /// [`StreamMessage::Item`], in order, then [`StreamMessage::End`] once
    /// it ends. The stream is polled on this shard (it need not be `Send`)
    /// and never while this actor's mailbox holds [`STREAM_WINDOW`]
    /// messages or more (or its bound, for a bounded mailbox): a fast
    /// stream waits for a slow actor. It stops with the activation (a stop,
    /// a restart, a passivation), dropped unpolled; the returned handle
    /// stops it sooner.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::pin::Pin;
    /// use std::task::{Context, Poll};
    /// use mailring_actors::{Actor, ActorSystem, Ctx, Handler, Hooks, Message, Placement, Runtime};
    /// use mailring_actors::{Stream, StreamMessage};
    ///
    /// /// The numbers 1 to 100.
    /// struct Count(u32);
    ///
    /// impl Stream for Count {
    ///     type Item = u32;
    ///     fn poll_next(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<u32>> {
    ///         self.0 += 1;
    ///         Poll::Ready((self.0 <= 100).then_some(self.0))
    ///     }
    /// }
    ///
    /// #[derive(Actor, Default)]
    /// #[actor(handles(StreamMessage<u32>, Total))]
    /// struct Adder {
    ///     sum: u32,
    ///     ended: bool,
    /// }
    ///
    /// #[derive(Message)]
    /// #[message(reply = Option<u32>)]
    /// struct Total;
    ///
    /// impl Hooks for Adder {
    ///     async fn on_start(&mut self, cx: &mut Ctx<Self>) {
    ///         cx.attach_stream(Count(0));
    ///     }
    /// }
    ///
    /// impl Handler<StreamMessage<u32>> for Adder {
    ///     async fn handle(&mut self, m: StreamMessage<u32>, _cx: &mut Ctx<Self>) {
    ///         match m {
    ///             StreamMessage::Item(n) => self.sum += n,
    ///             StreamMessage::End => self.ended = true,
    ///         }
    ///     }
    /// }
    ///
    /// impl Handler<Total> for Adder {
    ///     async fn handle(&mut self, _m: Total, _cx: &mut Ctx<Self>) -> Option<u32> {
    ///         self.ended.then_some(self.sum)
    ///     }
    /// }
    ///
    /// let system = ActorSystem::start(Runtime::builder().shards(2))?;
    /// let adder = system.spawn_actor(Placement::RoundRobin, Adder::default);
    /// let total = system.block_on(async move {
    ///     loop {
    ///         if let Some(t) = adder.ask(Total).await.unwrap() {
    ///             return t;
    ///         }
    ///         mailring::time::sleep(std::time::Duration::from_millis(1)).await;
    ///     }
    /// });
    /// assert_eq!(total, 5050);
    /// # system.shutdown();
    /// # Ok::<(), mailring::BuildError>(())
    /// ```
    pub fn attach_stream<S>(&mut self, stream: S) -> TimerHandle
    where
        S: futures_core::Stream + 'static,
        S::Item: 'static,
        A: Accepts<StreamMessage<S::Item>>,
    {
        let cell = self.cell.clone();
        let window = A::CONFIG
            .mailbox
            .map_or(STREAM_WINDOW, |bound| bound.min(STREAM_WINDOW))
            .max(1);
        let failed = self.panic_sink();
        let join = self.scope().spawn(failed, async move {
            let mut stream = std::pin::pin!(stream);
            loop {
                poll_fn(|cx| cell.poll_below(window, cx)).await;
                let next = poll_fn(|cx| stream.as_mut().poll_next(cx)).await;
                let (msg, last) = match next {
                    Some(item) => (StreamMessage::Item(item), false),
                    None => (StreamMessage::End, true),
                };
                if cell.push_own(A::envelope(msg)).is_err() || last {
                    return;
                }
            }
        });
        TimerHandle { join }
    }

    /// Delivers a [`Terminated`] message to this actor when `target` stops
    /// (at once if it is not running; for a keyed target, when its current
    /// activation ends). Watching a target again while its watch stands
    /// (before its `Terminated` was sent) has no effect: one end, one
    /// message, however many calls.
    pub fn watch<B: Actor>(&mut self, target: &Addr<B>)
    where
        A: Accepts<Terminated>,
        A::Envelope: Send,
        B::Envelope: Send,
    {
        let watching = self.watching.get_or_insert_with(Box::default);
        let key = (std::any::TypeId::of::<B>(), target.uid());
        if watching
            .by_target
            .get(&key)
            .is_some_and(|told| !told.load(Ordering::Acquire))
        {
            return;
        }
        if watching.by_target.len() >= watching.prune_at {
            watching
                .by_target
                .retain(|_, told| !told.load(Ordering::Acquire));
            watching.prune_at = (watching.by_target.len() * 2).max(16);
        }
        let told = Arc::new(AtomicBool::new(false));
        watching.by_target.insert(key, told.clone());
        let me = self.myself.clone();
        // Dropped by the target once this activation is gone: an actor
        // watched by many short-lived ones keeps only the live watches.
        target.watch_while(
            Box::new(move |t| {
                told.store(true, Ordering::Release);
                let _ = me.tell(t);
            }),
            Arc::downgrade(self.alive.get_or_insert_with(Arc::default)),
        );
    }

    /// Spawns an unkeyed child actor: it stops when this actor stops or
    /// restarts, and with `supervision = "escalate"` its panics fail this actor.
    pub fn spawn_child<B, F>(&mut self, placement: Placement, factory: F) -> Addr<B>
    where
        B: Actor<Key = ()>,
        B::Envelope: Send,
        A::Envelope: Send,
        F: FnMut() -> B + Send + 'static,
    {
        let link = ParentLink::new(&self.myself);
        let child =
            crate::runner::spawn_unkeyed(self.myself.system.arc(), placement, factory, Some(link));
        // A child that ends on its own leaves the list (at the next
        // pruning): a parent spawning a short-lived child per request keeps
        // only the live ones.
        let ended = Arc::new(AtomicBool::new(false));
        let flag = ended.clone();
        child.watch_with(Box::new(move |_| flag.store(true, Ordering::Release)));
        let stop = child.clone();
        self.children.push(Child {
            ended,
            stop: Box::new(move || {
                crate::local::send_delivery(
                    stop.system.arc(),
                    stop.home(),
                    stop.target_id(),
                    crate::local::Delivery::Stop(StopReason::ParentStopped),
                )
            }),
        });
        if self.children.len() >= self.prune_children_at {
            self.prune_children();
            self.prune_children_at = (2 * self.children.len()).max(16);
        }
        child
    }

    /// Children spawned by this activation ([`Ctx::spawn_child`]) that have
    /// not ended yet, as far as this shard has heard.
    pub fn child_count(&mut self) -> usize {
        self.prune_children();
        self.children.len()
    }

    fn prune_children(&mut self) {
        self.children.retain(|c| !c.ended.load(Ordering::Acquire));
    }

    pub(crate) fn stop_children(&mut self) {
        for child in self.children.drain(..) {
            if !child.ended.load(Ordering::Acquire) {
                (child.stop)();
            }
        }
        self.prune_children_at = 16;
    }
}

/// The tasks one activation started with `run_later`, `run_interval` and
/// `wait_for`: they end when it stops or restarts.
///
/// Each task registers its waker in a slot while it waits; closing the
/// scope wakes them all, and a task that finds its scope closed returns
/// without polling its future again, which drops the future (and what it
/// holds: the message, the closure, the actor's cell) on this shard.
#[derive(Default)]
struct Scope {
    closed: Cell<bool>,
    /// The live tasks' wakers, by slot (`None`: a free slot, or a task not
    /// polled yet).
    wakers: RefCell<Vec<Option<Waker>>>,
    /// Free slots of `wakers`.
    free: RefCell<Vec<usize>>,
}

impl Scope {
    /// Spawns `fut` on this shard, to end when the scope closes. A panic in
    /// one of its polls ends it and goes to `failed`.
    fn spawn(
        self: &Rc<Self>,
        failed: impl FnOnce(Box<dyn Any + Send>) + 'static,
        fut: impl Future<Output = ()> + 'static,
    ) -> JoinHandle<()> {
        let member = Member::join(self.clone());
        mailring::spawn_local(async move {
            let mut fut = std::pin::pin!(fut);
            let mut failed = Some(failed);
            poll_fn(|cx| {
                if member.closed(cx.waker()) {
                    return Poll::Ready(());
                }
                match catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
                    Ok(polled) => polled,
                    Err(payload) => {
                        if let Some(failed) = failed.take() {
                            failed(payload);
                        }
                        Poll::Ready(())
                    }
                }
            })
            .await
        })
    }

    /// Ends every task of the scope (each at its next turn), and any spawned later.
    fn close(&self) {
        self.closed.set(true);
        // Taken before waking: a wake never polls inline, but the borrow is
        // not held across user code either way.
        let wakers = std::mem::take(&mut *self.wakers.borrow_mut());
        self.free.borrow_mut().clear();
        for waker in wakers.into_iter().flatten() {
            waker.wake();
        }
    }
}

/// A task's place in its [`Scope`]; freed when the task ends.
struct Member {
    scope: Rc<Scope>,
    slot: usize,
}

impl Member {
    fn join(scope: Rc<Scope>) -> Member {
        if scope.closed.get() {
            // Ends at its first poll.
            return Member {
                scope,
                slot: usize::MAX,
            };
        }
        let slot = match scope.free.borrow_mut().pop() {
            Some(slot) => slot,
            None => {
                let mut wakers = scope.wakers.borrow_mut();
                wakers.push(None);
                wakers.len() - 1
            }
        };
        Member { scope, slot }
    }

    /// Whether the scope closed; if not, `waker` is the one to wake when it does.
    fn closed(&self, waker: &Waker) -> bool {
        if self.scope.closed.get() {
            return true;
        }
        let mut wakers = self.scope.wakers.borrow_mut();
        match wakers.get_mut(self.slot) {
            Some(Some(w)) if w.will_wake(waker) => {}
            Some(entry) => *entry = Some(waker.clone()),
            None => {}
        }
        false
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        if self.scope.closed.get() {
            return;
        }
        if let Some(entry) = self.scope.wakers.borrow_mut().get_mut(self.slot) {
            *entry = None;
        }
        self.scope.free.borrow_mut().push(self.slot);
    }
}

/// A background panic queued to its actor: reported when dropped unraised
/// (the actor's mailbox dropped with the continuation in it).
struct Unraised(Option<Box<dyn Any + Send>>);

impl Drop for Unraised {
    fn drop(&mut self) {
        if let Some(payload) = self.0.take() {
            report_and_drop(payload);
        }
    }
}

/// Reports a panic of an actor's background work that no instance raises
/// again (see [`Ctx::panic_sink`]), then drops it.
fn report_and_drop(payload: Box<dyn Any + Send>) {
    mailring::panic::report_caught(CallbackKind::Handler, &*payload);
    mailring::panic::drop_payload(payload);
}

/// A fresh [`Ctx`] epoch: unique in the process.
fn next_epoch() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// One `wait_for` in its actor's count ([`ActorCell::pending_waits`]) while it
/// lives.
struct WaitPending<A: Actor>(Rc<ActorCell<A>>);

impl<A: Actor> WaitPending<A> {
    fn new(cell: Rc<ActorCell<A>>) -> Self {
        cell.pending_waits.set(cell.pending_waits.get() + 1);
        WaitPending(cell)
    }
}

impl<A: Actor> Drop for WaitPending<A> {
    fn drop(&mut self) {
        self.0.pending_waits.set(self.0.pending_waits.get() - 1);
    }
}
