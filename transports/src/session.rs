//! Sessions: the [`Session`] trait a user implements for one connection,
//! its [`SessionCtx`] (outbound frames, deferred replies in request order,
//! close), [`Route`] (the key extractor's answer) and [`CloseReason`].

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use bytes::BytesMut;
use mailring_actors::mailring::ShardId;
use mailring_actors::RouteKey;

use crate::codec::{Codec, CodecError};

/// A decoded frame of session `S`.
pub type FrameIn<S> = <<S as Session>::Codec as Codec>::In;
/// A frame session `S` sends.
pub type FrameOut<S> = <<S as Session>::Codec as Codec>::Out;

/// What the key extractor ([`Session::route`]) says of a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route<K> {
    /// No key in this frame: handle it where the connection is and ask again
    /// at the next one (a `PING`, `HELLO` or handshake before the key).
    NotYet,
    /// The connection belongs to this key: it moves to the key's shard (once
    /// no reply is outstanding), and this frame is handled there.
    Key(K),
}

/// One connection's protocol logic, run on the shard that owns the
/// connection. A session value moves with its connection when a key names
/// another shard, so it is `Send`; its handler futures need not be.
///
/// ```
/// use bytes::Bytes;
/// use mailring_transports::codec::LengthDelimited;
/// use mailring_transports::{Route, Session, SessionCtx};
///
/// /// Echoes frames; the first frame names the tenant.
/// struct Echo;
///
/// impl Session for Echo {
///     type Codec = LengthDelimited;
///     type Key = Bytes;
///
///     fn route(&mut self, frame: &Bytes, cx: &SessionCtx<Self>) -> Route<Bytes> {
///         if cx.key().is_some() { Route::NotYet } else { Route::Key(frame.clone()) }
///     }
///
///     async fn on_frame(&mut self, frame: Bytes, cx: &mut SessionCtx<Self>) {
///         cx.send_frame(frame);
///     }
/// }
/// ```
pub trait Session: Send + Sized + 'static {
    /// How the connection's bytes become frames and back.
    type Codec: Codec;
    /// The key that decides the owning shard (`()` for sessions that stay
    /// where they were accepted).
    type Key: RouteKey + Clone + Eq + std::hash::Hash + Send + Sync + fmt::Debug + 'static;

    /// The decoder of this connection's frames, made once with the
    /// session: by default a clone of the server's codec. A session that
    /// shares state with its decoder (a limit that depends on whether the
    /// peer authenticated, say) makes its own here.
    fn decoder(&mut self, server_codec: &Self::Codec) -> Self::Codec {
        server_codec.clone()
    }

    /// The key extractor, asked for each frame until it names a key. By
    /// default no frame names one: the session stays where it was accepted.
    fn route(&mut self, frame: &FrameIn<Self>, cx: &SessionCtx<Self>) -> Route<Self::Key> {
        let _ = (frame, cx);
        Route::NotYet
    }

    /// Runs once the connection is accepted, on the accepting shard, before
    /// any frame (e.g. to send a greeting).
    fn on_open(&mut self, cx: &mut SessionCtx<Self>) {
        let _ = cx;
    }

    /// Runs on the key's shard when the connection arrives there (also when
    /// that is the shard it was accepted on).
    fn on_attach(&mut self, cx: &mut SessionCtx<Self>) {
        let _ = cx;
    }

    /// Handles one inbound frame. Frames are handled one at a time; a reply
    /// that waits on something (an ask to a keyed actor) goes through
    /// [`SessionCtx::reply_later`], so later frames are handled meanwhile
    /// and replies still leave in request order.
    fn on_frame(
        &mut self,
        frame: FrameIn<Self>,
        cx: &mut SessionCtx<Self>,
    ) -> impl Future<Output = ()>;

    /// Runs when the session has handled every whole frame received so far
    /// (or may take no more for now: the pipeline window is full, the
    /// connection is closing or moving) and the driver is about to wait. A
    /// session that gathers work from a run of pipelined frames (one ask
    /// for sixteen commands instead of sixteen asks) sends it here, queued
    /// with [`SessionCtx::reply_later_many`]. Called at most once per run
    /// of handled frames; by default it does nothing.
    ///
    /// Work still gathered here counts towards no window: bound it.
    fn on_drained(&mut self, cx: &mut SessionCtx<Self>) {
        let _ = cx;
    }

    /// The outbound queue passed the server's high-water mark
    /// ([`crate::ServerConfig::outbound_high_water`]): the peer reads slower
    /// than the session writes. Past the hard limit the connection closes
    /// with [`CloseReason::SlowReader`].
    fn on_backpressure(&mut self, queued_bytes: usize, cx: &mut SessionCtx<Self>) {
        let _ = (queued_bytes, cx);
    }

    /// The frame sent before the server closes the connection for `reason`
    /// when the protocol has a way to say it (a Redis server answers
    /// `-ERR max number of clients reached`); by default none. Asked for
    /// [`CloseReason::KeyLimit`] and [`CloseReason::ClientLimit`]. For
    /// the client limit it is asked once, as the connection comes: before
    /// a TLS handshake, whose success the frame then waits for (a refused
    /// connection whose handshake fails gets nothing, but was asked, so a
    /// count kept here counts every refusal), and instead of `on_open`,
    /// which does not run: the session closes at once.
    fn refusal(&mut self, reason: &CloseReason) -> Option<FrameOut<Self>> {
        let _ = reason;
        None
    }

    /// Runs once when the connection ends, with the reason. It runs for
    /// every connection that got a session, also one that never opened
    /// (`on_open` did not run): one whose TLS handshake failed, or one
    /// turned away past the server's client limit
    /// ([`CloseReason::ClientLimit`]). A connection whose PROXY header is
    /// refused gets no session, so neither hook runs for it.
    fn on_close(&mut self, reason: &CloseReason, cx: &mut SessionCtx<Self>) {
        let _ = (reason, cx);
    }
}

