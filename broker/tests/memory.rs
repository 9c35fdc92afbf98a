//! Bounded memory per stream: with a small cache, a stream keeps only its
//! newest entries in memory and every command that reads older ones
//! (`XRANGE`, `XREVRANGE`, `XREAD`, `XREADGROUP` new and history,
//! `XCLAIM`, `XAUTOCLAIM`, `XINFO STREAM FULL`, `MULTI`/`EXEC`) answers
//! exactly as with everything in memory: the entries come back from the
//! log's segments, fetched through the ring before the command runs.
//! Restarts (same shard count, another one) and an actor's panic restart
//! keep the same answers.
//!
//! One test in its own binary: it reads the process-wide read-back
//! counters from `INFO`.

use mailring_broker::BrokerConfig;

mod common;
use common::client::{start_in, Client, R};
use common::{encode, TempDir};

/// Bytes of entries each stream keeps in memory here.
const CACHE: u64 = 4096;
const ENTRIES: usize = 3000;

fn config() -> BrokerConfig {
    let mut config = BrokerConfig::default();
    config.store.stream_cache_bytes = CACHE;
    // Small segments: the entries spread over many files.
    config.store.segment_bytes = 64 << 10;
    config.debug_commands = true;
    config
}

fn value(i: usize) -> String {
    format!("value-{i:05}-{}", "x".repeat(i % 97))
}

/// The entry `[id, [n, i, v, value(i)]]`.
fn entry(id: &str, i: usize) -> R {
    R::Array(vec![
        R::bulk(id),
        R::Array(vec![
            R::bulk("n"),
            R::bulk(&i.to_string()),
            R::bulk("v"),
            R::bulk(&value(i)),
        ]),
    ])
}

fn id(i: usize) -> String {
    format!("{}-1", i + 1)
}

fn entries(range: impl Iterator<Item = usize>) -> R {
    R::Array(range.map(|i| entry(&id(i), i)).collect())
}

/// A field of `INFO`, as a number.
fn info(c: &mut Client, field: &str) -> u64 {
    let text = c.cmd(&["INFO"]).text();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("INFO has no {field}: {text}"))
        .trim()
        .parse()
        .unwrap()
}

fn produce(c: &mut Client) {
    let mut wire = Vec::new();
    for i in 0..ENTRIES {
        let (n, v) = (i.to_string(), value(i));
        wire.extend(encode(&[
            b"XADD",
            b"s",
            id(i).as_bytes(),
            b"n",
            n.as_bytes(),
            b"v",
            v.as_bytes(),
        ]));
    }
    c.send_raw(&wire);
    for i in 0..ENTRIES {
        assert_eq!(c.read(), R::bulk(&id(i)));
    }
    assert!(matches!(c.cmd(&["XADD", "t", "*", "a", "b"]), R::Bulk(_)));
}

/// What every read of old entries must answer, with everything in memory
/// or not.
fn check_reads(c: &mut Client) {
    assert_eq!(c.cmd(&["XRANGE", "s", "-", "+"]), entries(0..ENTRIES));
    assert_eq!(
        c.cmd(&["XREVRANGE", "s", "+", "-", "COUNT", "50"]),
        entries((ENTRIES - 50..ENTRIES).rev())
    );
    assert_eq!(
        c.cmd(&["XRANGE", "s", &format!("({}", id(100)), "+", "COUNT", "10"]),
        entries(101..111)
    );
    assert_eq!(
        c.cmd(&["XREAD", "COUNT", "5", "STREAMS", "s", "0-0"]),
        R::Array(vec![R::Array(vec![R::bulk("s"), entries(0..5)])])
    );
}

