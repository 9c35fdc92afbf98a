//! Provided buffer rings (`IORING_REGISTER_PBUF_RING`) and the buffers they
//! hand out to multishot receives.
//!
//! A [`BufRing`] is a group of equal-sized buffers registered with one shard's
//! ring. A multishot receive picks a free buffer per completion; the
//! [`RecvBuf`] it yields gives the buffer back to the ring when dropped. Many
//! connections can share one ring, so memory scales with the data in flight,
//! not with the number of connections.
//!
//! Where the kernel has it (Linux 6.12+), the ring is registered with
//! incremental consumption (`IOU_PBUF_RING_INC`): a completion uses only the
//! bytes it needs and the next one continues in the same buffer
//! (`IORING_CQE_F_BUF_MORE`), so small messages do not each take a whole
//! buffer. A buffer then goes back to the kernel once the kernel is done with
//! it and every [`RecvBuf`] cut from it has been dropped.
//!
//! The ring memory and the buffers are freed only once no operation can use
//! them: every multishot receive holds the ring until its last CQE.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::fmt;
use std::io;
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Waker;

use io_uring::types::BufRingEntry;

use crate::runtime::Handle;
use crate::shard::with_current;

/// A provided-buffer ring registered on the current shard; cheap to clone.
///
/// # Examples
///
/// ```
/// use mailring::buf::BufRing;
/// use mailring::net::UnixStream;
/// let rt = mailring::Runtime::builder().shards(1).build()?;
/// let got = rt.block_on(async {
///     let ring = BufRing::new(16, 4096)?;
///     let (a, b) = UnixStream::pair()?;
///     a.send_all(b"hello".to_vec()).await.0?;
///     let mut incoming = b.recv_multishot(&ring);
///     let buf = incoming.next().await.expect("data")?;
///     Ok::<_, std::io::Error>(buf.to_vec())
/// })?;
/// assert_eq!(got, b"hello");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct BufRing {
    inner: Arc<Inner>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Slices {
    offset: usize,
    refs: u32,
    kernel_done: bool,
}

/// The kernel will put more data into this buffer (incremental rings).
const CQE_F_BUF_MORE: u32 = 1 << 4;

struct Inner {
    ring: NonNull<BufRingEntry>,
    ring_layout: Layout,
    bufs: NonNull<u8>,
    bufs_layout: Layout,
    entries: u16,
    buf_size: usize,
    group: u16,
    /// Buffers handed to the kernel so far (our copy of the ring's tail).
    tail: AtomicU16,
    /// Buffers the kernel has used (completions that selected one).
    consumed: AtomicU16,
    /// Receives waiting for a buffer to come back.
    waiters: Mutex<Vec<Waker>>,
    /// Incremental consumption accepted by the kernel.
    incremental: bool,
    /// Per buffer, with incremental consumption: where the next completion's
    /// data starts, how many `RecvBuf`s point into it, and whether the kernel
    /// is done with it.
    slices: Mutex<Vec<Slices>>,
    runtime: u64,
    shard: usize,
    handle: Handle,
}

// SAFETY: the ring entries are written only by `provide`, on the owning
// shard's thread (its callers: `new`, and `release`, reached from a `RecvBuf`
// dropped there or sent there with `run_on`); the buffers are written only by
// the kernel; the rest is atomics and mutexes. The memory is freed only on
// the owning shard (`Drop` leaks it elsewhere).
unsafe impl Send for Inner {}
// SAFETY: as for `Send`; from other threads, `&Inner` reads only the atomics,
// the mutexes and, through a `RecvBuf`'s `Deref`, the bytes of a buffer that
// nobody writes until that `RecvBuf` is dropped.
unsafe impl Sync for Inner {}

impl fmt::Debug for BufRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufRing")
            .field("group", &self.inner.group)
            .field("entries", &self.inner.entries)
            .field("buf_size", &self.inner.buf_size)
            .finish()
    }
}

