//! PROXY protocol listeners over real sockets: HAProxy (`send-proxy` and
//! `send-proxy-v2`) in front of a session server, plain and TLS, so the
//! session sees the client's own address; keys and per-key limits by that
//! address; headers that are malformed, late or cut closing only their
//! connection with a counted reason. The HAProxy cases skip with a printed
//! reason when it is not installed (`.ci/run` installs it).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use mailring_transports::codec::LengthDelimited;
use mailring_transports::rustls;
use mailring_transports::tls::{self, TlsAcceptor};
use mailring_transports::{
    CloseKind, CloseReason, Route, Server, ServerConfig, Session, SessionCtx,
};

mod common;
use common::{client, frame, read_frame, wait_for};

fn runtime() -> mailring::Runtime {
    mailring::Runtime::builder()
        .shards(2)
        .build()
        .expect("io_uring available")
}

/// Keyed by the client's IP address; answers each frame with
/// `"<peer> v<version>"` (`where` with the local address).
struct WhoAmI;

impl Session for WhoAmI {
    type Codec = LengthDelimited;
    type Key = String;

    fn route(&mut self, _frame: &Bytes, cx: &SessionCtx<Self>) -> Route<String> {
        match (cx.key(), cx.peer_addr()) {
            (None, Some(peer)) => Route::Key(peer.ip().to_string()),
            _ => Route::NotYet,
        }
    }

    fn refusal(&mut self, _reason: &CloseReason) -> Option<Bytes> {
        Some(Bytes::from_static(b"-ERR max number of clients reached"))
    }

    async fn on_frame(&mut self, frame: Bytes, cx: &mut SessionCtx<Self>) {
        if frame.as_ref() == b"where" {
            // The address the client connected to.
            let local = cx.local_addr().map_or("-".to_owned(), |a| a.to_string());
            return cx.send_frame(Bytes::from(local));
        }
        let version = cx.proxy_header().map_or(0, |h| h.version);
        let peer = cx.peer_addr().map_or("-".to_owned(), |p| p.to_string());
        cx.send_frame(Bytes::from(format!("{peer} v{version}")));
    }
}

fn proxy_config() -> ServerConfig {
    let mut config = ServerConfig::default();
    config.proxy_protocol = true;
    config.proxy_header_timeout = Duration::from_millis(300);
    config
}

/// A loopback port nobody listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// HAProxy in TCP mode in the foreground: port `v1` forwards with
/// `send-proxy`, port `v2` with `send-proxy-v2`, both to `backend`.
struct Haproxy {
    child: Child,
    dir: std::path::PathBuf,
}

