//! UDP sockets on the shard's ring.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use io_uring::opcode;
use io_uring::types::Fd;
use socket2::{Domain, Protocol, SockAddr, SockRef, Socket, Type};

use super::msg::{recv_msg, send_msg};
use super::{recycle_buffer, RingKeep, RingReceive};
use crate::buf::{BufRing, IoBuf, IoBufMut, RecvBuf};
use crate::op::{submit_read, MultishotOp, ShardFd};

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

    /// Sends `buf` as one datagram to `to` at once, with a plain
    /// non-blocking `sendto` (`MSG_DONTWAIT`) rather than an operation on
    /// the ring: `WouldBlock` when the socket's send buffer has no room,
    /// where [`send_to`](Self::send_to) waits for it. A datagram send
    /// never waits for the peer, so for a server's replies this is the
    /// cheaper path: no operation to submit and complete, no wake-up of
    /// the task when it completes.
    ///
    /// # Errors
    ///
    /// `WouldBlock` as above; the wrong-shard error off the socket's
    /// shard; the OS error.
    pub fn try_send_to(&self, buf: &[u8], to: SocketAddr) -> io::Result<usize> {
        self.inner.check()?;
        SockRef::from(&*self.inner.fd).send_to_with_flags(
            buf,
            &SockAddr::from(to),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    }

    /// Sends each datagram of `batch` (its bytes, its peer) at once, in
    /// order, with non-blocking `sendmmsg` calls (one per 64 datagrams)
    /// instead of one `sendto` each: for a server that answers several
    /// peers in one tick, one system call for all of them. Returns how
    /// many were sent, from the first: fewer than `batch.len()` when the
    /// socket's send buffer filled (the rest wait for
    /// [`send_to`](Self::send_to)) or a datagram failed after others went.
    ///
    /// # Errors
    ///
    /// When the first datagram could not go: `WouldBlock` (no room), the
    /// wrong-shard error off the socket's shard, the OS error.
    pub fn try_send_to_many(&self, batch: &[(&[u8], SocketAddr)]) -> io::Result<usize> {
        self.inner.check()?;
        const GROUP: usize = 64;
        let mut sent = 0;
        for group in batch.chunks(GROUP) {
            let addrs: Vec<SockAddr> = group.iter().map(|(_, to)| SockAddr::from(*to)).collect();
            let mut iovs: Vec<libc::iovec> = group
                .iter()
                .map(|(buf, _)| libc::iovec {
                    iov_base: buf.as_ptr().cast_mut().cast(),
                    iov_len: buf.len(),
                })
                .collect();
            let mut msgs: Vec<libc::mmsghdr> = iovs
                .iter_mut()
                .zip(&addrs)
                .map(|(iov, addr)| {
                    // SAFETY: an all-zero `msghdr` is valid (no name, no
                    // control data, no flags); the fields that matter are
                    // set below.
                    let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
                    hdr.msg_name = addr.as_ptr().cast_mut().cast();
                    hdr.msg_namelen = addr.len();
                    hdr.msg_iov = iov;
                    hdr.msg_iovlen = 1;
                    libc::mmsghdr {
                        msg_hdr: hdr,
                        msg_len: 0,
                    }
                })
                .collect();
            // SAFETY: `msgs` holds `msgs.len()` headers whose name, iovec and
            // data pointers (into `addrs`, `iovs` and `batch`) stay valid
            // and unmoved for the call, which only reads them (and writes
            // each header's `msg_len`); the call does not keep them.
            let n = unsafe {
                libc::sendmmsg(
                    self.inner.raw(),
                    msgs.as_mut_ptr(),
                    msgs.len() as libc::c_uint,
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                return if sent == 0 { Err(e) } else { Ok(sent) };
            }
            sent += n as usize;
            if (n as usize) < group.len() {
                break;
            }
        }
        Ok(sent)
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

impl UdpSocket {
    /// Starts a multishot receive of datagrams into buffers of `ring`
    /// (`IORING_OP_RECVMSG` with `IORING_RECV_MULTISHOT`, Linux 6.0+): one
    /// armed receive takes datagram after datagram, each into a buffer of
    /// the ring, with no operation submitted per datagram. The ring must be
    /// one of whole buffers ([`BufRing::whole`]): with one the kernel
    /// consumes a part at a time, each receive fails with `InvalidInput`.
    ///
    /// Each buffer holds a 16-byte header and 28 bytes of sender address
    /// before the payload: a datagram longer than the ring's buffer size less
    /// 44 bytes is cut ([`RecvDatagram::is_truncated`]), its rest dropped by
    /// the kernel. When every buffer is held, the kernel ends the receive
    /// without losing a datagram (they wait in the socket) and it is armed
    /// again as soon as a buffer comes back.
    ///
    /// # Examples
    ///
    /// ```
    /// use mailring::buf::BufRing;
    /// use mailring::net::UdpSocket;
    /// let rt = mailring::Runtime::builder().shards(1).build()?;
    /// rt.block_on(async {
    ///     let a = UdpSocket::bind("127.0.0.1:0".parse().unwrap())?;
    ///     let b = UdpSocket::bind("127.0.0.1:0".parse().unwrap())?;
    ///     let ring = BufRing::whole(8, 2048)?;
    ///     let mut incoming = b.recv_from_multishot(&ring);
    ///     for word in ["one", "two"] {
    ///         a.send_to(word.as_bytes().to_vec(), b.local_addr()?).await.0?;
    ///     }
    ///     for word in ["one", "two"] {
    ///         let datagram = incoming.next().await.expect("armed")?;
    ///         assert_eq!(datagram.payload(), word.as_bytes());
    ///         assert_eq!(datagram.peer(), a.local_addr()?);
    ///     }
    ///     Ok::<_, std::io::Error>(())
    /// })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn recv_from_multishot(&self, ring: &BufRing) -> RecvFromMultishot<'_> {
        RecvFromMultishot {
            socket: self,
            receive: RingReceive::new(ring),
        }
    }
}

/// Room for the sender's address in each buffer of a multishot `recvmsg`:
/// a `sockaddr_in6`, the largest a UDP socket reports.
const NAME_ROOM: u32 = std::mem::size_of::<libc::sockaddr_in6>() as u32;

/// The header a multishot `recvmsg` is submitted with (the kernel reads its
/// name and control lengths); kept until the op's last CQE.
struct RecvMsgTemplate(libc::msghdr);

// SAFETY: the header's pointers are all null (only its lengths are set);
// nothing is reached through it.
unsafe impl Send for RecvMsgTemplate {}

impl RecvMsgTemplate {
    fn new() -> Box<RecvMsgTemplate> {
        // SAFETY: msghdr is plain data; all-zero (null pointers) is valid.
        let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
        hdr.msg_namelen = NAME_ROOM;
        Box::new(RecvMsgTemplate(hdr))
    }
}

/// A stream of datagrams from one multishot receive over a [`BufRing`]; see
/// [`UdpSocket::recv_from_multishot`]. Dropping it cancels the receive;
/// datagrams not yet received stay in the socket.
#[derive(Debug)]
pub struct RecvFromMultishot<'a> {
    socket: &'a UdpSocket,
    receive: RingReceive,
}

impl RecvFromMultishot<'_> {
    /// The next datagram; `None` only after an error that polling again
    /// would repeat (below), said once.
    ///
    /// # Errors
    ///
    /// The kernel's error (an ICMP error answer to an earlier send, such as
    /// `ConnectionRefused`, arrives here and the receive goes on), or
    /// `InvalidData` for a buffer the kernel filled in a shape this does
    /// not know; and, ending the receive, the shard-ownership error, a
    /// ring of another shard, or a ring the kernel consumes a part at a
    /// time (`InvalidInput`).
    pub async fn next(&mut self) -> Option<io::Result<RecvDatagram>> {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }

    /// Polls for the next datagram; see [`next`](Self::next).
    pub fn poll_next(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<io::Result<RecvDatagram>>> {
        if self.receive.is_finished() {
            return std::task::Poll::Ready(None);
        }
        // Errors that polling again would only repeat end the stream
        // after they are said once.
        if let Err(e) = self.socket.inner.check() {
            return self.receive.end_with(e);
        }
        let injected = crate::shard::with_current(|s| s.shared.config.multishot_recvmsg_errno);
        if let Some(errno) = injected.flatten() {
            return self.receive.end_with(io::Error::from_raw_os_error(errno));
        }
        if self.receive.ring().is_incremental() {
            // A datagram must start a buffer: the kernel fails a receive
            // whose rest of a buffer cannot hold the header and address.
            return self.receive.end_with(io::Error::new(
                io::ErrorKind::InvalidInput,
                "mailring: datagram receives need a ring of whole buffers (BufRing::whole), \
                 not one the kernel consumes a part at a time",
            ));
        }
        let inner = &self.socket.inner;
        let polled = self.receive.poll_next(cx, |ring| {
            let template = RecvMsgTemplate::new();
            let hdr: *const libc::msghdr = &template.0;
            let entry = opcode::RecvMsgMulti::new(Fd(inner.raw()), hdr, ring.group()).build();
            let keep: Box<dyn std::any::Any + Send> = Box::new(RingKeep {
                _fd: inner.fd.clone(),
                ring: ring.clone(),
                _hdr: Some(template),
            });
            // SAFETY: the receive writes only into buffers of the group it
            // names, this ring's, registered on this shard (checked by
            // `RingReceive::poll_next`); the header it reads is boxed in
            // `keep` (its address stable) and `keep` holds it, the ring and
            // the fd until the op's last CQE (`MultishotOp::submit`).
            unsafe { MultishotOp::submit(keep, recycle_buffer, entry) }
        });
        polled.map(|next| next.map(|got| got.and_then(RecvDatagram::parse)))
    }
}

/// A datagram a multishot receive took into a [`BufRing`] buffer, which
/// goes back to the ring when this drops.
pub struct RecvDatagram {
    buf: RecvBuf,
    payload: std::ops::Range<usize>,
    peer: SocketAddr,
    truncated: bool,
}

impl std::fmt::Debug for RecvDatagram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvDatagram")
            .field("peer", &self.peer)
            .field("len", &self.payload.len())
            .field("truncated", &self.truncated)
            .finish()
    }
}