impl BufRing {
    /// Registers `entries` buffers of `buf_size` bytes on the current shard.
    ///
    /// # Errors
    ///
    /// `InvalidInput` unless `entries` is a power of two up to 32768 and
    /// `buf_size` is non-zero; the kernel's error (e.g. `EINVAL` before Linux
    /// 5.19); an error outside a mailring shard.
    pub fn new(entries: u16, buf_size: usize) -> io::Result<BufRing> {
        BufRing::register(entries, buf_size, true)
    }

    /// Registers `entries` buffers of `buf_size` bytes on the current shard,
    /// each taken whole by one completion (never consumed a part at a time,
    /// as [`new`](Self::new) lets kernels 6.12+ do): what datagram receives
    /// ([`UdpSocket::recv_from_multishot`](crate::net::UdpSocket::recv_from_multishot))
    /// need, as each datagram must start a buffer of its own.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    pub fn whole(entries: u16, buf_size: usize) -> io::Result<BufRing> {
        BufRing::register(entries, buf_size, false)
    }

    fn register(entries: u16, buf_size: usize, incremental: bool) -> io::Result<BufRing> {
        if !entries.is_power_of_two()
            || entries > 32768
            || buf_size == 0
            || buf_size > u32::MAX as usize
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a buffer ring needs a power-of-two entry count up to 32768 and a non-zero buffer size",
            ));
        }
        let invalid = |_| io::Error::new(io::ErrorKind::InvalidInput, "buffer ring too large");
        let ring_layout = Layout::from_size_align(
            usize::from(entries) * std::mem::size_of::<BufRingEntry>(),
            4096,
        )
        .map_err(invalid)?;
        let bufs_layout =
            Layout::from_size_align(usize::from(entries) * buf_size, 64).map_err(invalid)?;
        // SAFETY: both layouts have a non-zero size.
        let (ring, bufs) = unsafe { (alloc_zeroed(ring_layout), alloc_zeroed(bufs_layout)) };
        let (Some(ring), Some(bufs)) = (
            NonNull::new(ring.cast::<BufRingEntry>()),
            NonNull::new(bufs),
        ) else {
            return Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                "cannot allocate a buffer ring",
            ));
        };
        let registered = with_current(|shard| {
            // SAFETY: `ring` points to `entries` zeroed, page-aligned entries,
            // freed only by `Inner`'s drop on this shard after the kernel
            // unregistered the group; dropped anywhere else (or when the
            // unregistration fails) they are leaked.
            let group =
                unsafe { shard.register_buf_ring(ring.as_ptr() as u64, entries, incremental) };
            group.map(|(g, inc)| (g, inc, shard.runtime_id(), shard.index()))
        });
        let (group, incremental, runtime, shard) = match registered {
            Some(Ok(v)) => v,
            other => {
                // SAFETY: allocated above with these layouts; the kernel never saw them.
                unsafe {
                    dealloc(ring.as_ptr().cast(), ring_layout);
                    dealloc(bufs.as_ptr(), bufs_layout);
                }
                return Err(match other {
                    Some(Err(e)) => e,
                    _ => crate::op::wrong_shard(),
                });
            }
        };
        let handle = Handle::current();
        let inner = Arc::new(Inner {
            ring,
            ring_layout,
            bufs,
            bufs_layout,
            entries,
            buf_size,
            group,
            tail: AtomicU16::new(0),
            consumed: AtomicU16::new(0),
            waiters: Mutex::new(Vec::new()),
            incremental,
            slices: Mutex::new(vec![Slices::default(); usize::from(entries)]),
            runtime,
            shard,
            handle,
        });
        for bid in 0..entries {
            inner.provide(bid);
        }
        Ok(BufRing { inner })
    }

    /// Whether the kernel consumes buffers incrementally (`IOU_PBUF_RING_INC`).
    pub fn is_incremental(&self) -> bool {
        self.inner.incremental
    }

    /// The group id receives name.
    pub fn group(&self) -> u16 {
        self.inner.group
    }

    /// The size of each buffer.
    pub fn buf_size(&self) -> usize {
        self.inner.buf_size
    }

    /// The number of buffers.
    pub fn entries(&self) -> u16 {
        self.inner.entries
    }

    pub(crate) fn on_owner(&self) -> bool {
        self.inner.on_owner()
    }

    /// Buffers currently in the kernel's hands.
    pub(crate) fn available(&self) -> u16 {
        let i = &self.inner;
        i.tail
            .load(Ordering::Relaxed)
            .wrapping_sub(i.consumed.load(Ordering::Relaxed))
    }

    /// Buffers the kernel itself still holds, as it says (Linux 6.8 and
    /// later; `None` where it cannot say). Unlike [`BufRing::available`], a
    /// buffer the kernel filled but whose completion nobody has taken yet
    /// (another receive's, queued) is not counted. Owner shard only.
    pub(crate) fn kernel_available(&self) -> Option<u16> {
        let head = with_current(|s| s.buf_ring_head(self.inner.group).ok()).flatten()?;
        Some(self.inner.tail.load(Ordering::Relaxed).wrapping_sub(head))
    }

    /// The ring's tail: it moves each time a buffer is given back.
    pub(crate) fn tail(&self) -> u16 {
        self.inner.tail.load(Ordering::Relaxed)
    }

    /// Wraps the data a completion put into buffer `bid` (owner shard only).
    pub(crate) fn take(&self, bid: u16, len: usize, flags: u32) -> RecvBuf {
        let inner = &self.inner;
        let mut offset = 0;
        if inner.incremental {
            let mut slices = inner.slices.lock().unwrap_or_else(|p| p.into_inner());
            let s = &mut slices[usize::from(bid)];
            // Bounded by the buffer whatever the kernel reports, so a
            // `RecvBuf` never points past its buffer.
            offset = s.offset.min(inner.buf_size);
            s.offset = offset.saturating_add(len).min(inner.buf_size);
            s.refs += 1;
            // A completion of no bytes never finishes a buffer: kernels
            // from 6.12 until a 2026 fix post one at the end of a stream
            // without `BUF_MORE` but leave the buffer at the ring's head,
            // still the kernel's; providing it again would put it in the
            // ring twice.
            if flags & CQE_F_BUF_MORE == 0 && len > 0 {
                s.kernel_done = true;
                inner.consumed.fetch_add(1, Ordering::Relaxed);
            }
        } else {
            inner.consumed.fetch_add(1, Ordering::Relaxed);
        }
        let len = len.min(inner.buf_size.saturating_sub(offset));
        RecvBuf {
            ring: self.clone(),
            bid,
            offset,
            len,
        }
    }

    /// Drops the data a completion put into buffer `bid`, nobody will read it.
    pub(crate) fn discard(&self, bid: u16, len: usize, flags: u32) {
        drop(self.take(bid, len, flags));
    }

    pub(crate) fn wait_for_buffer(&self, waker: &Waker) {
        let mut waiters = self.inner.waiters.lock().unwrap_or_else(|p| p.into_inner());
        if !waiters.iter().any(|w| w.will_wake(waker)) {
            waiters.push(waker.clone());
        }
    }
}

