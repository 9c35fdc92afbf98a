//! Adapters to the I/O traits the Rust ecosystem is written against: a
//! [`CompatStream`] (TCP, Unix or TLS, on its shard's ring) is
//! `tokio::io::AsyncRead + AsyncWrite` (feature `tokio-io`),
//! `futures::io::AsyncRead + AsyncWrite` (feature `futures-io`) and
//! `hyper::rt::Read + Write` (feature `hyper`, with [`ShardExecutor`] and
//! [`ShardTimer`]), so hyper, tokio-util codecs and the libraries on them
//! run on mailring shards.
//!
//! The ring takes owned buffers, the traits lend slices: a read receives
//! into the stream's own buffer and copies out of it; a write copies into
//! the stream's buffer and returns at once, the send going on behind it
//! (at most [`WRITE_BUFFER`] bytes queued: past that a write waits for the
//! send in flight). A flush waits until everything written is handed to a
//! send, not until the peer has made room for it: the send in flight plays
//! the part of the kernel's socket buffer behind a Tokio `TcpStream`, whose
//! flush returns at once; a send that the socket does not take at once goes
//! on in a task of the stream's shard, so it moves whether or not the
//! stream is polled again. A send that fails is reported by the next write,
//! flush or shutdown; a shutdown waits for every send; a stream dropped
//! with sends still to go finishes them in the background on its shard,
//! wherever it is dropped (for at most [`DROP_LINGER`]), so no byte a write
//! accepted is lost. The stream is `Send`
//! (hyper boxes upgraded connections as `Send`), but its I/O runs on its
//! shard: used from another thread, each operation fails with the
//! runtime's off-shard error.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll, Waker};

use bytes::{Buf, Bytes, BytesMut};
use mailring_actors::mailring::net::{TcpStream, UnixStream};
use mailring_actors::ShardId;

use crate::conn::Conn;
use crate::tls::{TlsAcceptor, TlsFailure, TlsInfo};

/// Bytes a receive asks for.
const READ_CHUNK: usize = 16 << 10;
/// Bytes a stream queues behind the send in flight before a write waits.
pub const WRITE_BUFFER: usize = 64 << 10;
/// How long a dropped stream goes on sending what its writes accepted.
pub const DROP_LINGER: std::time::Duration = std::time::Duration::from_secs(10);

type Receive = Pin<Box<dyn Future<Output = (io::Result<usize>, BytesMut)> + Send>>;
type Send_ = Pin<Box<dyn Future<Output = (io::Result<()>, Bytes)> + Send>>;
type Shutdown = Pin<Box<dyn Future<Output = io::Result<()>> + Send>>;

/// A connection on its shard's ring, behind the poll-based I/O traits of
/// Tokio, futures and hyper (see the [module](self) doc for which feature
/// brings which).
///
/// ```
/// # #[cfg(feature = "tokio-io")] {
/// use mailring_transports::compat::CompatStream;
/// use tokio::io::{AsyncReadExt, AsyncWriteExt};
///
/// let rt = mailring_actors::Runtime::builder().shards(1).build()?;
/// rt.block_on_local(|| async {
///     let (a, b) = mailring_actors::mailring::net::UnixStream::pair()?;
///     let (mut a, mut b) = (CompatStream::unix(a), CompatStream::unix(b));
///     a.write_all(b"ping").await?;
///     a.flush().await?;
///     let mut got = [0u8; 4];
///     b.read_exact(&mut got).await?;
///     assert_eq!(&got, b"ping");
///     Ok::<_, std::io::Error>(())
/// })?;
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct CompatStream {
    conn: Arc<Conn>,
    tls: Option<TlsInfo>,
    /// Received and not yet read.
    read_buf: BytesMut,
    receiving: Option<Receive>,
    read_eof: bool,
    /// Written and not yet handed to a send.
    write_buf: BytesMut,
    sending: Option<InFlight>,
    /// A send that failed, reported by the next write or flush.
    write_error: Option<io::Error>,
    shutting_down: Option<Shutdown>,
    /// The write side was shut down: nothing more is written.
    write_closed: bool,
    /// The shard the stream was made on, whose ring its sends run on.
    home: Option<ShardId>,
    /// That shard's runtime: a stream dropped elsewhere hands the sends
    /// it still owes back to its shard through it.
    runtime: Option<mailring_actors::mailring::Handle>,
}

