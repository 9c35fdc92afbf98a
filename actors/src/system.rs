//! The actor system: a [`mailring::Runtime`] plus what its actors share
//! across shards (factories, stealable directories, bounded-mailbox counts,
//! the name registry) and the graceful shutdown.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::task::Waker;
use std::time::Duration;

use mailring::{BuildError, Builder, Handle, Placement, Runtime, ShardId, ShutdownReport};

use crate::actor::{Actor, ActorPlacement, Message};
use crate::addr::{Addr, LocalActors};
use crate::capacity::Capacity;
use crate::error::{PlaceError, RunNowError, StopReason};
use crate::local;
use crate::replica::ReplicaRef;
use crate::route::Directory;
use crate::stats::{ActorStats, ActorTypeStats};

static NEXT_SYSTEM_ID: AtomicU64 = AtomicU64::new(1);

type Factory<A> = Arc<dyn Fn(&<A as Actor>::Key) -> A + Send + Sync>;
type AnyMap = HashMap<TypeId, Arc<dyn Any + Send + Sync>>;
/// A registered name: the actor type and its `Addr`.
type NamedAddr = (TypeId, Box<dyn Any + Send + Sync>);

/// What the shards of one system share.
pub(crate) struct SystemShared {
    pub(crate) id: u64,
    pub(crate) handle: Handle,
    pub(crate) ask_timeout: Option<Duration>,
    pub(crate) cross_shard_window: u32,
    /// The first of the system's credit tags (see `flow`).
    pub(crate) credit_base: u16,
    next_uid: AtomicU64,
    /// The turn of `Placement::RoundRobin`, apart from the uids (a spawn also
    /// takes a uid, so sharing that counter skipped every other shard).
    next_round_robin: AtomicUsize,
    /// Shared with each shard's credit flow (see `crate::flow`).
    pub(crate) shutting_down: Arc<AtomicBool>,
    closed: AtomicBool,
    factories: RwLock<AnyMap>,
    /// One bit per actor type slot: a factory is registered (what a send
    /// to a keyed type without `activate` checks; slots past the bitmap
    /// look in `factories`).
    factory_bits: Box<[AtomicU64]>,
    directories: Mutex<AnyMap>,
    capacities: Mutex<AnyMap>,
    names: Mutex<HashMap<String, NamedAddr>>,
    /// Senders waiting for room in a bounded mailbox ([`RoomWait`]): woken
    /// when the system starts shutting down, as an abandoned actor never
    /// frees its places.
    /// The wakers of the senders waiting for room (to wake at shutdown).
    room_waiters: Mutex<mailring::sync::WaitList>,
    /// Set by [`SystemHandle::request_shutdown`]; what
    /// [`ActorSystem::wait_for_shutdown_request`] waits on.
    shutdown_requested: Mutex<bool>,
    /// Named topics, by message type and name.
    topics: Mutex<HashMap<(TypeId, String), Box<dyn Any + Send + Sync>>>,
    shutdown_request: std::sync::Condvar,
}

/// A sender's registration to be woken when the system starts shutting
/// down while it waits for room in a bounded mailbox (see
/// [`crate::Addr::send`]); freed when dropped.
pub(crate) struct RoomWait<'a> {
    shared: &'a SystemShared,
    slot: Option<mailring::sync::WaitKey>,
    /// Its wait for credit on a cross-shard window, taken back when dropped.
    pub(crate) credit: crate::flow::CreditWait,
    /// Its listing among the senders waiting for room in a bounded
    /// mailbox, taken back when dropped.
    pub(crate) place: PlaceWait,
}

/// A sender's listing among those waiting for room in one bounded mailbox
/// (see [`crate::capacity::Capacity::poll_acquire`]); dropped, it takes
/// its waker back, so a send given up at a full mailbox holds no task.
#[derive(Default)]
pub(crate) struct PlaceWait {
    listed: Option<(Arc<crate::capacity::Capacity>, mailring::sync::WaitKey)>,
}

impl PlaceWait {
    /// Takes a place in `capacity`, or lists `cx` to be woken when one
    /// frees.
    pub(crate) fn poll_acquire(
        &mut self,
        capacity: &Arc<crate::capacity::Capacity>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        let mut key = match self.listed.take() {
            Some((listed_in, key)) if Arc::ptr_eq(&listed_in, capacity) => Some(key),
            Some((other, key)) => {
                other.forget(&mut Some(key));
                None
            }
            None => None,
        };
        let polled = capacity.poll_acquire(cx, &mut key);
        self.listed = key.map(|k| (capacity.clone(), k));
        polled
    }
}

impl Drop for PlaceWait {
    fn drop(&mut self) {
        if let Some((capacity, key)) = self.listed.take() {
            capacity.forget(&mut Some(key));
        }
    }
}

impl<'a> RoomWait<'a> {
    pub(crate) fn new(shared: &'a SystemShared) -> Self {
        RoomWait {
            shared,
            slot: None,
            credit: Default::default(),
            place: Default::default(),
        }
    }

    /// Registers `waker` to be woken when the system starts shutting down;
    /// whether it already is. The shutdown sets its flag and takes the
    /// waiters under the lock this reads the flag under, so a shutdown
    /// either came first (and this says so) or wakes `waker` (its wake
    /// ends every key: none taken before names anything then).
    pub(crate) fn register(&mut self, waker: &Waker) -> bool {
        let replaced = {
            let mut w = self
                .shared
                .room_waiters
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if self.shared.is_shutting_down() {
                return true;
            }
            w.register(&mut self.slot, waker)
        };
        // Dropped with the lock released.
        drop(replaced);
        false
    }
}

impl Drop for RoomWait<'_> {
    fn drop(&mut self) {
        crate::local::forget_credit_wait(self.shared.id, &mut self.credit);
        if self.slot.is_some() {
            let waker = self
                .shared
                .room_waiters
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&mut self.slot);
            // Dropped with the lock released.
            drop(waker);
        }
    }
}

impl fmt::Debug for SystemShared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SystemShared")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// A counted reference to a system's shared state that is cheap to take on
/// a shard.
///
/// An `Arc<SystemShared>` has one reference count, which every thread that
/// builds a reference (`SystemHandle::keyed` per send is the common case)
/// would increment and decrement: two contended atomic operations per send
/// when several shards do it at once (measured: 27 ns per clone and drop on
/// two threads, against 5 ns uncontended). On a shard of the system, a
/// `SystemRef` instead counts on that shard's own replica, with a plain
/// increment on the shard's thread and an atomic one elsewhere
/// ([`crate::replica`]); off the system's shards it holds the shared `Arc`.
pub(crate) struct SystemRef(SystemRefInner);

enum SystemRefInner {
    /// Counted on a shard's replica.
    Replica(ReplicaRef),
    /// Counted on the shared state itself (off the system's shards).
    Shared(Arc<SystemShared>),
}

impl SystemRef {
    /// A reference counted on the calling shard's replica when the caller
    /// runs on a shard of this system.
    #[inline]
    pub(crate) fn here(shared: &Arc<SystemShared>) -> SystemRef {
        match ReplicaRef::here(shared) {
            Some(r) => SystemRef(SystemRefInner::Replica(r)),
            None => SystemRef(SystemRefInner::Shared(shared.clone())),
        }
    }

