//! Actor references: [`Addr`] for unkeyed actors and [`KeyedRef`] (the same
//! type, naming a key) for keyed virtual actors. Both are `Send + Sync` and
//! cheap to clone; every send method works from any shard or outside thread.
//!
//! Paths of a send (see `local` for the data structures):
//! 1. on the target's shard: look the actor up (activating a keyed one),
//!    wrap the message, push it on the mailbox, wake the actor's task;
//! 2. on another shard: append to this tick's batch for the target's shard;
//! 3. from an outside thread: hand a closure to the target's shard.

use std::fmt;
use std::future::poll_fn;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use mailring::ShardId;

use crate::actor::{Accepts, Actor, Message};
use crate::capacity::Capacity;
use crate::error::{AskError, RunNowError, StopReason, TellError};
use crate::local::{self, Delivery, TargetId};
use crate::reply::{self, Asked, Reply};
use crate::system::{RoomWait, SystemHandle, SystemRef};

/// The identity of an actor within its system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ActorId(pub(crate) u64);

impl fmt::Display for ActorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "actor#{:x}", self.0)
    }
}

const UNKNOWN: usize = usize::MAX;

pub(crate) enum AddrTarget<A: Actor> {
    Actor {
        shard: usize,
        uid: u64,
    },
    Key {
        key: A::Key,
        hash: u64,
        home: AtomicUsize,
    },
}

/// A reference to an actor of type `A`: unkeyed (from `spawn_actor`) or keyed
/// (from `keyed(key)`, valid before the actor exists).
pub struct Addr<A: Actor> {
    pub(crate) system: SystemRef,
    pub(crate) target: AddrTarget<A>,
    pub(crate) capacity: Option<Arc<Capacity>>,
}

/// A reference to a keyed (virtual) actor: an [`Addr`] that names a key.
pub type KeyedRef<A> = Addr<A>;

impl<A: Actor> Clone for Addr<A> {
    fn clone(&self) -> Self {
        let target = match &self.target {
            AddrTarget::Actor { shard, uid } => AddrTarget::Actor {
                shard: *shard,
                uid: *uid,
            },
            AddrTarget::Key { key, hash, home } => AddrTarget::Key {
                key: key.clone(),
                hash: *hash,
                home: AtomicUsize::new(home.load(Ordering::Relaxed)),
            },
        };
        Addr {
            system: self.system.clone(),
            target,
            capacity: self.capacity.clone(),
        }
    }
}

impl<A: Actor> fmt::Debug for Addr<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Addr");
        d.field("actor", &std::any::type_name::<A>());
        match &self.target {
            AddrTarget::Actor { shard, uid } => d.field("shard", shard).field("uid", uid),
            AddrTarget::Key { key, .. } => d.field("key", key),
        };
        d.finish()
    }
}

impl<A: Actor> Addr<A> {
    pub(crate) fn keyed(system: SystemRef, key: A::Key) -> Self {
        let hash = crate::route::route_hash(&key);
        let capacity = A::CONFIG
            .mailbox
            .map(|cap| system.keyed_capacity::<A>(&key, cap));
        Addr {
            system,
            target: AddrTarget::Key {
                key,
                hash,
                home: AtomicUsize::new(UNKNOWN),
            },
            capacity,
        }
    }

    pub(crate) fn unkeyed(
        system: SystemRef,
        shard: usize,
        uid: u64,
        capacity: Option<Arc<Capacity>>,
    ) -> Self {
        Addr {
            system,
            target: AddrTarget::Actor { shard, uid },
            capacity,
        }
    }

    /// The actor's identity (for keyed actors, a stable function of type and key).
    pub fn id(&self) -> ActorId {
        ActorId(self.uid())
    }

    pub(crate) fn uid(&self) -> u64 {
        match &self.target {
            AddrTarget::Actor { uid, .. } => *uid,
            AddrTarget::Key { key, .. } => crate::route::keyed_uid::<A, _>(key),
        }
    }

    /// The key, for a keyed reference.
    pub fn key(&self) -> Option<&A::Key> {
        match &self.target {
            AddrTarget::Actor { .. } => None,
            AddrTarget::Key { key, .. } => Some(key),
        }
    }

    /// The shard the actor lives on (or will be activated on).
    pub fn shard(&self) -> ShardId {
        ShardId::new(self.home())
    }

    /// The system this reference belongs to.
    pub fn system(&self) -> SystemHandle {
        SystemHandle {
            shared: self.system.arc().clone(),
        }
    }

    #[inline]
    pub(crate) fn home(&self) -> usize {
        match &self.target {
            AddrTarget::Actor { shard, .. } => *shard,
            AddrTarget::Key { key, hash, home } => {
                let h = home.load(Ordering::Relaxed);
                if h != UNKNOWN {
                    return h;
                }
                let h = local::keyed_home::<A>(self.system.arc(), key, *hash);
                home.store(h, Ordering::Relaxed);
                h
            }
        }
    }

