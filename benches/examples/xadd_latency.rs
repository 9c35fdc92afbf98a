//! Per-connection latency of pipelined `XADD`s against a server on
//! loopback (`xadd_latency PORT CONNS PIPELINE SECONDS [STREAMS]`): each
//! connection writes a batch of `PIPELINE` commands, reads every reply,
//! and records the batch's time. Prints the latency spread over all
//! batches, per connection, and when the slow batches happened, so a
//! stall of the whole server (slow batches on every connection at once)
//! tells itself apart from connections served late.
//!
//! Runs on one thread (pin it with `taskset`); stops by itself after
//! `SECONDS`.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn arg(args: &[String], i: usize, default: u64) -> u64 {
    args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default)
}

/// Counts complete RESP simple/error/integer/bulk replies in `buf`
/// (enough for `XADD`'s bulk-string or error replies), consuming them.
fn take_replies(buf: &mut Vec<u8>) -> usize {
    let mut at = 0;
    let mut n = 0;
    while let Some(nl) = buf[at..].windows(2).position(|w| w == b"\r\n") {
        let line = &buf[at..at + nl];
        let mut next = at + nl + 2;
        if line.first() == Some(&b'$') {
            let len: i64 = std::str::from_utf8(&line[1..])
                .ok()
                .and_then(|l| l.parse().ok())
                .expect("a bulk length");
            if len >= 0 {
                next += len as usize + 2;
                if next > buf.len() {
                    break;
                }
            }
        }
        at = next;
        n += 1;
    }
    buf.drain(..at);
    n
}

struct ConnStats {
    batches: Vec<(Duration, Duration)>, // (when it started, how long it took)
}

async fn connection(
    port: u16,
    stream: String,
    pipeline: usize,
    start: Instant,
    stop: Instant,
) -> ConnStats {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.set_nodelay(true).unwrap();
    let mut cmd = Vec::new();
    for _ in 0..pipeline {
        cmd.extend_from_slice(
            format!(
                "*5\r\n$4\r\nXADD\r\n${}\r\n{}\r\n$1\r\n*\r\n$1\r\nf\r\n$1\r\nv\r\n",
                stream.len(),
                stream
            )
            .as_bytes(),
        );
    }
    let mut buf = Vec::with_capacity(64 << 10);
    let mut chunk = vec![0u8; 64 << 10];
    let mut stats = ConnStats {
        batches: Vec::new(),
    };
    while Instant::now() < stop {
        let t0 = Instant::now();
        s.write_all(&cmd).await.unwrap();
        let mut got = 0;
        while got < pipeline {
            let n = s.read(&mut chunk).await.unwrap();
            assert!(n > 0, "server closed");
            buf.extend_from_slice(&chunk[..n]);
            got += take_replies(&mut buf);
        }
        stats.batches.push((t0 - start, t0.elapsed()));
    }
    stats
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let port = arg(&args, 1, 7101) as u16;
    let conns = arg(&args, 2, 50) as usize;
    let pipeline = arg(&args, 3, 16) as usize;
    let secs = arg(&args, 4, 3);
    let streams = arg(&args, 5, 1) as usize;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let stats = rt.block_on(async move {
        let start = Instant::now();
        let stop = start + Duration::from_secs(secs);
        let tasks: Vec<_> = (0..conns)
            .map(|i| {
                let name = format!("s{}", i % streams);
                tokio::spawn(connection(port, name, pipeline, start, stop))
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    });
    let mut all: Vec<Duration> = stats
        .iter()
        .flat_map(|c| c.batches.iter().map(|b| b.1))
        .collect();
    all.sort();
    if all.is_empty() {
        println!("no batch finished in {secs} s");
        return;
    }
    let total: usize = all.len() * pipeline;
    println!(
        "{} requests in {secs} s: {:.0} req/s; batch ms p50 {:.3} p90 {:.3} p99 {:.3} p99.9 {:.3} max {:.3}",
        total,
        total as f64 / secs as f64,
        pct(&all, 0.5),
        pct(&all, 0.9),
        pct(&all, 0.99),
        pct(&all, 0.999),
        pct(&all, 1.0)
    );
    let slow = pct(&all, 0.99).max(2.0 * pct(&all, 0.5));
    let slow = Duration::from_secs_f64(slow / 1e3);
    println!("slow = over {:.3} ms", slow.as_secs_f64() * 1e3);
    for (i, c) in stats.iter().enumerate() {
        let mut v: Vec<Duration> = c.batches.iter().map(|b| b.1).collect();
        v.sort();
        if v.is_empty() {
            println!("conn {i:3}: no batch finished");
            continue;
        }
        let n_slow = v.iter().filter(|d| **d > slow).count();
        println!(
            "conn {i:3}: {:6} batches, p50 {:.3} p99 {:.3} max {:.3}, slow {n_slow}",
            v.len(),
            pct(&v, 0.5),
            pct(&v, 0.99),
            pct(&v, 1.0)
        );
    }
    // When slow batches started, in 1 ms bins: how many connections had
    // a slow batch start in the same bin.
    let mut bins = std::collections::BTreeMap::<u64, usize>::new();
    for c in &stats {
        for (at, took) in &c.batches {
            if *took > slow {
                *bins.entry(at.as_millis() as u64).or_default() += 1;
            }
        }
    }
    let mut hist = std::collections::BTreeMap::<usize, usize>::new();
    for n in bins.values() {
        *hist.entry(*n).or_default() += 1;
    }
    println!("slow batches starting in the same ms (count -> ms bins): {hist:?}");
    let first: Vec<_> = bins.iter().take(40).collect();
    println!("first slow bins (ms, count): {first:?}");
}