/// Why a connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CloseReason {
    /// The peer closed its side, and every reply was written.
    PeerClosed,
    /// The session asked ([`SessionCtx::close`]).
    ClosedBySession,
    /// Nothing arrived for the idle timeout.
    IdleTimeout,
    /// No key was named within the handshake timeout.
    HandshakeTimeout,
    /// A frame was started and not finished within the frame deadline (a
    /// client sending a byte a second).
    FrameTimeout,
    /// A handler ran past [`crate::ServerConfig::handler_timeout`]: it was
    /// dropped where it waited, and the replies not yet written with it.
    HandlerTimeout,
    /// A frame the codec refused (malformed or over the maximum).
    BadFrame(CodecError),
    /// A frame the session sent could not be encoded.
    BadOutput(CodecError),
    /// The peer stopped reading: the outbound queue passed its hard limit.
    SlowReader {
        /// Bytes queued when it closed.
        queued: usize,
    },
    /// The key already had as many connections as the server allows.
    KeyLimit,
    /// The server already served as many connections as it allows
    /// ([`crate::ServerConfig::max_clients`]): this one was accepted only to
    /// be told so ([`Session::refusal`]).
    ClientLimit,
    /// The server is shutting down (after its grace period, or at once
    /// for an idle connection).
    Shutdown,
    /// The socket failed (reset, broken pipe, ...).
    Io(std::io::ErrorKind),
    /// Moving the connection to its key's shard failed.
    HandOff,
    /// The TLS handshake or a TLS record failed (a client that trusts
    /// another CA, an expired certificate, bytes that are no TLS, a
    /// handshake past its timeout).
    Tls(crate::tls::TlsFailure),
    /// A PROXY-protocol listener's connection sent no valid header (no
    /// session was made).
    ProxyHeader(crate::proxy::ProxyError),
    /// Its [`SessionCloser`] was used (an operator's kick, from any
    /// shard or thread): the connection ended at once, replies not yet
    /// written dropped.
    ClosedByHandle,
    /// The session's code (the factory, a hook, a handler, a push, a
    /// deferred reply) panicked. The panic is reported to the runtime
    /// (`ShardStats::panics`, the `on_panic` hook); `on_close` does not run
    /// on a session that panicked.
    Panicked,
}

