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
use common::TempDir;

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
            o.lines()
                .map(|line| {
                    let integers = match s.mask {
                        Mask::Ids => false,
                        Mask::Integers => true,
                        Mask::Idle => line.trim_start().starts_with("3) (integer)"),
                    };
                    mask(line, integers) + "\n"
                })
                .collect()
        })
        .collect()
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
        let name = script.file_name().unwrap().to_string_lossy().into_owned();
        // A fresh server of each kind per script.
        let redis = RedisServer::start(&dir.0.join(format!("redis-{name}")));
        let mut config = BrokerConfig {
            addr: "127.0.0.1:0".parse().unwrap(),
            ..BrokerConfig::default()
        };
        config.store.dir = dir.0.join(format!("broker-{name}"));
        let broker = Broker::start(config).expect("start the broker");
        let want = run(redis.port, &steps, resp3);
        let got = run(broker.local_addr().port(), &steps, resp3);
        broker.shutdown();
        for ((step, w), g) in steps.iter().zip(&want).zip(&got) {
            if w != g {
                failures.push(format!(
                    "{name}: `{}`\n--- redis-server:\n{w}--- broker:\n{g}",
                    step.command
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} differences:\n\n{}",
        failures.len(),
        failures.join("\n")
    );
}
