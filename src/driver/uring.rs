//! The io_uring driver: one ring per shard, created and used on the shard's thread only.
//!
//! Owns the ring, the external-wake eventfd (with one read armed on it), and the
//! single armed `IORING_OP_TIMEOUT` that covers the shard's nearest timer
//! deadline. Every SQE it queues either refers to no memory (doorbells, tiny
//! messages, cancels) or to memory the driver owns and keeps until the
//! matching CQE: the eventfd read buffer and the timeout's timespec.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Instant;

use io_uring::types::{self, CancelBuilder, Fd, TimeoutFlags, Timespec};
use io_uring::{opcode, squeue, EnterFlags, IoUring};

use super::{
    kind_of, token, Completion, RingFeatures, ShardDriver, WakeTarget, KIND_DOORBELL,
    KIND_DOORBELL_SENT, KIND_EVENTFD, KIND_FD_ARRIVAL, KIND_IGNORE, KIND_OP, KIND_SHIFT,
    KIND_TIMER, KIND_TINY, KIND_TINY_SENT,
};
use crate::builder::{Builder, ExternalWake};
use crate::error::BuildError;

/// The io_uring implementation of [`ShardDriver`].
pub(crate) struct UringDriver {
    ring: IoUring,
    features: RingFeatures,
    eventfd: OwnedFd,
    /// Target of the armed eventfd read; lives until that read's CQE.
    eventfd_buf: Box<u64>,
    eventfd_armed: bool,
    /// The armed timeout: its deadline and generation.
    timer_armed: Option<(Instant, u64)>,
    timer_generation: u64,
    /// The armed timeout's absolute deadline; read by the kernel at submission.
    timer_ts: Box<Timespec>,
    timeouts_in_flight: usize,
    skip_success: squeue::Flags,
    cqes: Vec<(u64, i32, u32)>,
    /// Completions taken off the CQ to let a full SQ drain (see `push`);
    /// the next `reap` hands them out first, in order.
    stash: Vec<(u64, i32, u32)>,
    /// `FaultInjection::busy_while_completions_wait` left to inject.
    busy_faults: u32,
    cancelling: bool,
    overflows: u64,
}