impl RecvDatagram {
    /// Reads the kernel's `io_uring_recvmsg_out` layout: a header, the
    /// address room, then the payload.
    fn parse(buf: RecvBuf) -> io::Result<RecvDatagram> {
        let shape = || io::Error::new(io::ErrorKind::InvalidData, "unexpected recvmsg buffer");
        let mut template: libc::msghdr =
            // SAFETY: msghdr is plain data; all-zero is valid.
            unsafe { std::mem::zeroed() };
        template.msg_namelen = NAME_ROOM;
        let out = io_uring::types::RecvMsgOut::parse(&buf, &template).map_err(|()| shape())?;
        let peer = sockaddr_bytes_to_addr(out.name_data()).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidData, "datagram from a non-IP sender")
        })?;
        let payload = out.payload_data();
        let start = payload.as_ptr() as usize - buf.as_ptr() as usize;
        let range = start..start + payload.len();
        let truncated = out.is_payload_truncated();
        Ok(RecvDatagram {
            payload: range,
            peer,
            truncated,
            buf,
        })
    }

    /// The datagram's bytes (its first part when truncated).
    pub fn payload(&self) -> &[u8] {
        &self.buf[self.payload.clone()]
    }

    /// Who sent it.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Whether it was longer than the buffer's room and cut.
    pub fn is_truncated(&self) -> bool {
        self.truncated
    }
}

