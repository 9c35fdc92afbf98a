//! Direct descriptors: a connected socket held in a slot of its shard's
//! registered file table ([`DirectStream`]), used by slot (`IOSQE_FIXED_FILE`:
//! no `fget` per operation) and moved to another shard's ring with
//! `IORING_MSG_SEND_FD` ([`DirectStream::send_to_shard`], redeemed there with
//! [`DirectTicket::receive`]).
//!
//! A direct descriptor has no process descriptor: what needs one (the peer's
//! address, socket options) is read before it becomes direct and kept beside
//! it. It does not show in `/proc/self/fd`; `ShardStats::direct_descriptors`
//! counts the occupied slots instead. The table comes from
//! `Builder::direct_descriptors`; without one, or on kernels before 6.0 for
//! moves, these calls fail with `Unsupported` and callers keep plain
//! descriptors.

use std::io;
use std::net::{Shutdown, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

use io_uring::opcode;
use io_uring::types::{DestinationSlot, Fd, Fixed};

use super::{StreamCore, TcpStream};
use crate::buf::{IoBuf, IoBufMut};
use crate::driver::{token, KIND_FD_ARRIVAL};
use crate::op::{wrong_shard, Op, OpFile};
use crate::shard::with_current;
use crate::{Handle, ShardId};

/// `IORING_MSG_RING_CQE_SKIP`: a `MSG_RING` that posts no completion to
/// the target ring.
const MSG_RING_CQE_SKIP: u32 = 1;

/// A slot of one shard's table.
#[derive(Debug)]
pub(crate) struct Slot {
    slot: u32,
    runtime: u64,
    shard: usize,
}

impl OpFile for Slot {
    type Raw = RawFd;
    type Keep = ();
    const FIXED: bool = true;

    fn check(&self) -> io::Result<()> {
        match with_current(|s| s.runtime_id() == self.runtime && s.index() == self.shard) {
            Some(true) => Ok(()),
            _ => Err(wrong_shard()),
        }
    }
    fn raw(&self) -> RawFd {
        self.slot as RawFd
    }
    fn keep(&self) {}
}

/// The refusal to move a stream whose dropped `recv`s took bytes no `recv`
/// has reported yet: its next `recv` reports them, then it may move.
fn unreported_loss<F: crate::op::OpFile<Raw = RawFd>>(core: &StreamCore<F>) -> io::Result<()> {
    match core.unreported_loss() {
        0 => Ok(()),
        n => Err(io::Error::other(format!(
            "{n} bytes received by a dropped recv are not reported yet: the stream's next recv reports them, then it may move"
        ))),
    }
}

fn unsupported(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::Unsupported, format!("mailring: {what}"))
}

/// A connected TCP socket held by slot in this shard's direct-descriptor
/// table; see the module docs.
#[derive(Debug)]
pub struct DirectStream {
    core: StreamCore<Slot>,
    peer: Option<SocketAddr>,
    handle: Handle,
    /// Sent to another ring: this side's slot is closed already.
    moved: bool,
}

impl DirectStream {
    /// Moves `stream` into this shard's table (`IORING_OP_FILES_UPDATE`
    /// into a slot the kernel picks), keeping its peer address; its process
    /// descriptor is closed.
    ///
    /// # Errors
    ///
    /// `Unsupported` when the shard has no table, the kernel's error (e.g.
    /// `ENFILE`: the table is full), the shard-ownership error, or an
    /// abandoned operation still using the stream; the stream comes back
    /// with the error, for the caller to go on with it.
    pub async fn from_tcp(stream: TcpStream) -> Result<DirectStream, (io::Error, TcpStream)> {
        let peer = stream.peer_addr().ok();
        let Some((handle, table)) = with_current(|s| {
            (
                Handle::try_current().expect("on a shard"),
                s.features().direct_descriptors,
            )
        }) else {
            return Err((wrong_shard(), stream));
        };
        if table == 0 {
            return Err((
                unsupported(
                    "this shard has no direct-descriptor table (Builder::direct_descriptors)",
                ),
                stream,
            ));
        }
        if let Err(e) = stream.core.inner.check() {
            return Err((e, stream));
        }
        if let Err(e) = unreported_loss(&stream.core) {
            return Err((e, stream));
        }
        let fd: OwnedFd = match stream.core.into_owned() {
            Ok(fd) => fd,
            Err(core) => {
                return Err((
                    io::Error::other("an abandoned operation still uses the stream"),
                    TcpStream { core },
                ))
            }
        };
        let fds = Box::new([fd.as_raw_fd()]);
        // SAFETY: the SQE reads one descriptor number from the box (heap,
        // owned by the op until its CQE) and writes the slot back there;
        // `fd` stays open in the op until then.
        let op = unsafe {
            Op::submit((fds, fd), Some(close_unclaimed_slot), |(fds, _)| {
                opcode::FilesUpdate::new(fds.as_ptr(), 1)
                    .offset(-1) // IORING_FILE_INDEX_ALLOC
                    .build()
            })
        }
        .expect("checked to be on the stream's shard");
        let (res, (fds, fd)) = op.await;
        if let Err(e) = res {
            return match TcpStream::from_std(std::net::TcpStream::from(fd)) {
                Ok(stream) => Err((e, stream)),
                Err(_) => unreachable!("adopting on the shard the stream came from"),
            };
        }
        // The table holds its own reference now.
        drop(fd);
        let slot = fds[0] as u32;
        let (runtime, shard) = with_current(|s| {
            s.note_direct_opened();
            (s.runtime_id(), s.index())
        })
        .expect("checked to be on the stream's shard");
        Ok(DirectStream {
            core: StreamCore::new(Slot {
                slot,
                runtime,
                shard,
            }),
            peer,
            handle,
            moved: false,
        })
    }

