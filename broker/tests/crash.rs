//! The broker process killed with SIGKILL in the middle of a produce
//! storm, then restarted on its data directory: every acknowledged entry
//! is there, in order, with its id and fields.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::{encode, TempDir};

/// A broker process, killed when dropped.
struct Proc {
    child: Child,
    addr: SocketAddr,
}

impl Proc {
    fn start(dir: &Path) -> Proc {
        Self::start_with(dir, &[])
    }

    fn start_with(dir: &Path, extra: &[&str]) -> Proc {
        Self::start_in(
            Command::new(env!("CARGO_BIN_EXE_mailring-broker")),
            dir,
            extra,
        )
    }

    /// Under a descriptor limit of `n` (soft and hard: it cannot raise it).
    fn start_with_descriptor_limit(dir: &Path, n: u32) -> Proc {
        let mut bash = Command::new("bash");
        bash.args(["-c", &format!("ulimit -n {n} && exec \"$0\" \"$@\"")])
            .arg(env!("CARGO_BIN_EXE_mailring-broker"));
        Self::start_in(bash, dir, &[])
    }

    fn start_in(mut command: Command, dir: &Path, extra: &[&str]) -> Proc {
        let mut child = command
            .args(["--port", "0", "--shards", "2", "--dir"])
            .arg(dir)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the broker binary");
        let out = BufReader::new(child.stdout.take().unwrap());
        let mut addr = None;
        for line in out.lines() {
            let line = line.expect("broker stdout");
            if let Some(a) = line.strip_prefix("mailring broker listening on ") {
                addr = Some(a.parse().expect("an address"));
                break;
            }
        }
        Proc {
            child,
            addr: addr.expect("the broker printed its address"),
        }
    }