impl Inner {
    fn on_owner(&self) -> bool {
        with_current(|s| s.runtime_id() == self.runtime && s.index() == self.shard).unwrap_or(false)
    }

    /// A `RecvBuf` cut from buffer `bid` was dropped. Owner shard only.
    fn release(&self, bid: u16) {
        if self.incremental {
            let mut slices = self.slices.lock().unwrap_or_else(|p| p.into_inner());
            let s = &mut slices[usize::from(bid)];
            s.refs -= 1;
            if s.refs > 0 || !s.kernel_done {
                return;
            }
            *s = Slices::default();
        }
        self.provide(bid);
    }

    /// Hands buffer `bid` to the kernel. Owner shard only.
    fn provide(&self, bid: u16) {
        debug_assert!(self.on_owner());
        let tail = self.tail.load(Ordering::Relaxed);
        let index = usize::from(tail & (self.entries - 1));
        // SAFETY: `index < entries`; only this thread writes entries, and the
        // kernel reads only entries between its head and the published tail,
        // which this slot is not part of until the store below.
        unsafe {
            let entry = &mut *self.ring.as_ptr().add(index);
            entry.set_addr(self.bufs.as_ptr().add(usize::from(bid) * self.buf_size) as u64);
            entry.set_len(self.buf_size as u32);
            entry.set_bid(bid);
        }
        let next = tail.wrapping_add(1);
        self.tail.store(next, Ordering::Relaxed);
        // SAFETY: the tail is the u16 the kernel reads at the ring's start; it is
        // aligned and lives as long as the ring memory. Release publishes the entry.
        unsafe {
            let shared_tail = &*(BufRingEntry::tail(self.ring.as_ptr()) as *const AtomicU16);
            shared_tail.store(next, Ordering::Release);
        }
        let waiters = std::mem::take(&mut *self.waiters.lock().unwrap_or_else(|p| p.into_inner()));
        waiters.into_iter().for_each(Waker::wake);
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if !self.on_owner() {
            // Off the owning shard the kernel may still read the ring: keep the
            // memory (the ring's closing at shutdown releases the registration).
            return;
        }
        let unregistered =
            with_current(|s| s.unregister_buf_ring(self.group).is_ok()).unwrap_or(false);
        if unregistered {
            // SAFETY: no operation holds the ring any more (each keeps a clone until
            // its last CQE) and the kernel forgot the group: the memory is ours.
            unsafe {
                dealloc(self.ring.as_ptr().cast(), self.ring_layout);
                dealloc(self.bufs.as_ptr(), self.bufs_layout);
            }
        }
    }
}