impl CloseReason {
    /// The reason's kind, for counting.
    pub fn kind(&self) -> CloseKind {
        match self {
            CloseReason::PeerClosed => CloseKind::PeerClosed,
            CloseReason::ClosedBySession => CloseKind::ClosedBySession,
            CloseReason::ClosedByHandle => CloseKind::ClosedByHandle,
            CloseReason::IdleTimeout => CloseKind::IdleTimeout,
            CloseReason::HandshakeTimeout => CloseKind::HandshakeTimeout,
            CloseReason::FrameTimeout => CloseKind::FrameTimeout,
            CloseReason::HandlerTimeout => CloseKind::HandlerTimeout,
            CloseReason::BadFrame(_) => CloseKind::BadFrame,
            CloseReason::BadOutput(_) => CloseKind::BadOutput,
            CloseReason::SlowReader { .. } => CloseKind::SlowReader,
            CloseReason::KeyLimit => CloseKind::KeyLimit,
            CloseReason::ClientLimit => CloseKind::ClientLimit,
            CloseReason::Shutdown => CloseKind::Shutdown,
            CloseReason::Io(_) => CloseKind::Io,
            CloseReason::HandOff => CloseKind::HandOff,
            CloseReason::Tls(_) => CloseKind::Tls,
            CloseReason::ProxyHeader(_) => CloseKind::ProxyHeader,
            CloseReason::Panicked => CloseKind::Panicked,
        }
    }
}

impl fmt::Display for CloseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CloseReason::PeerClosed => f.write_str("peer closed"),
            CloseReason::ClosedBySession => f.write_str("closed by the session"),
            CloseReason::ClosedByHandle => f.write_str("closed by its handle"),
            CloseReason::IdleTimeout => f.write_str("idle timeout"),
            CloseReason::HandshakeTimeout => f.write_str("no key within the handshake timeout"),
            CloseReason::FrameTimeout => f.write_str("frame not completed in time"),
            CloseReason::HandlerTimeout => f.write_str("a handler ran past its timeout"),
            CloseReason::BadFrame(e) => write!(f, "bad frame: {e}"),
            CloseReason::BadOutput(e) => write!(f, "frame could not be encoded: {e}"),
            CloseReason::SlowReader { queued } => {
                write!(f, "peer not reading ({queued} bytes queued)")
            }
            CloseReason::KeyLimit => f.write_str("too many connections for this key"),
            CloseReason::ClientLimit => f.write_str("too many connections for the server"),
            CloseReason::Shutdown => f.write_str("server shutdown"),
            CloseReason::Io(kind) => write!(f, "socket error: {kind}"),
            CloseReason::HandOff => f.write_str("hand-off to the key's shard failed"),
            CloseReason::Tls(e) => e.fmt(f),
            CloseReason::ProxyHeader(e) => e.fmt(f),
            CloseReason::Panicked => f.write_str("the session panicked"),
        }
    }
}

/// Closes one connection from anywhere: from [`SessionCtx::closer`].
/// Cheap to clone, `Send` and `Sync`; it outlives its connection harmlessly
/// (it holds a flag, not the connection).
///
/// ```no_run
/// # use mailring_transports::{Session, SessionCtx, SessionCloser};
/// # use mailring_transports::codec::LengthDelimited;
/// # use bytes::Bytes;
/// struct Kickable(std::sync::Arc<std::sync::Mutex<Vec<SessionCloser>>>);
///
/// impl Session for Kickable {
///     type Codec = LengthDelimited;
///     type Key = ();
///
///     fn on_open(&mut self, cx: &mut SessionCtx<Self>) {
///         // An admin task may kick this connection later.
///         self.0.lock().unwrap().push(cx.closer());
///     }
///
///     async fn on_frame(&mut self, frame: Bytes, cx: &mut SessionCtx<Self>) {
///         cx.send_frame(frame);
///     }
/// }
/// ```
#[derive(Clone)]
pub struct SessionCloser(Arc<CloserState>);

#[derive(Default)]
pub(crate) struct CloserState {
    /// Closed by a handle, or the connection ended.
    closed: AtomicBool,
    /// The connection's task, woken by a close (none once it ended).
    waker: Mutex<Option<Waker>>,
}

impl CloserState {
    /// Whether a [`SessionCloser`] closed the connection; else keeps
    /// `waker` to be woken when one does (`known`: the waker kept last,
    /// so that the lock is taken only when the task's waker changes).
    pub(crate) fn watch(&self, waker: &Waker, known: &mut Option<Waker>) -> bool {
        if self.closed.load(Ordering::Acquire) {
            return true;
        }
        if !known.as_ref().is_some_and(|k| k.will_wake(waker)) {
            *self.waker.lock().unwrap_or_else(|p| p.into_inner()) = Some(waker.clone());
            *known = Some(waker.clone());
        }
        // Closed between the first look and the waker's keeping: the
        // closer may have found no waker to wake.
        self.closed.load(Ordering::Acquire)
    }
}

