//! Servers: listeners (one `SO_REUSEPORT` listener per shard, or a single
//! acceptor), the per-connection driver (read, decode, handle, ordered
//! replies, write), the move of a connection to its key's shard, limits,
//! timeouts and shutdown.

use std::any::Any;
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::{pin, Pin};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::BytesMut;
use mailring_actors::mailring::net::TcpListener;
use mailring_actors::mailring::time::{deadline_in, sleep_until, Sleep};
use mailring_actors::mailring::{self, Handle, ShardId};
use mailring_actors::{Actor, SystemHandle};

use crate::codec::{Codec, CodecError};
use crate::conn::{Conn, Listener, StdListener};
use crate::proxy::{Parsed, ProxyError, ProxyHeader};
use crate::session::{CloseKind, CloseReason, CloserState, FrameIn, Route, Session, SessionCtx};
use crate::stats::{ServerStats, ShardCounters};
use crate::tls::{TlsAcceptor, TlsFailure};
use mailring_actors::mailring::CallbackKind;

/// How a server listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ListenMode {
    /// One listener per shard on the same address (`SO_REUSEPORT`): the
    /// kernel spreads connections over the shards.
    #[default]
    ReusePort,
    /// One listener on one shard, which accepts every connection.
    SingleAcceptor(ShardId),
}

/// How a connection moves between shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HandOff {
    /// As a plain descriptor: taken off the accepting ring, adopted by the
    /// owner's (works everywhere).
    #[default]
    Descriptor,
    /// As a direct descriptor: each TCP connection is moved into its
    /// shard's registered table when accepted (I/O by slot) and sent to the
    /// owner's ring with `IORING_MSG_SEND_FD`. Needs
    /// `Builder::direct_descriptors` on the runtime and kernel 6.0+; a
    /// connection that finds no room when accepted (no table, table full)
    /// stays a plain descriptor, counted in
    /// `SessionShardStats::direct_refused`; one whose move then finds the
    /// owner's table full becomes a plain descriptor again (kernel 6.8+,
    /// `IORING_OP_FIXED_FD_INSTALL`), travels as one and is counted there
    /// too; on an older kernel it has no descriptor to fall back on and
    /// closes with `CloseReason::HandOff` (size the tables for the
    /// connections a shard may own). Unix connections always move as
    /// descriptors.
    Direct,
}

/// What a peer's end (its side of the connection closed) does to the
/// replies still owed to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PeerClose {
    /// They are finished and written, then the connection closes: a
    /// client that shuts its sending side after its last request (a
    /// half-close) still gets every answer.
    #[default]
    FinishReplies,
    /// While the session is blocked on a reply that may take forever
    /// ([`SessionCtx::block_until_replied`], as after a blocking read), the
    /// peer's end is watched for, with a poll that takes no byte; once it
    /// is seen, the replies before the blocked one are finished and
    /// written, and the connection closes, the blocked reply dropped (its
    /// future with it): a client blocked and then gone is noticed, as
    /// Redis frees a blocked client whose socket reads 0. Otherwise as
    /// [`FinishReplies`](Self::FinishReplies).
    CloseWhileBlocked,
}

/// A server's limits and timeouts.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServerConfig {
    /// How the server listens.
    pub listen: ListenMode,
    /// Deferred replies ([`SessionCtx::reply_later`]) a session may have
    /// outstanding; reading pauses at this many. Default 32.
    pub pipeline_window: usize,
    /// Bytes asked of each receive. Default 16 KiB. A connection whose
    /// last few reads were small and that has nothing buffered asks for
    /// 2 KiB (or this, if less) in a buffer of that size, so an idle
    /// connection does not hold a whole chunk; a read that fills it is
    /// followed by full chunks until reads have been small again for a
    /// while.
    pub read_chunk: usize,
    /// Queued outbound bytes past which [`Session::on_backpressure`] runs.
    /// Default 1 MiB.
    pub outbound_high_water: usize,
    /// Queued outbound bytes past which the connection closes with
    /// [`CloseReason::SlowReader`], once a send has stayed in flight for
    /// [`slow_reader_grace`](Self::slow_reader_grace) with them queued.
    /// Past it no request or push is taken. Default 8 MiB.
    pub outbound_limit: usize,
    /// How long a send may stay in flight while more than
    /// [`outbound_limit`](Self::outbound_limit) bytes wait behind it
    /// before the peer counts as a slow reader. A send carries at most
    /// [`outbound_high_water`](Self::outbound_high_water) bytes (64 KiB
    /// if that is less), so a peer that reads keeps its sends completing,
    /// however big a reply or however much its pipeline's replies add at
    /// once (Redis closes no normal client for its output): with the
    /// defaults, a peer is a slow reader once it takes less than 1 MiB in
    /// 10 s with more than 8 MiB owed to it. Default 10 s.
    pub slow_reader_grace: Duration,
    /// Pushes ([`SessionsByKey::push`]) a session holds while it is busy
    /// (they run between its frames); past it, more are dropped and
    /// counted ([`SessionShardStats::pushes_dropped`](crate::SessionShardStats)).
    /// Default 1024.
    pub push_queue: usize,
    /// What the peer's end does to replies still owed. Default
    /// [`PeerClose::FinishReplies`].
    pub on_peer_close: PeerClose,
    /// Close a connection when nothing arrives for this long and nothing
    /// is outstanding or being written ([`CloseReason::IdleTimeout`]); a
    /// send still in flight after two such periods means the peer stopped
    /// reading ([`CloseReason::SlowReader`]). Default none.
    pub idle_timeout: Option<Duration>,
    /// Close a connection whose session names no key within this time.
    /// Default none.
    pub handshake_timeout: Option<Duration>,
    /// Close a connection that starts a frame and does not finish it within
    /// this time. Default 30 s.
    pub frame_timeout: Option<Duration>,
    /// Close a connection whose `on_frame` handler is still running this
    /// long after it first waited (one that never waits is not timed;
    /// [`CloseReason::HandlerTimeout`]): the handler is dropped
    /// where it waits (an upstream that never answers), with the replies
    /// not yet written. Without it such a handler holds its connection,
    /// and its place under the limits, until the shutdown's grace runs
    /// out, even after the peer has gone: nothing reads the socket while
    /// a handler runs. Default none (as tower's timeout layer, it is
    /// asked for); deferred replies ([`SessionCtx::reply_later`]) do not
    /// count, their handler having returned.
    pub handler_timeout: Option<Duration>,
    /// With [`ListenMode::ReusePort`] on TCP: steer each connection to
    /// listener `mailring::net::steered_index(source port, shards)` (a
    /// multiplicative hash of the port, in a classic BPF program on the
    /// group), so a client that picks its source port
    /// ([`Framed::connect_tcp_to_shard`](crate::Framed::connect_tcp_to_shard))
    /// lands on its key's shard with no hand-off; other clients' ephemeral
    /// ports spread over the shards. Default on; where the kernel
    /// refuses the program the server says so on stderr and runs unsteered
    /// ([`Server::is_steered`]).
    pub source_port_steering: bool,
    /// How a connection moves to its key's shard. Default
    /// [`HandOff::Descriptor`].
    pub hand_off: HandOff,
    /// Sessions attached to one key at once; past it, a new session of the
    /// key gets [`Session::refusal`] and closes with
    /// [`CloseReason::KeyLimit`]. Default none.
    pub max_per_key: Option<usize>,
    /// Connections served at once by each listener; at the limit the
    /// listener stops accepting (counted in [`ServerStats`]) until one
    /// closes. Default 10,000.
    pub max_connections: usize,
    /// Connections served at once by the whole server, past which a new
    /// connection is still accepted but only to be refused: it gets the
    /// session's [`Session::refusal`] for [`CloseReason::ClientLimit`]
    /// (asked at once, sent after the TLS handshake on a TLS server), no
    /// `on_open`, and closes, as Redis answers past `maxclients`. A client
    /// learns why instead of waiting in the listen backlog. The refused
    /// count among the connections until they close, so `max_connections`
    /// still bounds the descriptors a flood takes. Default none.
    pub max_clients: Option<usize>,
    /// How long [`Server::shutdown`] lets sessions finish what they have
    /// started before closing them. Default 5 s.
    pub shutdown_grace: Duration,
    /// Every connection starts with a PROXY protocol header (v1 or v2, as
    /// a load balancer such as HAProxy writes with `send-proxy` or
    /// `send-proxy-v2`): the client's address it gives is the session's
    /// peer address (the factory's argument, [`SessionCtx::peer_addr`],
    /// keys and limits by address), and [`SessionCtx::proxy_header`] keeps
    /// the whole header. A connection without a valid header closes with
    /// [`CloseReason::ProxyHeader`] before any session is made. Only for
    /// listeners that nothing but the proxy can reach: the header is
    /// believed. Default off.
    pub proxy_protocol: bool,
    /// How long a connection may take to send its PROXY header. Default
    /// 5 s.
    pub proxy_header_timeout: Duration,
    /// Move each fresh plain (not TLS) connection to the least loaded
    /// shard before it is read, as fresh TLS connections always are: for
    /// servers of long-lived connections whose sessions name no key (the
    /// kernel's spread of a few connections over the reuseport listeners
    /// is uneven, and a connection stays where it starts). A move is a
    /// hand-off of the descriptor; a session that names a key moves again,
    /// to its key's shard, so leave it off for keyed sessions and short
    /// connections. Counted in
    /// [`SessionShardStats::balanced_away`](crate::SessionShardStats::balanced_away).
    /// Default off.
    pub balance_plain_connections: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: ListenMode::ReusePort,
            pipeline_window: 32,
            read_chunk: 16 << 10,
            outbound_high_water: 1 << 20,
            outbound_limit: 8 << 20,
            slow_reader_grace: Duration::from_secs(10),
            push_queue: 1024,
            on_peer_close: PeerClose::FinishReplies,
            idle_timeout: None,
            handshake_timeout: None,
            frame_timeout: Some(Duration::from_secs(30)),
            handler_timeout: None,
            source_port_steering: true,
            hand_off: HandOff::Descriptor,
            max_per_key: None,
            max_connections: 10_000,
            max_clients: None,
            shutdown_grace: Duration::from_secs(5),
            proxy_protocol: false,
            proxy_header_timeout: Duration::from_secs(5),
            balance_plain_connections: false,
        }
    }
}

type Placer<K> = Arc<dyn Fn(&K, usize) -> ShardId + Send + Sync>;
type Factory<S> = Arc<dyn Fn(Option<SocketAddr>) -> S + Send + Sync>;

/// What every shard's part of a server shares.
struct Shared<S: Session> {
    id: u64,
    handle: Handle,
    config: ServerConfig,
    codec: S::Codec,
    factory: Factory<S>,
    placer: Placer<S::Key>,
    tls: Option<TlsAcceptor>,
    /// TLS handshakes in progress, per shard.
    handshaking: Box<[AtomicUsize]>,
    counters: Box<[ShardCounters]>,
    next_conn: AtomicU64,
    /// Connections served now, per listener index.
    per_listener: Box<[AtomicUsize]>,
    live: AtomicUsize,
    /// Connections served now, not counting those accepted to be refused
    /// past [`ServerConfig::max_clients`] (what that limit counts).
    served: AtomicUsize,
    closing: AtomicBool,
    /// Past the grace period: close whatever is still open.
    forced: AtomicBool,
}

