//! Unix-domain sockets on the shard's ring: streams and datagrams.

use std::io;
use std::net::Shutdown;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use io_uring::opcode;
use io_uring::types::Fd;
use socket2::{Domain, SockAddr, Socket, Type};

use super::msg::{recv_msg, send_msg};
use super::{Acceptor, RecvMultishot, StreamCore};
use crate::buf::{BufRing, IoBuf, IoBufMut};
use crate::op::{Op, ShardFd};

/// A Unix-domain listening socket on the current shard.
#[derive(Debug)]
pub struct UnixListener {
    inner: ShardFd,
    acceptor: Acceptor,
}

impl UnixListener {
    /// Binds `path` and listens.
    ///
    /// # Errors
    ///
    /// The OS error (e.g. `AddrInUse` if the path exists), or an error outside a shard.
    pub fn bind(path: impl AsRef<Path>) -> io::Result<UnixListener> {
        let listener = std::os::unix::net::UnixListener::bind(path)?;
        Ok(UnixListener {
            inner: ShardFd::adopt(OwnedFd::from(listener))?,
            acceptor: Acceptor::default(),
        })
    }

    /// Adopts a bound, listening std socket on the current shard.
    ///
    /// # Errors
    ///
    /// An error outside a mailring shard.
    pub fn from_std(listener: std::os::unix::net::UnixListener) -> io::Result<UnixListener> {
        Ok(UnixListener {
            inner: ShardFd::adopt(OwnedFd::from(listener))?,
            acceptor: Acceptor::default(),
        })
    }

    /// Stops accepting until the next [`accept`](Self::accept), as
    /// [`TcpListener::pause_accepting`](super::TcpListener::pause_accepting).
    pub fn pause_accepting(&self) {
        self.acceptor.pause();
    }

    /// Accepts one connection.
    ///
    /// # Errors
    ///
    /// The kernel's error, or the shard-ownership error.
    pub async fn accept(&self) -> io::Result<UnixStream> {
        let fd = self.acceptor.accept(&self.inner).await?;
        Ok(UnixStream {
            core: StreamCore::new(ShardFd::adopt(fd)?),
        })
    }
}

impl AsRawFd for UnixListener {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.raw()
    }
}

/// A Unix-domain stream on the current shard.
#[derive(Debug)]
pub struct UnixStream {
    core: StreamCore,
}

impl UnixStream {
    /// Connects to the socket at `path` (`IORING_OP_CONNECT`).
    ///
    /// # Errors
    ///
    /// The kernel's error (e.g. `NotFound`, `ConnectionRefused`), or an error outside a shard.
    pub async fn connect(path: impl AsRef<Path>) -> io::Result<UnixStream> {
        let path = path.as_ref();
        let target = Box::new(SockAddr::unix(path)?);
        let socket = Socket::new(Domain::UNIX, Type::STREAM.cloexec(), None)?;
        let inner = ShardFd::adopt(OwnedFd::from(socket))?;
        let keep = inner.fd.clone();
        let raw = inner.raw();
        // SAFETY: the SQE reads the address from the box (heap, owned by the op
        // until its CQE) and uses the socket kept by `keep`.
        let op = unsafe {
            Op::submit((target, keep), None, |(t, _)| {
                opcode::Connect::new(Fd(raw), t.as_ptr().cast(), t.len()).build()
            })
        }?;
        op.await
            .0
            .map_err(|e| io::Error::new(e.kind(), format!("connect {}: {e}", path.display())))?;
        Ok(UnixStream {
            core: StreamCore::new(inner),
        })
    }

    /// Adopts a connected std stream on the current shard.
    ///
    /// # Errors
    ///
    /// An error outside a mailring shard.
    pub fn from_std(stream: std::os::unix::net::UnixStream) -> io::Result<UnixStream> {
        Ok(UnixStream {
            core: StreamCore::new(ShardFd::adopt(OwnedFd::from(stream))?),
        })
    }

    /// Turns the stream back into a std stream, e.g. to move it to another
    /// shard (`UnixStream::from_std` there).
    ///
    /// # Errors
    ///
    /// Gives the stream back while an abandoned operation still uses it.
    pub fn into_std(self) -> Result<std::os::unix::net::UnixStream, UnixStream> {
        self.core
            .into_owned()
            .map(std::os::unix::net::UnixStream::from)
            .map_err(|core| UnixStream { core })
    }

    /// A connected pair (`socketpair`), both on the current shard.
    ///
    /// # Errors
    ///
    /// The OS error, or an error outside a shard.
    pub fn pair() -> io::Result<(UnixStream, UnixStream)> {
        let (a, b) = std::os::unix::net::UnixStream::pair()?;
        Ok((
            UnixStream {
                core: StreamCore::new(ShardFd::adopt(OwnedFd::from(a))?),
            },
            UnixStream {
                core: StreamCore::new(ShardFd::adopt(OwnedFd::from(b))?),
            },
        ))
    }