    /// The shared state's own `Arc`.
    #[inline]
    pub(crate) fn arc(&self) -> &Arc<SystemShared> {
        match &self.0 {
            SystemRefInner::Replica(r) => r.shared(),
            SystemRefInner::Shared(s) => s,
        }
    }
}

impl Clone for SystemRef {
    /// Counts the copy on the calling shard's replica when there is one.
    #[inline]
    fn clone(&self) -> Self {
        SystemRef::here(self.arc())
    }
}

impl std::ops::Deref for SystemRef {
    type Target = SystemShared;

    #[inline]
    fn deref(&self) -> &SystemShared {
        self.arc()
    }
}

impl SystemShared {
    /// The shared state of a new system over `handle`'s runtime.
    pub(crate) fn new(
        handle: Handle,
        config: &SystemConfig,
        credit_base: u16,
    ) -> Arc<SystemShared> {
        Arc::new(SystemShared {
            id: NEXT_SYSTEM_ID.fetch_add(1, Ordering::Relaxed),
            handle,
            ask_timeout: config.ask_timeout,
            cross_shard_window: config.cross_shard_window,
            credit_base,
            next_uid: AtomicU64::new(1),
            next_round_robin: AtomicUsize::new(0),
            shutting_down: Arc::new(AtomicBool::new(false)),
            closed: AtomicBool::new(false),
            factories: RwLock::new(HashMap::new()),
            factory_bits: (0..64).map(|_| AtomicU64::new(0)).collect(),
            directories: Mutex::new(HashMap::new()),
            capacities: Mutex::new(HashMap::new()),
            names: Mutex::new(HashMap::new()),
            room_waiters: Mutex::new(mailring::sync::WaitList::new()),
            shutdown_requested: Mutex::new(false),
            topics: Mutex::new(HashMap::new()),
            shutdown_request: std::sync::Condvar::new(),
        })
    }

    /// Marks the system shutting down and wakes the senders waiting for
    /// room in a bounded mailbox (they then fail with `ShuttingDown`).
    fn begin_shutdown(&self) {
        let woken = {
            let mut w = self.room_waiters.lock().unwrap_or_else(|p| p.into_inner());
            self.shutting_down.store(true, Ordering::Release);
            w.take_all()
        };
        woken.wake();
    }

    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    pub(crate) fn next_uid(&self) -> u64 {
        self.next_uid.fetch_add(1, Ordering::Relaxed) | (1 << 63)
    }

    /// The next shard in turn of `shards` for `Placement::RoundRobin`.
    pub(crate) fn next_round_robin(&self, shards: usize) -> usize {
        self.next_round_robin.fetch_add(1, Ordering::Relaxed) % shards.max(1)
    }

    pub(crate) fn factory<A: Actor>(&self) -> Option<Factory<A>> {
        let map = self.factories.read().unwrap_or_else(|p| p.into_inner());
        map.get(&TypeId::of::<A>())
            .and_then(|f| f.downcast_ref::<Factory<A>>())
            .cloned()
    }

    /// Whether a factory is registered for `A`.
    #[inline]
    pub(crate) fn has_factory<A: Actor>(&self) -> bool {
        let slot = A::__slot().index();
        match self.factory_bits.get(slot / 64) {
            Some(word) => word.load(Ordering::Acquire) & (1 << (slot % 64)) != 0,
            None => self.factory::<A>().is_some(),
        }
    }

    pub(crate) fn directory<A: Actor>(&self) -> Arc<Directory> {
        let mut map = self.directories.lock().unwrap_or_else(|p| p.into_inner());
        let entry = map
            .entry(TypeId::of::<A>())
            .or_insert_with(|| Arc::new(Directory::new()));
        entry.clone().downcast::<Directory>().expect("a directory")
    }

    /// The shared count of a keyed actor's bounded mailbox: one per key,
    /// held by every reference to the key and by its activation.
    ///
    /// The map forgets a count that nothing else holds and that counts no
    /// message (checked under its lock, through which alone a new holder can
    /// appear), whenever it has doubled since it last looked: keys that come
    /// and go do not pin a count each for the system's lifetime.
    pub(crate) fn keyed_capacity<A: Actor>(&self, key: &A::Key, cap: usize) -> Arc<Capacity> {
        let caps = self.keyed_capacities::<A>();
        let mut caps = caps.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = caps.counts.get(key) {
            return c.clone();
        }
        if caps.counts.len() >= caps.prune_at {
            // `get_mut` succeeds only for a count nothing else holds, and
            // (unlike a relaxed `strong_count`) orders the depth read after
            // the last holder's release of it.
            caps.counts
                .retain(|_, c| Arc::get_mut(c).is_none() || !c.is_idle());
            caps.prune_at = (caps.counts.len() * 2).max(KEYED_CAPACITIES_FIRST_PRUNE);
        }
        let c = Capacity::new(cap);
        caps.counts
            .insert(mailring::RouteKey::detached(key), c.clone());
        c
    }

    /// The key's bounded-mailbox count if the system has one (a count that
    /// was forgotten held no place).
    pub(crate) fn existing_keyed_capacity<A: Actor>(&self, key: &A::Key) -> Option<Arc<Capacity>> {
        let caps = self.keyed_capacities::<A>();
        let caps = caps.lock().unwrap_or_else(|p| p.into_inner());
        caps.counts.get(key).cloned()
    }

    /// The bounded-mailbox counts of keyed type `A`.
    fn keyed_capacities<A: Actor>(&self) -> Arc<Mutex<KeyedCapacities<A::Key>>> {
        let mut map = self.capacities.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(TypeId::of::<A>())
            .or_insert_with(|| Arc::new(Mutex::new(KeyedCapacities::<A::Key>::default())))
            .clone()
            .downcast::<Mutex<KeyedCapacities<A::Key>>>()
            .expect("capacity map of the right key type")
    }
}

/// Size of a type's keyed-capacity map at which it first drops unused counts.
const KEYED_CAPACITIES_FIRST_PRUNE: usize = 1024;

/// The bounded-mailbox counts of one keyed actor type.
struct KeyedCapacities<K> {
    counts: HashMap<K, Arc<Capacity>>,
    /// Size at which the next insertion first drops unused counts.
    prune_at: usize,
}

impl<K> Default for KeyedCapacities<K> {
    fn default() -> Self {
        KeyedCapacities {
            counts: HashMap::new(),
            prune_at: KEYED_CAPACITIES_FIRST_PRUNE,
        }
    }
}