#[test]
fn evicted_entries_come_back_through_every_read() {
    let dir = TempDir::new();
    let broker = start_in(&dir.0, 2, config());
    let mut c = Client::connect(broker.local_addr());
    produce(&mut c);

    // Two streams, each within its cache (plus an entry's worth).
    let cached = info(&mut c, "stream_cache_bytes");
    assert!(cached <= 2 * (CACHE + 512), "cached {cached} bytes");
    let blocking = info(&mut c, "entries_read_back_blocking");
    let ahead = info(&mut c, "entries_read_back_ahead");

    check_reads(&mut c);
    assert_eq!(
        c.cmd(&["XGROUP", "CREATE", "s", "g", "0"]),
        R::Status("OK".into())
    );
    for (from, count) in [(">", 300), ("0", 40)] {
        let count = count.to_string();
        let args = [
            "XREADGROUP",
            "GROUP",
            "g",
            "c1",
            "COUNT",
            &count,
            "STREAMS",
            "s",
            from,
        ];
        let want = entries(0..count.parse().unwrap());
        assert_eq!(
            c.cmd(&args),
            R::Array(vec![R::Array(vec![R::bulk("s"), want])])
        );
    }
    assert_eq!(
        c.cmd(&["XCLAIM", "s", "g", "c2", "0", &id(7), &id(200)]),
        R::Array(vec![entry(&id(7), 7), entry(&id(200), 200)])
    );
    match c.cmd(&["XAUTOCLAIM", "s", "g", "c3", "0", "0-0", "COUNT", "20"]) {
        R::Array(parts) => assert_eq!(parts[1], entries(0..20)),
        other => panic!("XAUTOCLAIM: {other:?}"),
    }
    let full = c.cmd(&["XINFO", "STREAM", "s", "FULL", "COUNT", "3"]);
    let R::Array(full) = full else {
        panic!("XINFO STREAM FULL: {full:?}")
    };
    let at = full.iter().position(|k| *k == R::bulk("entries")).unwrap();
    assert_eq!(full[at + 1], entries(0..3));
    let info_stream = c.cmd(&["XINFO", "STREAM", "s"]);
    let R::Array(info_stream) = info_stream else {
        panic!("XINFO STREAM: {info_stream:?}")
    };
    let at = info_stream
        .iter()
        .position(|k| *k == R::bulk("first-entry"))
        .unwrap();
    assert_eq!(info_stream[at + 1], entry(&id(0), 0));

    // A read over several streams (of one shard) runs as a transaction of
    // its own, so that it sees each transaction in all of them or none:
    // its reads are planned and fetched ahead all the same.
    for (create, read) in [
        (
            None,
            vec!["XREAD", "COUNT", "5", "STREAMS", "s", "t", "0-0", "0-0"],
        ),
        (
            Some("g2"),
            vec![
                "XREADGROUP",
                "GROUP",
                "g2",
                "c",
                "COUNT",
                "5",
                "STREAMS",
                "s",
                "t",
                ">",
                ">",
            ],
        ),
    ] {
        if let Some(group) = create {
            for stream in ["s", "t"] {
                assert_eq!(
                    c.cmd(&["XGROUP", "CREATE", stream, group, "0"]),
                    R::Status("OK".into())
                );
            }
        }
        match c.cmd(&read) {
            R::Array(per_stream) => assert_eq!(
                per_stream[0],
                R::Array(vec![R::bulk("s"), entries(0..5)]),
                "{read:?}"
            ),
            other => panic!("{read:?}: {other:?}"),
        }
    }

    // All of that read old entries through the ring, none blocking.
    assert_eq!(info(&mut c, "entries_read_back_blocking"), blocking);
    assert!(info(&mut c, "entries_read_back_ahead") >= ahead + ENTRIES as u64);
    let cached = info(&mut c, "stream_cache_bytes");
    assert!(
        cached <= 2 * (CACHE + 512),
        "cached {cached} bytes after reads"
    );

    // A transaction's reads are not planned ahead: they read back with
    // blocking reads, and answer the same.
    assert_eq!(c.cmd(&["MULTI"]), R::Status("OK".into()));
    assert_eq!(
        c.cmd(&["XRANGE", "s", "-", "+", "COUNT", "3"]),
        R::Status("QUEUED".into())
    );
    assert_eq!(c.cmd(&["EXEC"]), R::Array(vec![entries(0..3)]));
    assert!(info(&mut c, "entries_read_back_blocking") > blocking);

    // A panic restart reads the stream back, keeping only its cache.
    assert!(matches!(
        c.cmd(&["DEBUG", "PANIC-STREAM", "s"]),
        R::Error(_)
    ));
    check_reads(&mut c);
    drop(c);
    broker.shutdown();

    // A restart, and a restart with another shard count (every stream
    // written again from entries read back from the old logs).
    for shards in [2, 1] {
        let broker = start_in(&dir.0, shards, config());
        let mut c = Client::connect(broker.local_addr());
        check_reads(&mut c);
        let cached = info(&mut c, "stream_cache_bytes");
        assert!(
            cached <= 2 * (CACHE + 512),
            "cached {cached} bytes after a restart"
        );
        assert_eq!(
            c.cmd(&["XTRIM", "s", "MAXLEN", "1000"]),
            R::Int(ENTRIES as i64 - 1000)
        );
        assert_eq!(
            c.cmd(&["XRANGE", "s", "-", "+", "COUNT", "2"]),
            entries(ENTRIES - 1000..ENTRIES - 998)
        );
        drop(c);
        broker.shutdown();
        // The trim is undone for the next round's checks.
        let broker = start_in(&dir.0, shards, config());
        let mut c = Client::connect(broker.local_addr());
        assert_eq!(c.cmd(&["DEL", "s"]), R::Int(1));
        produce(&mut c);
        drop(c);
        broker.shutdown();
    }
}