    /// Sends some of `buf`'s bytes; returns how many.
    pub async fn send<B: IoBuf>(&self, buf: B) -> (io::Result<usize>, B) {
        self.core.send_from(buf, 0).await
    }

    /// Sends all of `buf`'s bytes.
    ///
    /// # Errors
    ///
    /// The kernel's error; `WriteZero` if nothing is accepted.
    pub async fn send_all<B: IoBuf>(&self, buf: B) -> (io::Result<()>, B) {
        self.core.send_all(buf).await
    }

    /// Receives into `buf`; 0 means the peer closed its side.
    pub async fn recv<B: IoBufMut>(&self, buf: B) -> (io::Result<usize>, B) {
        self.core.recv(buf).await
    }

    /// Sends what the socket takes of `buf` now, with a non-blocking
    /// `send` (`MSG_DONTWAIT`) rather than an operation on the ring; see
    /// [`TcpStream::try_send`](super::TcpStream::try_send). While a send of
    /// this socket is on the ring it says `WouldBlock` and sends nothing:
    /// the bytes would overtake it.
    ///
    /// # Errors
    ///
    /// `WouldBlock` when the send buffer has no room or a send is on the
    /// ring; the wrong-shard error off the socket's shard; the OS error
    /// (e.g. `BrokenPipe`).
    pub fn try_send(&self, buf: &[u8]) -> io::Result<usize> {
        self.core.try_send(buf)
    }

    /// Copies the queued bytes into `buf` without taking them; see
    /// [`TcpStream::try_peek`](super::TcpStream::try_peek).
    ///
    /// # Errors
    ///
    /// `WouldBlock` when nothing is queued or a receive is on the ring; the
    /// wrong-shard error off the socket's shard; the OS error.
    pub fn try_peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.core.try_peek(buf)
    }

    /// Takes the queued bytes into `buf` without waiting; see
    /// [`TcpStream::try_recv`](super::TcpStream::try_recv).
    ///
    /// # Errors
    ///
    /// `WouldBlock` when nothing is queued or a receive is on the ring; the
    /// bytes a dropped `recv` took; the wrong-shard error off the socket's
    /// shard; the OS error.
    pub fn try_recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.core.try_recv(buf)
    }

    /// Starts a multishot receive into buffers of `ring`; see
    /// [`TcpStream::recv_multishot`](super::TcpStream::recv_multishot).
    pub fn recv_multishot(&self, ring: &BufRing) -> RecvMultishot<'_> {
        RecvMultishot::new(&self.core, ring)
    }

    /// Shuts down one or both directions.
    ///
    /// # Errors
    ///
    /// The kernel's error.
    pub async fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.core.shutdown(how).await
    }

    /// Completes once the peer has closed its side; see
    /// [`TcpStream::peer_close`](crate::net::TcpStream::peer_close).
    ///
    /// # Errors
    ///
    /// The wrong-shard error off the stream's shard; the kernel's error.
    pub async fn peer_close(&self) -> io::Result<()> {
        self.core.peer_close().await
    }
}

impl AsRawFd for UnixStream {
    fn as_raw_fd(&self) -> RawFd {
        self.core.inner.raw()
    }
}

/// A Unix-domain datagram socket on the current shard.
#[derive(Debug)]
pub struct UnixDatagram {
    inner: ShardFd,
}

impl UnixDatagram {
    /// Binds `path`.
    ///
    /// # Errors
    ///
    /// The OS error, or an error outside a shard.
    pub fn bind(path: impl AsRef<Path>) -> io::Result<UnixDatagram> {
        let socket = std::os::unix::net::UnixDatagram::bind(path)?;
        Ok(UnixDatagram {
            inner: ShardFd::adopt(OwnedFd::from(socket))?,
        })
    }

    /// An unbound socket (it can send, and receive once connected).
    ///
    /// # Errors
    ///
    /// The OS error, or an error outside a shard.
    pub fn unbound() -> io::Result<UnixDatagram> {
        let socket = std::os::unix::net::UnixDatagram::unbound()?;
        Ok(UnixDatagram {
            inner: ShardFd::adopt(OwnedFd::from(socket))?,
        })
    }

    /// Sends `buf` as one datagram to the socket bound at `path`.
    pub async fn send_to<B: IoBuf>(
        &self,
        buf: B,
        path: impl AsRef<Path>,
    ) -> (io::Result<usize>, B) {
        match SockAddr::unix(path) {
            Ok(addr) => send_msg(&self.inner, buf, Some(&addr)).await,
            Err(e) => (Err(e), buf),
        }
    }

    /// Receives one datagram; returns its length and the sender's path (`None`
    /// for an unbound sender).
    pub async fn recv_from<B: IoBufMut>(
        &self,
        buf: B,
    ) -> (io::Result<(usize, Option<PathBuf>)>, B) {
        let (res, buf) = recv_msg(&self.inner, buf).await;
        (
            res.map(|(n, from)| (n, from.as_pathname().map(Path::to_path_buf))),
            buf,
        )
    }
}

impl AsRawFd for UnixDatagram {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.raw()
    }
}
