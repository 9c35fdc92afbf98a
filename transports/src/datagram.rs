//! UDP datagram sessions: a [`DatagramServer`] keeps one session per key,
//! the key named by the first datagram of a peer ([`DatagramSession::key`]:
//! its address, or something it carries), on the key's shard. Sessions
//! expire when idle, their number is capped, and datagrams that name no
//! key are dropped and counted without touching anyone else.
//!
//! Each shard has a socket bound to the server's address (`SO_REUSEPORT`;
//! the kernel keeps a peer on one of them). A datagram is keyed where it
//! arrives (the key of a known peer is remembered there), then handed to
//! the key's shard if it is another one; a session sends its replies from
//! its own shard's socket, which has the same address.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use mailring_actors::mailring::net::UdpSocket;
use mailring_actors::mailring::{self, CallbackKind, Handle, ShardId};
use mailring_actors::{Actor, RouteKey, SystemHandle};
use std::time::Instant;

/// The most [`DatagramConfig::max_datagram`] takes (more than UDP carries).
const MAX_DATAGRAM: usize = 64 << 10;
/// Receives each shard keeps in flight where multishot receives are
/// missing (before Linux 6.0).
const RECEIVES_IN_FLIGHT: usize = 8;
/// Buffers of the ring a shard's multishot receive takes datagrams into
/// (each copied out at once and its buffer given back).
const RING_BUFFERS: u16 = 16;
/// Room in each ring buffer before the payload: the kernel's 16-byte
/// header and a 28-byte address, rounded up.
const RING_HEADROOM: usize = 64;
/// Datagrams one wake of a shard's loop takes before it lets other tasks
/// run.
const ARRIVALS_PER_WAKE: usize = 64;
/// Failures of the multishot receive in a row, with no datagram between,
/// after which a shard takes single receives instead.
const MULTISHOT_FAILURES_MAX: u32 = 16;
/// Datagrams up to this size are copied out of the receive buffer (which
/// is kept); bigger ones take it along.
const COPY_OUT_MAX: usize = 2048;

/// One peer-or-key's protocol logic over datagrams, run on its key's shard.
///
/// ```
/// use std::net::SocketAddr;
/// use mailring_transports::bytes::Bytes;
/// use mailring_transports::datagram::{DatagramCtx, DatagramSession};
///
/// /// Echoes each datagram; one session per peer address.
/// struct Echo;
///
/// impl DatagramSession for Echo {
///     type Key = SocketAddr;
///
///     fn key(_first: &[u8], peer: SocketAddr) -> Option<SocketAddr> {
///         Some(peer)
///     }
///
///     async fn on_datagram(&mut self, datagram: Bytes, cx: &mut DatagramCtx) {
///         cx.reply(datagram);
///     }
/// }
/// ```
pub trait DatagramSession: Send + Sized + 'static {
    /// What a session is kept by: the peer's address, or a key its
    /// datagrams carry.
    type Key: RouteKey + Clone + Eq + std::hash::Hash + Send + Sync + fmt::Debug + 'static;

    /// The key of a peer not seen yet (or whose session expired), from its
    /// datagram and address. `None`: the datagram is garbage, dropped and
    /// counted ([`DatagramShardStats::garbage`]); the next datagram of the
    /// peer is asked again. The key found is remembered for the peer until
    /// it is idle for the server's idle timeout.
    fn key(datagram: &[u8], peer: SocketAddr) -> Option<Self::Key>;

    /// Handles one datagram (its sender is [`DatagramCtx::peer`]).
    /// Datagrams of a session are handled one at a time, in the order the
    /// shard took them: their arrival order with the multishot receive.
    /// With single receives (kernels before 6.0, or
    /// [`DatagramConfig::multishot_receive`] off), several are in flight,
    /// and datagrams that arrive together may be handed in another order,
    /// as UDP allows.
    fn on_datagram(&mut self, datagram: Bytes, cx: &mut DatagramCtx) -> impl Future<Output = ()>;

    /// Runs once when the session ends.
    fn on_close(&mut self, reason: DatagramClose, cx: &mut DatagramCtx) {
        let _ = (reason, cx);
    }
}

/// Why a datagram session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DatagramClose {
    /// Nothing arrived for the idle timeout.
    IdleTimeout,
    /// The session asked ([`DatagramCtx::close`]).
    ClosedBySession,
    /// The server shut down.
    Shutdown,
    /// The session's code panicked (reported to the runtime; `on_close`
    /// does not run).
    Panicked,
    /// A handler ran past [`DatagramConfig::handler_timeout`]: it was
    /// dropped where it waited, and the replies it had queued were not
    /// sent.
    HandlerTimeout,
}

/// A datagram session's view: who sent the datagram being handled, replies.
#[derive(Debug)]
pub struct DatagramCtx {
    peer: SocketAddr,
    shard: ShardId,
    out: Vec<(SocketAddr, Bytes)>,
    close: bool,
}

impl DatagramCtx {
    /// The sender of the datagram being handled (in `on_close`, of the
    /// last one).
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The shard the session runs on.
    pub fn shard(&self) -> ShardId {
        self.shard
    }

    /// Sends `datagram` to the sender of the one being handled.
    pub fn reply(&mut self, datagram: Bytes) {
        self.out.push((self.peer, datagram));
    }

    /// Sends `datagram` to `peer` (another peer of the same key, say).
    pub fn send_to(&mut self, peer: SocketAddr, datagram: Bytes) {
        self.out.push((peer, datagram));
    }

    /// Ends the session after this datagram (its replies still go).
    pub fn close(&mut self) {
        self.close = true;
    }
}