/// The context's side of its closers: when the connection ends (the
/// context is dropped, however it ends), later closes do nothing and the
/// task's waker is let go. Moved, not dropped, when the connection moves
/// to another shard.
pub(crate) struct CloserHandle(pub(crate) Arc<CloserState>);

impl Drop for CloserHandle {
    fn drop(&mut self) {
        self.0.closed.store(true, Ordering::Release);
        drop(
            self.0
                .waker
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
    }
}

impl SessionCloser {
    /// Ends the connection at its driver's next turn, whatever it is doing
    /// (waiting for the peer, or on a reply that may never come): replies
    /// not yet written are dropped, as a server's kill drops them, and the
    /// session closes with [`CloseReason::ClosedByHandle`]. `true` for the
    /// call that closed it; `false` once closed, or once the connection
    /// ended.
    pub fn close(&self) -> bool {
        if self.0.closed.swap(true, Ordering::AcqRel) {
            return false;
        }
        let waker = self
            .0
            .waker
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(w) = waker {
            w.wake();
        }
        true
    }

    /// Whether [`SessionCloser::close`] was called, or the connection
    /// ended.
    pub fn is_closed(&self) -> bool {
        self.0.closed.load(Ordering::Acquire)
    }
}

impl fmt::Debug for SessionCloser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionCloser")
            .field("closed", &self.is_closed())
            .finish()
    }
}

/// [`CloseReason`] without its details: an index into the close counters.
/// Kinds may be added (as [`CloseReason`]s are): match with a wildcard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
#[non_exhaustive]
pub enum CloseKind {
    PeerClosed,
    ClosedBySession,
    IdleTimeout,
    HandshakeTimeout,
    FrameTimeout,
    BadFrame,
    BadOutput,
    SlowReader,
    KeyLimit,
    Shutdown,
    Io,
    HandOff,
    Panicked,
    Tls,
    ProxyHeader,
    ClosedByHandle,
    ClientLimit,
    HandlerTimeout,
}

impl CloseKind {
    /// Every kind, in counter order.
    pub const ALL: [CloseKind; 18] = [
        CloseKind::PeerClosed,
        CloseKind::ClosedBySession,
        CloseKind::IdleTimeout,
        CloseKind::HandshakeTimeout,
        CloseKind::FrameTimeout,
        CloseKind::BadFrame,
        CloseKind::BadOutput,
        CloseKind::SlowReader,
        CloseKind::KeyLimit,
        CloseKind::Shutdown,
        CloseKind::Io,
        CloseKind::HandOff,
        CloseKind::Panicked,
        CloseKind::Tls,
        CloseKind::ProxyHeader,
        CloseKind::ClosedByHandle,
        CloseKind::ClientLimit,
        CloseKind::HandlerTimeout,
    ];

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// One slot of the ordered outbound queue.
enum Slot<T> {
    Ready(T),
    Later(Pin<Box<dyn Future<Output = T>>>),
    /// Several replies from one future, counted as that many.
    LaterMany(usize, Pin<Box<dyn Future<Output = Vec<T>>>>),
    ReadyMany(Vec<T>),
    /// A reply made when every slot before it is ready.
    InTurn(Box<dyn FnOnce() -> T>),
    /// A deferred reply whose future is made (and its work started) when
    /// every slot before it is ready.
    LaterInTurn(Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = T>>>>),
}

/// A session's view of its connection: identity, outbound frames in order,
/// deferred replies, close.
pub struct SessionCtx<S: Session> {
    pub(crate) peer: Option<SocketAddr>,
    /// The address the connection was accepted on (TCP).
    pub(crate) local: Option<SocketAddr>,
    pub(crate) shard: ShardId,
    pub(crate) id: u64,
    pub(crate) key: Option<S::Key>,
    /// What the TLS handshake agreed on, for a TLS connection.
    pub(crate) tls: Option<std::sync::Arc<crate::tls::TlsInfo>>,
    /// The PROXY header the connection began with, on such a listener.
    pub(crate) proxy: Option<std::sync::Arc<crate::proxy::ProxyHeader>>,
    pub(crate) encoder: S::Codec,
    /// Encoded bytes not yet handed to a send.
    pub(crate) wbuf: BytesMut,
    /// Bytes sends took from `wbuf` in full batches since it last let go
    /// of its allocation: past [`crate::server::WBUF_KEEP_MAX`], once
    /// `wbuf` is empty, it lets go rather than keep the allocation for the
    /// next reply (an idle connection would otherwise hold the biggest
    /// reply it ever sent); replies under it keep reusing it.
    pub(crate) wbuf_big_bytes: usize,
    /// Frames behind a deferred reply, in order; the front is the oldest.
    slots: VecDeque<Slot<FrameOut<S>>>,
    /// Deferred replies among `slots`.
    pending: usize,
    /// Replies ready in `slots` but not written yet (behind one that is
    /// not ready): they count against the pipeline window with the
    /// pending ones, so a stuck reply cannot gather every later one in
    /// memory.
    pub(crate) held: usize,
    /// Replies queued, and written, since the connection opened (for a
    /// blocked reply's place).
    queued: u64,
    written: u64,
    /// Blocked on the reply of this number (see
    /// [`SessionCtx::block_until_replied`]).
    blocked_at: Option<u64>,
    /// No frame is handled until the deferred replies are written.
    hold: bool,
    /// Replies queued now are dropped instead of written
    /// ([`SessionCtx::discard_replies`]).
    discarding: bool,
    /// Slots pushed so far: a slot's number is its place in that
    /// sequence (the front slot's is this less the queue's length).
    slots_pushed: u64,
    /// The numbers of the slots whose replies are dropped, in order.
    discarded_slots: VecDeque<u64>,
    pub(crate) close: Option<CloseReason>,
    /// Shared with the session's [`SessionCloser`]s, once one was asked
    /// for.
    pub(crate) closer: Option<CloserHandle>,
}

impl<S: Session> fmt::Debug for SessionCtx<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionCtx")
            .field("peer", &self.peer)
            .field("shard", &self.shard)
            .field("id", &self.id)
            .field("key", &self.key)
            .field("queued_bytes", &self.wbuf.len())
            .field("pending_replies", &self.pending)
            .finish()
    }
}

