//! Errors of building a runtime; task errors live with the join handle.

use std::io;

/// Why [`Builder::build`](crate::Builder::build) could not start a runtime.
///
/// Every variant names the cause and, where there is one, the remedy.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The `kernel.io_uring_disabled` sysctl forbids io_uring for this process.
    #[error(
        "io_uring is disabled by the sysctl kernel.io_uring_disabled={value}; \
         set it to 0 (`sysctl -w kernel.io_uring_disabled=0`) or, for value 1, \
         run as a member of the group in kernel.io_uring_group"
    )]
    Disabled {
        /// The value read from `/proc/sys/kernel/io_uring_disabled`.
        value: u8,
    },
    /// `io_uring_setup` returned `EPERM`.
    #[error(
        "io_uring_setup was refused with EPERM: a seccomp profile (Docker's default \
         blocks io_uring) or kernel.io_uring_disabled=1 denies it; allow the \
         io_uring_setup, io_uring_enter and io_uring_register syscalls for this process"
    )]
    PermissionDenied,
    /// `io_uring_setup` returned `ENOSYS`.
    #[error(
        "io_uring_setup is not available (ENOSYS): the kernel was built without \
         io_uring or a seccomp profile hides it; use Linux 6.1 or newer with \
         CONFIG_IO_URING=y and allow the io_uring syscalls"
    )]
    Unsupported,
    /// The kernel accepted the ring but lacks an opcode mailring cannot work without.
    #[error(
        "the kernel lacks IORING_OP_{opcode}, which mailring needs for {purpose}; \
         upgrade to Linux {min_kernel} or newer"
    )]
    MissingOpcode {
        /// The opcode's name without the `IORING_OP_` prefix.
        opcode: &'static str,
        /// What mailring uses it for.
        purpose: &'static str,
        /// The first kernel version that has it.
        min_kernel: &'static str,
    },
    /// `io_uring_setup` failed for another reason (often `ENOMEM`: raise `ulimit -l`).
    #[error("io_uring_setup failed on shard {shard}: {source}")]
    Setup {
        /// The shard whose ring could not be created.
        shard: usize,
        /// The kernel's error.
        #[source]
        source: io::Error,
    },
    /// A builder setting is out of range.
    #[error("invalid runtime configuration: {0}")]
    Config(String),
    /// The OS refused to start a shard thread.
    #[error("could not start the thread of shard {shard}: {source}")]
    ThreadSpawn {
        /// The shard whose thread could not start.
        shard: usize,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}
