//! Errors of building a runtime; task errors live with the join handle.

use std::fmt;
use std::io;

/// Why [`Builder::build`](crate::Builder::build) could not start a runtime.
///
/// Every variant names the cause and, where there is one, the remedy. `Debug`
/// prints the variant's name and that text, so `fn main() -> Result<(),
/// BuildError>` reports the remedy too.
#[derive(thiserror::Error)]
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
    /// A shard thread could not be pinned to its CPU.
    #[error("could not pin shard {shard} to CPU {cpu}: {source}")]
    Pin {
        /// The shard.
        shard: usize,
        /// The CPU it was to run on.
        cpu: usize,
        /// The OS error.
        #[source]
        source: io::Error,
    },
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

impl fmt::Debug for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let variant = match self {
            BuildError::Disabled { .. } => "Disabled",
            BuildError::PermissionDenied => "PermissionDenied",
            BuildError::Unsupported => "Unsupported",
            BuildError::MissingOpcode { .. } => "MissingOpcode",
            BuildError::Setup { .. } => "Setup",
            BuildError::Config(_) => "Config",
            BuildError::Pin { .. } => "Pin",
            BuildError::ThreadSpawn { .. } => "ThreadSpawn",
        };
        write!(f, "{variant}: {self}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `fn main() -> Result<(), BuildError>` prints the error with `Debug`:
    /// it must carry the cause and the remedy, not just the variant's fields.
    #[test]
    fn debug_carries_the_cause_and_the_remedy() {
        let errors = [
            BuildError::Disabled { value: 2 },
            BuildError::PermissionDenied,
            BuildError::Unsupported,
            BuildError::MissingOpcode {
                opcode: "MSG_RING",
                purpose: "waking shards",
                min_kernel: "6.0",
            },
            BuildError::Setup {
                shard: 3,
                source: io::Error::from_raw_os_error(12),
            },
            BuildError::Config("shards must be between 1 and 64, got 0".into()),
            BuildError::Pin {
                shard: 1,
                cpu: 3,
                source: io::Error::from_raw_os_error(22),
            },
            BuildError::ThreadSpawn {
                shard: 1,
                source: io::Error::from_raw_os_error(11),
            },
        ];
        for err in &errors {
            let debug = format!("{err:?}");
            assert!(
                debug.contains(&err.to_string()),
                "{debug:?} lacks the Display text {:?}",
                err.to_string()
            );
        }
        let debug = format!("{:?}", BuildError::Disabled { value: 2 });
        assert!(debug.contains("Disabled"), "{debug}");
        assert!(
            debug.contains("sysctl -w kernel.io_uring_disabled=0"),
            "{debug}"
        );
    }
}