impl<S: Session> Shared<S> {
    fn counters(&self, shard: ShardId) -> &ShardCounters {
        &self.counters[shard.index()]
    }

    /// The key's shard, or `None` when the placement names one the runtime
    /// does not have (a custom function, or an actor type pinned past the
    /// last shard).
    fn place(&self, key: &S::Key) -> Option<ShardId> {
        let n = self.handle.shards();
        Some((self.placer)(key, n)).filter(|s| s.index() < n)
    }
}

/// Builds a [`Server`].
pub struct ServerBuilder<S: Session> {
    config: ServerConfig,
    codec: S::Codec,
    factory: Factory<S>,
    placer: Option<Placer<S::Key>>,
    tls: Option<TlsAcceptor>,
    steered: bool,
}

impl<S: Session> std::fmt::Debug for ServerBuilder<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerBuilder")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<S: Session> ServerBuilder<S> {
    /// Sets the limits and timeouts.
    pub fn config(mut self, config: ServerConfig) -> Self {
        self.config = config;
        self
    }

    /// Places keys with `place(key, shards)` instead of the default
    /// `mailring::sticky_shard` (the placement of `Sticky` keyed actors).
    pub fn placement(
        mut self,
        place: impl Fn(&S::Key, usize) -> ShardId + Send + Sync + 'static,
    ) -> Self {
        self.placer = Some(Arc::new(place));
        self
    }

    /// Serves TLS: each accepted connection runs the server side of a
    /// handshake with `acceptor`'s configuration (within its handshake
    /// timeout) before [`Session::on_open`]; sessions read and write
    /// plaintext, and [`SessionCtx::tls`] tells what the handshake agreed
    /// (SNI, ALPN). A failed handshake closes only its connection, with
    /// [`CloseReason::Tls`]. The connection moves to its key's shard with
    /// its TLS state.
    pub fn tls(mut self, acceptor: TlsAcceptor) -> Self {
        self.tls = Some(acceptor);
        self
    }

    /// Places keys where the keyed actor type `A` of `system` lives, so a
    /// session and the actor of its key share a shard whatever `A`'s
    /// placement (sticky, pinned, a custom function, stealable, balanced).
    pub fn follow<A>(self, system: SystemHandle) -> Self
    where
        A: Actor<Key = S::Key>,
    {
        self.placement(move |key, _| system.shard_of::<A>(key))
    }

    /// Binds `addr` on the runtime of `handle` and starts accepting.
    ///
    /// # Errors
    ///
    /// The OS error of a bind, or an error for a shard the runtime lacks.
    pub fn bind(mut self, handle: &Handle, addr: SocketAddr) -> io::Result<Server<S>> {
        let shards = match self.config.listen {
            ListenMode::ReusePort => (0..handle.shards()).map(ShardId::new).collect(),
            ListenMode::SingleAcceptor(s) => vec![check_shard(handle, s)?],
        };
        let reuse_port = matches!(self.config.listen, ListenMode::ReusePort);
        if reuse_port && addr.port() != 0 {
            // A reuseport group would silently share the port with another
            // process's group (same user) and split its connections: a
            // plain socket binds only where nobody listens, so try one
            // first and refuse with `AddrInUse` as a single listener would.
            drop(probe_port(addr)?);
        }
        // Bind every socket here, so an error comes back to the caller and
        // port 0 is resolved once for the whole group.
        let mut sockets = Vec::with_capacity(shards.len());
        let mut bound = addr;
        for _ in &shards {
            let socket = TcpListener::bind_std(bound, reuse_port)?;
            bound = socket.local_addr()?;
            sockets.push(StdListener::Tcp(socket));
        }
        let mut steered = false;
        if reuse_port && self.config.source_port_steering {
            if let Some(StdListener::Tcp(first)) = sockets.first() {
                use std::os::fd::AsFd;
                match mailring::net::steer_by_source_port(first.as_fd(), sockets.len()) {
                    Ok(()) => steered = true,
                    Err(e) => tracing_error("source-port steering (running unsteered)", &e),
                }
            }
        }
        self.steered = steered;
        Ok(self.start(
            handle,
            shards.into_iter().zip(sockets).collect(),
            ListenAddr::Tcp(bound),
        ))
    }

    /// Binds the Unix socket `path` and starts accepting on one shard (the
    /// `SingleAcceptor` shard, or shard 0: Unix sockets have no
    /// `SO_REUSEPORT`). Unix peers have no address: the factory gets `None`.
    ///
    /// # Errors
    ///
    /// The OS error of the bind (e.g. `AddrInUse` when `path` exists).
    pub fn bind_unix(self, handle: &Handle, path: impl AsRef<Path>) -> io::Result<Server<S>> {
        let shard = match self.config.listen {
            ListenMode::ReusePort => ShardId::new(0),
            ListenMode::SingleAcceptor(s) => check_shard(handle, s)?,
        };
        let path = path.as_ref().to_path_buf();
        let listener = std::os::unix::net::UnixListener::bind(&path)?;
        Ok(self.start(
            handle,
            vec![(shard, StdListener::Unix(listener))],
            ListenAddr::Unix(path),
        ))
    }

    fn start(
        self,
        handle: &Handle,
        listeners: Vec<(ShardId, StdListener)>,
        addr: ListenAddr,
    ) -> Server<S> {
        static SERVER_IDS: AtomicU64 = AtomicU64::new(1);
        let steered = self.steered;
        let shared = Arc::new(Shared::<S> {
            id: SERVER_IDS.fetch_add(1, Ordering::Relaxed),
            handle: handle.clone(),
            codec: self.codec,
            factory: self.factory,
            placer: self
                .placer
                .unwrap_or_else(|| Arc::new(|key: &S::Key, n| mailring::sticky_shard(key, n))),
            tls: self.tls,
            handshaking: (0..handle.shards()).map(|_| AtomicUsize::new(0)).collect(),
            counters: (0..handle.shards())
                .map(|_| ShardCounters::default())
                .collect(),
            next_conn: AtomicU64::new(1),
            per_listener: (0..listeners.len()).map(|_| AtomicUsize::new(0)).collect(),
            live: AtomicUsize::new(0),
            served: AtomicUsize::new(0),
            closing: AtomicBool::new(false),
            forced: AtomicBool::new(false),
            config: self.config,
        });
        let mut tasks = Vec::with_capacity(listeners.len());
        for (index, (shard, socket)) in listeners.into_iter().enumerate() {
            let shared = shared.clone();
            tasks.push(handle.spawn_local_on(shard, move || async move {
                match Listener::from_std(socket) {
                    Ok(listener) => accept_loop(shared, listener, index).await,
                    Err(e) => tracing_error("listener", &e),
                }
            }));
        }
        Server {
            addr,
            shared,
            listeners: tasks,
            steered,
            stopped: false,
        }
    }
}

fn check_shard(handle: &Handle, s: ShardId) -> io::Result<ShardId> {
    if s.index() < handle.shards() {
        Ok(s)
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "SingleAcceptor({}) on a runtime of {} shards",
                s.index(),
                handle.shards()
            ),
        ))
    }
}

/// Where a [`Server`] listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    /// A TCP address (with the port chosen for port 0).
    Tcp(SocketAddr),
    /// A Unix socket's path.
    Unix(PathBuf),
}

fn tracing_error(what: &str, e: &io::Error) {
    eprintln!("mailring-transports: {what}: {e}");
}

/// What a [`Server`] handle does to its shared state, whatever the session
/// type.
trait Control: Send + Sync {
    fn begin_shutdown(&self);
    fn force(&self);
    fn live(&self) -> usize;
    fn stats(&self) -> ServerStats;
    fn grace(&self) -> Duration;
}

impl<S: Session> Control for Shared<S> {
    fn begin_shutdown(&self) {
        self.closing.store(true, Ordering::Release);
        wake_all(&self.handle, self.id);
    }

    fn force(&self) {
        self.forced.store(true, Ordering::Release);
        wake_all(&self.handle, self.id);
    }

    fn live(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    fn grace(&self) -> Duration {
        self.config.shutdown_grace
    }

    fn stats(&self) -> ServerStats {
        ServerStats {
            shards: self.counters.iter().map(ShardCounters::snapshot).collect(),
        }
    }
}

/// A listening server; its sessions run on the runtime's shards.
///
/// ```no_run
/// use bytes::Bytes;
/// use mailring_transports::codec::LengthDelimited;
/// use mailring_transports::{Server, Session, SessionCtx};
///
/// struct Echo;
/// impl Session for Echo {
///     type Codec = LengthDelimited;
///     type Key = ();
///     async fn on_frame(&mut self, frame: Bytes, cx: &mut SessionCtx<Self>) {
///         cx.send_frame(frame);
///     }
/// }
///
/// let rt = mailring::Runtime::builder().shards(2).build()?;
/// let server = Server::builder(LengthDelimited::new(), |_peer| Echo)
///     .bind(rt.handle(), "127.0.0.1:7000".parse()?)?;
/// println!("listening on {}", server.local_addr());
/// rt.block_on(server.shutdown());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Server<S: Session> {
    addr: ListenAddr,
    shared: Arc<Shared<S>>,
    listeners: Vec<mailring::JoinHandle<()>>,
    steered: bool,
    /// `shutdown` ran (or runs): the drop has nothing left to do.
    stopped: bool,
}

/// Dropping a server without [`Server::shutdown`] stops it the same way
/// without waiting: it stops accepting, idle connections close, the others
/// get the grace period, then are cut off. Keep the `Server` while it should
/// serve.
impl<S: Session> Drop for Server<S> {
    fn drop(&mut self) {
        if std::mem::replace(&mut self.stopped, true) {
            return;
        }
        self.shared.begin_shutdown();
        let shared = self.shared.clone();
        let grace = self.shared.grace();
        self.shared.handle.spawn(async move {
            mailring::time::sleep(grace).await;
            shared.force();
        });
        if let ListenAddr::Unix(path) = &self.addr {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl<S: Session> std::fmt::Debug for Server<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("addr", &self.addr)
            .field("live", &self.shared.live())
            .finish()
    }
}

/// What [`Server::shutdown`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerShutdownReport {
    /// Connections open when the shutdown began.
    pub open_at_start: usize,
    /// Of those, the ones closed after the grace period, with work left.
    pub forced: usize,
}

impl<S: Session> Server<S> {
    /// A server of `S` sessions, each made by `factory` (given the peer's
    /// address) when a connection is accepted, framed by `codec`.
    pub fn builder(
        codec: S::Codec,
        factory: impl Fn(Option<SocketAddr>) -> S + Send + Sync + 'static,
    ) -> ServerBuilder<S> {
        ServerBuilder {
            config: ServerConfig::default(),
            codec,
            factory: Arc::new(factory),
            placer: None,
            tls: None,
            steered: false,
        }
    }

