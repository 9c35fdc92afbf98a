//! Sockets on the shard's ring, with owned buffers: TCP ([`TcpListener`],
//! [`TcpStream`]), UDP ([`UdpSocket`], via `sendmsg`/`recvmsg`) and Unix
//! ([`UnixListener`], [`UnixStream`], [`UnixDatagram`]).
//!
//! Like files, sockets belong to the shard that created or accepted them; use
//! from another thread gives an error. Addresses are [`SocketAddr`]s: nothing
//! here resolves host names.
//!
//! A `recv` whose future is dropped is cancelled; if the kernel had already
//! received data into its buffer, that data goes with the buffer (the kernel
//! reports the operation as done, not cancelled). It is never lost silently:
//! the stream's next `recv` fails once with an error that says how many bytes
//! were lost. Do not drop a pending `recv` on a stream you keep using: keep the
//! future and poll it again, or use [`TcpStream::recv_multishot`], whose data
//! waits in its buffers.
//!
//! # Examples
//!
//! ```
//! use mailring::net::{TcpListener, TcpStream};
//! let rt = mailring::Runtime::builder().shards(1).build()?;
//! let echoed = rt.block_on(async {
//!     let listener = TcpListener::bind("127.0.0.1:0".parse().unwrap())?;
//!     let addr = listener.local_addr();
//!     let server = mailring::spawn_local(async move {
//!         let (conn, _) = listener.accept().await?;
//!         let (n, buf) = conn.recv(Vec::with_capacity(64)).await;
//!         n?;
//!         conn.send_all(buf).await.0
//!     });
//!     let client = TcpStream::connect(addr).await?;
//!     client.send_all(b"ping".to_vec()).await.0?;
//!     let (n, buf) = client.recv(Vec::with_capacity(64)).await;
//!     n?;
//!     server.await.unwrap()?;
//!     Ok::<_, std::io::Error>(buf)
//! })?;
//! assert_eq!(echoed, b"ping");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::io;
use std::net::{Shutdown, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use io_uring::opcode;
use io_uring::types::Fd;
use socket2::{Domain, Protocol, SockAddr, SockRef, Socket, Type};

use crate::buf::{BufRing, IoBuf, IoBufMut, RecvBuf};
use std::task::Poll;

use crate::op::{submit_write, MultishotOp, Op, OpFile, ShardFd};

mod direct;
mod msg;
mod steer;
mod udp;
mod unix;

pub use self::direct::{DirectStream, DirectTicket};
pub use self::steer::{steer_by_source_port, steered_index};

pub use self::udp::{RecvDatagram, RecvFromMultishot, UdpSocket};

pub use self::unix::{UnixDatagram, UnixListener, UnixStream};

/// What a cancelled multishot accept's late results go to: connections the
/// kernel accepted after the op was dropped (a pause's cancel under way)
/// are kept for the next `accept()`, and the calls waiting are woken. The
/// op's resources hold it, with the listening socket.
struct AcceptResources {
    _listener: std::sync::Arc<OwnedFd>,
    kept: std::sync::Arc<Kept>,
}

/// Keeps the connection a dropped multishot `accept` produced (see
/// [`AcceptResources`]); closes it if the resources are not those.
fn keep_fd(res: i32, _flags: u32, resources: &dyn std::any::Any) {
    if res < 0 {
        return;
    }
    // SAFETY: `res` is a descriptor an accept created for us that no
    // poll handed out: a cleanup runs only on results nobody takes (an
    // abandoned op's CQEs, a finished op dropped unpolled, results still
    // queued when a multishot op is dropped), so nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(res) };
    if let Some(r) = resources.downcast_ref::<AcceptResources>() {
        r.kept.hold(fd);
        // The calls waiting are woken from a task of their own: a cleanup
        // runs inside the op table's borrow, and a waker may do anything.
        if crate::current_shard().is_some() {
            let kept = r.kept.clone();
            drop(crate::spawn_local(async move { kept.wake_all() }));
        }
    }
}

/// The accepting side of a listener: one multishot `IORING_OP_ACCEPT` kept
/// armed while the listener lives, re-armed when the kernel ends it.
///
/// Accepted connections queue in the op table until an `accept()` takes
/// them, so dropping a pending `accept()` future loses nothing. `pause`
/// cancels the multishot (keeping what it had accepted, and what it
/// accepts while the cancel is under way) so that the kernel stops
/// accepting until the next `accept()`.
#[derive(Debug, Default)]
pub(crate) struct Acceptor {
    op: std::sync::Mutex<Option<MultishotOp>>,
    kept: std::sync::Arc<Kept>,
    next_id: std::sync::atomic::AtomicU64,
}

/// An acceptor's connections taken from cancelled multishots, and the
/// `accept()` calls to wake when one comes.
#[derive(Debug, Default)]
struct Kept {
    /// Connections a paused multishot had accepted, served first.
    held: std::sync::Mutex<std::collections::VecDeque<OwnedFd>>,
    /// Pending `accept()` calls (an id each) and their wakers: a `pause`
    /// from another task drops the multishot they wait on, and wakes them
    /// to take what it held or arm a new one.
    waiting: std::sync::Mutex<Vec<(u64, std::task::Waker)>>,
}

impl Kept {
    /// Keeps `fd` for the next `accept()`.
    fn hold(&self, fd: OwnedFd) {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(fd);
    }

    fn pop(&self) -> Option<OwnedFd> {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
    }

    /// Wakes every `accept()` waiting (outside the lock).
    fn wake_all(&self) {
        let waiting: Vec<std::task::Waker> = self
            .waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(_, w)| w.clone())
            .collect();
        waiting.into_iter().for_each(std::task::Waker::wake);
    }
}

/// An `accept()`'s entry in [`Kept::waiting`], removed when the call
/// ends or is dropped.
struct AcceptWait<'a> {
    kept: &'a Kept,
    id: u64,
}

impl AcceptWait<'_> {
    fn register(&self, waker: &std::task::Waker) {
        let mut waiting = self.kept.waiting.lock().unwrap_or_else(|p| p.into_inner());
        match waiting.iter_mut().find(|(id, _)| *id == self.id) {
            Some((_, w)) => w.clone_from(waker),
            None => waiting.push((self.id, waker.clone())),
        }
    }
}

impl Drop for AcceptWait<'_> {
    fn drop(&mut self) {
        self.kept
            .waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(id, _)| *id != self.id);
    }
}

