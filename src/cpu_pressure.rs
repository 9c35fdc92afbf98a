//! Whether the machine has a CPU to spare: what an idle shard asks before
//! it spins.
//!
//! A spinning shard keeps its CPU. Where every CPU already has a runnable
//! thread (more busy threads than CPUs: a load generator beside the
//! server, a container packed with other work), that CPU is taken from a
//! thread that waits for it, and the spin costs the machine what it was
//! meant to save: on the 2-vCPU VM, a hyper server on two spinning shards
//! with its client beside them spent 23% of its CPU spinning and showed a
//! 3.7 ms p99, against 0.5 ms when its shards blocked at once.
//!
//! The kernel's pressure-stall figure for CPUs (`/proc/pressure/cpu`,
//! Linux 4.20+: the microseconds in which at least one runnable thread
//! waited for a CPU) tells it, integrated over time rather than sampled,
//! so a kernel worker that runs for a moment does not count as a
//! shortage. One shard of the runtime reads it (an open, a read and a
//! close: no descriptor is kept), at most once per [`WINDOW`]. A window in
//! which threads waited for a CPU more than [`SHORT_ABOVE`] percent of the
//! time is a shortage: shards then park without spinning for [`HOLD`],
//! after which a window of spinning shows whether the wait comes back.
//! Where the kernel keeps no such figure (PSI off), shards spin as their
//! policy says.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The least time between two readings.
const WINDOW: Duration = Duration::from_millis(50);
/// How long a shortage stands before the next reading.
pub(crate) const HOLD: Duration = Duration::from_millis(200);
/// The share of a window, in percent, in which threads waited for a CPU
/// that counts as a shortage (an idle 2-vCPU VM shows 1-3%, one busy
/// thread more than it has CPUs 30-50%).
const SHORT_ABOVE: u64 = 10;

/// The runtime's shared reading of the machine's CPU pressure.
pub(crate) struct CpuPressure {
    /// The figure's file (`/proc/pressure/cpu`, or a test's).
    path: PathBuf,
    /// Whether it could be read when the runtime started.
    available: bool,
    /// What the nanosecond stamps count from.
    base: Instant,
    /// When the next reading is due, in ns since `base`.
    due_ns: AtomicU64,
    /// The last reading: (ns since `base`, stalled µs in total).
    last: Mutex<Option<(u64, u64)>>,
    short: AtomicBool,
}

impl std::fmt::Debug for CpuPressure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuPressure")
            .field("probing", &self.available)
            .field("short", &self.short.load(Ordering::Relaxed))
            .finish()
    }
}

impl CpuPressure {
    /// The probe of the figure in `path` (`/proc/pressure/cpu` but for
    /// tests); one that cannot read it never reports a shortage.
    pub(crate) fn probe(path: &Path) -> CpuPressure {
        let mut probe = CpuPressure::off();
        probe.path = path.to_owned();
        probe.available = stalled_us(&probe.path).is_some();
        probe
    }

    /// A probe that never reports a shortage (spinning as configured).
    pub(crate) fn off() -> CpuPressure {
        CpuPressure {
            path: PathBuf::new(),
            available: false,
            base: Instant::now(),
            due_ns: AtomicU64::new(0),
            last: Mutex::new(None),
            short: AtomicBool::new(false),
        }
    }

    /// Whether threads waited for a CPU for more than [`SHORT_ABOVE`] of the
    /// last window, reading the figure again if a reading is due (`now`:
    /// the caller's clock reading).
    pub(crate) fn cpus_short(&self, now: Instant) -> bool {
        if !self.available {
            return false;
        }
        let now_ns =
            u64::try_from(now.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX);
        let due = self.due_ns.load(Ordering::Relaxed);
        if now_ns < due {
            return self.short.load(Ordering::Relaxed);
        }
        // One shard reads; the others keep the standing verdict meanwhile.
        let next = now_ns.saturating_add(WINDOW.as_nanos() as u64);
        if self
            .due_ns
            .compare_exchange(due, next, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return self.short.load(Ordering::Relaxed);
        }
        let Some(stalled) = stalled_us(&self.path) else {
            return self.short.load(Ordering::Relaxed);
        };
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let short = match last.replace((now_ns, stalled)) {
            Some((then_ns, then_stalled)) => short_between(
                now_ns.saturating_sub(then_ns),
                stalled.saturating_sub(then_stalled),
            ),
            None => false,
        };
        drop(last);
        self.short.store(short, Ordering::Relaxed);
        if short {
            self.due_ns.store(
                now_ns.saturating_add(HOLD.as_nanos() as u64),
                Ordering::Relaxed,
            );
        }
        short
    }
}

/// The kernel's total of microseconds in which some thread waited for a
/// CPU, from the figure's file at `path`.
fn stalled_us(path: &Path) -> Option<u64> {
    let mut file = std::fs::File::open(path).ok()?;
    let mut buf = [0u8; 256];
    let n = file.read(&mut buf).ok()?;
    stalled_in_pressure(&buf[..n])
}

/// Whether `stalled_us` of waiting in `elapsed_ns` is more than
/// [`SHORT_ABOVE`] percent.
fn short_between(elapsed_ns: u64, stalled_us: u64) -> bool {
    elapsed_ns > 0
        && u128::from(stalled_us) * 1000 * 100 > u128::from(elapsed_ns) * u128::from(SHORT_ABOVE)
}

/// The `total` of the `some` line of a `/proc/pressure/cpu` text
/// ("some avg10=2.43 avg60=1.96 avg300=4.87 total=1332623689"); `None`
/// for anything else.
fn stalled_in_pressure(text: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(text).ok()?;
    let some = text.lines().find(|l| l.starts_with("some "))?;
    some.split_ascii_whitespace()
        .find_map(|field| field.strip_prefix("total="))?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pressure_texts_give_their_stalled_total_and_nothing_else_does() {
        let text = b"some avg10=2.43 avg60=1.96 avg300=4.87 total=1332623689\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
        assert_eq!(stalled_in_pressure(text), Some(1_332_623_689));
        for bad in [
            &b""[..],
            b"full avg10=0.00 total=5\n",
            b"some avg10=2.43 avg60=1.96 avg300=4.87\n",
            b"some total=\n",
            b"some total=-4\n",
            b"some total=99999999999999999999999\n",
            b"some \xff total=1\n",
        ] {
            assert_eq!(stalled_in_pressure(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_window_is_short_past_a_tenth_spent_waiting() {
        let ms = 1_000_000;
        assert!(!short_between(10 * ms, 0));
        assert!(!short_between(10 * ms, 1_000));
        assert!(short_between(10 * ms, 1_001));
        assert!(short_between(10 * ms, 5_000));
        assert!(!short_between(0, 5_000));
        assert!(short_between(u64::MAX, u64::MAX));
    }

    #[test]
    fn a_disabled_probe_never_reports_a_shortage() {
        let off = CpuPressure::off();
        assert!(!off.cpus_short(Instant::now()));
        // This machine keeps the figure or not; either way the probe
        // answers without a panic.
        let probe = CpuPressure::probe(Path::new("/proc/pressure/cpu"));
        let _ = probe.cpus_short(Instant::now());
    }
}