    /// The bound TCP address (with the port chosen for port 0).
    ///
    /// # Panics
    ///
    /// For a Unix server (see [`listen_addr`](Self::listen_addr)).
    pub fn local_addr(&self) -> SocketAddr {
        match &self.addr {
            ListenAddr::Tcp(a) => *a,
            ListenAddr::Unix(p) => panic!("Server::local_addr of a Unix server ({})", p.display()),
        }
    }

    /// Where the server listens.
    pub fn listen_addr(&self) -> &ListenAddr {
        &self.addr
    }

    /// Whether its listeners steer connections by source port
    /// ([`ServerConfig::source_port_steering`]).
    pub fn is_steered(&self) -> bool {
        self.steered
    }

    /// Connections open now.
    pub fn live_connections(&self) -> usize {
        self.shared.live()
    }

    /// A handle that pushes to the live sessions of a key.
    pub fn sessions(&self) -> SessionsByKey<S> {
        SessionsByKey {
            shared: self.shared.clone(),
        }
    }

    /// Counters per shard.
    pub fn stats(&self) -> ServerStats {
        self.shared.stats()
    }

    /// A handle that reads [`stats`](Self::stats) from anywhere (a
    /// service's own `INFO`, a metrics exporter). It does not keep the
    /// server alive (it holds it weakly: sessions may hold the handle
    /// without a cycle): once the server is gone it reads no shards.
    pub fn stats_source(&self) -> StatsSource {
        let shared = Arc::downgrade(&self.shared);
        StatsSource(Arc::new(move || {
            shared
                .upgrade()
                .map(|shared| shared.stats())
                .unwrap_or_default()
        }))
    }

    /// Stops accepting, lets sessions finish what they started (replies
    /// outstanding, bytes queued) for the grace period, then closes the
    /// rest; idle connections close at once. Each closes with
    /// [`CloseReason::Shutdown`]. What was drained and what was cut off also
    /// goes into the runtime's `ShutdownReport::drained`.
    pub async fn shutdown(mut self) -> ServerShutdownReport {
        let open_at_start = self.shared.live();
        let deadline = deadline_in(self.shared.grace());
        self.shared.begin_shutdown();
        for l in std::mem::take(&mut self.listeners) {
            let _ = l.await;
        }
        while self.shared.live() > 0 && mailring::time::now() < deadline {
            mailring::time::sleep(Duration::from_millis(1)).await;
        }
        let forced = self.shared.live();
        // From here on nothing is left for the drop to do (a shutdown
        // future dropped before this point leaves the drop to finish it).
        self.stopped = true;
        if forced > 0 {
            self.shared.force();
            while self.shared.live() > 0 {
                mailring::time::sleep(Duration::from_millis(1)).await;
            }
        }
        if let ListenAddr::Unix(path) = &self.addr {
            // The listener is closed: its path would only refuse the next bind.
            let _ = std::fs::remove_file(path);
        }
        let name = match &self.addr {
            ListenAddr::Tcp(a) => format!("server {a}"),
            ListenAddr::Unix(p) => format!("server {}", p.display()),
        };
        self.shared.handle.report_drained(
            name,
            (open_at_start - forced.min(open_at_start)) as u64,
            forced as u64,
        );
        ServerShutdownReport {
            open_at_start,
            forced,
        }
    }
}

/// Per shard: the wake cells of the tasks of each server, for shutdown.
struct Waiters {
    cells: slab::Slab<(u64, Rc<RefCell<Option<Waker>>>)>,
}

thread_local! {
    static WAITERS: RefCell<Waiters> = const { RefCell::new(Waiters { cells: slab::Slab::new() }) };
}

/// A task's registration for shutdown wakes on its shard; removed on drop.
struct WakeCell {
    key: usize,
    cell: Rc<RefCell<Option<Waker>>>,
}

impl WakeCell {
    fn register(server: u64) -> WakeCell {
        let cell = Rc::new(RefCell::new(None));
        let key = WAITERS.with(|w| w.borrow_mut().cells.insert((server, cell.clone())));
        WakeCell { key, cell }
    }

    fn set(&self, waker: &Waker) {
        let mut slot = self.cell.borrow_mut();
        match &*slot {
            Some(w) if w.will_wake(waker) => {}
            _ => *slot = Some(waker.clone()),
        }
    }
}

impl Drop for WakeCell {
    fn drop(&mut self) {
        let _ = WAITERS.try_with(|w| {
            let mut w = w.borrow_mut();
            if w.cells.contains(self.key) {
                w.cells.remove(self.key);
            }
        });
    }
}

fn wake_all(handle: &Handle, server: u64) {
    for s in 0..handle.shards() {
        handle.run_on(ShardId::new(s), move || {
            let wakers: Vec<Waker> = WAITERS.with(|w| {
                w.borrow()
                    .cells
                    .iter()
                    .filter(|(_, (id, _))| *id == server)
                    .filter_map(|(_, (_, cell))| cell.borrow().clone())
                    .collect()
            });
            wakers.into_iter().for_each(Waker::wake);
        });
    }
}

async fn accept_loop<S: Session>(shared: Arc<Shared<S>>, listener: Listener, index: usize) {
    let shard = mailring::current_shard().expect("listener task runs on a shard");
    let wake = WakeCell::register(shared.id);
    let limit = shared.config.max_connections.max(1);
    let mut paused = false;
    // Accepts failing for a reason not the connection's own (out of
    // descriptors or memory): how long to wait before the next accept
    // (doubling while it lasts), and the last report of it.
    let mut breather = ACCEPT_BREATHER_MIN;
    let mut reported: Option<(std::time::Instant, u64)> = None;
    loop {
        // At the limit, wait for a connection of this listener to close
        // (its close wakes this task through the same cell).
        let accepted = {
            let mut accept = pin!(listener.accept());
            std::future::poll_fn(|cx| {
                wake.set(cx.waker());
                if shared.closing.load(Ordering::Acquire) {
                    return Poll::Ready(None);
                }
                if shared.per_listener[index].load(Ordering::Acquire) >= limit {
                    if !paused {
                        paused = true;
                        // New connections wait in the listen backlog, not
                        // in accepted descriptors nobody serves.
                        listener.pause();
                        shared
                            .counters(shard)
                            .accept_paused
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    return Poll::Pending;
                }
                paused = false;
                accept.as_mut().poll(cx).map(Some)
            })
            .await
        };
        match accepted {
            None => return,
            Some(Ok((stream, peer, local))) => {
                breather = ACCEPT_BREATHER_MIN;
                shared.per_listener[index].fetch_add(1, Ordering::AcqRel);
                shared.live.fetch_add(1, Ordering::AcqRel);
                // Counted among those served only if it is: refusals still
                // under way (a TLS handshake, a PROXY header) take no place.
                let refused = match shared.config.max_clients {
                    Some(max) => shared
                        .served
                        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                            (n < max).then_some(n + 1)
                        })
                        .is_err(),
                    None => {
                        shared.served.fetch_add(1, Ordering::AcqRel);
                        false
                    }
                };
                shared
                    .counters(shard)
                    .accepted
                    .fetch_add(1, Ordering::Relaxed);
                // From here its drop accounts the close.
                let conn = Connection {
                    shared: shared.clone(),
                    listener: index,
                    acceptor_wake: wake.cell.borrow().clone(),
                    rebalanced: false,
                    counted_on: None,
                    refused,
                };
                if shared.config.proxy_protocol {
                    // The client's address comes from the header: the
                    // session is made once it is read.
                    mailring::spawn_local(guarded(
                        shared.clone(),
                        open_proxied(conn, stream, peer, local, shard),
                    ));
                    continue;
                }
                let Some((session, decoder)) = make_session(&shared, peer, shard) else {
                    continue;
                };
                let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
                let mut cx = SessionCtx::new(peer, shard, id, shared.codec.clone());
                cx.local = local;
                mailring::spawn_local(guarded(
                    shared.clone(),
                    run_connection(
                        conn,
                        stream,
                        session,
                        cx,
                        (BytesMut::new(), decoder),
                        None,
                        true,
                    ),
                ));
            }
            Some(Err(e)) => {
                shared
                    .counters(shard)
                    .accept_errors
                    .fetch_add(1, Ordering::Relaxed);
                // Out of descriptors or memory, or a listener that fails
                // for good: breathe before the next, longer while it
                // lasts, and say so at most every
                // `ACCEPT_ERROR_REPORT_EVERY` (with how many since). A
                // connection the peer reset before it was taken
                // (ECONNABORTED) concerns only itself.
                if !accept_error_concerns_one_connection(&e) {
                    let now = std::time::Instant::now();
                    match &mut reported {
                        Some((at, since))
                            if now.duration_since(*at) < ACCEPT_ERROR_REPORT_EVERY =>
                        {
                            *since += 1;
                        }
                        _ => {
                            let since = reported.map_or(0, |(_, n)| n);
                            let what = if since > 0 {
                                format!("accept ({since} more like it since the last report)")
                            } else {
                                "accept".to_owned()
                            };
                            tracing_error(&what, &e);
                            reported = Some((now, 0));
                        }
                    }
                    // A shutdown meanwhile ends the wait (it wakes this
                    // listener's cell).
                    let mut nap = pin!(mailring::time::sleep(breather));
                    std::future::poll_fn(|cx| {
                        wake.set(cx.waker());
                        if shared.closing.load(Ordering::Acquire) {
                            return Poll::Ready(());
                        }
                        nap.as_mut().poll(cx)
                    })
                    .await;
                    breather = (breather * 2).min(ACCEPT_BREATHER_MAX);
                }
            }
        }
    }
}