    fn kill(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().unwrap();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads one bulk or status reply line's text (`XADD` answers a bulk).
fn read_bulk(r: &mut BufReader<TcpStream>) -> Option<String> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 || !line.ends_with("\r\n") {
        return None;
    }
    let n: usize = line.strip_prefix('$')?.trim_end().parse().ok()?;
    let mut buf = vec![0u8; n + 2];
    r.read_exact(&mut buf).ok()?;
    buf.truncate(n);
    String::from_utf8(buf).ok()
}

/// Reads a whole reply into text (enough for XRANGE's arrays of bulks,
/// and status and error lines).
fn read_reply(r: &mut BufReader<TcpStream>, out: &mut Vec<String>) {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let line = line.trim_end().to_owned();
    match line.as_bytes()[0] {
        b'*' => {
            let n: i64 = line[1..].parse().unwrap();
            for _ in 0..n.max(0) {
                read_reply(r, out);
            }
        }
        b'$' => {
            let n: usize = line[1..].parse().unwrap();
            let mut buf = vec![0u8; n + 2];
            r.read_exact(&mut buf).unwrap();
            buf.truncate(n);
            out.push(String::from_utf8(buf).unwrap());
        }
        b'+' | b'-' => out.push(line[1..].to_owned()),
        _ => panic!("unexpected reply {line:?}"),
    }
}

const STREAMS: usize = 6;
const PRODUCERS: usize = 4;
const WINDOW: usize = 16;

#[test]
fn sigkill_mid_stream_loses_no_acknowledged_entry() {
    let dir = TempDir::new();
    let broker = Proc::start(&dir.0);
    let stop = Arc::new(AtomicBool::new(false));
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let addr = broker.addr;
            let stop = stop.clone();
            std::thread::spawn(move || {
                // (stream, id, value) of each acknowledged entry, in order.
                let mut acked: Vec<(usize, String, String)> = Vec::new();
                let s = TcpStream::connect(addr).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                let mut w = s.try_clone().unwrap();
                let mut r = BufReader::new(s);
                let deadline = Instant::now() + Duration::from_secs(20);
                let mut n = 0usize;
                'run: while Instant::now() < deadline {
                    let mut wire = Vec::new();
                    let mut sent = Vec::new();
                    for _ in 0..WINDOW {
                        let stream = (n + p) % STREAMS;
                        let value = format!("p{p}-{n}");
                        wire.extend(encode(&[
                            b"XADD",
                            format!("crash:{stream}").as_bytes(),
                            b"*",
                            b"v",
                            value.as_bytes(),
                        ]));
                        sent.push((stream, value));
                        n += 1;
                    }
                    if w.write_all(&wire).is_err() {
                        break;
                    }
                    for (stream, value) in sent {
                        match read_bulk(&mut r) {
                            Some(id) => acked.push((stream, id, value)),
                            None => break 'run,
                        }
                    }
                    if stop.load(Ordering::Relaxed) && acked.len() > 10_000 {
                        break;
                    }
                }
                acked
            })
        })
        .collect();
    // Let them get going, then kill the broker in the middle.
    std::thread::sleep(Duration::from_millis(400));
    broker.kill();
    stop.store(true, Ordering::Relaxed);
    let acked: Vec<Vec<(usize, String, String)>> =
        producers.into_iter().map(|h| h.join().unwrap()).collect();
    let total: usize = acked.iter().map(Vec::len).sum();
    assert!(total > 0, "the producers got answers before the kill");
    eprintln!("{total} entries acknowledged before the kill");

    let broker = Proc::start(&dir.0);
    let s = TcpStream::connect(broker.addr).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    let mut recovered: Vec<Vec<(String, String)>> = Vec::new();
    for stream in 0..STREAMS {
        w.write_all(&encode(&[
            b"XRANGE",
            format!("crash:{stream}").as_bytes(),
            b"-",
            b"+",
        ]))
        .unwrap();
        let mut flat = Vec::new();
        read_reply(&mut r, &mut flat);
        // [id, "v", value] per entry.
        recovered.push(
            flat.chunks(3)
                .map(|e| (e[0].clone(), e[2].clone()))
                .collect(),
        );
    }
    for (p, entries) in acked.iter().enumerate() {
        // Each producer's acknowledged entries are in their stream, in the
        // order acknowledged, with the ids and values it was told.
        let mut cursor = [0usize; STREAMS];
        for (stream, id, value) in entries {
            let log = &recovered[*stream];
            let at = log[cursor[*stream]..]
                .iter()
                .position(|(i, v)| i == id && v == value)
                .unwrap_or_else(|| panic!("producer {p}: {id} {value} lost from stream {stream}"));
            cursor[*stream] += at + 1;
        }
    }
    drop(broker);
}

