//! The broker against `redis-server` with the same `redis-benchmark`
//! command lines: XADD with 1 client, 1 client `-P 16`, 50 clients, 50
//! clients `-P 16`, each on one stream and on `__rand_int__` keys over 100
//! streams, 50 clients `-P 16` on keys over 10^8 names (nearly every
//! append makes a stream: `xadd-c50-P16-new`), and 100-entry XRANGE /
//! XREAD pages; redis-server with
//! `appendonly yes`, mailring with 1 and 2 shards, both under the same
//! `appendfsync`. Contenders alternate within each pair; each run gets a
//! fresh server and data directory on the same filesystem. Server CPU per
//! request comes from `/proc/<pid>/stat` before and after the run, and a
//! bare 4 KiB write + `fdatasync` loop on that filesystem gives the floor.
//! The client runs pinned to CPU 1 with `taskset` when it is installed
//! (`BROKER_CLIENT_CPU` picks another; `BROKER_SERVER_CPUS=LIST` pins the
//! broker's shards with `--cpus LIST` and redis-server to the list's first
//! CPU). `BROKER_CLIENT_THREADS=N` gives redis-benchmark `--threads N`,
//! `BROKER_SHARDS=LIST` the broker's shard counts (default `1,2`); an
//! entry may carry broker flags after its count (`1,1 --no-direct-io`
//! runs two variants of one shard).
//!
//! The `multi-*` rows send no `redis-benchmark` load: one client queues
//! a `MULTI` block of 100,000 commands over many streams and times its
//! `EXEC` (five blocks per run on one server, after one that makes the
//! streams when the row reads them); their req/s is commands per second
//! of `EXEC`, p50 the median `EXEC` in ms and p99 the slowest. The
//! `group-read-2` row times one reader's `XREADGROUP` over two streams
//! while two writers append to them (see [`run_group_reads`]); the server
//! CPU it reports includes the writers' appends.
//!
//! Run (loopback only):
//! `cargo build --release -p mailring-broker && cargo run --release -p mailring-bench --example broker_vs_redis -- [pairs] [always|everysec]`
//! Needs `redis-server` and `redis-benchmark` on the PATH. `BROKER_ROWS`
//! (a comma list of row names) runs a subset.

use std::net::TcpListener;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Clone, PartialEq)]
enum Server {
    Redis,
    /// The broker with this many shards and these extra flags.
    Mailring(usize, Vec<String>),
}

impl Server {
    fn name(&self) -> String {
        match self {
            Server::Redis => "redis-server 7.0".to_owned(),
            Server::Mailring(n, flags) => format!(
                "mailring, {n} shard{}{}",
                if *n == 1 { "" } else { "s" },
                if flags.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", flags.join(" "))
                }
            ),
        }
    }
}

/// One benchmark row: its `redis-benchmark` arguments.
struct Row {
    name: &'static str,
    clients: usize,
    pipeline: usize,
    requests: usize,
    command: &'static [&'static str],
    /// `-r N`: `__rand_int__` over N keys (0: no `-r`).
    keyspace: u64,
    /// Entries put in stream `s` before the run (read rows).
    prefill: usize,
}

const ROWS: &[Row] = &[
    Row {
        name: "xadd-c1",
        clients: 1,
        pipeline: 1,
        requests: 2_000,
        command: &["XADD", "s", "*", "f", "v"],
        keyspace: 0,
        prefill: 0,
    },
    Row {
        name: "xadd-c1-rand",
        clients: 1,
        pipeline: 1,
        requests: 2_000,
        command: &["XADD", "s:__rand_int__", "*", "f", "v"],
        keyspace: 100,
        prefill: 0,
    },
    Row {
        name: "xadd-c1-P16",
        clients: 1,
        pipeline: 16,
        requests: 16_000,
        command: &["XADD", "s", "*", "f", "v"],
        keyspace: 0,
        prefill: 0,
    },
    Row {
        name: "xadd-c1-P16-rand",
        clients: 1,
        pipeline: 16,
        requests: 16_000,
        command: &["XADD", "s:__rand_int__", "*", "f", "v"],
        keyspace: 100,
        prefill: 0,
    },
    Row {
        name: "xadd-c50",
        clients: 50,
        pipeline: 1,
        requests: 20_000,
        command: &["XADD", "s", "*", "f", "v"],
        keyspace: 0,
        prefill: 0,
    },
    Row {
        name: "xadd-c50-rand",
        clients: 50,
        pipeline: 1,
        requests: 20_000,
        command: &["XADD", "s:__rand_int__", "*", "f", "v"],
        keyspace: 100,
        prefill: 0,
    },
    Row {
        name: "xadd-c50-P16",
        clients: 50,
        pipeline: 16,
        requests: 80_000,
        command: &["XADD", "s", "*", "f", "v"],
        keyspace: 0,
        prefill: 0,
    },
    Row {
        name: "xadd-c50-P16-rand",
        clients: 50,
        pipeline: 16,
        requests: 80_000,
        command: &["XADD", "s:__rand_int__", "*", "f", "v"],
        keyspace: 100,
        prefill: 0,
    },
    // Nearly every append makes a new stream (10^8 names): what making a
    // stream costs (its actor, its log record, the catalog), not an append.
    Row {
        name: "xadd-c50-P16-new",
        clients: 50,
        pipeline: 16,
        requests: 20_000,
        command: &["XADD", "s:__rand_int__", "*", "f", "v"],
        keyspace: 100_000_000,
        prefill: 0,
    },
    Row {
        name: "xrange-100",
        clients: 50,
        pipeline: 1,
        requests: 20_000,
        command: &["XRANGE", "s", "-", "+", "COUNT", "100"],
        keyspace: 0,
        prefill: 1000,
    },
    Row {
        name: "xread-100",
        clients: 50,
        pipeline: 1,
        requests: 20_000,
        command: &["XREAD", "COUNT", "100", "STREAMS", "s", "0"],
        keyspace: 0,
        prefill: 1000,
    },
];

