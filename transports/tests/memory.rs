//! Bounded memory under hostile clients, measured with a counting global
//! allocator (live heap bytes, not RSS), in a binary of its own
//! (`harness = false`: no other test allocates meanwhile).
//!
//! Forty bad clients (frames announced and never finished, garbage
//! headers, silence, peers that never read while the server writes, and
//! peers that never read while tiny requests each ask for a big reply) run
//! beside a good client whose replies are checked. The live heap during the
//! attack stays within a bound set by the server's limits, and returns to
//! its level before once the bad clients are closed.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

mod common;
#[path = "support/counting_alloc.rs"]
mod counting_alloc;

use bytes::Bytes;
use common::{frame, round_trip};
use counting_alloc::live;
use mailring_transports::codec::LengthDelimited;
use mailring_transports::{CloseKind, Server, ServerConfig, Session, SessionCtx};

/// Echoes each frame, but answers `amp` with a frame of the largest size:
/// a tiny request, a big reply.
struct EchoOrAmplify;

impl Session for EchoOrAmplify {
    type Codec = LengthDelimited;
    type Key = ();

    async fn on_frame(&mut self, frame: Bytes, cx: &mut SessionCtx<Self>) {
        if &frame[..] == b"amp" {
            cx.send_frame(Bytes::from(vec![b'y'; MAX_FRAME - 16]));
        } else if &frame[..] == b"burst" {
            // One request, replies of several MiB in all.
            for _ in 0..BURST_FRAMES {
                cx.send_frame(Bytes::from(vec![b'z'; MAX_FRAME - 16]));
            }
        } else {
            cx.send_frame(frame);
        }
    }
}

/// A client whose writes give up after 200 ms (the bad ones fill buffers).
fn client(addr: SocketAddr) -> TcpStream {
    let c = common::client(addr);
    c.set_write_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    c
}

const MAX_FRAME: usize = 64 << 10;
const OUTBOUND_LIMIT: usize = 256 << 10;
const BAD_CLIENTS: usize = 40;
const BURST_FRAMES: usize = 100;

fn main() {
    let rt = mailring::Runtime::builder().shards(2).build().unwrap();
    let mut config = ServerConfig::default();
    config.frame_timeout = Some(Duration::from_secs(1));
    config.idle_timeout = Some(Duration::from_secs(1));
    config.outbound_high_water = OUTBOUND_LIMIT / 2;
    config.outbound_limit = OUTBOUND_LIMIT;
    config.slow_reader_grace = Duration::from_millis(300);
    let server = Server::builder(LengthDelimited::new().max_frame(MAX_FRAME), |_| {
        EchoOrAmplify
    })
    .config(config)
    .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
    .unwrap();
    let addr = server.local_addr();
    let mut good = client(addr);
    for i in 0..20 {
        round_trip(&mut good, format!("warm up {i}").as_bytes());
    }
    let before = live();

    let mut bad = Vec::new();
    for i in 0..BAD_CLIENTS {
        let mut c = client(addr);
        match i % 5 {
            // A frame announced just under the maximum, one byte of it sent.
            0 => c
                .write_all(&((MAX_FRAME as u32 - 1).to_be_bytes()))
                .unwrap(),
            // A header claiming 4 GiB.
            1 => c.write_all(&[0xff; 8]).unwrap(),
            // Nothing at all.
            2 => {}
            // Tiny requests (in the socket's buffers at once), each
            // asking for a reply of the largest size, never read: the
            // outbound limit holds between frames too.
            3 => {
                let amp = frame(b"amp").repeat(4000);
                let _ = c.write_all(&amp);
            }
            // Requests whose replies it never reads.
            _ => {
                let big = frame(&vec![b'x'; MAX_FRAME - 16]);
                for _ in 0..64 {
                    if c.write_all(&big).is_err() {
                        break;
                    }
                }
            }
        }
        bad.push(c);
    }
    let mut peak = live();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut i = 0;
    loop {
        round_trip(&mut good, format!("during {i}").as_bytes());
        i += 1;
        peak = peak.max(live());
        let stats = server.stats();
        let closed: u64 = [
            CloseKind::FrameTimeout,
            CloseKind::BadFrame,
            CloseKind::IdleTimeout,
            CloseKind::SlowReader,
        ]
        .iter()
        .map(|k| stats.closed(*k))
        .sum();
        if closed >= BAD_CLIENTS as u64 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "bad clients still open: {stats:#?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(bad);
    // Per bad client: a read buffer (a receive's chunk of 16 KiB plus what
    // it sent, capped by the frame maximum) and a few KiB of session state;
    // per non-reader also its outbound bytes: the queue under its limit
    // plus one frame, and the batch in flight (under the limit too).
    let per_client = MAX_FRAME + (16 << 10) + (4 << 10);
    let per_non_reader = 2 * OUTBOUND_LIMIT + MAX_FRAME;
    let bound = (BAD_CLIENTS * per_client + BAD_CLIENTS / 5 * 2 * per_non_reader) as isize;
    let grew = peak - before;
    println!("memory: live heap before {before} B, peak +{grew} B (bound {bound} B)");
    assert!(
        grew < bound,
        "live heap grew by {grew} B during the attack, bound {bound} B"
    );
    round_trip(&mut good, b"after");
    let after = settled_above(before);
    println!("memory: after the bad clients closed: {after:+} B against before");
    assert!(
        after < 256 << 10,
        "live heap stays {after} B above its level before"
    );
    assert_eq!(server.live_connections(), 1);
    drop(good);
    rt.block_on(server.shutdown());
    big_reply_then_idle(&rt);
    rt.shutdown();
    println!("memory: 2 tests passed");
}

/// A reply of several MiB, read whole: the connection, idle again, keeps
/// nothing of it (its outbound buffer kept the whole allocation after the
/// last send while the connection lived). Default limits: the reply is
/// under the outbound limit.
fn big_reply_then_idle(rt: &mailring::Runtime) {
    let server = Server::builder(LengthDelimited::new().max_frame(MAX_FRAME), |_| {
        EchoOrAmplify
    })
    .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
    .unwrap();
    let addr = server.local_addr();
    // A reply of several MiB, read whole: the connection, idle again,
    // keeps nothing of it (its outbound buffer held the whole allocation
    // after the last send while the connection lived).
    let mut good = client(addr);
    round_trip(&mut good, b"warm up");
    let before = live();
    good.write_all(&frame(b"burst")).unwrap();
    for _ in 0..BURST_FRAMES {
        let got = common::read_frame(&mut good).unwrap();
        assert_eq!(got.len(), MAX_FRAME - 16);
    }
    round_trip(&mut good, b"after the burst");
    let kept = settled_above(before);
    println!(
        "memory: an idle connection after a {} KiB reply: {kept:+} B against before",
        (BURST_FRAMES * MAX_FRAME) >> 10
    );
    assert!(
        kept < 256 << 10,
        "an idle connection keeps {kept} B after a big reply"
    );
    assert_eq!(server.live_connections(), 1);
    drop(good);
    rt.block_on(server.shutdown());
}

/// The live heap above `before` once it has come within 256 KiB of it, or
/// after 5 s (what the server frees, it frees on its shards' threads).
fn settled_above(before: isize) -> isize {
    let settle = Instant::now() + Duration::from_secs(5);
    loop {
        let now = live() - before;
        if now < 256 << 10 || Instant::now() > settle {
            return now;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
