//! Segment removal: with small segments, streams that are trimmed, idle,
//! deleted or grouped let their old segments go, the data directory stays
//! small, and every restart (same shard count, another one, after a
//! rewrite that did not finish) finds the same state. And a stream read
//! back from what is left of its log when its actor panics.

use mailring_broker::{Broker, BrokerConfig};

mod common;
use common::client::{start_in, Client, R};
use common::{power_loss_image, segment_files, TempDir};

const SEGMENT: u64 = 4096;

fn config() -> BrokerConfig {
    let mut config = BrokerConfig::default();
    config.store.segment_bytes = SEGMENT;
    config
}

/// What a client can see of the streams, without times or node counts
/// (a restart lays nodes out afresh).
fn state(c: &mut Client) -> Vec<R> {
    let mut out = Vec::new();
    let mut keys = match c.cmd(&["KEYS", "*"]) {
        R::Array(keys) => keys.iter().map(R::text).collect::<Vec<_>>(),
        other => panic!("KEYS: {other:?}"),
    };
    keys.sort();
    for key in &keys {
        out.push(R::bulk(key));
        out.push(c.cmd(&["XRANGE", key, "-", "+"]));
        let info = match c.cmd(&["XINFO", "STREAM", key]) {
            R::Array(items) => items
                .chunks(2)
                .filter(|kv| !kv[0].text().starts_with("radix"))
                .flat_map(|kv| kv.to_vec())
                .collect(),
            other => panic!("XINFO STREAM: {other:?}"),
        };
        out.push(R::Array(info));
        let groups = c.cmd(&["XINFO", "GROUPS", key]);
        if let R::Array(groups) = &groups {
            for g in groups {
                let R::Array(fields) = g else { continue };
                out.push(c.cmd(&["XPENDING", key, &fields[1].text()]));
            }
        }
        out.push(groups);
    }
    out
}

fn generations(dir: &std::path::Path) -> Vec<String> {
    let mut gens: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("gen-"))
        .collect();
    gens.sort();
    gens
}

/// `XREADGROUP GROUP g c COUNT count STREAMS key >`: the ids delivered.
fn read_group(c: &mut Client, key: &str, count: usize) -> Vec<String> {
    let count = count.to_string();
    let args = [
        "XREADGROUP",
        "GROUP",
        "g",
        "c",
        "COUNT",
        &count,
        "STREAMS",
        key,
        ">",
    ];
    let read = c.cmd(&args);
    let R::Array(streams) = read else {
        panic!("XREADGROUP: {read:?}")
    };
    let R::Array(stream) = &streams[0] else {
        panic!()
    };
    let R::Array(entries) = &stream[1] else {
        panic!()
    };
    entries
        .iter()
        .map(|e| match e {
            R::Array(e) => e[0].text(),
            other => panic!("{other:?}"),
        })
        .collect()
}

/// Traffic that writes about a hundred segments: a hot trimmed stream
/// read by a group, an idle stream with a group and no entries, an idle
/// stream with two entries, and a deleted stream.
fn traffic(c: &mut Client) {
    assert_eq!(
        c.cmd(&["XGROUP", "CREATE", "idle-group", "g", "$", "MKSTREAM"]),
        R::Status("OK".into())
    );
    c.cmd(&["XADD", "idle-small", "1-1", "k", "v"]);
    c.cmd(&["XADD", "idle-small", "1-2", "k", "w"]);
    c.cmd(&["XADD", "gone", "*", "k", "v"]);
    assert_eq!(c.cmd(&["DEL", "gone"]), R::Int(1));
    assert_eq!(
        c.cmd(&["XGROUP", "CREATE", "hot", "g", "$", "MKSTREAM"]),
        R::Status("OK".into())
    );
    let payload = "x".repeat(200);
    for round in 0..300 {
        for _ in 0..5 {
            let r = c.cmd(&["XADD", "hot", "MAXLEN", "20", "*", "f", &payload]);
            assert!(matches!(r, R::Bulk(_)), "{r:?}");
        }
        let ids = read_group(c, "hot", 5);
        assert_eq!(ids.len(), 5);
        // The last round leaves two pending.
        let acked = if round == 299 { 3 } else { 5 };
        let mut ack = vec!["XACK", "hot", "g"];
        ack.extend(ids[..acked].iter().map(String::as_str));
        assert_eq!(c.cmd(&ack), R::Int(acked as i64));
    }
}