/// Settings of an [`ActorSystem`] beyond the runtime's.
#[derive(Debug, Clone)]
pub struct SystemConfig {
    /// The default deadline of every `ask` (`None`, the default: wait as long
    /// as the actor lives; an ask to a stopped or panicking actor fails at
    /// once, and these ask cycles are detected and fail one ask with
    /// [`AskError::WouldDeadlock`](crate::AskError::WouldDeadlock), so no
    /// deadline is needed for them: an actor asking itself; a cycle along
    /// one ask chain (C asks B, B's handler asks A, A's handler asks C); and two
    /// handlers blocked on asks to each other, on any shards (A's handler
    /// asks B while B's asks A, both from tells).
    ///
    /// A deadline is still needed for cycles of three or more actors whose
    /// hops each start from a tell handler (A's handler asks B, B's asks C,
    /// C's asks A), and for waits through something other than asks (a
    /// channel fed by another actor). Asks made inside the future given to
    /// [`Ctx::wait_for`](crate::Ctx::wait_for) and asks from outside actors
    /// are not blocked waits: they are never refused, and wait as long as
    /// the actor they ask takes. (An ask the handler made itself carries
    /// the handler's actor on its chain, even if its reply is then handed
    /// to `wait_for`.)
    pub ask_timeout: Option<Duration>,
    /// How long [`ActorSystem::shutdown`] waits for actors to run `on_stop`
    /// (default 5 s); past it, the actors still running are abandoned. A
    /// shard thread stuck in a handler that never yields (a blocking loop)
    /// is waited for as long again, then detached (see
    /// [`mailring::Runtime::shutdown_timeout`]), so a shutdown takes about
    /// twice this at most. `Duration::MAX` waits for everything.
    pub shutdown_grace: Duration,
    /// The most messages one shard may have sent to the actors of another
    /// shard that they have not taken from their mailboxes yet (default
    /// 65 536; at least 1). Past it, [`Addr::send`](crate::Addr::send) waits
    /// for credit and [`Addr::try_tell`](crate::Addr::try_tell) gives the
    /// message back as [`TellError::Full`](crate::TellError::Full); `tell`
    /// and `ask` are counted but never held back. Credits come back through
    /// the runtime's coalesced hot counters, on tags the system registers
    /// at start (one per shard, with `Handle::register_hot_tags`, so two
    /// systems on one runtime never share one). (A runtime
    /// `hot_counter_wake_threshold` above half the window delays a held
    /// sender's wake-up until its shard has nothing else to do or another
    /// send takes the credits.)
    ///
    /// The window is shared by all actors of the receiving shard: inside
    /// handlers prefer `tell`/`try_tell`, since handlers that `send().await`
    /// to each other's shards can wait on each other's windows (see the
    /// actors guide, "Flow control between shards").
    pub cross_shard_window: u32,
}

impl Default for SystemConfig {
    fn default() -> Self {
        SystemConfig {
            ask_timeout: None,
            shutdown_grace: Duration::from_secs(5),
            cross_shard_window: DEFAULT_CROSS_SHARD_WINDOW,
        }
    }
}

/// The default [`SystemConfig::cross_shard_window`]: large enough that
/// bursts of `send` keep both shards busy, small enough to bound what one
/// shard can queue for a saturated one.
const DEFAULT_CROSS_SHARD_WINDOW: u32 = 1 << 16;

/// A running actor system: shards, and the actors placed on them.
///
/// ```
/// use mailring_actors::{Actor, ActorSystem, Ctx, Handler, Message, Runtime};
///
/// #[derive(Actor, Default)]
/// #[actor(key = u64, activate = Counter::new, handles(Add))]
/// struct Counter { total: u64 }
/// impl Counter { fn new(_: &u64) -> Self { Counter::default() } }
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
/// let counter = system.keyed::<Counter>(7);
/// let total = system.block_on(async move {
///     counter.tell(Add(1)).unwrap();
///     counter.ask(Add(2)).await.unwrap()
/// });
/// assert_eq!(total, 3);
/// system.shutdown();
/// # Ok::<(), mailring::BuildError>(())
/// ```
pub struct ActorSystem {
    shared: Arc<SystemShared>,
    /// The runtime, when the system started it (`start`); `None` on a
    /// runtime started elsewhere (`start_on`), which outlives the system.
    runtime: Option<Runtime>,
    /// Until shutdown begins.
    live: bool,
    grace: Duration,
}

impl fmt::Debug for ActorSystem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ActorSystem")
            .field("id", &self.shared.id)
            .field("shards", &self.shared.handle.shards())
            .finish_non_exhaustive()
    }
}

impl ActorSystem {
    /// Starts the runtime `builder` describes and an actor system on it.
    ///
    /// # Errors
    ///
    /// The runtime's [`BuildError`] (io_uring unavailable, ...).
    pub fn start(builder: Builder) -> Result<ActorSystem, BuildError> {
        Self::start_with(builder, SystemConfig::default())
    }

    /// As [`ActorSystem::start`], with system settings.
    ///
    /// # Errors
    ///
    /// The runtime's [`BuildError`].
    pub fn start_with(builder: Builder, config: SystemConfig) -> Result<ActorSystem, BuildError> {
        let runtime = builder.build()?;
        let credit_base = register_credit_tags(runtime.handle())
            .expect("a fresh runtime has every dynamic hot tag left");
        let handle = runtime.handle().clone();
        Ok(Self::start_inner(
            &handle,
            Some(runtime),
            config,
            credit_base,
        ))
    }

    /// Starts an actor system on a runtime that is already running (the one
    /// of `#[mailring::main]`, or one shared with other layers), on its
    /// threads: no second set of shards. The runtime outlives the system:
    /// [`shutdown`](Self::shutdown) stops the actors and leaves it running.
    /// Several systems may share one runtime. Callable from any thread or
    /// shard; it never waits.
    ///
    /// # Errors
    ///
    /// [`HotTagError::Exhausted`](mailring::hot::HotTagError::Exhausted):
    /// the runtime has no room left for the system's credit tags (one per
    /// shard; thousands of systems run on it at once). A system whose
    /// shutdown ended all its actors gives its tags back (the shutdown
    /// waits up to two seconds for the runtime to take them), so systems
    /// started and stopped in turn never run out; one whose shutdown left
    /// actors running, or a shard unheard from, keeps them for good (those
    /// actors could still hand credits back through them).
    ///
    /// # Examples
    ///
    /// One runtime, one set of threads, from `#[mailring::main]`:
    ///
    /// ```
    /// use mailring_actors::{Actor, ActorSystem, Ctx, Handler, Message, Placement, SystemConfig};
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
    ///     async fn handle(&mut self, _m: Ping, _cx: &mut Ctx<Self>) -> u8 { 7 }
    /// }
    ///
    /// #[mailring::main(shards = 2)]
    /// async fn main() {
    ///     let handle = mailring::Handle::current();
    ///     let system = ActorSystem::start_on(&handle, SystemConfig::default()).unwrap();
    ///     let pinger = system.spawn_actor(Placement::RoundRobin, Pinger::default);
    ///     assert_eq!(pinger.ask(Ping).await, Ok(7));
    ///     // On a shard, the actors are stopped without blocking it.
    ///     let report = system.shutdown_async().await;
    ///     assert_eq!(report.actors_stopped, 1);
    /// }
    /// ```
    pub fn start_on(
        handle: &Handle,
        config: SystemConfig,
    ) -> Result<ActorSystem, mailring::hot::HotTagError> {
        let credit_base = register_credit_tags(handle)?;
        Ok(Self::start_inner(handle, None, config, credit_base))
    }