impl UringDriver {
    /// Creates the ring of shard `shard`; must run on that shard's thread.
    pub(crate) fn new(builder: &Builder, shard: usize) -> Result<Self, BuildError> {
        let (ring, mut features) = super::probe::setup_ring(builder, shard)?;
        features.registered_ring_fd = ring.submitter().register_ring_fd().is_ok();
        // SAFETY: eventfd(2) has no memory arguments; the result is checked below.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if raw < 0 {
            return Err(BuildError::Setup {
                shard,
                source: io::Error::last_os_error(),
            });
        }
        // SAFETY: `raw` is a fresh eventfd that nothing else owns.
        let eventfd = unsafe { OwnedFd::from_raw_fd(raw) };
        let skip_success = if features.skip_cqe_on_success {
            squeue::Flags::SKIP_SUCCESS
        } else {
            squeue::Flags::empty()
        };
        let mut driver = UringDriver {
            ring,
            features,
            eventfd,
            eventfd_buf: Box::new(0),
            eventfd_armed: false,
            timer_armed: None,
            timer_generation: 0,
            timer_ts: Box::new(Timespec::new()),
            timeouts_in_flight: 0,
            skip_success,
            cqes: Vec::with_capacity(256),
            stash: Vec::new(),
            busy_faults: builder.faults.busy_while_completions_wait,
            cancelling: false,
            overflows: 0,
        };
        driver.features.send_msg_ring =
            builder.external_wake != ExternalWake::EventFd && driver.probe_send_msg_ring();
        if builder.direct_descriptors > 0
            && driver
                .ring
                .submitter()
                .register_files_sparse(builder.direct_descriptors)
                .is_ok()
        {
            driver.features.direct_descriptors = builder.direct_descriptors;
            driver.features.msg_ring_send_fd = driver.probe_msg_ring_send_fd();
        }
        driver.arm_eventfd();
        driver
            .submit()
            .map_err(|source| BuildError::Setup { shard, source })?;
        Ok(driver)
    }

    /// Tries `IORING_REGISTER_SEND_MSG_RING` on our own ring (kernel 6.13+).
    fn probe_send_msg_ring(&mut self) -> bool {
        let target = self.ring.as_raw_fd();
        let ok = send_msg_ring_from_outside(target, token(KIND_IGNORE, 0), 0).is_ok();
        // Consume the probe's completion, if any, so it does not linger.
        let _ = self.ring.submit();
        self.ring.completion().for_each(drop);
        ok
    }

    /// Sends slot 0 of our own (empty) table to a scratch ring (a ring may
    /// not send to itself): 6.0+ refuses it with EBADF (no file there),
    /// older kernels with EINVAL (no such MSG_RING command). Nothing is
    /// moved either way.
    fn probe_msg_ring_send_fd(&mut self) -> bool {
        let Ok(scratch) = IoUring::new(2) else {
            return false;
        };
        let probe_token = token(KIND_IGNORE, 1);
        let entry = opcode::MsgRingSendFd::new(
            Fd(scratch.as_raw_fd()),
            types::Fixed(0),
            types::DestinationSlot::auto_target(),
            token(KIND_IGNORE, 0),
        )
        .build()
        .user_data(probe_token);
        // SAFETY: a MSG_RING entry refers to no memory, only to our ring.
        if unsafe { self.ring.submission().push(&entry) }.is_err() {
            return false;
        }
        if self.ring.submit_and_wait(1).is_err() {
            return false;
        }
        let mut verdict = false;
        for cqe in self.ring.completion() {
            if cqe.user_data() == probe_token {
                verdict = cqe.result() == -libc::EBADF;
            }
        }
        verdict
    }

    fn arm_eventfd(&mut self) {
        if self.eventfd_armed || self.cancelling {
            return;
        }
        let buf: *mut u64 = &mut *self.eventfd_buf;
        let entry = opcode::Read::new(Fd(self.eventfd.as_raw_fd()), buf.cast(), 8)
            .build()
            .user_data(token(KIND_EVENTFD, 0));
        // SAFETY: the read writes 8 bytes into `eventfd_buf`, a heap box the
        // driver owns. `eventfd_armed` stays set until `reap` hands out this
        // read's CQE (a CQE moved to the stash by `push` counts only once
        // reaped), no other read is armed while it is set, and `Drop` leaks
        // the box rather than free it while it is set.
        unsafe { self.push(&entry) };
        self.eventfd_armed = true;
    }

    /// Pushes an SQE, submitting first when the queue is full so that internal
    /// SQEs (doorbells, timers, cancels) are never refused.
    ///
    /// # Safety
    ///
    /// Memory the entry points to must stay valid until its CQE (or, for a
    /// timespec, until it has been submitted).
    unsafe fn push(&mut self, entry: &squeue::Entry) {
        loop {
            // SAFETY: forwarded from this function's contract.
            if unsafe { self.ring.submission().push(entry) }.is_ok() {
                return;
            }
            if let Err(e) = self.submit_full_sq(false) {
                if e.raw_os_error() == Some(libc::EBUSY) {
                    // The kernel refuses submissions while completions wait
                    // (older kernels, with a CQ overflow backlog). The caller
                    // may hold the op table, so the completions cannot be
                    // dispatched here: they are moved to the stash, which
                    // frees the CQ (and lets the kernel flush its backlog
                    // into it), and `reap` hands them out later.
                    let stash = &mut self.stash;
                    stash.extend(
                        self.ring
                            .completion()
                            .map(|cqe| (cqe.user_data(), cqe.result(), cqe.flags())),
                    );
                    let _ = self.submit_full_sq(true);
                }
            }
        }
    }

    /// A submission forced by a full SQ: `io_uring_enter` as the kernel
    /// answers it, or `EBUSY` where fault injection plays a kernel that
    /// refuses submissions while completions wait.
    fn submit_full_sq(&mut self, and_wait: bool) -> io::Result<usize> {
        if self.busy_faults > 0 && !self.ring.completion().is_empty() {
            self.busy_faults -= 1;
            return Err(io::Error::from_raw_os_error(libc::EBUSY));
        }
        if and_wait {
            self.ring.submitter().submit_and_wait(0)
        } else {
            self.ring.submit()
        }
    }

    fn absolute_timespec(deadline: Instant) -> Timespec {
        let mut now_ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `now_ts` is a valid, writable timespec.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now_ts) };
        let delta = deadline.saturating_duration_since(Instant::now());
        let mut sec = now_ts.tv_sec as u64 + delta.as_secs();
        let mut nsec = now_ts.tv_nsec as u64 + u64::from(delta.subsec_nanos());
        if nsec >= 1_000_000_000 {
            sec += 1;
            nsec -= 1_000_000_000;
        }
        Timespec::new().sec(sec).nsec(nsec as u32)
    }
}