/// A row of `MULTI` blocks: `commands` of `command` (its key and
/// arguments follow) over `streams` streams named `prefix` and a number,
/// round robin.
struct TransactionRow {
    name: &'static str,
    command: &'static str,
    prefix: &'static str,
    args: &'static [&'static str],
    commands: usize,
    streams: usize,
    /// Whether the streams are made (one `XADD` each) before the blocks.
    made: bool,
}

/// Blocks timed per run.
const BLOCKS: usize = 5;

const TRANSACTION_ROWS: &[TransactionRow] = &[
    TransactionRow {
        name: "multi-xadd-10k",
        command: "XADD",
        prefix: "bt",
        args: &["*", "f", "v"],
        commands: 100_000,
        streams: 10_000,
        made: false,
    },
    TransactionRow {
        name: "multi-xlen-100",
        command: "XLEN",
        prefix: "bt",
        args: &[],
        commands: 100_000,
        streams: 100,
        made: true,
    },
    TransactionRow {
        name: "multi-xlen-10k",
        command: "XLEN",
        prefix: "bt",
        args: &[],
        commands: 100_000,
        streams: 10_000,
        made: true,
    },
    TransactionRow {
        name: "multi-xlen-missing",
        command: "XLEN",
        prefix: "nobody",
        args: &[],
        commands: 100_000,
        streams: 10_000,
        made: false,
    },
];

/// The `group-read-2` row: one reader loops `XREADGROUP GROUP g c COUNT
/// 10 NOACK STREAMS xa xb > >` (two streams of one shard, read as one
/// snapshot) while two `redis-benchmark` writers (4 clients `-P 8` each)
/// append to `xa` and `xb`; req/s is the reader's calls per second, p50
/// and p99 its calls' latency, CPU the server's per call.
const GROUP_READ_ROW: &str = "group-read-2";

/// Reads timed per run of `group-read-2`.
const GROUP_READS: usize = 20_000;

