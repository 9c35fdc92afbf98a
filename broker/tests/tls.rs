//! The broker binary on TLS (`--tls-cert`, `--tls-key`), driven by
//! `redis-cli --tls` with certificates made at test time: commands and a
//! pipeline over TLS, a client that trusts another CA refused, a plain-text
//! client closed without disturbing the TLS ones, and bad TLS flags
//! stopping the start. Skips with a printed reason when redis-cli is not
//! installed (`.ci/run` installs it).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

mod common;
use common::TempDir;

/// Writes a CA, and a server certificate for `localhost` and `127.0.0.1`
/// signed by it, under `dir`; returns (ca, cert, key) paths.
fn certificates(dir: &Path, ca_name: &str) -> (PathBuf, PathBuf, PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, ca_name.to_string());
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let paths = (
        dir.join(format!("{ca_name}-ca.pem")),
        dir.join(format!("{ca_name}-cert.pem")),
        dir.join(format!("{ca_name}-key.pem")),
    );
    std::fs::write(&paths.0, ca.pem()).unwrap();
    std::fs::write(&paths.1, cert.pem()).unwrap();
    std::fs::write(&paths.2, key.serialize_pem()).unwrap();
    paths
}

/// The broker binary, killed when dropped.
struct Proc(Child, SocketAddr);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(data: &Path, cert: &Path, key: &Path) -> Proc {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mailring-broker"))
        .args(["--port", "0", "--shards", "2", "--appendfsync", "everysec"])
        .arg("--dir")
        .arg(data)
        .arg("--tls-cert")
        .arg(cert)
        .arg("--tls-key")
        .arg(key)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the broker binary");
    let out = BufReader::new(child.stdout.take().unwrap());
    let addr = out
        .lines()
        .map_while(Result::ok)
        .find_map(|l| {
            l.strip_prefix("mailring broker listening on ")
                .map(|a| a.parse().expect("an address"))
        })
        .expect("the broker printed its address");
    Proc(child, addr)
}

/// `redis-cli --tls` trusting `ca`, with `args` as the command (or the
/// commands of `stdin`, one per line); (success, stdout + stderr).
fn redis_cli(addr: SocketAddr, ca: &Path, args: &[&str], stdin: Option<&str>) -> (bool, String) {
    let mut child = Command::new("redis-cli")
        .args(["--tls", "--sni", "localhost", "--cacert"])
        .arg(ca)
        .args(["-h", "127.0.0.1", "-p", &addr.port().to_string()])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run redis-cli");
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).unwrap();
    }
    drop(input);
    let out = child.wait_with_output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success() && !text.contains("ERR"), text)
}

#[test]
fn redis_cli_drives_the_broker_over_tls_and_bad_clients_close_alone() {
    if Command::new("redis-cli").arg("--version").output().is_err() {
        eprintln!("SKIPPED: redis-cli is not installed (apt-get install redis-tools)");
        return;
    }
    let dir = TempDir::new();
    let (ca, cert, key) = certificates(&dir.0.join("pki"), "good");
    let (other_ca, _, _) = certificates(&dir.0.join("pki"), "other");
    let broker = start(&dir.0.join("data"), &cert, &key);
    let addr = broker.1;

    let (ok, out) = redis_cli(addr, &ca, &["XADD", "s", "1-1", "f", "v"], None);
    assert!(ok, "{out}");
    assert_eq!(out.trim(), "1-1");
    // Several commands down one TLS connection.
    let (ok, out) = redis_cli(
        addr,
        &ca,
        &[],
        Some("XADD s 2-1 g w\nXLEN s\nXRANGE s - + COUNT 1\n"),
    );
    assert!(ok, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines, ["2-1", "2", "1-1", "f", "v"], "{out}");

    // A client that trusts another CA refuses the broker's certificate.
    let (ok, out) = redis_cli(addr, &other_ca, &["PING"], None);
    assert!(!ok && !out.contains("PONG"), "{out}");

    // A plain-text client gets no Redis reply, and is closed.
    let mut plain = TcpStream::connect(addr).unwrap();
    plain
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    plain.write_all(b"PING\r\n").unwrap();
    let mut got = Vec::new();
    let _ = plain.read_to_end(&mut got);
    assert!(!String::from_utf8_lossy(&got).contains("PONG"), "{got:?}");

    // Every entry stayed, and TLS clients are still served.
    let (ok, out) = redis_cli(addr, &ca, &["XLEN", "s"], None);
    assert!(ok, "{out}");
    assert_eq!(out.trim(), "2");
}