    fn start_inner(
        handle: &Handle,
        runtime: Option<Runtime>,
        config: SystemConfig,
        credit_base: u16,
    ) -> ActorSystem {
        let shared = SystemShared::new(handle.clone(), &config, credit_base);
        // Every shard's registry exists before any delivery can reach it
        // (inboxes are FIFO), so deliveries need not carry the system.
        for i in 0..shared.handle.shards() {
            let s = shared.clone();
            shared
                .handle
                .run_on(ShardId::new(i), move || local::install(&s));
        }
        ActorSystem {
            shared,
            runtime,
            live: true,
            grace: config.shutdown_grace,
        }
    }

    /// A cheap handle to this system, usable from any thread and inside actors.
    pub fn handle(&self) -> SystemHandle {
        SystemHandle {
            shared: self.shared.clone(),
        }
    }

    /// The runtime's handle.
    pub fn runtime(&self) -> &Handle {
        &self.shared.handle
    }

    /// Runs `future` on shard 0 and blocks until it finishes.
    ///
    /// The future is built on the calling thread and sent to shard 0, so it
    /// must be `Send`. One that holds a `!Send` value across an `.await` (a
    /// [`LocalAddr`](crate::LocalAddr), an `Rc`) fails to compile with "future
    /// cannot be sent between threads safely": use
    /// [`ActorSystem::block_on_local`], which builds the future on shard 0.
    ///
    /// # Panics
    ///
    /// Called on one of the system's own shards (it would block that shard),
    /// and if `future` panics.
    pub fn block_on<F>(&self, future: F) -> F::Output
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.shared.handle.block_on(future)
    }

    /// Builds a future on shard 0 (it need not be `Send`) and blocks until it
    /// finishes: the way to use a [`LocalAddr`](crate::LocalAddr) of an
    /// actor on shard 0 from outside the shards (see its example).
    ///
    /// # Panics
    ///
    /// As [`ActorSystem::block_on`].
    pub fn block_on_local<G, Fut>(&self, factory: G) -> Fut::Output
    where
        G: FnOnce() -> Fut + Send + 'static,
        Fut: Future + 'static,
        Fut::Output: Send + 'static,
    {
        self.shared.handle.block_on_local(factory)
    }

    /// A reference to the keyed actor `key` of type `A` (see [`SystemHandle::keyed`]).
    pub fn keyed<A: Actor>(&self, key: A::Key) -> Addr<A> {
        Addr::keyed(SystemRef::here(&self.shared), key)
    }

    /// Spawns an unkeyed actor (see [`SystemHandle::spawn_actor`], which
    /// says when it panics).
    pub fn spawn_actor<A, F>(&self, placement: Placement, factory: F) -> Addr<A>
    where
        A: Actor<Key = ()>,
        F: FnMut() -> A + Send + 'static,
    {
        self.handle().spawn_actor(placement, factory)
    }

    /// Registers how keyed actors of type `A` are built (see
    /// [`SystemHandle::register_factory`]).
    pub fn register_factory<A: Actor>(
        &self,
        factory: impl Fn(&A::Key) -> A + Send + Sync + 'static,
    ) {
        self.handle().register_factory(factory)
    }

    /// Blocks the calling thread (not a shard) until some actor, task or
    /// thread calls [`SystemHandle::request_shutdown`], or `limit` passes;
    /// returns whether it was requested. The usual `main` of a server:
    /// start, wait for the request, [`shutdown`](Self::shutdown).
    ///
    /// # Examples
    ///
    /// ```
    /// use mailring_actors::{Actor, ActorSystem, Ctx, Handler, Message, Placement, Runtime};
    ///
    /// #[derive(Actor, Default)]
    /// #[actor(handles(Quit))]
    /// struct Admin;
    ///
    /// #[derive(Message)]
    /// struct Quit;
    ///
    /// impl Handler<Quit> for Admin {
    ///     async fn handle(&mut self, _q: Quit, cx: &mut Ctx<Self>) {
    ///         cx.system().request_shutdown();
    ///     }
    /// }
    ///
    /// let system = ActorSystem::start(Runtime::builder().shards(2))?;
    /// let admin = system.spawn_actor(Placement::RoundRobin, Admin::default);
    /// admin.tell(Quit).unwrap();
    /// assert!(system.wait_for_shutdown_request(None));
    /// let report = system.shutdown();
    /// assert_eq!(report.actors_stopped, 1);
    /// # Ok::<(), mailring::BuildError>(())
    /// ```
    ///
    /// # Panics
    ///
    /// On one of the system's shards, which it would block.
    pub fn wait_for_shutdown_request(&self, limit: Option<Duration>) -> bool {
        assert!(
            mailring::current_shard().is_none(),
            "ActorSystem::wait_for_shutdown_request called on a shard: it would block it"
        );
        let deadline = limit.and_then(|l| std::time::Instant::now().checked_add(l));
        let mut requested = self
            .shared
            .shutdown_requested
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        while !*requested {
            requested = match deadline {
                None => self
                    .shared
                    .shutdown_request
                    .wait(requested)
                    .unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    let left = d.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        return false;
                    }
                    self.shared
                        .shutdown_request
                        .wait_timeout(requested, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
            };
        }
        true
    }

    /// Registers `addr` under `name` (see [`SystemHandle::register_name`]).
    pub fn register_name<A: Actor>(&self, name: impl Into<String>, addr: Addr<A>)
    where
        A::Key: Send,
    {
        self.handle().register_name(name, addr)
    }

    /// The actor registered under `name` (see [`SystemHandle::lookup`]).
    pub fn lookup<A: Actor>(&self, name: &str) -> Option<Addr<A>> {
        self.handle().lookup(name)
    }

    /// Removes a name (see [`SystemHandle::unregister_name`]).
    pub fn unregister_name(&self, name: &str) -> bool {
        self.handle().unregister_name(name)
    }

    /// A new topic (see [`SystemHandle::topic`]).
    pub fn topic<M>(&self) -> crate::Topic<M>
    where
        M: Message + Clone + Send,
        M::Reply: Send,
    {
        self.handle().topic()
    }

    /// The system's topic named `name` (see [`SystemHandle::named_topic`]).
    pub fn named_topic<M>(&self, name: &str) -> crate::Topic<M>
    where
        M: Message + Clone + Send,
        M::Reply: Send,
    {
        self.handle().named_topic(name)
    }

    /// Where the keyed actor `key` lives (see [`SystemHandle::shard_of`]).
    pub fn shard_of<A: Actor>(&self, key: &A::Key) -> ShardId {
        self.handle().shard_of::<A>(key)
    }

    /// Per-shard, per-type actor counters (see [`SystemHandle::stats`]).
    pub fn stats(&self) -> ActorStats {
        let h = self.handle();
        self.block_on(async move { h.stats().await })
    }

    /// Stops every actor (each runs `on_passivate`/`on_stop`; pending asks
    /// fail with `ShuttingDown`), waits up to [`SystemConfig::shutdown_grace`]
    /// for them, then shuts the runtime down; returns what it found.
    ///
    /// Called (or the system dropped) on a shard, its own or another mailring
    /// runtime's, in a task or an actor, it cannot wait there: the shutdown goes on, in
    /// the same steps, on a thread of its own once the calling task yields,
    /// and the report returned is empty.
    ///
    /// # Examples
    ///
    /// ```
    /// use mailring_actors::{Actor, ActorSystem, Ctx, Handler, Message, Placement, Runtime};
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
    /// let pinger = system.spawn_actor(Placement::RoundRobin, Pinger::default);
    /// assert_eq!(system.block_on(async move { pinger.ask(Ping).await }), Ok(1));
    /// let report = system.shutdown();
    /// assert_eq!(report.actors_stopped, 1);
    /// assert_eq!(report.actors_abandoned, 0);
    /// assert!(report.is_clean(), "{report:?}");
    /// # Ok::<(), mailring::BuildError>(())
    /// ```
    pub fn shutdown(mut self) -> SystemShutdownReport {
        self.shutdown_inner()
    }

    /// Stops every actor as [`shutdown`](Self::shutdown) does, awaiting
    /// them instead of blocking: the way to end a system on a shard (one
    /// started with [`start_on`](Self::start_on) in `#[mailring::main]`).
    /// A runtime the system started itself is then shut down on a helper
    /// thread, and the report's `runtime` part is empty.
    pub async fn shutdown_async(mut self) -> SystemShutdownReport {
        if !std::mem::replace(&mut self.live, false) {
            return SystemShutdownReport::default();
        }
        self.shared.begin_shutdown();
        let deadline = std::time::Instant::now().checked_add(self.grace);
        let stop = stop_actors(self.shared.clone(), deadline);
        let gather = self.shared.handle.spawn_on(ShardId::new(0), stop);
        let report = match deadline {
            Some(d) => {
                let left = d.saturating_duration_since(std::time::Instant::now());
                mailring::time::timeout(left + Duration::from_secs(2), gather)
                    .await
                    .ok()
                    .and_then(Result::ok)
            }
            None => gather.await.ok(),
        }
        .unwrap_or_else(|| SystemShutdownReport::unreported(self.shared.handle.shards()));
        warn_unfinished(&report);
        drop_registries(&self.shared);
        if self.runtime.is_none() {
            if let Some(release) = release_credit_tags(&self.shared, &report) {
                let _ = mailring::time::timeout(CREDIT_TAGS_RELEASE_WAIT, release).await;
            }
        }
        if let Some(runtime) = self.runtime.take() {
            // Not on this shard, which the runtime's shutdown waits for.
            let _ = std::thread::Builder::new()
                .name("mailring-actors-shutdown".into())
                .spawn(move || drop(runtime));
        }
        report
    }

    fn shutdown_inner(&mut self) -> SystemShutdownReport {
        if !std::mem::replace(&mut self.live, false) {
            return SystemShutdownReport::default();
        }
        let runtime = self.runtime.take();
        self.shared.begin_shutdown();
        let shared = self.shared.clone();
        let grace = self.grace;
        if mailring::current_shard().is_none() {
            return shut_down(shared, grace, runtime);
        }
        // On a shard (dropped in a task or an actor): on one of the
        // system's own, waiting here would block the shard the shutdown
        // needs; on another runtime's, `Runtime::block_on` refuses to block
        // it (a panic). Finish on a thread of its own, which the shards
        // serve once this task yields.
        let spawned = std::thread::Builder::new()
            .name("mailring-actors-shutdown".into())
            .spawn(move || {
                let _ = shut_down(shared, grace, runtime);
            });
        // Without a thread, the runtime (dropped with the closure, on this
        // shard) still shuts itself down once this task returns; the actors
        // are dropped with it, without `on_stop`.
        drop(spawned);
        SystemShutdownReport::default()
    }
}