impl fmt::Debug for CompatStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompatStream")
            .field("conn", &self.conn)
            .field("buffered_in", &self.read_buf.len())
            .field("buffered_out", &self.write_buf.len())
            .finish_non_exhaustive()
    }
}

impl CompatStream {
    pub(crate) fn new(conn: Conn) -> Self {
        let tls = conn.tls_info();
        CompatStream {
            conn: Arc::new(conn),
            tls,
            read_buf: BytesMut::new(),
            receiving: None,
            read_eof: false,
            write_buf: BytesMut::new(),
            sending: None,
            write_error: None,
            shutting_down: None,
            write_closed: false,
            home: mailring_actors::mailring::current_shard(),
            runtime: mailring_actors::mailring::Handle::try_current(),
        }
    }

    /// Adapts a TCP stream of the current shard.
    pub fn tcp(stream: TcpStream) -> Self {
        Self::new(Conn::Tcp(stream))
    }

    /// Adapts a Unix stream of the current shard.
    pub fn unix(stream: UnixStream) -> Self {
        Self::new(Conn::Unix(stream))
    }

    /// Connects over TCP (with `TCP_NODELAY`).
    ///
    /// # Errors
    ///
    /// The connect's error, or an error outside a shard.
    pub async fn connect(addr: SocketAddr) -> io::Result<Self> {
        let s = TcpStream::connect(addr).await?;
        s.set_nodelay(true)?;
        Ok(Self::tcp(s))
    }

    /// Connects over TCP and runs a TLS client handshake for `server_name`
    /// with `config` (set `alpn_protocols` on it for HTTP/2: `h2`).
    ///
    /// # Errors
    ///
    /// As [`crate::Framed::connect_tls`].
    pub async fn connect_tls(
        addr: SocketAddr,
        server_name: &str,
        config: Arc<rustls::ClientConfig>,
    ) -> io::Result<Self> {
        Ok(Self::new(
            crate::conn::connect_tls(addr, server_name, config).await?,
        ))
    }

    /// Runs the server side of a TLS handshake on an accepted TCP stream
    /// (within the acceptor's handshake timeout).
    ///
    /// # Errors
    ///
    /// The handshake's failure (its [`TlsFailure`] inside the error).
    pub async fn accept_tls(stream: TcpStream, acceptor: &TlsAcceptor) -> io::Result<Self> {
        let _ = stream.set_nodelay(true);
        match acceptor.accept(Conn::Tcp(stream), BytesMut::new()).await {
            Ok((tls, _)) => Ok(Self::new(Conn::Tls(Box::new(tls)))),
            Err(failure) => Err(io::Error::new(failure_kind(&failure), failure)),
        }
    }

    /// What the TLS handshake agreed on (ALPN: `h2` or `http/1.1`), for a
    /// TLS stream.
    pub fn tls_info(&self) -> Option<&TlsInfo> {
        self.tls.as_ref()
    }