/// A session from the factory; `None` (reported and counted) when the
/// factory panicked.
fn make_session<S: Session>(
    shared: &Shared<S>,
    peer: Option<SocketAddr>,
    shard: ShardId,
) -> Option<(S, S::Codec)> {
    // The factory and the session's decoder hook, both the user's code.
    let made = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut session = (shared.factory)(peer);
        let decoder = session.decoder(&shared.codec);
        (session, decoder)
    }));
    match made {
        Ok(made) => Some(made),
        Err(payload) => {
            mailring::panic::report_caught(CallbackKind::Factory, &*payload);
            mailring::panic::drop_payload(payload);
            shared
                .counters(shard)
                .closed(CloseKind::Panicked)
                .fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// A connection of a PROXY-protocol listener: its header first (the
/// client's address), then the session, made for that address.
async fn open_proxied<S: Session>(
    conn: Connection<S>,
    stream: Conn,
    socket_peer: Option<SocketAddr>,
    socket_local: Option<SocketAddr>,
    shard: ShardId,
) {
    let shared = conn.shared.clone();
    let (header, rest) = match read_proxy_header(&shared, &stream).await {
        Ok(read) => read,
        Err(reason) => {
            shared
                .counters(shard)
                .closed(reason.kind())
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    let peer = header.source.or(socket_peer);
    let Some((session, decoder)) = make_session(&shared, peer, shard) else {
        return;
    };
    let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
    let mut cx = SessionCtx::new(peer, shard, id, shared.codec.clone());
    // The address the client connected to, on the proxy.
    cx.local = header.destination.or(socket_local);
    cx.proxy = Some(Arc::new(header));
    // The bytes after the header are the connection's own (a TLS
    // ClientHello, the first frames).
    run_connection(conn, stream, session, cx, (rest, decoder), None, true).await;
}

/// Reads a PROXY header within the server's timeout; a shutdown that
/// begins meanwhile ends the wait.
async fn read_proxy_header<S: Session>(
    shared: &Shared<S>,
    stream: &Conn,
) -> Result<(ProxyHeader, BytesMut), CloseReason> {
    let wake = WakeCell::register(shared.id);
    let mut read = pin!(mailring::time::timeout(
        shared.config.proxy_header_timeout,
        receive_proxy_header(stream),
    ));
    std::future::poll_fn(|task| {
        wake.set(task.waker());
        if shared.closing.load(Ordering::Acquire) {
            return Poll::Ready(Err(CloseReason::Shutdown));
        }
        read.as_mut().poll(task).map(|r| match r {
            Ok(Ok(read)) => Ok(read),
            Ok(Err(ProxyRead::Io(e))) => Err(CloseReason::Io(e)),
            Ok(Err(ProxyRead::Header(e))) => Err(CloseReason::ProxyHeader(e)),
            Err(_) => Err(CloseReason::ProxyHeader(ProxyError::Timeout)),
        })
    })
    .await
}

enum ProxyRead {
    Io(io::ErrorKind),
    Header(ProxyError),
}

/// Receives until a whole PROXY header is in; gives it and the bytes that
/// followed it.
async fn receive_proxy_header(stream: &Conn) -> Result<(ProxyHeader, BytesMut), ProxyRead> {
    let mut buf = BytesMut::with_capacity(512);
    loop {
        match crate::proxy::parse(&buf).map_err(ProxyRead::Header)? {
            Parsed::Complete(header, len) => {
                let rest = buf.split_off(len);
                return Ok((header, rest));
            }
            Parsed::Incomplete => {}
        }
        buf.reserve(512);
        let tail = buf.split_off(buf.len());
        let (res, tail) = stream.recv(tail).await;
        buf.unsplit(tail);
        match res {
            Ok(0) => return Err(ProxyRead::Header(ProxyError::Truncated(buf.len()))),
            Ok(_) => {}
            Err(e) => return Err(ProxyRead::Io(e.kind())),
        }
    }
}

/// A connection's tie to its server, carried across a move; its drop
/// accounts the close.
struct Connection<S: Session> {
    shared: Arc<Shared<S>>,
    listener: usize,
    /// The accepting task, woken at close when its listener is at the limit.
    acceptor_wake: Option<Waker>,
    /// Moved once already to run its TLS handshake on a less busy shard.
    rebalanced: bool,
    /// Counted open on the shard it is moving to for balance, from the
    /// moment the move was decided: connections decided after it on any
    /// shard see it there before it arrives.
    counted_on: Option<OpenHere<S>>,
    /// Accepted past [`ServerConfig::max_clients`]: told so and closed.
    refused: bool,
}

impl<S: Session> Drop for Connection<S> {
    fn drop(&mut self) {
        self.shared.per_listener[self.listener].fetch_sub(1, Ordering::AcqRel);
        self.shared.live.fetch_sub(1, Ordering::AcqRel);
        if !self.refused {
            self.shared.served.fetch_sub(1, Ordering::AcqRel);
        }
        if let Some(w) = self.acceptor_wake.take() {
            w.wake();
        }
    }
}

/// Runs a connection's future; a panic in it (the session's code: hooks,
/// handlers, pushes, deferred replies) is reported to the runtime and
/// counted as [`CloseReason::Panicked`], and the connection closes (its
/// future, with the socket, is dropped) while the shard goes on.
///
/// The connection's future is boxed, and the task holds this small guard:
/// an `async fn` taking the future as an argument held it twice (the
/// argument, and the pinned copy it polls), and a task's future is copied
/// when the task is made.
fn guarded<S: Session, F: Future<Output = ()>>(
    shared: Arc<Shared<S>>,
    connection: F,
) -> Guarded<S, F> {
    Guarded {
        shared,
        connection: Box::pin(connection),
    }
}

/// See [`guarded`].
struct Guarded<S: Session, F> {
    shared: Arc<Shared<S>>,
    connection: Pin<Box<F>>,
}

impl<S: Session, F: Future<Output = ()>> Future for Guarded<S, F> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, task: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let connection = this.connection.as_mut();
        let payload = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            connection.poll(task)
        })) {
            Ok(poll) => return poll,
            Err(payload) => payload,
        };
        mailring::panic::report_caught(CallbackKind::Handler, &*payload);
        mailring::panic::drop_payload(payload);
        if let Some(shard) = mailring::current_shard() {
            this.shared
                .counters(shard)
                .closed(CloseKind::Panicked)
                .fetch_add(1, Ordering::Relaxed);
        }
        Poll::Ready(())
    }
}

enum Exit<S: Session> {
    Close(CloseReason),
    Move(S::Key, FrameIn<S>),
}

/// Runs one connection on this shard until it closes or moves to its key's
/// shard (where this runs again with what it carried).
///
/// An `async` block, not an `async fn`: an `async fn` keeps its arguments
/// and the locals they are moved into side by side in its state (the
/// context twice, the stream twice: about 500 bytes a connection).
#[allow(clippy::manual_async_fn)]
fn run_connection<S: Session>(
    mut conn: Connection<S>,
    mut stream: Conn,
    mut session: S,
    mut cx: SessionCtx<S>,
    // The read buffer and the decoder's state travel together.
    reader: (BytesMut, S::Codec),
    carried: Option<FrameIn<S>>,
    fresh: bool,
) -> impl std::future::Future<Output = ()> {
    async move {
        let (mut rbuf, mut decoder) = reader;
        let shard = cx.shard;
        if fresh && !conn.refused {
            if let Some(best) = less_loaded_shard(&conn, shard) {
                // Counted there now, not when it arrives: the next fresh
                // connections (a burst taken in one go) see it.
                let counted = OpenHere::new(&conn.shared, best);
                // The rare paths' futures are boxed: the connection's state
                // holds only the biggest of what it awaits.
                match Box::pin(stream.depart(best)).await {
                    Ok(transit) => {
                        let counters = conn.shared.counters(shard);
                        if conn.shared.tls.is_some() {
                            counters.handshakes_moved.fetch_add(1, Ordering::Relaxed);
                        } else {
                            counters.balanced_away.fetch_add(1, Ordering::Relaxed);
                        }
                        conn.rebalanced = true;
                        conn.counted_on = Some(counted);
                        continue_on(
                            best,
                            conn,
                            transit,
                            session,
                            cx,
                            (rbuf, decoder),
                            None,
                            true,
                        );
                        return;
                    }
                    Err((_, back)) => {
                        drop(counted);
                        stream = back;
                    }
                }
            }
        }
        // Counted here: by the move that brought it, or now.
        let _open_here = match conn.counted_on.take() {
            Some(counted) if counted.shard == shard => counted,
            other => {
                drop(other);
                OpenHere::new(&conn.shared, shard)
            }
        };
        if fresh {
            if conn.shared.config.hand_off == HandOff::Direct && !conn.refused {
                let (direct, refused) = Box::pin(stream.into_direct()).await;
                stream = direct;
                if refused.is_some() {
                    conn.shared
                        .counters(shard)
                        .direct_refused
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
            // A refusal is decided as the connection comes, before its TLS
            // handshake (as Redis counts a rejected connection at accept); its
            // frame is sent once the handshake is done.
            let refusal = if conn.refused {
                Some(session.refusal(&CloseReason::ClientLimit))
            } else {
                None
            };
            if let Some(acceptor) = &conn.shared.tls {
                // Bytes already read (after a PROXY header) are the handshake's.
                let received = std::mem::take(&mut rbuf);
                match Box::pin(tls_handshake(&conn.shared, acceptor, stream, received)).await {
                    Ok((tls, info)) => {
                        stream = Conn::Tls(Box::new(tls));
                        cx.tls = Some(Arc::new(info));
                        conn.shared
                            .counters(shard)
                            .tls_handshakes
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    Err(reason) => {
                        close(&conn, &mut session, &mut cx, reason);
                        drop_session(session);
                        return;
                    }
                }
            }
            if let Some(refusal) = refusal {
                // Past the server's limit: the refusal, then the close (the
                // drive loop writes what is queued and takes no frame).
                if let Some(frame) = refusal {
                    cx.send_frame(frame);
                }
                cx.close = Some(CloseReason::ClientLimit);
            } else {
                session.on_open(&mut cx);
            }
        }
        let exit = drive(
            &conn.shared,
            &stream,
            &mut session,
            &mut cx,
            &mut rbuf,
            &mut decoder,
            carried,
        )
        .await;
        let reason = match exit {
            Exit::Close(reason) => {
                // A TLS peer learns that the end is deliberate (a cut
                // connection reads as a possible truncation); bounded, and
                // skipped where the connection cannot take it.
                if matches!(stream, Conn::Tls(_))
                    && !matches!(
                        reason,
                        CloseReason::Io(_) | CloseReason::Tls(_) | CloseReason::SlowReader { .. }
                    )
                {
                    let _ = Box::pin(mailring::time::timeout(
                        TLS_CLOSE_NOTIFY_LIMIT,
                        stream.close_notify(),
                    ))
                    .await;
                }
                reason
            }
            Exit::Move(key, frame) => {
                // Checked when the key was named.
                let owner = conn.shared.place(&key).unwrap_or(shard);
                // An operation dropped just before (a watch for the peer's end)
                // holds the socket until its cancellation completes, in a tick
                // or two: the move waits for it, briefly.
                let mut stream = stream;
                let was_direct = stream.is_direct();
                let mut tries = 0;
                let departed = loop {
                    match Box::pin(stream.depart(owner)).await {
                        Err((e, back))
                            if e.kind() == io::ErrorKind::ResourceBusy && tries < 200 =>
                        {
                            tries += 1;
                            stream = back;
                            Box::pin(mailring::time::sleep(Duration::from_millis(1))).await;
                        }
                        other => break other,
                    }
                };
                match departed {
                    Ok(transit) => {
                        let counters = conn.shared.counters(shard);
                        counters.handed_off.fetch_add(1, Ordering::Relaxed);
                        if was_direct && !transit.is_direct() {
                            // The owner's table had no room: it travels plain.
                            counters.direct_refused.fetch_add(1, Ordering::Relaxed);
                        }
                        cx.key = Some(key);
                        continue_on(
                            owner,
                            conn,
                            transit,
                            session,
                            cx,
                            (rbuf, decoder),
                            Some(frame),
                            false,
                        );
                        return;
                    }
                    Err((e, _stream)) => {
                        tracing_error("moving a connection to its key's shard", &e);
                        CloseReason::HandOff
                    }
                }
            }
        };
        close(&conn, &mut session, &mut cx, reason);
        drop_session(session);
    }
}

/// Drops the session of a connection that ended, catching a panic of its
/// `Drop`: reported as a `Drop` panic, not counted as the connection's
/// close a second time (its close was counted with its reason).
fn drop_session<S>(session: S) {
    if let Err(payload) =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(session)))
    {
        mailring::panic::report_caught(CallbackKind::Drop, &*payload);
        mailring::panic::drop_payload(payload);
    }
}

/// The shard a fresh TLS connection (or a plain one, with
/// [`ServerConfig::balance_plain_connections`]) should run on instead of
/// `here`: the least loaded, when `here` is more loaded than it (reuseport listeners
/// only; a connection moves for this once). A shard's load is its open
/// connections plus its handshakes in progress (counted twice: a
/// handshake is a few hundred microseconds of CPU). The kernel's spread
/// of a few connections is uneven (8 split 5 and 3 more often than 4 and
/// 4), and a connection stays where it starts: without this, one shard
/// of two serves most of a busy server's connections while the other
/// idles.
fn less_loaded_shard<S: Session>(conn: &Connection<S>, here: ShardId) -> Option<ShardId> {
    let shared = &conn.shared;
    if (shared.tls.is_none() && !shared.config.balance_plain_connections)
        || conn.rebalanced
        || shared.config.listen != ListenMode::ReusePort
        || shared.handshaking.len() < 2
    {
        return None;
    }
    crate::balanced::less_loaded(shared.handshaking.len(), here, |i| {
        let open = shared.counters[i].open.load(Ordering::Acquire);
        let handshaking = shared.handshaking[i].load(Ordering::Acquire);
        usize::try_from(open)
            .unwrap_or(usize::MAX)
            .saturating_add(handshaking)
    })
}

/// Counts a connection as open on a shard while it runs there.
struct OpenHere<S: Session> {
    shared: Arc<Shared<S>>,
    shard: ShardId,
}

impl<S: Session> OpenHere<S> {
    fn new(shared: &Arc<Shared<S>>, shard: ShardId) -> Self {
        shared.counters(shard).open.fetch_add(1, Ordering::AcqRel);
        OpenHere {
            shared: shared.clone(),
            shard,
        }
    }
}

impl<S: Session> Drop for OpenHere<S> {
    fn drop(&mut self) {
        self.shared
            .counters(self.shard)
            .open
            .fetch_sub(1, Ordering::AcqRel);
    }
}

/// Counts a handshake in progress on a shard while it lives.
struct Handshaking<'a>(&'a AtomicUsize);