/// A datagram server's limits.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DatagramConfig {
    /// A session (and a remembered peer) with no datagram for this long
    /// ends with [`DatagramClose::IdleTimeout`]. Default 60 s.
    pub idle_timeout: Duration,
    /// Sessions alive at once, over all shards; a datagram that would open
    /// one more is dropped and counted
    /// ([`DatagramShardStats::over_capacity`]). Default 10,000.
    pub max_sessions: usize,
    /// Datagrams queued for one session while it handles another; past it
    /// they are dropped and counted ([`DatagramShardStats::queue_full`]).
    /// Default 256.
    pub session_queue: usize,
    /// Bytes of datagrams queued on one shard over all its sessions (each
    /// counted with [`QUEUED_OVERHEAD`] bytes more, for its place in the
    /// queue): sessions whose handlers are slow could otherwise hold
    /// `max_sessions × session_queue × max_datagram` bytes between them.
    /// Past it, datagrams are dropped and counted
    /// ([`DatagramShardStats::queued_bytes_full`]). Default 64 MiB.
    pub max_queued_bytes: usize,
    /// Datagrams handed to a shard (their key's) by the others and not
    /// taken by it yet, counted per destination shard over every shard
    /// that hands to it: while that shard is busy (a handler holding its
    /// thread), more would gather in its inbox without bound, so past this
    /// they are dropped where they arrived and counted
    /// ([`DatagramShardStats::handoff_full`]), as a full socket buffer
    /// drops them. At least 1 (0 is taken as 1). Default 4,096.
    pub handoff_queue: usize,
    /// Whether each shard takes datagrams with one multishot receive over a
    /// ring of 16 buffers of 64 KiB (Linux 6.0+; 1 MiB per shard), instead
    /// of 8 single receives in flight (512 KiB per shard, and a receive
    /// submitted per datagram). Kernels without it take the single
    /// receives whatever this says. Default `true`.
    pub multishot_receive: bool,
    /// The largest datagram taken, in bytes (1 to 65,536; values outside are
    /// taken as the nearest bound): a longer one is
    /// dropped and counted ([`DatagramShardStats::oversized`]), never handed
    /// to a session cut. It sizes each shard's receive buffers: 16 of about
    /// this size for the multishot receive, 8 for single receives. Default
    /// 65,536 (anything UDP carries).
    pub max_datagram: usize,
    /// How long [`DatagramServer::shutdown`] waits for the sessions to end
    /// (each handles what it queued, then `on_close`); past it, those still
    /// running (a handler that never finishes) are left to end with the
    /// runtime, and counted as dropped in its shutdown report. Default 5 s.
    pub shutdown_grace: Duration,
    /// How long one `on_datagram` may run from its first wait (one that
    /// never waits is not timed). A handler still running past it (waiting on an upstream that never answers) is dropped where it
    /// waits, its queued replies are not sent (its state may be half
    /// changed), and its session ends with
    /// [`DatagramClose::HandlerTimeout`] (counted in
    /// [`DatagramShardStats::handler_timeouts`]); the key's next datagrams,
    /// those queued behind it included, open a new session. Without it a
    /// stuck handler would hold its key, and drop its peer's datagrams,
    /// until shutdown. `None`: handlers run as long as they take. Default
    /// 30 s.
    pub handler_timeout: Option<Duration>,
}

impl Default for DatagramConfig {
    fn default() -> Self {
        DatagramConfig {
            idle_timeout: Duration::from_secs(60),
            max_sessions: 10_000,
            session_queue: 256,
            max_queued_bytes: 64 << 20,
            handoff_queue: 4096,
            multishot_receive: true,
            max_datagram: MAX_DATAGRAM,
            shutdown_grace: Duration::from_secs(5),
            handler_timeout: Some(Duration::from_secs(30)),
        }
    }
}

/// One shard's datagram counters.
#[derive(Debug, Default)]
struct Counters {
    datagrams_in: AtomicU64,
    datagrams_out: AtomicU64,
    garbage: AtomicU64,
    over_capacity: AtomicU64,
    queue_full: AtomicU64,
    queued_bytes_full: AtomicU64,
    forwarded: AtomicU64,
    handoff_full: AtomicU64,
    /// Datagrams handed to this shard that it has not taken yet.
    in_transit: AtomicUsize,
    opened: AtomicU64,
    expired: AtomicU64,
    panicked: AtomicU64,
    handler_timeouts: AtomicU64,
    send_errors: AtomicU64,
    oversized: AtomicU64,
    quiet_peer_looks: AtomicU64,
}

/// A snapshot of one shard's datagram counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DatagramShardStats {
    /// Datagrams this shard's socket received.
    pub datagrams_in: u64,
    /// Datagrams its sessions sent.
    pub datagrams_out: u64,
    /// Datagrams of unknown peers that named no key, dropped.
    pub garbage: u64,
    /// Datagrams that would have opened a session past the cap, dropped.
    pub over_capacity: u64,
    /// Datagrams dropped because their session's queue was full.
    pub queue_full: u64,
    /// Datagrams dropped because the shard's sessions held
    /// [`DatagramConfig::max_queued_bytes`] in their queues.
    pub queued_bytes_full: u64,
    /// Datagrams received here and handed to their key's shard.
    pub forwarded: u64,
    /// Datagrams received here for another shard that already had
    /// [`DatagramConfig::handoff_queue`] handed datagrams waiting, dropped.
    pub handoff_full: u64,
    /// Sessions opened here.
    pub opened: u64,
    /// Sessions here that ended idle.
    pub expired: u64,
    /// Sessions here whose code panicked.
    pub panicked: u64,
    /// Sessions here that ended because a handler ran past
    /// [`DatagramConfig::handler_timeout`].
    pub handler_timeouts: u64,
    /// Sends that failed (the datagram is lost, as UDP may lose it).
    pub send_errors: u64,
    /// Datagrams longer than [`DatagramConfig::max_datagram`], dropped.
    pub oversized: u64,
    /// Passes over the remembered peers, with their table at its bound,
    /// for quiet ones to forget to make room for a newcomer (each looks
    /// at them all; a flood of newcomers to a full table costs one pass
    /// per eighth of the quiet time, not one each).
    pub quiet_peer_looks: u64,
}

impl Counters {
    fn snapshot(&self) -> DatagramShardStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        DatagramShardStats {
            datagrams_in: get(&self.datagrams_in),
            datagrams_out: get(&self.datagrams_out),
            garbage: get(&self.garbage),
            over_capacity: get(&self.over_capacity),
            queue_full: get(&self.queue_full),
            forwarded: get(&self.forwarded),
            handoff_full: get(&self.handoff_full),
            opened: get(&self.opened),
            expired: get(&self.expired),
            panicked: get(&self.panicked),
            handler_timeouts: get(&self.handler_timeouts),
            send_errors: get(&self.send_errors),
            oversized: get(&self.oversized),
            quiet_peer_looks: get(&self.quiet_peer_looks),
            queued_bytes_full: get(&self.queued_bytes_full),
        }
    }
}

type Placer<K> = Arc<dyn Fn(&K, usize) -> ShardId + Send + Sync>;

