//! Differential tests: the same scripted `redis-cli` sessions run against
//! the broker and against a real `redis-server` (7.0, as Debian ships it,
//! with `appendonly yes` and `appendfsync always` as the broker runs, and
//! one database as the broker has),
//! and their outputs must match, with only the time part of `*`-made ids
//! masked (and integers of replies marked `#! mask-integers`, or the
//! idle times of those marked `#! mask-idle`). The scripts are `tests/redis/*.redis`. Without `redis-server`
//! and `redis-cli` on the PATH the test says so and passes (`.ci/run`
//! installs them).

use std::io::Write;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mailring_broker::{Broker, BrokerConfig};

mod common;
use common::{power_loss_image, TempDir};

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A `redis-server` on a loopback port, its AOF in `dir`; stopped when
/// dropped.
struct RedisServer {
    child: Child,
    port: u16,
}

impl RedisServer {
    fn start(dir: &Path) -> RedisServer {
        Self::start_with(dir, &[])
    }

    /// As [`start`](Self::start), with more settings (`--name value`).
    fn start_with(dir: &Path, settings: &[&str]) -> RedisServer {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        std::fs::create_dir_all(dir).unwrap();
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--databases",
                "1",
                "--dir",
            ])
            .arg(dir)
            .args(settings)
            .stdout(Stdio::null())
            .spawn()
            .expect("start redis-server");
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        RedisServer { child, port }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How a step's output is masked before comparing.
#[derive(Clone, Copy, PartialEq)]
enum Mask {
    /// Only the time part of clock-made ids.
    Ids,
    /// Also every integer (`#! mask-integers`).
    Integers,
    /// Also the third element of nested arrays: XPENDING's idle times
    /// (`#! mask-idle`).
    Idle,
    /// `INFO commandstats`: the times masked and the lines sorted, as
    /// Redis lists them in its hash table's order (`#!
    /// mask-commandstats`).
    CommandStats,
}

/// One command of a script with how its output is compared.
struct Step {
    command: String,
    mask: Mask,
}

fn parse_script(text: &str) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut mask = Mask::Ids;
    for line in text.lines() {
        let line = line.trim();
        if line == "#! mask-integers" {
            mask = Mask::Integers;
        } else if line == "#! mask-idle" {
            mask = Mask::Idle;
        } else if line == "#! mask-commandstats" {
            mask = Mask::CommandStats;
        } else if line.is_empty() || line.starts_with('#') {
            continue;
        } else {
            steps.push(Step {
                command: line.to_owned(),
                mask,
            });
            mask = Mask::Ids;
        }
    }
    steps
}

/// Runs the steps through one `redis-cli` session (an `ECHO` marker
/// before each), returning each step's output.
fn run(port: u16, steps: &[Step], resp3: bool) -> Vec<String> {
    let mut input = String::new();
    for (i, s) in steps.iter().enumerate() {
        input.push_str(&format!("ECHO \"<<step {i}>>\"\n{}\n", s.command));
    }
    let mut cmd = Command::new("redis-cli");
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string(), "--no-raw"]);
    if resp3 {
        cmd.arg("-3");
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run redis-cli");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut outputs = vec![String::new(); steps.len()];
    let mut current: Option<usize> = None;
    for line in text.lines() {
        if let Some(i) = line
            .strip_prefix("\"<<step ")
            .and_then(|r| r.strip_suffix(">>\""))
            .and_then(|n| n.parse::<usize>().ok())
        {
            current = Some(i);
            continue;
        }
        if let Some(i) = current {
            outputs[i].push_str(line);
            outputs[i].push('\n');
        }
    }
    outputs
        .into_iter()
        .zip(steps)
        .map(|(o, s)| {
            if s.mask == Mask::CommandStats {
                return mask_command_stats(&o);
            }
            o.lines()
                .map(|line| {
                    let integers = match s.mask {
                        Mask::Ids | Mask::CommandStats => false,
                        Mask::Integers => true,
                        Mask::Idle => line.trim_start().starts_with("3) (integer)"),
                    };
                    mask(line, integers) + "\n"
                })
                .collect()
        })
        .collect()
}

