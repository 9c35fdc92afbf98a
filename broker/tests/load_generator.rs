//! The built-in load generator (`broker --bench`) measured for real: a
//! broker on loopback, producers and consumers over TCP. What it reports
//! must follow from what happened: without consumers every entry is lag;
//! with them, every entry read is a latency sample; its data directory is
//! gone afterwards.

use std::time::Duration;

mod common;

use mailring_broker::bench::{measure, BenchConfig};
use mailring_broker::{BrokerConfig, Fsync};

fn config(parent: &std::path::Path, consumers: usize) -> BenchConfig {
    BenchConfig {
        producers: 2,
        consumers,
        pipeline: 4,
        streams: 2,
        duration: Duration::from_millis(500),
        fsync: Fsync::No,
        shards: 1,
        parent_dir: Some(parent.to_path_buf()),
        ..BenchConfig::default()
    }
}

/// A fresh, existing parent directory.
fn parent() -> common::TempDir {
    let dir = common::TempDir::new();
    std::fs::create_dir_all(&dir.0).unwrap();
    dir
}

fn empty(dir: &std::path::Path) -> bool {
    std::fs::read_dir(dir).unwrap().next().is_none()
}

#[test]
fn without_consumers_every_entry_produced_is_lag_and_the_data_directory_goes() {
    let parent = parent();
    let c = config(&parent.0, 0);
    let report = measure(&c, BrokerConfig::default()).unwrap();
    assert!(report.produced > 0, "{report:?}");
    // Entries answered after the stop (at most a batch per producer) are
    // in the streams too.
    let in_flight = (c.producers * c.pipeline) as u64;
    assert!(
        (report.produced..=report.produced + in_flight).contains(&report.lag_at_stop),
        "{report:?}"
    );
    assert_eq!(report.lag_after_drain, report.lag_at_stop);
    assert_eq!(report.consumed, 0);
    assert_eq!(report.end_to_end.samples(), 0);
    assert!(report.xadd.samples() >= report.produced);
    assert!(report.elapsed >= c.duration);
    assert!(empty(&parent.0), "the run's data directory is removed");
    // The table says so, with "-" for the latencies nobody measured.
    let mut table = Vec::new();
    mailring_broker::bench::print_table(&c, &report, &mut table);
    let table = String::from_utf8(table).unwrap();
    assert!(
        table.contains("| end-to-end (produce → consume) p50 / p99 | - / - ms (0 samples) |"),
        "{table}"
    );
    assert!(
        table.contains(&format!(
            "| consumer lag when producers stopped | {} entries |",
            report.lag_at_stop
        )),
        "{table}"
    );
}

#[test]
fn consumers_read_what_was_produced_and_each_read_is_a_latency_sample() {
    let parent = parent();
    let c = config(&parent.0, 2);
    let report = measure(&c, BrokerConfig::default()).unwrap();
    assert!(report.consumed > 0, "{report:?}");
    assert_eq!(report.end_to_end.samples(), report.consumed, "{report:?}");
    assert!(report.end_to_end.quantile_ms(0.5).is_some());
    assert!(!report.interrupted);
    assert!(empty(&parent.0));
}

#[test]
fn a_run_the_bench_cannot_make_is_refused_before_anything_starts() {
    let parent = parent();
    let mut c = config(&parent.0, 3);
    c.streams = 2;
    let e = measure(&c, BrokerConfig::default()).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    assert!(e.to_string().contains("--consumers 3"), "{e}");
    assert!(empty(&parent.0));
}