/// Posts a `MSG_RING` data message to `target_ring_fd` from a thread with no ring
/// (`IORING_REGISTER_SEND_MSG_RING`, Linux 6.13+).
pub(crate) fn send_msg_ring_from_outside(
    target_ring_fd: i32,
    user_data: u64,
    value: i32,
) -> io::Result<()> {
    const IORING_REGISTER_SEND_MSG_RING: libc::c_uint = 31;
    let entry = opcode::MsgRingData::new(Fd(target_ring_fd), value, user_data, None).build();
    // SAFETY: `squeue::Entry` is `repr(C)` around one `io_uring_sqe`, which is what
    // this register opcode reads (one entry, `nr_args == 1`); fd -1 means "no ring".
    let ret = unsafe {
        libc::syscall(
            libc::SYS_io_uring_register,
            -1,
            IORING_REGISTER_SEND_MSG_RING,
            &entry as *const squeue::Entry,
            1,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Wakes a shard through its eventfd.
/// The outcome of a waiting `io_uring_enter`: an interruption, a timeout or
/// a busy ring only end the wait early (the loop looks again).
fn waited(res: io::Result<usize>) -> io::Result<()> {
    match res {
        Ok(_) => Ok(()),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EINTR | libc::EBUSY | libc::ETIME | libc::EAGAIN)
            ) =>
        {
            Ok(())
        }
        Err(e) => Err(e),
    }
}

pub(crate) fn write_eventfd(eventfd: i32) -> io::Result<()> {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a valid u64 to an fd; the caller keeps the fd open
    // (the runtime's wake gate is held while external wakes are sent).
    let n = unsafe { libc::write(eventfd, (&one as *const u64).cast(), 8) };
    if n == 8 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

impl ShardDriver for UringDriver {
    fn features(&self) -> &RingFeatures {
        &self.features
    }

    fn wake_target(&self) -> WakeTarget {
        WakeTarget {
            ring_fd: self.ring.as_raw_fd(),
            eventfd: self.eventfd.as_raw_fd(),
            send_msg_ring: self.features.send_msg_ring,
        }
    }

    fn queue_doorbell(&mut self, target_index: usize, target: &WakeTarget) {
        let entry = opcode::MsgRingData::new(Fd(target.ring_fd), 0, token(KIND_DOORBELL, 0), None)
            .build()
            .flags(self.skip_success)
            .user_data(token(KIND_DOORBELL_SENT, target_index as u64));
        // SAFETY: a MSG_RING data SQE refers to no memory.
        unsafe { self.push(&entry) };
    }

    fn queue_tiny(
        &mut self,
        from: usize,
        target_index: usize,
        target: &WakeTarget,
        tag: u16,
        value: u32,
    ) {
        let theirs = token(KIND_TINY, ((from as u64 & 0xffff) << 40) | u64::from(tag));
        let ours = token(
            KIND_TINY_SENT,
            ((target_index as u64 & 0xff) << 48) | (u64::from(tag) << 32) | u64::from(value),
        );
        let entry = opcode::MsgRingData::new(Fd(target.ring_fd), value as i32, theirs, None)
            .build()
            .flags(self.skip_success)
            .user_data(ours);
        // SAFETY: a MSG_RING data SQE refers to no memory.
        unsafe { self.push(&entry) };
    }

    fn arm_timer(&mut self, deadline: Instant) {
        if let Some((armed, generation)) = self.timer_armed {
            if armed <= deadline {
                return;
            }
            let remove = opcode::TimeoutRemove::new(token(KIND_TIMER, generation))
                .build()
                .flags(self.skip_success)
                .user_data(token(KIND_IGNORE, 0));
            // SAFETY: a timeout removal refers to no memory.
            unsafe { self.push(&remove) };
        }
        self.timer_generation += 1;
        *self.timer_ts = Self::absolute_timespec(deadline);
        let ts: *const Timespec = &*self.timer_ts;
        let entry = opcode::Timeout::new(ts)
            .flags(TimeoutFlags::ABS)
            .build()
            .user_data(token(KIND_TIMER, self.timer_generation));
        // SAFETY: `timer_ts` is a heap box the driver owns and never frees
        // before the ring is closed (`ring` is dropped first). The kernel
        // copies the timespec when it prepares the SQE, inside an
        // `io_uring_enter` made by this thread (no SQPOLL), so it never reads
        // while this thread writes. A later `arm_timer` that rewrites it
        // before this SQE was submitted (a park that returned before `wait`)
        // only gives that SQE the newer, earlier deadline.
        unsafe { self.push(&entry) };
        self.timeouts_in_flight += 1;
        self.timer_armed = Some((deadline, self.timer_generation));
    }

    fn has_completions(&self) -> bool {
        // SAFETY: only the head/tail/flags words are read; this thread is the
        // ring's single issuer and no `SubmissionQueue`/`CompletionQueue` borrow
        // is alive across this call.
        let (sq, cq) = unsafe { (self.ring.submission_shared(), self.ring.completion_shared()) };
        !cq.is_empty() || sq.taskrun() || sq.cq_overflow() || !self.stash.is_empty()
    }

    fn submit(&mut self) -> io::Result<()> {
        let (needed, overflow) = {
            let sq = self.ring.submission();
            (
                !sq.is_empty() || sq.taskrun() || sq.cq_overflow(),
                sq.cq_overflow(),
            )
        };
        if overflow {
            self.overflows += 1;
        }
        if !needed {
            return Ok(());
        }
        match self.ring.submit() {
            Ok(_) => Ok(()),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR | libc::EBUSY | libc::EAGAIN)
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    fn wait(&mut self) -> io::Result<()> {
        let mut flags = EnterFlags::GETEVENTS;
        if self.features.no_iowait {
            flags |= EnterFlags::NO_IOWAIT;
        }
        let to_submit = self.ring.submission().len() as u32;
        // SAFETY: no extra argument is passed (`None`); flags are valid enter flags.
        let res = unsafe {
            self.ring
                .submitter()
                .enter::<libc::sigset_t>(to_submit, 1, flags.bits(), None)
        };
        waited(res)
    }

    fn wait_timeout(&mut self, limit: std::time::Duration) -> io::Result<()> {
        let ts = Timespec::new()
            .sec(limit.as_secs())
            .nsec(limit.subsec_nanos());
        // The timeout travels as an enter argument (IORING_ENTER_EXT_ARG,
        // Linux 5.11, older than the MSG_RING mailring requires): the
        // kernel reads `ts` during the call and keeps no reference.
        let args = io_uring::types::SubmitArgs::new().timespec(&ts);
        waited(self.ring.submitter().submit_with_args(1, &args))
    }

    fn reap(&mut self, sink: &mut dyn FnMut(Completion)) -> usize {
        self.cqes.clear();
        self.cqes.append(&mut self.stash);
        self.cqes.extend(
            self.ring
                .completion()
                .map(|cqe| (cqe.user_data(), cqe.result(), cqe.flags())),
        );
        let n = self.cqes.len();
        for i in 0..n {
            let (user_data, res, flags) = self.cqes[i];
            let rest = user_data & ((1 << KIND_SHIFT) - 1);
            match kind_of(user_data) {
                KIND_OP => sink(Completion::Op {
                    user_data,
                    res,
                    flags,
                }),
                KIND_TINY => sink(Completion::Tiny {
                    from: (rest >> 40) as u16,
                    tag: rest as u16,
                    value: res as u32,
                }),
                KIND_TIMER => {
                    self.timeouts_in_flight = self.timeouts_in_flight.saturating_sub(1);
                    if matches!(self.timer_armed, Some((_, generation)) if generation == rest) {
                        self.timer_armed = None;
                    }
                }
                KIND_EVENTFD => {
                    self.eventfd_armed = false;
                    self.arm_eventfd();
                }
                KIND_DOORBELL_SENT if res < 0 => sink(Completion::DoorbellFailed {
                    target: rest as usize,
                }),
                KIND_FD_ARRIVAL => sink(Completion::FdArrived { id: rest, res }),
                KIND_TINY_SENT if res < 0 => sink(Completion::TinyFailed {
                    target: ((rest >> 48) & 0xff) as usize,
                    tag: (rest >> 32) as u16,
                    value: rest as u32,
                }),
                // Doorbells only wake the ring; sender-side successes, cancels and
                // timeout removals need nothing.
                _ => {}
            }
        }
        n
    }

    fn in_flight(&self) -> usize {
        usize::from(self.eventfd_armed) + self.timeouts_in_flight
    }

    fn cancel_all(&mut self) {
        self.cancelling = true;
        if let Some((_, generation)) = self.timer_armed {
            let remove = opcode::TimeoutRemove::new(token(KIND_TIMER, generation))
                .build()
                .user_data(token(KIND_IGNORE, 0));
            // SAFETY: a timeout removal refers to no memory.
            unsafe { self.push(&remove) };
        }
        let cancel = opcode::AsyncCancel2::new(CancelBuilder::any().all())
            .build()
            .user_data(token(KIND_IGNORE, 0));
        // SAFETY: a cancel refers to no memory.
        unsafe { self.push(&cancel) };
        // Completing the eventfd read for certain, whatever the cancel matched.
        if self.eventfd_armed {
            let _ = write_eventfd(self.eventfd.as_raw_fd());
        }
        let _ = self.submit();
    }

    fn cq_overflows(&self) -> u64 {
        self.overflows
    }

    fn close_direct(&mut self, slot: u32) -> io::Result<()> {
        self.ring
            .submitter()
            .register_files_update(slot, &[-1])
            .map(drop)
    }

    unsafe fn push_op(&mut self, entry: &squeue::Entry) {
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.push(entry) };
    }

    unsafe fn register_buf_ring(
        &mut self,
        addr: u64,
        entries: u16,
        group: u16,
        flags: u16,
    ) -> io::Result<()> {
        // SAFETY: forwarded from the caller's contract.
        unsafe {
            self.ring
                .submitter()
                .register_buf_ring_with_flags(addr, entries, group, flags)
        }
    }

    fn unregister_buf_ring(&mut self, group: u16) -> io::Result<()> {
        self.ring.submitter().unregister_buf_ring(group)
    }

    fn buf_ring_head(&mut self, group: u16) -> io::Result<u16> {
        /// `struct io_uring_buf_status` of the kernel's ABI.
        #[repr(C)]
        struct BufStatus {
            buf_group: u32,
            head: u32,
            resv: [u32; 8],
        }
        const IORING_REGISTER_PBUF_STATUS: libc::c_long = 26;
        let mut status = BufStatus {
            buf_group: u32::from(group),
            head: 0,
            resv: [0; 8],
        };
        // SAFETY: the ring's fd is open while `self` lives; the kernel reads
        // `buf_group` and writes `head` of one struct laid out as the ABI's
        // `io_uring_buf_status`, which outlives the call.
        let r = unsafe {
            libc::syscall(
                libc::SYS_io_uring_register,
                self.ring.as_raw_fd(),
                IORING_REGISTER_PBUF_STATUS,
                std::ptr::addr_of_mut!(status),
                1,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        // The kernel's head is a u16 index that wraps, as the tail does.
        Ok(status.head as u16)
    }

    fn queue_cancel(&mut self, user_data: u64) {
        let cancel = opcode::AsyncCancel::new(user_data)
            .build()
            .flags(self.skip_success)
            .user_data(token(KIND_IGNORE, 0));
        // SAFETY: a cancel refers to no memory.
        unsafe { self.push(&cancel) };
        // Submit now and run the deferred task work that actually removes a
        // cancelled poll from its wait queue. Otherwise an exclusive wake-up
        // (accept) arriving before our next enter could be swallowed by the
        // cancelled request while a newer one, queued behind the cancel, waits.
        let to_submit = self.ring.submission().len() as u32;
        // SAFETY: no extra argument; GETEVENTS with min_complete 0 never blocks.
        let _ = unsafe {
            self.ring.submitter().enter::<libc::sigset_t>(
                to_submit,
                0,
                EnterFlags::GETEVENTS.bits(),
                None,
            )
        };
    }
}

impl std::fmt::Debug for UringDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringDriver")
            .field("features", &self.features)
            .field("in_flight", &self.in_flight())
            .finish_non_exhaustive()
    }
}

impl Drop for UringDriver {
    fn drop(&mut self) {
        if self.eventfd_armed {
            // The kernel may still write into the buffer while the ring tears
            // down: give it up rather than free memory it could touch.
            let buf = std::mem::replace(&mut self.eventfd_buf, Box::new(0));
            Box::leak(buf);
        }
    }
}
