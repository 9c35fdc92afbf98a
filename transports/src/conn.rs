//! The stream sockets sessions run on ([`Conn`]: TCP or Unix, on one
//! shard's ring), their std form for a move between shards, listeners, and
//! [`Framed`], a framed client or server connection for code outside a
//! [`crate::Server`].

use std::io;
use std::net::{Shutdown, SocketAddr};
use std::path::Path;

use bytes::{Bytes, BytesMut};
use mailring_actors::mailring::net::{
    DirectStream, DirectTicket, TcpListener, TcpStream, UnixListener, UnixStream,
};
use mailring_actors::mailring::ShardId;

use crate::codec::{Codec, CodecError};
use crate::tls::{TlsConn, TlsInfo, TlsState};

/// A connected stream socket on the current shard.
#[derive(Debug)]
pub(crate) enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
    /// A TCP socket held in the shard's direct-descriptor table.
    Direct(DirectStream),
    /// TLS over one of the others.
    Tls(Box<TlsConn>),
}

/// A connection between two shards.
#[derive(Debug)]
pub(crate) enum InTransit {
    /// Off every ring, as a plain descriptor.
    Plain(StdConn),
    /// On its way over `IORING_MSG_SEND_FD`.
    Direct(DirectTicket),
    /// A TLS connection: its socket on its way, its TLS state beside it.
    Tls(Box<InTransit>, Box<TlsState>),
}

impl InTransit {
    /// Whether the socket travels as a direct descriptor.
    pub(crate) fn is_direct(&self) -> bool {
        match self {
            InTransit::Plain(_) => false,
            InTransit::Direct(_) => true,
            InTransit::Tls(inner, _) => inner.is_direct(),
        }
    }

    /// The connection, on the shard it was sent to.
    pub(crate) async fn arrive(self) -> io::Result<Conn> {
        match self {
            InTransit::Plain(std) => Conn::from_std(std),
            InTransit::Direct(ticket) => ticket.receive().await.map(Conn::Direct),
            InTransit::Tls(inner, state) => {
                let inner = Box::pin(inner.arrive()).await?;
                Ok(Conn::Tls(Box::new(TlsConn::from_state(inner, *state))))
            }
        }
    }
}

/// A [`Conn`] off every ring, on its way to another shard.
#[derive(Debug)]
pub(crate) enum StdConn {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
}

impl Conn {
    pub(crate) async fn recv(&self, buf: BytesMut) -> (io::Result<usize>, BytesMut) {
        match self {
            Conn::Tls(s) => s.recv(buf).await,
            plain => plain.recv_plain(buf).await,
        }
    }

    pub(crate) async fn send_all(&self, buf: Bytes) -> (io::Result<()>, Bytes) {
        match self {
            Conn::Tls(s) => s.send_all(buf).await,
            plain => plain.send_all_plain(buf).await,
        }
    }