    /// Makes sure there are received bytes to hand out, or the end.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // A send that ended is taken off, and what was queued behind it
        // handed to the next (a task that wrote, flushed and now waits for
        // the answer polls only here); a failure is kept for the next
        // write or flush. Only once it has ended: polled before, it would
        // take the wake-up of a writing task that waits for it (a stream
        // split into a reading and a writing task) for this one.
        if self.sending.as_ref().is_none_or(InFlight::may_have_ended)
            && self.poll_send(cx).is_ready()
        {
            self.start_send(cx);
        }
        loop {
            if !self.read_buf.is_empty() || self.read_eof {
                return Poll::Ready(Ok(()));
            }
            let op = self.receiving.get_or_insert_with(|| {
                let conn = self.conn.clone();
                let mut buf = std::mem::take(&mut self.read_buf);
                buf.clear();
                buf.reserve(READ_CHUNK);
                Box::pin(async move { conn.recv(buf).await })
            });
            let (res, buf) = ready!(op.as_mut().poll(cx));
            self.receiving = None;
            self.read_buf = buf;
            if res? == 0 {
                self.read_eof = true;
            }
        }
    }

    /// Hands up to `room` received bytes to `put`; nothing at the end.
    #[cfg_attr(not(any(feature = "tokio-io", feature = "hyper")), allow(dead_code))]
    fn poll_read_with(
        &mut self,
        cx: &mut Context<'_>,
        room: usize,
        put: impl FnOnce(&[u8]),
    ) -> Poll<io::Result<()>> {
        ready!(self.poll_fill(cx))?;
        let n = room.min(self.read_buf.len());
        put(&self.read_buf[..n]);
        self.read_buf.advance(n);
        Poll::Ready(Ok(()))
    }

    /// Copies received bytes into `out`; 0 at the end.
    #[cfg_attr(not(feature = "futures-io"), allow(dead_code))]
    fn poll_read_slice(&mut self, cx: &mut Context<'_>, out: &mut [u8]) -> Poll<io::Result<usize>> {
        ready!(self.poll_fill(cx))?;
        let n = out.len().min(self.read_buf.len());
        out[..n].copy_from_slice(&self.read_buf[..n]);
        self.read_buf.advance(n);
        Poll::Ready(Ok(n))
    }

    /// Moves the send in flight on; a failure is kept for the next write
    /// or flush.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(in_flight) = self.sending.as_mut() else {
            return Poll::Ready(());
        };
        let (res, _) = ready!(in_flight.op.as_mut().poll(cx));
        self.sending = None;
        if let Err(e) = res {
            self.write_error.get_or_insert(e);
        }
        Poll::Ready(())
    }

    /// Hands what is queued to a send, if none is in flight, and polls it
    /// once (which sends what the socket takes at once, or submits it). A
    /// send that does not end there goes on in a task of the stream's
    /// shard, so that it moves whatever this stream's task does next.
    fn start_send(&mut self, cx: &mut Context<'_>) {
        if self.sending.is_some() || self.write_buf.is_empty() {
            return;
        }
        let conn = self.conn.clone();
        let batch = self.write_buf.split().freeze();
        let mut op: Send_ = Box::pin(async move { conn.send_all(batch).await });
        match op.as_mut().poll(cx) {
            Poll::Ready((res, _)) => {
                if let Err(e) = res {
                    self.write_error.get_or_insert(e);
                }
            }
            Poll::Pending => self.sending = Some(self.on_its_own(op)),
        }
    }

    /// `op`, a send under way, moved to a task of the stream's shard: a
    /// send the kernel takes in part submits the rest from there, not at
    /// the stream's next poll (a task that flushes and then waits for
    /// something else would leave it half sent). The future returned
    /// waits for that task; dropped, it stops it (and so the send, as
    /// dropping the send itself would). Off the stream's shard the send
    /// stays as it is (its poll failed already with the off-shard error).
    fn on_its_own(&self, op: Send_) -> InFlight {
        if self.home.is_none() || mailring_actors::mailring::current_shard() != self.home {
            return InFlight { op, ended: None };
        }
        let ended = Arc::new(SendEnd::default());
        let mark = ended.clone();
        let conn = self.conn.clone();
        let task = StopOnDrop(mailring_actors::mailring::spawn_local(async move {
            let mut out = op.await;
            loop {
                // What was written behind it goes next, until nothing is
                // (or a send failed: the error is the writer's to hear).
                let (next, writer) = {
                    let mut behind = mark.behind();
                    let next = if out.0.is_err() || behind.bytes.is_empty() {
                        behind.closed = true;
                        None
                    } else {
                        Some(behind.bytes.split().freeze())
                    };
                    (next, behind.writer.take())
                };
                if let Some(w) = writer {
                    w.wake();
                }
                match next {
                    Some(batch) => out = conn.send_all(batch).await,
                    None => break,
                }
            }
            mark.done.store(true, Ordering::Release);
            out
        }));
        let op = Box::pin(async move {
            let mut task = task;
            match (&mut task.0).await {
                Ok(out) => out,
                Err(e) => (
                    Err(io::Error::other(format!("the send's task ended: {e}"))),
                    Bytes::new(),
                ),
            }
        });
        InFlight {
            op,
            ended: Some(ended),
        }
    }

    fn poll_write_slice(&mut self, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        loop {
            let _ = self.poll_send(cx);
            if let Some(e) = self.write_error.take() {
                return Poll::Ready(Err(e));
            }
            if self.write_closed {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "the stream was shut down for writing",
                )));
            }
            if self.shutting_down.is_some() {
                // A shutdown under way (its poll given up mid-way): bytes
                // written now would go after the end.
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "the stream is being shut down for writing",
                )));
            }
            if data.is_empty() {
                return Poll::Ready(Ok(0));
            }
            // A send going on in its task: queued behind it, for the task
            // to send next (see `SendEnd`), unless it took its last look.
            let on_home =
                self.home.is_some() && mailring_actors::mailring::current_shard() == self.home;
            if let Some(end) = self
                .sending
                .as_ref()
                .and_then(|s| s.ended.clone())
                .filter(|_| on_home)
            {
                let mut behind = end.behind();
                if !behind.closed {
                    // Written before, so sent before.
                    if !self.write_buf.is_empty() {
                        behind.bytes.unsplit(self.write_buf.split());
                    }
                    let room = WRITE_BUFFER.saturating_sub(behind.bytes.len());
                    if room == 0 {
                        behind.writer = Some(cx.waker().clone());
                        return Poll::Pending;
                    }
                    let n = data.len().min(room);
                    behind.bytes.extend_from_slice(&data[..n]);
                    return Poll::Ready(Ok(n));
                }
                // Ending (its task set `closed` and ends in the same
                // step): its handle, polled above, wakes this task.
                return Poll::Pending;
            }
            let room = WRITE_BUFFER.saturating_sub(self.write_buf.len());
            if room > 0 {
                let n = data.len().min(room);
                self.write_buf.extend_from_slice(&data[..n]);
                self.start_send(cx);
                return Poll::Ready(Ok(n));
            }
            if self.sending.is_some() {
                // Full behind the send in flight, polled above: this task
                // is woken when it ends.
                return Poll::Pending;
            }
            // Full with no send in flight: hand the buffer to one. It may
            // end at once (the kernel took it whole, or refused it), and
            // then nothing is left to wake this task: go round again.
            self.start_send(cx);
        }
    }

    /// Hands everything written to a send; the last one may still be in
    /// flight (see the [module](self) doc).
    fn poll_flush_handed(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            let idle = self.poll_send(cx).is_ready();
            if let Some(e) = self.write_error.take() {
                return Poll::Ready(Err(e));
            }
            if self.write_buf.is_empty() {
                return Poll::Ready(Ok(()));
            }
            if !idle {
                return Poll::Pending;
            }
            self.start_send(cx);
        }
    }

    /// Waits for every send to finish.
    fn poll_flush_all(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            ready!(self.poll_send(cx));
            if let Some(e) = self.write_error.take() {
                return Poll::Ready(Err(e));
            }
            if self.write_buf.is_empty() {
                return Poll::Ready(Ok(()));
            }
            self.start_send(cx);
        }
    }

    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.write_closed {
            // Shut down already (a second `shutdown`, or `close` repeated).
            return Poll::Ready(Ok(()));
        }
        ready!(self.poll_flush_all(cx))?;
        let op = self.shutting_down.get_or_insert_with(|| {
            let conn = self.conn.clone();
            Box::pin(async move { conn.shutdown(std::net::Shutdown::Write).await })
        });
        let res = ready!(op.as_mut().poll(cx));
        self.shutting_down = None;
        let res = match res {
            // Already shut, or the peer is gone: the end is the end.
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(()),
            other => other,
        };
        // A shutdown that failed may be tried again.
        self.write_closed = res.is_ok();
        Poll::Ready(res)
    }
}

