//! Timer storm for profiling: 100k sleeps created, polled once, reset and
//! dropped (`timers ROUNDS`), one at a time (`timers ROUNDS churn`), or the
//! same loop with no timer (`timers ROUNDS floor`: the cost every runtime's
//! figure includes).
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use mailring::ShardId;

fn main() {
    let rounds: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10);
    let mode = std::env::args().nth(2);
    let churn = mode.as_deref() == Some("churn");
    // The storm's loop with no timer at all (same clock arithmetic, same
    // vector of 32-byte values): what any runtime's figure includes.
    let floor = mode.as_deref() == Some("floor");
    // Shards spin instead of parking (valgrind stalls on a blocking io_uring_enter).
    let rt = mailring::Runtime::builder()
        .shards(1)
        .idle_policy(mailring::IdlePolicy::Spin(Duration::from_secs(3600)))
        .build()
        .unwrap();
    let h = rt.handle().spawn_on(ShardId::new(0), async move {
        let start = Instant::now();
        for _ in 0..rounds {
            let now = Instant::now();
            if floor {
                let mut v: Vec<(Instant, u64)> = Vec::with_capacity(100_000);
                for i in 0..100_000u64 {
                    let d = now + Duration::from_secs(30) + Duration::from_micros(i * 7 % 100_000);
                    v.push(std::hint::black_box((d, i)));
                }
                for (i, s) in v.iter_mut().enumerate() {
                    s.0 = std::hint::black_box(
                        now + Duration::from_secs(60)
                            + Duration::from_micros(i as u64 * 7 % 100_000),
                    );
                }
                drop(std::hint::black_box(v));
                continue;
            }
            if churn {
                for i in 0..100_000u64 {
                    let mut s = mailring::time::sleep_until(
                        now + Duration::from_secs(30) + Duration::from_micros(i * 7 % 100_000),
                    );
                    let waker = futures::task::noop_waker_ref();
                    assert!(matches!(
                        Pin::new(&mut s).poll(&mut Context::from_waker(waker)),
                        Poll::Pending
                    ));
                    s.reset(now + Duration::from_secs(60) + Duration::from_micros(i * 7 % 100_000));
                }
                continue;
            }
            let mut v: Vec<mailring::time::Sleep> = Vec::with_capacity(100_000);
            for i in 0..100_000u64 {
                let mut s = mailring::time::sleep_until(
                    now + Duration::from_secs(30) + Duration::from_micros(i * 7 % 100_000),
                );
                let waker = futures::task::noop_waker_ref();
                assert!(matches!(
                    Pin::new(&mut s).poll(&mut Context::from_waker(waker)),
                    Poll::Pending
                ));
                v.push(s);
            }
            for (i, s) in v.iter_mut().enumerate() {
                s.reset(
                    now + Duration::from_secs(60) + Duration::from_micros(i as u64 * 7 % 100_000),
                );
            }
            drop(v);
        }
        start.elapsed() / (rounds * 100_000)
    });
    let per = futures::executor::block_on(h).unwrap();
    let what = if floor {
        "per iteration of the loop alone"
    } else {
        "per timer (create + poll + reset + drop)"
    };
    println!("{per:?} {what}");
}