impl Acceptor {
    /// Cancels the armed multishot accept: new connections wait in the
    /// listen backlog until the next `accept()` arms it again. Connections
    /// it had already accepted, and those it accepts while the cancel is
    /// under way, are kept for that `accept()`.
    pub(crate) fn pause(&self) {
        let Some(op) = self.op.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return;
        };
        let mut held = self.kept.held.lock().unwrap_or_else(|p| p.into_inner());
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        while let Poll::Ready(Ok(Some((fd, _)))) = op.poll_next(&mut cx) {
            if fd >= 0 {
                // SAFETY: a successful accept returned a new descriptor that we now own.
                held.push_back(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
        drop(held);
        drop(op);
        // Pending accepts waited on the op just dropped, whose wakers went
        // with it: each looks again (at what was held, or arms anew).
        self.kept.wake_all();
    }

    pub(crate) async fn accept(&self, listener: &ShardFd) -> io::Result<OwnedFd> {
        listener.check()?;
        let wait = AcceptWait {
            kept: &self.kept,
            id: self
                .next_id
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        };
        std::future::poll_fn(|cx| {
            if let Some(fd) = self.kept.pop() {
                return Poll::Ready(Ok(fd));
            }
            wait.register(cx.waker());
            let mut op = self.op.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if op.is_none() {
                    let raw = listener.raw();
                    let entry = opcode::AcceptMulti::new(Fd(raw))
                        .flags(libc::SOCK_CLOEXEC)
                        .build();
                    let resources = AcceptResources {
                        _listener: listener.fd.clone(),
                        kept: self.kept.clone(),
                    };
                    // SAFETY: a multishot accept refers to no memory, only to the
                    // listening fd, which the op keeps open.
                    *op =
                        Some(unsafe { MultishotOp::submit(Box::new(resources), keep_fd, entry) }?);
                }
                match op.as_ref().expect("armed above").poll_next(cx) {
                    Poll::Ready(Ok(Some((fd, _)))) if fd >= 0 => {
                        // SAFETY: a successful accept returned a new descriptor that we now own.
                        return Poll::Ready(Ok(unsafe { OwnedFd::from_raw_fd(fd) }));
                    }
                    // A kernel before 5.19 takes the multishot flag for a bad
                    // argument: say so rather than a bare EINVAL.
                    Poll::Ready(Ok(Some((err, _)))) if err == -libc::EINVAL => {
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::InvalidInput,
                            "accept refused with EINVAL: the listener was shut down, or the \
                             kernel is older than 5.19 (no IORING_ACCEPT_MULTISHOT, which \
                             mailring's listeners use)",
                        )))
                    }
                    Poll::Ready(Ok(Some((err, _)))) => {
                        return Poll::Ready(Err(io::Error::from_raw_os_error(-err)))
                    }
                    // The kernel ended the multishot: arm a new one.
                    Poll::Ready(Ok(None)) => *op = None,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                }
            }
        })
        .await
    }
}

/// A TCP listening socket on the current shard.
#[derive(Debug)]
pub struct TcpListener {
    inner: ShardFd,
    local: SocketAddr,
    acceptor: Acceptor,
}

impl TcpListener {
    /// Binds and listens (backlog 1024, `SO_REUSEADDR`) on the current shard.
    ///
    /// # Errors
    ///
    /// The OS error (e.g. `AddrInUse`), or an error outside a mailring shard.
    pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
        Self::adopt(Socket::from(Self::bind_std(addr, false)?))
    }

    /// A bound, listening std socket (backlog 1024, `SO_REUSEADDR`, and
    /// `SO_REUSEPORT` when `reuse_port`), on no shard yet: what a server
    /// binds on its caller's thread (so errors come back there) before each
    /// shard adopts its socket with [`from_std`](Self::from_std); the
    /// members of a reuseport group each bind one.
    ///
    /// # Errors
    ///
    /// The OS error (e.g. `AddrInUse`).
    pub fn bind_std(addr: SocketAddr, reuse_port: bool) -> io::Result<std::net::TcpListener> {
        let socket = Socket::new(
            Domain::for_address(addr),
            Type::STREAM.cloexec(),
            Some(Protocol::TCP),
        )?;
        socket.set_reuse_address(true)?;
        if reuse_port {
            socket.set_reuse_port(true)?;
        }
        socket.bind(&addr.into())?;
        socket.listen(1024)?;
        Ok(socket.into())
    }

    /// Adopts a bound, listening std socket on the current shard.
    ///
    /// # Errors
    ///
    /// An error outside a mailring shard.
    pub fn from_std(listener: std::net::TcpListener) -> io::Result<TcpListener> {
        Self::adopt(Socket::from(listener))
    }

    fn adopt(socket: Socket) -> io::Result<TcpListener> {
        let local = socket
            .local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not an IP socket"))?;
        Ok(TcpListener {
            inner: ShardFd::adopt(OwnedFd::from(socket))?,
            local,
            acceptor: Acceptor::default(),
        })
    }

    /// The bound address (with the port the OS chose for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Stops accepting until the next [`accept`](Self::accept): the armed
    /// multishot accept is cancelled, so new connections wait in the
    /// kernel's listen backlog (bounded by it) instead of being accepted
    /// into descriptors nobody takes. Connections already accepted, and
    /// those the kernel accepts while the cancel is under way, are kept for
    /// the next `accept()`. What a server at its connection limit does.
    /// An `accept()` already waiting (another task's) counts as the next:
    /// it is woken, takes what was kept or arms the accept again.
    pub fn pause_accepting(&self) {
        self.acceptor.pause();
    }

    /// Accepts one connection. The listener keeps one multishot
    /// `IORING_OP_ACCEPT` armed; connections wait in its queue, so a dropped
    /// `accept()` future loses none. A connection its client reset before
    /// it was accepted is passed over (the kernel hands it over dead).
    ///
    /// # Errors
    ///
    /// The kernel's error (e.g. `EMFILE`), or the shard-ownership error.
    pub async fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        loop {
            let fd = self.acceptor.accept(&self.inner).await?;
            let peer = match SockRef::from(&fd).peer_addr() {
                Ok(peer) => peer,
                // Reset by its client before it was accepted (a health
                // check closing with `SO_LINGER` 0): the kernel still
                // hands it over, dead, with no peer to name. Nothing can
                // be read from it or sent on it: passed over.
                Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => continue,
                Err(e) => return Err(e),
            };
            let peer = peer.as_socket().ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidData, "accepted a non-IP peer")
            })?;
            return Ok((
                TcpStream {
                    core: StreamCore::new(ShardFd::adopt(fd)?),
                },
                peer,
            ));
        }
    }
}

impl AsRawFd for TcpListener {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.raw()
    }
}

/// A TCP connection on the current shard.
#[derive(Debug)]
pub struct TcpStream {
    core: StreamCore,
}