impl Drop for CompatStream {
    /// Finishes the sends still to go in the background, on the stream's
    /// own shard; dropped on another thread, the stream hands them to that
    /// shard (unless its runtime has shut down).
    fn drop(&mut self) {
        let in_flight = self.sending.take();
        let queued = std::mem::take(&mut self.write_buf);
        if in_flight.is_none() && queued.is_empty() {
            return;
        }
        let Some(home) = self.home else {
            return;
        };
        let conn = self.conn.clone();
        let linger = move || {
            drop(mailring_actors::mailring::spawn_local(async move {
                let _ = mailring_actors::mailring::time::timeout(DROP_LINGER, async move {
                    if let Some(in_flight) = in_flight {
                        if in_flight.op.await.0.is_err() {
                            return;
                        }
                    }
                    if !queued.is_empty() {
                        let _ = conn.send_all(queued.freeze()).await;
                    }
                })
                .await;
            }));
        };
        if mailring_actors::mailring::current_shard() == Some(home) {
            linger();
        } else if let Some(runtime) = &self.runtime {
            runtime.run_on(home, linger);
        }
    }
}

/// A send under way and, for one going on in a task of its own, whether
/// it has ended.
struct InFlight {
    op: Send_,
    /// Set by the send's task as it ends; `None` for a send polled where
    /// it is (off its shard, where it fails at once).
    ended: Option<Arc<SendEnd>>,
}