impl Drop for Handshaking<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a receive asks for when the connection's reads are small and
/// nothing is buffered (see [`size_read_buffer`]): a pipeline of small
/// requests, or an HTTP request's head.
const SMALL_READ: usize = 2048;

/// Receives in a row that brought less than [`SMALL_READ`] before the
/// buffer is made small (a fresh connection starts there): a connection
/// whose requests are a few KiB keeps a whole chunk, instead of a small
/// buffer that each request fills, grows and lets go.
const SMALL_READS_TO_SHRINK: u8 = 4;

/// Makes room in `rbuf` for the next receive. A connection whose last
/// [`SMALL_READS_TO_SHRINK`] receives were small, with nothing buffered,
/// asks for [`SMALL_READ`] bytes in a buffer of about that size (a bigger
/// one is let go), so a connection that waits for its next small request,
/// as most of a server's do, holds a small buffer rather than a full
/// `read_chunk`. A small buffer that fills leaves the rest to a receive
/// made at once (the kernel says bytes remain), and the reads after it ask
/// for full chunks until they have been small again for a while.
fn size_read_buffer(rbuf: &mut BytesMut, read_chunk: usize, small_reads: u8) {
    let chunk = read_chunk.max(64);
    let small = SMALL_READ.min(chunk);
    if !rbuf.is_empty() {
        rbuf.reserve(chunk);
        return;
    }
    let want = if small_reads >= SMALL_READS_TO_SHRINK {
        small
    } else {
        chunk
    };
    // Empty. Its room ran out: taken back whole if no frame holds it any
    // more (no allocation), or a new one. Then one far bigger than wanted
    // is let go.
    if rbuf.capacity() < want {
        rbuf.reserve(want);
    }
    if rbuf.capacity() > 4 * want {
        *rbuf = BytesMut::with_capacity(want);
    }
}

/// A connection's send in flight, as the driver follows it.
#[derive(Default)]
struct SendInFlight {
    /// Its bytes (0: none in flight).
    bytes: usize,
    /// An idle period ended with it still in flight.
    stalled: bool,
    /// Past the outbound limit: when it counts as stuck (reset by each
    /// send that completes).
    slow_deadline: Option<Sleep>,
}

impl SendInFlight {
    /// It is over (`sent`: its bytes went): they count, and a reader that
    /// takes them is making progress (the slow-reader grace starts again).
    fn done(&mut self, counters: &ShardCounters, sent: bool) {
        if sent {
            counters
                .bytes_out
                .fetch_add(self.bytes as u64, Ordering::Relaxed);
        }
        *self = SendInFlight::default();
    }
}

/// Reads a server's counters ([`Server::stats_source`]); cheap to clone.
#[derive(Clone)]
pub struct StatsSource(Arc<dyn Fn() -> ServerStats + Send + Sync>);

impl StatsSource {
    /// The counters now.
    pub fn stats(&self) -> ServerStats {
        (self.0)()
    }
}

impl std::fmt::Debug for StatsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StatsSource")
    }
}

/// Whether a failed accept concerns only the connection it would have
/// taken (accept(2): a connection reset or refused before it was taken,
/// and the network errors of a pending connection, which Linux passes on
/// and asks callers to treat as a retry). Anything else (out of
/// descriptors or memory, a listening socket that fails for good, an
/// error the ring reports) would fail again at once: the accept loop
/// pauses before its next try rather than spin.
pub(crate) fn accept_error_concerns_one_connection(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::ECONNABORTED
                | libc::EPERM
                | libc::EPROTO
                | libc::ENETDOWN
                | libc::ENOPROTOOPT
                | libc::EHOSTDOWN
                | libc::ENONET
                | libc::EHOSTUNREACH
                | libc::ENETUNREACH
                | libc::ETIMEDOUT
                | libc::EAGAIN
                | libc::EINTR
        )
    )
}

/// The first wait of a listener after an accept failed for a reason not
/// the connection's own (see [`accept_error_concerns_one_connection`]),
/// and the longest (it doubles while they last).
const ACCEPT_BREATHER_MIN: Duration = Duration::from_millis(10);
const ACCEPT_BREATHER_MAX: Duration = Duration::from_secs(1);

/// How often a listener reports accepts failing for a reason not the
/// connection's own (each is counted in the stats' `accept_errors`).
const ACCEPT_ERROR_REPORT_EVERY: Duration = Duration::from_secs(10);

/// Bytes of big replies (sent in full batches) after which a connection's
/// emptied outbound buffer lets go of its allocation (see
/// `SessionCtx::wbuf_big_bytes`): replies under it reuse the buffer.
pub(crate) const WBUF_KEEP_MAX: usize = 256 << 10;

/// The least a send carries when there is that much to send (see
/// [`ServerConfig::slow_reader_grace`]).
const MIN_SEND_BATCH: usize = 64 << 10;

/// The most output sent at once with a plain non-blocking send (see
/// `drive`): a few small replies.
const SEND_AT_ONCE_MAX: usize = 2048;

/// How long a closing TLS connection may take to send its `close_notify`.
const TLS_CLOSE_NOTIFY_LIMIT: Duration = Duration::from_millis(100);

/// The server side of a TLS handshake on a fresh connection; a shutdown
/// that begins meanwhile ends it.
async fn tls_handshake<S: Session>(
    shared: &Shared<S>,
    acceptor: &TlsAcceptor,
    stream: Conn,
    received: BytesMut,
) -> Result<(crate::tls::TlsConn, crate::tls::TlsInfo), CloseReason> {
    let here = mailring::current_shard().map_or(0, |s| s.index());
    let count = &shared.handshaking[here % shared.handshaking.len()];
    count.fetch_add(1, Ordering::AcqRel);
    let _counted = Handshaking(count);
    let wake = WakeCell::register(shared.id);
    let mut handshake = pin!(acceptor.accept(stream, received));
    std::future::poll_fn(|task| {
        wake.set(task.waker());
        if shared.closing.load(Ordering::Acquire) {
            return Poll::Ready(Err(CloseReason::Shutdown));
        }
        handshake
            .as_mut()
            .poll(task)
            .map(|r| r.map_err(CloseReason::Tls))
    })
    .await
}

/// Runs a connection that left this shard on shard `to`, once it arrives
/// there with what it carried; its context is rebuilt for `to` with the
/// same peer, id, key, TLS and PROXY facts.
#[allow(clippy::too_many_arguments)]
fn continue_on<S: Session>(
    to: ShardId,
    conn: Connection<S>,
    transit: crate::conn::InTransit,
    mut session: S,
    mut cx: SessionCtx<S>,
    reader: (BytesMut, S::Codec),
    carried: Option<FrameIn<S>>,
    fresh: bool,
) {
    let handle = conn.shared.handle.clone();
    let guard = conn.shared.clone();
    let (key, tls, proxy) = (cx.key.take(), cx.tls.take(), cx.proxy.take());
    // Handed out on the shard before: they close it on the next one.
    let closer = cx.closer.take();
    let discarding = cx.discards_replies();
    let (peer, local, id, codec) = (cx.peer, cx.local, cx.id, cx.encoder);
    handle.spawn_local_on(to, move || {
        guarded(guard, async move {
            let mut cx = SessionCtx::new(peer, to, id, codec);
            cx.discard_replies(discarding);
            cx.key = key;
            cx.local = local;
            cx.tls = tls;
            cx.proxy = proxy;
            cx.closer = closer;
            match transit.arrive().await {
                Ok(stream) => {
                    run_connection(conn, stream, session, cx, reader, carried, fresh).await
                }
                Err(e) => {
                    tracing_error("adopting a connection moved from another shard", &e);
                    close(&conn, &mut session, &mut cx, CloseReason::HandOff);
                }
            }
        })
    });
}

fn close<S: Session>(
    conn: &Connection<S>,
    session: &mut S,
    cx: &mut SessionCtx<S>,
    reason: CloseReason,
) {
    conn.shared
        .counters(cx.shard)
        .closed(reason.kind())
        .fetch_add(1, Ordering::Relaxed);
    // Counted once, under its reason: a panic in `on_close` is reported to
    // the runtime here, not counted again as a panicked connection.
    let closed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        session.on_close(&reason, cx)
    }));
    if let Err(payload) = closed {
        mailring::panic::report_caught(CallbackKind::Handler, &*payload);
        mailring::panic::drop_payload(payload);
    }
}

