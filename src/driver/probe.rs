//! Ring setup: the sysctl check, setup flags with fallback, and the opcode probe.
//!
//! Setup tries `SINGLE_ISSUER | DEFER_TASKRUN | COOP_TASKRUN | TASKRUN_FLAG` first
//! and drops flags one step at a time while the kernel answers `EINVAL`; what
//! was accepted is recorded in [`RingFeatures`] and shown by
//! [`crate::Runtime::stats`]. `EPERM` and `ENOSYS` end setup at once with a
//! typed error, as does a kernel whose probe lacks `IORING_OP_MSG_RING`.

use std::io;
use std::path::Path;

use io_uring::{opcode, IoUring, Probe};

use crate::builder::Builder;
use crate::error::BuildError;

const SYSCTL_PATH: &str = "/proc/sys/kernel/io_uring_disabled";

/// What the kernel accepted for one ring.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RingFeatures {
    /// `IORING_SETUP_SINGLE_ISSUER` was accepted.
    pub single_issuer: bool,
    /// `IORING_SETUP_DEFER_TASKRUN` was accepted.
    pub defer_taskrun: bool,
    /// `IORING_SETUP_COOP_TASKRUN` was accepted.
    pub coop_taskrun: bool,
    /// `IORING_SETUP_TASKRUN_FLAG` was accepted (spinning shards see deferred work without a syscall).
    pub taskrun_flag: bool,
    /// Idle waits pass `IORING_ENTER_NO_IOWAIT`.
    pub no_iowait: bool,
    /// SQEs may carry `IOSQE_CQE_SKIP_SUCCESS`.
    pub skip_cqe_on_success: bool,
    /// Outside threads wake shards with `IORING_REGISTER_SEND_MSG_RING`.
    pub send_msg_ring: bool,
    /// The ring fd is registered (`IORING_ENTER_REGISTERED_RING`).
    pub registered_ring_fd: bool,
    /// Submission queue entries.
    pub sq_entries: u32,
    /// Completion queue entries.
    pub cq_entries: u32,
    /// The kernel has `IORING_OP_SEND_ZC`.
    pub op_send_zc: bool,
    /// The kernel has `IORING_OP_READ` / `IORING_OP_WRITE`.
    pub op_read_write: bool,
    /// Slots of the registered direct-descriptor table (0: none; see
    /// `Builder::direct_descriptors`).
    pub direct_descriptors: u32,
    /// `IORING_OP_MSG_RING` can send a direct descriptor to another ring
    /// (`IORING_MSG_SEND_FD`, kernel 6.0+).
    pub msg_ring_send_fd: bool,
    /// The kernel has `IORING_OP_FIXED_FD_INSTALL` (6.8+): a direct
    /// descriptor can become a process descriptor again.
    pub op_fixed_fd_install: bool,
}

/// Checks `kernel.io_uring_disabled` before touching the ring.
pub(crate) fn check_sysctl(builder: &Builder) -> Result<(), BuildError> {
    let path = builder
        .faults
        .sysctl_path
        .as_deref()
        .unwrap_or(Path::new(SYSCTL_PATH));
    // A missing file means an older kernel without the sysctl: nothing to check.
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(());
    };
    match text.trim().parse::<u8>() {
        Ok(2) => Err(BuildError::Disabled { value: 2 }),
        // 1: allowed for members of kernel.io_uring_group; setup reports EPERM otherwise.
        _ => Ok(()),
    }
}

/// Creates the ring of shard `shard` on the calling thread.
pub(crate) fn setup_ring(
    builder: &Builder,
    shard: usize,
) -> Result<(IoUring, RingFeatures), BuildError> {
    if let Some(errno) = builder.faults.setup_errno {
        return Err(map_setup_error(shard, io::Error::from_raw_os_error(errno)));
    }
    let entries = builder.ring_entries;
    // Room for every SQE's completion four times over plus the doorbells and tiny
    // messages that up to MAX_SHARDS peers may post before we next reap.
    let cq_entries = (entries * 4).max(entries + 2 * crate::builder::MAX_SHARDS as u32);
    let ladders: [(bool, bool, bool); 4] = [
        (true, true, true),
        (true, false, true),
        (false, false, true),
        (false, false, false),
    ];
    let mut last_err = None;
    for (single, defer, coop) in ladders {
        let mut b = IoUring::builder();
        b.dontfork().setup_cqsize(cq_entries).setup_clamp();
        if single {
            b.setup_single_issuer();
        }
        if defer {
            b.setup_defer_taskrun();
        }
        if coop {
            b.setup_coop_taskrun().setup_taskrun_flag();
        }
        match b.build(entries) {
            Ok(ring) => {
                let mut features = RingFeatures {
                    single_issuer: single,
                    defer_taskrun: defer,
                    coop_taskrun: coop,
                    taskrun_flag: coop,
                    no_iowait: ring.params().is_feature_no_iowait(),
                    skip_cqe_on_success: ring.params().is_feature_skip_cqe_on_success(),
                    sq_entries: ring.params().sq_entries(),
                    cq_entries: ring.params().cq_entries(),
                    ..RingFeatures::default()
                };
                probe_opcodes(builder, &ring, &mut features)?;
                return Ok((ring, features));
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => last_err = Some(e),
            Err(e) => return Err(map_setup_error(shard, e)),
        }
    }
    Err(map_setup_error(
        shard,
        last_err.unwrap_or_else(|| io::Error::from_raw_os_error(libc::EINVAL)),
    ))
}

fn map_setup_error(shard: usize, e: io::Error) -> BuildError {
    match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => BuildError::PermissionDenied,
        Some(libc::ENOSYS) => BuildError::Unsupported,
        _ => BuildError::Setup { shard, source: e },
    }
}

fn probe_opcodes(
    builder: &Builder,
    ring: &IoUring,
    features: &mut RingFeatures,
) -> Result<(), BuildError> {
    let mut probe = Probe::new();
    let probed = ring.submitter().register_probe(&mut probe).is_ok();
    let hidden = builder.faults.hide_opcode;
    let has = |code: u8| probed && hidden != Some(code) && probe.is_supported(code);
    let required = [
        (
            opcode::MsgRingData::CODE,
            "MSG_RING",
            "cross-shard doorbells",
            "5.18",
        ),
        (opcode::Timeout::CODE, "TIMEOUT", "timers", "5.4"),
        (
            opcode::AsyncCancel::CODE,
            "ASYNC_CANCEL",
            "cancellation",
            "5.5",
        ),
        (
            opcode::Read::CODE,
            "READ",
            "the external wake eventfd",
            "5.6",
        ),
    ];
    for (code, name, purpose, min_kernel) in required {
        if !has(code) {
            return Err(BuildError::MissingOpcode {
                opcode: name,
                purpose,
                min_kernel,
            });
        }
    }
    features.op_send_zc = has(opcode::SendZc::CODE);
    features.op_read_write = has(opcode::Write::CODE);
    features.op_fixed_fd_install = has(opcode::FixedFdInstall::CODE);
    Ok(())
}