/// Where a key's session lives.
enum Placing<K> {
    /// On the key's shard by this function (several peers of one key
    /// share one session, wherever their datagrams arrive).
    By(Placer<K>),
    /// Where the key's first datagram arrived: no hand-off between shards.
    WhereReceived,
}
type Factory<S> = Arc<dyn Fn(&<S as DatagramSession>::Key) -> S + Send + Sync>;

struct Shared<S: DatagramSession> {
    id: u64,
    handle: Handle,
    config: DatagramConfig,
    factory: Factory<S>,
    placing: Placing<S::Key>,
    counters: Box<[Counters]>,
    live: AtomicUsize,
    closing: AtomicBool,
}

impl<S: DatagramSession> Shared<S> {
    fn counters(&self, shard: ShardId) -> &Counters {
        &self.counters[shard.index()]
    }
}

/// A session's place on its shard: its inbox, its driver's waker, when it
/// last heard from a peer.
struct Slot {
    inbox: RefCell<VecDeque<(SocketAddr, Bytes)>>,
    /// What `inbox` holds, as counted in `queued` (see [`queued_cost`]).
    inbox_bytes: Cell<usize>,
    /// The shard's bytes queued in its sessions' inboxes.
    queued: Rc<Cell<usize>>,
    waker: RefCell<Option<Waker>>,
    last: Cell<Instant>,
    stop: Cell<Option<DatagramClose>>,
    /// The session left the table: a peer's cached slot is stale.
    ended: Cell<bool>,
}

/// The bytes a queued datagram is counted for, against
/// [`DatagramConfig::max_queued_bytes`]: its own and its place's.
fn queued_cost(datagram: &Bytes) -> usize {
    datagram.len() + QUEUED_OVERHEAD
}

/// What a queued datagram is counted for beyond its bytes (its place in
/// the queue, its buffer's header): an empty datagram is not free.
pub const QUEUED_OVERHEAD: usize = 64;

impl Slot {
    fn new(queued: Rc<Cell<usize>>, now: Instant) -> Slot {
        Slot {
            inbox: RefCell::new(VecDeque::new()),
            inbox_bytes: Cell::new(0),
            queued,
            waker: RefCell::new(None),
            last: Cell::new(now),
            stop: Cell::new(None),
            ended: Cell::new(false),
        }
    }

    fn wake(&self) {
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }

    fn charge(&self, bytes: usize) {
        self.inbox_bytes.set(self.inbox_bytes.get() + bytes);
        self.queued.set(self.queued.get() + bytes);
    }

    fn uncharge(&self, bytes: usize) {
        self.inbox_bytes.set(self.inbox_bytes.get() - bytes);
        self.queued.set(self.queued.get() - bytes);
    }

    /// The next queued datagram.
    fn take_next(&self) -> Option<(SocketAddr, Bytes)> {
        let next = self.inbox.borrow_mut().pop_front()?;
        self.uncharge(queued_cost(&next.1));
        Some(next)
    }

    /// Every queued datagram.
    fn take_all(&self) -> VecDeque<(SocketAddr, Bytes)> {
        let all = std::mem::take(&mut *self.inbox.borrow_mut());
        self.uncharge(self.inbox_bytes.get());
        all
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.queued.set(self.queued.get() - self.inbox_bytes.get());
    }
}

/// A server's state on one shard.
struct Table<S: DatagramSession> {
    /// The shard's socket; `None` once the server stopped and its
    /// sessions ended or had their grace.
    socket: Option<Rc<UdpSocket>>,
    sessions: HashMap<S::Key, Rc<Slot>>,
    /// Peers seen here, with their key and when they were last heard.
    peers: HashMap<PeerAddr, Peer<S::Key>>,
    /// With `peers` at its bound and none quiet at the last look: no
    /// peer can be quiet before this, so a newcomer is refused without
    /// another look at them all.
    none_quiet_until: Option<Instant>,
    /// The receive loop, woken to see a shutdown.
    loop_waker: Option<Waker>,
    /// Bytes of datagrams queued in the sessions' inboxes here.
    queued: Rc<Cell<usize>>,
}

/// A datagram handed to a shard whose receive loop has not started yet.
type Early = Box<dyn FnOnce()>;

/// A peer's address as the key of the peers seen: hashed as one word (an
/// IPv4 address and port) or two (IPv6), where `SocketAddr`'s own hash
/// feeds the hasher its parts one at a time (a SipHash of a few bytes
/// costs about as much per call as per byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PeerAddr(SocketAddr);

impl std::hash::Hash for PeerAddr {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // Equal addresses hash alike (IPv6's flow and scope are left out:
        // addresses that differ only there share a hash, not an entry).
        match self.0 {
            SocketAddr::V4(a) => {
                state.write_u64(u64::from(a.ip().to_bits()) << 16 | u64::from(a.port()));
            }
            SocketAddr::V6(a) => {
                state.write_u128(a.ip().to_bits());
                state.write_u16(a.port());
            }
        }
    }
}

/// A peer seen on a shard.
struct Peer<K> {
    key: K,
    /// When it was last heard from.
    last: Instant,
    /// Its key's session on this shard, when it lives here: its datagrams
    /// go to it without a look-up by key (until the session ends).
    slot: Option<Rc<Slot>>,
}

thread_local! {
    /// Per shard: each datagram server's table, by server id.
    static TABLES: RefCell<HashMap<u64, Rc<dyn std::any::Any>>> = RefCell::new(HashMap::new());
    /// Per shard: datagrams handed here before the server's table was
    /// (its loop starts on its own; another shard's may run first).
    static EARLY: RefCell<HashMap<u64, Vec<Early>>> = RefCell::new(HashMap::new());
}

fn table<S: DatagramSession>(id: u64) -> Option<Rc<RefCell<Table<S>>>> {
    TABLES
        .with(|t| t.borrow().get(&id).cloned())
        .and_then(|any| any.downcast::<RefCell<Table<S>>>().ok())
}

/// Builds a [`DatagramServer`].
pub struct DatagramServerBuilder<S: DatagramSession> {
    config: DatagramConfig,
    factory: Factory<S>,
    placing: Option<Placing<S::Key>>,
}