    #[inline]
    pub(crate) fn target_id(&self) -> TargetId<A> {
        match &self.target {
            AddrTarget::Actor { uid, .. } => TargetId::Uid(*uid),
            AddrTarget::Key { key, .. } => TargetId::Key(key.clone()),
        }
    }

    /// The target, borrowed (no key clone).
    #[inline]
    fn target_ref(&self) -> local::TargetRef<'_, A> {
        match &self.target {
            AddrTarget::Actor { uid, .. } => local::TargetRef::Uid(*uid),
            AddrTarget::Key { key, .. } => local::TargetRef::Key(key),
        }
    }

    /// Sends `msg` without waiting for a reply. Never waits: on a bounded
    /// mailbox it enqueues even past the bound (use [`Addr::try_tell`] or
    /// [`Addr::send`] for backpressure).
    ///
    /// # Errors
    ///
    /// The message comes back when the actor is known to have stopped (an
    /// unkeyed actor on this shard), cannot be activated, or the system is
    /// shutting down. A stop noticed on another shard counts as a dead letter.
    #[inline]
    pub fn tell<M>(&self, msg: M) -> Result<(), TellError<M>>
    where
        A: Accepts<M>,
        M: Message + Send,
        A::Envelope: Send,
    {
        if let Some(c) = &self.capacity {
            c.force_acquire();
        }
        self.deliver_msg(msg)
    }

    /// Sends `msg` if the bounded mailbox has room and, from another shard,
    /// the sending shard's credit window to the actor's shard has room (see
    /// [`crate::SystemConfig::cross_shard_window`]); never waits.
    ///
    /// # Errors
    ///
    /// [`TellError::Full`] with the message when the mailbox is full or the
    /// window spent; else as [`Addr::tell`].
    pub fn try_tell<M>(&self, msg: M) -> Result<(), TellError<M>>
    where
        A: Accepts<M>,
        M: Message + Send,
        A::Envelope: Send,
    {
        if let Some((ts, dest)) = self.windowed_route() {
            if !ts.flow.has_credit(dest) {
                return Err(TellError::Full(msg));
            }
        }
        if let Some(c) = &self.capacity {
            if !c.try_acquire() {
                return Err(TellError::Full(msg));
            }
        }
        self.deliver_msg(msg)
    }

    /// Sends `msg`, waiting for room in a bounded mailbox and, from another
    /// shard, for credit in the sending shard's window to the actor's shard
    /// (see [`crate::SystemConfig::cross_shard_window`]). An actor's send to
    /// itself from its own handler never waits for room (only it frees its
    /// places): it takes one past the bound, as its timers' messages do.
    ///
    /// A producer that sends with `send().await` never gets further ahead
    /// of the actors it feeds than the window:
    ///
    /// ```
    /// use mailring_actors::{Actor, ActorSystem, Ctx, Handler, Message};
    /// use mailring_actors::{Placement, Runtime, ShardId, SystemConfig};
    ///
    /// #[derive(Actor, Default)]
    /// #[actor(handles(Line, Count))]
    /// struct Sink(u64);
    ///
    /// #[derive(Message)]
    /// struct Line(String);
    ///
    /// #[derive(Message)]
    /// #[message(reply = u64)]
    /// struct Count;
    ///
    /// impl Handler<Line> for Sink {
    ///     async fn handle(&mut self, _line: Line, _cx: &mut Ctx<Self>) {
    ///         self.0 += 1;
    ///     }
    /// }
    /// impl Handler<Count> for Sink {
    ///     async fn handle(&mut self, _m: Count, _cx: &mut Ctx<Self>) -> u64 {
    ///         self.0
    ///     }
    /// }
    ///
    /// let config = SystemConfig { cross_shard_window: 64, ..SystemConfig::default() };
    /// let system = ActorSystem::start_with(Runtime::builder().shards(2), config)?;
    /// let sink = system.spawn_actor(Placement::Pinned(ShardId::new(1)), Sink::default);
    /// let producer = system.runtime().spawn_on(ShardId::new(0), async move {
    ///     for i in 0..1000 {
    ///         // At most 64 lines wait in shard 1's mailboxes at any time.
    ///         sink.send(Line(format!("line {i}"))).await.unwrap();
    ///     }
    ///     sink.ask(Count).await.unwrap()
    /// });
    /// assert_eq!(system.block_on(producer).unwrap(), 1000);
    /// # system.shutdown();
    /// # Ok::<(), mailring_actors::mailring::BuildError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Addr::tell`].
    pub async fn send<M>(&self, msg: M) -> Result<(), TellError<M>>
    where
        A: Accepts<M>,
        M: Message + Send,
        A::Envelope: Send,
    {
        let mut room = RoomWait::new(self.system.arc());
        let placed = poll_fn(|cx| self.poll_room(&mut room, cx)).await;
        drop(room);
        if !placed {
            return Err(TellError::ShuttingDown(msg));
        }
        self.deliver_msg(msg)
    }

    /// One poll of [`send`](Self::send)'s wait: ready with `true` once the
    /// credit window and the bounded mailbox have room (a place is then
    /// taken), with `false` when the system is shutting down.
    pub(crate) fn poll_room(&self, room: &mut RoomWait<'_>, cx: &mut Context<'_>) -> Poll<bool> {
        // Looked up at every poll: the future holds nothing `!Send`.
        // A shutting-down system returns no more credits: its sends go
        // on (and fail or become dead letters) without waiting for them.
        if let Some((ts, dest)) = self.windowed_route() {
            if ts.flow.poll_credit(dest, cx, &mut room.credit).is_pending()
                && !self.system.arc().is_shutting_down()
            {
                return Poll::Pending;
            }
        }
        // Credit checked in this same poll, with nothing between it and
        // the delivery that follows: a place is taken only when both are
        // there.
        match &self.capacity {
            Some(c) => match room.place.poll_acquire(c, cx) {
                Poll::Ready(()) => Poll::Ready(true),
                // An actor's send to itself: only it frees its places, and
                // not while its handler waits here. It takes one past the
                // bound, as its timers' messages do.
                Poll::Pending
                    if crate::runner::current_frame().is_some_and(|f| f.uid == self.uid()) =>
                {
                    c.force_acquire();
                    Poll::Ready(true)
                }
                // No room: wait for it, unless the system is shutting
                // down (an actor it abandons never frees its places);
                // the shutdown wakes the waiters it finds registered.
                Poll::Pending if room.register(cx.waker()) => Poll::Ready(false),
                Poll::Pending => Poll::Pending,
            },
            None => Poll::Ready(true),
        }
    }

    /// Sends `msg` and returns the future of its reply. The message is sent
    /// now, whether or not the reply is awaited. The system's default ask
    /// timeout ([`crate::SystemConfig::ask_timeout`], none unless set)
    /// applies unless [`Reply::timeout`], [`Reply::deadline`] or
    /// [`Reply::no_timeout`] says otherwise.
    ///
    /// The reply fails with [`AskError::WouldDeadlock`] at once when the
    /// target is the asking actor itself or an actor waiting on it (on the
    /// asker's ask chain), and when the ask reaches an actor whose handler
    /// is blocked on an ask to the asking actor.
    pub fn ask<M>(&self, msg: M) -> Reply<M::Reply>
    where
        A: Accepts<M>,
        M: Message + Send,
        M::Reply: Send,
        A::Envelope: Send,
    {
        let (asked, reply) = match crate::runner::ask_chain(|| self.uid()) {
            Ok(from) => new_ask(msg, from, self.system.ask_timeout),
            Err(e) => return Reply::failed(e),
        };
        if let Some(c) = &self.capacity {
            c.force_acquire();
        }
        // A failed delivery drops the envelope with its reason, which the
        // reply then reports.
        self.deliver_env(A::ask_envelope(asked));
        reply
    }

    /// Runs `f` on the actor at once, in the calling task, when the actor
    /// is active on the calling shard and idle: its task waits for mail,
    /// nothing is queued for it (deliveries other shards published here
    /// are taken first, as for a send), and none of its handlers or hooks
    /// is running. Otherwise nothing runs and `f` comes back in
    /// [`RunNowError::NotIdle`]: send a message instead.
    ///
    /// This is a message handled between two others, without the mailbox
    /// and the task switch: the actor never sees two at once, and a
    /// message sent before the call (from this task, or published to this
    /// shard) runs before it, since a queued message makes the actor busy.
    /// It counts as activity for the idle timeout (an actor that closures
    /// alone keep busy passivates between one and two idle timeouts after
    /// the last one: its deadline moves when it comes, not at each call)
    /// and in the type's `handled` (and `ran_now`) counters. `f` cannot await: it suits
    /// work that an actor does without I/O (a counter, an in-memory
    /// state change), asked from a task on its shard, such as a
    /// connection's session calling the keyed actors it lives next to.
    /// A keyed actor that is not active is not activated (send it a
    /// message).
    ///
    /// # Errors
    ///
    /// [`RunNowError::NotIdle`] with `f`, as above; [`RunNowError::Panicked`]
    /// when `f` panicked, which is reported as a handler's panic and sends
    /// the actor through its supervision policy, as a panicking handler
    /// would.
    ///
    /// # Examples
    ///
    /// ```
    /// use mailring_actors::{Actor, ActorSystem, Ctx, Handler, Message, RunNowError, Runtime};
    ///
    /// #[derive(Actor, Default)]
    /// #[actor(key = u64, activate = |_| Counter::default(), handles(Add))]
    /// struct Counter {
    ///     total: u64,
    /// }
    ///
    /// #[derive(Message)]
    /// #[message(reply = u64)]
    /// struct Add(u64);
    ///
    /// impl Handler<Add> for Counter {
    ///     async fn handle(&mut self, m: Add, _cx: &mut Ctx<Self>) -> u64 {
    ///         self.total += m.0;
    ///         self.total
    ///     }
    /// }
    ///
    /// let system = ActorSystem::start(Runtime::builder().shards(1))?;
    /// let handle = system.handle();
    /// let total = system.block_on(async move {
    ///     let counter = handle.keyed::<Counter>(7);
    ///     counter.ask(Add(1)).await.unwrap(); // activates it
    ///     // Idle now: added in this task, no message sent.
    ///     match counter.run_now(|c| { c.total += 2; c.total }) {
    ///         Ok(total) => total,
    ///         Err(RunNowError::NotIdle(_)) => counter.ask(Add(2)).await.unwrap(),
    ///         Err(e) => panic!("{e}"),
    ///     }
    /// });
    /// assert_eq!(total, 3);
    /// # system.shutdown();
    /// # Ok::<(), mailring::BuildError>(())
    /// ```
    pub fn run_now<R, F: FnOnce(&mut A) -> R>(&self, f: F) -> Result<R, RunNowError<F>> {
        self.run_now_taking(true, f)
    }

    /// [`Addr::run_now`], without first taking in what other shards
    /// delivered to this one since the shard last did: for several
    /// closures on several actors that must see one instant of the shard.
    /// The first is run with `run_now` (which takes the deliveries in) and
    /// the others with this: nothing that arrives in between reaches a
    /// mailbox, so an actor found idle stays idle for the next closure on
    /// it (nothing else runs on the shard meanwhile), and what the
    /// closures see together is what it was at that one point.
    ///
    /// # Errors
    ///
    /// As [`Addr::run_now`].
    pub fn run_now_as_taken<R, F: FnOnce(&mut A) -> R>(&self, f: F) -> Result<R, RunNowError<F>> {
        self.run_now_taking(false, f)
    }

    fn run_now_taking<R, F: FnOnce(&mut A) -> R>(
        &self,
        take: bool,
        f: F,
    ) -> Result<R, RunNowError<F>> {
        let Some(ts) = local::type_state::<A>(self.system.arc()) else {
            return Err(RunNowError::NotIdle(f));
        };
        if ts.shard != self.home() {
            return Err(RunNowError::NotIdle(f));
        }
        if take {
            // Deliveries already published to this shard go first.
            mailring::receive_pending();
        }
        let cell = match self.target_ref() {
            local::TargetRef::Uid(uid) => ts.find_unkeyed(uid),
            local::TargetRef::Key(key) => ts.find_keyed(key),
        };
        match cell {
            Some(cell) => cell.run_now(&ts, f),
            None => Err(RunNowError::NotIdle(f)),
        }
    }

    /// The calling shard's state and the actor's shard, when the caller is
    /// a shard of this system other than the actor's (a send that a credit
    /// window counts).
    #[inline]
    fn windowed_route(&self) -> Option<(std::rc::Rc<local::TypeState<A>>, usize)> {
        let ts = local::type_state::<A>(self.system.arc())?;
        let dest = self.home();
        (ts.shard != dest && !local::pinned_past_last_shard::<A>(self.system.arc(), dest))
            .then_some((ts, dest))
    }

    /// Delivers an ask's envelope; a failure drops it with the reason, which
    /// the ask's reply then reports.
    #[inline]
    fn deliver_env(&self, env: A::Envelope)
    where
        A::Envelope: Send,
    {
        let _ = self.deliver(env, |env| env, reply::drop_with_reason);
    }

    /// Delivers a told message; a failure noticed here gives it back.
    #[inline]
    pub(crate) fn deliver_msg<M>(&self, msg: M) -> Result<(), TellError<M>>
    where
        A: Accepts<M>,
        M: Message + Send,
        A::Envelope: Send,
    {
        self.deliver(msg, A::envelope, tell_error)
    }

    /// The three paths of a send (see the module docs): `wrap` makes the
    /// envelope, `fail` handles a failure noticed on this side (a stopped
    /// local actor, no factory, a closed system).
    #[inline]
    fn deliver<P, E>(
        &self,
        payload: P,
        wrap: impl FnOnce(P) -> A::Envelope,
        fail: impl FnOnce(AskError, P) -> E,
    ) -> Result<(), E>
    where
        A::Envelope: Send,
    {
        // A keyed type with no way to be built (no `activate`, no factory
        // registered) fails here, where the sender learns it, not as a dead
        // letter on the actor's shard. Both first tests are constants: the
        // check folds away for types with `activate` and for unkeyed types
        // (whose key is `()`).
        if !A::HAS_ACTIVATE
            && std::mem::size_of::<A::Key>() != 0
            && matches!(self.target, AddrTarget::Key { .. })
            && !self.system.arc().has_factory::<A>()
        {
            self.release_place();
            return Err(fail(AskError::NoFactory, payload));
        }
        let dest = self.home();
        match local::type_state::<A>(self.system.arc()) {
            Some(ts) if ts.shard == dest => {
                // Deliveries already published to this shard go first.
                mailring::receive_pending();
                ts.push_with(self.target_ref(), payload, wrap)
                    .map_err(|(e, payload)| {
                        self.release_place();
                        fail(e, payload)
                    })
            }
            // Only a keyed type pinned past the last shard has no home:
            // checked off the same-shard path, which found its shard.
            _ if local::pinned_past_last_shard::<A>(self.system.arc(), dest) => {
                self.release_place();
                Err(fail(AskError::NoSuchShard, payload))
            }
            Some(ts) => {
                ts.push_outbound(dest, self.target_id(), || wrap(payload));
                Ok(())
            }
            None if self.system.is_closed() => {
                self.release_place();
                Err(fail(AskError::ShuttingDown, payload))
            }
            None => {
                local::send_delivery(
                    self.system.arc(),
                    dest,
                    self.target_id(),
                    Delivery::Msg(wrap(payload)),
                );
                Ok(())
            }
        }
    }

    fn release_place(&self) {
        if let Some(c) = &self.capacity {
            c.release(1);
        }
    }

    /// Asks the actor to stop after the message it is handling. An unkeyed
    /// actor's queued messages are dropped (their asks fail with
    /// [`AskError::Stopped`]); a keyed actor passivates (`on_passivate`,
    /// `on_stop`) and its queued messages go to a fresh activation. The
    /// table in the guide (docs/actors.md, "Stopping") lists every case.
    pub fn stop(&self)
    where
        A::Envelope: Send,
    {
        self.control(Delivery::Stop(StopReason::Stopped));
    }

    /// Asks the actor to stop once it has handled the messages its mailbox
    /// holds when the request arrives (messages this sender sent before it
    /// included); messages that arrive after are dropped as with
    /// [`stop`](Self::stop). An actor that is not running (a passivated
    /// keyed actor) is not activated for it.
    pub fn stop_gracefully(&self)
    where
        A::Envelope: Send,
    {
        self.control(Delivery::StopGracefully);
    }

    /// Resolves when the actor stops, with why; at once when it is not
    /// running. For a keyed actor, when its current activation ends
    /// (passivation included): the key lives on, and a later message
    /// activates it again. A restart after a panic is not a stop.
    ///
    /// # Examples
    ///
    /// ```
    /// use mailring_actors::{Actor, ActorSystem, Ctx, Handler, Message, Placement, Runtime, StopReason};
    ///
    /// #[derive(Actor, Default)]
    /// #[actor(handles(Work))]
    /// struct Worker(u32);
    ///
    /// #[derive(Message)]
    /// struct Work;
    ///
    /// impl Handler<Work> for Worker {
    ///     async fn handle(&mut self, _w: Work, _cx: &mut Ctx<Self>) {
    ///         self.0 += 1;
    ///     }
    /// }
    ///
    /// let system = ActorSystem::start(Runtime::builder().shards(2))?;
    /// let worker = system.spawn_actor(Placement::RoundRobin, Worker::default);
    /// for _ in 0..3 {
    ///     worker.tell(Work).unwrap();
    /// }
    /// // The three queued messages are handled, then the actor stops.
    /// worker.stop_gracefully();
    /// let end = system.block_on(async move { worker.stopped().await });
    /// assert_eq!(end.reason, StopReason::Stopped);
    /// # system.shutdown();
    /// # Ok::<(), mailring::BuildError>(())
    /// ```
    pub fn stopped(&self) -> impl std::future::Future<Output = crate::Terminated> + Send + 'static
    where
        A::Envelope: Send,
    {
        let (answer, result) = crate::answer::channel();
        let id = self.id();
        // The watcher lives while this future does: one dropped unanswered
        // (a caller's timeout) leaves nothing behind in the actor's cell.
        let waiting = std::sync::Arc::new(());
        self.control(Delivery::Watch(crate::mailbox::Watcher::while_awaited(
            Box::new(move |t| answer.send(t)),
            std::sync::Arc::downgrade(&waiting),
        )));
        async move {
            let _waiting = waiting;
            // Dropped unanswered: the system shut down under it.
            result.await.unwrap_or(crate::Terminated {
                id,
                reason: StopReason::Shutdown,
            })
        }
    }

    /// Whether the actor is running (a keyed actor: active now), asked of
    /// its shard without activating it. `false` once the system shuts down.
    pub fn is_alive(&self) -> impl std::future::Future<Output = bool> + Send + 'static
    where
        A::Envelope: Send,
    {
        let (answer, result) = crate::answer::channel();
        self.control(Delivery::Alive(Box::new(move |alive| answer.send(alive))));
        async move { result.await.unwrap_or(false) }
    }

    /// Asks that `notify` be called once with the actor's [`crate::Terminated`]
    /// when it stops (at once if it is not running).
    pub(crate) fn watch_with(&self, notify: Box<dyn FnOnce(crate::Terminated) + Send>)
    where
        A::Envelope: Send,
    {
        self.control(Delivery::Watch(crate::mailbox::Watcher::new(notify)));
    }

    /// [`Addr::watch_with`] for as long as `watcher`'s `Arc` lives (the
    /// target drops the watch once it is gone).
    pub(crate) fn watch_while(
        &self,
        notify: Box<dyn FnOnce(crate::Terminated) + Send>,
        watcher: std::sync::Weak<()>,
    ) where
        A::Envelope: Send,
    {
        self.control(Delivery::Watch(crate::mailbox::Watcher::while_awaited(
            notify, watcher,
        )));
    }

    /// Runs `f` on the actor's shard (where it lives, or will be
    /// activated), in order with what this shard sends there: after every
    /// message, stop or watch this shard (or outside thread) sent before
    /// to any actor of type `A` on that shard, before every one sent after.
    /// On the actor's own shard it runs now, in the caller.
    ///
    /// This is how to work next to an actor on another shard without a
    /// turn of its task, keeping a sender's order: `f` tries
    /// [`Addr::run_now`] there and, when the actor is busy, sends the
    /// message from there, which then takes the place a message sent from
    /// here would have taken. One call can serve several actors of the
    /// type on that shard: the order holds for each of them.
    ///
    /// `f` runs outside any task and must not block. A panic in it is
    /// caught and reported as a closure run on the shard
    /// ([`CallbackKind::RunOn`](mailring::panic::CallbackKind::RunOn)), and
    /// the deliveries after it go on. When it cannot run (the system shuts
    /// down, or a pinned type's shard does not exist) it is dropped unrun:
    /// whatever it holds (a reply's sender) tells the caller.
    ///
    /// # Examples
    ///
    /// ```
    /// use mailring_actors::{Actor, ActorSystem, Ctx, Handler, Message, Runtime, RunNowError};
    ///
    /// #[derive(Actor, Default)]
    /// #[actor(key = u64, activate = Counter::new, pinned = 1, handles(Add))]
    /// struct Counter {
    ///     total: u64,
    /// }
    ///
    /// impl Counter {
    ///     fn new(_key: &u64) -> Self {
    ///         Counter::default()
    ///     }
    /// }
    ///
    /// #[derive(Message)]
    /// #[message(reply = u64)]
    /// struct Add(u64);
    ///
    /// impl Handler<Add> for Counter {
    ///     async fn handle(&mut self, m: Add, _cx: &mut Ctx<Self>) -> u64 {
    ///         self.total += m.0;
    ///         self.total
    ///     }
    /// }
    ///
    /// let system = ActorSystem::start(Runtime::builder().shards(2))?;
    /// let handle = system.handle();
    /// let total = system.block_on(async move {
    ///     let counter = handle.keyed::<Counter>(7);
    ///     counter.ask(Add(1)).await.unwrap(); // activates it on shard 1
    ///     let (tx, rx) = mailring::sync::oneshot::channel();
    ///     let there = counter.clone();
    ///     // On shard 1, after the ask above: at once if the actor is idle,
    ///     // else as a message sent from there, in the same place.
    ///     counter.run_in_order(move || {
    ///         let total = match there.run_now(|c| { c.total += 2; c.total }) {
    ///             Ok(total) => Some(total),
    ///             Err(RunNowError::NotIdle(_)) => None,
    ///             Err(e) => panic!("{e}"),
    ///         };
    ///         let _ = tx.send((total, there.ask(Add(0))));
    ///     });
    ///     let (now, later) = rx.await.unwrap();
    ///     let after = later.await.unwrap();
    ///     assert!(now.is_none() || now == Some(after));
    ///     after
    /// });
    /// assert_eq!(total, 3);
    /// # system.shutdown();
    /// # Ok::<(), mailring::BuildError>(())
    /// ```
    pub fn run_in_order(&self, f: impl FnOnce() + Send + 'static)
    where
        A::Envelope: Send,
    {
        self.control(Delivery::Call(Box::new(f)));
    }

    /// Sends a control (stop, watch, probe) along this sender's ordered
    /// path to the actor.
    fn control(&self, item: Delivery<A>)
    where
        A::Envelope: Send,
    {
        local::send_delivery(self.system.arc(), self.home(), self.target_id(), item);
    }
}