#[test]
fn shutdown_from_a_client_flushes_and_exits_cleanly() {
    let dir = TempDir::new();
    let mut broker = Proc::start(&dir.0);
    let s = TcpStream::connect(broker.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    w.write_all(&encode(&[b"XADD", b"kept", b"1-1", b"f", b"v"]))
        .unwrap();
    assert_eq!(read_bulk(&mut r).as_deref(), Some("1-1"));
    w.write_all(&encode(&[b"SHUTDOWN"])).unwrap();
    // No reply: the connection closes and the process exits by itself.
    let mut rest = Vec::new();
    let _ = r.read_to_end(&mut rest);
    assert!(rest.is_empty(), "SHUTDOWN answered {rest:?}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = broker.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the broker did not exit");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    let broker = Proc::start(&dir.0);
    let s = TcpStream::connect(broker.addr).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    w.write_all(&encode(&[b"XRANGE", b"kept", b"-", b"+"]))
        .unwrap();
    let mut flat = Vec::new();
    read_reply(&mut r, &mut flat);
    assert_eq!(flat, ["1-1", "f", "v"]);
}

#[test]
fn under_everysec_and_no_an_answered_write_survives_a_killed_process() {
    for policy in ["everysec", "no"] {
        let dir = TempDir::new();
        let broker = Proc::start_with(&dir.0, &["--appendfsync", policy]);
        let s = TcpStream::connect(broker.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut w = s.try_clone().unwrap();
        let mut r = BufReader::new(s);
        for i in 1..=50 {
            let id = format!("{i}-1");
            w.write_all(&encode(&[b"XADD", b"k", id.as_bytes(), b"f", b"v"]))
                .unwrap();
            assert_eq!(read_bulk(&mut r).as_deref(), Some(id.as_str()));
        }
        // Killed at once: the writes are in the page cache, not flushed.
        broker.kill();
        let broker = Proc::start(&dir.0);
        let s = TcpStream::connect(broker.addr).unwrap();
        let mut w = s.try_clone().unwrap();
        let mut r = BufReader::new(s);
        w.write_all(&encode(&[b"XRANGE", b"k", b"-", b"+"]))
            .unwrap();
        let mut flat = Vec::new();
        read_reply(&mut r, &mut flat);
        assert_eq!(flat.len(), 150, "{policy}: every answered entry is there");
    }
}

#[test]
fn sigkill_mid_consumption_leaves_groups_where_their_acks_left_them() {
    let dir = TempDir::new();
    let broker = Proc::start(&dir.0);
    let s = TcpStream::connect(broker.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    let mut wire = encode(&[b"XGROUP", b"CREATE", b"work", b"g", b"$", b"MKSTREAM"]);
    for i in 1..=10_000 {
        let id = format!("{i}-1");
        wire.extend(encode(&[b"XADD", b"work", id.as_bytes(), b"n", b"x"]));
    }
    w.write_all(&wire).unwrap();
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert_eq!(line, "+OK\r\n");
    for _ in 0..10_000 {
        read_bulk(&mut r).expect("an id");
    }
    // A consumer reads batches and acknowledges every other entry, until
    // the broker is killed under it.
    let addr = broker.addr;
    let consumer = std::thread::spawn(move || {
        let mut acked: Vec<String> = Vec::new();
        let mut unacked: Vec<String> = Vec::new();
        let mut in_flight: Vec<String> = Vec::new();
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut w = s.try_clone().unwrap();
        let mut r = BufReader::new(s);
        loop {
            let read = encode(&[
                b"XREADGROUP",
                b"GROUP",
                b"g",
                b"c",
                b"COUNT",
                b"10",
                b"STREAMS",
                b"work",
                b">",
            ]);
            if w.write_all(&read).is_err() {
                break;
            }
            let mut flat = Vec::new();
            let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                read_reply(&mut r, &mut flat)
            }));
            if ok.is_err() || flat.is_empty() {
                break;
            }
            // [key, id, "n", "x", id, "n", "x", ...]
            let ids: Vec<String> = flat[1..].chunks(3).map(|e| e[0].clone()).collect();
            let (ack, keep): (Vec<_>, Vec<_>) =
                ids.into_iter().enumerate().partition(|(i, _)| i % 2 == 0);
            unacked.extend(keep.into_iter().map(|(_, id)| id));
            in_flight = ack.into_iter().map(|(_, id)| id).collect();
            let mut args: Vec<&[u8]> = vec![b"XACK", b"work", b"g"];
            args.extend(in_flight.iter().map(|s| s.as_bytes()));
            if w.write_all(&encode(&args)).is_err() {
                break;
            }
            let mut line = String::new();
            if r.read_line(&mut line).unwrap_or(0) == 0 || !line.starts_with(':') {
                break;
            }
            acked.append(&mut in_flight);
        }
        (acked, unacked, in_flight)
    });
    std::thread::sleep(Duration::from_millis(150));
    broker.kill();
    let (acked, unacked, in_flight) = consumer.join().unwrap();
    assert!(!acked.is_empty(), "the consumer got going before the kill");
    let broker = Proc::start(&dir.0);
    let s = TcpStream::connect(broker.addr).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    w.write_all(&encode(&[
        b"XPENDING",
        b"work",
        b"g",
        b"-",
        b"+",
        b"100000",
    ]))
    .unwrap();
    // Rows of [id, consumer, idle, count]: integers read as text below.
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let rows: usize = line.trim_end()[1..].parse().unwrap();
    let mut pending = std::collections::HashSet::new();
    for _ in 0..rows {
        let mut header = String::new();
        r.read_line(&mut header).unwrap();
        let mut id = Vec::new();
        read_reply(&mut r, &mut id);
        let mut consumer = Vec::new();
        read_reply(&mut r, &mut consumer);
        for _ in 0..2 {
            let mut int = String::new();
            r.read_line(&mut int).unwrap();
        }
        pending.insert(id.remove(0));
    }
    for id in &acked {
        assert!(!pending.contains(id), "{id} was acknowledged, yet pending");
    }
    for id in &unacked {
        assert!(
            pending.contains(id),
            "{id} was delivered, not acknowledged, yet not pending"
        );
    }
    // The acknowledgement in flight at the kill may or may not have landed.
    let _ = in_flight;
}