#[test]
fn tls_flags_that_do_not_load_stop_the_start() {
    let dir = TempDir::new();
    let (_, cert, key) = certificates(&dir.0.join("pki"), "flags");
    let run = |args: &[&std::ffi::OsStr]| {
        let out = Command::new(env!("CARGO_BIN_EXE_mailring-broker"))
            .args(["--port", "0", "--dir"])
            .arg(dir.0.join("data"))
            .args(args)
            .output()
            .unwrap();
        (
            out.status,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (status, err) = run(&["--tls-cert".as_ref(), cert.as_os_str()]);
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(
        err.contains("--tls-cert and --tls-key go together"),
        "{err}"
    );
    let missing = dir.0.join("pki/missing.pem");
    let (status, err) = run(&[
        "--tls-cert".as_ref(),
        missing.as_os_str(),
        "--tls-key".as_ref(),
        key.as_os_str(),
    ]);
    assert!(!status.success());
    assert!(err.contains("missing.pem"), "{err}");
    // The key given as the certificate: no certificate in it.
    let (status, err) = run(&[
        "--tls-cert".as_ref(),
        key.as_os_str(),
        "--tls-key".as_ref(),
        key.as_os_str(),
    ]);
    assert!(!status.success());
    assert!(err.contains("no certificate"), "{err}");
    assert!(
        !dir.0.join("data").exists(),
        "the data directory is untouched by a start that failed on its TLS files"
    );
}

#[test]
fn sighup_reloads_the_certificate_and_a_bad_file_keeps_the_old_one() {
    if Command::new("redis-cli").arg("--version").output().is_err() {
        eprintln!("SKIPPED: redis-cli is not installed (apt-get install redis-tools)");
        return;
    }
    let dir = TempDir::new();
    let pki = dir.0.join("pki");
    let (good_ca, good_cert, good_key) = certificates(&pki, "good");
    let (next_ca, next_cert, next_key) = certificates(&pki, "next");
    let (cert, key) = (pki.join("live-cert.pem"), pki.join("live-key.pem"));
    std::fs::copy(&good_cert, &cert).unwrap();
    std::fs::copy(&good_key, &key).unwrap();
    let mut broker = start(&dir.0.join("data"), &cert, &key);
    let addr = broker.1;
    let hup = |pid: u32| {
        let ok = Command::new("kill")
            .args(["-HUP", &pid.to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok);
    };
    let pong = |ca: &Path| {
        let (ok, out) = redis_cli(addr, ca, &["PING"], None);
        ok && out.trim() == "PONG"
    };
    assert!(pong(&good_ca));
    // Renewed files, then SIGHUP: new connections get the new certificate.
    std::fs::copy(&next_cert, &cert).unwrap();
    std::fs::copy(&next_key, &key).unwrap();
    hup(broker.0.id());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !pong(&next_ca) {
        assert!(std::time::Instant::now() < deadline, "reloaded on SIGHUP");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!pong(&good_ca), "the old certificate is gone");
    // A file that does not load: the certificate in use stays, the broker
    // serves on.
    std::fs::write(&cert, "not a certificate\n").unwrap();
    hup(broker.0.id());
    std::thread::sleep(Duration::from_millis(200));
    assert!(broker.0.try_wait().unwrap().is_none(), "still running");
    assert!(pong(&next_ca));
}