/// The system's credit tags, one per shard: the first.
fn register_credit_tags(handle: &Handle) -> Result<u16, mailring::hot::HotTagError> {
    Ok(handle.register_hot_tags(credit_tag_count(handle))?.start)
}

/// How many credit tags a system on `handle`'s runtime takes: one per
/// shard.
fn credit_tag_count(handle: &Handle) -> u16 {
    handle.shards().min(mailring::MAX_SHARDS) as u16
}

/// Stops every actor of `shared` on every shard, each shard giving up at
/// `deadline` (`None`: waits for every actor); sums the shards' figures.
async fn stop_actors(
    shared: Arc<SystemShared>,
    deadline: Option<std::time::Instant>,
) -> SystemShutdownReport {
    let n = shared.handle.shards();
    {
        let mut joins = Vec::new();
        for i in 0..n {
            let s = shared.clone();
            joins.push(s.handle.clone().spawn_on(ShardId::new(i), async move {
                let mut first = None;
                loop {
                    let live = local::stop_shard(&s, StopReason::Shutdown);
                    let running = *first.get_or_insert(live);
                    if live == 0 || deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                        s.closed.store(true, Ordering::Release);
                        let mut shard = SystemShutdownReport {
                            actors_stopped: running.saturating_sub(live) as u64,
                            actors_abandoned: live as u64,
                            ..SystemShutdownReport::default()
                        };
                        for t in local::shard_stats(&s) {
                            shard.actor_panics += t.panics;
                            shard.dead_letters += t.dead_letters;
                        }
                        local::clear_shard(&s);
                        return shard;
                    }
                    mailring::time::sleep(Duration::from_millis(1)).await;
                }
            }));
        }
        let mut report = SystemShutdownReport::default();
        // A shard held by a handler that never yields runs none of its
        // part: waited for until a second past the grace period.
        let until = deadline.and_then(|d| d.checked_add(Duration::from_secs(1)));
        for j in joins {
            let gathered = match until {
                Some(u) => {
                    let left = u.saturating_duration_since(std::time::Instant::now());
                    mailring::time::timeout(left, j).await.ok()
                }
                None => Some(j.await),
            };
            let Some(gathered) = gathered else {
                report.shards_unreported += 1;
                continue;
            };
            if let Ok(shard) = gathered {
                report.actors_stopped += shard.actors_stopped;
                report.actors_abandoned += shard.actors_abandoned;
                report.actor_panics += shard.actor_panics;
                report.dead_letters += shard.dead_letters;
            }
        }
        report
    }
}

/// Stops every actor of `shared` within `grace`, then shuts `runtime` down
/// when the system owns it (steps of [`ActorSystem::shutdown`]). Blocks;
/// never called on a shard.
fn shut_down(
    shared: Arc<SystemShared>,
    grace: Duration,
    runtime: Option<Runtime>,
) -> SystemShutdownReport {
    // `None`: a grace too long for an `Instant` (`Duration::MAX`) waits for
    // every actor, and for every shard thread.
    let deadline = std::time::Instant::now().checked_add(grace);
    let (done, gathered) = std::sync::mpsc::channel();
    let stop = stop_actors(shared.clone(), deadline);
    shared
        .handle
        .spawn_on(ShardId::new(0), async move {
            let _ = done.send(stop.await);
        })
        .detach();
    // Waited for from here, with a bound: a shard stuck in a handler that
    // never yields runs none of this, and its thread is then abandoned by
    // the runtime's bounded shutdown below.
    // (A second more than the gathering on shard 0 waits for the others.)
    let n = shared.handle.shards();
    let outer = deadline.and_then(|d| d.checked_add(Duration::from_secs(2)));
    let mut report = match outer {
        Some(outer) => {
            let left = outer.saturating_duration_since(std::time::Instant::now());
            gathered.recv_timeout(left).ok()
        }
        None => gathered.recv().ok(),
    }
    .unwrap_or_else(|| SystemShutdownReport::unreported(n));
    warn_unfinished(&report);
    let borrowed = runtime.is_none();
    report.runtime = match (runtime, deadline) {
        (Some(rt), Some(_)) => rt.shutdown_timeout(grace),
        (Some(rt), None) => rt.shutdown(),
        (None, _) => ShutdownReport::default(),
    };
    drop_registries(&shared);
    if borrowed {
        if let Some(release) = release_credit_tags(&shared, &report) {
            // Waited for with a bound, as the stop was (a shard stuck in
            // some other task's code would hold it); past it, the tags go
            // back once that shard moves on.
            let (done, released) = std::sync::mpsc::channel();
            shared
                .handle
                .spawn_on(ShardId::new(0), async move {
                    let _ = done.send(release.await);
                })
                .detach();
            let _ = released.recv_timeout(CREDIT_TAGS_RELEASE_WAIT);
        }
    }
    report
}

