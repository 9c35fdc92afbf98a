//! Process-wide settings a server makes once at startup, before it
//! builds its runtime.

use std::io;

/// Turns transparent huge pages off for this process, as Redis does at
/// startup (its `disable-thp yes`).
///
/// With them on, the first touch of a fresh 2 MiB page zeroes all of it
/// inside one page fault. An allocator that asks for huge pages (mimalloc
/// does) makes each such fault a stall of the shard that touched it:
/// measured on a VM, about 4 ms, every few tens of milliseconds while a
/// broker's memory grows, which was the whole 99th percentile of its
/// pipelined latency. With 4 KiB pages the same zeroing is spread over
/// the requests that grow the memory. It applies to the whole process
/// (every page fault after the call; make it before building a runtime)
/// and is inherited by the processes it starts.
///
/// # Errors
///
/// The kernel refused (`PR_SET_THP_DISABLE` needs Linux 3.15).
///
/// # Examples
///
/// ```
/// mailring::process::disable_transparent_huge_pages()?;
/// assert!(mailring::process::transparent_huge_pages_disabled()?);
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn disable_transparent_huge_pages() -> io::Result<()> {
    let (on, unused): (libc::c_ulong, libc::c_ulong) = (1, 0);
    // SAFETY: `PR_SET_THP_DISABLE` reads its four arguments as `unsigned
    // long` (passed as such through the variadic call) and touches no
    // memory of ours; it sets a flag on this process.
    let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, on, unused, unused, unused) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether transparent huge pages are off for this process (see
/// [`disable_transparent_huge_pages`]).
///
/// # Errors
///
/// The kernel does not know `PR_GET_THP_DISABLE`.
pub fn transparent_huge_pages_disabled() -> io::Result<bool> {
    let unused: libc::c_ulong = 0;
    // SAFETY: `PR_GET_THP_DISABLE` takes `unsigned long` arguments (unused
    // here), touches no memory of ours, and returns the flag.
    let rc = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, unused, unused, unused, unused) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc != 0)
}

/// The process's resident memory in bytes (`VmRSS` of `/proc/self/status`),
/// what a server without an allocator of its own reports as its memory
/// (Redis's `used_memory_rss`).
///
/// # Errors
///
/// `/proc` could not be read, or had no `VmRSS` line.
///
/// # Examples
///
/// ```
/// assert!(mailring::process::resident_bytes()? > 0);
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn resident_bytes() -> io::Result<u64> {
    status_bytes("VmRSS:")
}

/// A size line of `/proc/self/status` (`VmRSS:   1234 kB`), in bytes.
fn status_bytes(field: &str) -> io::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|kb| kb.trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| io::Error::other(format!("no {field} line in /proc/self/status")))
}

/// CPU time a process used, in user and in system mode (`getrusage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct CpuTime {
    /// Time in user mode.
    pub user: std::time::Duration,
    /// Time in the kernel on its behalf.
    pub system: std::time::Duration,
}

/// Whose CPU time [`cpu_time`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuOf {
    /// This process, every thread.
    This,
    /// Its children that ended and were waited for.
    Children,
}

/// The CPU time `of` this process (or its waited-for children) so far, as
/// servers report it (Redis's `used_cpu_user` / `used_cpu_sys`).
///
/// # Errors
///
/// The kernel's refusal (none is expected).
///
/// # Examples
///
/// ```
/// use mailring::process::{cpu_time, CpuOf};
/// let used = cpu_time(CpuOf::This)?;
/// assert!(used.user + used.system > std::time::Duration::ZERO);
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn cpu_time(of: CpuOf) -> io::Result<CpuTime> {
    let who = match of {
        CpuOf::This => libc::RUSAGE_SELF,
        CpuOf::Children => libc::RUSAGE_CHILDREN,
    };
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `getrusage` writes one `struct rusage` at the pointer, which
    // names such a struct (zeroed, so whole even if the kernel left a
    // field alone).
    let rc = unsafe { libc::getrusage(who, usage.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: zeroed above and filled by the kernel: every field holds a
    // value of its type.
    let usage = unsafe { usage.assume_init() };
    let time = |t: libc::timeval| {
        std::time::Duration::new(
            u64::try_from(t.tv_sec).unwrap_or(0),
            u32::try_from(t.tv_usec).unwrap_or(0).min(999_999) * 1000,
        )
    };
    Ok(CpuTime {
        user: time(usage.ru_utime),
        system: time(usage.ru_stime),
    })
}

/// How many descriptors this process may open (`RLIMIT_NOFILE`): the soft
/// limit in force and the hard limit it may be raised to
/// (`u64::MAX` for no limit).
///
/// # Errors
///
/// The kernel's refusal (none is expected).
///
/// # Examples
///
/// ```
/// let limit = mailring::process::descriptor_limit()?;
/// assert!(limit.soft <= limit.hard);
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn descriptor_limit() -> io::Result<DescriptorLimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` writes one `struct rlimit` at the pointer, which
    // names such a struct of ours.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(DescriptorLimit {
        soft: limit.rlim_cur,
        hard: limit.rlim_max,
    })
}

/// Raises this process's soft descriptor limit to `wanted`, or as near
/// as its hard limit lets; never lowers it. Returns the limit in force
/// after. A server sizes its connection limit by this, as Redis lowers
/// its `maxclients` to fit.
///
/// # Errors
///
/// The kernel refused the new limit (it stays as it was).
pub fn raise_descriptor_limit(wanted: u64) -> io::Result<u64> {
    let now = descriptor_limit()?;
    let target = wanted.min(now.hard);
    if target <= now.soft {
        return Ok(now.soft);
    }
    let limit = libc::rlimit {
        rlim_cur: target,
        rlim_max: now.hard,
    };
    // SAFETY: `setrlimit` reads one `struct rlimit` at the pointer, which
    // names such a struct of ours.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(target)
}

/// The descriptor limits of [`descriptor_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DescriptorLimit {
    /// The limit in force.
    pub soft: u64,
    /// What the soft limit may be raised to.
    pub hard: u64,
}

/// The most resident memory this process has had, in bytes (`VmHWM` of
/// `/proc/self/status`): what a server reports as its memory's peak.
///
/// # Errors
///
/// `/proc/self/status` could not be read or has no `VmHWM` line.
///
/// # Examples
///
/// ```
/// let peak = mailring::process::peak_resident_bytes()?;
/// assert!(peak >= mailring::process::resident_bytes()? / 2);
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn peak_resident_bytes() -> io::Result<u64> {
    status_bytes("VmHWM:")
}
