//! The ring driver: the one seam between the scheduler and the kernel.
//!
//! The scheduler ([`crate::shard`]) asks a driver for exactly these things:
//! queue a doorbell or a tiny message to another shard, arm one timer for the
//! nearest deadline, submit without waiting, block until something completes,
//! and hand back decoded [`Completion`]s. Nothing else of io_uring leaks out, so a
//! readiness-based driver (epoll + eventfd doorbells + a blocking pool) can be
//! added beside [`uring::UringDriver`] without touching the scheduler or the
//! actor layer.
//!
//! # Tokens
//!
//! Every SQE's `user_data` is a token whose top byte is its kind:
//!
//! | kind | meaning | rest |
//! | --- | --- | --- |
//! | 0 | reserved for the op table (native I/O) | slot + generation |
//! | [`KIND_DOORBELL`] | a doorbell arrived (target side) | 0 |
//! | [`KIND_TINY`] | a tiny message arrived (target side) | sender shard (bits 40..48), tag (bits 0..16); value in `res` |
//! | [`KIND_TIMER`] | the armed timeout fired or was removed | arm generation |
//! | [`KIND_EVENTFD`] | the external-wake eventfd was read | 0 |
//! | [`KIND_IGNORE`] | a completion nobody waits for (cancel, timeout removal) | 0 |
//! | [`KIND_DOORBELL_SENT`] | a doorbell failed on the sender side | target shard |
//! | [`KIND_TINY_SENT`] | a tiny message failed on the sender side | target (bits 48..56), tag (32..48), value (0..32) |
//! | [`KIND_FD_ARRIVAL`] | a direct descriptor arrived (`IORING_MSG_SEND_FD`, target side) | the move's id; the slot in `res` |

pub(crate) mod probe;
pub(crate) mod uring;

use std::io;
use std::time::Instant;

pub use probe::RingFeatures;

pub(crate) const KIND_SHIFT: u32 = 56;
pub(crate) const KIND_OP: u64 = 0;
pub(crate) const KIND_DOORBELL: u64 = 1;
pub(crate) const KIND_TINY: u64 = 2;
pub(crate) const KIND_TIMER: u64 = 3;
pub(crate) const KIND_EVENTFD: u64 = 4;
pub(crate) const KIND_IGNORE: u64 = 5;
pub(crate) const KIND_DOORBELL_SENT: u64 = 6;
pub(crate) const KIND_TINY_SENT: u64 = 7;
pub(crate) const KIND_FD_ARRIVAL: u64 = 8;

pub(crate) const fn token(kind: u64, rest: u64) -> u64 {
    (kind << KIND_SHIFT) | (rest & ((1 << KIND_SHIFT) - 1))
}

pub(crate) const fn kind_of(token: u64) -> u64 {
    token >> KIND_SHIFT
}

/// Where other threads send doorbells for one shard.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WakeTarget {
    /// The shard's ring fd: target of `IORING_OP_MSG_RING` from other shards.
    pub(crate) ring_fd: i32,
    /// The shard's eventfd, watched by an armed read.
    pub(crate) eventfd: i32,
    /// Whether outside threads may use `IORING_REGISTER_SEND_MSG_RING`.
    pub(crate) send_msg_ring: bool,
}

/// A decoded completion that the scheduler must act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Completion {
    /// An operation of the op table completed.
    Op {
        user_data: u64,
        res: i32,
        flags: u32,
    },
    /// A tiny message from another shard (or from outside, `from == u16::MAX`).
    Tiny { from: u16, tag: u16, value: u32 },
    /// A doorbell we sent could not be delivered; ring again.
    DoorbellFailed { target: usize },
    /// A tiny message we sent could not be delivered; deliver it another way.
    TinyFailed { target: usize, tag: u16, value: u32 },
    /// A direct descriptor sent by another ring arrived in slot `res` (or
    /// failed: `res < 0`); `id` names the move.
    FdArrived { id: u64, res: i32 },
}

/// What the scheduler needs from a ring driver (see the module docs).
pub(crate) trait ShardDriver {
    /// What the kernel accepted at setup.
    fn features(&self) -> &RingFeatures;
    /// Where other threads send this shard's doorbells.
    fn wake_target(&self) -> WakeTarget;
    /// Queues a doorbell to another shard's ring.
    fn queue_doorbell(&mut self, target_index: usize, target: &WakeTarget);
    /// Queues a tiny message to another shard's ring.
    fn queue_tiny(
        &mut self,
        from: usize,
        target_index: usize,
        target: &WakeTarget,
        tag: u16,
        value: u32,
    );
    /// Makes sure the ring wakes by `deadline` (keeps an earlier armed timeout).
    fn arm_timer(&mut self, deadline: Instant);
    /// Whether completions may be waiting (CQ non-empty, deferred task work, overflow).
    fn has_completions(&self) -> bool;
    /// Submits queued SQEs and runs deferred completions, without waiting.
    fn submit(&mut self) -> io::Result<()>;
    /// Submits and blocks until at least one completion arrives.
    fn wait(&mut self) -> io::Result<()>;
    /// Submits and blocks until at least one completion arrives or `limit`
    /// has passed (shutdown's bounded wait; needs no armed timer).
    fn wait_timeout(&mut self, limit: std::time::Duration) -> io::Result<()>;
    /// Consumes the completion queue, passing what matters to `sink`; returns how
    /// many CQEs were consumed.
    fn reap(&mut self, sink: &mut dyn FnMut(Completion)) -> usize;
    /// Operations whose CQE is still awaited.
    fn in_flight(&self) -> usize;
    /// Cancels every in-flight operation (shutdown, step 4).
    fn cancel_all(&mut self);
    /// Times the completion queue was found overflowed and flushed.
    fn cq_overflows(&self) -> u64;

    /// Closes a slot of the direct-descriptor table (the table's reference;
    /// operations in flight keep theirs).
    fn close_direct(&mut self, slot: u32) -> io::Result<()>;
    /// Queues the SQE of an operation of the op table.
    ///
    /// # Safety
    ///
    /// Every buffer, path or fd the entry refers to must stay valid until the
    /// operation's CQE has been reaped (the op, or its op-table slot, keeps
    /// them; what may never be reaped is leaked, see `Op::submit`).
    unsafe fn push_op(&mut self, entry: &io_uring::squeue::Entry);
    /// Queues an `ASYNC_CANCEL` for the operation with this `user_data`.
    fn queue_cancel(&mut self, user_data: u64);
    /// Registers a provided-buffer ring (`IORING_REGISTER_PBUF_RING`).
    ///
    /// # Safety
    ///
    /// `addr` must point to `entries` ring entries, page aligned, that stay
    /// valid until the group is unregistered or the ring is closed.
    unsafe fn register_buf_ring(
        &mut self,
        addr: u64,
        entries: u16,
        group: u16,
        flags: u16,
    ) -> io::Result<()>;
    /// Unregisters a provided-buffer ring.
    fn unregister_buf_ring(&mut self, group: u16) -> io::Result<()>;
    /// The kernel's head of provided-buffer ring `group`
    /// (`IORING_REGISTER_PBUF_STATUS`, Linux 6.8): the entries between it
    /// and the tail are buffers the kernel may still use.
    fn buf_ring_head(&mut self, group: u16) -> io::Result<u16>;
}