/// The process's `THP_enabled` line in `/proc/PID/status` (0: transparent
/// huge pages are off for it).
fn thp_enabled(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("THP_enabled:"))
        .expect("the kernel reports THP_enabled (Linux 5.0 and later)")
        .trim()
        .to_owned()
}

#[test]
fn the_broker_turns_transparent_huge_pages_off_unless_allowed() {
    let dir = TempDir::new();
    let broker = Proc::start(&dir.0);
    assert_eq!(thp_enabled(broker.child.id()), "0", "off by default");
    broker.kill();
    let broker = Proc::start_with(&dir.0, &["--allow-thp"]);
    assert_eq!(
        thp_enabled(broker.child.id()),
        thp_enabled(std::process::id()),
        "--allow-thp leaves the setting it was started with"
    );
    broker.kill();
}

/// The CPUs each of the `shards` shard threads of process `pid` may run
/// on (`Cpus_allowed_list` of its threads named `mailring-shard…`).
///
/// A thread a shard starts carries the shard's name and CPUs until its
/// own first steps rename it (Rust names a thread from inside it), so a
/// reading that sees more than `shards` of them is taken again, for up to
/// 5 s.
fn shard_cpus(pid: u32, shards: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let cpus = shard_cpus_now(pid);
        if cpus.len() <= shards || Instant::now() > deadline {
            return cpus;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn shard_cpus_now(pid: u32) -> Vec<String> {
    let mut cpus = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let status = std::fs::read_to_string(task.unwrap().path().join("status")).unwrap();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_owned())
        };
        if field("Name:").is_some_and(|n| n.starts_with("mailring-shard")) {
            cpus.push(field("Cpus_allowed_list:").unwrap());
        }
    }
    cpus
}