/// Bytes queued for the peer: in the session's buffer and in the send in
/// flight.
fn outbound<S: Session>(cx: &SessionCtx<S>, in_flight: usize) -> usize {
    cx.wbuf.len() + in_flight
}

/// The connection's loop on this shard: decode and handle frames, keep
/// deferred replies in order, write, read when the decoder needs bytes.
///
/// A receive is in flight only while the decoder has no whole frame, so
/// when a frame names a key on another shard nothing is in flight once the
/// replies before it are written: the socket moves with every unread byte.
async fn drive<S: Session>(
    shared: &Arc<Shared<S>>,
    stream: &Conn,
    session: &mut S,
    cx: &mut SessionCtx<S>,
    rbuf: &mut BytesMut,
    decoder: &mut S::Codec,
    mut carried: Option<FrameIn<S>>,
) -> Exit<S> {
    let shard = cx.shard;
    let counters = shared.counters(shard);
    let config = &shared.config;
    let window = config.pipeline_window.max(1);
    let wake = WakeCell::register(shared.id);
    let mut recv = pin!(None);
    let mut send = pin!(None);
    // With `PeerClose::CloseWhileBlocked`: the peer's end, watched while
    // the session is blocked on a reply.
    let mut end_watch = pin!(None);
    let mut peer_closed = false;
    // The peer's end, seen while the session was blocked.
    let mut peer_gone = false;
    let mut moving: Option<(S::Key, FrameIn<S>)> = None;
    let mut over_high_water = false;
    let mut idle = config.idle_timeout.map(|t| sleep_until(deadline_in(t)));
    let mut handshake = match (config.handshake_timeout, &cx.key) {
        (Some(t), None) => Some(sleep_until(deadline_in(t))),
        _ => None,
    };
    let mut frame_deadline: Option<Sleep> = None;
    // The waker a `SessionCloser` holds now.
    let mut closer_waker = None;
    let mut starved = false;
    // Frames were handled since the session's last `on_drained`.
    let mut handled_since_drained = false;
    let mut in_flight = SendInFlight::default();
    // Receives in a row that brought little: the next one's buffer is
    // sized by it (see `size_read_buffer`).
    let mut small_reads = SMALL_READS_TO_SHRINK;
    // Arrived with a key (moved here): attach, or refuse past the limit.
    let mut registered = None;
    if let Some(key) = cx.key.clone() {
        registered = attach(shared, session, cx, key, &wake);
        if registered.is_none() {
            carried = None;
        }
    }
    loop {
        // Outbound bytes past the limit: no push and no frame is taken
        // until the send drains them (a tiny request may ask for a big
        // reply; the limit holds between frames, not only while waiting).
        let outbound_full = outbound(cx, in_flight.bytes) > config.outbound_limit;
        // Pushes run between frames. Frames held behind a deferred reply
        // take no room in the output yet: they count against the push
        // queue instead, so pushes to a session owing a slow reply wait in
        // its queue (and those past it are refused) rather than pile up.
        let holding = |cx: &SessionCtx<S>| cx.held >= config.push_queue.max(1);
        // Nor once it is to close or move: what is left of them is counted
        // as dropped when it ends (a steady flow would keep it writing).
        let leaving =
            cx.close.is_some() || moving.is_some() || shared.closing.load(Ordering::Acquire);
        if let Some(r) = registered
            .as_ref()
            .filter(|_| !outbound_full && !holding(cx) && !leaving)
        {
            while let Some(push) = r.take() {
                push(session, cx);
                if outbound(cx, in_flight.bytes) > config.outbound_limit || holding(cx) {
                    break;
                }
            }
        }
        let closing = shared.closing.load(Ordering::Acquire);
        if shared.forced.load(Ordering::Acquire) {
            return Exit::Close(CloseReason::Shutdown);
        }
        if cx.closer_fired() {
            return Exit::Close(CloseReason::ClosedByHandle);
        }
        // Handle the next frame if one is whole and the window has room.
        let may_take = moving.is_none()
            && cx.close.is_none()
            && !closing
            && cx.replies_owed() < window
            && cx.takes_frames();
        // Held back by the outbound limit alone, with bytes of requests
        // waiting: more output waits behind the send, as if queued.
        let outbound_ok = outbound(cx, in_flight.bytes) <= config.outbound_limit;
        let held_back = may_take && !outbound_ok && (carried.is_some() || !rbuf.is_empty());
        if may_take && outbound_ok {
            let next = match carried.take() {
                Some(f) => Ok(Some(f)),
                None if recv.is_none() => decoder.decode(rbuf),
                None => Ok(None),
            };
            match next {
                Err(e) => {
                    cx.close = Some(CloseReason::BadFrame(e));
                }
                Ok(Some(frame)) => {
                    starved = false;
                    frame_deadline = None;
                    if cx.key.is_none() {
                        if let Route::Key(key) = session.route(&frame, cx) {
                            let Some(owner) = shared.place(&key) else {
                                tracing_error(
                                    "placing a session",
                                    &io::Error::other(format!(
                                        "the placement of key {key:?} names a shard past the last"
                                    )),
                                );
                                cx.close = Some(CloseReason::HandOff);
                                continue;
                            };
                            if owner == shard {
                                handshake = None;
                                registered = attach(shared, session, cx, key, &wake);
                                if registered.is_none() {
                                    continue;
                                }
                            } else {
                                // The key is named: no handshake timeout
                                // while the replies before it are written.
                                handshake = None;
                                moving = Some((key, frame));
                                continue;
                            }
                        }
                    }
                    counters.frames_in.fetch_add(1, Ordering::Relaxed);
                    handled_since_drained = true;
                    // Run the handler; meanwhile only the send in flight
                    // moves (everything else waits for the context).
                    // A closer handed out before (or by) this handler ends
                    // it too: the state it will share is made now.
                    let closer = cx.closer_state_made();
                    let handling = pin!(session.on_frame(frame, cx));
                    let stop = Stop {
                        forced: &shared.forced,
                        closer: Some(&closer),
                        known: &mut closer_waker,
                        limit: config.handler_timeout,
                    };
                    let sending = send.is_some();
                    let handled = run_beside_send(handling, send.as_mut(), stop, &wake).await;
                    // The idle period starts again when the handler is done:
                    // one that ran past it kept the timer unpolled, and the
                    // next request, sent in time, is read after it is due.
                    if let (Some(t), Some(d)) = (idle.as_mut(), config.idle_timeout) {
                        t.reset(deadline_in(d));
                    }
                    if sending && send.is_none() {
                        // The send in flight completed meanwhile.
                        let sent = !matches!(handled, Handled::SendFailed(_));
                        in_flight.done(counters, sent);
                    }
                    match handled {
                        Handled::Done => {}
                        Handled::SendFailed(reason) => return Exit::Close(reason),
                        // Past the shutdown grace: the handler is dropped.
                        Handled::Forced => return Exit::Close(CloseReason::Shutdown),
                        Handled::Closed => return Exit::Close(CloseReason::ClosedByHandle),
                        Handled::TimedOut => return Exit::Close(CloseReason::HandlerTimeout),
                    }
                    continue;
                }
                Ok(None) => {
                    starved = true;
                    if rbuf.is_empty() {
                        frame_deadline = None;
                    } else if frame_deadline.is_none() {
                        frame_deadline = config.frame_timeout.map(|t| sleep_until(deadline_in(t)));
                    }
                }
            }
        }
        // No frame was handled this turn: the session sends what it
        // gathered from the run before (before anything below looks at
        // what is pending).
        if handled_since_drained {
            handled_since_drained = false;
            session.on_drained(cx);
        }
        // A blocked client gone: leave once every reply before the blocked
        // one is written.
        if peer_gone && cx.written_up_to_blocked() && cx.wbuf.is_empty() && send.is_none() {
            return Exit::Close(CloseReason::PeerClosed);
        }
        // Leave when nothing is left to write.
        let quiet = cx.pending_replies() == 0 && cx.is_drained() && send.is_none();
        if quiet {
            if let Some(reason) = cx.close.take() {
                return Exit::Close(reason);
            }
            if moving.is_some() {
                let (key, frame) = moving.take().expect("checked");
                return Exit::Move(key, frame);
            }
            if closing {
                return Exit::Close(CloseReason::Shutdown);
            }
            if peer_closed && starved {
                return Exit::Close(if rbuf.is_empty() {
                    CloseReason::PeerClosed
                } else {
                    CloseReason::BadFrame(CodecError::Malformed(format!(
                        "connection closed in the middle of a frame ({} bytes)",
                        rbuf.len()
                    )))
                });
            }
        }
        // Past the outbound limit, one receive still looks for a request
        // held back (which makes the peer a slow reader), and no more is
        // read.
        let outbound_ok = outbound(cx, in_flight.bytes) <= config.outbound_limit;
        let wants_bytes = if outbound_ok {
            starved
        } else {
            rbuf.is_empty() && carried.is_none()
        };
        let may_read = wants_bytes
            && !peer_closed
            && moving.is_none()
            && cx.close.is_none()
            && !closing
            && cx.replies_owed() < window;
        // Wait for something to happen.
        let event = std::future::poll_fn(|task| {
            wake.set(task.waker());
            if cx.closed_by_handle(task.waker(), &mut closer_waker) {
                return Poll::Ready(Event::Close(CloseReason::ClosedByHandle));
            }
            let pending_before = cx.pending_replies();
            // A deferred reply that finished frees a place in the window
            // even when older ones still wait: that is progress too.
            let mut progressed = cx.poll_slots(task) || cx.pending_replies() < pending_before;
            if send.is_none() && cx.wbuf.is_empty() && cx.wbuf_big_bytes >= WBUF_KEEP_MAX {
                // Big replies went out whole: their buffer goes (the sent
                // batches took views of it; this empty one kept it all).
                cx.wbuf = BytesMut::new();
                cx.wbuf_big_bytes = 0;
            }
            if send.is_none() && !cx.wbuf.is_empty() {
                counters.send_ops.fetch_add(1, Ordering::Relaxed);
                note_owner(counters, shard);
                // A small reply with nothing else owed (request and
                // response) goes at once, without the ring: no send is in
                // flight to overtake, and no operation and wake-up are
                // paid for it. Big or pipelined output goes through the
                // ring, which gathers more while a send is in flight.
                let at_once = cx.wbuf.len() <= SEND_AT_ONCE_MAX && cx.pending_replies() == 0;
                let sent = if at_once {
                    stream.try_send_plain(&cx.wbuf)
                } else {
                    None
                };
                match sent {
                    Some(Ok(n)) => {
                        bytes::Buf::advance(&mut cx.wbuf, n);
                        counters.bytes_out.fetch_add(n as u64, Ordering::Relaxed);
                        progressed = true;
                    }
                    Some(Err(e)) if e.kind() != std::io::ErrorKind::WouldBlock => {
                        return Poll::Ready(Event::Close(io_close(&e)));
                    }
                    _ => {}
                }
            }
            if send.is_none() && !cx.wbuf.is_empty() {
                // At most a high-water mark's worth per send, so a peer
                // that reads completes sends while a big reply goes out:
                // the slow-reader grace counts from the last one.
                let take = cx
                    .wbuf
                    .len()
                    .min(config.outbound_high_water.max(MIN_SEND_BATCH));
                if take >= MIN_SEND_BATCH {
                    cx.wbuf_big_bytes = cx.wbuf_big_bytes.saturating_add(take);
                }
                let batch = cx.wbuf.split_to(take).freeze();
                in_flight.bytes = batch.len();
                send.set(Some(stream.send_all(batch)));
            }
            if let Some(op) = send.as_mut().as_pin_mut() {
                if let Poll::Ready((res, _buf)) = op.poll(task) {
                    send.set(None);
                    in_flight.done(counters, res.is_ok());
                    if let Err(e) = res {
                        return Poll::Ready(Event::Close(io_close(&e)));
                    }
                    progressed = true;
                }
            }
            // Outbound bytes: queued, and handed to the send in flight. Past
            // the limit only while a send is stuck on them and more waits
            // behind it (queued, or requests held back by the limit): a
            // big reply about to go is not a slow reader, nor a pipeline
            // whose replies came ready together for a peer that reads
            // (its sends complete): a send in flight that long is stuck.
            let queued = outbound(cx, in_flight.bytes);
            if queued > config.outbound_limit
                && send.is_some()
                && (!cx.wbuf.is_empty() || held_back)
            {
                let stuck = in_flight
                    .slow_deadline
                    .get_or_insert_with(|| sleep_until(deadline_in(config.slow_reader_grace)));
                if std::pin::Pin::new(stuck).poll(task).is_ready() {
                    return Poll::Ready(Event::Close(CloseReason::SlowReader { queued }));
                }
            } else {
                in_flight.slow_deadline = None;
            }
            if queued > config.outbound_high_water && !over_high_water {
                over_high_water = true;
                return Poll::Ready(Event::HighWater(queued));
            }
            if queued <= config.outbound_high_water / 2 {
                over_high_water = false;
            }
            if config.on_peer_close == PeerClose::CloseWhileBlocked && !peer_gone {
                // Blocked: frames held behind a reply that may never come,
                // and nothing else (a move, a close) stops the reading.
                let blocked = cx.is_blocked() && moving.is_none() && cx.close.is_none() && !closing;
                if may_read || recv.is_some() || !blocked || peer_closed {
                    // A receive sees the end itself.
                    end_watch.set(None);
                } else if end_watch.is_none() {
                    end_watch.set(Some(stream.peer_close()));
                }
                if let Some(watch) = end_watch.as_mut().as_pin_mut() {
                    if watch.poll(task).is_ready() {
                        end_watch.set(None);
                        return Poll::Ready(Event::PeerGone);
                    }
                }
            }
            if may_read && recv.is_none() {
                counters.recv_ops.fetch_add(1, Ordering::Relaxed);
                note_owner(counters, shard);
                size_read_buffer(rbuf, config.read_chunk, small_reads);
                let tail = rbuf.split_off(rbuf.len());
                recv.set(Some(stream.recv(tail)));
            }
            if let Some(op) = recv.as_mut().as_pin_mut() {
                if let Poll::Ready((res, tail)) = op.poll(task) {
                    recv.set(None);
                    rbuf.unsplit(tail);
                    return Poll::Ready(match res {
                        Ok(0) => Event::PeerClosed,
                        Ok(n) => {
                            counters.bytes_in.fetch_add(n as u64, Ordering::Relaxed);
                            small_reads = if n < SMALL_READ {
                                small_reads.saturating_add(1)
                            } else {
                                0
                            };
                            Event::Read
                        }
                        Err(e) => Event::Close(io_close(&e)),
                    });
                }
                // A TLS record under way (a client sending a byte a second
                // inside one): the frame it carries has started, though no
                // byte of it is plaintext yet. A record that ended with no
                // data (a key update) started none.
                if stream.partial_input() {
                    if frame_deadline.is_none() {
                        frame_deadline = config.frame_timeout.map(|t| sleep_until(deadline_in(t)));
                    }
                } else if rbuf.is_empty() {
                    frame_deadline = None;
                }
            }
            if shared.closing.load(Ordering::Acquire) != closing
                || shared.forced.load(Ordering::Acquire)
            {
                return Poll::Ready(Event::Shutdown);
            }
            if let Some(t) = idle.as_mut() {
                if std::pin::Pin::new(t).poll(task).is_ready() {
                    return Poll::Ready(Event::Idle);
                }
            }
            if let Some(t) = handshake.as_mut() {
                if std::pin::Pin::new(t).poll(task).is_ready() {
                    return Poll::Ready(Event::Close(CloseReason::HandshakeTimeout));
                }
            }
            if let Some(t) = frame_deadline.as_mut() {
                if std::pin::Pin::new(t).poll(task).is_ready() {
                    return Poll::Ready(Event::Close(CloseReason::FrameTimeout));
                }
            }
            // Pushes run in the loop, but not while the output is past its
            // limit, nor while frames held behind a deferred reply fill
            // the push queue: then they wait here for the send that drains
            // the output, or the reply that lets the held frames go (going
            // round for them would never yield, and neither could end).
            if registered.as_ref().is_some_and(Registered::has_pushes)
                && queued <= config.outbound_limit
                && cx.held < config.push_queue.max(1)
                && cx.close.is_none()
                && moving.is_none()
                && !closing
            {
                return Poll::Ready(Event::Progress);
            }
            // Progress (replies written, a send done) that leaves the loop
            // above nothing new to do goes on waiting here: every operation
            // and reply still pending was polled above and holds this
            // task's waker. Most requests of a connection that asks one at
            // a time end so (their reply written at once, the next receive
            // armed); going round the loop would poll all of it again for
            // nothing. The loop has work when output waits for a send (the
            // one in flight just ended), when a frame may be buffered or
            // carried (the window or the outbound limit held it), when an
            // end waits for the replies (a close, a move, a shutdown, the
            // peer's end), or when a receive it held back may now be armed.
            let loop_has_work = (send.is_none() && !cx.wbuf.is_empty())
                || carried.is_some()
                || !rbuf.is_empty()
                || cx.close.is_some()
                || moving.is_some()
                || closing
                || peer_closed
                || peer_gone
                // No receive armed (it would be, had the loop allowed one).
                || recv.is_none();
            if progressed && loop_has_work {
                Poll::Ready(Event::Progress)
            } else {
                Poll::Pending
            }
        })
        .await;
        match event {
            Event::Progress | Event::Shutdown => {}
            Event::Read => {
                starved = false;
                if let (Some(t), Some(d)) = (idle.as_mut(), config.idle_timeout) {
                    t.reset(deadline_in(d));
                }
            }
            // Seen while blocked: the replies before the blocked one are
            // written, then the connection ends (below).
            Event::PeerGone => peer_gone = true,
            Event::PeerClosed => peer_closed = true,
            Event::HighWater(queued) => session.on_backpressure(queued, cx),
            Event::Idle => {
                // Replies outstanding or being written are activity; but a
                // send that spans two idle periods has a peer that stopped
                // reading.
                if send.is_some() {
                    if in_flight.stalled {
                        return Exit::Close(CloseReason::SlowReader {
                            queued: outbound(cx, in_flight.bytes),
                        });
                    }
                    in_flight.stalled = true;
                } else if cx.pending_replies() == 0 && cx.wbuf.is_empty() {
                    return Exit::Close(CloseReason::IdleTimeout);
                }
                if let (Some(t), Some(d)) = (idle.as_mut(), config.idle_timeout) {
                    t.reset(deadline_in(d));
                }
            }
            Event::Close(reason) => return Exit::Close(reason),
        }
    }
}

