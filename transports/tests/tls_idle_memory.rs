//! What an idle TLS connection costs the server: live heap bytes per
//! connection (a counting global allocator, in a binary of its own:
//! `harness = false`), with many connections that each made a real
//! handshake and one round trip and then wait. The clients run in a child
//! process (this binary again), so their own TLS state is not counted.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
#[path = "support/counting_alloc.rs"]
mod counting_alloc;

use common::{frame, read_frame, Echo};
use counting_alloc::live;
use mailring_transports::codec::LengthDelimited;
use mailring_transports::tls::{self, TlsAcceptor};
use mailring_transports::{Server, ServerConfig};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

const CONNECTIONS: usize = 200;

/// The most heap an idle TLS echo connection may hold on the server: its
/// task's state and session, its TLS state, a small plaintext buffer and
/// a small ciphertext receive (2 KiB each): about 12.5 KiB. A whole
/// ciphertext chunk (16 KiB) armed on each fails it.
const PER_CONNECTION_MAX: isize = 16 << 10;

const CLIENT_ENV: &str = "MAILRING_TLS_IDLE_CLIENT";

fn main() {
    if let Ok(target) = std::env::var(CLIENT_ENV) {
        return client_process(&target);
    }
    let dir =
        TempDir(std::env::temp_dir().join(format!("mailring-tls-idle-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let (ca_path, cert, key) = pki(&dir.0);

    let rt = mailring::Runtime::builder().shards(2).build().unwrap();
    let server = Server::builder(LengthDelimited::new(), |_| Echo)
        .config(ServerConfig::default())
        .tls(TlsAcceptor::from_pem_files(&cert, &key).unwrap())
        .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
        .unwrap();
    let addr = server.local_addr();
    let settled = |want: usize| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while server.live_connections() != want {
            assert!(Instant::now() < deadline, "connections did not settle");
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(200));
        live()
    };
    // One warm connection first: the shards' one-time allocations go
    // before the count.
    let mut warm = spawn_clients(&format!("{addr} 1 {}", ca_path.display()));
    let before = settled(1);
    let mut clients = spawn_clients(&format!("{addr} {CONNECTIONS} {}", ca_path.display()));
    let during = settled(CONNECTIONS + 1);
    let per_connection = (during - before) / CONNECTIONS as isize;
    println!(
        "tls idle memory: {per_connection} B of heap per idle TLS connection ({CONNECTIONS} connections)"
    );
    // They close (the child exits once its input ends): all of it goes.
    drop(clients.stdin.take());
    clients.wait().unwrap();
    let after = settled(1);
    println!(
        "tls idle memory: {:+} B against before, once they closed",
        after - before
    );
    drop(warm.stdin.take());
    warm.wait().unwrap();
    rt.block_on(server.shutdown());
    rt.shutdown();
    assert!(
        per_connection < PER_CONNECTION_MAX,
        "an idle TLS connection holds {per_connection} B, more than {PER_CONNECTION_MAX} B"
    );
    // What stays is rustls's resumption cache (256 sessions at most, a
    // few hundred bytes each), not the connections (12 KiB each).
    assert!(
        after - before < 256 << 10,
        "{} B stay after the connections closed",
        after - before
    );
    println!("tls idle memory: 1 test passed");
}

/// A directory removed at drop, a failed assertion's unwind included.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A CA and a `localhost` certificate it signs: (CA file, cert, key).
fn pki(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "mailring idle test CA");
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    let key = KeyPair::generate().unwrap();
    let leaf = params.signed_by(&key, &ca).unwrap();
    let write = |name: &str, pem: &str| {
        let path = dir.join(name);
        std::fs::write(&path, pem).unwrap();
        path
    };
    (
        write("ca.pem", &ca.pem()),
        write("cert.pem", &leaf.pem()),
        write("key.pem", &key.serialize_pem()),
    )
}

/// Starts this binary as a client process for `target` (`addr count ca`)
/// and waits until its connections made their round trips.
fn spawn_clients(target: &str) -> std::process::Child {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .env(CLIENT_ENV, target)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready", "the client process");
    child
}

/// The child: `count` TLS connections (rustls's own client), each with one
/// round trip; then "ready", and it holds them until its input ends.
fn client_process(target: &str) {
    let mut parts = target.split(' ');
    let addr: std::net::SocketAddr = parts.next().unwrap().parse().unwrap();
    let count: usize = parts.next().unwrap().parse().unwrap();
    let ca = parts.next().unwrap();
    let config = Arc::new(tls::client_config_from_ca_pem_file(ca).unwrap());
    let mut held = Vec::with_capacity(count);
    for i in 0..count {
        let conn = rustls::ClientConnection::new(
            config.clone(),
            rustls::pki_types::ServerName::try_from("localhost").unwrap(),
        )
        .unwrap();
        let sock = TcpStream::connect(addr).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut stream = rustls::StreamOwned::new(conn, sock);
        let body = format!("hello {i}");
        stream.write_all(&frame(body.as_bytes())).unwrap();
        stream.flush().unwrap();
        assert_eq!(read_frame(&mut stream).unwrap(), body.as_bytes());
        held.push(stream);
    }
    println!("ready");
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);
    drop(held);
}
