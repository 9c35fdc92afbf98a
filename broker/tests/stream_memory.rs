//! What an idle stream of one entry costs in heap, measured with a
//! counting global allocator (live heap bytes, not RSS), in a binary with
//! this one test so nothing else allocates meanwhile.
//!
//! Every stream that exists keeps its actor: its task, its mailbox, its
//! state and its entries. Brokers hold many small streams (one per user,
//! per device, per order), so what each costs at rest decides how many
//! fit in memory: redis-server 7.0 takes about 4.5 KB of RSS per stream
//! of one entry. Here (a debug build, whose tasks are larger than a
//! release build's) one cost 10.2 KB of heap before its first chunk of
//! entries and its mailbox grew as they filled instead of starting at
//! their full size; 5.2 KB after. 4.2 KB since the actor's message loop
//! holds the actor's borrow instead of moving the actor out of its cell
//! into the task (room for it in both, for the activation's life) and a
//! mailbox's first buffer has room for one message instead of four; 3.6
//! KB since a stream's queues of one element have room for one, and an
//! activation's timer scope waits for its first timer.

use mailring_broker::BrokerConfig;

mod common;
#[path = "../../transports/tests/support/counting_alloc.rs"]
mod counting_alloc;
use common::client::{start_in, Client, R};
use common::{encode, TempDir};
use counting_alloc::live;

const STREAMS: usize = 4000;

/// Makes streams `name(from)..name(to)`, one entry each, pipelined.
fn make(c: &mut Client, from: usize, to: usize) {
    let mut requests = Vec::new();
    for i in from..to {
        let key = format!("stream:{i:06}");
        requests.extend(encode(&[b"XADD", key.as_bytes(), b"*", b"f", b"v"]));
    }
    c.send_raw(&requests);
    for _ in from..to {
        assert!(matches!(c.read(), R::Bulk(_)));
    }
}

#[test]
fn an_idle_stream_of_one_entry_costs_a_few_kilobytes() {
    let dir = TempDir::new();
    let broker = start_in(&dir.0, 1, BrokerConfig::default());
    let mut c = Client::connect(broker.local_addr());
    // The shard's tables warmed up before the count starts.
    make(&mut c, 0, 500);
    let before = live();
    make(&mut c, 500, 500 + STREAMS);
    let grown = live() - before;
    let per_stream = grown / STREAMS as isize;
    eprintln!(
        "{STREAMS} streams of one entry grew the heap by {grown} bytes ({per_stream} per stream)"
    );
    assert!(
        per_stream < 4096,
        "{STREAMS} streams of one entry grew the heap by {grown} bytes ({per_stream} per stream)"
    );
    assert_eq!(c.cmd(&["DBSIZE"]), R::Int(500 + STREAMS as i64));
    // A second append to each, in a round of its own: each actor now has
    // been woken twice.
    make(&mut c, 500, 500 + STREAMS);
    let grown = live() - before;
    let per_stream = grown / STREAMS as isize;
    eprintln!("after a second entry each: {grown} bytes ({per_stream} per stream)");
    assert!(
        per_stream < 4096,
        "a second entry each grew the heap to {grown} bytes ({per_stream} per stream)"
    );
    broker.shutdown();
}