/// A new ask of `msg`; `from`: the chain and target id of an ask made by an
/// actor's future, whose handler may then block on the reply.
fn new_ask<M>(
    msg: M,
    from: Option<(crate::runner::Chain, u64)>,
    timeout: Option<std::time::Duration>,
) -> (Asked<M>, Reply<M::Reply>)
where
    M: Message + Send,
    M::Reply: Send,
{
    match from {
        Some((chain, target)) => Asked::asking(msg, Some(chain), Some(target), timeout),
        None => Asked::asking(msg, None, None, timeout),
    }
}

fn tell_error<M>(e: AskError, msg: M) -> TellError<M> {
    match e {
        AskError::NoFactory => TellError::NoFactory(msg),
        AskError::ShuttingDown => TellError::ShuttingDown(msg),
        AskError::NoSuchShard => TellError::NoSuchShard(msg),
        _ => TellError::Stopped(msg),
    }
}

/// A reference pinned to the actor's own shard, for hot same-shard loops:
/// a send is a queue push with no lookup and no atomic operation, and
/// messages need not be `Send`. Get one with [`Addr::local`]; it is `!Send`.
///
/// So a future that holds one across an `.await` is `!Send` too, and
/// [`ActorSystem::block_on`](crate::ActorSystem::block_on), which sends its
/// future to shard 0, rejects it ("future cannot be sent between threads
/// safely ... has type `LocalAddr<..>` which is not `Send`"). Build that
/// future on the shard instead, with
/// [`ActorSystem::block_on_local`](crate::ActorSystem::block_on_local) (shard
/// 0) or `mailring::spawn_local` from a task on the actor's shard:
///
/// ```
/// use mailring_actors::{Actor, ActorSystem, Ctx, Handler, Message, Placement, Runtime, ShardId};
///
/// #[derive(Actor, Default)]
/// #[actor(handles(Ping))]
/// struct Pinger;
///
/// #[derive(Message)]
/// #[message(reply = u8)]
/// struct Ping;
///
/// impl Handler<Ping> for Pinger {
///     async fn handle(&mut self, _m: Ping, _cx: &mut Ctx<Self>) -> u8 { 1 }
/// }
///
/// let system = ActorSystem::start(Runtime::builder().shards(2))?;
/// // On shard 0, where `block_on_local` builds its future.
/// let p = system.spawn_actor(Placement::Pinned(ShardId::new(0)), Pinger::default);
/// let sum = system.block_on_local(move || async move {
///     let local = p.local().expect("on the actor's shard");
///     local.ask(Ping).await.unwrap() + local.ask(Ping).await.unwrap()
/// });
/// assert_eq!(sum, 2);
/// # system.shutdown();
/// # Ok::<(), mailring::BuildError>(())
/// ```
pub struct LocalAddr<A: Actor> {
    addr: Addr<A>,
    ts: std::rc::Rc<local::TypeState<A>>,
    cell: std::cell::RefCell<std::rc::Rc<crate::mailbox::ActorCell<A>>>,
    /// This shard's inbox flag: deliveries other shards published here go
    /// first (see `mailring::receive_pending`), checked with one load.
    pending: mailring::PendingProbe,
}