/// A received buffer from a [`BufRing`]; returns to the ring when dropped.
pub struct RecvBuf {
    ring: BufRing,
    bid: u16,
    offset: usize,
    len: usize,
}

impl fmt::Debug for RecvBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecvBuf")
            .field("bid", &self.bid)
            .field("len", &self.len)
            .finish()
    }
}

impl Deref for RecvBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        let inner = &self.ring.inner;
        // SAFETY: the kernel wrote `len` bytes at `offset` of buffer `bid`
        // (`offset + len <= buf_size`) and does not write that range again until
        // the buffer is provided anew, which waits for this `RecvBuf` to drop.
        unsafe {
            std::slice::from_raw_parts(
                inner
                    .bufs
                    .as_ptr()
                    .add(usize::from(self.bid) * inner.buf_size + self.offset),
                self.len,
            )
        }
    }
}

impl Drop for RecvBuf {
    fn drop(&mut self) {
        if self.ring.on_owner() {
            self.ring.inner.release(self.bid);
        } else {
            let (ring, bid) = (self.ring.clone(), self.bid);
            let shard = crate::ShardId::new(ring.inner.shard);
            ring.inner
                .handle
                .clone()
                .run_on(shard, move || ring.inner.release(bid));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_completion_of_no_bytes_leaves_an_incremental_buffer_with_the_kernel() {
        let rt = crate::Runtime::builder()
            .shards(1)
            .build()
            .expect("io_uring runtime");
        rt.block_on(async {
            let ring = BufRing::new(4, 64).expect("a buffer ring");
            if !ring.is_incremental() {
                // Kernels before 6.12 take buffers whole.
                return;
            }
            let provided = ring.available();
            let tail = || ring.inner.tail.load(Ordering::Relaxed);
            let published = tail();
            // A stream's end on kernels that post it with the buffer id and
            // no `BUF_MORE`: the buffer stays the kernel's, never provided
            // again (the tail never moves) while the kernel still holds it
            // at the ring's head.
            for _ in 0..3 {
                drop(ring.take(0, 0, 0));
                assert_eq!(ring.available(), provided);
                assert_eq!(tail(), published, "buffer 0 provided twice");
            }
            // Offsets never pass the buffer, whatever a completion says.
            let first = ring.take(1, 100, CQE_F_BUF_MORE);
            assert_eq!((first.offset, first.len), (0, 64));
            let second = ring.take(1, 10, CQE_F_BUF_MORE);
            assert_eq!((second.offset, second.len), (64, 0));
            drop((first, second));
            // A buffer the kernel finished goes back once its data is dropped.
            let last = ring.take(2, 8, 0);
            assert_eq!(ring.available(), provided - 1);
            drop(last);
            assert_eq!(ring.available(), provided);
        });
    }
}