    /// The peer's address, read before the socket became direct.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer
    }

    /// The slot in the table.
    pub fn slot(&self) -> u32 {
        self.core.inner.slot
    }

    /// Sends some of `buf`'s bytes; returns how many.
    pub async fn send<B: IoBuf>(&self, buf: B) -> (io::Result<usize>, B) {
        self.core.send_from(buf, 0).await
    }

    /// Sends all of `buf`'s bytes, continuing after short sends.
    ///
    /// # Errors
    ///
    /// The kernel's error; `WriteZero` if nothing is accepted.
    pub async fn send_all<B: IoBuf>(&self, buf: B) -> (io::Result<()>, B) {
        self.core.send_all(buf).await
    }

    /// Receives into `buf` (from its start); 0 means the peer closed. The
    /// rules of `TcpStream::recv` on dropping a pending receive apply.
    pub async fn recv<B: IoBufMut>(&self, buf: B) -> (io::Result<usize>, B) {
        self.core.recv(buf).await
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

    /// Sends the socket to shard `target`'s ring (`IORING_MSG_SEND_FD` into
    /// a slot the kernel picks there) and closes this shard's slot. The
    /// ticket, which may travel to `target` any way (a closure, a job, a
    /// message), gives the stream back there with
    /// [`DirectTicket::receive`]. Operations whose futures were dropped
    /// may still be in flight here: the stream there goes on counting them
    /// (a send of it does not overtake one, and bytes a dropped `recv`
    /// took are reported by its next `recv`).
    ///
    /// # Errors
    ///
    /// `Unsupported` (kernel before 6.0), an unknown shard, or the kernel's
    /// error (`ENFILE`: the target's table is full); the stream comes back
    /// with the error. After `EOVERFLOW` (the kernel put the socket in the
    /// target's table but could not tell the target, which only happens
    /// when it cannot allocate even an overflowed completion) the stream
    /// comes back shut down in both directions: nobody can reach the
    /// target's copy, whose slot stays taken until the runtime ends.
    pub async fn send_to_shard(
        mut self,
        target: ShardId,
    ) -> Result<DirectTicket, (io::Error, DirectStream)> {
        static MOVES: AtomicU64 = AtomicU64::new(1);
        let ring_fd = with_current(|s| {
            if !s.features().msg_ring_send_fd {
                return Err(unsupported(
                    "the kernel cannot send direct descriptors between rings (6.0+)",
                ));
            }
            s.shared
                .shards
                .get(target.index())
                .map(|t| (t.target.ring_fd, s.shared.config.unannounced_fd_moves))
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("no shard {}", target.index()),
                    )
                })
        });
        let (ring_fd, unannounced) = match ring_fd {
            Some(Ok(fd)) => fd,
            Some(Err(e)) => return Err((e, self)),
            None => return Err((wrong_shard(), self)),
        };
        if let Err(e) = self.core.inner.check() {
            return Err((e, self));
        }
        if let Err(e) = unreported_loss(&self.core) {
            return Err((e, self));
        }
        let id = MOVES.fetch_add(1, Ordering::Relaxed) & ((1 << 56) - 1);
        let slot = self.slot();
        // SAFETY: a MSG_RING entry refers to no memory: the target ring's fd
        // (open while the runtime lives) and our own table's slot.
        let op = unsafe {
            Op::submit(
                (id, target, self.handle.clone()),
                Some(abandon_unclaimed_move),
                |_| {
                    opcode::MsgRingSendFd::new(
                        Fd(ring_fd),
                        Fixed(slot),
                        DestinationSlot::auto_target(),
                        token(KIND_FD_ARRIVAL, id),
                    )
                    // The fault injection's: no completion for the target.
                    .opcode_flags(if unannounced { MSG_RING_CQE_SKIP } else { 0 })
                    .build()
                },
            )
        };
        let res = match op {
            Ok(op) => op.await.0,
            Err(e) => Err(e),
        };
        let res = match res {
            Ok(_) if unannounced => Err(io::Error::from_raw_os_error(libc::EOVERFLOW)),
            res => res,
        };
        if let Err(e) = res {
            if e.raw_os_error() == Some(libc::EOVERFLOW) {
                // The target's table holds the socket, but the target was
                // not told where (its completion could not be posted), so
                // nobody can reach it there: shut the socket down, so its
                // peer sees the end rather than waiting for ever. The slot
                // there stays taken until the runtime ends.
                let _ = self.shutdown(Shutdown::Both).await;
            }
            return Err((e, self));
        }
        // The target holds its own reference: this side's slot goes.
        let _ = with_current(|s| s.close_direct(slot));
        self.moved = true;
        Ok(DirectTicket {
            id,
            target,
            peer: self.peer,
            handle: self.handle.clone(),
            redeemed: false,
            book: self.core.book.clone(),
        })
    }
}