/// `INFO commandstats` and `INFO latencystats` as compared: each line's
/// times (`usec`, `usec_per_call`, the percentiles `p50`, `p99`, ...)
/// masked, the lines sorted.
fn mask_command_stats(output: &str) -> String {
    let is_time = |name: &str| {
        let last = name.rsplit(':').next().unwrap_or(name);
        name == "usec"
            || name == "usec_per_call"
            || (last.starts_with('p') && last[1..].starts_with(|c: char| c.is_ascii_digit()))
    };
    let mut lines: Vec<String> = output
        .lines()
        .map(|line| {
            line.split(',')
                .map(|field| match field.split_once('=') {
                    Some((name, _)) if is_time(name) => format!("{name}=<t>"),
                    _ => field.to_owned(),
                })
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect();
    lines.sort();
    lines.iter().map(|l| format!("{l}\n")).collect()
}

/// Masks the time part of ids made from the clock (13 or more digits
/// before a `-`), and with `integers`, every `(integer) n`.
fn mask(text: &str, integers: bool) -> String {
    let mut out = String::with_capacity(text.len());
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_digit() && (i == 0 || !b[i - 1].is_ascii_digit()) {
            let start = i;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            let digits = &text[start..i];
            let is_time = digits.len() >= 13 && b.get(i) == Some(&b'-');
            let is_int = integers && text[..start].ends_with("(integer) ");
            out.push_str(if is_time {
                "<ms>"
            } else if is_int {
                "<n>"
            } else {
                digits
            });
        } else {
            let ch = text[i..].chars().next().unwrap();
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

/// Runs `steps` through redis-server and through `broker` (through
/// `redis-cli`, or `pipelined`: all at once on one connection, each reply
/// compared byte for byte), and adds a failure naming `what` for each
/// step whose outputs differ.
fn compare(
    redis: &RedisServer,
    broker: &Broker,
    steps: &[Step],
    (resp3, pipelined): (bool, bool),
    what: &str,
    failures: &mut Vec<String>,
) {
    let run = |port| {
        if pipelined {
            run_pipelined(port, steps, resp3)
        } else {
            run(port, steps, resp3)
        }
    };
    let (want, got) = (run(redis.port), run(broker.local_addr().port()));
    for (i, step) in steps.iter().enumerate() {
        let (w, g) = (want.get(i), got.get(i));
        if w != g {
            let before: Vec<&str> = steps[i.saturating_sub(8)..i]
                .iter()
                .map(|s| s.command.as_str())
                .collect();
            let mode = if pipelined { " (pipelined)" } else { "" };
            failures.push(format!(
                "{what}{mode}: `{}` after {before:?}\n--- redis-server:\n{w:?}\n--- broker:\n{g:?}",
                step.command
            ));
        }
    }
}

/// The steps sent all at once on one connection, as RESP requests (split
/// on blanks: the generated commands quote nothing but `""`): each one's
/// reply, as sent.
fn run_pipelined(port: u16, steps: &[Step], resp3: bool) -> Vec<String> {
    let mut input = Vec::new();
    if resp3 {
        input.extend(common::encode(&[b"HELLO", b"3"]));
    }
    for step in steps {
        let args: Vec<&[u8]> = step
            .command
            .split(' ')
            .filter(|a| !a.is_empty())
            .map(|a| if a == "\"\"" { &b""[..] } else { a.as_bytes() })
            .collect();
        input.extend(common::encode(&args));
    }
    input.extend(common::encode(&[b"QUIT"]));
    let mut replies = split_replies(&exchange(port, &input));
    if resp3 {
        // HELLO's map carries the connection's id: not compared.
        replies.remove(0);
    }
    replies
}

/// A stream of RESP2/RESP3 replies cut into one string per reply.
fn split_replies(bytes: &[u8]) -> Vec<String> {
    fn line_end(b: &[u8], at: usize) -> Option<usize> {
        b[at..]
            .windows(2)
            .position(|w| w == b"\r\n")
            .map(|p| at + p)
    }
    /// The end of the reply at `at`.
    fn reply_end(b: &[u8], at: usize) -> Option<usize> {
        let end = line_end(b, at)?;
        let n = || {
            std::str::from_utf8(&b[at + 1..end])
                .ok()?
                .parse::<i64>()
                .ok()
        };
        match *b.get(at)? {
            b'$' | b'=' | b'!' => {
                let len = n()?;
                if len < 0 {
                    Some(end + 2)
                } else {
                    Some(end + 2 + len as usize + 2)
                }
            }
            b'*' | b'~' | b'>' | b'%' => {
                let count = n()?;
                let items = if b[at] == b'%' { 2 * count } else { count };
                let mut pos = end + 2;
                for _ in 0..items.max(0) {
                    pos = reply_end(b, pos)?;
                }
                Some(pos)
            }
            _ => Some(end + 2),
        }
    }
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let Some(end) = reply_end(bytes, at) else {
            out.push(String::from_utf8_lossy(&bytes[at..]).into_owned());
            break;
        };
        // Clock-made ids masked, as in `run` (a `*` among the spoilt
        // arguments makes one).
        out.push(mask(&String::from_utf8_lossy(&bytes[at..end]), false));
        at = end;
    }
    out
}

/// A broker on a loopback port with its data in `dir`.
fn broker_config(dir: std::path::PathBuf) -> BrokerConfig {
    let mut config = BrokerConfig {
        addr: "127.0.0.1:0".parse().unwrap(),
        ..BrokerConfig::default()
    };
    config.store.dir = dir;
    config
}

#[test]
fn scripted_redis_cli_sessions_match_redis_server() {
    if !have("redis-server") || !have("redis-cli") {
        eprintln!("SKIPPED: redis-server and redis-cli are not installed (apt-get install redis-server redis-tools)");
        return;
    }
    let dir = TempDir::new();
    let mut scripts: Vec<_> =
        std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/redis"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "redis"))
            .collect();
    scripts.sort();
    assert!(!scripts.is_empty());
    let mut failures = Vec::new();
    for script in &scripts {
        let text = std::fs::read_to_string(script).unwrap();
        let steps = parse_script(&text);
        let resp3 = text.starts_with("#! resp3");
        // `#! requirepass <password>` on a line of its own: both servers
        // require it.
        let password = text
            .lines()
            .find_map(|l| l.strip_prefix("#! requirepass "))
            .map(str::trim);
        let name = script.file_name().unwrap().to_string_lossy().into_owned();
        // A fresh server of each kind per script.
        let settings: Vec<&str> = password
            .map(|p| vec!["--requirepass", p])
            .unwrap_or_default();
        let redis = RedisServer::start_with(&dir.0.join(format!("redis-{name}")), &settings);
        let mut config = broker_config(dir.0.join(format!("broker-{name}")));
        config.requirepass = password.map(|p| bytes::Bytes::copy_from_slice(p.as_bytes()));
        let broker = Broker::start(config).expect("start the broker");
        compare(
            &redis,
            &broker,
            &steps,
            (resp3, false),
            &name,
            &mut failures,
        );
        broker.shutdown();
    }
    assert!(
        failures.is_empty(),
        "{} differences:\n\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// A small deterministic generator (splitmix64): the same seed gives the
/// same traffic.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }
}

/// Random stream traffic over three streams, two groups and three
/// consumers, with explicit and partial ids only (no clock), mostly valid
/// and sometimes not: every command's reply (errors included) must match.
struct Traffic {
    rng: Rng,
    /// Per stream, the time part the next id is near.
    next_ms: [u64; 3],
    /// Whether `XINFO STREAM` is asked: its node counts (`radix-tree-*`)
    /// follow how the entries were laid out, which a restart does afresh
    /// (in redis-server, whose AOF replay adds the live entries again, as
    /// in the broker), so only before the first restart.
    node_info: bool,
    /// Whether replies carrying idle times (`XPENDING`'s extended form)
    /// are asked: not when the round is compared byte for byte.
    idle_times: bool,
    /// Whether a transaction may name several streams: only while the
    /// broker has one shard (over several, its streams may sit on
    /// different shards, and such a transaction is refused).
    multi_streams: bool,
}

const KEYS: [&str; 3] = ["s0", "s1", "s2"];

impl Traffic {
    fn new(seed: u64) -> Traffic {
        Traffic {
            rng: Rng(seed),
            next_ms: [1; 3],
            node_info: true,
            idle_times: true,
            multi_streams: false,
        }
    }

    fn key(&mut self) -> (usize, &'static str) {
        let k = self.rng.below(3) as usize;
        (k, KEYS[k])
    }

    /// An id near the stream's newest (and sometimes an old one).
    fn id(&mut self, k: usize) -> String {
        let top = self.next_ms[k];
        let ms = top.saturating_sub(self.rng.below(top.min(12) + 1)).max(1);
        format!("{ms}-{}", self.rng.below(3))
    }

    fn bound(&mut self, k: usize) -> String {
        match self.rng.below(5) {
            0 => "-".into(),
            1 => "+".into(),
            2 => format!("({}", self.id(k)),
            _ => self.id(k),
        }
    }

    fn value(&mut self) -> String {
        // Some large enough to roll 4 KiB segments now and then.
        let n = [1, 3, 40, 300][self.rng.below(4) as usize];
        "v".repeat(n)
    }

    fn add(&mut self, k: usize, key: &str) -> String {
        let mut cmd = format!("XADD {key}");
        if self.rng.below(12) == 0 {
            cmd.push_str(" NOMKSTREAM");
        }
        match self.rng.below(10) {
            0 => cmd.push_str(&format!(" MAXLEN = {}", self.rng.below(6))),
            1 => cmd.push_str(&format!(" MINID = {}", self.id(k))),
            _ => {}
        }
        let step = self.rng.below(3);
        self.next_ms[k] += step;
        let ms = self.next_ms[k];
        let id = match self.rng.below(10) {
            0 => self.id(k),
            1..=4 => format!("{ms}-*"),
            _ => format!("{ms}-{}", self.rng.below(4)),
        };
        let value = self.value();
        format!("{cmd} {id} f {value}")
    }

    /// One command on stream `k` (in a transaction: naming no other).
    fn stream_command(&mut self, k: usize, in_multi: bool) -> (String, Mask) {
        let key = KEYS[k];
        let g = self.rng.pick(&["g0", "g1"]);
        let c = self.rng.pick(&["c0", "c1", "c2"]);
        let count = 1 + self.rng.below(4);
        let cmd = match self.rng.below(100) {
            0..=29 => self.add(k, key),
            30..=33 => format!("XDEL {key} {} {}", self.id(k), self.id(k)),
            34..=35 => match self.rng.below(2) {
                0 => format!("XTRIM {key} MAXLEN = {}", self.rng.below(8)),
                _ => format!("XTRIM {key} MINID = {}", self.id(k)),
            },
            36..=43 => {
                let (a, b) = (self.bound(k), self.bound(k));
                let rev = self.rng.below(2) == 0;
                let name = if rev { "XREVRANGE" } else { "XRANGE" };
                format!("{name} {key} {a} {b} COUNT {count}")
            }
            44..=45 => format!("XLEN {key}"),
            46..=50 => {
                let id = match self.rng.below(4) {
                    0 => "0".to_owned(),
                    1 => "$".to_owned(),
                    _ => self.id(k),
                };
                let create = if self.rng.below(3) == 0 {
                    " MKSTREAM"
                } else {
                    ""
                };
                let read = if self.rng.below(4) == 0 {
                    format!(" ENTRIESREAD {}", self.rng.below(6))
                } else {
                    String::new()
                };
                format!("XGROUP CREATE {key} {g} {id}{create}{read}")
            }
            51..=52 => format!("XGROUP SETID {key} {g} {}", self.id(k)),
            53 => format!("XGROUP DESTROY {key} {g}"),
            54..=55 => format!("XGROUP CREATECONSUMER {key} {g} {c}"),
            56..=57 => format!("XGROUP DELCONSUMER {key} {g} {c}"),
            58..=69 => {
                let from = match self.rng.below(4) {
                    0 => "0".to_owned(),
                    1 => self.id(k),
                    _ => ">".to_owned(),
                };
                let noack = if self.rng.below(6) == 0 { " NOACK" } else { "" };
                // A millisecond's block: nothing else writes meanwhile, so
                // it answers what is there or times out, in both.
                let noack = if !in_multi && self.rng.below(5) == 0 {
                    format!("{noack} BLOCK 1")
                } else {
                    noack.to_owned()
                };
                if !in_multi && self.rng.below(4) == 0 {
                    let other = KEYS[(k + 1) % 3];
                    format!(
                        "XREADGROUP GROUP {g} {c} COUNT {count}{noack} STREAMS {key} {other} {from} >"
                    )
                } else {
                    format!("XREADGROUP GROUP {g} {c} COUNT {count}{noack} STREAMS {key} {from}")
                }
            }
            70..=76 => format!("XACK {key} {g} {} {}", self.id(k), self.id(k)),
            77..=79 => format!("XPENDING {key} {g}"),
            80..=82 if !self.idle_times => format!("XPENDING {key} {g}"),
            80..=82 => {
                let only = if self.rng.below(2) == 0 {
                    format!(" {c}")
                } else {
                    String::new()
                };
                return (format!("XPENDING {key} {g} - + {count}{only}"), Mask::Idle);
            }
            83..=85 => {
                let mut opts = String::new();
                if self.rng.below(2) == 0 {
                    opts.push_str(" JUSTID");
                }
                if self.rng.below(4) == 0 {
                    opts.push_str(&format!(" RETRYCOUNT {}", self.rng.below(5)));
                }
                if self.rng.below(4) == 0 {
                    opts.push_str(" FORCE");
                }
                if self.rng.below(4) == 0 {
                    opts.push_str(&format!(" LASTID {}", self.id(k)));
                }
                format!("XCLAIM {key} {g} {c} 0 {} {}{opts}", self.id(k), self.id(k))
            }
            86..=88 => {
                let just = if self.rng.below(2) == 0 {
                    " JUSTID"
                } else {
                    ""
                };
                let start = self.id(k);
                format!("XAUTOCLAIM {key} {g} {c} 0 {start} COUNT {count}{just}")
            }
            89..=92 => format!("XINFO GROUPS {key}"),
            93 => match self.rng.below(3) {
                0 => format!("XSETID {key} {}", self.id(k)),
                1 => format!(
                    "XSETID {key} {} ENTRIESADDED {} MAXDELETEDID {}",
                    self.id(k),
                    self.rng.below(40),
                    self.id(k)
                ),
                _ if self.node_info => format!("XINFO STREAM {key}"),
                _ => format!("XLEN {key}"),
            },
            94..=95 => format!("DEL {key}"),
            96 if in_multi => format!("EXISTS {key}"),
            96 => format!("EXISTS {key} {}", KEYS[(k + 1) % 3]),
            97 => format!("TYPE {key}"),
            _ if in_multi => format!("XREAD COUNT {count} STREAMS {key} {}", self.id(k)),
            _ => {
                let (a, b) = (self.id(k), self.id(k));
                let other = KEYS[(k + 2) % 3];
                let (a, block) = match self.rng.below(4) {
                    0 => ("$".to_owned(), " BLOCK 1"),
                    1 => (a, " BLOCK 1"),
                    _ => (a, ""),
                };
                format!("XREAD COUNT {count}{block} STREAMS {key} {other} {a} {b}")
            }
        };
        (cmd, Mask::Ids)
    }

    /// `command` with one argument after its name (often its key or an
    /// option) replaced by an edge of what commands parse: bounds, signs,
    /// overflows, option names out of place, empty.
    fn spoil(&mut self, command: &str) -> String {
        const TOKENS: &[&str] = &[
            "\"\"",
            "0",
            "-1",
            "+",
            "-",
            "$",
            ">",
            "*",
            "(",
            "(-",
            "(+",
            "0-0",
            "(0-0",
            "1-0",
            "18446744073709551615",
            "18446744073709551616",
            "18446744073709551615-18446744073709551615",
            "1-18446744073709551616",
            "9223372036854775807",
            "9223372036854775808",
            "-9223372036854775809",
            "1.5",
            "abc",
            "COUNT",
            "MAXLEN",
            "MINID",
            "~",
            "=",
            "LIMIT",
            "NOMKSTREAM",
            "JUSTID",
            "FORCE",
            "IDLE",
            "TIME",
            "RETRYCOUNT",
            "LASTID",
            "BLOCK",
            "STREAMS",
            "GROUP",
            "NOACK",
            "MKSTREAM",
            "ENTRIESREAD",
            "ENTRIESADDED",
            "MAXDELETEDID",
            "5-*",
            "*-5",
            "-5-1",
            "1--1",
            " ",
        ];
        let mut words: Vec<&str> = command.split(' ').collect();
        if words.len() < 2 {
            return command.to_owned();
        }
        let at = 1 + self.rng.below(words.len() as u64 - 1) as usize;
        let token = TOKENS[self.rng.below(TOKENS.len() as u64) as usize];
        if words[at - 1] == "BLOCK" && token == "0" {
            // Blocked for good, with no writer: the servers would differ
            // only in what they do with the requests behind it when the
            // connection goes.
            return command.to_owned();
        }
        words[at] = token;
        words.join(" ")
    }

    /// The next steps: one command, or a transaction (on one stream, or
    /// while [`Traffic::multi_streams`] over several).
    fn steps(&mut self) -> Vec<Step> {
        let (k, _) = self.key();
        if self.rng.below(25) != 0 {
            let (mut command, mask) = self.stream_command(k, false);
            if self.rng.below(4) == 0 {
                command = self.spoil(&command);
            }
            return vec![Step { command, mask }];
        }
        // The markers between steps are queued too: every reply of the
        // transaction shows under `MULTI`'s, XPENDING's idle times among
        // them.
        let mut steps = vec![Step {
            command: "MULTI".into(),
            mask: Mask::Idle,
        }];
        let over_streams = self.multi_streams && self.rng.below(2) == 0;
        for _ in 0..2 + self.rng.below(3) {
            let (command, mask) = if over_streams && self.rng.below(5) == 0 {
                let count = 1 + self.rng.below(4);
                let ids = [self.id(0), self.id(1), self.id(2)];
                let command = match self.rng.below(3) {
                    0 => "EXISTS s2 s0 s1 s0 nope".to_owned(),
                    1 => format!(
                        "XREAD COUNT {count} STREAMS s1 s0 s2 {} {} {}",
                        ids[1], ids[0], ids[2]
                    ),
                    _ => format!("XREADGROUP GROUP g0 c0 COUNT {count} STREAMS s0 s2 > >"),
                };
                (command, Mask::Ids)
            } else {
                let k = if over_streams { self.key().0 } else { k };
                self.stream_command(k, true)
            };
            steps.push(Step { command, mask });
        }
        steps.push(Step {
            command: "EXEC".into(),
            mask: Mask::Ids,
        });
        steps
    }
}

#[test]
fn random_traffic_across_restarts_matches_redis_server() {
    if !have("redis-server") || !have("redis-cli") {
        eprintln!("SKIPPED: redis-server and redis-cli are not installed (apt-get install redis-server redis-tools)");
        return;
    }
    let seeds: Vec<u64> = match std::env::var("MAILRING_TRAFFIC_SEEDS") {
        Ok(s) => s.split(',').filter_map(|s| s.trim().parse().ok()).collect(),
        Err(_) => (1..=8).collect(),
    };
    let dir = TempDir::new();
    let mut failures = Vec::new();
    for seed in seeds {
        let redis = RedisServer::start(&dir.0.join(format!("redis-{seed}")));
        let mut traffic = Traffic::new(seed);
        let mut config = broker_config(dir.0.join(format!("broker-{seed}")));
        config.store.segment_bytes = 4096;
        // Rounds of traffic, the broker restarted between them with
        // another shard count (its state read back from its files, moved
        // between logs); redis-server runs throughout. After rounds 0 and
        // 2 the next starts from what a power loss would have left
        // (`appendfsync always`: every reply waited for its flush, so
        // nothing answered may be missing).
        // Rounds 1 and 3 are sent pipelined, all at once, and their replies
        // compared byte for byte: a request may not see the effects of
        // the ones after it, nor miss those of the ones before.
        for (round, shards) in [1, 2, 3, 1].into_iter().enumerate() {
            let pipelined = round % 2 == 1;
            traffic.node_info = round == 0;
            traffic.idle_times = !pipelined;
            traffic.multi_streams = shards == 1 && round == 0;
            let mut steps = Vec::new();
            while steps.len() < 150 {
                steps.extend(traffic.steps());
            }
            config.shards = shards;
            let broker = Broker::start(config.clone()).expect("start the broker");
            let what = format!("seed {seed}, round {round}");
            let mode = (seed % 2 == 0, pipelined);
            compare(&redis, &broker, &steps, mode, &what, &mut failures);
            if round % 2 == 0 {
                let image = dir.0.join(format!("broker-{seed}-power-loss-{round}"));
                power_loss_image(&config.store.dir, &image, &broker.durable_files());
                config.store.dir = image;
            }
            broker.shutdown();
        }
    }
    assert_no_failures(&failures, "");
}

/// Sends `input` on a fresh connection, closes the sending side (unless
/// `input` ends with a `QUIT`, which closes the connection once the
/// requests before it are answered: a server may drop a client blocked in
/// `XREAD BLOCK` when it sees the input end), and returns every byte the
/// server answered until it closed.
fn exchange(port: u16, input: &[u8]) -> Vec<u8> {
    let half_close = !input.ends_with(b"QUIT\r\n");
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // Written from another thread: a server that stops reading (after a
    // protocol error) must not stall the test's write.
    let mut w = s.try_clone().unwrap();
    let input = input.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = w.write_all(&input);
        if half_close {
            let _ = w.shutdown(std::net::Shutdown::Write);
        }
    });
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let _ = writer.join();
    out
}

/// A request's bytes with one mutation: a byte replaced by one the parser
/// cares about, a cut, a line put in, or a length made extreme.
fn mutate(rng: &mut Rng, request: &[u8]) -> Vec<u8> {
    const BYTES: &[u8] = b"*$\r\n-+:0123456789 \"'\\ax\0\x0b\x0c\t";
    let mut out = request.to_vec();
    if out.is_empty() {
        return out;
    }
    match rng.below(5) {
        0 => {
            let at = rng.below(out.len() as u64) as usize;
            out[at] = BYTES[rng.below(BYTES.len() as u64) as usize];
        }
        1 => out.truncate(rng.below(out.len() as u64) as usize),
        2 => {
            let at = rng.below(out.len() as u64 + 1) as usize;
            let line: &[u8] = rng.pick_bytes(&[
                b"*-1\r\n",
                b"*0\r\n",
                b"$-1\r\n",
                b"*3\r\n$4\r\nECHO\r\n",
                b"PING \"a b\" 'c'\r\n",
                b"\r\n",
                b"*1\r\n$4\r\nPINGX\r\n",
                b"ECHO \"unbalanced\r\n",
                b"PING\0x \"y\r\n",
                b"\x0bECHO\x0b'a'\x0b\x0cb\x0c'c'\r\n",
                b"ECHO \"a\0b\"\r\n",
                b"\0\n",
            ]);
            out.splice(at..at, line.iter().copied());
        }
        3 => {
            // A length (after `*` or `$`) made extreme.
            let marks: Vec<usize> = out
                .iter()
                .enumerate()
                .filter(|(_, b)| **b == b'*' || **b == b'$')
                .map(|(i, _)| i)
                .collect();
            if let Some(&at) = marks.get(rng.below(marks.len().max(1) as u64) as usize) {
                let end = out[at..]
                    .iter()
                    .position(|b| *b == b'\r')
                    .map_or(out.len(), |p| at + p);
                let len: &[u8] = if out[at] == b'*' {
                    // Counts from 1,048,577 to INT_MAX left out: Redis 7
                    // takes them, the broker refuses them (each argument
                    // costs it a slot before its bytes come), on purpose.
                    rng.pick_bytes(&[
                        b"2147483648",
                        b"-2",
                        b"99999999999999999999",
                        b"1048576",
                        b"",
                        b"+1",
                        b"0x10",
                    ])
                } else {
                    rng.pick_bytes(&[
                        b"2147483648",
                        b"-2",
                        b"536870913",
                        b"536870912",
                        b"99999999999999999999",
                        b"",
                        b"+1",
                        b"0x10",
                    ])
                };
                out.splice(at + 1..end, len.iter().copied());
            }
        }
        _ => {
            // Two requests run together without their line end.
            if let Some(p) = out.windows(2).position(|w| w == b"\r\n") {
                out.drain(p..p + 2);
            }
        }
    }
    out
}

/// Whether `input` has a multibulk count the broker refuses and Redis 7
/// takes (from 1,048,577 to `INT_MAX`), wherever a mutation put it.
fn counts_past_the_brokers_limit(input: &[u8]) -> bool {
    input.split(|b| *b == b'*').skip(1).any(|rest| {
        let digits: Vec<u8> = rest
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .copied()
            .collect();
        std::str::from_utf8(&digits)
            .ok()
            .and_then(|d| d.parse::<u64>().ok())
            .is_some_and(|n| n > 1_048_576 && n <= i32::MAX as u64)
    })
}

impl Rng {
    fn pick_bytes<'a>(&mut self, items: &[&'a [u8]]) -> &'a [u8] {
        items[self.below(items.len() as u64) as usize]
    }
}