fn run_group_reads(server: &Server, base: &Path, seq: usize) -> Measure {
    let dir = base.join(format!("run-{seq}"));
    let port = free_port();
    let mut child = start(server, &dir, port, "everysec");
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    for stream in ["xa", "xb"] {
        let mut request = encode(&["XGROUP", "CREATE", stream, "g", "$", "MKSTREAM"]);
        request.extend(encode(&["PING"]));
        exchange(&mut conn, &request, b"+PONG\r\n");
    }
    let writers: Vec<Child> = ["xa", "xb"]
        .iter()
        .map(|stream| {
            pinned_redis_benchmark()
                .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-q"])
                .args(["-c", "4", "-P", "8", "-n", "100000000"])
                .args(["XADD", stream, "*", "f", "v"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start a redis-benchmark writer")
        })
        .collect();
    // The writers under way before the count starts.
    std::thread::sleep(Duration::from_millis(300));
    let mut request = encode(&[
        "XREADGROUP",
        "GROUP",
        "g",
        "c",
        "COUNT",
        "10",
        "NOACK",
        "STREAMS",
        "xa",
        "xb",
        ">",
        ">",
    ]);
    request.extend(encode(&["PING"]));
    let cpu0 = cpu_seconds(child.id());
    let began = Instant::now();
    let mut times = Vec::with_capacity(GROUP_READS);
    for _ in 0..GROUP_READS {
        let t = Instant::now();
        exchange(&mut conn, &request, b"+PONG\r\n");
        times.push(t.elapsed().as_secs_f64());
    }
    let elapsed = began.elapsed().as_secs_f64();
    let cpu1 = cpu_seconds(child.id());
    for mut w in writers {
        let _ = w.kill();
        let _ = w.wait();
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    times.sort_by(f64::total_cmp);
    Measure {
        rps: GROUP_READS as f64 / elapsed,
        p50: times[times.len() / 2] * 1e3,
        p99: times[times.len() * 99 / 100] * 1e3,
        cpu_us_per_req: (cpu1 - cpu0) * 1e6 / GROUP_READS as f64,
    }
}

/// `redis-benchmark`, pinned to CPU 1 (taskset) as the issue's runs are;
/// `BROKER_CLIENT_CPU` picks another.
fn pinned_redis_benchmark() -> Command {
    let client_cpu = std::env::var("BROKER_CLIENT_CPU").unwrap_or_else(|_| "1".to_owned());
    if on_path("taskset") {
        let mut c = Command::new("taskset");
        c.args(["-c", &client_cpu, "redis-benchmark"]);
        c
    } else {
        Command::new("redis-benchmark")
    }
}

/// A command in RESP.
fn encode(words: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", words.len()).into_bytes();
    for w in words {
        out.extend_from_slice(format!("${}\r\n{w}\r\n", w.len()).as_bytes());
    }
    out
}

/// Sends `request`, then reads until the replies end with `last`.
fn exchange(conn: &mut std::net::TcpStream, request: &[u8], last: &[u8]) {
    use std::io::{Read, Write};
    conn.write_all(request).expect("send");
    let mut tail = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = conn.read(&mut buf).expect("read");
        assert!(n > 0, "the server closed the connection");
        tail.extend_from_slice(&buf[..n]);
        if tail.ends_with(last) {
            return;
        }
        let keep = tail.len().saturating_sub(last.len());
        tail.drain(..keep);
    }
}

/// A `MULTI` block of `row` (its `EXEC` followed by a `PING`, whose
/// `+PONG` ends the replies).
fn block(row: &TransactionRow, command: &str, args: &[&str]) -> (Vec<u8>, Vec<u8>) {
    let mut queued = encode(&["MULTI"]);
    for i in 0..row.commands {
        let key = format!("{}{}", row.prefix, i % row.streams);
        let mut words = vec![command, key.as_str()];
        words.extend_from_slice(args);
        queued.extend(encode(&words));
    }
    queued.extend(encode(&["PING"]));
    let mut exec = encode(&["EXEC"]);
    exec.extend(encode(&["PING"]));
    (queued, exec)
}

fn run_transactions(server: &Server, row: &TransactionRow, base: &Path, seq: usize) -> Measure {
    let dir = base.join(format!("run-{seq}"));
    let port = free_port();
    let mut child = start(server, &dir, port, "everysec");
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    if row.made {
        let (queued, exec) = block(row, "XADD", &["*", "f", "v"]);
        exchange(&mut conn, &queued, b"+QUEUED\r\n");
        exchange(&mut conn, &exec, b"+PONG\r\n");
    }
    let (queued, exec) = block(row, row.command, row.args);
    let cpu0 = cpu_seconds(child.id());
    let mut times = Vec::with_capacity(BLOCKS);
    for _ in 0..BLOCKS {
        exchange(&mut conn, &queued, b"+QUEUED\r\n");
        let t = Instant::now();
        exchange(&mut conn, &exec, b"+PONG\r\n");
        times.push(t.elapsed().as_secs_f64());
    }
    let cpu1 = cpu_seconds(child.id());
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    let slowest = times.iter().copied().fold(0.0, f64::max);
    let (median, _, _) = quartiles(times);
    Measure {
        rps: row.commands as f64 / median,
        p50: median * 1e3,
        p99: slowest * 1e3,
        cpu_us_per_req: (cpu1 - cpu0) * 1e6 / (BLOCKS * row.commands) as f64,
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn broker_binary() -> PathBuf {
    // target/release/examples/broker_vs_redis → target/release/mailring-broker
    let exe = std::env::current_exe().expect("own path");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/release")
        .join("mailring-broker");
    assert!(
        bin.exists(),
        "{} missing: cargo build --release -p mailring-broker",
        bin.display()
    );
    bin
}

fn start(server: &Server, dir: &Path, port: u16, fsync: &str) -> Child {
    std::fs::create_dir_all(dir).unwrap();
    // BROKER_SERVER_CPUS=LIST: mailring's --cpus, and redis-server under
    // `taskset -c` the list's first CPU (its one thread that serves).
    let server_cpus = std::env::var("BROKER_SERVER_CPUS").ok();
    let child = match server {
        Server::Redis => match server_cpus.as_deref().and_then(|l| l.split(',').next()) {
            Some(cpu) => {
                let mut c = Command::new("taskset");
                c.args(["-c", cpu, "redis-server"]);
                c
            }
            None => Command::new("redis-server"),
        }
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args(["--save", "", "--appendonly", "yes", "--appendfsync", fsync])
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::null())
        .spawn(),
        Server::Mailring(shards, flags) => Command::new(broker_binary())
            .args(["--port", &port.to_string(), "--shards", &shards.to_string()])
            .args(flags)
            .args(
                std::env::var("BROKER_SPIN_US")
                    .ok()
                    .map(|us| vec!["--spin-us".to_owned(), us])
                    .unwrap_or_default(),
            )
            .args(
                server_cpus
                    .map(|cpus| vec!["--cpus".to_owned(), cpus])
                    .unwrap_or_default(),
            )
            .args(["--appendfsync", fsync, "--dir"])
            .arg(dir)
            .stdout(Stdio::null())
            .spawn(),
    }
    .expect("start the server");
    let t = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "server did not start"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    child
}

/// Whether `program` is found in a directory of `PATH`.
fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

/// utime + stime of a process, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields 14 and 15 (utime, stime) are 12 and 13 after the `)`.
    (ticks(11) + ticks(12)) / 100.0
}

struct Measure {
    rps: f64,
    p50: f64,
    p99: f64,
    cpu_us_per_req: f64,
}

/// How many times a row's requests a run sends: the counts are sized for
/// `always`, where the disk paces them; without a flush per request they
/// would take a few milliseconds, within the noise of a start.
/// `BROKER_SCALE=N` sets it: with `--threads`, redis-benchmark notices its
/// end only at its 250 ms progress tick, so a threaded run must last
/// seconds for its rate to mean anything.
fn scale(fsync: &str) -> usize {
    if let Some(n) = std::env::var("BROKER_SCALE")
        .ok()
        .and_then(|n| n.parse().ok())
    {
        n
    } else if fsync == "always" {
        1
    } else {
        10
    }
}

fn run_row(server: &Server, row: &Row, fsync: &str, base: &Path, seq: usize) -> Measure {
    let requests = row.requests * scale(fsync);
    let dir = base.join(format!("run-{seq}"));
    let port = free_port();
    let mut child = start(server, &dir, port, fsync);
    if row.prefill > 0 {
        let status = Command::new("redis-benchmark")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-q",
                "-c",
                "1",
                "-P",
                "50",
            ])
            .args(["-n", &row.prefill.to_string(), "XADD", "s", "*", "f", "v"])
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
    }
    let cpu0 = cpu_seconds(child.id());
    let mut cmd = pinned_redis_benchmark();
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string(), "--csv"])
        .args([
            "-c",
            &row.clients.to_string(),
            "-P",
            &row.pipeline.to_string(),
        ])
        .args(["-n", &requests.to_string()]);
    // BROKER_CLIENT_THREADS=N: redis-benchmark's own `--threads N`, for a
    // machine where one client thread would bound the servers; rows of
    // one client keep one thread (with more, redis-benchmark 7.0 measured
    // half the rate of one thread against the same server).
    if let (Ok(threads), true) = (std::env::var("BROKER_CLIENT_THREADS"), row.clients > 1) {
        cmd.args(["--threads", &threads]);
    }
    if row.keyspace > 0 {
        cmd.args(["-r", &row.keyspace.to_string()]);
    }
    let out = cmd.args(row.command).output().expect("run redis-benchmark");
    let cpu1 = cpu_seconds(child.id());
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8_lossy(&out.stdout);
    // "test","rps","avg","min","p50","p95","p99","max"
    let line = text
        .lines()
        .find(|l| !l.starts_with("\"test\""))
        .unwrap_or_else(|| panic!("no result from redis-benchmark: {text}"));
    let cols: Vec<f64> = line
        .split(',')
        .skip(1)
        .map(|c| c.trim_matches('"').parse().unwrap_or(f64::NAN))
        .collect();
    Measure {
        rps: cols[0],
        p50: cols[3],
        p99: cols[5],
        cpu_us_per_req: (cpu1 - cpu0) * 1e6 / requests as f64,
    }
}