impl<S: Session> SessionCtx<S> {
    pub(crate) fn new(peer: Option<SocketAddr>, shard: ShardId, id: u64, codec: S::Codec) -> Self {
        SessionCtx {
            peer,
            local: None,
            shard,
            id,
            key: None,
            tls: None,
            proxy: None,
            encoder: codec,
            wbuf: BytesMut::new(),
            wbuf_big_bytes: 0,
            slots: VecDeque::new(),
            pending: 0,
            held: 0,
            queued: 0,
            written: 0,
            blocked_at: None,
            hold: false,
            discarding: false,
            slots_pushed: 0,
            discarded_slots: VecDeque::new(),
            close: None,
            closer: None,
        }
    }

    /// From now on, drops the replies the session queues (sent, deferred
    /// or in turn) instead of writing them, until called with `false`
    /// (a Redis server's `CLIENT REPLY OFF` / `SKIP`). A deferred reply
    /// queued meanwhile still runs its future in order and counts
    /// towards the pipeline window until it is ready; only its frames are
    /// dropped. Replies queued before the call are written as usual.
    pub fn discard_replies(&mut self, discard: bool) {
        self.discarding = discard;
    }

    /// Whether replies queued now are dropped
    /// ([`SessionCtx::discard_replies`]).
    pub fn discards_replies(&self) -> bool {
        self.discarding
    }

    /// Queues `slot` behind the others, marked for dropping while
    /// replies are discarded.
    fn push_slot(&mut self, slot: Slot<FrameOut<S>>) {
        if self.discarding {
            self.discarded_slots.push_back(self.slots_pushed);
        }
        self.slots_pushed += 1;
        self.slots.push_back(slot);
    }