#[test]
fn cpus_pins_the_shards_and_a_bad_list_stops_the_start() {
    let dir = TempDir::new();
    // The last CPU this test may use: every shard of the broker on it.
    let allowed = std::fs::read_to_string("/proc/self/status").unwrap();
    let last: usize = allowed
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .split([',', '-'])
        .filter_map(|c| c.parse().ok())
        .max()
        .unwrap();
    let broker = Proc::start_with(&dir.0, &["--cpus", &last.to_string()]);
    assert_eq!(shard_cpus(broker.child.id(), 2), vec![last.to_string(); 2]);
    broker.kill();
    // A CPU past the machine: the broker says so and exits.
    let out = Command::new(env!("CARGO_BIN_EXE_mailring-broker"))
        .args(["--port", "0", "--cpus", "100000", "--dir"])
        .arg(&dir.0)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("CPU 100000"), "{said}");
    let out = Command::new(env!("CARGO_BIN_EXE_mailring-broker"))
        .args(["--cpus", "1,x"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--cpus"));
}

/// Under a low `ulimit -n` the broker lowers `maxclients` to fit (as
/// Redis does), so a client past it is told, not left in the backlog of a
/// listener that cannot accept it for want of descriptors.
#[test]
fn a_low_descriptor_limit_lowers_maxclients_and_clients_past_it_are_told() {
    let dir = TempDir::new();
    let broker = Proc::start_with_descriptor_limit(&dir.0, 400);
    let connect = || {
        let c = TcpStream::connect(broker.addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        BufReader::new(c)
    };
    let ask = |c: &mut BufReader<TcpStream>, args: &[&[u8]]| -> Vec<String> {
        c.get_mut().write_all(&encode(args)).unwrap();
        let mut out = Vec::new();
        read_reply(c, &mut out);
        out
    };
    let mut first = connect();
    let reply = ask(&mut first, &[b"CONFIG", b"GET", b"maxclients"]);
    let max: usize = reply[1].parse().unwrap();
    assert!((1..400 - 176).contains(&max), "{reply:?}");
    // Every client up to it is served; the next is told.
    let mut clients = vec![first];
    while clients.len() < max {
        let mut c = connect();
        assert_eq!(
            ask(&mut c, &[b"PING"]),
            ["PONG"],
            "client {}",
            clients.len() + 1
        );
        clients.push(c);
    }
    for _ in 0..3 {
        let mut past = connect();
        let mut line = String::new();
        past.read_line(&mut line).unwrap();
        assert_eq!(line, "-ERR max number of clients reached\r\n");
    }
    drop(clients);
    // Once the closes are seen, clients are served again.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut again = connect();
        let mut line = String::new();
        again.get_mut().write_all(&encode(&[b"PING"])).unwrap();
        again.read_line(&mut line).unwrap();
        if line == "+PONG\r\n" {
            break;
        }
        assert_eq!(line, "-ERR max number of clients reached\r\n");
        assert!(Instant::now() < deadline, "never served again");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The first segment file under `dir`, searched depth first.
fn find_segment(dir: &Path) -> Option<std::path::PathBuf> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .collect();
    entries.sort_by_key(|e| e.file_name());
    entries.into_iter().find_map(|e| {
        let path = e.path();
        if path.is_dir() {
            find_segment(&path)
        } else {
            path.extension().is_some_and(|x| x == "seg").then_some(path)
        }
    })
}

/// A data directory the broker cannot use is named in the error that
/// stops it (not a bare `Not a directory`).
#[test]
fn a_data_directory_it_cannot_use_is_named_in_the_error() {
    let dir = TempDir::new();
    let start = |data: &Path| {
        let mut config = mailring_broker::BrokerConfig {
            addr: "127.0.0.1:0".parse().unwrap(),
            ..mailring_broker::BrokerConfig::default()
        };
        config.store.dir = data.to_path_buf();
        mailring_broker::Broker::start(config)
            .map(|b| b.shutdown())
            .expect_err("refused")
            .to_string()
    };
    // A file where the directory should be.
    std::fs::create_dir_all(&dir.0).unwrap();
    let file = dir.0.join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let e = start(&file);
    assert!(e.contains(&file.display().to_string()), "{e}");
    // A directory where a segment should be.
    let data = dir.0.join("data");
    let proc = Proc::start(&data);
    let mut c = BufReader::new(TcpStream::connect(proc.addr).unwrap());
    c.get_mut()
        .write_all(&encode(&[b"XADD", b"s", b"1-1", b"f", b"v"]))
        .unwrap();
    assert_eq!(read_bulk(&mut c).as_deref(), Some("1-1"));
    drop(proc);
    let segment = find_segment(&data).expect("a segment file");
    std::fs::remove_file(&segment).unwrap();
    std::fs::create_dir(&segment).unwrap();
    let e = start(&data);
    assert!(e.contains(&segment.display().to_string()), "{e}");
}
