//! `sendmsg`/`recvmsg` on the ring, for datagram sockets.

use std::io;
use std::mem::MaybeUninit;

use io_uring::opcode;
use io_uring::types::Fd;
use socket2::{SockAddr, SockAddrStorage};

use crate::buf::{IoBuf, IoBufMut};
use crate::op::{Op, ShardFd};

/// A message header, its one iovec and its address, in one heap allocation
/// whose internal pointers stay valid while the box is not freed.
struct Msg {
    hdr: libc::msghdr,
    iov: libc::iovec,
    addr: MaybeUninit<SockAddrStorage>,
}

struct MsgBox(Box<Msg>);

// SAFETY: the raw pointers inside point into this same allocation and into the
// buffer the operation owns beside it; only the kernel dereferences them, while
// the op is in flight. The box may move to another thread with its op (polled
// or dropped off its shard), where only its plain fields are read after the
// CQE (`msg_namelen`, the address), never concurrently with anyone.
unsafe impl Send for MsgBox {}

impl MsgBox {
    fn new() -> MsgBox {
        // SAFETY: msghdr and iovec are plain data; all-zero is a valid value.
        let (hdr, iov) = unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        MsgBox(Box::new(Msg {
            hdr,
            iov,
            addr: MaybeUninit::zeroed(),
        }))
    }

    /// Points the header at the iovec (over `ptr`/`len`) and the address slot.
    fn prepare(
        &mut self,
        ptr: *mut u8,
        len: usize,
        name_len: libc::socklen_t,
    ) -> *mut libc::msghdr {
        let m = &mut *self.0;
        m.iov = libc::iovec {
            iov_base: ptr.cast(),
            iov_len: len,
        };
        m.hdr.msg_iov = &mut m.iov;
        m.hdr.msg_iovlen = 1;
        m.hdr.msg_name = m.addr.as_mut_ptr().cast();
        m.hdr.msg_namelen = name_len;
        &mut m.hdr
    }
}

/// Sends `buf`'s bytes as one datagram, to `to` or to the connected peer.
pub(crate) async fn send_msg<B: IoBuf>(
    fd: &ShardFd,
    buf: B,
    to: Option<&SockAddr>,
) -> (io::Result<usize>, B) {
    if let Err(e) = fd.check() {
        return (Err(e), buf);
    }
    let mut msg = MsgBox::new();
    let name_len = match to {
        Some(addr) => {
            let len = addr.len() as usize;
            // SAFETY: copies `len <= size_of::<SockAddrStorage>()` bytes of a valid
            // sockaddr into the box's address slot.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    addr.as_ptr().cast::<u8>(),
                    msg.0.addr.as_mut_ptr().cast::<u8>(),
                    len,
                )
            };
            addr.len()
        }
        None => 0,
    };
    let keep = fd.fd.clone();
    let raw = fd.raw();
    // SAFETY: the SQE reads the header, iovec and address in the box and the
    // buffer's initialised bytes (heap, stable), all owned by the op until its
    // CQE, and uses the socket kept by `keep`.
    let op = unsafe {
        Op::submit((buf, msg, keep), None, |(b, m, _)| {
            let hdr = m.prepare(b.stable_ptr().cast_mut(), b.bytes_init(), name_len);
            if name_len == 0 {
                (*hdr).msg_name = std::ptr::null_mut();
            }
            opcode::SendMsg::new(Fd(raw), hdr)
                .flags(libc::MSG_NOSIGNAL as u32)
                .build()
        })
    };
    let op = op.expect("checked to be on the socket's shard");
    let (res, (buf, _, _)) = op.await;
    (res.map(|(n, _)| n as usize), buf)
}

/// Receives one datagram into `buf`; returns its length and sender.
pub(crate) async fn recv_msg<B: IoBufMut>(
    fd: &ShardFd,
    buf: B,
) -> (io::Result<(usize, SockAddr)>, B) {
    if let Err(e) = fd.check() {
        return (Err(e), buf);
    }
    let msg = MsgBox::new();
    let keep = fd.fd.clone();
    let raw = fd.raw();
    let name_len = std::mem::size_of::<SockAddrStorage>() as libc::socklen_t;
    // SAFETY: the SQE writes into the buffer (up to its capacity) and the box's
    // address slot and header, all heap memory owned by the op until its CQE.
    let op = unsafe {
        Op::submit((buf, msg, keep), None, |(b, m, _)| {
            let len = b.bytes_total();
            let hdr = m.prepare(b.stable_mut_ptr(), len, name_len);
            opcode::RecvMsg::new(Fd(raw), hdr).build()
        })
    };
    let op = op.expect("checked to be on the socket's shard");
    let (res, (mut buf, msg, _)) = op.await;
    match res {
        Ok((n, _)) => {
            // SAFETY: the kernel wrote `n` bytes at the buffer's start.
            unsafe { buf.set_init(n as usize) };
            let m = &*msg.0;
            // SAFETY: the slot was zeroed at creation, so it is initialised,
            // and the kernel wrote the sender's address into it with its
            // length in `msg_namelen` (at most the slot's size).
            let from = unsafe { SockAddr::new(m.addr.assume_init_read(), m.hdr.msg_namelen) };
            (Ok((n as usize, from)), buf)
        }
        Err(e) => (Err(e), buf),
    }
}