/// How long a shutdown waits for its credit tags to go back to a runtime
/// it did not start.
const CREDIT_TAGS_RELEASE_WAIT: Duration = Duration::from_secs(2);

/// Gives the credit tags of `shared`, a system on a runtime it did not
/// start, back to that runtime for the next system started on it; `None`
/// when its shutdown left actors running (they could still hand credits
/// back through them) or a shard unheard from.
fn release_credit_tags(
    shared: &Arc<SystemShared>,
    report: &SystemShutdownReport,
) -> Option<mailring::JoinHandle<()>> {
    if report.actors_abandoned > 0 || report.shards_unreported > 0 {
        return None;
    }
    let handle = shared.handle.clone();
    let tags = shared.credit_base..shared.credit_base + credit_tag_count(&handle);
    Some(shared.handle.spawn_on(ShardId::new(0), async move {
        if let Err(e) = handle.release_hot_tags(tags).await {
            debug_assert!(false, "a system's credit tags given back twice: {e}");
        }
    }))
}

/// Says on stderr what a shutdown left running or could not account for.
fn warn_unfinished(report: &SystemShutdownReport) {
    if report.actors_abandoned > 0 {
        eprintln!(
            "mailring-actors: {} actors still running after the shutdown grace period; dropping them",
            report.actors_abandoned
        );
    }
    if report.shards_unreported > 0 {
        eprintln!(
            "mailring-actors: {} shards sent no shutdown figures within the grace period (a handler that never yields?)",
            report.shards_unreported
        );
    }
}

/// What the system keeps for its whole life goes at its shutdown: a named
/// `Addr` holds the system itself (a cycle that kept it, and the runtime's
/// shared state with it, alive forever), and factories and topics hold
/// whatever they captured. Taken out of their locks before they are dropped.
fn drop_registries(registries: &SystemShared) {
    let names = std::mem::take(&mut *registries.names.lock().unwrap_or_else(|p| p.into_inner()));
    let factories = std::mem::take(
        &mut *registries
            .factories
            .write()
            .unwrap_or_else(|p| p.into_inner()),
    );
    let directories = std::mem::take(
        &mut *registries
            .directories
            .lock()
            .unwrap_or_else(|p| p.into_inner()),
    );
    let topics = std::mem::take(&mut *registries.topics.lock().unwrap_or_else(|p| p.into_inner()));
    drop((names, factories, directories, topics));
}

/// What [`ActorSystem::shutdown`] found: the actor layer's figures and the
/// runtime's [`ShutdownReport`].
///
/// An actor still running when the grace period ends is abandoned: its task
/// is dropped with the runtime (so it also counts in
/// `runtime.tasks_cancelled`), without `on_stop`. Under
/// [`ActorSystem::start_on`] the runtime is the caller's and goes on: the
/// abandoned task runs on until it ends (then its `on_stop` runs) or that
/// runtime shuts down.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SystemShutdownReport {
    /// The runtime's report: tasks cancelled, closures and jobs dropped
    /// unrun, operations cancelled or leaked, panics the shards caught.
    pub runtime: ShutdownReport,
    /// Actors running when shutdown began that stopped within
    /// [`SystemConfig::shutdown_grace`] (each ran its `on_stop`).
    pub actors_stopped: u64,
    /// Actors still running when the grace period ended (a handler that
    /// did not return): dropped with the runtime (a runtime of the
    /// system's own; see the type's doc for `start_on`).
    pub actors_abandoned: u64,
    /// Handler and `on_start` panics the actor layer caught during
    /// the system's life ([`ActorTypeStats::panics`](crate::ActorTypeStats::panics)
    /// summed; the shard that caught one carried on, and these do not appear
    /// in `runtime.panics`).
    pub actor_panics: u64,
    /// Messages that found no live actor during the system's life
    /// ([`ActorTypeStats::dead_letters`](crate::ActorTypeStats::dead_letters)
    /// summed).
    pub dead_letters: u64,
    /// Shards whose figures did not come within the grace period and the
    /// second after it (a handler that never yields holds its shard): the
    /// figures above leave their actors out, and the report is not clean.
    pub shards_unreported: u64,
}

impl SystemShutdownReport {
    /// Whether shutdown found nothing to report: every actor stopped in
    /// time, no actor panicked, and the runtime's report is clean.
    pub fn is_clean(&self) -> bool {
        self.actors_abandoned == 0
            && self.actor_panics == 0
            && self.shards_unreported == 0
            && self.runtime.is_clean()
    }

    /// The report of a shutdown none of whose `shards` sent its figures.
    fn unreported(shards: usize) -> Self {
        SystemShutdownReport {
            shards_unreported: shards as u64,
            ..SystemShutdownReport::default()
        }
    }
}

impl Drop for ActorSystem {
    fn drop(&mut self) {
        let _ = self.shutdown_inner();
    }
}

/// A cheap, cloneable, `Send` handle to an [`ActorSystem`].
#[derive(Clone)]
pub struct SystemHandle {
    pub(crate) shared: Arc<SystemShared>,
}

impl fmt::Debug for SystemHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SystemHandle")
            .field("id", &self.shared.id)
            .finish()
    }
}

impl SystemHandle {
    /// The runtime's handle.
    pub fn runtime(&self) -> &Handle {
        &self.shared.handle
    }

    /// A reference to the keyed actor `key` of type `A`. It is valid before
    /// the actor exists: the first message activates it on the shard its
    /// placement picks.
    pub fn keyed<A: Actor>(&self, key: A::Key) -> Addr<A> {
        Addr::keyed(SystemRef::here(&self.shared), key)
    }

