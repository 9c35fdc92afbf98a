//! [`Recipient<M>`]: a reference to any actor that handles `M`, whatever
//! its type: what a publisher, a router or a session holds without naming
//! its subscribers' types.
//!
//! It is an [`Addr`] behind one shared pointer: a send is one indirect call
//! more than the `Addr`'s (no allocation per message); a clone is a
//! reference-count increment.

use std::fmt;
use std::future::poll_fn;
use std::sync::Arc;
use std::task::{Context, Poll};

use mailring::ShardId;

use crate::actor::{Accepts, Actor, Message};
use crate::addr::{ActorId, Addr, LocalAddr};
use crate::error::TellError;
use crate::reply::Reply;
use crate::system::{RoomWait, SystemShared};

/// A reference to an actor that handles messages of type `M`, of whatever
/// actor type: made from an [`Addr`] or a [`KeyedRef`](crate::KeyedRef)
/// with `Recipient::from(addr)` or [`Addr::recipient`].
///
/// `Clone + Send + Sync`; its send methods behave as the `Addr`'s, from any
/// shard or outside thread.
///
/// # Examples
///
/// ```
/// use mailring_actors::{Actor, ActorSystem, Ctx, Handler, Message, Placement, Recipient, Runtime};
///
/// #[derive(Message, Clone)]
/// #[message(reply = usize)]
/// struct Note(&'static str);
///
/// #[derive(Actor, Default)]
/// #[actor(handles(Note))]
/// struct Journal(Vec<&'static str>);
///
/// #[derive(Actor, Default)]
/// #[actor(handles(Note))]
/// struct Tally(usize);
///
/// impl Handler<Note> for Journal {
///     async fn handle(&mut self, n: Note, _cx: &mut Ctx<Self>) -> usize {
///         self.0.push(n.0);
///         self.0.len()
///     }
/// }
/// impl Handler<Note> for Tally {
///     async fn handle(&mut self, _n: Note, _cx: &mut Ctx<Self>) -> usize {
///         self.0 += 1;
///         self.0
///     }
/// }
///
/// let system = ActorSystem::start(Runtime::builder().shards(2))?;
/// // Two actor types, one list: each is a `Recipient<Note>`.
/// let readers: Vec<Recipient<Note>> = vec![
///     system.spawn_actor(Placement::RoundRobin, Journal::default).into(),
///     system.spawn_actor(Placement::RoundRobin, Tally::default).into(),
/// ];
/// for r in &readers {
///     r.tell(Note("hello")).unwrap();
/// }
/// let counts = system.block_on(async move {
///     let mut counts = Vec::new();
///     for r in &readers {
///         counts.push(r.ask(Note("again")).await.unwrap());
///     }
///     counts
/// });
/// assert_eq!(counts, [2, 2]);
/// # system.shutdown();
/// # Ok::<(), mailring::BuildError>(())
/// ```
pub struct Recipient<M: Message> {
    addr: Arc<dyn Deliver<M>>,
}

/// What a [`Recipient`] calls on the `Addr` it erases.
trait Deliver<M: Message>: Send + Sync + 'static {
    fn tell(&self, msg: M) -> Result<(), TellError<M>>;
    fn try_tell(&self, msg: M) -> Result<(), TellError<M>>;
    fn poll_room(&self, room: &mut RoomWait<'_>, cx: &mut Context<'_>) -> Poll<bool>;
    fn deliver(&self, msg: M) -> Result<(), TellError<M>>;
    fn ask(&self, msg: M) -> Reply<M::Reply>;
    fn system(&self) -> &SystemShared;
    fn id(&self) -> ActorId;
    fn shard(&self) -> ShardId;
    fn actor_type(&self) -> &'static str;
    fn local(&self) -> Option<Box<dyn LocalTell<M>>>;
}

/// A [`LocalAddr`] erased to one message type: the sends a topic makes on
/// the subscriber's own shard, without a lookup.
pub(crate) trait LocalTell<M: Message> {
    fn tell(&self, msg: M) -> Result<(), TellError<M>>;
    fn id(&self) -> ActorId;
}

impl<A: Actor + Accepts<M>, M: Message> LocalTell<M> for LocalAddr<A> {
    #[inline]
    fn tell(&self, msg: M) -> Result<(), TellError<M>> {
        LocalAddr::tell(self, msg)
    }

    fn id(&self) -> ActorId {
        self.addr().id()
    }
}

