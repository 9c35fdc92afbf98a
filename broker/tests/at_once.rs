//! Stream commands a session runs at once on an idle stream actor of its
//! shard (`Addr::run_now`, no ask): the same replies, in the same order,
//! as through the actor's mailbox, on the failure paths too (a command
//! that panics, one that must read evicted entries back from the log).

use mailring_broker::BrokerConfig;

mod common;
use common::client::{start_in, Client, R};
use common::{encode, TempDir};

fn send_pipeline(c: &mut Client, commands: &[&[&str]]) {
    let mut wire = Vec::new();
    for args in commands {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        wire.extend(encode(&args));
    }
    c.send_raw(&wire);
}

/// Adds entries `1-1` ..= `n-1` (field `n`), pipelined, and checks the
/// replies: past a node's 100 entries the first ones sit in closed nodes,
/// evicted once written when the stream cache is 0.
fn fill(c: &mut Client, n: usize) {
    let ids: Vec<String> = (1..=n).map(|i| format!("{i}-1")).collect();
    let values: Vec<String> = (1..=n).map(|i| i.to_string()).collect();
    let commands: Vec<Vec<&str>> = ids
        .iter()
        .zip(&values)
        .map(|(id, v)| vec!["XADD", "s", id.as_str(), "n", v.as_str()])
        .collect();
    let commands: Vec<&[&str]> = commands.iter().map(Vec::as_slice).collect();
    send_pipeline(c, &commands);
    for id in &ids {
        assert_eq!(c.read(), R::bulk(id));
    }
    assert_eq!(c.cmd(&["XLEN", "s"]), R::Int(n as i64));
}