enum Event {
    Progress,
    Read,
    PeerClosed,
    /// The end, seen by the watch while nothing read.
    PeerGone,
    HighWater(usize),
    Idle,
    Shutdown,
    Close(CloseReason),
}

fn note_owner(counters: &ShardCounters, owner: ShardId) {
    if mailring::current_shard() != Some(owner) {
        counters.io_off_owner.fetch_add(1, Ordering::Relaxed);
    }
}

/// How a handler's run ended.
/// The close reason of a failed receive or send: the TLS layer's failure,
/// or the socket's error.
fn io_close(e: &io::Error) -> CloseReason {
    match TlsFailure::of(e) {
        Some(failure) => CloseReason::Tls(failure),
        None => CloseReason::Io(e.kind()),
    }
}

enum Handled {
    Done,
    /// The send in flight beside it failed (the handler still finished).
    SendFailed(CloseReason),
    /// The server's shutdown grace ran out first: the handler is dropped.
    Forced,
    /// A [`crate::SessionCloser`] closed the connection: the handler is
    /// dropped.
    Closed,
    /// The handler ran past the server's handler timeout: it is dropped.
    TimedOut,
}

/// What ends a handler early.
struct Stop<'a> {
    /// The server's shutdown grace ran out.
    forced: &'a AtomicBool,
    /// The connection's closers (with the waker they hold now).
    closer: Option<&'a CloserState>,
    known: &'a mut Option<Waker>,
    /// How long the handler may run ([`ServerConfig::handler_timeout`]).
    limit: Option<Duration>,
}

/// Runs a handler's future to its end while polling the send in flight, if
/// any; a forced shutdown or a closer ends it early (a handler that never
/// finishes must not hold the server's shutdown, nor an operator's kick).
async fn run_beside_send<F, W>(
    mut handling: std::pin::Pin<&mut F>,
    mut send: std::pin::Pin<&mut Option<W>>,
    stop: Stop<'_>,
    wake: &WakeCell,
) -> Handled
where
    F: Future<Output = ()>,
    W: Future<Output = (io::Result<()>, bytes::Bytes)>,
{
    let mut failed = None;
    let Stop {
        forced,
        closer,
        known,
        limit,
    } = stop;
    // Made at the handler's first wait: one that finishes at once never
    // touches the timers.
    let mut deadline: Option<Sleep> = None;
    std::future::poll_fn(|task| {
        if forced.load(Ordering::Acquire) {
            return Poll::Ready(Handled::Forced);
        }
        if closer.is_some_and(|c| c.watch(task.waker(), known)) {
            return Poll::Ready(Handled::Closed);
        }
        wake.set(task.waker());
        if let Some(op) = send.as_mut().as_pin_mut() {
            if let Poll::Ready((res, _)) = op.poll(task) {
                send.set(None);
                if let Err(e) = res {
                    failed = Some(io_close(&e));
                }
            }
        }
        if let Poll::Ready(()) = handling.as_mut().poll(task) {
            return Poll::Ready(match failed.take() {
                Some(e) => Handled::SendFailed(e),
                None => Handled::Done,
            });
        }
        let Some(limit) = limit else {
            return Poll::Pending;
        };
        let sleep = deadline.get_or_insert_with(|| mailring::time::sleep(limit));
        match Pin::new(sleep).poll(task) {
            // A send that failed meanwhile is the first cause (and its
            // bytes were not sent).
            Poll::Ready(()) => Poll::Ready(match failed.take() {
                Some(e) => Handled::SendFailed(e),
                None => Handled::TimedOut,
            }),
            Poll::Pending => Poll::Pending,
        }
    })
    .await
}