/// What a multishot receive over a [`BufRing`] keeps until its last CQE:
/// the socket, the ring, and for `recvmsg` the header the kernel reads.
pub(crate) struct RingKeep {
    /// Held so the descriptor outlives the receive.
    pub(crate) _fd: std::sync::Arc<OwnedFd>,
    pub(crate) ring: BufRing,
    /// Held so the header the kernel reads outlives the receive.
    pub(crate) _hdr: Option<Box<dyn std::any::Any + Send>>,
}

/// Gives a provided buffer back when a multishot receive's CQE arrives after
/// nobody waits for it any more.
fn recycle_buffer(res: i32, flags: u32, resources: &dyn std::any::Any) {
    if let (Some(bid), Some(keep)) = (
        io_uring::cqueue::buffer_select(flags),
        resources.downcast_ref::<RingKeep>(),
    ) {
        keep.ring.discard(bid, res.max(0) as usize, flags);
    }
}

/// One multishot receive kept armed over a [`BufRing`]: armed when needed
/// (again after the kernel ends it), each filled buffer handed out, and
/// given up after repeated `ENOBUFS` while buffers were provided. Shared by
/// the stream receive ([`RecvMultishot`]) and the datagram one
/// ([`RecvFromMultishot`]).
#[derive(Debug)]
pub(crate) struct RingReceive {
    ring: BufRing,
    op: Option<MultishotOp>,
    finished: bool,
    /// `ENOBUFS` completions in a row while the ring had buffers to give.
    empty_rearms: u8,
    /// The ring's tail when the kernel said it had no buffer left though
    /// some are not taken back yet: the receive waits until it moves.
    starved_at: Option<u16>,
    /// The ring's tail when the receive was last armed.
    armed_at: u16,
}

/// `ENOBUFS` completions in a row, with buffers provided, after which a
/// receive gives up: the kernel cannot use the ring's buffers.
const MAX_EMPTY_REARMS: u8 = 8;

/// The error of a buffer ring used on a shard that did not register it.
fn foreign_ring() -> io::Error {
    io::Error::other(
        "mailring: this BufRing is registered on another shard (group ids repeat \
         across shards); register a BufRing on the stream's shard and use that one",
    )
}

impl RingReceive {
    pub(crate) fn new(ring: &BufRing) -> Self {
        RingReceive {
            ring: ring.clone(),
            op: None,
            finished: false,
            empty_rearms: 0,
            starved_at: None,
            armed_at: 0,
        }
    }

    pub(crate) fn ring(&self) -> &BufRing {
        &self.ring
    }

    /// Whether the receive ended (the kernel's end, or an error that
    /// polling again would only repeat).
    pub(crate) fn is_finished(&self) -> bool {
        self.finished
    }

    /// Says `e` once and ends the receive: an error polling again would
    /// only repeat (a wrong shard, a ring it cannot use), which a loop
    /// that logs errors and goes on would otherwise spin on.
    pub(crate) fn end_with<T>(&mut self, e: io::Error) -> Poll<Option<io::Result<T>>> {
        self.finished = true;
        self.op = None;
        Poll::Ready(Some(Err(e)))
    }

    /// The next filled buffer; `None` once the kernel reports the end (a
    /// receive of 0). `arm` submits the multishot receive on this ring's
    /// group when none is armed.
    pub(crate) fn poll_next(
        &mut self,
        cx: &mut std::task::Context<'_>,
        mut arm: impl FnMut(&BufRing) -> io::Result<MultishotOp>,
    ) -> Poll<Option<io::Result<RecvBuf>>> {
        if self.finished {
            return Poll::Ready(None);
        }
        // The socket is on this shard; the ring must be too, or the receive
        // would name a group of this ring that is another shard's (or none).
        if !self.ring.on_owner() {
            return self.end_with(foreign_ring());
        }
        loop {
            if self.op.is_none() {
                // Out of buffers, or every one filled (some in completions
                // of other receives on this ring, not taken yet): until one
                // comes back (the tail moves), a receive would end at once.
                let starved = self.starved_at == Some(self.ring.tail());
                if self.ring.available() == 0 || starved {
                    self.ring.wait_for_buffer(cx.waker());
                    return Poll::Pending;
                }
                self.starved_at = None;
                self.armed_at = self.ring.tail();
                match arm(&self.ring) {
                    Ok(op) => self.op = Some(op),
                    Err(e) => return Poll::Ready(Some(Err(e))),
                }
            }
            let polled = self.op.as_ref().expect("armed above").poll_next(cx);
            match polled {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Some(Err(e))),
                // Ended by the kernel (ENOBUFS handled below, or after an error): re-arm.
                Poll::Ready(Ok(None)) => self.op = None,
                Poll::Ready(Ok(Some((res, flags)))) => {
                    let bid = io_uring::cqueue::buffer_select(flags);
                    if res > 0 {
                        let Some(bid) = bid else {
                            return Poll::Ready(Some(Err(io::Error::other(
                                "receive completed without a buffer",
                            ))));
                        };
                        self.empty_rearms = 0;
                        return Poll::Ready(Some(Ok(self.ring.take(bid, res as usize, flags))));
                    }
                    if let Some(bid) = bid {
                        self.ring.discard(bid, 0, flags);
                    }
                    if res == 0 {
                        self.finished = true;
                        return Poll::Ready(None);
                    }
                    if res == -libc::ENOBUFS {
                        // No data was lost: the kernel left it in the socket.
                        // With buffers provided, ENOBUFS again and again
                        // means the kernel cannot use them: an error, not
                        // an endless re-arm.
                        if self.ring.available() > 0 {
                            match self.ring.kernel_available() {
                                // The kernel has none left: the others are
                                // in completions not taken yet. Wait for
                                // one to come back.
                                Some(0) => {
                                    self.starved_at = Some(self.ring.tail());
                                    self.empty_rearms = 0;
                                    continue;
                                }
                                // It cannot say (before Linux 6.8): it had
                                // none at some point since the receive was
                                // armed. Armed again at once if one came
                                // back since, else when one does. A ring
                                // the kernel cannot use then waits (no
                                // buffer comes back) rather than end a
                                // receive only starved by another on the
                                // same ring.
                                None => {
                                    self.starved_at = Some(self.armed_at);
                                    self.empty_rearms = 0;
                                    continue;
                                }
                                Some(_) => {}
                            }
                            self.empty_rearms += 1;
                            if self.empty_rearms >= MAX_EMPTY_REARMS {
                                self.finished = true;
                                return Poll::Ready(Some(Err(io::Error::other(
                                    "mailring: the kernel found no buffer in this BufRing's group \
                                     although buffers were provided",
                                ))));
                            }
                        }
                        continue;
                    }
                    return Poll::Ready(Some(Err(io::Error::from_raw_os_error(-res))));
                }
            }
        }
    }
}

