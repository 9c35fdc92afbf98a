//! What a stored entry costs in heap, measured with a counting global
//! allocator (live heap bytes, not RSS), in a binary with this one test so
//! nothing else allocates meanwhile.
//!
//! An entry's fields arrive as slices of its connection's read buffer. If
//! the stream kept those slices, each cached entry of a few dozen bytes
//! would keep a whole read buffer (16 KiB) alive, and every later read on
//! the connection would need a fresh one: 4,000 entries sent one request
//! per read would hold about 64 MiB.

use mailring_broker::BrokerConfig;

mod common;
#[path = "../../transports/tests/support/counting_alloc.rs"]
mod counting_alloc;
use common::client::{start_in, Client, R};
use common::TempDir;
use counting_alloc::live;

const CONNECTIONS: usize = 40;
const PER_CONNECTION: usize = 100;

#[test]
fn a_cached_entry_does_not_keep_its_request_buffer_alive() {
    let dir = TempDir::new();
    let broker = start_in(&dir.0, 1, BrokerConfig::default());
    let mut clients: Vec<Client> = (0..CONNECTIONS)
        .map(|_| Client::connect(broker.local_addr()))
        .collect();
    // Every connection attached and warmed up before the count starts.
    for c in &mut clients {
        assert!(matches!(c.cmd(&["XADD", "s", "*", "f", "v"]), R::Bulk(_)));
    }
    let before = live();
    for i in 0..PER_CONNECTION {
        for c in &mut clients {
            let value = format!("value {i}");
            assert!(matches!(
                c.cmd(&["XADD", "s", "*", "field", &value]),
                R::Bulk(_)
            ));
        }
    }
    let grown = live() - before;
    let entries = CONNECTIONS * PER_CONNECTION;
    // An entry's id, place, fields and share of the stream's index come to
    // a few hundred bytes; 2 KiB each leaves room and is far below the 16
    // KiB a kept read buffer costs.
    assert!(
        grown < (entries * 2048) as isize,
        "{entries} entries grew the heap by {grown} bytes ({} per entry)",
        grown / entries as isize
    );
    let mut c = Client::connect(broker.local_addr());
    assert_eq!(
        c.cmd(&["XLEN", "s"]),
        R::Int((entries + CONNECTIONS) as i64)
    );
    drop(clients);
    broker.shutdown();
}