#[test]
fn old_segments_go_and_every_restart_finds_the_same_state() {
    let dir = TempDir::new();
    let broker = start_in(&dir.0, 1, config());
    let mut c = Client::connect(broker.local_addr());
    traffic(&mut c);
    let before = state(&mut c);
    assert_eq!(c.cmd(&["EXISTS", "gone"]), R::Int(0));
    assert_eq!(c.cmd(&["XLEN", "hot"]), R::Int(20));
    let files = segment_files(&dir.0);
    // ~100 segments were written; the hot stream needs its last two or
    // three, the idle ones move up every few segments.
    assert!(
        files.len() <= 12,
        "{} segments kept: {files:?}",
        files.len()
    );
    assert!(
        files.iter().all(|f| !f.ends_with("0000000000000001.seg")),
        "the first segment is still there: {files:?}"
    );
    drop(c);
    broker.shutdown();

    // The same shard count: the same generation, the same state.
    let broker = start_in(&dir.0, 1, config());
    assert!(!broker.recovery().migrated);
    let mut c = Client::connect(broker.local_addr());
    assert_eq!(state(&mut c), before);
    drop(c);
    broker.shutdown();

    // Another shard count: rewritten into one new generation.
    let broker = start_in(&dir.0, 2, config());
    assert!(broker.recovery().migrated);
    assert_eq!(generations(&dir.0), vec!["gen-00002".to_owned()]);
    let mut c = Client::connect(broker.local_addr());
    assert_eq!(state(&mut c), before);
    // Still writable, and its groups go on where they were.
    let r = c.cmd(&["XREADGROUP", "GROUP", "g", "c", "STREAMS", "hot", ">"]);
    assert_eq!(r, R::Nil, "nothing new for the group");
    assert!(matches!(c.cmd(&["XADD", "hot", "*", "f", "v"]), R::Bulk(_)));
    drop(c);
    broker.shutdown();
}

#[test]
fn a_rewrite_that_did_not_finish_is_dropped_and_the_old_generation_kept() {
    let dir = TempDir::new();
    let broker: Broker = start_in(&dir.0, 2, config());
    let mut c = Client::connect(broker.local_addr());
    for i in 0..50 {
        c.cmd(&["XADD", &format!("s{}", i % 7), "*", "n", &i.to_string()]);
    }
    let before = state(&mut c);
    drop(c);
    broker.shutdown();
    // A crash while rewriting for another shard count leaves a new
    // generation without its COMPLETE mark.
    let partial = dir.0.join("gen-00002").join("log-000");
    std::fs::create_dir_all(&partial).unwrap();
    std::fs::write(partial.join("0000000000000001.seg"), b"half a segment").unwrap();
    let broker = start_in(&dir.0, 2, config());
    assert!(!broker.recovery().migrated);
    assert_eq!(generations(&dir.0), vec!["gen-00001".to_owned()]);
    let mut c = Client::connect(broker.local_addr());
    assert_eq!(state(&mut c), before);
    drop(c);
    broker.shutdown();
}

#[test]
fn logs_in_the_older_layout_are_rewritten_into_a_generation() {
    let dir = TempDir::new();
    let broker = start_in(&dir.0, 1, config());
    let mut c = Client::connect(broker.local_addr());
    for i in 0..30 {
        c.cmd(&["XADD", &format!("s{}", i % 3), "*", "n", &i.to_string()]);
    }
    c.cmd(&["XGROUP", "CREATE", "s1", "g", "0"]);
    read_group(&mut c, "s1", 2);
    let before = state(&mut c);
    drop(c);
    broker.shutdown();
    // The layout before generations: log directories at the top.
    let gen = dir.0.join("gen-00001");
    for entry in std::fs::read_dir(&gen).unwrap().flatten() {
        if entry.file_name().to_string_lossy().starts_with("log-") {
            std::fs::rename(entry.path(), dir.0.join(entry.file_name())).unwrap();
        }
    }
    std::fs::remove_dir_all(&gen).unwrap();
    let broker = start_in(&dir.0, 1, config());
    assert!(broker.recovery().migrated);
    assert_eq!(generations(&dir.0), vec!["gen-00001".to_owned()]);
    assert!(!dir.0.join("log-000").exists());
    let mut c = Client::connect(broker.local_addr());
    assert_eq!(state(&mut c), before);
    drop(c);
    broker.shutdown();
}