#[test]
fn mutated_requests_get_the_same_bytes_back_as_from_redis_server() {
    if !have("redis-server") {
        eprintln!("SKIPPED: redis-server is not installed (apt-get install redis-server)");
        return;
    }
    let cases: u64 = std::env::var("MAILRING_MUTATION_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(300);
    let dir = TempDir::new();
    let redis = RedisServer::start(&dir.0.join("redis"));
    let broker = Broker::start(broker_config(dir.0.join("broker"))).expect("start the broker");
    let seed = std::env::var("MAILRING_MUTATION_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    let mut rng = Rng(seed);
    let mut failures = Vec::new();
    for case in 0..cases {
        let key = format!("m{case}");
        let mut request = Vec::new();
        for args in [
            vec!["PING"],
            vec!["XADD", &key, "1-1", "f", "v"],
            // Not "hello": a mutation could make it HELLO, whose reply
            // carries the connection's id (counted differently).
            vec!["ECHO", "hi"],
            vec!["XLEN", &key],
            vec!["XRANGE", &key, "-", "+"],
            vec!["EXISTS", &key],
        ] {
            let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
            request.extend(common::encode(&args));
        }
        request.extend_from_slice(b"PING inline\r\n");
        request.extend_from_slice(b"ECHO \"q\\x41\\n\" 'it''s'\r\n");
        let mut input = mutate(&mut rng, &request);
        for _ in 0..rng.below(3) {
            input = mutate(&mut rng, &input);
        }
        if counts_past_the_brokers_limit(&input) {
            // The difference on purpose (see `mutate`), however made.
            continue;
        }
        // Every other case in RESP3: `HELLO 3` first, its reply (which
        // carries the connection's id) left out of the comparison.
        let resp3 = case % 2 == 1;
        if resp3 {
            let mut hello = common::encode(&[b"HELLO", b"3"]);
            hello.extend(input);
            input = hello;
        }
        let answer = |port| {
            let out = exchange(port, &input);
            if !resp3 {
                return out;
            }
            let first = split_replies(&out).first().map_or(0, |r| r.len());
            out[first.min(out.len())..].to_vec()
        };
        let (want, got) = (answer(redis.port), answer(broker.local_addr().port()));
        if want != got {
            failures.push(format!(
                "case {case}: {:?}\n--- redis-server:\n{:?}\n--- broker:\n{:?}",
                String::from_utf8_lossy(&input),
                String::from_utf8_lossy(&want),
                String::from_utf8_lossy(&got)
            ));
        }
    }
    broker.shutdown();
    assert_no_failures(&failures, &format!(" of {cases} cases"));
}

/// Fails with the first ten differences found, if any.
fn assert_no_failures(failures: &[String], of: &str) {
    assert!(
        failures.is_empty(),
        "{} differences{of} (the first 10):\n\n{}",
        failures.len(),
        failures
            .iter()
            .take(10)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n\n")
    );
}

#[test]
fn requests_of_clients_that_have_not_authenticated_get_redis_s_limits() {
    if !have("redis-server") {
        eprintln!("SKIPPED: redis-server is not installed (apt-get install redis-server)");
        return;
    }
    let dir = TempDir::new();
    let redis = RedisServer::start_with(&dir.0.join("redis"), &["--requirepass", "secret"]);
    let mut config = broker_config(dir.0.join("broker"));
    config.requirepass = Some(bytes::Bytes::from_static(b"secret"));
    let broker = Broker::start(config).expect("start the broker");
    let many = |n: usize| {
        let mut args: Vec<&[u8]> = vec![b"PING"];
        args.resize(n, b"a");
        common::encode(&args)
    };
    let auth = common::encode(&[b"AUTH", b"secret"]);
    let big_bulk = |len: usize| format!("*2\r\n$4\r\nECHO\r\n${len}\r\n").into_bytes();
    let cases: Vec<Vec<u8>> = vec![
        // Past 10 arguments, or a bulk past 16 KiB, before the password:
        // refused from the header, and the connection closed.
        many(11),
        many(10),
        big_bulk(16385),
        [big_bulk(16384), vec![b'x'; 16384], b"\r\n".to_vec()].concat(),
        // Once authenticated (in the same write), anything goes.
        [auth.clone(), many(11)].concat(),
        [auth, big_bulk(20000), vec![b'x'; 20000], b"\r\n".to_vec()].concat(),
    ];
    let mut failures = Vec::new();
    for (i, input) in cases.iter().enumerate() {
        let want = exchange(redis.port, input);
        let got = exchange(broker.local_addr().port(), input);
        if want != got {
            failures.push(format!(
                "case {i}:\n--- redis-server:\n{:?}\n--- broker:\n{:?}",
                String::from_utf8_lossy(&want),
                String::from_utf8_lossy(&got)
            ));
        }
    }
    broker.shutdown();
    assert_no_failures(&failures, "unauthenticated limits");
}

/// One connection of a blocking scenario, raw RESP (ASCII replies).
struct Raw(std::net::TcpStream, Vec<u8>);

impl Raw {
    fn connect(port: u16) -> Raw {
        let s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        Raw(s, Vec::new())
    }

    /// Sends `command`; commands joined by ` | ` go in one write, as a
    /// client's pipeline (their replies are read one by one).
    fn send(&mut self, command: &str) {
        let mut bytes = Vec::new();
        for one in command.split(" | ") {
            let args: Vec<&[u8]> = one.split(' ').map(str::as_bytes).collect();
            bytes.extend(common::encode(&args));
        }
        self.0.write_all(&bytes).unwrap();
    }

    /// The next whole reply, as text (bytes past it are kept for the
    /// next).
    fn reply(&mut self) -> String {
        use std::io::Read;
        let mut buf = [0u8; 4096];
        loop {
            if let Some(first) = split_replies(&self.1).into_iter().next() {
                self.1.drain(..first.len());
                return first;
            }
            match self.0.read(&mut buf) {
                Ok(0) | Err(_) => {
                    return format!("(no reply) {}", String::from_utf8_lossy(&self.1))
                }
                Ok(n) => self.1.extend_from_slice(&buf[..n]),
            }
        }
    }

    /// Sends `command` (or a pipeline, as [`Raw::send`]) and reads its
    /// replies, joined by ` | `.
    fn call(&mut self, command: &str) -> String {
        self.send(command);
        (0..command.split(" | ").count())
            .map(|_| self.reply())
            .collect::<Vec<_>>()
            .join(" | ")
    }
}

#[test]
fn blocked_readers_are_woken_and_answered_as_redis_server_answers_them() {
    // Each scenario: setup commands, a blocking read on its own
    // connection, commands of another connection once the reader is
    // blocked, then the reader's answer and what the scenario asks after.
    // Compared byte for byte (only explicit ids are used).
    if !have("redis-server") {
        eprintln!("SKIPPED: redis-server is not installed (apt-get install redis-server)");
        return;
    }
    struct Scenario {
        setup: &'static [&'static str],
        read: &'static str,
        trigger: &'static [&'static str],
        after: &'static [&'static str],
    }
    let scenarios = [
        // Streams nobody named before the read: its reader waits for their
        // making (in the broker, without placing the name), then is served
        // as by any stream.
        Scenario {
            setup: &[],
            read: "XREAD BLOCK 0 STREAMS s $",
            trigger: &["XADD s 1-0 f v"],
            after: &[],
        },
        Scenario {
            setup: &[],
            read: "XREAD BLOCK 0 STREAMS s $",
            trigger: &["XADD s MAXLEN 0 1-0 f v"],
            after: &[],
        },
        Scenario {
            setup: &[],
            read: "XREAD BLOCK 300 STREAMS s $",
            trigger: &["MULTI", "XADD s 1-0 f v", "DEL s", "EXEC"],
            after: &["EXISTS s"],
        },
        Scenario {
            setup: &[],
            read: "XREAD BLOCK 0 STREAMS s t $ $",
            trigger: &[
                "XGROUP CREATE t g $ MKSTREAM",
                "XADD t 1-0 f v",
                "XADD s 2-0 f v",
            ],
            after: &[],
        },
        Scenario {
            setup: &[],
            read: "XREAD BLOCK 0 STREAMS s s 0 0",
            trigger: &["XADD s 1-0 a 1 | XADD s 2-0 b 2"],
            after: &[],
        },
        // The reader's group destroyed, its stream deleted.
        Scenario {
            setup: &["XGROUP CREATE s g $ MKSTREAM"],
            read: "XREADGROUP GROUP g c BLOCK 0 STREAMS s >",
            trigger: &["XGROUP DESTROY s g"],
            after: &["XINFO GROUPS s"],
        },
        Scenario {
            setup: &["XGROUP CREATE s g $ MKSTREAM"],
            read: "XREADGROUP GROUP g c BLOCK 0 STREAMS s >",
            trigger: &["DEL s"],
            after: &["EXISTS s"],
        },
        Scenario {
            setup: &[
                "XGROUP CREATE s g $ MKSTREAM",
                "XGROUP CREATE t g $ MKSTREAM",
            ],
            read: "XREADGROUP GROUP g c BLOCK 0 STREAMS s t > >",
            trigger: &["XGROUP DESTROY t g"],
            after: &[],
        },
        // The group destroyed and made again before the reader is served:
        // it finds a group, and nothing new for it.
        Scenario {
            setup: &["XGROUP CREATE s g $ MKSTREAM"],
            read: "XREADGROUP GROUP g c BLOCK 300 STREAMS s >",
            trigger: &["MULTI", "XGROUP DESTROY s g", "XGROUP CREATE s g $", "EXEC"],
            after: &[],
        },
        // An entry added and trimmed at once still answers the readers,
        // with no entry (and the group's reader becomes a consumer).
        Scenario {
            setup: &["XGROUP CREATE s g $ MKSTREAM"],
            read: "XREADGROUP GROUP g c BLOCK 0 STREAMS s >",
            trigger: &["XADD s MAXLEN 0 2-0 f v"],
            after: &["XINFO GROUPS s"],
        },
        Scenario {
            setup: &["XADD s 1-0 f v"],
            read: "XREAD BLOCK 0 STREAMS s $",
            trigger: &["XADD s MAXLEN 0 2-0 f v"],
            after: &[],
        },
        Scenario {
            setup: &["XADD s 1-0 f v"],
            read: "XREAD BLOCK 0 STREAMS s $",
            trigger: &["MULTI", "XADD s 2-0 f v", "XDEL s 2-0", "EXEC"],
            after: &[],
        },
        // What does not answer a reader: a deleted stream (plain XREAD),
        // a raised last id, a trim.
        Scenario {
            setup: &["XADD s 1-0 f v"],
            read: "XREAD BLOCK 300 STREAMS s $",
            trigger: &["DEL s"],
            after: &[],
        },
        Scenario {
            setup: &["XADD s 1-0 f v"],
            read: "XREAD BLOCK 300 STREAMS s $",
            trigger: &["XSETID s 20-0"],
            after: &[],
        },
        Scenario {
            setup: &["XADD s 1-0 f v", "XGROUP CREATE s g $"],
            read: "XREADGROUP GROUP g c BLOCK 300 STREAMS s >",
            trigger: &["XTRIM s MAXLEN 0", "XSETID s 30-0"],
            after: &["XINFO GROUPS s"],
        },
        // A stream deleted and made again past the reader's id serves it.
        Scenario {
            setup: &["XADD s 1-0 f v"],
            read: "XREAD BLOCK 0 STREAMS s 5-0",
            trigger: &["DEL s", "XADD s 9-0 f v"],
            after: &[],
        },
        // Pipelined commands (one write): Redis serves blocked readers
        // after each command, so a reader gets what the first command
        // that signalled left, not what the whole pipeline did.
        Scenario {
            setup: &["XADD s 1-0 f v"],
            read: "XREAD BLOCK 0 STREAMS s $",
            trigger: &["XADD s 2-0 a 1 | XADD s 3-0 b 2 | XADD s 4-0 c 3"],
            after: &[],
        },
        Scenario {
            setup: &["XADD s 1-0 f v"],
            read: "XREAD BLOCK 0 STREAMS s $",
            trigger: &["XADD s 2-0 a 1 | XDEL s 2-0"],
            after: &[],
        },
        Scenario {
            setup: &["XGROUP CREATE s g $ MKSTREAM"],
            read: "XREADGROUP GROUP g c BLOCK 0 STREAMS s >",
            trigger: &["XADD s 2-0 a 1 | XADD s 3-0 b 2 | XACK s g 2-0"],
            after: &["XPENDING s g", "XINFO GROUPS s"],
        },
        Scenario {
            setup: &["XGROUP CREATE s g $ MKSTREAM"],
            read: "XREADGROUP GROUP g c BLOCK 0 NOACK STREAMS s >",
            trigger: &["XADD s 2-0 a 1 | XDEL s 2-0 | XADD s 3-0 b 2"],
            after: &["XPENDING s g", "XINFO GROUPS s"],
        },
        Scenario {
            setup: &["XGROUP CREATE s g $ MKSTREAM"],
            read: "XREADGROUP GROUP g c COUNT 1 BLOCK 0 STREAMS s >",
            trigger: &["XADD s 2-0 a 1 | XGROUP DESTROY s g"],
            after: &["XINFO GROUPS s"],
        },
        // Over two streams: the first that signals serves the reader.
        Scenario {
            setup: &["XADD s 1-0 f v", "XADD t 1-0 f v"],
            read: "XREAD BLOCK 0 STREAMS s t $ $",
            trigger: &["XADD t 2-0 a 1 | XADD s 2-0 b 2 | XADD t 3-0 c 3"],
            after: &[],
        },
    ];
    let dir = TempDir::new();
    let redis = RedisServer::start(&dir.0.join("redis"));
    let broker = Broker::start(broker_config(dir.0.join("broker"))).expect("start the broker");
    // Scenario `i`'s streams are `s<i>` and `t<i>` (the broker has no
    // FLUSHALL).
    let play = |port: u16, i: usize, s: &Scenario| -> Vec<String> {
        let named = |c: &str| -> String {
            c.split(' ')
                .map(|w| match w {
                    "s" | "t" => format!("{w}{i}"),
                    _ => w.to_owned(),
                })
                .collect::<Vec<_>>()
                .join(" ")
        };
        let mut other = Raw::connect(port);
        let mut out = Vec::new();
        for c in s.setup {
            out.push(other.call(&named(c)));
        }
        let mut reader = Raw::connect(port);
        reader.send(&named(s.read));
        let deadline = Instant::now() + Duration::from_secs(5);
        while !other.call("INFO clients").contains("blocked_clients:1") {
            assert!(Instant::now() < deadline, "{}: never blocked", s.read);
            std::thread::sleep(Duration::from_millis(5));
        }
        for c in s.trigger {
            out.push(other.call(&named(c)));
        }
        out.push(format!("reader: {}", reader.reply()));
        for c in s.after {
            out.push(other.call(&named(c)));
        }
        out
    };
    let mut failures = Vec::new();
    for (i, s) in scenarios.iter().enumerate() {
        let want = play(redis.port, i, s);
        let got = play(broker.local_addr().port(), i, s);
        if want != got {
            failures.push(format!(
                "scenario {i} ({}):\n--- redis-server:\n{want:#?}\n--- broker:\n{got:#?}",
                s.read
            ));
        }
    }
    broker.shutdown();
    assert_no_failures(&failures, "blocked readers");
}