/// A send going on in a task of its own: whether it has ended, and the
/// bytes written behind it meanwhile, which its task sends after it, in
/// order (the writer that queued them may wait for something else now,
/// as a task that writes a request and then waits for its answer from a
/// reading task does: nobody would start their send).
#[derive(Default)]
struct SendEnd {
    done: AtomicBool,
    behind: std::sync::Mutex<Behind>,
}

/// See [`SendEnd`].
#[derive(Default)]
struct Behind {
    /// Written behind the send, not handed to one yet.
    bytes: BytesMut,
    /// The task took its last look: bytes written from now on go to a
    /// send of their own.
    closed: bool,
    /// A writer waiting for room in `bytes`.
    writer: Option<Waker>,
}

impl SendEnd {
    fn behind(&self) -> std::sync::MutexGuard<'_, Behind> {
        self.behind.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl InFlight {
    /// Whether polling `op` may find it done without waiting (and so
    /// without putting the poller's waker in place of the one there).
    fn may_have_ended(&self) -> bool {
        self.ended
            .as_ref()
            .is_none_or(|ended| ended.done.load(Ordering::Acquire))
    }
}

/// A task's handle that stops the task when dropped (a plain handle lets
/// it run on).
struct StopOnDrop<T>(mailring_actors::mailring::JoinHandle<T>);

impl<T> Drop for StopOnDrop<T> {
    fn drop(&mut self) {
        if !self.0.is_finished() {
            self.0.abort();
        }
    }
}

fn failure_kind(failure: &TlsFailure) -> io::ErrorKind {
    match failure {
        TlsFailure::HandshakeTimeout => io::ErrorKind::TimedOut,
        TlsFailure::PeerClosedInHandshake => io::ErrorKind::UnexpectedEof,
        TlsFailure::Protocol(_) => io::ErrorKind::InvalidData,
    }
}

#[cfg(feature = "tokio-io")]
impl tokio::io::AsyncRead for CompatStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let room = buf.remaining();
        self.get_mut()
            .poll_read_with(cx, room, |bytes| buf.put_slice(bytes))
    }
}