/// Under `appendfsync no` nothing waits for a flush but the roll of a
/// segment, and segments go only once the records that let them go are
/// flushed: a power loss with later writes in flight (and their segment
/// rolls held) leaves every stream whole, groups included.
#[test]
fn a_power_loss_after_segments_went_finds_every_stream_whole() {
    let dir = TempDir::new();
    let image = TempDir::new();
    let gate = mailring_broker::SyncGate::new();
    let mut config = config();
    config.store.fsync = mailring_broker::Fsync::No;
    config.store.sync_gate = Some(gate.clone());
    let broker = start_in(&dir.0, 1, config);
    let mut c = Client::connect(broker.local_addr());
    traffic(&mut c);
    assert!(segment_files(&dir.0).len() <= 12);
    // Flushes held: a burst that needs several segment rolls.
    gate.close();
    let payload = "y".repeat(200);
    let mut burst = Vec::new();
    for _ in 0..100 {
        burst.extend(common::encode(&[
            b"XADD",
            b"hot",
            b"MAXLEN",
            b"20",
            b"*",
            b"f",
            payload.as_bytes(),
        ]));
    }
    c.send_raw(&burst);
    std::thread::sleep(std::time::Duration::from_millis(300));
    power_loss_image(&dir.0, &image.0, &broker.durable_files());
    gate.open();
    for _ in 0..100 {
        assert!(matches!(c.read(), R::Bulk(_)));
    }
    drop(c);
    broker.shutdown();

    let broker = start_in(&image.0, 1, self::config());
    let mut c = Client::connect(broker.local_addr());
    let groups = |c: &mut Client, key: &str| match c.cmd(&["XINFO", "GROUPS", key]) {
        R::Array(groups) => groups.len(),
        other => panic!("XINFO GROUPS {key}: {other:?}"),
    };
    assert_eq!(groups(&mut c, "idle-group"), 1);
    assert_eq!(groups(&mut c, "hot"), 1);
    assert_eq!(c.cmd(&["XLEN", "idle-small"]), R::Int(2));
    assert_eq!(c.cmd(&["EXISTS", "gone"]), R::Int(0));
    let R::Int(len) = c.cmd(&["XLEN", "hot"]) else {
        panic!()
    };
    assert!((1..=20).contains(&len), "hot has {len} entries");
    drop(c);
    broker.shutdown();
}