#[test]
fn unknown_commands_and_subcommands_echo_the_client_s_bytes_as_redis_server_does() {
    // Bytes that are not UTF-8 come back as they were sent (not as
    // replacement characters), cut where Redis cuts them, also when a
    // transaction is refused for them.
    if !have("redis-server") {
        eprintln!("SKIPPED: redis-server is not installed (apt-get install redis-server)");
        return;
    }
    let dir = TempDir::new();
    let redis = RedisServer::start(&dir.0.join("redis"));
    let broker = Broker::start(broker_config(dir.0.join("broker"))).expect("start the broker");
    let long = [b'\xe9'; 200];
    let cases: Vec<Vec<&[u8]>> = vec![
        vec![b"FO\xffO", b"a\xfe", b"\xc3\x28"],
        vec![b"\xff", &long],
        vec![&long, b"x"],
        vec![b"CLIENT", b"x\xffy"],
        vec![b"CONFIG", &long],
        vec![b"COMMAND", b"\x80"],
        vec![b"XGROUP", b"\xfe\xff", b"k", b"g"],
        vec![b"XINFO", b"\xfe", b"k"],
        vec![b"XPENDING", b"k\xff", b"g\xfe"],
        vec![b"HELLO", b"3", b"\xffopt"],
        vec![b"XADD", b"kx", b"1-0", b"f", b"v"],
        vec![b"XGROUP", b"CREATE", b"kx", b"g", b"0"],
        vec![b"XCLAIM", b"kx", b"g", b"c", b"0", b"1-0", b"\xffbad"],
        vec![
            b"XREADGROUP",
            b"GROUP",
            b"g\xfe",
            b"c",
            b"STREAMS",
            b"k\xff",
            b">",
        ],
    ];
    let mut failures = Vec::new();
    for (i, args) in cases.iter().enumerate() {
        // Alone, then queued in a transaction (refused at EXEC).
        let alone = common::encode(args);
        let queued = [
            common::encode(&[b"MULTI"]),
            common::encode(args),
            common::encode(&[b"EXEC"]),
        ]
        .concat();
        for (how, input) in [("alone", alone), ("in MULTI", queued)] {
            let input = [input, common::encode(&[b"QUIT"])].concat();
            let want = exchange(redis.port, &input);
            let got = exchange(broker.local_addr().port(), &input);
            if want != got {
                failures.push(format!(
                    "case {i} {how}:\n--- redis-server:\n{}\n--- broker:\n{}",
                    want.escape_ascii(),
                    got.escape_ascii()
                ));
            }
        }
    }
    broker.shutdown();
    assert_no_failures(&failures, "bytes in error texts");
}