    pub(crate) async fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Conn::Tls(s) => s.shutdown(how).await,
            plain => plain.shutdown_plain(how).await,
        }
    }

    /// A receive on the socket itself (what the TLS layer reads from).
    pub(crate) async fn recv_plain<B: mailring_actors::mailring::buf::IoBufMut>(
        &self,
        buf: B,
    ) -> (io::Result<usize>, B) {
        match self {
            Conn::Tcp(s) => s.recv(buf).await,
            Conn::Unix(s) => s.recv(buf).await,
            Conn::Direct(s) => s.recv(buf).await,
            Conn::Tls(_) => (Err(tls_over_tls()), buf),
        }
    }

    /// A send on the socket itself.
    pub(crate) async fn send_all_plain(&self, buf: Bytes) -> (io::Result<()>, Bytes) {
        match self {
            Conn::Tcp(s) => s.send_all(buf).await,
            Conn::Unix(s) => s.send_all(buf).await,
            Conn::Direct(s) => s.send_all(buf).await,
            Conn::Tls(_) => (Err(tls_over_tls()), buf),
        }
    }

    /// Sends what the socket takes at once, without the ring (plain TCP
    /// and Unix streams; `None` for direct descriptors, which live only in
    /// the ring's table, and TLS, whose sends all go through the ring).
    pub(crate) fn try_send_plain(&self, buf: &[u8]) -> Option<io::Result<usize>> {
        match self {
            Conn::Tcp(s) => Some(s.try_send(buf)),
            Conn::Unix(s) => Some(s.try_send(buf)),
            _ => None,
        }
    }

    /// Whether an idle connection may be handed out again: still open,
    /// and sent nothing unasked since its last exchange (a frame then
    /// would be read as the next caller's reply). Over TLS records may
    /// come unasked (session tickets, key updates): those queued are taken
    /// through the record layer now, and the connection is fit if they
    /// held no data and no end (over TCP the kernel's state also sees an
    /// end behind them).
    pub(crate) fn fit_for_reuse(&self) -> bool {
        let mut probe = [0u8; 1];
        let peeked = match self {
            Conn::Tcp(s) => s.try_peek(&mut probe),
            Conn::Unix(s) => s.try_peek(&mut probe),
            Conn::Direct(_) => return true,
            Conn::Tls(s) => {
                // Its end may sit behind a `close_notify` record: over TCP
                // the kernel's state tells.
                if let Conn::Tcp(tcp) = s.inner() {
                    if tcp.peer_closed().unwrap_or(true) {
                        return false;
                    }
                }
                return s.at_rest_without_data();
            }
        };
        matches!(peeked, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    /// Whether bytes of the peer's are held that make no whole unit yet:
    /// over TLS, part of a record (the plaintext it carries has begun to
    /// come); never for a plain stream, whose bytes reach the caller as
    /// they come.
    pub(crate) fn partial_input(&self) -> bool {
        match self {
            Conn::Tls(s) => s.has_partial_record(),
            _ => false,
        }
    }

    /// Takes the bytes queued on the socket itself now (plain TCP and
    /// Unix streams; `WouldBlock` for the others).
    pub(crate) fn recv_plain_now(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.try_recv(buf),
            Conn::Unix(s) => s.try_recv(buf),
            _ => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    /// Completes once the peer has closed its side (or the socket
    /// failed), taking no byte: over TLS, the socket under it.
    pub(crate) async fn peer_close(&self) -> io::Result<()> {
        match self {
            Conn::Tcp(s) => s.peer_close().await,
            Conn::Unix(s) => s.peer_close().await,
            Conn::Direct(s) => s.peer_close().await,
            Conn::Tls(s) => Box::pin(s.inner().peer_close()).await,
        }
    }

    /// A shutdown of the socket itself.
    pub(crate) async fn shutdown_plain(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Conn::Tcp(s) => s.shutdown(how).await,
            Conn::Unix(s) => s.shutdown(how).await,
            Conn::Direct(s) => s.shutdown(how).await,
            Conn::Tls(_) => Err(tls_over_tls()),
        }
    }

    /// Ends a TLS connection's sending side with `close_notify`, so the
    /// peer tells a clean end from a cut; nothing for other connections.
    pub(crate) async fn close_notify(&self) -> io::Result<()> {
        match self {
            Conn::Tls(s) => s.close_notify().await,
            _ => Ok(()),
        }
    }

    /// Whether the socket is a direct descriptor (a TLS one's too).
    pub(crate) fn is_direct(&self) -> bool {
        match self {
            Conn::Direct(_) => true,
            Conn::Tls(s) => s.inner().is_direct(),
            _ => false,
        }
    }

    /// What the TLS handshake agreed on, for a TLS connection.
    pub(crate) fn tls_info(&self) -> Option<TlsInfo> {
        match self {
            Conn::Tls(s) => Some(s.info()),
            _ => None,
        }
    }

    /// Sends the connection towards shard `to`: a direct one over
    /// `IORING_MSG_SEND_FD`, a plain one off this ring as a descriptor.
    /// Gives the connection back (with the error) when it cannot leave.
    pub(crate) async fn depart(self, to: ShardId) -> Result<InTransit, (io::Error, Conn)> {
        let busy = || {
            io::Error::new(
                io::ErrorKind::ResourceBusy,
                "an abandoned operation still uses the connection",
            )
        };
        match self {
            Conn::Tcp(s) => s
                .into_std()
                .map(|s| InTransit::Plain(StdConn::Tcp(s)))
                .map_err(|s| (busy(), Conn::Tcp(s))),
            Conn::Unix(s) => s
                .into_std()
                .map(|s| InTransit::Plain(StdConn::Unix(s)))
                .map_err(|s| (busy(), Conn::Unix(s))),
            Conn::Direct(s) => match s.send_to_shard(to).await {
                Ok(ticket) => Ok(InTransit::Direct(ticket)),
                // No room in the target's table: the socket becomes a
                // process descriptor again and travels as one. (Not on
                // other errors: after `EOVERFLOW` the target holds the
                // socket already, out of anyone's reach, and the runtime
                // has shut it down.)
                Err((e, s)) if e.raw_os_error() == Some(libc::ENFILE) => match s.into_tcp().await {
                    Ok(tcp) => tcp
                        .into_std()
                        .map(|s| InTransit::Plain(StdConn::Tcp(s)))
                        .map_err(|s| (busy(), Conn::Tcp(s))),
                    Err((_, s)) => Err((e, Conn::Direct(s))),
                },
                Err((e, s)) => Err((e, Conn::Direct(s))),
            },
            Conn::Tls(s) => {
                let (inner, state) = s.into_parts();
                match Box::pin(inner.depart(to)).await {
                    Ok(transit) => Ok(InTransit::Tls(Box::new(transit), Box::new(state))),
                    Err((e, inner)) => {
                        Err((e, Conn::Tls(Box::new(TlsConn::from_state(inner, state)))))
                    }
                }
            }
        }
    }

    /// A TCP connection moved into the shard's direct-descriptor table; the
    /// same connection when it cannot be (no table, table full), with why.
    pub(crate) async fn into_direct(self) -> (Conn, Option<io::Error>) {
        match self {
            Conn::Tcp(s) => match DirectStream::from_tcp(s).await {
                Ok(d) => (Conn::Direct(d), None),
                Err((e, s)) => (Conn::Tcp(s), Some(e)),
            },
            other => (other, None),
        }
    }

    /// Adopts a socket on the current shard.
    pub(crate) fn from_std(conn: StdConn) -> io::Result<Conn> {
        Ok(match conn {
            StdConn::Tcp(s) => Conn::Tcp(TcpStream::from_std(s)?),
            StdConn::Unix(s) => Conn::Unix(UnixStream::from_std(s)?),
        })
    }
}

/// Connects over TCP (with `TCP_NODELAY`) and runs a TLS client handshake
/// for `server_name`.
pub(crate) async fn connect_tls(
    addr: SocketAddr,
    server_name: &str,
    config: std::sync::Arc<rustls::ClientConfig>,
) -> io::Result<Conn> {
    let name = rustls::pki_types::ServerName::try_from(server_name.to_owned())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    let tls = TlsConn::connect(Conn::Tcp(s), config, name).await?;
    Ok(Conn::Tls(Box::new(tls)))
}

/// TLS layers are never stacked: the layer reads and writes the socket.
fn tls_over_tls() -> io::Error {
    io::Error::new(io::ErrorKind::Unsupported, "TLS over a TLS connection")
}

/// A listening socket on the current shard.
#[derive(Debug)]
pub(crate) enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

/// A listening socket before it reaches its shard.
#[derive(Debug)]
pub(crate) enum StdListener {
    Tcp(std::net::TcpListener),
    Unix(std::os::unix::net::UnixListener),
}

impl Listener {
    pub(crate) fn from_std(l: StdListener) -> io::Result<Listener> {
        Ok(match l {
            StdListener::Tcp(l) => Listener::Tcp(TcpListener::from_std(l)?),
            StdListener::Unix(l) => Listener::Unix(UnixListener::from_std(l)?),
        })
    }

    /// Stops the kernel accepting until the next `accept` (see
    /// `TcpListener::pause_accepting`).
    pub(crate) fn pause(&self) {
        match self {
            Listener::Tcp(l) => l.pause_accepting(),
            Listener::Unix(l) => l.pause_accepting(),
        }
    }

    /// Accepts one connection, with the peer's address and the local one
    /// for TCP (the listener's, unless it listens on every address: then
    /// the socket's, one `getsockname`).
    pub(crate) async fn accept(&self) -> io::Result<Accepted> {
        match self {
            Listener::Tcp(l) => {
                let (s, peer) = l.accept().await?;
                let _ = s.set_nodelay(true);
                let bound = l.local_addr();
                let local = if bound.ip().is_unspecified() {
                    s.local_addr().ok()
                } else {
                    Some(bound)
                };
                Ok((Conn::Tcp(s), Some(peer), local))
            }
            Listener::Unix(l) => Ok((Conn::Unix(l.accept().await?), None, None)),
        }
    }
}

/// An accepted connection, its peer's address and its local one (TCP).
pub(crate) type Accepted = (Conn, Option<SocketAddr>, Option<SocketAddr>);

/// Why [`Framed::recv`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FramedError {
    /// The socket failed.
    #[error("socket error: {0}")]
    Io(#[from] io::Error),
    /// The bytes received are not a frame of the codec.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// The peer closed its side in the middle of a frame.
    #[error("connection closed in the middle of a frame ({0} bytes)")]
    Truncated(usize),
}

/// A framed connection on the current shard: frames out with
/// [`send`](Self::send) (or [`feed`](Self::feed) then
/// [`flush`](Self::flush)), frames in with [`recv`](Self::recv). What a
/// client of a [`crate::Server`] (or a test) uses.
///
/// Keep a pending `recv` future until it finishes: dropping one while the
/// kernel fills its buffer loses those bytes (the next `recv` says so).
///
/// ```
/// use mailring_transports::bytes::Bytes;
/// use mailring_transports::codec::Lines;
/// use mailring_transports::Framed;
///
/// let rt = mailring_actors::Runtime::builder().shards(1).build()?;
/// rt.block_on_local(|| async {
///     let (a, b) = mailring_actors::mailring::net::UnixStream::pair()?;
///     let (mut a, mut b) = (Framed::unix(a, Lines::new()), Framed::unix(b, Lines::new()));
///     a.send(Bytes::from_static(b"hello")).await?;
///     assert_eq!(b.recv().await?.as_deref(), Some(&b"hello"[..]));
///     Ok::<_, mailring_transports::FramedError>(())
/// })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Framed<C: Codec> {
    conn: Conn,
    codec: C,
    rbuf: BytesMut,
    wbuf: BytesMut,
    eof: bool,
    /// Frames encoded (fed or sent) and frames decoded so far: a pool
    /// tells from them whether every request had its reply.
    frames_out: u64,
    frames_in: u64,
    /// A send or receive is under way: set before its wait, cleared after.
    /// Still set once the connection is idle again, the operation's
    /// future was dropped mid-way (part of a frame may be on the wire, or
    /// bytes taken from the socket lost).
    in_io: bool,
    /// A send is under way (as `in_io`): still set at the next send or
    /// receive, it was given up mid-way.
    in_send: bool,
    /// A send was given up mid-way (part of a frame may be on the wire),
    /// or a receive given up mid-way lost bytes: the frames are out of
    /// step with the peer's, and every later send and receive fails.
    broken: bool,
    /// Its sending side was shut down ([`Framed::close_write`]): it sends
    /// nothing more, so a pool does not hand it out again.
    write_closed: bool,
}