impl<A: Actor> fmt::Debug for LocalAddr<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalAddr")
            .field("addr", &self.addr)
            .finish()
    }
}

impl<A: Actor> Addr<A> {
    /// A [`LocalAddr`] for this actor, when called on the actor's shard
    /// (activating a keyed actor if needed).
    ///
    /// # Errors
    ///
    /// [`AskError::WrongShard`] off the actor's shard; [`AskError::Stopped`]
    /// for a stopped unkeyed actor; [`AskError::NoFactory`] or
    /// [`AskError::ShuttingDown`].
    pub fn local(&self) -> Result<LocalAddr<A>, AskError> {
        let ts = local::type_state::<A>(self.system.arc()).ok_or(AskError::WrongShard)?;
        if ts.shard != self.home() {
            return Err(AskError::WrongShard);
        }
        let cell = ts.resolve(&self.target_id())?;
        Ok(LocalAddr {
            addr: self.clone(),
            ts,
            cell: std::cell::RefCell::new(cell),
            pending: mailring::PendingProbe::current().ok_or(AskError::WrongShard)?,
        })
    }
}

impl<A: Actor> LocalAddr<A> {
    /// The shard-independent reference.
    pub fn addr(&self) -> &Addr<A> {
        &self.addr
    }

    fn live_cell(&self) -> Result<std::rc::Rc<crate::mailbox::ActorCell<A>>, AskError> {
        let cell = self.cell.borrow().clone();
        if cell.is_open() {
            return Ok(cell);
        }
        // A keyed actor passivated: the next message activates it again.
        let fresh = self.ts.resolve(&self.addr.target_id())?;
        *self.cell.borrow_mut() = fresh.clone();
        Ok(fresh)
    }