impl<S: DatagramSession> fmt::Debug for DatagramServerBuilder<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatagramServerBuilder")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<S: DatagramSession> DatagramServerBuilder<S> {
    /// Sets the limits.
    pub fn config(mut self, config: DatagramConfig) -> Self {
        self.config = config;
        self
    }

    /// Places keys with `place(key, shards)` instead of
    /// `mailring::sticky_shard`.
    pub fn placement(
        mut self,
        place: impl Fn(&S::Key, usize) -> ShardId + Send + Sync + 'static,
    ) -> Self {
        self.placing = Some(Placing::By(Arc::new(place)));
        self
    }

    /// Keeps each session on the shard that received its key's first
    /// datagram: no datagram crosses shards. Right for keys that one peer
    /// sends (`Key = SocketAddr`: the kernel keeps a peer's datagrams on
    /// one socket of the group); a key several peers send would get one
    /// session per shard they land on. Per-peer echo went from 199k to
    /// 266k datagrams/s with it (`benches/results/udp-*.txt`).
    pub fn place_where_received(mut self) -> Self {
        self.placing = Some(Placing::WhereReceived);
        self
    }

    /// Places keys where the keyed actor type `A` of `system` lives.
    pub fn follow<A>(self, system: SystemHandle) -> Self
    where
        A: Actor<Key = S::Key>,
    {
        self.placement(move |key, _| system.shard_of::<A>(key))
    }

    /// Binds `addr` on every shard of `handle`'s runtime (`SO_REUSEPORT`)
    /// and starts receiving.
    ///
    /// # Errors
    ///
    /// The OS error of a bind.
    pub fn bind(self, handle: &Handle, addr: SocketAddr) -> io::Result<DatagramServer<S>> {
        static IDS: AtomicU64 = AtomicU64::new(1);
        let shards = handle.shards();
        let mut sockets = Vec::with_capacity(shards);
        let mut bound = addr;
        for _ in 0..shards {
            let socket = socket2::Socket::new(
                socket2::Domain::for_address(bound),
                socket2::Type::DGRAM.cloexec(),
                Some(socket2::Protocol::UDP),
            )?;
            socket.set_reuse_port(true)?;
            socket.bind(&bound.into())?;
            let socket: std::net::UdpSocket = socket.into();
            bound = socket.local_addr()?;
            sockets.push(socket);
        }
        let shared = Arc::new(Shared::<S> {
            id: IDS.fetch_add(1, Ordering::Relaxed),
            handle: handle.clone(),
            config: self.config,
            factory: self.factory,
            placing: self.placing.unwrap_or_else(|| {
                Placing::By(Arc::new(|key: &S::Key, n| mailring::sticky_shard(key, n)))
            }),
            counters: (0..shards).map(|_| Counters::default()).collect(),
            live: AtomicUsize::new(0),
            closing: AtomicBool::new(false),
        });
        let mut tasks = Vec::with_capacity(shards);
        for (i, socket) in sockets.into_iter().enumerate() {
            let shared = shared.clone();
            tasks.push(handle.spawn_local_on(ShardId::new(i), move || async move {
                match UdpSocket::from_std(socket) {
                    Ok(socket) => shard_loop(shared, socket).await,
                    Err(e) => eprintln!("mailring-transports: datagram socket: {e}"),
                }
            }));
        }
        Ok(DatagramServer {
            addr: bound,
            shared,
            tasks,
        })
    }
}

/// A UDP server of [`DatagramSession`]s.
pub struct DatagramServer<S: DatagramSession> {
    addr: SocketAddr,
    shared: Arc<Shared<S>>,
    tasks: Vec<mailring::JoinHandle<()>>,
}

impl<S: DatagramSession> fmt::Debug for DatagramServer<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatagramServer")
            .field("addr", &self.addr)
            .field("sessions", &self.sessions())
            .finish()
    }
}

impl<S: DatagramSession> DatagramServer<S> {
    /// A server whose sessions `factory` makes, one per key.
    pub fn builder(
        factory: impl Fn(&S::Key) -> S + Send + Sync + 'static,
    ) -> DatagramServerBuilder<S> {
        DatagramServerBuilder {
            config: DatagramConfig::default(),
            factory: Arc::new(factory),
            placing: None,
        }
    }

    /// The bound address (with the port chosen for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sessions alive now.
    pub fn sessions(&self) -> usize {
        self.shared.live.load(Ordering::Acquire)
    }

    /// Counters per shard.
    pub fn stats(&self) -> Vec<DatagramShardStats> {
        self.shared
            .counters
            .iter()
            .map(Counters::snapshot)
            .collect()
    }

    /// Stops receiving and ends every session ([`DatagramClose::Shutdown`]:
    /// each handles what it already queued, then `on_close` runs). Returns
    /// the number of sessions it ended.
    pub async fn shutdown(mut self) -> usize {
        let open = self.shared.live.load(Ordering::Acquire);
        self.stop_receiving();
        let deadline = mailring::time::deadline_in(self.shared.config.shutdown_grace);
        for t in std::mem::take(&mut self.tasks) {
            let _ = t.await;
        }
        // Bounded: a handler that never finishes is not waited for past
        // the grace.
        while self.shared.live.load(Ordering::Acquire) > 0 && mailring::time::now() < deadline {
            mailring::time::sleep(Duration::from_millis(1)).await;
        }
        let left = self.shared.live.load(Ordering::Acquire).min(open);
        self.shared.handle.report_drained(
            format!("datagram server {}", self.addr),
            (open - left) as u64,
            left as u64,
        );
        open
    }

    /// Stops every shard's receive loop (which then closes its socket,
    /// once its sessions ended or had the shutdown's grace) and tells
    /// every session to end.
    fn stop_receiving(&self) {
        if self.shared.closing.swap(true, Ordering::AcqRel) {
            return;
        }
        for s in 0..self.shared.handle.shards() {
            let id = self.shared.id;
            self.shared.handle.run_on(ShardId::new(s), move || {
                if let Some(t) = table::<S>(id) {
                    let mut t = t.borrow_mut();
                    for slot in t.sessions.values() {
                        slot.stop.set(Some(DatagramClose::Shutdown));
                        slot.wake();
                    }
                    if let Some(w) = t.loop_waker.take() {
                        w.wake();
                    }
                }
            });
        }
    }
}

impl<S: DatagramSession> Drop for DatagramServer<S> {
    /// A server dropped without [`shutdown`](DatagramServer::shutdown)
    /// stops as it would, without waiting: its sockets close once its
    /// loops see it, and its sessions end with
    /// [`DatagramClose::Shutdown`].
    fn drop(&mut self) {
        self.stop_receiving();
    }
}