#[test]
fn a_stream_whose_actor_panicked_is_read_back_from_its_log() {
    let dir = TempDir::new();
    let mut config = config();
    config.debug_commands = true;
    let broker = start_in(&dir.0, 2, config);
    let mut c = Client::connect(broker.local_addr());
    let payload = "p".repeat(100);
    for i in 0..200 {
        let r = c.cmd(&[
            "XADD",
            "s",
            "MAXLEN",
            "50",
            "*",
            "n",
            &i.to_string(),
            "p",
            &payload,
        ]);
        assert!(matches!(r, R::Bulk(_)), "{r:?}");
    }
    c.cmd(&["XADD", "other", "*", "k", "v"]);
    assert_eq!(
        c.cmd(&["XGROUP", "CREATE", "s", "g", "0"]),
        R::Status("OK".into())
    );
    read_group(&mut c, "s", 7);
    let R::Array(page) = c.cmd(&["XRANGE", "s", "-", "+", "COUNT", "3"]) else {
        panic!()
    };
    let id = |e: &R| match e {
        R::Array(e) => e[0].text(),
        other => panic!("{other:?}"),
    };
    assert_eq!(c.cmd(&["XACK", "s", "g", &id(&page[0])]), R::Int(1));
    assert_eq!(c.cmd(&["XDEL", "s", &id(&page[2])]), R::Int(1));
    let before = state(&mut c);
    // Some of the stream's segments are gone: it is read back from what
    // is left.
    let files = segment_files(&dir.0);
    let highest = files
        .iter()
        .filter_map(|f| u32::from_str_radix(f.file_stem()?.to_str()?, 16).ok())
        .max()
        .unwrap();
    assert!(files.len() < highest as usize, "{files:?}");

    let r = c.cmd(&["DEBUG", "PANIC-STREAM", "s"]);
    assert!(matches!(r, R::Error(_)), "{r:?}");
    // Restarted by its supervisor, it reads its stream back on its next
    // command: entries, counters, the group and its pending entries.
    assert_eq!(state(&mut c), before);
    assert!(matches!(
        c.cmd(&["XADD", "s", "*", "n", "last"]),
        R::Bulk(_)
    ));
    assert_eq!(c.cmd(&["XLEN", "s"]), R::Int(50));
    let after = state(&mut c);
    drop(c);
    broker.shutdown();
    // What it logged after the restart recovers as well.
    let broker = start_in(&dir.0, 2, self::config());
    let mut c = Client::connect(broker.local_addr());
    assert_eq!(state(&mut c), after);
    // Without the test setting there is no such command.
    let r = c.cmd(&["DEBUG", "PANIC-STREAM", "s"]);
    assert!(
        matches!(&r, R::Error(e) if e.starts_with("ERR unknown command")),
        "{r:?}"
    );
    drop(c);
    broker.shutdown();
}

#[test]
fn a_lone_generation_without_its_mark_is_refused_not_dropped() {
    let dir = TempDir::new();
    let broker = start_in(&dir.0, 1, config());
    let mut c = Client::connect(broker.local_addr());
    c.cmd(&["XADD", "s", "*", "k", "v"]);
    drop(c);
    broker.shutdown();
    let mark = dir.0.join("gen-00001").join("COMPLETE");
    std::fs::remove_file(&mark).unwrap();
    let mut config = config();
    config.addr = "127.0.0.1:0".parse().unwrap();
    config.store.dir = dir.0.clone();
    let err = Broker::start(config).expect_err("a generation without its mark");
    assert!(err.to_string().contains("COMPLETE"), "{err}");
    assert!(!segment_files(&dir.0).is_empty(), "nothing was removed");
    // Restoring the mark brings the stream back.
    std::fs::write(&mark, "logs 1\n").unwrap();
    let broker = start_in(&dir.0, 1, self::config());
    let mut c = Client::connect(broker.local_addr());
    assert_eq!(c.cmd(&["XLEN", "s"]), R::Int(1));
    drop(c);
    broker.shutdown();
}

/// Stream `key` holds one entry, `id` with `a` = `value`.
fn assert_only_entry(c: &mut Client, key: &str, id: &str, value: &str) {
    assert_eq!(
        c.cmd(&["XRANGE", key, "-", "+"]),
        R::Array(vec![R::Array(vec![
            R::bulk(id),
            R::Array(vec![R::bulk("a"), R::bulk(value)])
        ])])
    );
}

