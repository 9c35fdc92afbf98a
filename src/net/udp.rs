//! UDP sockets on the shard's ring.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use io_uring::opcode;
use io_uring::types::Fd;
use socket2::{Domain, Protocol, SockAddr, SockRef, Socket, Type};

use super::msg::{recv_msg, send_msg};
use crate::buf::{IoBuf, IoBufMut};
use crate::op::{submit_read, ShardFd};

/// A UDP socket on the current shard.
///
/// # Examples
///
/// ```
/// use mailring::net::UdpSocket;
/// let rt = mailring::Runtime::builder().shards(1).build()?;
/// let got = rt.block_on(async {
///     let a = UdpSocket::bind("127.0.0.1:0".parse().unwrap())?;
///     let b = UdpSocket::bind("127.0.0.1:0".parse().unwrap())?;
///     a.send_to(b"hi".to_vec(), b.local_addr()?).await.0?;
///     let (res, buf) = b.recv_from(Vec::with_capacity(16)).await;
///     let (_, from) = res?;
///     assert_eq!(from, a.local_addr()?);
///     Ok::<_, std::io::Error>(buf)
/// })?;
/// assert_eq!(got, b"hi");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct UdpSocket {
    inner: ShardFd,
}

impl UdpSocket {
    /// Binds on the current shard.
    ///
    /// # Errors
    ///
    /// The OS error, or an error outside a mailring shard.
    pub fn bind(addr: SocketAddr) -> io::Result<UdpSocket> {
        let socket = Socket::new(
            Domain::for_address(addr),
            Type::DGRAM.cloexec(),
            Some(Protocol::UDP),
        )?;
        socket.bind(&addr.into())?;
        Ok(UdpSocket {
            inner: ShardFd::adopt(OwnedFd::from(socket))?,
        })
    }

    /// Adopts a bound std socket on the current shard.
    ///
    /// # Errors
    ///
    /// An error outside a mailring shard.
    pub fn from_std(socket: std::net::UdpSocket) -> io::Result<UdpSocket> {
        Ok(UdpSocket {
            inner: ShardFd::adopt(OwnedFd::from(socket))?,
        })
    }

    /// Sets the default peer (for [`send`](Self::send) and filtering [`recv`](Self::recv)).
    ///
    /// # Errors
    ///
    /// The OS error.
    pub fn connect(&self, addr: SocketAddr) -> io::Result<()> {
        SockRef::from(&*self.inner.fd).connect(&addr.into())
    }

    /// The bound address.
    ///
    /// # Errors
    ///
    /// The OS error.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        let addr = SockRef::from(&*self.inner.fd).local_addr()?;
        addr.as_socket()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "not an IP socket"))
    }

    /// Sends `buf` as one datagram to `to` (`IORING_OP_SENDMSG`).
    pub async fn send_to<B: IoBuf>(&self, buf: B, to: SocketAddr) -> (io::Result<usize>, B) {
        send_msg(&self.inner, buf, Some(&SockAddr::from(to))).await
    }

    /// Receives one datagram and its sender (`IORING_OP_RECVMSG`). A datagram
    /// longer than the buffer's capacity is truncated.
    pub async fn recv_from<B: IoBufMut>(&self, buf: B) -> (io::Result<(usize, SocketAddr)>, B) {
        let (res, buf) = recv_msg(&self.inner, buf).await;
        let res = res.and_then(|(n, from)| {
            from.as_socket().map(|a| (n, a)).ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidData, "datagram from a non-IP sender")
            })
        });
        (res, buf)
    }

    /// Sends to the connected peer.
    pub async fn send<B: IoBuf>(&self, buf: B) -> (io::Result<usize>, B) {
        send_msg(&self.inner, buf, None).await
    }

    /// Receives from the connected peer.
    pub async fn recv<B: IoBufMut>(&self, buf: B) -> (io::Result<usize>, B) {
        // SAFETY: a recv writes at most `len` bytes at `ptr`.
        unsafe {
            submit_read(&self.inner, buf, 0, |fd, ptr, len| {
                opcode::Recv::new(Fd(fd), ptr, len).build()
            })
            .await
        }
    }
}

impl AsRawFd for UdpSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.raw()
    }
}