/// A shard's receive loop, with its sweeper for idle sessions and peers.
async fn shard_loop<S: DatagramSession>(shared: Arc<Shared<S>>, socket: UdpSocket) {
    let shard = mailring::current_shard().expect("on a shard");
    let socket = Rc::new(socket);
    let t: Rc<RefCell<Table<S>>> = Rc::new(RefCell::new(Table {
        socket: Some(socket.clone()),
        sessions: HashMap::new(),
        peers: HashMap::new(),
        none_quiet_until: None,
        loop_waker: None,
        queued: Rc::new(Cell::new(0)),
    }));
    TABLES.with(|tables| {
        tables
            .borrow_mut()
            .insert(shared.id, t.clone() as Rc<dyn std::any::Any>)
    });
    let early = EARLY.with(|e| e.borrow_mut().remove(&shared.id));
    for deliver in early.into_iter().flatten() {
        deliver();
    }
    let idle = shared.config.idle_timeout;
    let mut sweep = mailring::time::interval((idle / 4).max(Duration::from_millis(1)));
    // Several receives in flight: a tick of the ring takes a burst of
    // datagrams at once (one receive at a time costs a round trip through
    // the ring per datagram). Each has its buffer, kept across datagrams.
    // A receive has room for one byte past the limit: a datagram that
    // fills it is too long (the kernel cuts what does not fit).
    let max = shared.config.max_datagram.clamp(1, MAX_DATAGRAM);
    let receive = |buf: BytesMut| socket.recv_from(buf);
    let mut slots: Vec<_> = Vec::new();
    let start_slots = |slots: &mut Vec<_>| {
        *slots = (0..RECEIVES_IN_FLIGHT)
            .map(|_| Box::pin(Some(receive(BytesMut::with_capacity(max + 1)))))
            .collect();
    };
    let oversized = || {
        shared
            .counters(shard)
            .oversized
            .fetch_add(1, Ordering::Relaxed)
    };
    // One multishot receive over a ring of whole buffers where the kernel
    // has them (6.0+): no operation submitted per datagram. Before that,
    // several single receives in flight.
    let ring = shared
        .config
        .multishot_receive
        .then(|| mailring::buf::BufRing::whole(RING_BUFFERS, max + RING_HEADROOM).ok())
        .flatten();
    let mut multishot = ring.as_ref().map(|ring| socket.recv_from_multishot(ring));
    // Whether the multishot receive has delivered: a first failure of
    // `EINVAL` means the kernel lacks it, and the slots take over. So do
    // they when it ends, or fails again and again with nothing between.
    let mut multishot_proven = false;
    let mut multishot_failures = 0u32;
    if multishot.is_none() {
        start_slots(&mut slots);
    }
    let mut arrived: Vec<io::Result<(SocketAddr, Bytes)>> = Vec::new();
    loop {
        let got = std::future::poll_fn(|task| {
            if shared.closing.load(Ordering::Acquire) {
                return Poll::Ready(None);
            }
            t.borrow_mut().loop_waker = Some(task.waker().clone());
            let swept = std::pin::Pin::new(&mut sweep).poll_tick(task).is_ready();
            if let Some(incoming) = multishot.as_mut() {
                while arrived.len() < ARRIVALS_PER_WAKE {
                    match incoming.poll_next(task) {
                        Poll::Ready(Some(Ok(d))) => {
                            multishot_proven = true;
                            multishot_failures = 0;
                            if d.is_truncated() || d.payload().len() > max {
                                oversized();
                            } else {
                                arrived.push(Ok((d.peer(), Bytes::copy_from_slice(d.payload()))));
                            }
                        }
                        Poll::Ready(Some(Err(e)))
                            if !multishot_proven
                                && e.raw_os_error().is_some_and(|c| {
                                    c == libc::EINVAL || c == libc::EOPNOTSUPP
                                }) =>
                        {
                            multishot_failures = MULTISHOT_FAILURES_MAX;
                        }
                        Poll::Ready(Some(Err(e))) => {
                            multishot_failures += 1;
                            arrived.push(Err(e));
                        }
                        Poll::Ready(None) => multishot_failures = MULTISHOT_FAILURES_MAX,
                        Poll::Pending => break,
                    }
                    if multishot_failures >= MULTISHOT_FAILURES_MAX {
                        multishot = None;
                        start_slots(&mut slots);
                        task.waker().wake_by_ref();
                        break;
                    }
                }
                if arrived.len() >= ARRIVALS_PER_WAKE {
                    // More may be waiting: polled again at the next wake.
                    task.waker().wake_by_ref();
                }
            }
            for slot in &mut slots {
                let Some(op) = slot.as_mut().as_pin_mut() else {
                    continue;
                };
                if let Poll::Ready((res, mut buf)) = op.poll(task) {
                    match res {
                        Ok((n, _)) if n > max => {
                            oversized();
                        }
                        Ok((n, from)) => {
                            // Small datagrams are copied out and the buffer
                            // kept; a big one takes the buffer along, when
                            // it fills half of it at least (a queued
                            // datagram holds at most twice its size).
                            let datagram = if n <= COPY_OUT_MAX || n < buf.capacity() / 2 {
                                Bytes::copy_from_slice(&buf[..n])
                            } else {
                                let d = buf.split().freeze();
                                buf.reserve(max + 1);
                                d
                            };
                            arrived.push(Ok((from, datagram)));
                        }
                        Err(e) => arrived.push(Err(e)),
                    }
                    buf.clear();
                    slot.set(Some(receive(buf)));
                    // Polled again at the next wake (it may complete at
                    // once and would starve the others here).
                    task.waker().wake_by_ref();
                }
            }
            if swept || !arrived.is_empty() {
                Poll::Ready(Some(swept))
            } else {
                Poll::Pending
            }
        })
        .await;
        let Some(swept) = got else { break };
        if swept {
            sweep_idle::<S>(&shared, &t);
            // Ticks missed while the shard was held up are not caught up
            // one after another: one sweep, then a period from now.
            sweep.reset();
        }
        // An error (the ICMP answer to an earlier send, ECONNREFUSED and
        // the like) concerns one peer, not the socket: skipped. The
        // datagrams of one wake arrived together: one clock read.
        let now = mailring::time::now();
        for (peer, datagram) in arrived.drain(..).flatten() {
            shared
                .counters(shard)
                .datagrams_in
                .fetch_add(1, Ordering::Relaxed);
            arrive(&shared, &t, shard, peer, datagram, now);
        }
    }
    // The shutdown's own pass over this shard may come after the table
    // is gone (this loop can see `closing` first, woken by something
    // else): the sessions are told here too, or one would never end.
    for slot in t.borrow().sessions.values() {
        slot.stop.set(Some(DatagramClose::Shutdown));
        slot.wake();
    }
    TABLES.with(|tables| tables.borrow_mut().remove(&shared.id));
    // The sessions hold the table, and with it the socket, which would
    // stay in the port's reuse group, read by nobody, as long as one of
    // them runs (a handler that never finishes): it goes once they end,
    // or at the shutdown's grace, whichever comes first (their later
    // sends are dropped and counted). Then it closes once no send uses it
    // (this loop's own reference goes as it returns).
    if t.borrow().sessions.is_empty() {
        t.borrow_mut().socket = None;
    } else {
        let grace = shared.config.shutdown_grace;
        mailring::spawn_local(async move {
            let deadline = mailring::time::deadline_in(grace);
            while !t.borrow().sessions.is_empty() && mailring::time::now() < deadline {
                mailring::time::sleep(Duration::from_millis(1)).await;
            }
            t.borrow_mut().socket = None;
        });
    }
}