    /// As [`Addr::tell`], without the lookup (and `M` need not be `Send`).
    ///
    /// # Errors
    ///
    /// As [`Addr::tell`].
    #[inline]
    pub fn tell<M>(&self, msg: M) -> Result<(), TellError<M>>
    where
        A: Accepts<M>,
        M: Message,
    {
        // Deliveries already published to this shard go first.
        self.pending.receive_pending();
        {
            let cell = self.cell.borrow();
            // A blocked actor (see `cycle`) takes the general path.
            if cell.takes_plain_push() && cell.capacity.is_none() {
                // Used now, for least-recently-used passivation (nothing
                // for a type without `max_active`).
                self.ts.touch(&cell);
                if let Err((why, env)) = cell.push(A::envelope(msg)) {
                    reply::drop_with_reason(why, env);
                }
                return Ok(());
            }
        }
        self.push_counted(msg, false)
    }

    /// The general path: re-resolves a passivated keyed actor and takes a
    /// place in a bounded mailbox (`bounded`: refuse when full).
    #[cold]
    fn push_counted<M>(&self, msg: M, bounded: bool) -> Result<(), TellError<M>>
    where
        A: Accepts<M>,
        M: Message,
    {
        self.pending.receive_pending();
        let cell = match self.live_cell() {
            Ok(c) => c,
            Err(e) => return Err(tell_error(e, msg)),
        };
        if let Some(c) = &cell.capacity {
            if !bounded {
                c.force_acquire();
            } else if !c.try_acquire() {
                return Err(TellError::Full(msg));
            }
        }
        self.ts.touch(&cell);
        if let Err((why, env)) = cell.push(A::envelope(msg)) {
            // The place taken above goes back with the refused message.
            cell.free_place();
            reply::drop_with_reason(why, env);
        }
        Ok(())
    }

