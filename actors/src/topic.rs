//! Publish/subscribe across shards: a [`Topic<M>`] that any actor handling
//! `M` subscribes to through its [`Recipient<M>`].
//!
//! Subscribers are kept per shard, on the shard the subscriber lives on. A
//! publish sends one job to each shard that has subscribers (one clone of
//! the message per shard, one cross-shard hand-over per shard, however many
//! subscribers live there); the job then tells each of that shard's
//! subscribers locally, through senders resolved once per change of the
//! shard's subscribers (a `LocalAddr` each: no lookup per delivery). A publisher's messages reach each subscriber in the
//! order published.
//!
//! A change of subscribers applies to the deliveries that start after it
//! on the subscriber's shard: a publish already on its way may or may not
//! reach an actor subscribed or unsubscribed meanwhile.
//!
//! Ends of a subscription: [`Topic::unsubscribe`]; an unkeyed subscriber
//! that stopped is dropped by the first publish that finds it stopped. A
//! keyed subscriber is a key, not an activation: it stays subscribed across
//! passivation, and a publish activates it again (as any message to its key
//! would).

use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use mailring::ShardId;

use crate::actor::Message;
use crate::addr::ActorId;
use crate::error::{SubscribeError, TellError};
use crate::recipient::{LocalTell, Recipient};
use crate::system::SystemShared;

/// A topic of messages of type `M`: publish once, every subscriber gets a
/// clone. `Clone + Send + Sync`; clones are the same topic. Get one with
/// [`SystemHandle::topic`](crate::SystemHandle::topic) (a new topic) or
/// [`SystemHandle::named_topic`](crate::SystemHandle::named_topic) (the
/// system's topic of that name and type).
///
/// # Examples
///
/// ```
/// use mailring_actors::{Actor, ActorSystem, Ctx, Handler, Message, Placement, Runtime, Topic};
///
/// #[derive(Message, Clone)]
/// struct Price(u64);
///
/// #[derive(Message)]
/// #[message(reply = u64)]
/// struct Last;
///
/// #[derive(Actor, Default)]
/// #[actor(handles(Price, Last))]
/// struct Ticker(u64);
///
/// impl Handler<Price> for Ticker {
///     async fn handle(&mut self, p: Price, _cx: &mut Ctx<Self>) {
///         self.0 = p.0;
///     }
/// }
/// impl Handler<Last> for Ticker {
///     async fn handle(&mut self, _m: Last, _cx: &mut Ctx<Self>) -> u64 {
///         self.0
///     }
/// }
///
/// let system = ActorSystem::start(Runtime::builder().shards(2))?;
/// let prices: Topic<Price> = system.handle().topic();
/// let tickers: Vec<_> = (0..4)
///     .map(|_| system.spawn_actor(Placement::RoundRobin, Ticker::default))
///     .collect();
/// for t in &tickers {
///     prices.subscribe(t.recipient());
/// }
/// prices.publish(Price(42));
/// let last = system.block_on(async move {
///     let mut last = Vec::new();
///     for t in &tickers {
///         last.push(t.ask(Last).await.unwrap());
///     }
///     last
/// });
/// assert_eq!(last, [42; 4]);
/// # system.shutdown();
/// # Ok::<(), mailring::BuildError>(())
/// ```
pub struct Topic<M: Message> {
    shared: Arc<TopicShared<M>>,
}

/// Topic ids, for the shards' caches.
static NEXT_TOPIC: AtomicU64 = AtomicU64::new(1);

struct TopicShared<M: Message> {
    id: u64,
    system: Arc<SystemShared>,
    /// Subscribers by the shard they live on.
    shards: Box<[ShardSubscribers<M>]>,
}

struct ShardSubscribers<M: Message> {
    /// Subscribers, for the publishers to skip a shard without any.
    count: AtomicUsize,
    /// Bumped under the lock at every change of `list`: a shard's cache
    /// built at an older generation is rebuilt before it delivers.
    generation: AtomicU64,
    list: Mutex<Subscribers<M>>,
}

struct Subscribers<M: Message> {
    /// In subscription order.
    live: Vec<Recipient<M>>,
    ids: HashSet<ActorId>,
}

/// One shard's subscribers of one topic, resolved to local senders (kept in
/// the shard's actor registry, dropped with the topic or at shutdown).
struct LocalSubscribers<M: Message> {
    /// The generation it was built at (0: never built).
    generation: u64,
    senders: Vec<Sender<M>>,
}

impl<M: Message> Default for LocalSubscribers<M> {
    fn default() -> Self {
        LocalSubscribers {
            generation: 0,
            senders: Vec::new(),
        }
    }
}