/// A stream of received buffers from one multishot `IORING_OP_RECV` with
/// buffers picked from a [`BufRing`]; see [`TcpStream::recv_multishot`].
///
/// The receive stays armed between calls to [`next`](Self::next), so data
/// keeps arriving into the ring's buffers; dropping the stream cancels it and
/// gives every buffer it still held back to the ring, discarding data that had
/// arrived in them but was not taken (keep the stream while the connection is
/// in use). When the ring runs out
/// of buffers the kernel ends the receive (`ENOBUFS`) without losing data; it
/// is re-armed as soon as a buffer comes back.
#[derive(Debug)]
pub struct RecvMultishot<'a> {
    stream: &'a StreamCore,
    receive: RingReceive,
}

impl<'a> RecvMultishot<'a> {
    pub(crate) fn new(stream: &'a StreamCore, ring: &BufRing) -> Self {
        stream.recv_at_once.multishot_armed();
        RecvMultishot {
            stream,
            receive: RingReceive::new(ring),
        }
    }

    /// The next buffer of data; `None` once the peer closed its side, or
    /// after an error that polling again would repeat.
    ///
    /// # Errors
    ///
    /// The kernel's error, or bytes a dropped `recv` took (said once, then
    /// the data goes on); and, ending the receive, the shard-ownership
    /// error or a ring of another shard.
    pub async fn next(&mut self) -> Option<io::Result<RecvBuf>> {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }

    fn poll_next(&mut self, cx: &mut std::task::Context<'_>) -> Poll<Option<io::Result<RecvBuf>>> {
        if self.receive.is_finished() {
            return Poll::Ready(None);
        }
        // Off the socket's shard: an error polling again would repeat.
        if let Err(e) = self.stream.inner.check() {
            return self.receive.end_with(e);
        }
        // Bytes a dropped `recv` took: said once, then the data goes on.
        if let Err(e) = self.stream.check_lost() {
            return Poll::Ready(Some(Err(e)));
        }
        let stream = self.stream;
        self.receive.poll_next(cx, |ring| {
            let raw = stream.inner.raw();
            let entry = opcode::RecvMulti::new(Fd(raw), ring.group()).build();
            let keep: Box<dyn std::any::Any + Send> = Box::new(RingKeep {
                _fd: stream.inner.fd.clone(),
                ring: ring.clone(),
                _hdr: None,
            });
            // SAFETY: a multishot receive writes only into buffers of the
            // group it names, which is this ring's: the ring is registered
            // on this shard (`RingReceive::poll_next` checked `on_owner`),
            // so the group id names it and not another shard's ring. `keep`
            // holds the ring (with the fd) until the op's last CQE
            // (`MultishotOp::submit`).
            unsafe { MultishotOp::submit(keep, recycle_buffer, entry) }
        })
    }
}

/// The error (inside an [`io::Error`] of kind `Other`) a stream's receive
/// reports once when `recv`s whose futures were dropped had taken bytes
/// off the socket: they are gone, and the stream's data is no longer
/// contiguous. A framed protocol over the stream is out of step from
/// there on. Find it with `error.get_ref().and_then(|e|
/// e.downcast_ref::<LostBytes>())`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "{bytes} bytes received by a dropped recv were lost; the stream's data is no longer contiguous"
)]
pub struct LostBytes {
    /// How many.
    pub bytes: usize,
}

impl LostBytes {
    /// Whether `error` is this error (reported by a stream's receive).
    pub fn is(error: &io::Error) -> bool {
        error
            .get_ref()
            .is_some_and(|e| e.downcast_ref::<LostBytes>().is_some())
    }
}

/// What every connected stream socket does on the ring, named by a
/// descriptor ([`ShardFd`]) or a direct-descriptor slot.
#[derive(Debug)]
pub(crate) struct StreamCore<F: OpFile = ShardFd> {
    pub(crate) inner: F,
    /// Its operations on the ring, and bytes dropped `recv`s took.
    book: std::sync::Arc<OpBook>,
    /// When a send may go out at once (see [`SendAtOnce`]).
    at_once: SendAtOnce,
    /// When a receive may be taken at once (see [`RecvAtOnce`]).
    recv_at_once: RecvAtOnce,
}

/// What a stream socket's operations on the ring share with the stream,
/// behind an `Arc` that each of them holds until its CQE: how many of each
/// kind are in flight, and the bytes dropped `recv`s took.
#[derive(Debug, Default)]
struct OpBook {
    /// Bytes received by `recv`s whose futures were dropped after the kernel
    /// had filled their buffers; reported by the next `recv`.
    lost: std::sync::atomic::AtomicUsize,
    reads: std::sync::atomic::AtomicU32,
    writes: std::sync::atomic::AtomicU32,
}

impl OpBook {
    fn reads_on_ring(&self) -> bool {
        self.reads.load(std::sync::atomic::Ordering::Relaxed) > 0
    }

    fn writes_on_ring(&self) -> bool {
        self.writes.load(std::sync::atomic::Ordering::Relaxed) > 0
    }
}

/// One operation of a stream socket on the ring (a write, or a receive),
/// counted in its [`OpBook`] from submission until this is dropped. It
/// travels in the operation's resources, so it is dropped when the future
/// takes the result or, for a future dropped first, when the op table drops
/// the abandoned operation's resources at its CQE: while the kernel may
/// still use the socket for it, and no longer. (An operation whose future
/// was moved to another thread by hand and dropped there is leaked with its
/// resources and stays counted: the socket then always takes the ring for
/// that kind, and its `try_send`, or `try_recv` and `try_peek`, say
/// `WouldBlock` for good.)
///
/// Counted on the socket's shard (after `check`), uncounted wherever the
/// operation's resources are dropped: atomic adds, so no count is lost to
/// a race (each drop follows its count, so it never goes below 0).
#[derive(Debug)]
struct OnRing {
    book: std::sync::Arc<OpBook>,
    write: bool,
}

impl OnRing {
    fn counter(&self) -> &std::sync::atomic::AtomicU32 {
        if self.write {
            &self.book.writes
        } else {
            &self.book.reads
        }
    }

    fn read(book: &std::sync::Arc<OpBook>) -> OnRing {
        Self::count(book, false)
    }

    fn write(book: &std::sync::Arc<OpBook>) -> OnRing {
        Self::count(book, true)
    }

    fn count(book: &std::sync::Arc<OpBook>, write: bool) -> OnRing {
        let op = OnRing {
            book: book.clone(),
            write,
        };
        op.counter()
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        op
    }
}