#[cfg(feature = "tokio-io")]
impl tokio::io::AsyncWrite for CompatStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_write_slice(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_flush_handed(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_close(cx)
    }
}

#[cfg(feature = "futures-io")]
impl futures_io::AsyncRead for CompatStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_read_slice(cx, buf)
    }
}

#[cfg(feature = "futures-io")]
impl futures_io::AsyncWrite for CompatStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_write_slice(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_flush_handed(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_close(cx)
    }
}

#[cfg(feature = "hyper")]
impl hyper::rt::Read for CompatStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        let room = buf.remaining();
        self.get_mut()
            .poll_read_with(cx, room, |bytes| buf.put_slice(bytes))
    }
}

#[cfg(feature = "hyper")]
impl hyper::rt::Write for CompatStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_write_slice(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_flush_handed(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_close(cx)
    }
}

/// A `hyper::rt::Executor` that spawns on one shard (hyper's HTTP/2
/// connection and stream tasks), pinned there: never a stealable task, as
/// the connection belongs to that shard's ring.
#[cfg(feature = "hyper")]
#[derive(Debug, Clone)]
pub struct ShardExecutor {
    handle: mailring_actors::mailring::Handle,
    shard: mailring_actors::mailring::ShardId,
}

#[cfg(feature = "hyper")]
impl ShardExecutor {
    /// An executor for the current shard.
    ///
    /// # Panics
    ///
    /// Outside a shard.
    pub fn current() -> Self {
        let shard = mailring_actors::mailring::current_shard()
            .expect("ShardExecutor::current outside a mailring shard");
        ShardExecutor {
            handle: mailring_actors::mailring::Handle::current(),
            shard,
        }
    }
}

#[cfg(feature = "hyper")]
impl<F> hyper::rt::Executor<F> for ShardExecutor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, future: F) {
        drop(self.handle.spawn_on(self.shard, future));
    }
}

/// A one-shot "stop taking work" signal shared by many connections:
/// [`trigger`](Self::trigger) once (from a signal future, a shutdown path),
/// and every [`signaled`](Self::signaled) future completes. Cheap to clone,
/// `Send + Sync`.
///
/// ```
/// use mailring_transports::compat::Drain;
///
/// let drain = Drain::new();
/// let waiting = drain.signaled();
/// drain.trigger();
/// futures::executor::block_on(waiting);
/// assert!(drain.is_triggered());
/// ```
#[cfg(feature = "hyper")]
#[derive(Debug, Clone, Default)]
pub struct Drain {
    state: Arc<std::sync::Mutex<DrainState>>,
}

/// Whether a [`Drain`] fired, and the wakers of the futures waiting for
/// it, each under the number of the future that left it.
#[cfg(feature = "hyper")]
#[derive(Debug, Default)]
struct DrainState {
    triggered: bool,
    waiting: std::collections::HashMap<u64, std::task::Waker>,
    next: u64,
}

#[cfg(feature = "hyper")]
impl Drain {
    /// A drain not triggered yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, DrainState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Triggers it: every `signaled` future, past and future, completes.
    pub fn trigger(&self) {
        let wakers = {
            let mut state = self.state();
            state.triggered = true;
            std::mem::take(&mut state.waiting)
        };
        wakers.into_values().for_each(std::task::Waker::wake);
    }

    /// Whether it was triggered.
    pub fn is_triggered(&self) -> bool {
        self.state().triggered
    }

    /// Completes once it is triggered. A future dropped before takes its
    /// waker back, so a drain that never fires holds nothing of the
    /// connections that waited on it and finished.
    pub fn signaled(&self) -> impl Future<Output = ()> + Send + 'static {
        let id = {
            let mut state = self.state();
            state.next += 1;
            state.next
        };
        Signaled {
            state: self.state.clone(),
            id,
        }
    }
}

/// [`Drain::signaled`]'s future.
#[cfg(feature = "hyper")]
struct Signaled {
    state: Arc<std::sync::Mutex<DrainState>>,
    id: u64,
}