#[test]
fn a_deleted_stream_made_again_after_its_actor_panicked_keeps_its_entries_across_a_restart() {
    let dir = TempDir::new();
    let mut config = config();
    config.debug_commands = true;
    let broker = start_in(&dir.0, 1, config.clone());
    let mut c = Client::connect(broker.local_addr());
    // "filler" holds every segment from its first on, so the deleted
    // stream's records stay on disk after its deletion is flushed.
    assert!(matches!(
        c.cmd(&["XADD", "filler", "*", "n", "0"]),
        R::Bulk(_)
    ));
    assert_eq!(c.cmd(&["XADD", "s", "1-1", "a", "1"]), R::bulk("1-1"));
    assert_eq!(c.cmd(&["XADD", "s", "2-1", "a", "2"]), R::bulk("2-1"));
    assert_eq!(c.cmd(&["DEL", "s"]), R::Int(1));
    // Segments roll past the deletion (each roll collects what the
    // streams need: the deleted one needs nothing now).
    let payload = "p".repeat(200);
    for i in 0..100 {
        let r = c.cmd(&["XADD", "filler", "*", "n", &i.to_string(), "p", &payload]);
        assert!(matches!(r, R::Bulk(_)), "{r:?}");
    }
    let r = c.cmd(&["DEBUG", "PANIC-STREAM", "s"]);
    assert!(matches!(r, R::Error(_)), "{r:?}");
    // Made again by its restarted actor: acknowledged, so it must survive.
    assert_eq!(c.cmd(&["XADD", "s", "5-1", "a", "5"]), R::bulk("5-1"));
    assert_eq!(c.cmd(&["XLEN", "s"]), R::Int(1));
    let before = state(&mut c);
    drop(c);
    broker.shutdown();
    let broker = start_in(&dir.0, 1, config.clone());
    let mut c = Client::connect(broker.local_addr());
    assert_only_entry(&mut c, "s", "5-1", "5");
    assert_eq!(state(&mut c), before);
    // Deleted again, and the broker restarted: the log knows the deleted
    // stream from the start (its records are on disk), so a panic and a
    // new XADD go on from its operation numbers too.
    assert_eq!(c.cmd(&["DEL", "s"]), R::Int(1));
    drop(c);
    broker.shutdown();
    let broker = start_in(&dir.0, 1, config.clone());
    let mut c = Client::connect(broker.local_addr());
    let r = c.cmd(&["DEBUG", "PANIC-STREAM", "s"]);
    assert!(matches!(r, R::Error(_)), "{r:?}");
    assert_eq!(c.cmd(&["XADD", "s", "9-1", "a", "9"]), R::bulk("9-1"));
    drop(c);
    broker.shutdown();
    let broker = start_in(&dir.0, 1, config);
    let mut c = Client::connect(broker.local_addr());
    assert_only_entry(&mut c, "s", "9-1", "9");
    drop(c);
    broker.shutdown();
}