/// An IPv4 or IPv6 socket address from the bytes of a `sockaddr_in` or
/// `sockaddr_in6` (as the kernel lays them out).
fn sockaddr_bytes_to_addr(b: &[u8]) -> Option<SocketAddr> {
    let family = i32::from(u16::from_ne_bytes(b.get(0..2)?.try_into().ok()?));
    let port = u16::from_be_bytes(b.get(2..4)?.try_into().ok()?);
    match family {
        libc::AF_INET => {
            let ip: [u8; 4] = b.get(4..8)?.try_into().ok()?;
            Some(SocketAddr::from((ip, port)))
        }
        libc::AF_INET6 => {
            let flow = u32::from_be_bytes(b.get(4..8)?.try_into().ok()?);
            let ip: [u8; 16] = b.get(8..24)?.try_into().ok()?;
            let scope = u32::from_ne_bytes(b.get(24..28)?.try_into().ok()?);
            Some(SocketAddr::V6(std::net::SocketAddrV6::new(
                ip.into(),
                port,
                flow,
                scope,
            )))
        }
        _ => None,
    }
}

impl AsRawFd for UdpSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.raw()
    }
}

#[cfg(test)]
mod tests {
    use super::sockaddr_bytes_to_addr;

    #[test]
    fn kernel_socket_addresses_are_read_and_others_refused() {
        let mut v4 = vec![0u8; 16];
        v4[0..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        v4[2..4].copy_from_slice(&4242u16.to_be_bytes());
        v4[4..8].copy_from_slice(&[127, 0, 0, 9]);
        assert_eq!(
            sockaddr_bytes_to_addr(&v4),
            Some("127.0.0.9:4242".parse().unwrap())
        );
        let mut v6 = vec![0u8; 28];
        v6[0..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
        v6[2..4].copy_from_slice(&53u16.to_be_bytes());
        v6[23] = 1;
        assert_eq!(
            sockaddr_bytes_to_addr(&v6),
            Some("[::1]:53".parse().unwrap())
        );
        let mut unix = vec![0u8; 28];
        unix[0..2].copy_from_slice(&(libc::AF_UNIX as u16).to_ne_bytes());
        assert_eq!(sockaddr_bytes_to_addr(&unix), None);
        assert_eq!(sockaddr_bytes_to_addr(&v4[..6]), None);
        assert_eq!(sockaddr_bytes_to_addr(&v6[..20]), None);
        assert_eq!(sockaddr_bytes_to_addr(&[]), None);
    }
}