/// A datagram received on this shard: keyed, then delivered here or
/// handed to its key's shard.
fn arrive<S: DatagramSession>(
    shared: &Arc<Shared<S>>,
    t: &Rc<RefCell<Table<S>>>,
    shard: ShardId,
    peer: SocketAddr,
    datagram: Bytes,
    now: Instant,
) {
    let mut cached = None;
    let known = t.borrow_mut().peers.get_mut(&PeerAddr(peer)).map(|known| {
        known.last = now;
        cached = known.slot.clone().filter(|slot| !slot.ended.get());
        known.key.clone()
    });
    let is_new = known.is_none();
    let key = match known {
        Some(key) => key,
        None => {
            let keyed =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| S::key(&datagram, peer)));
            match keyed {
                Ok(Some(key)) => key,
                Ok(None) => return garbage(shared, shard, None),
                Err(payload) => return garbage(shared, shard, Some(payload)),
            }
        }
    };
    let n = shared.handle.shards();
    let owner = match &shared.placing {
        Placing::By(place) => {
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| place(&key, n))) {
                Ok(owner) => Some(owner).filter(|s| s.index() < n).unwrap_or(shard),
                // The user's placement panicked on this key: its datagram
                // is dropped, as one whose key cannot be read, and the
                // receive loop goes on.
                Err(payload) => return garbage(shared, shard, Some(payload)),
            }
        }
        Placing::WhereReceived => shard,
    };
    if is_new {
        // Remembered once its key is placed. Remembered peers are bounded
        // like sessions. At the bound, peers quiet for a quarter of the
        // idle timeout give way (their sessions may have closed long
        // ago); peers heard from more recently are kept (a later datagram
        // of theirs may not repeat the key), and the newcomer is refused.
        let mut t = t.borrow_mut();
        if t.peers.len() >= shared.config.max_sessions.max(1) {
            let quiet = shared.config.idle_timeout / 4;
            let room = if t.none_quiet_until.is_some_and(|until| now < until) {
                false
            } else {
                shared
                    .counters(shard)
                    .quiet_peer_looks
                    .fetch_add(1, Ordering::Relaxed);
                let quarter = (t.peers.len() / 4).max(1);
                let (forgot, next_quiet) = forget_quiet_peers(&mut t.peers, now, quiet);
                if forgot < quarter {
                    // Few were quiet: looked at again once one more may be,
                    // and not before an eighth of the wait. A flood of
                    // newcomers costs one look per period, not one each,
                    // also when each look frees a place or two (peers that
                    // fall quiet one at a time).
                    let next = next_quiet.max(mailring::time::deadline_in(quiet / 8));
                    t.none_quiet_until = Some(next);
                }
                forgot > 0
            };
            if !room {
                shared
                    .counters(shard)
                    .over_capacity
                    .fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        t.peers.insert(
            PeerAddr(peer),
            Peer {
                key: key.clone(),
                last: now,
                slot: None,
            },
        );
    }
    if owner == shard {
        if let Some(slot) = cached {
            // The key's session here, as this peer's last datagram found.
            if !shared.closing.load(Ordering::Acquire) {
                into_slot(shared, shard, &slot, peer, datagram, now);
            }
            return;
        }
        if let Some(slot) = deliver(shared, t, shard, key, peer, datagram, now) {
            if let Some(known) = t.borrow_mut().peers.get_mut(&PeerAddr(peer)) {
                known.slot = Some(slot);
            }
        }
    } else {
        let Some(transit) = InTransit::take(shared, owner) else {
            shared
                .counters(shard)
                .handoff_full
                .fetch_add(1, Ordering::Relaxed);
            return;
        };
        shared
            .counters(shard)
            .forwarded
            .fetch_add(1, Ordering::Relaxed);
        shared.handle.clone().run_on(owner, move || {
            let shared = transit.taken();
            if let Some(t) = table::<S>(shared.id) {
                let now = mailring::time::now();
                deliver(&shared, &t, owner, key, peer, datagram, now);
            } else if !shared.closing.load(Ordering::Acquire) {
                let id = shared.id;
                let counters = shared.clone();
                let later: Early = Box::new(move || {
                    if let Some(t) = table::<S>(shared.id) {
                        let now = mailring::time::now();
                        deliver(&shared, &t, owner, key, peer, datagram, now);
                    }
                });
                // Bounded: a shard whose loop never starts (its socket
                // refused) must not gather datagrams forever.
                let kept = EARLY.with(|e| {
                    let mut e = e.borrow_mut();
                    let waiting = e.entry(id).or_default();
                    if waiting.len() < counters.config.session_queue.max(1) {
                        waiting.push(later);
                        true
                    } else {
                        false
                    }
                });
                if !kept {
                    counters
                        .counters(owner)
                        .queue_full
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
}

/// A place among the datagrams handed to a shard and not yet taken by it
/// ([`DatagramConfig::handoff_queue`]), carrying the server to the hand-off;
/// given back when taken there, or when dropped unrun (the runtime shutting
/// down).
struct InTransit<S: DatagramSession> {
    shared: Option<Arc<Shared<S>>>,
    owner: ShardId,
}

impl<S: DatagramSession> InTransit<S> {
    fn take(shared: &Arc<Shared<S>>, owner: ShardId) -> Option<InTransit<S>> {
        let waiting = &shared.counters(owner).in_transit;
        if waiting.fetch_add(1, Ordering::Relaxed) >= shared.config.handoff_queue.max(1) {
            waiting.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        Some(InTransit {
            shared: Some(shared.clone()),
            owner,
        })
    }

    /// Taken by the shard it was handed to: the place is given back.
    fn taken(mut self) -> Arc<Shared<S>> {
        let shared = self.shared.take().expect("taken once");
        shared
            .counters(self.owner)
            .in_transit
            .fetch_sub(1, Ordering::Relaxed);
        shared
    }
}

impl<S: DatagramSession> Drop for InTransit<S> {
    fn drop(&mut self) {
        if let Some(shared) = &self.shared {
            shared
                .counters(self.owner)
                .in_transit
                .fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Drops a datagram whose key could not be read or placed (the user's
/// code said none, or panicked with `panic`), and counts it.
fn garbage<S: DatagramSession>(
    shared: &Shared<S>,
    shard: ShardId,
    panic: Option<Box<dyn std::any::Any + Send>>,
) {
    if let Some(payload) = panic {
        mailring::panic::report_caught(CallbackKind::Handler, &*payload);
        mailring::panic::drop_payload(payload);
    }
    shared
        .counters(shard)
        .garbage
        .fetch_add(1, Ordering::Relaxed);
}

/// Forgets remembered peers not heard from for `quiet` (at most a
/// quarter of them, and at least one, the longest quiet first); how many
/// it forgot, and the first moment a peer it kept may be quiet (now, if
/// some already are). A table at its bound makes room in one pass, paid
/// for by the next quarter of new peers.
fn forget_quiet_peers<K>(
    peers: &mut HashMap<PeerAddr, Peer<K>>,
    now: Instant,
    quiet: Duration,
) -> (usize, Instant) {
    // When the first peer kept may be quiet.
    let mut next_quiet = now.checked_add(quiet).unwrap_or(now);
    let mut seen: Vec<Instant> = Vec::new();
    for peer in peers.values() {
        if now.saturating_duration_since(peer.last) >= quiet {
            seen.push(peer.last);
        } else {
            next_quiet = next_quiet.min(peer.last.checked_add(quiet).unwrap_or(now));
        }
    }
    if seen.is_empty() {
        return (0, next_quiet);
    }
    let forget = (peers.len() / 4).clamp(1, seen.len());
    let (_, cutoff, _) = seen.select_nth_unstable(forget - 1);
    let cutoff = *cutoff;
    let mut left = forget;
    peers.retain(|_, peer| {
        if left > 0 && peer.last <= cutoff {
            left -= 1;
            false
        } else {
            true
        }
    });
    // Quiet peers kept (more than a quarter were quiet) are quiet now.
    if forget < seen.len() {
        next_quiet = now;
    }
    (forget, next_quiet)
}

/// Puts a datagram in its session's inbox on this (the key's) shard,
/// opening the session if it has none; gives the session's slot.
fn deliver<S: DatagramSession>(
    shared: &Arc<Shared<S>>,
    t: &Rc<RefCell<Table<S>>>,
    shard: ShardId,
    key: S::Key,
    peer: SocketAddr,
    datagram: Bytes,
    now: Instant,
) -> Option<Rc<Slot>> {
    if shared.closing.load(Ordering::Acquire) {
        return None;
    }
    let counters = shared.counters(shard);
    let existing = t.borrow().sessions.get(&key).cloned();
    let slot = match existing {
        Some(slot) => slot,
        None => {
            // Claim a place under the cap first.
            let claimed = shared
                .live
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < shared.config.max_sessions).then_some(n + 1)
                })
                .is_ok();
            if !claimed {
                counters.over_capacity.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            let made =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (shared.factory)(&key)));
            let session = match made {
                Ok(s) => s,
                Err(payload) => {
                    mailring::panic::report_caught(CallbackKind::Factory, &*payload);
                    mailring::panic::drop_payload(payload);
                    counters.panicked.fetch_add(1, Ordering::Relaxed);
                    shared.live.fetch_sub(1, Ordering::AcqRel);
                    return None;
                }
            };
            let queued = t.borrow().queued.clone();
            let slot = Rc::new(Slot::new(queued, now));
            t.borrow_mut().sessions.insert(key.clone(), slot.clone());
            counters.opened.fetch_add(1, Ordering::Relaxed);
            mailring::spawn_local(run_session(
                shared.clone(),
                t.clone(),
                shard,
                key,
                slot.clone(),
                session,
                peer,
            ));
            slot
        }
    };
    into_slot(shared, shard, &slot, peer, datagram, now);
    Some(slot)
}

/// Puts a datagram in a session's inbox (on its shard, this one).
fn into_slot<S: DatagramSession>(
    shared: &Shared<S>,
    shard: ShardId,
    slot: &Slot,
    peer: SocketAddr,
    datagram: Bytes,
    now: Instant,
) {
    slot.last.set(now);
    // Marked idle by the sweep but not ended yet: it lives on.
    if slot.stop.get() == Some(DatagramClose::IdleTimeout) {
        slot.stop.set(None);
    }
    let mut inbox = slot.inbox.borrow_mut();
    if inbox.len() >= shared.config.session_queue.max(1) {
        shared
            .counters(shard)
            .queue_full
            .fetch_add(1, Ordering::Relaxed);
        return;
    }
    let cost = queued_cost(&datagram);
    if slot.queued.get() + cost > shared.config.max_queued_bytes {
        shared
            .counters(shard)
            .queued_bytes_full
            .fetch_add(1, Ordering::Relaxed);
        return;
    }
    inbox.push_back((peer, datagram));
    drop(inbox);
    slot.charge(cost);
    slot.wake();
}

/// Ends idle sessions and forgets idle peers on this shard.
fn sweep_idle<S: DatagramSession>(shared: &Shared<S>, t: &Rc<RefCell<Table<S>>>) {
    let now = mailring::time::now();
    let idle = shared.config.idle_timeout;
    let mut t = t.borrow_mut();
    t.peers
        .retain(|_, peer| now.duration_since(peer.last) < idle);
    for slot in t.sessions.values() {
        if now.duration_since(slot.last.get()) >= idle && slot.stop.get().is_none() {
            slot.stop.set(Some(DatagramClose::IdleTimeout));
            slot.wake();
        }
    }
}

/// A session's task: its datagrams one at a time, its replies, its end.
async fn run_session<S: DatagramSession>(
    shared: Arc<Shared<S>>,
    t: Rc<RefCell<Table<S>>>,
    shard: ShardId,
    key: S::Key,
    slot: Rc<Slot>,
    mut session: S,
    first_peer: SocketAddr,
) {
    let mut cx = DatagramCtx {
        peer: first_peer,
        shard,
        out: Vec::new(),
        close: false,
    };
    let reason = loop {
        let next = std::future::poll_fn(|task| {
            if let Some(d) = slot.take_next() {
                return Poll::Ready(Ok(d));
            }
            if let Some(reason) = slot.stop.get() {
                return Poll::Ready(Err(reason));
            }
            *slot.waker.borrow_mut() = Some(task.waker().clone());
            Poll::Pending
        })
        .await;
        let (peer, datagram) = match next {
            Ok(d) => d,
            Err(reason) => break reason,
        };
        cx.peer = peer;
        // The session's code runs under `catch_unwind` wherever it runs:
        // as `on_datagram` makes its future (code before an `async` block),
        // as the future is polled, and as it is dropped.
        let mid_way;
        let mut timed_out = false;
        let handled = {
            let (s, c) = (&mut session, &mut cx);
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
                S::on_datagram(s, datagram, c)
            })) {
                Err(payload) => {
                    mid_way = true;
                    Err(payload)
                }
                Ok(future) => {
                    let mut handling = pin!(Some(future));
                    // Made at the handler's first wait: one that finishes
                    // at once never touches the timers.
                    let mut deadline: Option<mailring::time::Sleep> = None;
                    let polled = std::future::poll_fn(|task| {
                        let Some(future) = handling.as_mut().as_pin_mut() else {
                            return Poll::Ready(Ok(true));
                        };
                        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            future.poll(task)
                        })) {
                            Ok(Poll::Ready(())) => return Poll::Ready(Ok(true)),
                            Ok(Poll::Pending) => {}
                            Err(payload) => return Poll::Ready(Err(payload)),
                        }
                        let Some(limit) = shared.config.handler_timeout else {
                            return Poll::Pending;
                        };
                        let sleep = deadline.get_or_insert_with(|| mailring::time::sleep(limit));
                        match std::pin::Pin::new(sleep).poll(task) {
                            Poll::Ready(()) => Poll::Ready(Ok(false)),
                            Poll::Pending => Poll::Pending,
                        }
                    })
                    .await;
                    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        handling.set(None);
                    }));
                    // Given up at the deadline: dropped mid-way.
                    timed_out = matches!(polled, Ok(false));
                    mid_way = !matches!(polled, Ok(true));
                    polled.map(drop).and(dropped)
                }
            }
        };
        if mid_way {
            // What a handler queued before it panicked on its way is not
            // sent (as a connection's unsent replies are not): its state
            // may be half changed. One that finished, then panicked as its
            // future was dropped, did its work: its replies go.
            cx.out.clear();
        }
        if let Err(payload) = handled {
            mailring::panic::report_caught(CallbackKind::Handler, &*payload);
            mailring::panic::drop_payload(payload);
            break DatagramClose::Panicked;
        }
        if timed_out {
            break DatagramClose::HandlerTimeout;
        }
        send_out(&shared, &t, shard, &mut cx).await;
        if cx.close {
            break DatagramClose::ClosedBySession;
        }
    };
    // Off the table first: a datagram from now on opens a new session.
    // Those already queued behind the end go to that new session too.
    // Taken whole (its room freed too): a peer's entry may keep the ended
    // slot until the peer is forgotten.
    let left = slot.take_all();
    slot.waker.borrow_mut().take();
    {
        let mut table = t.borrow_mut();
        if table
            .sessions
            .get(&key)
            .is_some_and(|s| Rc::ptr_eq(s, &slot))
        {
            table.sessions.remove(&key);
        }
        slot.ended.set(true);
    }
    if reason == DatagramClose::IdleTimeout {
        shared
            .counters(shard)
            .expired
            .fetch_add(1, Ordering::Relaxed);
    }
    if reason == DatagramClose::HandlerTimeout {
        shared
            .counters(shard)
            .handler_timeouts
            .fetch_add(1, Ordering::Relaxed);
    }
    if reason == DatagramClose::Panicked {
        shared
            .counters(shard)
            .panicked
            .fetch_add(1, Ordering::Relaxed);
    } else {
        let closed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            session.on_close(reason, &mut cx)
        }));
        if let Err(payload) = closed {
            mailring::panic::report_caught(CallbackKind::Handler, &*payload);
            mailring::panic::drop_payload(payload);
        }
    }
    // Its place goes back, and the datagrams queued behind its end go to
    // the key's next session, before anything can arrive for the key (no
    // wait since it left the table): they keep their order ahead of later
    // ones. Then its last replies (from `on_close`) are sent.
    shared.live.fetch_sub(1, Ordering::AcqRel);
    let now = mailring::time::now();
    for (peer, datagram) in left {
        deliver(&shared, &t, shard, key.clone(), peer, datagram, now);
    }
    send_out(&shared, &t, shard, &mut cx).await;
}

/// Sends what the session queued, from this shard's socket.
async fn send_out<S: DatagramSession>(
    shared: &Shared<S>,
    t: &Rc<RefCell<Table<S>>>,
    shard: ShardId,
    cx: &mut DatagramCtx,
) {
    if cx.out.is_empty() {
        return;
    }
    let counters = shared.counters(shard);
    let Some(socket) = t.borrow().socket.clone() else {
        // The server stopped and this session outlived its grace.
        counters
            .send_errors
            .fetch_add(cx.out.len() as u64, Ordering::Relaxed);
        cx.out.clear();
        return;
    };
    for (peer, datagram) in cx.out.drain(..) {
        // At once when the socket has room (a datagram send never waits
        // for the peer); through the ring, waiting for room, when not.
        let sent = match socket.try_send_to(&datagram, peer) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                socket.send_to(datagram, peer).await.0
            }
            done => done,
        };
        match sent {
            Ok(_) => counters.datagrams_out.fetch_add(1, Ordering::Relaxed),
            Err(_) => counters.send_errors.fetch_add(1, Ordering::Relaxed),
        };
    }
}