#[test]
fn a_stream_made_and_deleted_in_one_transaction_after_its_log_forgot_it_keeps_later_entries() {
    let dir = TempDir::new();
    let mut config = config();
    config.debug_commands = true;
    let broker = start_in(&dir.0, 1, config.clone());
    let mut c = Client::connect(broker.local_addr());
    assert_eq!(c.cmd(&["XADD", "s", "1-1", "a", "1"]), R::bulk("1-1"));
    assert_eq!(c.cmd(&["XADD", "s", "2-1", "a", "2"]), R::bulk("2-1"));
    assert_eq!(c.cmd(&["DEL", "s"]), R::Int(1));
    let first_segments = segment_files(&dir.0);
    // Segments roll and the old ones go ("other" keeps one entry, and
    // its history moves up by snapshots): the log forgets `s`.
    let payload = "p".repeat(200);
    for i in 0..100 {
        let n = i.to_string();
        let r = c.cmd(&["XADD", "other", "MAXLEN", "1", "*", "n", &n, "p", &payload]);
        assert!(matches!(r, R::Bulk(_)), "{r:?}");
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while segment_files(&dir.0).contains(&first_segments[0]) {
        assert!(
            std::time::Instant::now() < deadline,
            "the first segment stayed: {:?}",
            segment_files(&dir.0)
        );
        let r = c.cmd(&["XADD", "other", "MAXLEN", "1", "*", "n", "x", "p", &payload]);
        assert!(matches!(r, R::Bulk(_)), "{r:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // Made and deleted in one transaction (its actor goes on numbering
    // its operations), then the actor panics and makes it again.
    assert_eq!(c.cmd(&["MULTI"]), R::Status("OK".into()));
    assert_eq!(
        c.cmd(&["XADD", "s", "3-1", "a", "3"]),
        R::Status("QUEUED".into())
    );
    assert_eq!(c.cmd(&["DEL", "s"]), R::Status("QUEUED".into()));
    assert_eq!(c.cmd(&["EXEC"]), R::Array(vec![R::bulk("3-1"), R::Int(1)]));
    let r = c.cmd(&["DEBUG", "PANIC-STREAM", "s"]);
    assert!(matches!(r, R::Error(_)), "{r:?}");
    assert_eq!(c.cmd(&["XADD", "s", "5-1", "a", "5"]), R::bulk("5-1"));
    let before = state(&mut c);
    drop(c);
    broker.shutdown();
    let broker = start_in(&dir.0, 1, config);
    let mut c = Client::connect(broker.local_addr());
    assert_only_entry(&mut c, "s", "5-1", "5");
    assert_eq!(state(&mut c), before);
    drop(c);
    broker.shutdown();
}

#[test]
fn a_stream_capped_at_one_entry_under_steady_writes_keeps_few_segments() {
    let dir = TempDir::new();
    let broker = start_in(&dir.0, 1, config());
    let mut c = Client::connect(broker.local_addr());
    // A stream made and deleted first shares the first segment.
    assert_eq!(c.cmd(&["XADD", "s", "1-1", "a", "1"]), R::bulk("1-1"));
    assert_eq!(c.cmd(&["DEL", "s"]), R::Int(1));
    // Each write trims the one before: the stream needs only its newest
    // segment, and its history moves up by a snapshot at every roll.
    let payload = "p".repeat(200);
    for i in 0..400 {
        let n = i.to_string();
        let r = c.cmd(&["XADD", "capped", "MAXLEN", "1", "*", "n", &n, "p", &payload]);
        assert!(matches!(r, R::Bulk(_)), "{r:?}");
    }
    let files = segment_files(&dir.0);
    // ~25 segments written.
    assert!(files.len() <= 8, "{} segments kept: {files:?}", files.len());
    assert_eq!(c.cmd(&["XLEN", "capped"]), R::Int(1));
    drop(c);
    broker.shutdown();
}

#[test]
fn actors_of_deleted_streams_end_and_a_stream_made_again_numbers_on() {
    let dir = TempDir::new();
    let config = config();
    let broker = start_in(&dir.0, 1, config.clone());
    let mut c = Client::connect(broker.local_addr());
    assert!(matches!(
        c.cmd(&["XADD", "kept", "*", "f", "v"]),
        R::Bulk(_)
    ));
    for i in 0..60 {
        let key = format!("tmp:{i}");
        assert_eq!(c.cmd(&["XADD", &key, "1-1", "f", "v"]), R::bulk("1-1"));
        assert_eq!(c.cmd(&["XADD", &key, "1-2", "f", "v"]), R::bulk("1-2"));
        if i % 3 == 0 {
            // Made again and deleted in one transaction as well.
            assert_eq!(c.cmd(&["DEL", &key]), R::Int(1));
            assert_eq!(c.cmd(&["MULTI"]), R::Status("OK".into()));
            assert_eq!(
                c.cmd(&["XADD", &key, "1-3", "f", "v"]),
                R::Status("QUEUED".into())
            );
            assert_eq!(c.cmd(&["DEL", &key]), R::Status("QUEUED".into()));
            assert_eq!(c.cmd(&["EXEC"]), R::Array(vec![R::bulk("1-3"), R::Int(1)]));
        } else {
            assert_eq!(c.cmd(&["DEL", &key]), R::Int(1));
        }
    }
    // Only the stream that exists keeps an actor.
    assert_eq!(broker.active_streams(), 1);
    // Made again by fresh actors: their records go on from the deleted
    // streams' operation numbers, so a restart (which orders a stream's
    // records by them when it reads a whole generation) finds them.
    for i in [0, 1, 2, 30, 59] {
        let key = format!("tmp:{i}");
        assert_eq!(c.cmd(&["XADD", &key, "5-1", "a", "5"]), R::bulk("5-1"));
    }
    let before = state(&mut c);
    drop(c);
    broker.shutdown();
    let broker = start_in(&dir.0, 1, config);
    let mut c = Client::connect(broker.local_addr());
    for i in [0, 1, 2, 30, 59] {
        assert_only_entry(&mut c, &format!("tmp:{i}"), "5-1", "5");
    }
    assert_eq!(state(&mut c), before);
    drop(c);
    broker.shutdown();
}

#[test]
fn a_stream_whose_actor_panicked_right_after_making_it_numbers_on_from_what_it_logged() {
    let dir = TempDir::new();
    let mut config = config();
    config.debug_commands = true;
    let broker = start_in(&dir.0, 1, config.clone());
    let mut c = Client::connect(broker.local_addr());
    assert_eq!(c.cmd(&["XADD", "gone", "1-1", "a", "1"]), R::bulk("1-1"));
    assert_eq!(c.cmd(&["DEL", "gone"]), R::Int(1));
    // A deleted stream and one never made, each made by an add whose
    // actor then panics in the same run of pipelined commands, before it
    // told its log anything: the add is logged, its reply is an error.
    for key in ["gone", "never"] {
        let mut wire = Vec::new();
        for args in [
            vec!["XADD", key, "9-1", "a", "9"],
            vec!["DEBUG", "PANIC-STREAM", key],
        ] {
            wire.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
            for a in args {
                wire.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
            }
        }
        c.send_raw(&wire);
        let (add, panic) = (c.read(), c.read());
        assert!(matches!(panic, R::Error(_)), "{panic:?}");
        assert!(matches!(add, R::Error(_) | R::Bulk(_)), "{add:?}");
        // The restarted actor goes on from the logged add: what it
        // answers now is what a restart finds.
        let r = c.cmd(&["XADD", key, "6-1", "a", "6"]);
        assert!(matches!(r, R::Error(_) | R::Bulk(_)), "{r:?}");
    }
    let before = state(&mut c);
    drop(c);
    broker.shutdown();
    let broker = start_in(&dir.0, 1, config);
    let mut c = Client::connect(broker.local_addr());
    assert_eq!(state(&mut c), before);
    drop(c);
    broker.shutdown();
}

#[test]
fn blocked_readers_of_a_stream_whose_actor_panicked_are_served_by_its_next_activation() {
    // The watchers live in the actor: a panic drops them. Each reader is
    // woken then and watches the restarted actor, so the next XADD serves
    // it (a `BLOCK 0` reader would otherwise wait for good).
    let dir = TempDir::new();
    let mut config = config();
    config.debug_commands = true;
    let broker = start_in(&dir.0, 2, config);
    let mut c = Client::connect(broker.local_addr());
    assert!(matches!(c.cmd(&["XADD", "s", "1-0", "f", "v"]), R::Bulk(_)));
    assert_eq!(
        c.cmd(&["XGROUP", "CREATE", "s", "g", "$"]),
        R::Status("OK".into())
    );
    let mut plain = Client::connect(broker.local_addr());
    let mut grouped = Client::connect(broker.local_addr());
    plain.send_raw(&common::encode(&[
        b"XREAD", b"BLOCK", b"0", b"STREAMS", b"s", b"$",
    ]));
    grouped.send_raw(&common::blocking_group_read(b"s"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !c
        .cmd(&["INFO", "clients"])
        .text()
        .contains("blocked_clients:2")
    {
        assert!(std::time::Instant::now() < deadline, "never blocked");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // A reader counts as blocked before its watch reaches the actor: time
    // for the watches to arrive, so the panic drops them (this failed,
    // the readers never answered, before the watchers woke them).
    std::thread::sleep(std::time::Duration::from_millis(100));
    let r = c.cmd(&["DEBUG", "PANIC-STREAM", "s"]);
    assert!(matches!(&r, R::Error(_)), "{r:?}");
    assert_eq!(c.cmd(&["XADD", "s", "2-0", "a", "b"]), R::bulk("2-0"));
    let entry = R::Array(vec![R::Array(vec![
        R::bulk("s"),
        R::Array(vec![R::Array(vec![
            R::bulk("2-0"),
            R::Array(vec![R::bulk("a"), R::bulk("b")]),
        ])]),
    ])]);
    assert_eq!(plain.read(), entry);
    assert_eq!(grouped.read(), entry);
    broker.shutdown();
}