    /// Runs `f` at once on the keyed actor `key` of type `A`, in the calling
    /// task, when that actor is active and idle on the calling shard: what
    /// [`Addr::run_now`] does for `self.keyed::<A>(key)`, without making
    /// the reference (no routing hash, no look-up of the key's home shard,
    /// no copy of the key). An actor active on this shard lives here, so
    /// finding it is enough. Suits a session that mostly calls the actors
    /// beside it: it tries this first and makes an [`Addr`] only when it
    /// must send a message.
    ///
    /// # Errors
    ///
    /// As [`Addr::run_now`]: [`RunNowError::NotIdle`] with `f` when the
    /// actor is not active on the calling shard (it lives on another, is
    /// not activated, or the caller is no shard of this system: nothing is
    /// activated) or is not idle; [`RunNowError::Panicked`] when `f`
    /// panicked, which sends the actor through its supervision policy.
    ///
    /// # Examples
    ///
    /// ```
    /// use mailring_actors::{Actor, ActorSystem, Ctx, Handler, Message, RunNowError, Runtime};
    ///
    /// #[derive(Actor, Default)]
    /// #[actor(key = String, activate = |_| Room::default(), handles(Join))]
    /// struct Room {
    ///     members: u32,
    /// }
    ///
    /// #[derive(Message)]
    /// #[message(reply = u32)]
    /// struct Join;
    ///
    /// impl Handler<Join> for Room {
    ///     async fn handle(&mut self, _: Join, _cx: &mut Ctx<Self>) -> u32 {
    ///         self.members += 1;
    ///         self.members
    ///     }
    /// }
    ///
    /// let system = ActorSystem::start(Runtime::builder().shards(1))?;
    /// let handle = system.handle();
    /// let members = system.block_on(async move {
    ///     let room = "lobby".to_owned();
    ///     handle.keyed::<Room>(room.clone()).ask(Join).await.unwrap();
    ///     match handle.run_now_keyed::<Room, _, _>(&room, |r| { r.members += 1; r.members }) {
    ///         Ok(n) => n,
    ///         Err(RunNowError::NotIdle(_)) => handle.keyed::<Room>(room).ask(Join).await.unwrap(),
    ///         Err(e) => panic!("{e}"),
    ///     }
    /// });
    /// assert_eq!(members, 2);
    /// # system.shutdown();
    /// # Ok::<(), mailring::BuildError>(())
    /// ```
    pub fn run_now_keyed<A: Actor, R, F: FnOnce(&mut A) -> R>(
        &self,
        key: &A::Key,
        f: F,
    ) -> Result<R, RunNowError<F>> {
        // The table alone (a `LocalActors` would take the shard's inbox
        // probe, a shared count, for this one call).
        let Some(ts) = local::type_state::<A>(&self.shared) else {
            return Err(RunNowError::NotIdle(f));
        };
        // Deliveries already published to this shard go first.
        mailring::receive_pending();
        ts.run_now_keyed(key, f)
    }

    /// The calling shard's table of its active actors of type `A`, to run
    /// closures on many of them by key ([`LocalActors::run_now`]) with one
    /// look-up of the table; `None` when the caller is no shard of this
    /// system.
    pub fn local_actors<A: Actor>(&self) -> Option<LocalActors<A>> {
        LocalActors::here(&self.shared)
    }

    /// Spawns an unkeyed actor built by `factory` on the shard `placement`
    /// picks (`Stealable` picks the least-loaded shard now: a started actor
    /// never moves). The factory runs on that shard, and again on restarts.
    ///
    /// # Panics
    ///
    /// When `placement` is `Pinned` to a shard the system does not have (as
    /// [`mailring::Handle::spawn_with`] does): a caller's mistake, reported
    /// where it is made. A keyed type pinned past the last shard by its
    /// attribute cannot be refused at a call, so its sends fail with
    /// `NoSuchShard` instead.
    pub fn spawn_actor<A, F>(&self, placement: Placement, factory: F) -> Addr<A>
    where
        A: Actor<Key = ()>,
        F: FnMut() -> A + Send + 'static,
    {
        crate::runner::spawn_unkeyed(&self.shared, placement, factory, None)
    }

    /// Registers how keyed actors of type `A` are built; it takes precedence
    /// over `#[actor(activate = ...)]`. Register before the first message.
    pub fn register_factory<A: Actor>(
        &self,
        factory: impl Fn(&A::Key) -> A + Send + Sync + 'static,
    ) {
        let f: Factory<A> = Arc::new(factory);
        let mut map = self
            .shared
            .factories
            .write()
            .unwrap_or_else(|p| p.into_inner());
        // Past the start of shutdown nothing is activated any more, and a
        // factory kept would keep what it holds (a handle of the system)
        // for ever.
        if self.shared.is_shutting_down() {
            drop(map);
            drop(f);
            return;
        }
        map.insert(TypeId::of::<A>(), Arc::new(f));
        drop(map);
        let slot = A::__slot().index();
        if let Some(word) = self.shared.factory_bits.get(slot / 64) {
            word.fetch_or(1 << (slot % 64), Ordering::Release);
        }
    }

    /// A new topic of messages of type `M` (see [`Topic`](crate::Topic)).
    pub fn topic<M>(&self) -> crate::Topic<M>
    where
        M: Message + Clone + Send,
        M::Reply: Send,
    {
        crate::Topic::new(self.shared.clone())
    }

    /// The system's topic of messages of type `M` named `name`: every call
    /// with the same name and type returns the same topic (a session and an
    /// actor that never met find each other by it). Dropped at shutdown.
    pub fn named_topic<M>(&self, name: &str) -> crate::Topic<M>
    where
        M: Message + Clone + Send,
        M::Reply: Send,
    {
        let mut topics = self.shared.topics.lock().unwrap_or_else(|p| p.into_inner());
        if self.shared.is_shutting_down() {
            // A topic of a closing system delivers nothing: not kept (it
            // holds the system).
            drop(topics);
            return crate::Topic::new(self.shared.clone());
        }
        let entry = topics
            .entry((TypeId::of::<M>(), name.to_owned()))
            .or_insert_with(|| Box::new(crate::Topic::<M>::new(self.shared.clone())));
        entry
            .downcast_ref::<crate::Topic<M>>()
            .expect("a topic of the type it is keyed by")
            .clone()
    }

    /// Asks the system's owner to shut it down: wakes
    /// [`ActorSystem::wait_for_shutdown_request`]. From anywhere, a handler
    /// included (which cannot shut the system down itself and wait).
    pub fn request_shutdown(&self) {
        let mut requested = self
            .shared
            .shutdown_requested
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        *requested = true;
        self.shared.shutdown_request.notify_all();
    }

    /// Registers `addr` under `name`; a previous actor of that name is replaced.
    pub fn register_name<A: Actor>(&self, name: impl Into<String>, addr: Addr<A>)
    where
        A::Key: Send,
    {
        let mut names = self.shared.names.lock().unwrap_or_else(|p| p.into_inner());
        // Past the start of shutdown (checked under the lock its end takes
        // the names under): kept, the `Addr` would hold the system for ever.
        if self.shared.is_shutting_down() {
            drop(names);
            drop(addr);
            return;
        }
        names.insert(name.into(), (TypeId::of::<A>(), Box::new(addr)));
    }

    /// The actor registered under `name`, if it has type `A`.
    pub fn lookup<A: Actor>(&self, name: &str) -> Option<Addr<A>> {
        let names = self.shared.names.lock().unwrap_or_else(|p| p.into_inner());
        let (ty, addr) = names.get(name)?;
        if *ty != TypeId::of::<A>() {
            return None;
        }
        addr.downcast_ref::<Addr<A>>().cloned()
    }