    /// As [`Addr::try_tell`], without the lookup.
    ///
    /// # Errors
    ///
    /// As [`Addr::try_tell`].
    pub fn try_tell<M>(&self, msg: M) -> Result<(), TellError<M>>
    where
        A: Accepts<M>,
        M: Message,
    {
        self.push_counted(msg, true)
    }

    /// As [`Addr::run_now`], without the lookup.
    ///
    /// # Errors
    ///
    /// As [`Addr::run_now`].
    pub fn run_now<R, F: FnOnce(&mut A) -> R>(&self, f: F) -> Result<R, RunNowError<F>> {
        self.pending.receive_pending();
        let mut cell = self.cell.borrow().clone();
        if !cell.is_open() {
            // A keyed actor passivated: its next activation, if one is
            // live (none is made for this).
            let Some(fresh) = self.ts.find(&self.addr.target_id()) else {
                return Err(RunNowError::NotIdle(f));
            };
            *self.cell.borrow_mut() = fresh.clone();
            cell = fresh;
        }
        cell.run_now(&self.ts, f)
    }

    /// As [`Addr::ask`], without the lookup. (An asked message and its
    /// reply must be `Send`: the reply slot is shared with the asker, which
    /// may be anywhere.)
    pub fn ask<M>(&self, msg: M) -> Reply<M::Reply>
    where
        A: Accepts<M>,
        M: Message + Send,
        M::Reply: Send,
    {
        let from = match crate::runner::ask_chain(|| self.addr.uid()) {
            Ok(from) => from,
            Err(e) => return Reply::failed(e),
        };
        self.pending.receive_pending();
        let cell = match self.live_cell() {
            Ok(c) => c,
            Err(e) => return Reply::failed(e),
        };
        let (asked, reply) = new_ask(msg, from, self.addr.system.ask_timeout);
        if let Some(c) = &cell.capacity {
            c.force_acquire();
        }
        self.ts.touch(&cell);
        if let Err((why, env)) = cell.push(A::ask_envelope(asked)) {
            cell.free_place();
            reply::drop_with_reason(why, env);
        }
        reply
    }
}