/// Median and quartiles of `v`.
fn quartiles(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let at = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    (at(0.5), at(0.25), at(0.75))
}

/// Median latency of a 4 KiB write + fdatasync loop on `dir`'s filesystem.
fn fdatasync_floor(dir: &Path) -> f64 {
    let path = dir.join("fdatasync-probe");
    let f = std::fs::File::create(&path).unwrap();
    let block = vec![7u8; 4096];
    let mut lat = Vec::new();
    for i in 0..300u64 {
        let t = Instant::now();
        f.write_all_at(&block, i * 4096).unwrap();
        f.sync_data().unwrap();
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let _ = std::fs::remove_file(&path);
    quartiles(lat).0
}

fn main() {
    let mut args = std::env::args().skip(1);
    let pairs: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);
    let fsync = args.next().unwrap_or_else(|| "always".to_owned());
    let only: Option<Vec<String>> = std::env::var("BROKER_ROWS")
        .ok()
        .map(|v| v.split(',').map(str::to_owned).collect());
    let base = std::env::current_dir()
        .unwrap()
        .join(format!("broker-vs-redis-{}", std::process::id()));
    std::fs::create_dir_all(&base).unwrap();
    let floor = fdatasync_floor(&base);
    // BROKER_SHARDS=LIST: the broker's shard counts (default 1,2).
    let servers: Vec<Server> = std::iter::once(Server::Redis)
        .chain(
            std::env::var("BROKER_SHARDS")
                .unwrap_or_else(|_| "1,2".to_owned())
                .split(',')
                .map(|entry| {
                    let mut words = entry.split_whitespace();
                    let n = words
                        .next()
                        .and_then(|n| n.parse().ok())
                        .expect("BROKER_SHARDS: a list of counts, each with optional flags");
                    Server::Mailring(n, words.map(str::to_owned).collect())
                }),
        )
        .collect();
    println!(
        "# broker vs redis-server: {pairs} alternating pairs per row, appendfsync {fsync}, {}x each row's request count, loopback, {} CPUs; bare 4 KiB write+fdatasync median {floor:.3} ms on this filesystem",
        scale(&fsync),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!("| row | server | median req/s | p50 ms | p99 ms | server CPU/req | req/s ratio vs redis (median [q1, q3]) |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    let mut seq = 0;
    let chosen = |name: &str| only.as_ref().is_none_or(|o| o.iter().any(|n| n == name));
    for row in ROWS.iter().filter(|r| chosen(r.name)) {
        let results = mailring_bench::alternating_pairs(pairs, servers.len(), |i| {
            seq += 1;
            run_row(&servers[i], row, &fsync, &base, seq)
        });
        report(row.name, &servers, &results);
    }
    // (`everysec` whatever the argument: a block is one append either
    // way.)
    for row in TRANSACTION_ROWS.iter().filter(|r| chosen(r.name)) {
        let results = mailring_bench::alternating_pairs(pairs, servers.len(), |i| {
            seq += 1;
            run_transactions(&servers[i], row, &base, seq)
        });
        report(row.name, &servers, &results);
    }
    if chosen(GROUP_READ_ROW) {
        let results = mailring_bench::alternating_pairs(pairs, servers.len(), |i| {
            seq += 1;
            run_group_reads(&servers[i], &base, seq)
        });
        report(GROUP_READ_ROW, &servers, &results);
    }
    let _ = std::fs::remove_dir_all(&base);
}

/// Prints a row's lines: each server's medians, and its ratio to the
/// first server's (redis-server's) rate.
fn report(row: &str, servers: &[Server], results: &[Vec<Measure>]) {
    let redis_rps: Vec<f64> = results[0].iter().map(|m| m.rps).collect();
    for (s, ms) in servers.iter().zip(results) {
        let (rps, _, _) = quartiles(ms.iter().map(|m| m.rps).collect());
        let (p50, _, _) = quartiles(ms.iter().map(|m| m.p50).collect());
        let (p99, _, _) = quartiles(ms.iter().map(|m| m.p99).collect());
        let (cpu, _, _) = quartiles(ms.iter().map(|m| m.cpu_us_per_req).collect());
        let ratios: Vec<f64> = ms.iter().zip(&redis_rps).map(|(m, r)| m.rps / r).collect();
        let (rm, rq1, rq3) = quartiles(ratios);
        println!(
            "| {} | {} | {:.0} | {:.3} | {:.3} | {:.1} µs | {:.2} [{:.2}, {:.2}] |",
            row,
            s.name(),
            rps,
            p50,
            p99,
            cpu,
            rm,
            rq1,
            rq3
        );
    }
}