impl DirectStream {
    /// Gives the socket back as a plain [`TcpStream`] of this shard: the
    /// kernel installs a process descriptor for it
    /// (`IORING_OP_FIXED_FD_INSTALL`, close-on-exec, kernel 6.8+) and the
    /// slot is closed. What a move that found the target's table full falls
    /// back on: the stream then travels as a plain descriptor. Operations
    /// whose futures were dropped still count on the plain stream (as for
    /// [`send_to_shard`](Self::send_to_shard)).
    ///
    /// # Errors
    ///
    /// `Unsupported` (a kernel without the operation), the shard-ownership
    /// error, or the kernel's error (`EMFILE`: no process descriptor
    /// free); the stream comes back with the error.
    pub async fn into_tcp(self) -> Result<TcpStream, (io::Error, DirectStream)> {
        match with_current(|s| s.features().op_fixed_fd_install) {
            None => return Err((wrong_shard(), self)),
            Some(false) => {
                return Err((
                    unsupported(
                        "the kernel cannot make a direct descriptor a process descriptor \
                         (IORING_OP_FIXED_FD_INSTALL, 6.8+)",
                    ),
                    self,
                ))
            }
            Some(true) => {}
        }
        if let Err(e) = self.core.inner.check() {
            return Err((e, self));
        }
        if let Err(e) = unreported_loss(&self.core) {
            return Err((e, self));
        }
        let slot = self.slot();
        // SAFETY: the entry refers to no memory, only to our table's slot;
        // a descriptor installed for a future dropped before it took the
        // result is closed by the cleanup.
        let op = unsafe {
            Op::submit((), Some(close_installed_fd), |_| {
                opcode::FixedFdInstall::new(Fixed(slot), 0).build()
            })
        };
        let res = match op {
            Ok(op) => op.await.0,
            Err(e) => Err(e),
        };
        let raw = match res {
            Ok((raw, _)) => raw as RawFd,
            Err(e) => return Err((e, self)),
        };
        // SAFETY: the kernel installed `raw` for this op: a new descriptor
        // that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        match TcpStream::from_std(std::net::TcpStream::from(fd)) {
            // The descriptor holds the socket now: the slot goes (`Drop`).
            // Operations abandoned on the slot still count on the socket
            // (a send they would overtake, bytes a dropped recv took).
            Ok(mut stream) => {
                stream.core.share_book_of(&self.core);
                Ok(stream)
            }
            // Not reached (checked to be on the stream's shard); the slot
            // still holds the socket.
            Err(e) => Err((e, self)),
        }
    }
}

impl Drop for DirectStream {
    fn drop(&mut self) {
        if self.moved {
            return;
        }
        let Slot {
            slot,
            runtime,
            shard,
        } = self.core.inner;
        let here = with_current(|s| {
            (s.runtime_id() == runtime && s.index() == shard).then(|| s.close_direct(slot))
        })
        .flatten();
        if here.is_none() {
            // Dropped off its shard: the slot is closed at home.
            self.handle.run_on(ShardId::new(shard), move || {
                let _ = with_current(|s| s.close_direct(slot));
            });
        }
    }
}