    /// The peer's address (`None` for Unix peers). On a PROXY-protocol
    /// listener ([`crate::ServerConfig::proxy_protocol`]), the client's
    /// address from the header (the proxy's own when the header names
    /// none).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer
    }

    /// The local address the connection was accepted on (`None` for
    /// Unix sockets): the listener's, or, for a listener on every address
    /// (`0.0.0.0`, `[::]`), the one the client reached. On a
    /// PROXY-protocol listener, the destination the header names (the
    /// address the client connected to, on the proxy).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local
    }

    /// The shard the session runs on now.
    pub fn shard(&self) -> ShardId {
        self.shard
    }

    /// The connection's id, unique within its server.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The key, once [`Session::route`] named one.
    pub fn key(&self) -> Option<&S::Key> {
        self.key.as_ref()
    }

    /// What the TLS handshake agreed on (the SNI server name, ALPN, the
    /// version), for a connection of a TLS server; `None` otherwise. A
    /// session may name its key from the server name in
    /// [`Session::route`], so a tenant's TLS connections land on its shard.
    pub fn tls(&self) -> Option<&crate::tls::TlsInfo> {
        self.tls.as_deref()
    }

    /// The PROXY protocol header the connection began with (version,
    /// client and destination addresses), on a listener with
    /// [`crate::ServerConfig::proxy_protocol`]; `None` otherwise.
    pub fn proxy_header(&self) -> Option<&crate::proxy::ProxyHeader> {
        self.proxy.as_deref()
    }

    /// Queues `frame` for sending, after every reply queued before it
    /// (deferred ones included).
    pub fn send_frame(&mut self, frame: FrameOut<S>) {
        self.queued += 1;
        if self.slots.is_empty() {
            self.written += 1;
            if self.discarding {
                self.encoder.discard(frame);
            } else {
                self.encode(frame);
            }
        } else {
            self.held += 1;
            self.push_slot(Slot::Ready(frame));
        }
    }

    /// Queues a reply that `reply` will produce (an ask to a keyed actor,
    /// say), in order with the frames around it: it is written once it and
    /// everything queued before it are ready. Meanwhile the session goes on
    /// with the next frames, up to the server's pipeline window.
    pub fn reply_later(&mut self, reply: impl Future<Output = FrameOut<S>> + 'static) {
        self.queued += 1;
        self.pending += 1;
        self.push_slot(Slot::Later(Box::pin(reply)));
    }

    /// Queues `count` replies that `replies` will produce together (one
    /// ask answering a run of pipelined commands), in order with the frames
    /// around them, as [`SessionCtx::reply_later`] queues one. They count
    /// as `count` towards the pipeline window. The future yields the
    /// replies in order; all of them are written once it is ready. Should
    /// it yield another number, or panic, nothing of it is written and the
    /// connection closes with [`crate::CloseReason::Panicked`] (every later
    /// reply would otherwise answer the wrong request). A run of no
    /// replies still runs its future, in turn, and counts as one pending
    /// reply until it is done.
    pub fn reply_later_many(
        &mut self,
        count: usize,
        replies: impl Future<Output = Vec<FrameOut<S>>> + 'static,
    ) {
        self.queued += count as u64;
        self.pending += count.max(1);
        self.push_slot(Slot::LaterMany(count, Box::pin(replies)));
    }

    /// Queues a reply made by `reply` once every reply queued before it is
    /// ready (at once if none is pending): what it reads then includes
    /// what the requests before it did. For a request answered from shared
    /// state (a catalog, a counter) that earlier pipelined requests, still
    /// in flight to their actors, may change. Later requests are still
    /// handled meanwhile, and their work may finish first: follow it with
    /// [`SessionCtx::hold_frames_until_replied`] when they could change
    /// what it reads.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use mailring_transports::codec::LengthDelimited;
    /// use mailring_transports::{Session, SessionCtx};
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use std::sync::Arc;
    ///
    /// struct Counter {
    ///     count: Arc<AtomicU64>,
    /// }
    ///
    /// impl Session for Counter {
    ///     type Codec = LengthDelimited;
    ///     type Key = ();
    ///
    ///     async fn on_frame(&mut self, frame: Bytes, cx: &mut SessionCtx<Self>) {
    ///         let count = self.count.clone();
    ///         if frame.as_ref() == b"COUNT" {
    ///             // After the increments before it, however long they
    ///             // take, and before any after it.
    ///             let n = move || count.load(Ordering::Relaxed);
    ///             cx.reply_in_turn(move || Bytes::from(n().to_string()));
    ///             cx.hold_frames_until_replied();
    ///         } else {
    ///             cx.reply_later(async move {
    ///                 count.fetch_add(1, Ordering::Relaxed);
    ///                 Bytes::from_static(b"OK")
    ///             });
    ///         }
    ///     }
    /// }
    /// ```
    pub fn reply_in_turn(&mut self, reply: impl FnOnce() -> FrameOut<S> + 'static) {
        if self.pending == 0 {
            let frame = reply();
            return self.send_frame(frame);
        }
        self.queued += 1;
        self.pending += 1;
        self.push_slot(Slot::InTurn(Box::new(reply)));
    }

    /// Queues a deferred reply whose future `start` makes only once every
    /// reply queued before it is ready (at once if none is pending): its
    /// work (the asks it sends) starts after what the requests before it
    /// did, as [`SessionCtx::reply_in_turn`]'s does, but may take time.
    /// Follow it with [`SessionCtx::hold_frames_until_replied`] when a
    /// later request could change what it reads.
    pub fn reply_later_in_turn<F>(&mut self, start: impl FnOnce() -> F + 'static)
    where
        F: Future<Output = FrameOut<S>> + 'static,
    {
        self.queued += 1;
        self.pending += 1;
        if self.slots.is_empty() {
            self.push_slot(Slot::Later(Box::pin(start())));
        } else {
            self.push_slot(Slot::LaterInTurn(Box::new(move || Box::pin(start()))));
        }
    }

    /// Deferred replies not yet written.
    pub fn pending_replies(&self) -> usize {
        self.pending
    }

    /// Replies owed to the peer and not written yet: those pending and
    /// those ready behind them (what the pipeline window bounds).
    pub(crate) fn replies_owed(&self) -> usize {
        self.pending + self.held
    }

    /// Handles no further frame until every deferred reply queued so far
    /// is written: the frames after a blocking command (a Redis client in
    /// `XREAD BLOCK` sends nothing it expects handled before the answer)
    /// wait, where by default they are handled while replies are pending.
    /// The replies already queued are still written as they come.
    pub fn hold_frames_until_replied(&mut self) {
        self.hold = self.pending > 0;
    }

    /// As [`SessionCtx::hold_frames_until_replied`], for a reply that may
    /// take forever (a blocking read): with
    /// [`PeerClose::CloseWhileBlocked`](crate::PeerClose::CloseWhileBlocked)
    /// the peer's end is watched for meanwhile, and closes the connection
    /// once the replies before the blocked one are written.
    pub fn block_until_replied(&mut self) {
        self.hold_frames_until_replied();
        self.blocked_at = self.hold.then_some(self.queued);
    }

    /// Whether the session is blocked now (see
    /// [`block_until_replied`](Self::block_until_replied)).
    pub(crate) fn is_blocked(&self) -> bool {
        self.hold && self.pending > 0 && self.blocked_at.is_some()
    }

    /// Whether every reply queued before the blocked one is written.
    pub(crate) fn written_up_to_blocked(&self) -> bool {
        self.blocked_at.is_some_and(|at| self.written + 1 >= at)
    }

    /// Whether the next frame may be handled: not while held with
    /// deferred replies pending (the hold ends when they are written).
    pub(crate) fn takes_frames(&mut self) -> bool {
        if self.hold && self.pending == 0 {
            self.hold = false;
            self.blocked_at = None;
        }
        !self.hold
    }

    /// Encoded bytes waiting to be sent.
    pub fn queued_bytes(&self) -> usize {
        self.wbuf.len()
    }

    /// Closes the connection once what is queued is written.
    pub fn close(&mut self) {
        self.close.get_or_insert(CloseReason::ClosedBySession);
    }

    /// A handle that closes this connection from anywhere (any shard, any
    /// thread), wherever the session lives by then: what an operator's
    /// kick holds (Redis's `CLIENT KILL`). Every call hands out the same
    /// handle's clone.
    pub fn closer(&mut self) -> SessionCloser {
        let handle = self
            .closer
            .get_or_insert_with(|| CloserHandle(Arc::default()));
        SessionCloser(handle.0.clone())
    }

    /// Whether a [`SessionCloser`] closed the connection.
    pub(crate) fn closer_fired(&self) -> bool {
        self.closer
            .as_ref()
            .is_some_and(|c| c.0.closed.load(Ordering::Acquire))
    }

    /// The closers' state, made now if no closer was handed out yet: a
    /// handler that hands one out while it runs is watched by it too.
    pub(crate) fn closer_state_made(&mut self) -> Arc<CloserState> {
        self.closer
            .get_or_insert_with(|| CloserHandle(Arc::default()))
            .0
            .clone()
    }

    /// Whether a [`SessionCloser`] closed the connection; else keeps
    /// `waker` to be woken when one does (see [`CloserState::watch`]).
    pub(crate) fn closed_by_handle(&self, waker: &Waker, known: &mut Option<Waker>) -> bool {
        self.closer
            .as_ref()
            .is_some_and(|c| c.0.watch(waker, known))
    }

    fn encode(&mut self, frame: FrameOut<S>) {
        if let Err(e) = self.encoder.encode(frame, &mut self.wbuf) {
            self.close.get_or_insert(CloseReason::BadOutput(e));
        }
    }

    /// Encodes `frame` when it is to be written, else gives it to the
    /// codec's [`Codec::discard`].
    #[inline]
    fn encode_or_discard(&mut self, frame: FrameOut<S>, write: bool) {
        if write {
            self.encode(frame);
        } else {
            self.encoder.discard(frame);
        }
    }

    /// Whether nothing is queued: no deferred reply and no unwritten byte
    /// in the context (a send may still be in flight).
    pub(crate) fn is_drained(&self) -> bool {
        self.slots.is_empty() && self.wbuf.is_empty()
    }

    /// Polls every deferred reply (each starts its work at its first poll,
    /// so all of them run at once, not one after the other), then encodes
    /// the front slots that are ready, in order; returns whether any was.
    pub(crate) fn poll_slots(&mut self, cx: &mut Context<'_>) -> bool {
        if self.pending > 0 {
            // Whether every slot so far is ready: a reply in turn starts
            // then.
            let mut all_ready = true;
            for slot in self.slots.iter_mut() {
                if let Slot::LaterInTurn(_) = slot {
                    if !all_ready {
                        continue;
                    }
                    let Slot::LaterInTurn(start) =
                        std::mem::replace(slot, Slot::ReadyMany(Vec::new()))
                    else {
                        unreachable!("matched above");
                    };
                    *slot = Slot::Later(start());
                }
                match slot {
                    Slot::Later(fut) => {
                        if let Poll::Ready(frame) = fut.as_mut().poll(cx) {
                            *slot = Slot::Ready(frame);
                            self.pending -= 1;
                            self.held += 1;
                        } else {
                            all_ready = false;
                        }
                    }
                    Slot::LaterMany(count, fut) => {
                        if let Poll::Ready(frames) = fut.as_mut().poll(cx) {
                            // Another number would put every later reply
                            // against the wrong request: the connection
                            // closes as for a panic in the session.
                            assert_eq!(
                                frames.len(),
                                *count,
                                "a reply_later_many future yielded {} replies for {}",
                                frames.len(),
                                count
                            );
                            self.pending -= (*count).max(1);
                            self.held += frames.len();
                            *slot = Slot::ReadyMany(frames);
                        } else {
                            all_ready = false;
                        }
                    }
                    Slot::InTurn(_) | Slot::LaterInTurn(_) => all_ready = false,
                    Slot::Ready(_) | Slot::ReadyMany(_) => {}
                }
            }
        }
        let mut progressed = false;
        while let Some(slot) = self.slots.pop_front() {
            // Queued while replies were discarded: dealt with, not written.
            let write = match self.discarded_slots.front() {
                None => true,
                Some(&number) => number != self.slots_pushed - self.slots.len() as u64 - 1,
            };
            match slot {
                Slot::Ready(frame) => {
                    self.held -= 1;
                    self.written += 1;
                    self.encode_or_discard(frame, write);
                }
                Slot::ReadyMany(frames) => {
                    self.held -= frames.len();
                    self.written += frames.len() as u64;
                    for frame in frames {
                        self.encode_or_discard(frame, write);
                    }
                }
                // Every reply before it is written: its turn.
                Slot::InTurn(reply) => {
                    self.pending -= 1;
                    self.written += 1;
                    let frame = reply();
                    self.encode_or_discard(frame, write);
                }
                waiting => {
                    self.slots.push_front(waiting);
                    break;
                }
            }
            if !write {
                self.discarded_slots.pop_front();
            }
            progressed = true;
        }
        if progressed && matches!(self.slots.front(), Some(Slot::LaterInTurn(_))) {
            // Everything before it is written: its turn, now (its future
            // starts and registers for its wake-up).
            return self.poll_slots(cx) || progressed;
        }
        progressed
    }
}