/// The actors of type `A` active on the calling shard, found by key with
/// no [`Addr`] made: for a task that calls many keyed actors beside it in
/// one go, such as a session running a client's pipelined requests. Taken
/// on a shard by [`SystemHandle::local_actors`]; it stays with that
/// shard's thread (it is not `Send`).
///
/// # Examples
///
/// ```
/// use mailring_actors::{Actor, ActorSystem, Ctx, Handler, Message, Runtime};
///
/// #[derive(Actor, Default)]
/// #[actor(key = u32, activate = |_| Counter::default(), handles(Touch))]
/// struct Counter {
///     hits: u64,
/// }
///
/// #[derive(Message)]
/// struct Touch;
///
/// impl Handler<Touch> for Counter {
///     async fn handle(&mut self, _: Touch, _cx: &mut Ctx<Self>) {
///         self.hits += 1;
///     }
/// }
///
/// let system = ActorSystem::start(Runtime::builder().shards(1))?;
/// let handle = system.handle();
/// let hits = system.block_on_local(move || async move {
///     for key in 0..4u32 {
///         let _ = handle.keyed::<Counter>(key).ask(Touch).await;
///     }
///     // One table, many keys: each idle actor runs the closure at once.
///     let counters = handle.local_actors::<Counter>().expect("on a shard");
///     (0..4u32)
///         .map(|key| counters.run_now(&key, |c| { c.hits += 1; c.hits }).unwrap_or(0))
///         .sum::<u64>()
/// });
/// assert_eq!(hits, 8);
/// # system.shutdown();
/// # Ok::<(), mailring::BuildError>(())
/// ```
pub struct LocalActors<A: Actor> {
    ts: std::rc::Rc<local::TypeState<A>>,
    /// This shard's inbox flag (see [`LocalAddr`]'s).
    pending: mailring::PendingProbe,
}

impl<A: Actor> fmt::Debug for LocalActors<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalActors")
            .field("type", &std::any::type_name::<A>())
            .finish()
    }
}

impl<A: Actor> LocalActors<A> {
    /// The calling shard's table, when the caller is a shard of `system`.
    pub(crate) fn here(system: &Arc<crate::system::SystemShared>) -> Option<Self> {
        Some(LocalActors {
            ts: local::type_state::<A>(system)?,
            pending: mailring::PendingProbe::current()?,
        })
    }

    /// Runs `f` at once on the keyed actor `key` when it is active and idle
    /// on this shard: as [`SystemHandle::run_now_keyed`], with the table
    /// already at hand.
    ///
    /// # Errors
    ///
    /// As [`SystemHandle::run_now_keyed`].
    pub fn run_now<R, F: FnOnce(&mut A) -> R>(
        &self,
        key: &A::Key,
        f: F,
    ) -> Result<R, RunNowError<F>> {
        // Deliveries already published to this shard go first.
        self.pending.receive_pending();
        self.ts.run_now_keyed(key, f)
    }
}