impl Haproxy {
    fn start(backend: SocketAddr, v1: u16, v2: u16) -> Option<Haproxy> {
        if Command::new("haproxy").arg("-v").output().is_err() {
            eprintln!("SKIPPED: haproxy is not installed (apt-get install haproxy)");
            return None;
        }
        let dir =
            std::env::temp_dir().join(format!("mailring-haproxy-{}-{v1}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = dir.join("haproxy.cfg");
        std::fs::write(
            &cfg,
            format!(
                "global\n  maxconn 200\ndefaults\n  mode tcp\n  timeout connect 2s\n  timeout client 10s\n  timeout server 10s\n\
                 frontend v1\n  bind 127.0.0.1:{v1}\n  default_backend b1\n\
                 backend b1\n  server s 127.0.0.1:{port} send-proxy\n\
                 frontend v2\n  bind 127.0.0.1:{v2}\n  default_backend b2\n\
                 backend b2\n  server s 127.0.0.1:{port} send-proxy-v2\n",
                port = backend.port()
            ),
        )
        .unwrap();
        let child = Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&cfg)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start haproxy");
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", v2)).is_err() {
            assert!(Instant::now() < deadline, "haproxy did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(Haproxy { child, dir })
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn behind_haproxy_the_session_sees_the_clients_own_address() {
    let rt = runtime();
    let server = Server::builder(LengthDelimited::new(), |_| WhoAmI)
        .config(proxy_config())
        .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
        .unwrap();
    let (v1, v2) = (free_port(), free_port());
    let Some(_haproxy) = Haproxy::start(server.local_addr(), v1, v2) else {
        return;
    };
    for (port, version) in [(v1, 1), (v2, 2), (v1, 1), (v2, 2)] {
        let mut c = client(SocketAddr::from(([127, 0, 0, 1], port)));
        let me = c.local_addr().unwrap();
        for _ in 0..2 {
            c.write_all(&frame(b"who")).unwrap();
            let reply = String::from_utf8(read_frame(&mut c).unwrap()).unwrap();
            assert_eq!(reply, format!("{me} v{version}"));
        }
    }
    wait_for(&server, "8 frames", |s| s.total(|s| s.frames_in) == 8);
    assert_eq!(server.stats().closed(CloseKind::ProxyHeader), 0);
    rt.block_on(server.shutdown());
}

#[test]
fn tls_behind_haproxy_keeps_the_clients_address() {
    let dir = std::env::temp_dir().join(format!("mailring-proxy-tls-{}", std::process::id()));
    common::self_signed_localhost(&dir);
    let rt = runtime();
    let server = Server::builder(LengthDelimited::new(), |_| WhoAmI)
        .config(proxy_config())
        .tls(TlsAcceptor::from_pem_files(dir.join("cert.pem"), dir.join("key.pem")).unwrap())
        .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
        .unwrap();
    let (v1, v2) = (free_port(), free_port());
    let Some(_haproxy) = Haproxy::start(server.local_addr(), v1, v2) else {
        let _ = std::fs::remove_dir_all(&dir);
        return;
    };
    let config = Arc::new(tls::client_config_from_ca_pem_file(dir.join("cert.pem")).unwrap());
    for (port, version) in [(v1, 1), (v2, 2)] {
        // The TLS bytes pass through HAProxy; the header comes first.
        let sock = client(SocketAddr::from(([127, 0, 0, 1], port)));
        let me = sock.local_addr().unwrap();
        let conn = rustls::ClientConnection::new(
            config.clone(),
            rustls::pki_types::ServerName::try_from("localhost").unwrap(),
        )
        .unwrap();
        let mut tls = rustls::StreamOwned::new(conn, sock);
        tls.write_all(&frame(b"who")).unwrap();
        let reply = String::from_utf8(read_frame(&mut tls).unwrap()).unwrap();
        assert_eq!(reply, format!("{me} v{version}"));
    }
    assert_eq!(server.stats().total(|s| s.tls_handshakes), 2);
    rt.block_on(server.shutdown());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A v2 PROXY header claiming `source` (to 127.0.0.1:1).
fn v2_header(source: SocketAddr) -> Vec<u8> {
    let SocketAddr::V4(src) = source else {
        panic!("IPv4")
    };
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    h.extend_from_slice(&[0x21, 0x11, 0, 12]);
    h.extend_from_slice(&src.ip().octets());
    h.extend_from_slice(&[127, 0, 0, 1]);
    h.extend_from_slice(&src.port().to_be_bytes());
    h.extend_from_slice(&1u16.to_be_bytes());
    h
}

#[test]
fn keys_limits_and_bad_headers_go_by_the_proxied_address() {
    let rt = runtime();
    let mut config = proxy_config();
    config.max_per_key = Some(1);
    let server = Server::builder(LengthDelimited::new(), |_| WhoAmI)
        .config(config)
        .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
        .unwrap();
    let addr = server.local_addr();
    // A header and a frame in one write: the frame is read after it.
    let mut a = client(addr);
    let mut first = v2_header("192.0.2.7:4000".parse().unwrap());
    first.extend_from_slice(&frame(b"who"));
    a.write_all(&first).unwrap();
    assert_eq!(read_frame(&mut a).unwrap(), b"192.0.2.7:4000 v2");
    // The same client address again: past the per-key limit of 1.
    let mut b = client(addr);
    let mut second = v2_header("192.0.2.7:4001".parse().unwrap());
    second.extend_from_slice(&frame(b"who"));
    b.write_all(&second).unwrap();
    assert_eq!(
        read_frame(&mut b).unwrap(),
        b"-ERR max number of clients reached"
    );
    // Another address is its own key.
    let mut c = client(addr);
    c.write_all(b"PROXY TCP4 192.0.2.8 127.0.0.1 5000 1\r\n")
        .unwrap();
    c.write_all(&frame(b"who")).unwrap();
    assert_eq!(read_frame(&mut c).unwrap(), b"192.0.2.8:5000 v1");
    // Its local address: the destination the header names.
    c.write_all(&frame(b"where")).unwrap();
    assert_eq!(read_frame(&mut c).unwrap(), b"127.0.0.1:1");

    // Bad headers, each closed alone while the good clients go on.
    let mut garbage = client(addr);
    garbage.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let mut cut = client(addr);
    cut.write_all(b"PROXY TCP4 192.0.2.9 127.0.0.1 50").unwrap();
    cut.shutdown(std::net::Shutdown::Write).unwrap();
    let mut long = client(addr);
    long.write_all(&[b"PROXY ".as_slice(), &[b'1'; 150]].concat())
        .unwrap();
    let silent = client(addr);
    for bad in [&mut garbage, &mut cut, &mut long] {
        let mut rest = Vec::new();
        let _ = bad.read_to_end(&mut rest);
        assert!(rest.is_empty(), "nothing written back: {rest:?}");
    }
    wait_for(&server, "four refused headers", |s| {
        s.closed(CloseKind::ProxyHeader) == 4
    });
    drop(silent);
    for (c, expect) in [
        (&mut a, &b"192.0.2.7:4000 v2"[..]),
        (&mut c, &b"192.0.2.8:5000 v1"[..]),
    ] {
        c.write_all(&frame(b"who")).unwrap();
        assert_eq!(read_frame(c).unwrap(), expect);
    }
    assert_eq!(server.stats().closed(CloseKind::KeyLimit), 1);
    rt.block_on(server.shutdown());
}

#[test]
fn a_refusal_under_way_takes_no_place_past_the_client_limit() {
    // With PROXY headers, a connection accepted past `max_clients` waits
    // for its header before it is refused: meanwhile a place freed must go
    // to the next client, not to the refusal.
    let rt = runtime();
    let mut config = proxy_config();
    config.max_clients = Some(1);
    // The stalled refusal waits longer than the test does.
    config.proxy_header_timeout = Duration::from_secs(30);
    let server = Server::builder(LengthDelimited::new(), |_| WhoAmI)
        .config(config)
        .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
        .unwrap();
    let addr = server.local_addr();
    let served = |source: &str| {
        let mut c = client(addr);
        let mut first = v2_header(source.parse().unwrap());
        first.extend_from_slice(&frame(b"who"));
        c.write_all(&first).unwrap();
        (read_frame(&mut c).unwrap(), c)
    };
    let (reply, a) = served("192.0.2.7:4000");
    assert_eq!(reply, b"192.0.2.7:4000 v2");
    // Past the limit, and stalled: no header yet.
    let _stalled = client(addr);
    std::thread::sleep(std::time::Duration::from_millis(50));
    drop(a);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (reply, _c) = served("192.0.2.8:5000");
        if reply == b"192.0.2.8:5000 v2" {
            break;
        }
        assert_eq!(reply, b"-ERR max number of clients reached");
        assert!(
            std::time::Instant::now() < deadline,
            "the stalled refusal keeps the place"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    rt.block_on(server.shutdown());
    rt.shutdown();
}