/// A push to the sessions of a key, run on each on its shard.
type PushFn<S> = Arc<dyn Fn(&mut S, &mut SessionCtx<S>) + Send + Sync>;

/// An attached session's queue of pushes, and the waker of its driver.
struct Inbox<S: Session> {
    queue: RefCell<VecDeque<PushFn<S>>>,
    wake: Rc<RefCell<Option<Waker>>>,
}

/// Per shard and server: the inboxes of the sessions attached here, by key.
type KeyTable<S> = HashMap<<S as Session>::Key, Vec<Rc<Inbox<S>>>>;

thread_local! {
    static BY_KEY: RefCell<HashMap<u64, Box<dyn Any>>> = RefCell::new(HashMap::new());
}

fn with_key_table<S: Session, R>(server: u64, f: impl FnOnce(&mut KeyTable<S>) -> R) -> R {
    BY_KEY.with(|tables| {
        let mut tables = tables.borrow_mut();
        let table = tables
            .entry(server)
            .or_insert_with(|| Box::new(KeyTable::<S>::new()))
            .downcast_mut::<KeyTable<S>>()
            .expect("one session type per server id");
        f(table)
    })
}

/// Reads the key table of `server` on this shard without making one (an
/// empty answer when there is none).
fn read_key_table<S: Session, R>(server: u64, f: impl FnOnce(Option<&KeyTable<S>>) -> R) -> R {
    BY_KEY.with(|tables| {
        let tables = tables.borrow();
        f(tables
            .get(&server)
            .and_then(|t| t.downcast_ref::<KeyTable<S>>()))
    })
}

/// A session's place in its shard's key table; leaves it on drop (and the
/// table goes with its last session).
struct Registered<S: Session> {
    server: u64,
    key: S::Key,
    inbox: Rc<Inbox<S>>,
    /// Where pushes left unrun at the end are counted.
    shared: Arc<Shared<S>>,
}

impl<S: Session> Registered<S> {
    fn new(shared: &Arc<Shared<S>>, key: S::Key, wake: &WakeCell) -> Self {
        let server = shared.id;
        let inbox = Rc::new(Inbox {
            queue: RefCell::new(VecDeque::new()),
            wake: wake.cell.clone(),
        });
        with_key_table::<S, _>(server, |t| {
            t.entry(key.clone()).or_default().push(inbox.clone())
        });
        Registered {
            server,
            key,
            inbox,
            shared: shared.clone(),
        }
    }

    fn take(&self) -> Option<PushFn<S>> {
        self.inbox.queue.borrow_mut().pop_front()
    }

    fn has_pushes(&self) -> bool {
        !self.inbox.queue.borrow().is_empty()
    }
}

impl<S: Session> Drop for Registered<S> {
    fn drop(&mut self) {
        let unrun = self.inbox.queue.borrow().len() as u64;
        if unrun > 0 {
            if let Some(shard) = mailring::current_shard() {
                self.shared
                    .counters(shard)
                    .pushes_dropped
                    .fetch_add(unrun, Ordering::Relaxed);
            }
        }
        let _ = BY_KEY.try_with(|tables| {
            let mut tables = tables.borrow_mut();
            let Some(table) = tables
                .get_mut(&self.server)
                .and_then(|t| t.downcast_mut::<KeyTable<S>>())
            else {
                return;
            };
            if let Some(list) = table.get_mut(&self.key) {
                list.retain(|i| !Rc::ptr_eq(i, &self.inbox));
                if list.is_empty() {
                    table.remove(&self.key);
                }
            }
            if table.is_empty() {
                tables.remove(&self.server);
            }
        });
    }
}

/// Attaches the session to `key` on this (the key's) shard: registers it
/// for pushes and runs `on_attach`; or, when the key has
/// [`ServerConfig::max_per_key`] sessions already, sends the session's
/// refusal and closes with [`CloseReason::KeyLimit`].
fn attach<S: Session>(
    shared: &Arc<Shared<S>>,
    session: &mut S,
    cx: &mut SessionCtx<S>,
    key: S::Key,
    wake: &WakeCell,
) -> Option<Registered<S>> {
    if let Some(max) = shared.config.max_per_key {
        let live = read_key_table::<S, _>(shared.id, |t| {
            t.and_then(|t| t.get(&key)).map_or(0, Vec::len)
        });
        if live >= max {
            if let Some(frame) = session.refusal(&CloseReason::KeyLimit) {
                cx.send_frame(frame);
            }
            cx.close = Some(CloseReason::KeyLimit);
            return None;
        }
    }
    let registered = Registered::new(shared, key.clone(), wake);
    cx.key = Some(key);
    shared
        .counters(cx.shard)
        .attached_in
        .fetch_add(1, Ordering::Relaxed);
    session.on_attach(cx);
    Some(registered)
}

/// Runs on the key's shard: queues `push` for each session of `key` there;
/// returns how many.
fn deliver<S: Session>(shared: &Shared<S>, key: &S::Key, push: PushFn<S>) -> usize {
    let inboxes: Vec<Rc<Inbox<S>>> = read_key_table::<S, _>(shared.id, |t| {
        t.and_then(|t| t.get(key)).cloned().unwrap_or_default()
    });
    let shard = mailring::current_shard().expect("delivered on a shard");
    let counters = shared.counters(shard);
    if inboxes.is_empty() {
        counters.push_dead_letters.fetch_add(1, Ordering::Relaxed);
        return 0;
    }
    let limit = shared.config.push_queue.max(1);
    let mut reached = 0;
    for inbox in &inboxes {
        let mut queue = inbox.queue.borrow_mut();
        if queue.len() >= limit {
            // A session busy for long, with more pushes waiting than it
            // may hold: memory stays bounded, and the loss is counted.
            counters.pushes_dropped.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        queue.push_back(push.clone());
        drop(queue);
        reached += 1;
        if let Some(w) = inbox.wake.borrow().as_ref() {
            w.wake_by_ref();
        }
    }
    counters
        .pushes_delivered
        .fetch_add(reached as u64, Ordering::Relaxed);
    reached
}

/// Reaches the live sessions of a key from anywhere (any shard, any
/// thread): what a publisher holds to push to a tenant's connections.
/// Cheap to clone.
pub struct SessionsByKey<S: Session> {
    shared: Arc<Shared<S>>,
}

impl<S: Session> Clone for SessionsByKey<S> {
    fn clone(&self) -> Self {
        SessionsByKey {
            shared: self.shared.clone(),
        }
    }
}

impl<S: Session> std::fmt::Debug for SessionsByKey<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionsByKey").finish_non_exhaustive()
    }
}

impl<S: Session> SessionsByKey<S> {
    /// A push to a key placed past the last shard: a dead letter (counted
    /// on shard 0).
    fn unplaceable(&self) {
        self.shared
            .counters(ShardId::new(0))
            .push_dead_letters
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Runs `push` on every session attached to `key`, on the key's shard,
    /// between its frames (e.g. `cx.send_frame(..)` to every connection of
    /// a tenant). Fire and forget: when the key has no attached session, the
    /// push is counted as a dead letter
    /// ([`SessionShardStats::push_dead_letters`](crate::SessionShardStats))
    /// and dropped. A session still moving to the key's shard is not
    /// attached yet.
    pub fn push(
        &self,
        key: &S::Key,
        push: impl Fn(&mut S, &mut SessionCtx<S>) + Send + Sync + 'static,
    ) {
        let Some(owner) = self.shared.place(key) else {
            self.unplaceable();
            return;
        };
        let shared = self.shared.clone();
        let key = key.clone();
        let push: PushFn<S> = Arc::new(push);
        self.shared.handle.run_on(owner, move || {
            deliver(&shared, &key, push);
        });
    }

    /// As [`push`](Self::push), and answers, after a round trip to the
    /// key's shard, how many sessions it reached (0: none, nothing ran).
    pub async fn push_counted(
        &self,
        key: &S::Key,
        push: impl Fn(&mut S, &mut SessionCtx<S>) + Send + Sync + 'static,
    ) -> usize {
        let Some(owner) = self.shared.place(key) else {
            self.unplaceable();
            return 0;
        };
        let shared = self.shared.clone();
        let key = key.clone();
        let push: PushFn<S> = Arc::new(push);
        self.shared
            .handle
            .spawn_on(owner, async move { deliver(&shared, &key, push) })
            .await
            .unwrap_or(0)
    }
}

/// Binds a plain socket (no `SO_REUSEPORT`) to `addr` without listening:
/// `AddrInUse` where anything listens there, a reuseport group of another
/// process included. It never listens, so a client that connects while
/// it is bound is refused, never accepted and then reset when it closes.
///
/// A listener of a process that just died (killed) stays a few
/// milliseconds after it: a port found taken is tried again for up to
/// [`PROBE_PATIENCE`] before `AddrInUse` is believed.
pub(crate) fn probe_port(addr: SocketAddr) -> io::Result<socket2::Socket> {
    let deadline = std::time::Instant::now() + PROBE_PATIENCE;
    loop {
        let socket = socket2::Socket::new(
            socket2::Domain::for_address(addr),
            socket2::Type::STREAM,
            None,
        )?;
        // As a listener binds: a port whose last connections wait out
        // TIME_WAIT is free.
        socket.set_reuse_address(true)?;
        match socket.bind(&addr.into()) {
            Ok(()) => return Ok(socket),
            Err(e)
                if e.kind() == io::ErrorKind::AddrInUse && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(e) => return Err(e),
        }
    }
}

/// How long [`probe_port`] tries a taken port again.
const PROBE_PATIENCE: std::time::Duration = std::time::Duration::from_millis(300);

#[cfg(test)]
mod probe_tests {
    use super::probe_port;
    use std::io;

    #[test]
    fn a_port_probe_refuses_connections_and_finds_listeners() {
        let held = probe_port("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = held.local_addr().unwrap().as_socket().unwrap();
        // Bound, not listening: a connect is refused, not accepted.
        let e = std::net::TcpStream::connect(addr).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
        drop(held);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let taken = listener.local_addr().unwrap();
        let e = probe_port(taken).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
        // A listener that goes a moment later (a killed process's lingers
        // a few milliseconds): the port is found free.
        let closing = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            drop(listener);
        });
        assert!(probe_port(taken).is_ok());
        closing.join().unwrap();
        // A reuseport group: taken too.
        let group =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        group.set_reuse_port(true).unwrap();
        group
            .bind(
                &"127.0.0.1:0"
                    .parse::<std::net::SocketAddr>()
                    .unwrap()
                    .into(),
            )
            .unwrap();
        group.listen(8).unwrap();
        let in_group = group.local_addr().unwrap().as_socket().unwrap();
        let e = probe_port(in_group).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
    }
}
