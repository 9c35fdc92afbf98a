//! `INFO`'s instantaneous rates: commands per second and network input
//! and output in KiB per second, each the mean of the last 16 samples of
//! its counter's growth taken every 100 ms, as Redis samples them.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often the counters are sampled.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// Samples a rate is the mean of.
const SAMPLES: usize = 16;

/// The counters sampled: commands, bytes in, bytes out.
pub(crate) type Totals = [u64; 3];

#[derive(Debug, Default)]
struct Window {
    /// The last totals and when they were read.
    last: Option<(Instant, Totals)>,
    /// Per second, for each counter, the last samples (a ring).
    samples: [[f64; 3]; SAMPLES],
    next: usize,
}

/// The sampled rates of one broker.
#[derive(Debug, Default)]
pub(crate) struct Rates(Mutex<Window>);

impl Rates {
    /// Takes a sample of `totals`, read at `now`.
    pub(crate) fn sample(&self, now: Instant, totals: Totals) {
        let mut w = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((then, before)) = w.last {
            let secs = now.saturating_duration_since(then).as_secs_f64();
            if secs > 0.0 {
                let mut rates = [0.0; 3];
                for (rate, (now_total, before_total)) in
                    rates.iter_mut().zip(totals.iter().zip(before))
                {
                    *rate = now_total.saturating_sub(before_total) as f64 / secs;
                }
                let at = w.next;
                w.samples[at] = rates;
                w.next = (at + 1) % SAMPLES;
            }
        }
        w.last = Some((now, totals));
    }

    /// Commands per second, and input and output in KiB per second.
    pub(crate) fn current(&self) -> (u64, f64, f64) {
        let w = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let mean = |k: usize| w.samples.iter().map(|s| s[k]).sum::<f64>() / SAMPLES as f64;
        (mean(0).round() as u64, mean(1) / 1024.0, mean(2) / 1024.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_is_the_mean_of_the_last_sixteen_samples() {
        let rates = Rates::default();
        let t0 = Instant::now();
        assert_eq!(rates.current(), (0, 0.0, 0.0));
        // 100 commands and 10 KiB in, 20 KiB out, every 100 ms.
        for i in 0..=20u64 {
            let at = t0 + SAMPLE_EVERY * i as u32;
            rates.sample(at, [100 * i, 10240 * i, 20480 * i]);
        }
        let (ops, kin, kout) = rates.current();
        assert_eq!(ops, 1000);
        assert!(
            (kin - 100.0).abs() < 1e-6 && (kout - 200.0).abs() < 1e-6,
            "{kin} {kout}"
        );
        // Idle for 8 samples: half the window is quiet.
        for i in 21..=28u64 {
            rates.sample(t0 + SAMPLE_EVERY * i as u32, [2000, 204_800, 409_600]);
        }
        assert_eq!(rates.current().0, 500);
        // A counter reset (CONFIG RESETSTAT) reads as no growth, not as
        // a huge one.
        rates.sample(t0 + SAMPLE_EVERY * 29, [0, 0, 0]);
        assert!(rates.current().0 <= 500);
    }
}