/// A [`DirectStream`] on its way to another shard; see
/// [`DirectStream::send_to_shard`]. Dropping it unredeemed closes the slot
/// on the target.
#[derive(Debug)]
pub struct DirectTicket {
    id: u64,
    target: ShardId,
    peer: Option<SocketAddr>,
    handle: Handle,
    redeemed: bool,
    /// The socket's operations still on the sending ring (abandoned ones)
    /// and bytes dropped `recv`s took: the stream goes on counting them.
    book: std::sync::Arc<super::OpBook>,
}

impl DirectTicket {
    /// The shard the stream was sent to.
    pub fn target(&self) -> ShardId {
        self.target
    }

    /// The stream, on the target shard, once its descriptor arrived.
    ///
    /// # Errors
    ///
    /// The move's error (as the kernel posted it), or the shard-ownership
    /// error when called elsewhere than on the target.
    pub async fn receive(mut self) -> io::Result<DirectStream> {
        self.redeemed = true;
        let (id, target) = (self.id, self.target);
        let on_target =
            with_current(|s| s.index() == target.index() && s.runtime_id() == self.handle.id());
        if on_target != Some(true) {
            self.redeemed = false;
            return Err(wrong_shard());
        }
        // Gives the slot up if this future is dropped while waiting.
        struct Waiting(Option<u64>);
        impl Drop for Waiting {
            fn drop(&mut self) {
                if let Some(id) = self.0 {
                    let _ = with_current(|s| s.abandon_arrival(id));
                }
            }
        }
        let mut waiting = Waiting(Some(id));
        let res = std::future::poll_fn(|cx| {
            with_current(|s| s.poll_arrival(id, cx)).unwrap_or(std::task::Poll::Ready(-libc::EBADF))
        })
        .await;
        waiting.0 = None;
        if res < 0 {
            return Err(io::Error::from_raw_os_error(-res));
        }
        let runtime = self.handle.id();
        let mut core = StreamCore::new(Slot {
            slot: res as u32,
            runtime,
            shard: target.index(),
        });
        core.book = self.book.clone();
        Ok(DirectStream {
            core,
            peer: self.peer,
            handle: self.handle.clone(),
            moved: false,
        })
    }
}

/// The cleanup of a `FILES_UPDATE` into a slot whose future was dropped
/// before it took the result: the slot the kernel filled is closed (its
/// socket with it), as if the stream had been made and dropped.
fn close_unclaimed_slot(res: i32, _flags: u32, resources: &dyn std::any::Any) {
    if res < 0 {
        return;
    }
    // A single-shot op's resources are kept as an `Option` of its own.
    if let Some(Some((fds, _))) = resources.downcast_ref::<Option<(Box<[RawFd; 1]>, OwnedFd)>>() {
        let slot = fds[0] as u32;
        let _ = with_current(|s| {
            s.note_direct_opened();
            s.close_direct(slot)
        });
    } else {
        debug_assert!(false, "a files-update op kept other resources");
    }
}

/// The cleanup of a descriptor install whose future was dropped before it
/// took the result: the descriptor it made is closed (the slot still holds
/// the socket, and the stream closes it).
fn close_installed_fd(res: i32, _flags: u32, _resources: &dyn std::any::Any) {
    if res >= 0 {
        // SAFETY: `res` is the descriptor the install made for us, which no
        // poll handed out (a cleanup runs only on results nobody takes).
        drop(unsafe { OwnedFd::from_raw_fd(res) });
    }
}

/// The cleanup of a move to another ring whose future was dropped before
/// it took the result: the slot sent there has no ticket to redeem it, so
/// the target closes it.
fn abandon_unclaimed_move(res: i32, _flags: u32, resources: &dyn std::any::Any) {
    if res < 0 {
        return;
    }
    if let Some(Some((id, target, handle))) =
        resources.downcast_ref::<Option<(u64, ShardId, Handle)>>()
    {
        let id = *id;
        handle.run_on(*target, move || {
            let _ = with_current(|s| s.abandon_arrival(id));
        });
    } else {
        debug_assert!(false, "a move op kept other resources");
    }
}

impl Drop for DirectTicket {
    fn drop(&mut self) {
        if !self.redeemed {
            let id = self.id;
            self.handle.run_on(self.target, move || {
                let _ = with_current(|s| s.abandon_arrival(id));
            });
        }
    }
}
