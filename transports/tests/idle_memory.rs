//! What an idle connection costs the server: live heap bytes per
//! connection (a counting global allocator, in a binary of its own:
//! `harness = false`, nothing else allocates meanwhile), with many
//! connections that each made one round trip and then wait. Each holds its
//! session, its context and its task's state; its read buffer is released
//! between frames.

use std::net::TcpStream;
use std::time::{Duration, Instant};

mod common;
#[path = "support/counting_alloc.rs"]
mod counting_alloc;

use common::{round_trip, Echo};
use counting_alloc::live;
use mailring_transports::codec::LengthDelimited;
use mailring_transports::{Server, ServerConfig};

const CONNECTIONS: usize = 400;

/// The most heap an idle echo connection may hold on the server: its
/// task's state (about 4.5 KiB) and a small read buffer (2 KiB). A whole
/// read chunk held by each (16 KiB) fails it.
const PER_CONNECTION_MAX: isize = 8 << 10;

fn main() {
    let rt = mailring::Runtime::builder().shards(2).build().unwrap();
    let server = Server::builder(LengthDelimited::new(), |_| Echo)
        .config(ServerConfig::default())
        .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
        .unwrap();
    let addr = server.local_addr();
    let mut warm = common::client(addr);
    for i in 0..20 {
        round_trip(&mut warm, format!("warm up {i}").as_bytes());
    }
    let settled = |want: usize| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.live_connections() != want {
            assert!(Instant::now() < deadline, "connections did not settle");
            std::thread::sleep(Duration::from_millis(5));
        }
        // What their last round trip left (a buffer on its way back) goes.
        std::thread::sleep(Duration::from_millis(100));
        live()
    };
    let before = settled(1);
    let mut clients: Vec<TcpStream> = Vec::with_capacity(CONNECTIONS);
    for i in 0..CONNECTIONS {
        let mut c = common::client(addr);
        round_trip(&mut c, format!("hello {i}").as_bytes());
        clients.push(c);
    }
    let during = settled(CONNECTIONS + 1);
    let per_connection = (during - before) / CONNECTIONS as isize;
    println!(
        "idle memory: {per_connection} B of heap per idle connection ({CONNECTIONS} connections)"
    );
    assert!(
        per_connection < PER_CONNECTION_MAX,
        "an idle connection holds {per_connection} B, more than {PER_CONNECTION_MAX} B"
    );
    // And all of it goes with them.
    drop(clients);
    let after = settled(1);
    println!(
        "idle memory: {:+} B against before, once they closed",
        after - before
    );
    assert!(
        after - before < 64 << 10,
        "{} B stay after the connections closed",
        after - before
    );
    drop(warm);
    rt.block_on(server.shutdown());
    rt.shutdown();
    println!("idle memory: 1 test passed");
}