    /// Removes a name; returns whether it was registered.
    pub fn unregister_name(&self, name: &str) -> bool {
        let mut names = self.shared.names.lock().unwrap_or_else(|p| p.into_inner());
        names.remove(name).is_some()
    }

    /// Per-shard, per-type counters, gathered on every shard.
    pub async fn stats(&self) -> ActorStats {
        let n = self.shared.handle.shards();
        let mut joins = Vec::new();
        for i in 0..n {
            let s = self.shared.clone();
            joins.push(
                self.shared
                    .handle
                    .spawn_on(ShardId::new(i), async move { local::shard_stats(&s) }),
            );
        }
        let mut per_shard: Vec<ActorTypeStats> = Vec::new();
        for j in joins {
            per_shard.extend(j.await.unwrap_or_default());
        }
        ActorStats::from_shards(per_shard)
    }

    /// The shard the keyed actor `key` of type `A` lives on, or will be
    /// activated on, without activating it: where a task or a session that
    /// works with that actor should run (`runtime().spawn_on(shard, ..)`).
    /// For a stealable, balanced or first-sender type, a key not routed yet
    /// is placed now (on the least-loaded shard, the one given the fewest
    /// keys, or the calling shard) and stays there.
    pub fn shard_of<A: Actor>(&self, key: &A::Key) -> ShardId {
        let hash = crate::route::route_hash(key);
        ShardId::new(local::keyed_home::<A>(&self.shared, key, hash))
    }

    /// The shard key `key` of `A` lives on if it is placed, without
    /// placing it: for a type placed through a directory (stealable,
    /// balanced, first-sender), `None` while no sender has routed the key
    /// (nor [`SystemHandle::place`]d it); for the others, where the key's
    /// placement puts it, as [`SystemHandle::shard_of`] says. On a shard,
    /// a key this shard has routed or asked about before is answered from
    /// the shard's cache without a lock (the first time, from the
    /// directory, under one stripe's lock). A server asks it to answer a
    /// request for a key that cannot exist yet without placing the key.
    ///
    /// The directory keeps each key's 64-bit route hash, not its bytes (a
    /// record lasts as long as the system): a key whose hash collides with
    /// a placed key's is answered with that key's shard, where it will
    /// live. `Some` says "may exist"; `None` says "never routed".
    pub fn placed_shard<A: Actor>(&self, key: &A::Key) -> Option<ShardId> {
        let hash = crate::route::route_hash(key);
        local::placed_home::<A>(&self.shared, key, hash).map(ShardId::new)
    }

    /// Records that key `key` of `A` lives on `shard`, unless it was routed
    /// already; returns the shard it lives on (the earlier record wins, so
    /// every sender agrees). For a type placed through a directory
    /// (stealable, balanced, first-sender), before its first message: a
    /// program that keeps its keys' homes (a per-shard log) puts each key
    /// back where its state is when it starts again.
    ///
    /// # Errors
    ///
    /// [`PlaceError::NotDirectoryPlaced`] for a sticky, pinned or custom
    /// type, whose keys' shards follow from the keys;
    /// [`PlaceError::NoSuchShard`] past the last shard;
    /// [`PlaceError::ShuttingDown`] once the system is shutting down.
    pub fn place<A: Actor>(&self, key: A::Key, shard: ShardId) -> Result<ShardId, PlaceError> {
        let shards = self.shared.handle.shards();
        if !matches!(
            A::CONFIG.placement,
            ActorPlacement::Stealable | ActorPlacement::Balanced | ActorPlacement::FirstSender
        ) {
            return Err(PlaceError::NotDirectoryPlaced {
                actor: std::any::type_name::<A>(),
            });
        }
        if self.shared.is_shutting_down() {
            return Err(PlaceError::ShuttingDown);
        }
        if shard.index() >= shards {
            return Err(PlaceError::NoSuchShard {
                shard: shard.index(),
                shards,
            });
        }
        let hash = crate::route::route_hash(&key);
        let dir = self.shared.directory::<A>();
        Ok(ShardId::new(dir.route_counted(
            hash,
            Some(shard.index()),
            shards,
        )))
    }

    /// The keys of `A` active on `shard` now (activated, not passivated or
    /// stopping), in no particular order; none on a shard the system does
    /// not have.
    pub async fn live_keys<A: Actor>(&self, shard: ShardId) -> Vec<A::Key> {
        if shard.index() >= self.shared.handle.shards() {
            return Vec::new();
        }
        let s = self.shared.clone();
        self.shared
            .handle
            .spawn_on(shard, async move {
                local::type_state::<A>(&s)
                    .map(|ts| ts.live_keys())
                    .unwrap_or_default()
            })
            .await
            .unwrap_or_default()
    }

    /// Number of keys recorded in `A`'s directory (a stealable, balanced or
    /// first-sender type: every key ever routed, active or not; keys whose
    /// route hashes collide count once). A record costs a few dozen bytes
    /// whatever the key's length: the directory keeps hashes, not keys.
    pub fn directory_len<A: Actor>(&self) -> usize {
        self.shared.directory::<A>().len()
    }
}

#[cfg(test)]
mod tests {
    use crate::{Actor, ActorSystem, Ctx, Handler, Message, Runtime};

    #[derive(Actor)]
    #[actor(key = u64, mailbox = 2, activate = Bounded::new, handles(Ping))]
    struct Bounded;

    impl Bounded {
        fn new(_key: &u64) -> Self {
            Bounded
        }
    }

    #[derive(Message)]
    struct Ping;

    impl Handler<Ping> for Bounded {
        async fn handle(&mut self, _m: Ping, _cx: &mut Ctx<Self>) {}
    }

    fn counts(sys: &ActorSystem) -> usize {
        let caps = sys.shared.capacities.lock().unwrap();
        let any = caps
            .values()
            .next()
            .expect("one keyed bounded type")
            .clone();
        drop(caps);
        let caps = any
            .downcast::<std::sync::Mutex<super::KeyedCapacities<u64>>>()
            .expect("u64 keys");
        let n = caps.lock().unwrap().counts.len();
        n
    }

    #[test]
    fn counts_of_keys_nobody_holds_are_forgotten() {
        let sys = ActorSystem::start(Runtime::builder().shards(1)).expect("io_uring available");
        // References made and dropped without sending: nothing holds their
        // counts once the map has looked again.
        for key in 0..10_000u64 {
            drop(sys.keyed::<Bounded>(key));
        }
        let n = counts(&sys);
        assert!(
            n <= 2 * super::KEYED_CAPACITIES_FIRST_PRUNE,
            "{n} counts kept"
        );
        // A held reference keeps its count, however many keys come after it,
        // and its place stays taken until the actor takes the message.
        let held = sys.keyed::<Bounded>(u64::MAX);
        held.try_tell(Ping).unwrap();
        for key in 0..10_000u64 {
            drop(sys.keyed::<Bounded>(key));
        }
        let again = sys.keyed::<Bounded>(u64::MAX);
        assert!(std::sync::Arc::ptr_eq(
            held.capacity.as_ref().unwrap(),
            again.capacity.as_ref().unwrap()
        ));
        sys.shutdown();
    }
}
