//! Real clients against the broker: redis-py's stream API and pipelines
//! (`tests/clients/redis_py.py`), and `redis-benchmark -e` runs whose
//! every `XADD` must land (redis-benchmark counts `-ERR` replies as done,
//! so the streams' total length is checked against `-n`). Each skips with
//! a printed reason when its tool is missing (`.ci/run` installs them).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Command;

use mailring_broker::{Broker, BrokerConfig};

mod common;
use common::{encode, TempDir};

fn start(dir: &TempDir) -> Broker {
    let mut config = BrokerConfig {
        addr: "127.0.0.1:0".parse().unwrap(),
        ..BrokerConfig::default()
    };
    config.store.dir = dir.0.clone();
    Broker::start(config).expect("start the broker")
}

/// One integer reply.
fn int_reply(r: &mut BufReader<TcpStream>) -> i64 {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    line.trim_end()
        .strip_prefix(':')
        .unwrap_or_else(|| panic!("not an integer: {line:?}"))
        .parse()
        .unwrap()
}

/// The names of a `KEYS` reply.
fn keys(r: &mut BufReader<TcpStream>) -> Vec<String> {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let n: usize = line.trim_end()[1..].parse().unwrap();
    (0..n)
        .map(|_| {
            let mut len = String::new();
            r.read_line(&mut len).unwrap();
            let l: usize = len.trim_end()[1..].parse().unwrap();
            let mut buf = vec![0u8; l + 2];
            r.read_exact(&mut buf).unwrap();
            buf.truncate(l);
            String::from_utf8(buf).unwrap()
        })
        .collect()
}

#[test]
fn redis_py_drives_streams_groups_and_pipelines() {
    let have = Command::new("python3")
        .args(["-c", "import redis"])
        .status()
        .is_ok_and(|s| s.success());
    if !have {
        eprintln!("SKIPPED: python3 with redis-py is not installed (pip install redis==5.0.8)");
        return;
    }
    let dir = TempDir::new();
    let broker = start(&dir);
    let out = Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/clients/redis_py.py"
        ))
        .arg("127.0.0.1")
        .arg(broker.local_addr().port().to_string())
        .output()
        .expect("run python3");
    broker.shutdown();
    assert!(
        out.status.success(),
        "redis-py failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn redis_benchmark_xadd_runs_land_every_entry() {
    if Command::new("redis-benchmark")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("SKIPPED: redis-benchmark is not installed (apt-get install redis-tools)");
        return;
    }
    let dir = TempDir::new();
    let broker = start(&dir);
    let port = broker.local_addr().port().to_string();
    // A multiple of clients × pipeline depth: redis-benchmark sends whole
    // pipelines, so with -P it overshoots any other -n (real Redis too).
    let n = 3200;
    for (args, pattern) in [
        (vec!["XADD", "bench", "*", "f", "v"], "bench"),
        (
            vec!["-r", "100", "XADD", "bench:__rand_int__", "*", "f", "v"],
            "bench:*",
        ),
        (vec!["-P", "16", "XADD", "piped", "*", "f", "v"], "piped"),
    ] {
        let out = Command::new("redis-benchmark")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-n",
                &n.to_string(),
                "-c",
                "20",
                "-q",
                "-e",
            ])
            .args(&args)
            .output()
            .expect("run redis-benchmark");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{text}");
        assert!(
            !text
                .lines()
                .any(|l| l.contains("Error from server") || l.trim_start().starts_with("ERR")),
            "redis-benchmark saw errors:\n{text}"
        );
        let s = TcpStream::connect(broker.local_addr()).unwrap();
        let mut w = s.try_clone().unwrap();
        let mut r = BufReader::new(s);
        w.write_all(&encode(&[b"KEYS", pattern.as_bytes()]))
            .unwrap();
        let names = keys(&mut r);
        let mut total = 0;
        for k in &names {
            w.write_all(&encode(&[b"XLEN", k.as_bytes()])).unwrap();
            total += int_reply(&mut r);
        }
        if pattern == "bench:*" {
            assert!(
                names.len() > 50,
                "keys spread over many streams: {}",
                names.len()
            );
        }
        assert_eq!(total, n, "entries landed for {args:?}");
    }
    broker.shutdown();
}

/// `redis-cli` run against `port` with `args`, its standard output (`None`
/// when it cannot run).
fn redis_cli(port: u16, args: &[&str]) -> Option<String> {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .ok()?;
    assert!(out.status.success(), "redis-cli {args:?}: {out:?}");
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn redis_cli_s_operator_modes_read_the_broker() {
    // What operators run against a server: `--bigkeys` (DBSIZE, SCAN,
    // TYPE, XLEN), `--memkeys` (MEMORY USAGE) and `--stat` (INFO's keys, used_memory, clients,
    // total_commands_processed, total_connections_received).
    let dir = TempDir::new();
    let broker = start(&dir);
    let port = broker.local_addr().port();
    let Some(_) = redis_cli(port, &["PING"]) else {
        println!("redis-cli is not installed: skipped (.ci/run installs redis-tools)");
        return;
    };
    for (stream, n) in [("small", 1), ("big", 5), ("mid", 3)] {
        for _ in 0..n {
            redis_cli(port, &["XADD", stream, "*", "f", "v"]).unwrap();
        }
    }
    assert_eq!(redis_cli(port, &["DBSIZE"]).unwrap().trim(), "3");
    let big = redis_cli(port, &["--bigkeys"]).unwrap();
    assert!(
        big.contains("Biggest stream found '\"big\"' has 5 entries")
            || big.contains("Biggest stream found 'big' has 5 entries"),
        "{big}"
    );
    assert!(big.contains("3 streams with 9 entries"), "{big}");
    // `--memkeys`: MEMORY USAGE of each.
    let mem = redis_cli(port, &["--memkeys"]).unwrap();
    assert!(mem.contains("Biggest stream found"), "{mem}");
    assert!(mem.contains("3 streams with"), "{mem}");
    // `--stat` prints a line per interval until stopped (line-buffered
    // through `stdbuf`: into a pipe its output would wait for a full
    // buffer): the header and two rows.
    let mut stat = Command::new("stdbuf")
        .args([
            "-oL",
            "redis-cli",
            "-p",
            &port.to_string(),
            "--stat",
            "-i",
            "0.2",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(stat.stdout.take().unwrap());
    let lines: Vec<String> = (0..4)
        .map(|_| {
            let mut line = String::new();
            out.read_line(&mut line).unwrap();
            line
        })
        .collect();
    stat.kill().unwrap();
    stat.wait().unwrap();
    let row: Vec<&str> = lines[3].split_whitespace().collect();
    // keys, mem, clients, blocked, requests (+delta), connections.
    assert_eq!(row[0], "3", "{lines:?}");
    assert!(row[1].ends_with(['K', 'M', 'G']), "used_memory: {lines:?}");
    assert!(!lines[3].contains("-9223372036854775808"), "{lines:?}");
    let requests: u64 = row[4].parse().expect("total_commands_processed");
    assert!(requests >= 9, "{lines:?}");
    broker.shutdown();
}