impl<C: Codec> Framed<C> {
    /// Connects over TCP.
    ///
    /// # Errors
    ///
    /// The connect's error, or an error outside a shard.
    pub async fn connect_tcp(addr: SocketAddr, codec: C) -> io::Result<Self> {
        let s = TcpStream::connect(addr).await?;
        s.set_nodelay(true)?;
        Ok(Self::tcp(s, codec))
    }

    /// Connects over TCP from a source port that a server's steered
    /// reuseport group ([`crate::ServerConfig::source_port_steering`]) sends
    /// to its listener `shard` of `shards`: a client that knows its key
    /// (`shard` = the key's shard on the server, e.g.
    /// `mailring::sticky_shard(&key, shards)`) lands where its session
    /// lives, with no hand-off. Ports taken locally are skipped.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for `shard >= shards`; `AddrInUse` when no port of
    /// the residue was free after 64 tries; the connect's error.
    pub async fn connect_tcp_to_shard(
        addr: SocketAddr,
        shard: ShardId,
        shards: usize,
        codec: C,
    ) -> io::Result<Self> {
        if shard.index() >= shards {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("shard {} of {shards}", shard.index()),
            ));
        }
        // Start somewhere in 20,000..60,000 and walk up to the next port
        // the group's hash sends to `shard` (one in `shards` on average).
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let mut port = 20_000 + seed % 40_000;
        let local_ip: std::net::IpAddr = if addr.is_ipv4() {
            std::net::Ipv4Addr::UNSPECIFIED.into()
        } else {
            std::net::Ipv6Addr::UNSPECIFIED.into()
        };
        let mut last = io::Error::new(io::ErrorKind::AddrInUse, "no free source port");
        let mut tries = 0;
        while tries < 64 {
            port = if port >= u32::from(u16::MAX) {
                1024
            } else {
                port + 1
            };
            let candidate = port as u16;
            if mailring_actors::mailring::net::steered_index(candidate, shards) != shard.index() {
                continue;
            }
            tries += 1;
            let local = SocketAddr::new(local_ip, candidate);
            match TcpStream::connect_from(local, addr).await {
                Ok(s) => {
                    s.set_nodelay(true)?;
                    return Ok(Self::tcp(s, codec));
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::AddrInUse | io::ErrorKind::AddrNotAvailable
                    ) =>
                {
                    last = e;
                }
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    /// Connects over TCP and runs a TLS client handshake for `server_name`
    /// (the name the certificate must carry, sent as SNI) with `config`
    /// (its trusted roots, ALPN list). Frames then travel encrypted.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for a server name that is neither a DNS name nor an
    /// IP address; the connect's error; a failed handshake (its
    /// [`TlsFailure`](crate::tls::TlsFailure) inside the `io::Error`, e.g.
    /// a server certificate from an untrusted CA or expired, or
    /// `HandshakeTimeout` when the server has not finished its side within
    /// [`TlsAcceptor::DEFAULT_HANDSHAKE_TIMEOUT`](crate::tls::TlsAcceptor::DEFAULT_HANDSHAKE_TIMEOUT)).
    pub async fn connect_tls(
        addr: SocketAddr,
        server_name: &str,
        config: std::sync::Arc<rustls::ClientConfig>,
        codec: C,
    ) -> io::Result<Self> {
        Ok(Self::new(
            connect_tls(addr, server_name, config).await?,
            codec,
        ))
    }

    /// What the TLS handshake agreed on (ALPN, version), for a connection
    /// made with [`connect_tls`](Self::connect_tls).
    pub fn tls_info(&self) -> Option<TlsInfo> {
        self.conn.tls_info()
    }

    /// Connects to a Unix socket.
    ///
    /// # Errors
    ///
    /// The connect's error, or an error outside a shard.
    pub async fn connect_unix(path: impl AsRef<Path>, codec: C) -> io::Result<Self> {
        Ok(Self::unix(UnixStream::connect(path).await?, codec))
    }

    /// Frames a TCP stream.
    pub fn tcp(stream: TcpStream, codec: C) -> Self {
        Self::new(Conn::Tcp(stream), codec)
    }

    /// Frames a Unix stream.
    pub fn unix(stream: UnixStream, codec: C) -> Self {
        Self::new(Conn::Unix(stream), codec)
    }

    fn new(conn: Conn, codec: C) -> Self {
        Framed {
            conn,
            codec,
            rbuf: BytesMut::new(),
            wbuf: BytesMut::new(),
            eof: false,
            frames_out: 0,
            frames_in: 0,
            in_io: false,
            in_send: false,
            broken: false,
            write_closed: false,
        }
    }

    /// Encodes `frame` into the write buffer without sending it.
    ///
    /// # Errors
    ///
    /// The codec's refusal.
    pub fn feed(&mut self, frame: C::Out) -> Result<(), CodecError> {
        self.codec.encode(frame, &mut self.wbuf)?;
        self.frames_out += 1;
        Ok(())
    }

    /// Sends what [`feed`](Self::feed) buffered. Given up mid-way (its
    /// future dropped: a timeout, a `select!`), part of a frame may be on
    /// the wire: every later send and receive of the connection fails
    /// (`BrokenPipe`); close it. A receive given up before anything came
    /// is harmless (an idle timeout around [`recv`](Self::recv)).
    ///
    /// # Errors
    ///
    /// The socket's error; `BrokenPipe` after a send given up mid-way, or
    /// a receive given up mid-way that lost bytes.
    pub async fn flush(&mut self) -> io::Result<()> {
        self.check_in_step()?;
        if self.wbuf.is_empty() {
            return Ok(());
        }
        self.in_io = true;
        self.in_send = true;
        let (res, _) = self.conn.send_all(self.wbuf.split().freeze()).await;
        self.in_send = false;
        self.in_io = false;
        res
    }

    /// Fails once a send was given up mid-way, or a receive given up
    /// mid-way lost bytes: the frames are out of step with the peer's.
    fn check_in_step(&mut self) -> io::Result<()> {
        // Over TLS the record layer keeps this mark itself (a record sent
        // part way), and says so in its own error.
        if self.in_send && !matches!(self.conn, Conn::Tls(_)) {
            self.broken = true;
        }
        if self.broken {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "a send or receive of this connection was given up mid-way: its frames are out of step with the peer's; close it",
            ));
        }
        Ok(())
    }

    /// Encodes and sends one frame.
    ///
    /// # Errors
    ///
    /// The codec's refusal (as `InvalidInput`) or the socket's error.
    pub async fn send(&mut self, frame: C::Out) -> io::Result<()> {
        self.feed(frame)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        self.flush().await
    }

    /// The next frame; `None` once the peer closed between frames.
    ///
    /// # Errors
    ///
    /// The socket's error, the codec's refusal, or a peer that closed in
    /// the middle of a frame.
    pub async fn recv(&mut self) -> Result<Option<C::In>, FramedError> {
        // A receive given up mid-way is harmless unless it lost bytes,
        // which a later receive of the socket reports (once): then out of
        // step for good.
        self.check_in_step()?;
        loop {
            if let Some(frame) = self.codec.decode(&mut self.rbuf)? {
                self.frames_in += 1;
                return Ok(Some(frame));
            }
            if self.eof {
                return match self.rbuf.len() {
                    0 => Ok(None),
                    n => Err(FramedError::Truncated(n)),
                };
            }
            self.rbuf.reserve(16 << 10);
            let tail = self.rbuf.split_off(self.rbuf.len());
            self.in_io = true;
            let (res, tail) = self.conn.recv(tail).await;
            self.in_io = false;
            self.rbuf.unsplit(tail);
            if res
                .as_ref()
                .is_err_and(mailring_actors::mailring::net::LostBytes::is)
            {
                self.broken = true;
            }
            if res? == 0 {
                self.eof = true;
            }
        }
    }

    /// Whether the peer closed its side (a `recv` saw the end).
    pub fn is_closed(&self) -> bool {
        self.eof
    }

    /// Whether the connection, idle between exchanges, may serve the next
    /// one: no end seen or queued, and no byte received that nobody asked
    /// for (see `Conn::fit_for_reuse`).
    pub(crate) fn fit_for_reuse(&self) -> bool {
        !self.eof && self.rbuf.is_empty() && self.wbuf.is_empty() && self.conn.fit_for_reuse()
    }

    /// Frames encoded and frames decoded so far (see [`Framed::between_exchanges`]).
    pub(crate) fn frames(&self) -> (u64, u64) {
        (self.frames_out, self.frames_in)
    }

    /// Whether the connection sits between request-reply exchanges since
    /// `at` (its [`Framed::frames`] then): no send or receive was cut off
    /// mid-way, its sending side is open, and as many replies came as
    /// requests went (more may have come: a greeting).
    pub(crate) fn between_exchanges(&self, at: (u64, u64)) -> bool {
        !self.in_io
            && !self.broken
            && !self.write_closed
            && self.frames_out - at.0 <= self.frames_in - at.1
    }

    /// Closes the sending side (the peer reads the end after what was sent).
    ///
    /// # Errors
    ///
    /// The socket's error.
    pub async fn close_write(&mut self) -> io::Result<()> {
        self.write_closed = true;
        // Nothing left to send (a broken connection included): the end
        // goes to the peer all the same.
        if !self.wbuf.is_empty() {
            self.flush().await?;
        }
        self.conn.shutdown(Shutdown::Write).await
    }
}