/// How a delivery reaches one subscriber.
enum Sender<M: Message> {
    /// On its shard, without a lookup.
    Local(Box<dyn LocalTell<M>>),
    /// Through its `Recipient` (a subscriber that could not be resolved
    /// here; its sends say why).
    Recipient(Recipient<M>),
}

impl<M: Message + Send> Sender<M>
where
    M::Reply: Send,
{
    #[inline]
    fn tell(&self, msg: M) -> Result<(), TellError<M>> {
        match self {
            Sender::Local(l) => l.tell(msg),
            Sender::Recipient(r) => r.tell(msg),
        }
    }

    fn id(&self) -> ActorId {
        match self {
            Sender::Local(l) => l.id(),
            Sender::Recipient(r) => r.id(),
        }
    }
}

impl<M: Message + Clone + Send> Topic<M>
where
    M::Reply: Send,
{
    pub(crate) fn new(system: Arc<SystemShared>) -> Self {
        let n = system.handle.shards();
        let shards = (0..n)
            .map(|_| ShardSubscribers {
                count: AtomicUsize::new(0),
                generation: AtomicU64::new(1),
                list: Mutex::new(Subscribers {
                    live: Vec::new(),
                    ids: HashSet::new(),
                }),
            })
            .collect();
        Topic {
            shared: Arc::new(TopicShared {
                id: NEXT_TOPIC.fetch_add(1, Ordering::Relaxed),
                system,
                shards,
            }),
        }
    }

    /// Subscribes an actor (an `Addr`, a `KeyedRef` or a `Recipient`);
    /// returns `false` if it was not added: it was subscribed already (it
    /// still gets each message once), or it could not be (see
    /// [`try_subscribe`](Self::try_subscribe), which says why).
    pub fn subscribe(&self, subscriber: impl Into<Recipient<M>>) -> bool {
        self.try_subscribe(subscriber).is_ok()
    }

    /// Subscribes an actor (an `Addr`, a `KeyedRef` or a `Recipient`) of
    /// the topic's own actor system.
    ///
    /// # Errors
    ///
    /// [`SubscribeError::AlreadySubscribed`] when it is subscribed already
    /// (it still gets each message once); [`SubscribeError::OtherSystem`]
    /// for an actor of another system (ids are unique only within one:
    /// the topic could not tell it from its own); and
    /// [`SubscribeError::NoSuchShard`] for a keyed type pinned past the
    /// system's last shard, which never runs.
    pub fn try_subscribe(&self, subscriber: impl Into<Recipient<M>>) -> Result<(), SubscribeError> {
        let r: Recipient<M> = subscriber.into();
        let id = r.id();
        if r.system_id() != self.shared.system.id {
            return Err(SubscribeError::OtherSystem { id });
        }
        let Some(shard) = self.shared.shards.get(r.shard().index()) else {
            return Err(SubscribeError::NoSuchShard {
                id,
                shard: r.shard().index(),
            });
        };
        let mut list = shard.list.lock().unwrap_or_else(|p| p.into_inner());
        if !list.ids.insert(id) {
            return Err(SubscribeError::AlreadySubscribed { id });
        }
        list.live.push(r);
        shard.count.fetch_add(1, Ordering::Relaxed);
        shard.generation.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Ends the subscription of the actor `id` (see [`Recipient::id`],
    /// [`Addr::id`](crate::Addr::id)); returns whether it was subscribed.
    pub fn unsubscribe(&self, id: ActorId) -> bool {
        for shard in self.shared.shards.iter() {
            let mut list = shard.list.lock().unwrap_or_else(|p| p.into_inner());
            if list.ids.remove(&id) {
                list.live.retain(|r| r.id() != id);
                shard.count.fetch_sub(1, Ordering::Relaxed);
                shard.generation.fetch_add(1, Ordering::Release);
                return true;
            }
        }
        false
    }

    /// How many actors are subscribed.
    pub fn subscriber_count(&self) -> usize {
        self.shared
            .shards
            .iter()
            .map(|s| s.count.load(Ordering::Relaxed))
            .sum()
    }

    /// Sends a clone of `msg` to every subscriber: on each shard that has
    /// subscribers, one hand-over carrying one clone, told there to each
    /// subscriber. Never waits (as `tell`); from any shard or thread.
    pub fn publish(&self, msg: M) {
        let here = self.shared.system.handle.local_shard().map(ShardId::index);
        let mut busy = self
            .shared
            .shards
            .iter()
            .enumerate()
            .filter(|(_, s)| s.count.load(Ordering::Relaxed) > 0)
            .map(|(i, _)| i)
            .peekable();
        let mut local = false;
        let mut msg = Some(msg);
        let mut handed_over = false;
        while let Some(i) = busy.next() {
            if Some(i) == here {
                local = true;
                continue;
            }
            // The last destination takes the message itself, unless this
            // shard (seen before it) still needs it.
            let copy = if busy.peek().is_none() && !local {
                msg.take().expect("taken once, last")
            } else {
                msg.as_ref().expect("present until the last").clone()
            };
            if !handed_over {
                // What this task sent earlier through the actor layer's
                // batches goes ahead of the publish, in the order sent.
                mailring::hand_over_batches();
                handed_over = true;
            }
            let shared = self.shared.clone();
            self.shared
                .system
                .handle
                .run_on(ShardId::new(i), move || shared.deliver_here(i, copy));
        }
        if let (true, Some(h), Some(m)) = (local, here, msg) {
            self.shared.deliver_here(h, m);
        }
    }
}

impl<M: Message + Clone + Send> TopicShared<M>
where
    M::Reply: Send,
{
    /// Tells each subscriber living on shard `shard` (the calling one).
    fn deliver_here(&self, shard: usize, msg: M) {
        let subs = &self.shards[shard];
        let Some(cache) = crate::local::topic_cache::<LocalSubscribers<M>>(&self.system, self.id)
        else {
            return; // The system is closing: nothing is delivered any more.
        };
        // Taken out while telling: a message's `Drop` that publishes here
        // again finds an empty cache and builds its own.
        let mut local = std::mem::take(&mut *cache.borrow_mut());
        if local.generation != subs.generation.load(Ordering::Acquire) {
            let list = subs.list.lock().unwrap_or_else(|p| p.into_inner());
            local.generation = subs.generation.load(Ordering::Acquire);
            local.senders = list
                .live
                .iter()
                .map(|r| match r.local() {
                    Some(l) => Sender::Local(l),
                    None => Sender::Recipient(r.clone()),
                })
                .collect();
        }
        let mut stopped = Vec::new();
        if let Some((last, rest)) = local.senders.split_last() {
            for s in rest {
                if tell_guarded(s, || msg.clone()) {
                    stopped.push(s.id());
                }
            }
            let mut msg = Some(msg);
            if tell_guarded(last, || msg.take().expect("taken once")) {
                stopped.push(last.id());
            }
        }
        if !stopped.is_empty() {
            let stopped: HashSet<ActorId> = stopped.into_iter().collect();
            let mut list = subs.list.lock().unwrap_or_else(|p| p.into_inner());
            for id in &stopped {
                if list.ids.remove(id) {
                    subs.count.fetch_sub(1, Ordering::Relaxed);
                }
            }
            list.live.retain(|r| !stopped.contains(&r.id()));
            let before = subs.generation.fetch_add(1, Ordering::Release);
            // Nothing else changed since the cache was built: drop the same
            // senders from it rather than rebuilding it whole at the next
            // publish (subscribers stopping one by one would rebuild it
            // once per stop).
            if before == local.generation {
                local.senders.retain(|s| !stopped.contains(&s.id()));
                local.generation = before + 1;
            }
        }
        *cache.borrow_mut() = local;
    }
}

/// Tells `sender` the copy `copy` makes; whether it had stopped. User code
/// runs here (the message's `Clone`, and the `Drop` of a copy a stopped
/// subscriber hands back): a panic in it is caught and reported, and the
/// subscribers after this one still get their copies.
fn tell_guarded<M: Message + Send>(sender: &Sender<M>, copy: impl FnOnce() -> M) -> bool
where
    M::Reply: Send,
{
    let told = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sender.tell(copy())));
    match told {
        Ok(Ok(())) => false,
        Ok(Err(refused)) => {
            let stopped = matches!(refused, TellError::Stopped(_));
            if let Err(payload) =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(refused)))
            {
                mailring::panic::report_caught(mailring::panic::CallbackKind::Drop, &*payload);
                mailring::panic::drop_payload(payload);
            }
            stopped
        }
        Err(payload) => {
            mailring::panic::report_caught(mailring::panic::CallbackKind::Handler, &*payload);
            mailring::panic::drop_payload(payload);
            false
        }
    }
}

impl<M: Message> Drop for TopicShared<M> {
    fn drop(&mut self) {
        // Each shard that may have built a cache of this topic forgets it.
        if self.system.is_closed() {
            return;
        }
        for i in 0..self.shards.len() {
            let (system, id) = (self.system.clone(), self.id);
            self.system.handle.run_on(ShardId::new(i), move || {
                crate::local::forget_topic_cache(&system, id)
            });
        }
    }
}

impl<M: Message> Clone for Topic<M> {
    fn clone(&self) -> Self {
        Topic {
            shared: self.shared.clone(),
        }
    }
}

impl<M: Message> fmt::Debug for Topic<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Topic")
            .field("message", &std::any::type_name::<M>())
            .finish_non_exhaustive()
    }
}