/// Entries read back from the log by stream actors (`INFO`).
fn read_back(c: &mut Client) -> u64 {
    let R::Bulk(info) = c.cmd(&["INFO", "stats"]) else {
        panic!("INFO is a bulk string")
    };
    let info = String::from_utf8_lossy(&info).into_owned();
    info.lines()
        .find_map(|l| l.strip_prefix("entries_read_back_ahead:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("entries_read_back_ahead in INFO stats")
}

/// `XRANGE s - + COUNT 1` after [`fill`]: entry `1-1`.
fn first_entry_page() -> R {
    R::Array(vec![R::Array(vec![
        R::bulk("1-1"),
        R::Array(vec![R::bulk("n"), R::bulk("1")]),
    ])])
}

/// A broker of `shards` shards that keeps nothing cached once written
/// (stream cache 0): a read of a closed node goes to the log.
fn uncached(shards: usize) -> (TempDir, mailring_broker::Broker) {
    let dir = TempDir::new();
    let mut config = BrokerConfig::default();
    config.store.stream_cache_bytes = 0;
    let broker = start_in(&dir.0, shards, config);
    (dir, broker)
}

fn is_unavailable(r: &R) -> bool {
    matches!(r, R::Error(e) if e.starts_with("ERR stream unavailable"))
}

#[test]
fn single_commands_and_runs_on_an_idle_actor_run_at_once() {
    let dir = TempDir::new();
    let broker = start_in(&dir.0, 1, BrokerConfig::default());
    let mut c = Client::connect(broker.local_addr());
    assert_eq!(c.cmd(&["XADD", "a", "1-1", "f", "v"]), R::bulk("1-1"));
    assert_eq!(c.cmd(&["XADD", "b", "1-1", "f", "v"]), R::bulk("1-1"));
    let before = broker.streams_run_at_once();
    assert_eq!(c.cmd(&["XLEN", "a"]), R::Int(1));
    send_pipeline(
        &mut c,
        &[
            &["XADD", "a", "2-1", "f", "v"],
            &["XADD", "b", "2-1", "f", "v"],
            &["XADD", "a", "1-1", "f", "v"],
            &["XLEN", "a"],
        ],
    );
    assert_eq!(c.read(), R::bulk("2-1"));
    assert_eq!(c.read(), R::bulk("2-1"));
    assert!(matches!(c.read(), R::Error(e) if e.contains("equal or smaller")));
    assert_eq!(c.read(), R::Int(2));
    // One for XLEN, one per stream of the run.
    assert_eq!(broker.streams_run_at_once() - before, 3);
    broker.shutdown();
}

#[test]
fn a_command_that_panics_fails_itself_and_what_follows_on_its_stream_only() {
    let dir = TempDir::new();
    let config = BrokerConfig {
        debug_commands: true,
        ..BrokerConfig::default()
    };
    let broker = start_in(&dir.0, 1, config);
    let mut c = Client::connect(broker.local_addr());
    assert_eq!(c.cmd(&["XADD", "a", "1-1", "f", "v"]), R::bulk("1-1"));
    assert_eq!(c.cmd(&["XADD", "b", "1-1", "f", "v"]), R::bulk("1-1"));
    let before = broker.streams_run_at_once();
    send_pipeline(
        &mut c,
        &[
            &["XADD", "a", "2-1", "f", "v"],
            &["XADD", "b", "2-1", "f", "v"],
            &["DEBUG", "PANIC-STREAM", "a"],
            &["XADD", "a", "3-1", "f", "v"],
            &["XLEN", "b"],
            &["PING"],
        ],
    );
    // The XADD before the panic ran and answers its id (through an ask,
    // the whole run on `a` failed with the handler).
    assert_eq!(c.read(), R::bulk("2-1"));
    assert_eq!(c.read(), R::bulk("2-1"));
    let r = c.read();
    assert!(is_unavailable(&r), "{r:?}");
    // Not run: the actor's state was half changed.
    let r = c.read();
    assert!(is_unavailable(&r), "{r:?}");
    assert_eq!(c.read(), R::Int(2));
    assert_eq!(c.read(), R::Status("PONG".into()));
    assert!(broker.streams_run_at_once() > before, "ran at once");
    // Restarted from its log: the entry added before the panic is there,
    // the one after it is not.
    assert_eq!(c.cmd(&["XLEN", "a"]), R::Int(2));
    assert_eq!(c.cmd(&["XADD", "a", "3-1", "f", "v"]), R::bulk("3-1"));
    broker.shutdown();
}

#[test]
fn a_run_reaching_evicted_entries_answers_the_rest_through_the_actor_in_order() {
    // A range read of a closed node goes to the log.
    let (_dir, broker) = uncached(1);
    let mut c = Client::connect(broker.local_addr());
    fill(&mut c, 250);
    let read_before = read_back(&mut c);
    let before = broker.streams_run_at_once();
    send_pipeline(
        &mut c,
        &[
            &["XADD", "s", "251-1", "n", "251"],
            &["XRANGE", "s", "-", "+", "COUNT", "1"],
            &["XADD", "s", "252-1", "n", "252"],
            &["XLEN", "s"],
        ],
    );
    assert_eq!(c.read(), R::bulk("251-1"));
    assert_eq!(c.read(), first_entry_page());
    assert_eq!(c.read(), R::bulk("252-1"));
    assert_eq!(c.read(), R::Int(252));
    // The first XADD ran at once; the range read, and what followed it,
    // went to the actor, which read the entry back.
    assert_eq!(broker.streams_run_at_once() - before, 1);
    assert!(
        read_back(&mut c) > read_before,
        "the XRANGE read nothing back"
    );
    broker.shutdown();
}

#[test]
fn a_group_read_on_an_idle_actor_runs_at_once_and_one_of_evicted_entries_is_asked() {
    // A history read goes to the log.
    let (_dir, broker) = uncached(1);
    let mut c = Client::connect(broker.local_addr());
    assert_eq!(
        c.cmd(&["XGROUP", "CREATE", "s", "g", "$", "MKSTREAM"]),
        R::Status("OK".into())
    );
    // Written and flushed out of the cache before the read.
    assert_eq!(c.cmd(&["XADD", "s", "1-1", "n", "1"]), R::bulk("1-1"));
    assert_eq!(c.cmd(&["XLEN", "s"]), R::Int(1));
    let entry = |id: &str, n: &str| {
        R::Array(vec![R::Array(vec![
            R::bulk("s"),
            R::Array(vec![R::Array(vec![
                R::bulk(id),
                R::Array(vec![R::bulk("n"), R::bulk(n)]),
            ])]),
        ])])
    };
    // `>` of what was just added: new entries are read from the stream's
    // newest, in memory until written... or read back: either way, right.
    let before = broker.streams_run_at_once();
    assert_eq!(
        c.cmd(&["XREADGROUP", "GROUP", "g", "a", "STREAMS", "s", ">"]),
        entry("1-1", "1")
    );
    // Its history (the pending entry) is evicted: asked, read back.
    assert_eq!(
        c.cmd(&["XREADGROUP", "GROUP", "g", "a", "STREAMS", "s", "0"]),
        entry("1-1", "1")
    );
    // An empty `>` needs nothing evicted: at once.
    let mid = broker.streams_run_at_once();
    assert_eq!(
        c.cmd(&["XREADGROUP", "GROUP", "g", "a", "STREAMS", "s", ">"]),
        R::Nil
    );
    assert_eq!(
        broker.streams_run_at_once() - mid,
        1,
        "the empty read ran at once"
    );
    assert!(mid >= before);
    // What the reads delivered is pending, as through the actor.
    assert_eq!(c.pending_count("s", "g"), R::Int(1));
    // A missing group is the same error either way.
    let r = c.cmd(&["XREADGROUP", "GROUP", "nope", "a", "STREAMS", "s", ">"]);
    assert!(
        matches!(&r, R::Error(e) if e.starts_with("NOGROUP")),
        "{r:?}"
    );
    broker.shutdown();
}

#[test]
fn a_group_read_of_several_streams_on_idle_actors_runs_at_once() {
    let dir = TempDir::new();
    let broker = start_in(&dir.0, 1, BrokerConfig::default());
    let mut c = Client::connect(broker.local_addr());
    for s in ["a", "b"] {
        assert_eq!(
            c.cmd(&["XGROUP", "CREATE", s, "g", "0", "MKSTREAM"]),
            R::Status("OK".into())
        );
        assert_eq!(c.cmd(&["XADD", s, "1-1", "n", s]), R::bulk("1-1"));
    }
    let both = |id: &str| {
        let one = |s: &str| {
            R::Array(vec![
                R::bulk(s),
                R::Array(vec![R::Array(vec![
                    R::bulk(id),
                    R::Array(vec![R::bulk("n"), R::bulk(s)]),
                ])]),
            ])
        };
        R::Array(vec![one("a"), one("b")])
    };
    let read = |c: &mut Client, second: &str, ids: [&str; 2]| {
        c.cmd(&[
            "XREADGROUP",
            "GROUP",
            "g",
            "c",
            "STREAMS",
            "a",
            second,
            ids[0],
            ids[1],
        ])
    };
    let before = broker.streams_run_at_once();
    assert_eq!(read(&mut c, "b", [">", ">"]), both("1-1"));
    // Each group checked, then each stream read: four runs, no ask.
    assert_eq!(broker.streams_run_at_once() - before, 4);
    // The history of both: what `>` delivered is pending.
    assert_eq!(read(&mut c, "b", ["0", "0"]), both("1-1"));
    // A stream without the group, second: its check (at once) fails the
    // read before anything is delivered from the first.
    assert_eq!(c.cmd(&["XADD", "a", "2-1", "n", "a"]), R::bulk("2-1"));
    assert_eq!(c.cmd(&["XADD", "nogroup", "1-1", "n", "x"]), R::bulk("1-1"));
    let before = broker.streams_run_at_once();
    let r = read(&mut c, "nogroup", [">", ">"]);
    assert!(
        matches!(&r, R::Error(e) if e.starts_with("NOGROUP")),
        "{r:?}"
    );
    assert_eq!(broker.streams_run_at_once() - before, 2, "two checks");
    assert_eq!(c.pending_count("a", "g"), R::Int(1), "2-1 not delivered");
    broker.shutdown();
}

#[test]
fn a_plain_read_on_an_idle_actor_runs_at_once_and_one_of_evicted_entries_is_asked() {
    let (_dir, broker) = uncached(1);
    let mut c = Client::connect(broker.local_addr());
    fill(&mut c, 250);
    // After the last entry: nothing evicted to read, at once.
    let before = broker.streams_run_at_once();
    assert_eq!(c.cmd(&["XREAD", "STREAMS", "s", "$"]), R::Nil);
    assert_eq!(c.cmd(&["XREAD", "STREAMS", "s", "250-1"]), R::Nil);
    assert_eq!(broker.streams_run_at_once() - before, 2);
    // From the start: the first entry is evicted, read back by the actor
    // (the closure finds that and leaves the read to a message).
    let read_before = read_back(&mut c);
    assert_eq!(
        c.cmd(&["XREAD", "COUNT", "1", "STREAMS", "s", "0"]),
        R::Array(vec![R::Array(vec![
            R::bulk("s"),
            R::Array(vec![R::Array(vec![
                R::bulk("1-1"),
                R::Array(vec![R::bulk("n"), R::bulk("1")]),
            ])]),
        ])])
    );
    assert!(
        read_back(&mut c) > read_before,
        "not read back by the actor"
    );
    broker.shutdown();
}

/// Streams `a` on shard 0 and `b` on shard 1 of a two-shard broker, made
/// active and idle: whichever shard the connection lands on, one of them
/// lives on the other.
fn two_shards_a_and_b(config: BrokerConfig) -> (TempDir, mailring_broker::Broker, Client) {
    let dir = TempDir::new();
    let broker = start_in(&dir.0, 2, config);
    assert_eq!(broker.place_stream(b"a", 0), Ok(0));
    assert_eq!(broker.place_stream(b"b", 1), Ok(1));
    let mut c = Client::connect(broker.local_addr());
    assert_eq!(c.cmd(&["XADD", "a", "1-1", "f", "v"]), R::bulk("1-1"));
    assert_eq!(c.cmd(&["XADD", "b", "1-1", "f", "v"]), R::bulk("1-1"));
    (dir, broker, c)
}

#[test]
fn a_run_over_two_shards_answers_in_order_and_keeps_each_stream_s_order() {
    let (_dir, broker, mut c) = two_shards_a_and_b(BrokerConfig::default());
    send_pipeline(
        &mut c,
        &[
            &["XADD", "a", "2-1", "f", "v"],
            &["XADD", "b", "2-1", "f", "v"],
            &["XADD", "b", "1-1", "f", "v"],
            &["XADD", "a", "1-1", "f", "v"],
            &["XLEN", "b"],
            &["XLEN", "a"],
        ],
    );
    assert_eq!(c.read(), R::bulk("2-1"));
    assert_eq!(c.read(), R::bulk("2-1"));
    assert!(matches!(c.read(), R::Error(e) if e.contains("equal or smaller")));
    assert!(matches!(c.read(), R::Error(e) if e.contains("equal or smaller")));
    assert_eq!(c.read(), R::Int(2));
    assert_eq!(c.read(), R::Int(2));
    // Many runs in a row over both shards keep each stream's order.
    for round in 0..50u32 {
        let ids: Vec<String> = (0..4).map(|k| format!("{}-{k}", round + 3)).collect();
        let commands: Vec<Vec<&str>> = ids
            .iter()
            .flat_map(|id| {
                [
                    vec!["XADD", "a", id.as_str(), "f", "v"],
                    vec!["XADD", "b", id.as_str(), "f", "v"],
                ]
            })
            .collect();
        let commands: Vec<&[&str]> = commands.iter().map(Vec::as_slice).collect();
        send_pipeline(&mut c, &commands);
        for id in &ids {
            assert_eq!(c.read(), R::bulk(id));
            assert_eq!(c.read(), R::bulk(id));
        }
    }
    assert_eq!(c.cmd(&["XLEN", "a"]), R::Int(202));
    assert_eq!(c.cmd(&["XLEN", "b"]), R::Int(202));
    broker.shutdown();
}

#[test]
fn a_panic_on_the_other_shard_fails_its_stream_s_commands_only() {
    let config = BrokerConfig {
        debug_commands: true,
        ..BrokerConfig::default()
    };
    let (_dir, broker, mut c) = two_shards_a_and_b(config);
    for (stream, other) in [("a", "b"), ("b", "a")] {
        // `stream`'s actor panics in the middle of a run that also names
        // `other`; on one of the two passes it lives on the other shard.
        let len = match c.cmd(&["XLEN", stream]) {
            R::Int(n) => n,
            r => panic!("{r:?}"),
        };
        let other_len = match c.cmd(&["XLEN", other]) {
            R::Int(n) => n,
            r => panic!("{r:?}"),
        };
        send_pipeline(
            &mut c,
            &[
                &["DEBUG", "PANIC-STREAM", stream],
                &["XADD", stream, "*", "f", "v"],
                &["XADD", other, "*", "f", "v"],
                &["XLEN", other],
                &["PING"],
            ],
        );
        let r = c.read();
        assert!(is_unavailable(&r), "{r:?}");
        let r = c.read();
        assert!(is_unavailable(&r), "{r:?}");
        assert!(matches!(c.read(), R::Bulk(_)));
        assert_eq!(c.read(), R::Int(other_len + 1));
        assert_eq!(c.read(), R::Status("PONG".into()));
        // Restarted from its log: nothing was added after the panic.
        assert_eq!(c.cmd(&["XLEN", stream]), R::Int(len));
    }
    broker.shutdown();
}

#[test]
fn a_run_on_the_other_shard_reaching_evicted_entries_answers_in_order() {
    for shard in [0, 1] {
        // On one of the two passes `s` lives on the connection's other shard.
        let (_dir, broker) = uncached(2);
        assert_eq!(broker.place_stream(b"s", shard), Ok(shard));
        let mut c = Client::connect(broker.local_addr());
        fill(&mut c, 250);
        assert_eq!(c.cmd(&["XADD", "t", "1-1", "f", "v"]), R::bulk("1-1"));
        let read_before = read_back(&mut c);
        send_pipeline(
            &mut c,
            &[
                &["XADD", "s", "251-1", "n", "251"],
                &["XLEN", "t"],
                &["XRANGE", "s", "-", "+", "COUNT", "1"],
                &["XADD", "s", "252-1", "n", "252"],
                &["XLEN", "s"],
            ],
        );
        assert_eq!(c.read(), R::bulk("251-1"));
        assert_eq!(c.read(), R::Int(1));
        assert_eq!(c.read(), first_entry_page());
        assert_eq!(c.read(), R::bulk("252-1"));
        assert_eq!(c.read(), R::Int(252));
        assert!(
            read_back(&mut c) > read_before,
            "the XRANGE read nothing back"
        );
        broker.shutdown();
    }
}