impl Drop for OnRing {
    fn drop(&mut self) {
        self.counter()
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// When [`StreamCore::send_all`] (and `try_send`) may send with a plain
/// non-blocking `send` before, or instead of, an operation on the ring: only
/// while no write of this socket is on the ring (bytes sent at once would
/// overtake it), and not after a send found the socket's buffer full, until
/// a write on the ring completes (the ring's send waits for room; trying
/// again at once would be a wasted call).
#[derive(Debug, Default)]
struct SendAtOnce {
    full: std::sync::atomic::AtomicBool,
}

impl SendAtOnce {
    fn allowed(&self, book: &OpBook) -> bool {
        !book.writes_on_ring() && !self.full.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn set_full(&self, full: bool) {
        self.full.store(full, std::sync::atomic::Ordering::Relaxed);
    }
}

/// When [`StreamCore::recv`] may take bytes with a plain non-blocking
/// `recv` instead of an operation on the ring: when bytes are known to be
/// queued (the kernel flagged the last receive on the ring
/// `IORING_CQE_F_SOCK_NONEMPTY`, or the last one taken at once filled its
/// whole buffer), while no receive of this socket is on the ring, and never
/// once a multishot receive was armed on it. A receive that finds nothing
/// (`WouldBlock`) or less than its buffer ends it: a request/response peer,
/// whose bytes are not there yet when asked for, pays no wasted call, even
/// when each read takes exactly one frame.
#[derive(Debug, Default)]
struct RecvAtOnce {
    more_queued: std::sync::atomic::AtomicBool,
    /// A multishot receive was armed on the socket: its bytes arrive
    /// through the ring from then on (one dropped may still take some until
    /// its cancellation lands).
    multishot: std::sync::atomic::AtomicBool,
}

impl RecvAtOnce {
    fn allowed(&self, book: &OpBook) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        !book.reads_on_ring() && self.more_queued.load(Relaxed) && !self.multishot.load(Relaxed)
    }

    fn set_more_queued(&self, more: bool) {
        self.more_queued
            .store(more, std::sync::atomic::Ordering::Relaxed);
    }

    /// Ends receives taken at once for good (a multishot receive).
    fn multishot_armed(&self) {
        self.multishot
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.set_more_queued(false);
    }
}

/// Records data an abandoned `recv` received (its buffer is gone with it).
fn note_lost_recv<B: 'static, K: 'static>(res: i32, _flags: u32, resources: &dyn std::any::Any) {
    type Resources<B, K> = Option<(B, K, OnRing)>;
    if res > 0 {
        if let Some(Some((_, _, read))) = resources.downcast_ref::<Resources<B, K>>() {
            read.book
                .lost
                .fetch_add(res as usize, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl StreamCore {
    /// The descriptor, unless an abandoned operation still uses it (then
    /// the core comes back unchanged).
    pub(crate) fn into_owned(self) -> Result<OwnedFd, StreamCore> {
        // Bytes a dropped `recv` took are the stream's next `recv`'s to
        // report: the descriptor does not go without them. Looked at once
        // no abandoned operation holds the descriptor (an abandoned
        // receive notes its bytes before it lets go, maybe on the shard
        // while this runs elsewhere).
        let StreamCore {
            inner,
            book,
            at_once,
            recv_at_once,
        } = self;
        let no_loss = || book.lost.load(std::sync::atomic::Ordering::Relaxed) == 0;
        inner.into_owned_if(no_loss).map_err(|inner| StreamCore {
            inner,
            book,
            at_once,
            recv_at_once,
        })
    }
}

impl<F: OpFile<Raw = RawFd>> StreamCore<F> {
    pub(crate) fn new(inner: F) -> StreamCore<F> {
        StreamCore {
            inner,
            book: Default::default(),
            at_once: SendAtOnce::default(),
            recv_at_once: RecvAtOnce::default(),
        }
    }

    /// Counts this socket's operations, and bytes its dropped `recv`s
    /// took, with those of `other`, the same socket in another form (a
    /// direct slot made a descriptor, or moved to another ring): what
    /// `other` abandoned still in flight keeps counting here.
    pub(crate) fn share_book_of<G: OpFile<Raw = RawFd>>(&mut self, other: &StreamCore<G>) {
        self.book = other.book.clone();
    }

    pub(crate) async fn send_from<B: IoBuf>(&self, buf: B, from: usize) -> (io::Result<usize>, B) {
        // Off the socket's shard the counts are not touched (see `SendAtOnce`).
        if let Err(e) = self.inner.check() {
            return (Err(e), buf);
        }
        let write = OnRing::write(&self.book);
        // SAFETY: a send reads at most `len` bytes at `ptr`.
        let out = unsafe {
            submit_write(&self.inner, buf, from, false, write, |fd, ptr, len| {
                opcode::Send::new(Fd(fd), ptr, len)
                    .flags(libc::MSG_NOSIGNAL)
                    .build()
            })
            .await
        };
        // A write completed: the socket had room again.
        self.at_once.set_full(false);
        out
    }

    /// A non-blocking `send` of what the socket takes of `buf` now; marks
    /// its buffer full when it took less (or nothing). `None` for a socket
    /// without a process descriptor (a direct one).
    fn send_now(&self, buf: &[u8]) -> Option<io::Result<usize>> {
        let res = self.inner.send_now(buf)?;
        match &res {
            Ok(n) if *n < buf.len() => self.at_once.set_full(true),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.at_once.set_full(true),
            _ => {}
        }
        Some(res)
    }

    /// The streams' `try_peek`: a non-blocking look at the queued bytes on
    /// the socket's shard, `WouldBlock` while a receive of the socket is on
    /// the ring or a multishot receive was armed (the bytes may be on their
    /// way to it).
    pub(crate) fn try_peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        use std::sync::atomic::Ordering::Relaxed;
        self.inner.check()?;
        if self.book.reads_on_ring() || self.recv_at_once.multishot.load(Relaxed) {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.inner
            .peek_now(buf)
            .unwrap_or_else(|| Err(io::ErrorKind::Unsupported.into()))
    }

    /// The streams' `try_recv`: a non-blocking receive on the socket's
    /// shard, `WouldBlock` while a receive of the socket is on the ring or
    /// a multishot receive was armed (the bytes would overtake theirs);
    /// bytes a dropped `recv` took are reported first, as by `recv`.
    pub(crate) fn try_recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        use std::sync::atomic::Ordering::Relaxed;
        self.inner.check()?;
        self.check_lost()?;
        if self.book.reads_on_ring() || self.recv_at_once.multishot.load(Relaxed) {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.inner
            .recv_now(crate::op::initialised_as_spare(buf))
            .unwrap_or_else(|| Err(io::ErrorKind::Unsupported.into()))
    }

    /// The streams' `try_send`: a non-blocking send on the socket's shard,
    /// `WouldBlock` while a write of the socket is on the ring (the bytes
    /// would overtake it).
    pub(crate) fn try_send(&self, buf: &[u8]) -> io::Result<usize> {
        self.inner.check()?;
        if self.book.writes_on_ring() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.send_now(buf)
            .unwrap_or_else(|| Err(io::ErrorKind::Unsupported.into()))
    }

    pub(crate) async fn send_zc_from<B: IoBuf>(
        &self,
        buf: B,
        from: usize,
    ) -> (io::Result<usize>, B) {
        // Off the socket's shard the counts are not touched (see `SendAtOnce`).
        if let Err(e) = self.inner.check() {
            return (Err(e), buf);
        }
        let write = OnRing::write(&self.book);
        // SAFETY: a zero-copy send reads at most `len` bytes at `ptr`; the op
        // table keeps the buffer until the kernel's notification CQE.
        let out = unsafe {
            submit_write(&self.inner, buf, from, false, write, |fd, ptr, len| {
                opcode::SendZc::new(Fd(fd), ptr, len)
                    .flags(libc::MSG_NOSIGNAL)
                    .build()
            })
            .await
        };
        // A write completed: the socket had room again.
        self.at_once.set_full(false);
        out
    }

    /// Sends all of `buf`'s bytes, continuing after short sends.
    ///
    /// # Errors
    ///
    /// The kernel's error (e.g. `BrokenPipe`); `WriteZero` if nothing is accepted.
    pub(crate) async fn send_all<B: IoBuf>(&self, buf: B) -> (io::Result<()>, B) {
        self.send_all_with(buf, false).await
    }

    /// Sends every initialised byte, continuing after short sends, with
    /// copying sends or zero-copy ones.
    pub(crate) async fn send_all_with<B: IoBuf>(
        &self,
        mut buf: B,
        zero_copy: bool,
    ) -> (io::Result<()>, B) {
        let total = buf.bytes_init();
        let mut done = 0;
        // First what the socket takes at once, with no operation to submit
        // and complete and no wait (a copying send only, within the shard's
        // allowance for this tick, see `take_immediate_io`).
        if !zero_copy
            && !F::FIXED
            && total > 0
            && self.at_once.allowed(&self.book)
            && crate::shard::take_immediate_io()
        {
            if let Err(e) = self.inner.check() {
                return (Err(e), buf);
            }
            // SAFETY: `bytes_init` bytes at `stable_ptr` are initialised
            // and stay put while `buf` is borrowed here.
            let bytes = unsafe { std::slice::from_raw_parts(buf.stable_ptr(), total) };
            loop {
                match self.send_now(bytes) {
                    // All of it, or as much as fits (the rest: the ring).
                    Some(Ok(n)) => {
                        done = n;
                        break;
                    }
                    Some(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                    Some(Err(e)) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Some(Err(e)) => return (Err(e), buf),
                    None => break,
                }
            }
        }
        while done < total {
            let (res, back) = if zero_copy {
                self.send_zc_from(buf, done).await
            } else {
                self.send_from(buf, done).await
            };
            buf = back;
            match res {
                Ok(0) => {
                    return (
                        Err(io::Error::new(io::ErrorKind::WriteZero, "send returned 0")),
                        buf,
                    )
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return (Err(e), buf),
            }
        }
        (Ok(()), buf)
    }

    /// Receives into `buf` (from its start, up to its capacity); 0 means the
    /// peer closed its side. See the module docs on dropping a pending `recv`.
    /// Errors once if an earlier, dropped `recv` took data (see the module docs).
    /// Bytes dropped `recv`s took that no `recv` has reported yet.
    pub(crate) fn unreported_loss(&self) -> usize {
        self.book.lost.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn check_lost(&self) -> io::Result<()> {
        match self.book.lost.swap(0, std::sync::atomic::Ordering::Relaxed) {
            0 => Ok(()),
            n => Err(io::Error::other(LostBytes { bytes: n })),
        }
    }

    pub(crate) async fn recv<B: IoBufMut>(&self, mut buf: B) -> (io::Result<usize>, B) {
        if let Err(e) = self.inner.check().and_then(|()| self.check_lost()) {
            return (Err(e), buf);
        }
        let len = buf.bytes_total().min(u32::MAX as usize) as u32;
        // Bytes likely queued (the last receive filled its buffer): take
        // them at once, with no operation to submit and complete.
        if !F::FIXED
            && len > 0
            && self.recv_at_once.allowed(&self.book)
            && crate::shard::take_immediate_io()
        {
            let ptr = buf.stable_mut_ptr();
            // SAFETY: `ptr` names `len` writable bytes (`IoBufMut`
            // contract) that nothing else uses while `buf` is borrowed here;
            // the kernel writes at most `len` of them.
            let spare = unsafe {
                std::slice::from_raw_parts_mut(
                    ptr.cast::<std::mem::MaybeUninit<u8>>(),
                    len as usize,
                )
            };
            if let Some(res) = self.inner.recv_now(spare) {
                // A full buffer leaves more likely queued.
                self.recv_at_once
                    .set_more_queued(matches!(res, Ok(n) if n == len as usize));
                match res {
                    Ok(n) => {
                        // SAFETY: the kernel wrote `n <= len` bytes at the
                        // buffer's start.
                        unsafe { buf.set_init(n) };
                        return (Ok(n), buf);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return (Err(e), buf),
                }
            }
        }
        let keep = self.inner.keep();
        let raw = self.inner.raw();
        // Uncounted when the op's resources go: below, or at the CQE of a
        // receive whose future was dropped.
        let read = OnRing::read(&self.book);
        // SAFETY: the recv writes at most `len` bytes into the buffer's heap memory
        // (stable, `IoBufMut` contract) and uses the socket kept by `keep`; both
        // stay in the op until its CQE.
        let op = unsafe {
            Op::submit(
                (buf, keep, read),
                Some(note_lost_recv::<B, F::Keep>),
                |(b, _, _)| F::finish(opcode::Recv::new(Fd(raw), b.stable_mut_ptr(), len).build()),
            )
        };
        let op = op.expect("checked to be on the socket's shard");
        let (res, (mut buf, _, _)) = op.await;
        // The kernel says whether bytes were left queued after this
        // receive (`IORING_CQE_F_SOCK_NONEMPTY`; never said by a kernel
        // that does not report it, which then takes nothing at once).
        self.recv_at_once.set_more_queued(
            matches!(res, Ok((_, flags)) if io_uring::cqueue::sock_nonempty(flags)),
        );
        let res = res.map(|(n, _)| n as usize);
        match res {
            Ok(n) => {
                // SAFETY: the kernel wrote `n <= len` bytes at the buffer's start.
                unsafe { buf.set_init(n) };
                (Ok(n), buf)
            }
            Err(e) => (Err(e), buf),
        }
    }

    /// Shuts down one or both directions (`IORING_OP_SHUTDOWN`).
    ///
    /// # Errors
    ///
    /// The kernel's error (e.g. `NotConnected`).
    /// Completes once the peer has closed its side, or the socket failed:
    /// a poll on the ring for `POLLRDHUP` (with `POLLHUP` and `POLLERR`,
    /// which the kernel always reports), which takes no byte. Dropped, it is
    /// cancelled, and nothing is lost.
    pub(crate) async fn peer_close(&self) -> io::Result<()> {
        self.inner.check()?;
        let keep = self.inner.keep();
        let raw = self.inner.raw();
        let mask = libc::POLLRDHUP as u32;
        // SAFETY: a poll uses only the socket, kept by `keep`.
        let op = unsafe {
            Op::submit(keep, None, |_| {
                F::finish(opcode::PollAdd::new(Fd(raw), mask).build())
            })
        }?;
        op.await.0.map(drop)
    }

    pub(crate) async fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.inner.check()?;
        let how = match how {
            Shutdown::Read => libc::SHUT_RD,
            Shutdown::Write => libc::SHUT_WR,
            Shutdown::Both => libc::SHUT_RDWR,
        };
        let keep = self.inner.keep();
        let raw = self.inner.raw();
        // SAFETY: a shutdown uses only the socket, kept by `keep`.
        let op = unsafe {
            Op::submit(keep, None, |_| {
                F::finish(opcode::Shutdown::new(Fd(raw), how).build())
            })
        }?;
        op.await.0.map(drop)
    }
}

impl TcpStream {
    /// Connects with `IORING_OP_CONNECT`.
    ///
    /// # Errors
    ///
    /// The kernel's error (e.g. `ConnectionRefused`), or an error outside a mailring shard.
    pub async fn connect(addr: SocketAddr) -> io::Result<TcpStream> {
        let socket = Socket::new(
            Domain::for_address(addr),
            Type::STREAM.cloexec(),
            Some(Protocol::TCP),
        )?;
        Self::connect_socket(socket, addr).await
    }

    async fn connect_socket(socket: Socket, addr: SocketAddr) -> io::Result<TcpStream> {
        let inner = ShardFd::adopt(OwnedFd::from(socket))?;
        let keep = inner.fd.clone();
        let raw = inner.raw();
        let target = Box::new(SockAddr::from(addr));
        // SAFETY: the SQE reads the address from the box (heap, owned by the op
        // until its CQE) and uses the socket kept by `keep`.
        let op = unsafe {
            Op::submit((target, keep), None, |(t, _)| {
                opcode::Connect::new(Fd(raw), t.as_ptr().cast(), t.len()).build()
            })
        }?;
        op.await
            .0
            .map_err(|e| io::Error::new(e.kind(), format!("connect {addr}: {e}")))?;
        Ok(TcpStream {
            core: StreamCore::new(inner),
        })
    }

    /// Connects from `local` (a chosen source address and port) with
    /// `IORING_OP_CONNECT`: what a client uses to pick the socket of a
    /// server's reuseport group steered by [`steer_by_source_port`].
    ///
    /// # Errors
    ///
    /// The bind's error (`AddrInUse` when the port is taken), the kernel's
    /// connect error, or an error outside a mailring shard.
    pub async fn connect_from(local: SocketAddr, addr: SocketAddr) -> io::Result<TcpStream> {
        let socket = Socket::new(
            Domain::for_address(addr),
            Type::STREAM.cloexec(),
            Some(Protocol::TCP),
        )?;
        socket.bind(&local.into())?;
        Self::connect_socket(socket, addr).await
    }

    /// Adopts a connected std stream on the current shard.
    ///
    /// # Errors
    ///
    /// An error outside a mailring shard.
    pub fn from_std(stream: std::net::TcpStream) -> io::Result<TcpStream> {
        Ok(TcpStream {
            core: StreamCore::new(ShardFd::adopt(OwnedFd::from(stream))?),
        })
    }

    /// Turns the stream back into a std stream, e.g. to move it to another
    /// shard (`TcpStream::from_std` there).
    ///
    /// # Errors
    ///
    /// Gives the stream back while an abandoned operation still uses it,
    /// or while bytes a dropped `recv` took are not reported yet (its next
    /// `recv` reports them).
    pub fn into_std(self) -> Result<std::net::TcpStream, TcpStream> {
        self.core
            .into_owned()
            .map(std::net::TcpStream::from)
            .map_err(|core| TcpStream { core })
    }

    /// Connects to `host:port`, resolving the name on the blocking pool and
    /// trying each address in turn.
    ///
    /// # Errors
    ///
    /// The resolver's error, or the last connection error.
    pub async fn connect_host(host_and_port: &str) -> io::Result<TcpStream> {
        let name = host_and_port.to_owned();
        let addrs: Vec<SocketAddr> = crate::Handle::try_current()
            .ok_or_else(crate::op::wrong_shard)?
            .spawn_blocking(move || {
                std::net::ToSocketAddrs::to_socket_addrs(&name).map(Iterator::collect)
            })
            .await
            .map_err(|e| io::Error::other(format!("name resolution failed: {e}")))??;
        let mut last = io::Error::new(
            io::ErrorKind::NotFound,
            format!("{host_and_port} resolved to no address"),
        );
        for addr in addrs {
            match TcpStream::connect(addr).await {
                Ok(s) => return Ok(s),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Sends some of `buf`'s bytes; returns how many (a short send is returned as such).
    pub async fn send<B: IoBuf>(&self, buf: B) -> (io::Result<usize>, B) {
        self.core.send_from(buf, 0).await
    }

    /// Sends all of `buf`'s bytes, continuing after short sends.
    ///
    /// # Errors
    ///
    /// The kernel's error (e.g. `BrokenPipe`); `WriteZero` if nothing is accepted.
    pub async fn send_all<B: IoBuf>(&self, buf: B) -> (io::Result<()>, B) {
        self.core.send_all(buf).await
    }

    /// Sends what of `buf` the socket takes at once, with a plain
    /// non-blocking `send` (`MSG_DONTWAIT`) rather than an operation on the
    /// ring: the number of bytes taken (maybe fewer than `buf` holds), or
    /// `WouldBlock` when the send buffer has no room. A reply to a peer
    /// that is reading goes out this way with no operation to submit and
    /// complete, and no wake-up of the task when it completes; what is left
    /// goes through [`send_all`](Self::send_all). While a send of this
    /// socket is on the ring (also one whose future was dropped, until its
    /// completion comes) it says `WouldBlock` and sends nothing: the bytes
    /// would overtake it.
    ///
    /// # Errors
    ///
    /// `WouldBlock` as above; the wrong-shard error off the socket's shard;
    /// the OS error (e.g. `BrokenPipe`).
    pub fn try_send(&self, buf: &[u8]) -> io::Result<usize> {
        self.core.try_send(buf)
    }

    /// Copies into `buf` the bytes queued on the socket without taking
    /// them, with a plain non-blocking `recv(MSG_PEEK)`: how many, `Ok(0)`
    /// when the peer closed its side (nothing queued before the end), or
    /// `WouldBlock` when nothing is queued. A pool checks this way that an
    /// idle connection is still open and was sent nothing unasked. While a
    /// receive of this socket is on the ring (also one whose future was
    /// dropped, until its completion comes), or once a multishot receive was
    /// armed on it, it says `WouldBlock`: the bytes may be that receive's.
    ///
    /// # Errors
    ///
    /// `WouldBlock` as above; the wrong-shard error off the socket's shard;
    /// the OS error (e.g. `ConnectionReset`).
    pub fn try_peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.core.try_peek(buf)
    }

    /// Takes into `buf` the bytes queued on the socket now, with a plain
    /// non-blocking `recv`: how many, `Ok(0)` at the peer's end, or
    /// `WouldBlock` when nothing is queued. While a receive of this socket
    /// is on the ring (or a multishot receive was armed on it) it says
    /// `WouldBlock` without looking: bytes taken here would overtake that
    /// receive's. What a TLS layer over a pooled connection reads to see
    /// whether records that came unasked hold data.
    ///
    /// # Errors
    ///
    /// `WouldBlock` as above; the bytes a dropped `recv` took, as
    /// [`recv`](Self::recv) reports them; the wrong-shard error off the
    /// socket's shard; the OS error (e.g. `ConnectionReset`).
    pub fn try_recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.core.try_recv(buf)
    }

    /// Whether the peer has closed its side: the kernel's TCP state is
    /// `CLOSE_WAIT` or past it (read from `TCP_INFO`). Unlike a peek it
    /// sees the end behind bytes still queued before it (a TLS peer's
    /// `close_notify`, say).
    ///
    /// # Errors
    ///
    /// The OS error of `getsockopt`.
    pub fn peer_closed(&self) -> io::Result<bool> {
        // The kernel's TCP states (include/net/tcp_states.h).
        const TCP_CLOSE: u8 = 7;
        const TCP_CLOSE_WAIT: u8 = 8;
        const TCP_LAST_ACK: u8 = 9;
        let mut state = 0u8;
        let mut len = 1 as libc::socklen_t;
        // SAFETY: `getsockopt` writes at most `len` (1) bytes at the
        // pointer to `state`, which lives across the call, and the first
        // byte of `struct tcp_info` is `tcpi_state` (the kernel copies the
        // first `len` bytes of it); the descriptor is this stream's own.
        let rc = unsafe {
            libc::getsockopt(
                self.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                std::ptr::from_mut(&mut state).cast(),
                &mut len,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(matches!(state, TCP_CLOSE | TCP_CLOSE_WAIT | TCP_LAST_ACK))
    }

    /// Sends some of `buf`'s bytes with `IORING_OP_SEND_ZC`: the kernel sends
    /// from the buffer itself instead of copying it, and the buffer comes back
    /// only once the kernel has released it (its notification CQE). Pays off
    /// for large buffers; see the `net_send_zc` benchmark.
    ///
    /// # Errors
    ///
    /// The kernel's error; `Unsupported` (EINVAL) on kernels without `SEND_ZC`.
    pub async fn send_zc<B: IoBuf>(&self, buf: B) -> (io::Result<usize>, B) {
        self.core.send_zc_from(buf, 0).await
    }

    /// Sends all of `buf`'s bytes with zero-copy sends; see [`send_zc`](Self::send_zc).
    ///
    /// # Errors
    ///
    /// As [`send_all`](Self::send_all).
    pub async fn send_all_zc<B: IoBuf>(&self, buf: B) -> (io::Result<()>, B) {
        self.core.send_all_with(buf, true).await
    }

    /// Receives into `buf` (from its start, up to its capacity); 0 means the
    /// peer closed its side. See the module docs on dropping a pending `recv`.
    pub async fn recv<B: IoBufMut>(&self, buf: B) -> (io::Result<usize>, B) {
        self.core.recv(buf).await
    }

    /// Starts a multishot receive into buffers of `ring` (an opt-in mode for
    /// servers with many connections: one armed receive per connection, memory
    /// shared through the ring).
    pub fn recv_multishot(&self, ring: &BufRing) -> RecvMultishot<'_> {
        RecvMultishot::new(&self.core, ring)
    }

    /// Shuts down one or both directions (`IORING_OP_SHUTDOWN`).
    ///
    /// # Errors
    ///
    /// The kernel's error (e.g. `NotConnected`).
    pub async fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.core.shutdown(how).await
    }

    /// Completes once the peer has closed its side (or the connection
    /// failed), without taking a byte: a poll for `POLLRDHUP` on the ring.
    /// A server that stops reading a client (its requests held while one
    /// is answered) still learns this way that the client went away.
    /// Dropping the future cancels the poll; nothing is lost.
    ///
    /// # Errors
    ///
    /// The wrong-shard error off the stream's shard; the kernel's error.
    pub async fn peer_close(&self) -> io::Result<()> {
        self.core.peer_close().await
    }

    /// Sets `TCP_NODELAY`.
    ///
    /// # Errors
    ///
    /// The OS error.
    pub fn set_nodelay(&self, nodelay: bool) -> io::Result<()> {
        SockRef::from(&*self.core.inner.fd).set_tcp_nodelay(nodelay)
    }

    /// Whether `TCP_NODELAY` is set.
    ///
    /// # Errors
    ///
    /// The OS error.
    pub fn nodelay(&self) -> io::Result<bool> {
        SockRef::from(&*self.core.inner.fd).tcp_nodelay()
    }

    /// The remote address.
    ///
    /// # Errors
    ///
    /// The OS error.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        let addr = SockRef::from(&*self.core.inner.fd).peer_addr()?;
        addr.as_socket()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "not an IP socket"))
    }

    /// The local address.
    ///
    /// # Errors
    ///
    /// The OS error.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        let addr = SockRef::from(&*self.core.inner.fd).local_addr()?;
        addr.as_socket()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "not an IP socket"))
    }
}

impl AsRawFd for TcpStream {
    fn as_raw_fd(&self) -> RawFd {
        self.core.inner.raw()
    }
}