#[cfg(feature = "hyper")]
impl Future for Signaled {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if state.triggered {
            return Poll::Ready(());
        }
        match state.waiting.entry(self.id) {
            std::collections::hash_map::Entry::Occupied(mut held) => {
                if !held.get().will_wake(cx.waker()) {
                    held.insert(cx.waker().clone());
                }
            }
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(cx.waker().clone());
            }
        }
        Poll::Pending
    }
}

#[cfg(feature = "hyper")]
impl Drop for Signaled {
    fn drop(&mut self) {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .waiting
            .remove(&self.id);
    }
}

/// A hyper server connection that can drain: answer what it has started,
/// take nothing new (HTTP/1.1 stops keep-alive; HTTP/2 sends `GOAWAY`).
#[cfg(feature = "hyper")]
pub trait GracefulConnection: Future {
    /// hyper's `graceful_shutdown`; keep polling the connection after it.
    fn start_draining(self: Pin<&mut Self>);
}

#[cfg(feature = "hyper")]
impl<I, S, B> GracefulConnection for hyper::server::conn::http1::Connection<I, S>
where
    S: hyper::service::HttpService<hyper::body::Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    B: hyper::body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn start_draining(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

#[cfg(feature = "hyper")]
impl<I, S, B> GracefulConnection for hyper::server::conn::http1::UpgradeableConnection<I, S>
where
    S: hyper::service::HttpService<hyper::body::Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    B: hyper::body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn start_draining(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

#[cfg(feature = "hyper")]
impl<I, S, B, E> GracefulConnection for hyper::server::conn::http2::Connection<I, S, E>
where
    S: hyper::service::HttpService<hyper::body::Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    B: hyper::body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    E: hyper::rt::bounds::Http2ServerConnExec<S::Future, B>,
{
    fn start_draining(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

/// Serves a hyper connection to its end; if `stop` completes first
/// (a [`Drain`]'s `signaled()`, a signal future such as
/// `mailring::signal::ctrl_c()`), starts its graceful shutdown and serves
/// on until what it had started is answered.
#[cfg(feature = "hyper")]
pub async fn serve_until<C, F>(conn: C, stop: F) -> C::Output
where
    C: GracefulConnection,
    F: Future,
{
    let mut conn = std::pin::pin!(conn);
    let mut stop = std::pin::pin!(stop);
    let mut draining = false;
    std::future::poll_fn(|cx| {
        if !draining && stop.as_mut().poll(cx).is_ready() {
            draining = true;
            conn.as_mut().start_draining();
        }
        conn.as_mut().poll(cx)
    })
    .await
}

/// A `hyper::rt::Timer` on mailring's timers (the shard's timer wheel on a
/// shard, the runtime's timer thread elsewhere).
#[cfg(feature = "hyper")]
#[derive(Debug, Clone, Copy, Default)]
pub struct ShardTimer;

#[cfg(feature = "hyper")]
struct HyperSleep(mailring_actors::mailring::time::Sleep);

#[cfg(feature = "hyper")]
impl Future for HyperSleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        Pin::new(&mut self.0).poll(cx)
    }
}

#[cfg(feature = "hyper")]
impl hyper::rt::Sleep for HyperSleep {}

#[cfg(feature = "hyper")]
impl hyper::rt::Timer for ShardTimer {
    fn sleep(&self, duration: std::time::Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(HyperSleep(mailring_actors::mailring::time::sleep(duration)))
    }

    fn sleep_until(&self, deadline: std::time::Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(HyperSleep(mailring_actors::mailring::time::sleep_until(
            deadline,
        )))
    }

    /// The runtime's clock, the one its deadlines are on (a test's
    /// [`advance_clock`](mailring_actors::mailring::Handle::advance_clock)
    /// included).
    fn now(&self) -> std::time::Instant {
        mailring_actors::mailring::time::now()
    }
}

/// hyper's upgrades box the I/O as `Send`.
const _: fn() = || {
    fn is_send<T: Send>() {}
    is_send::<CompatStream>();
};
