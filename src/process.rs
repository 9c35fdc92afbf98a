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