impl<A, M> Deliver<M> for Addr<A>
where
    A: Actor + Accepts<M>,
    M: Message + Send,
    M::Reply: Send,
    A::Envelope: Send,
{
    #[inline]
    fn tell(&self, msg: M) -> Result<(), TellError<M>> {
        Addr::tell(self, msg)
    }

    fn try_tell(&self, msg: M) -> Result<(), TellError<M>> {
        Addr::try_tell(self, msg)
    }

    fn poll_room(&self, room: &mut RoomWait<'_>, cx: &mut Context<'_>) -> Poll<bool> {
        Addr::poll_room(self, room, cx)
    }

    fn deliver(&self, msg: M) -> Result<(), TellError<M>> {
        self.deliver_msg(msg)
    }

    fn ask(&self, msg: M) -> Reply<M::Reply> {
        Addr::ask(self, msg)
    }

    fn system(&self) -> &SystemShared {
        self.system.arc()
    }

    fn id(&self) -> ActorId {
        Addr::id(self)
    }

    fn shard(&self) -> ShardId {
        Addr::shard(self)
    }

    fn actor_type(&self) -> &'static str {
        std::any::type_name::<A>()
    }

    fn local(&self) -> Option<Box<dyn LocalTell<M>>> {
        Addr::local(self)
            .ok()
            .map(|l| Box::new(l) as Box<dyn LocalTell<M>>)
    }
}

impl<M: Message + Send> Recipient<M>
where
    M::Reply: Send,
{
    /// Sends `msg` without waiting for a reply (see [`Addr::tell`]).
    ///
    /// # Errors
    ///
    /// As [`Addr::tell`].
    #[inline]
    pub fn tell(&self, msg: M) -> Result<(), TellError<M>> {
        self.addr.tell(msg)
    }

    /// Sends `msg` if there is room, never waiting (see [`Addr::try_tell`]).
    ///
    /// # Errors
    ///
    /// As [`Addr::try_tell`].
    pub fn try_tell(&self, msg: M) -> Result<(), TellError<M>> {
        self.addr.try_tell(msg)
    }

    /// Sends `msg`, waiting for room (see [`Addr::send`]).
    ///
    /// # Errors
    ///
    /// As [`Addr::send`].
    pub async fn send(&self, msg: M) -> Result<(), TellError<M>> {
        let mut room = RoomWait::new(self.addr.system());
        let placed = poll_fn(|cx| self.addr.poll_room(&mut room, cx)).await;
        drop(room);
        if !placed {
            return Err(TellError::ShuttingDown(msg));
        }
        self.addr.deliver(msg)
    }

    /// Sends `msg` and returns the future of its reply (see [`Addr::ask`]).
    pub fn ask(&self, msg: M) -> Reply<M::Reply> {
        self.addr.ask(msg)
    }
}

impl<M: Message> Recipient<M> {
    /// The actor's identity: two recipients of one actor (made from any of
    /// its references) have the same.
    pub fn id(&self) -> ActorId {
        self.addr.id()
    }

    /// The shard the actor lives on (or will be activated on).
    pub fn shard(&self) -> ShardId {
        self.addr.shard()
    }

    /// The id of the actor system the actor belongs to.
    pub(crate) fn system_id(&self) -> u64 {
        self.addr.system().id
    }

    /// A lookup-free sender to the actor, on the actor's shard (activating
    /// a keyed one); `None` elsewhere or when it stopped.
    pub(crate) fn local(&self) -> Option<Box<dyn LocalTell<M>>> {
        self.addr.local()
    }
}

impl<A, M> From<Addr<A>> for Recipient<M>
where
    A: Actor + Accepts<M>,
    M: Message + Send,
    M::Reply: Send,
    A::Envelope: Send,
{
    fn from(addr: Addr<A>) -> Self {
        Recipient {
            addr: Arc::new(addr),
        }
    }
}

impl<A: Actor> Addr<A> {
    /// This reference as a [`Recipient`] of `M`.
    pub fn recipient<M>(&self) -> Recipient<M>
    where
        A: Accepts<M>,
        M: Message + Send,
        M::Reply: Send,
        A::Envelope: Send,
    {
        Recipient::from(self.clone())
    }
}

impl<M: Message> Clone for Recipient<M> {
    fn clone(&self) -> Self {
        Recipient {
            addr: self.addr.clone(),
        }
    }
}

impl<M: Message> fmt::Debug for Recipient<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Recipient")
            .field("message", &std::any::type_name::<M>())
            .field("actor", &self.addr.actor_type())
            .field("id", &self.addr.id())
            .finish()
    }
}
