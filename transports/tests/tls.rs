//! TLS sessions over real loopback sockets and real rustls handshakes with
//! certificates made at test time: SNI routing to the tenant's shard (the
//! TLS state moves with the connection), ALPN, large frames, failed
//! handshakes (another CA, an expired certificate, bytes that are no TLS, a
//! silent client, a client that hangs up) each closing only their
//! connection with a counted reason, certificate reload, and shutdown while
//! a handshake waits.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use mailring_actors::ShardId;
use mailring_transports::codec::LengthDelimited;
use mailring_transports::rustls;
use mailring_transports::tls::{self, TlsAcceptor, TlsError, TlsFailure};
use mailring_transports::{
    CloseKind, CloseReason, Framed, ListenMode, Route, Server, ServerConfig, Session, SessionCtx,
};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

mod common;
use common::{connect_steered_to, frame, read_frame, wait_for, Echo};

fn runtime(shards: usize) -> mailring::Runtime {
    mailring::Runtime::builder()
        .shards(shards)
        .build()
        .expect("io_uring available")
}

/// A directory of PEM files for one test, removed at drop.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn new(test: &str) -> Pki {
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "mailring-tls-{test}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Pki { dir }
    }

    fn write(&self, name: &str, pem: &str) -> PathBuf {
        let path = self.dir.join(name);
        std::fs::write(&path, pem).unwrap();
        path
    }

    /// A CA; its certificate written to `<name>.pem`.
    fn ca(&self, name: &str) -> (CertifiedIssuer<'static, KeyPair>, PathBuf) {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("mailring test CA {name}"));
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let path = self.write(&format!("{name}.pem"), &ca.pem());
        (ca, path)
    }

    /// A server certificate for `names` signed by `ca` (expired in 2020
    /// when `expired`); returns the certificate and key files.
    fn leaf(
        &self,
        ca: &CertifiedIssuer<'static, KeyPair>,
        file: &str,
        names: &[&str],
        expired: bool,
    ) -> (PathBuf, PathBuf) {
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, names[0].to_string());
        if expired {
            params.not_before = rcgen::date_time_ymd(2019, 1, 1);
            params.not_after = rcgen::date_time_ymd(2020, 1, 1);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, ca).unwrap();
        (
            self.write(&format!("{file}-cert.pem"), &cert.pem()),
            self.write(&format!("{file}-key.pem"), &key.serialize_pem()),
        )
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A blocking rustls client (its own stack, not ours) that trusts `ca`.
fn tls_client(
    addr: SocketAddr,
    ca: &Path,
    server_name: &str,
    alpn: &[&[u8]],
) -> std::io::Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
    let mut config = tls::client_config_from_ca_pem_file(ca).unwrap();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let conn = rustls::ClientConnection::new(
        Arc::new(config),
        rustls::pki_types::ServerName::try_from(server_name.to_owned()).unwrap(),
    )
    .unwrap();
    let sock = TcpStream::connect(addr)?;
    sock.set_read_timeout(Some(Duration::from_secs(10)))?;
    sock.set_nodelay(true)?;
    let mut stream = rustls::StreamOwned::new(conn, sock);
    // The handshake, now (rustls would run it at the first read or write).
    while stream.conn.is_handshaking() {
        stream.conn.complete_io(&mut stream.sock)?;
    }
    Ok(stream)
}

/// An echo server of length-delimited frames over TLS on loopback.
fn echo_server(rt: &mailring::Runtime, acceptor: TlsAcceptor) -> Server<Echo> {
    Server::builder(LengthDelimited::new(), |_| Echo)
        .tls(acceptor)
        .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
        .unwrap()
}

fn round_trip(c: &mut (impl Read + Write), body: &[u8]) -> Vec<u8> {
    c.write_all(&frame(body)).unwrap();
    c.flush().unwrap();
    read_frame(c).unwrap()
}

/// Keys its connection by the TLS server name (SNI) at the first frame;
/// answers `"<shard> <sni> <alpn> <frame>"` from the key's shard.
struct SniSession;

impl Session for SniSession {
    type Codec = LengthDelimited;
    type Key = String;

    fn route(&mut self, _frame: &Bytes, cx: &SessionCtx<Self>) -> Route<String> {
        match cx.tls().and_then(|t| t.server_name.clone()) {
            Some(name) if cx.key().is_none() => Route::Key(name),
            _ => Route::NotYet,
        }
    }

    async fn on_frame(&mut self, frame: Bytes, cx: &mut SessionCtx<Self>) {
        let tls = cx.tls().expect("a TLS connection").clone();
        assert_eq!(
            mailring::current_shard().map(|s| s.index()),
            Some(cx.shard().index())
        );
        let mut out = format!(
            "{} {} {} ",
            cx.shard().index(),
            tls.server_name.as_deref().unwrap_or("-"),
            String::from_utf8_lossy(tls.alpn.as_deref().unwrap_or(b"-")),
        )
        .into_bytes();
        out.extend_from_slice(&frame);
        cx.send_frame(Bytes::from(out));
    }
}

/// `tenant-<n>.test` lives on shard `n % shards`.
fn by_tenant_number(key: &str, shards: usize) -> ShardId {
    let n: usize = key
        .trim_start_matches("tenant-")
        .trim_end_matches(".test")
        .parse()
        .unwrap_or(0);
    ShardId::new(n % shards)
}

#[test]
fn tls_sessions_move_to_their_sni_tenants_shard_with_their_tls_state() {
    let pki = Pki::new("sni");
    let (ca, ca_path) = pki.ca("ca");
    let names: Vec<String> = (0..6).map(|t| format!("tenant-{t}.test")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let (cert, key) = pki.leaf(&ca, "server", &names, false);
    let mut config = tls::server_config_from_pem_files(&cert, &key).unwrap();
    config.alpn_protocols = vec![b"mr/1".to_vec()];
    let rt = runtime(2);
    let mut server_config = ServerConfig::default();
    // One acceptor: every tenant of shard 1 moves there after its
    // handshake, rustls state and all.
    server_config.listen = ListenMode::SingleAcceptor(ShardId::new(0));
    let server = Server::builder(LengthDelimited::new(), |_| SniSession)
        .config(server_config)
        .placement(|key: &String, n| by_tenant_number(key, n))
        .tls(TlsAcceptor::new(config))
        .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
        .unwrap();
    let mut clients = Vec::new();
    for t in 0..6 {
        let sni = format!("tenant-{t}.test");
        let mut c = tls_client(server.local_addr(), &ca_path, &sni, &[b"mr/1"]).unwrap();
        assert_eq!(c.conn.alpn_protocol(), Some(&b"mr/1"[..]));
        // Several frames in one write: the bytes after the first travel
        // (decrypted or not) with the connection.
        let burst: Vec<u8> = (0..3)
            .flat_map(|i| frame(format!("req {i}").as_bytes()))
            .collect();
        c.write_all(&burst).unwrap();
        for i in 0..3 {
            let expect = format!("{} {sni} mr/1 req {i}", t % 2);
            assert_eq!(read_frame(&mut c).unwrap(), expect.as_bytes());
        }
        clients.push((c, t, sni));
    }
    // Later traffic, with a frame larger than a TLS record both ways.
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    for (c, t, sni) in &mut clients {
        let reply = round_trip(c, &big);
        let prefix = format!("{} {sni} mr/1 ", *t % 2);
        assert_eq!(&reply[..prefix.len()], prefix.as_bytes());
        assert_eq!(&reply[prefix.len()..], &big[..]);
    }
    let stats = server.stats();
    assert_eq!(stats.total(|s| s.tls_handshakes), 6);
    assert_eq!(stats.shards[0].tls_handshakes, 6, "all on the acceptor");
    assert_eq!(stats.total(|s| s.handed_off), 3, "tenants 1, 3, 5 moved");
    assert_eq!(stats.total(|s| s.io_off_owner), 0);
    // A clean TLS close (close_notify, then FIN) is a peer close.
    for (mut c, _, _) in clients {
        c.conn.send_close_notify();
        c.conn.complete_io(&mut c.sock).unwrap();
        c.sock.shutdown(std::net::Shutdown::Write).unwrap();
    }
    wait_for(&server, "6 peer closes", |s| {
        s.closed(CloseKind::PeerClosed) == 6
    });
    rt.block_on(server.shutdown());
}

/// Records the reasons its connections closed with.
#[derive(Clone, Default)]
struct Reasons(Arc<std::sync::Mutex<Vec<CloseReason>>>);

struct RecordingEcho(Reasons);

impl Session for RecordingEcho {
    type Codec = LengthDelimited;
    type Key = ();

    async fn on_frame(&mut self, frame: Bytes, cx: &mut SessionCtx<Self>) {
        cx.send_frame(frame);
    }

    fn on_close(&mut self, reason: &CloseReason, _cx: &mut SessionCtx<Self>) {
        self.0 .0.lock().unwrap().push(reason.clone());
    }
}

#[test]
fn failed_handshakes_close_only_their_connection_with_a_counted_reason() {
    let pki = Pki::new("bad");
    let (ca, ca_path) = pki.ca("ca");
    let (other_ca, other_ca_path) = pki.ca("other");
    let (cert, key) = pki.leaf(&ca, "server", &["localhost"], false);
    let _ = other_ca;
    let rt = runtime(2);
    let reasons = Reasons::default();
    let r = reasons.clone();
    let acceptor = TlsAcceptor::from_pem_files(&cert, &key)
        .unwrap()
        .with_handshake_timeout(Duration::from_millis(300));
    let server = Server::builder(LengthDelimited::new(), move |_| RecordingEcho(r.clone()))
        .tls(acceptor)
        .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
        .unwrap();
    let addr = server.local_addr();
    // A good client, checked between every bad one.
    let mut good = tls_client(addr, &ca_path, "localhost", &[]).unwrap();
    let mut check_good = |n: usize| {
        let body = format!("still served {n}");
        assert_eq!(round_trip(&mut good, body.as_bytes()), body.as_bytes());
    };
    check_good(0);

    // 1. A client that trusts another CA refuses the server's certificate.
    let err = tls_client(addr, &other_ca_path, "localhost", &[])
        .expect_err("untrusted server certificate");
    assert!(err.to_string().contains("UnknownIssuer"), "{err}");
    check_good(1);

    // 2. A name the certificate does not carry.
    let err = tls_client(addr, &ca_path, "elsewhere.test", &[]).expect_err("name mismatch");
    assert!(err.to_string().contains("not valid for name"), "{err}");
    check_good(2);

    // 3. Bytes that are no TLS record, in place of a ClientHello.
    let mut garbage = TcpStream::connect(addr).unwrap();
    garbage
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    garbage
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut rest = Vec::new();
    // The server answers with an alert at most, then closes.
    let _ = garbage.read_to_end(&mut rest);
    assert!(rest.len() < 64, "no more than an alert: {rest:?}");
    check_good(3);

    // 4. A client that connects and says nothing: the handshake timeout.
    let silent = TcpStream::connect(addr).unwrap();
    // 5. A client that hangs up before its handshake.
    drop(TcpStream::connect(addr).unwrap());
    wait_for(&server, "five TLS closes", |s| {
        s.closed(CloseKind::Tls) == 5
    });
    check_good(4);
    drop(silent);

    let got = reasons.0.lock().unwrap().clone();
    let tls_failures: Vec<TlsFailure> = got
        .iter()
        .filter_map(|r| match r {
            CloseReason::Tls(f) => Some(f.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(tls_failures.len(), 5, "{got:?}");
    assert!(
        tls_failures.contains(&TlsFailure::HandshakeTimeout),
        "{got:?}"
    );
    assert!(
        tls_failures.contains(&TlsFailure::PeerClosedInHandshake),
        "{got:?}"
    );
    // The untrusted CA and the wrong name arrive as the client's alerts;
    // the garbage as rustls's refusal of the record.
    let protocol: Vec<&String> = tls_failures
        .iter()
        .filter_map(|f| match f {
            TlsFailure::Protocol(e) => Some(e),
            _ => None,
        })
        .collect();
    assert_eq!(protocol.len(), 3, "{got:?}");
    assert!(protocol.iter().any(|e| e.contains("alert")), "{protocol:?}");
    assert_eq!(
        server.stats().total(|s| s.tls_handshakes),
        1,
        "the good client's only"
    );
    drop(good);
    rt.block_on(server.shutdown());
}

/// Echoes; past the server's client limit it says so, and counts each
/// time it is asked to.
struct CountingRefusals(Arc<AtomicUsize>);

impl Session for CountingRefusals {
    type Codec = LengthDelimited;
    type Key = ();

    async fn on_frame(&mut self, frame: Bytes, cx: &mut SessionCtx<Self>) {
        cx.send_frame(frame);
    }

    fn refusal(&mut self, reason: &CloseReason) -> Option<Bytes> {
        assert_eq!(reason, &CloseReason::ClientLimit);
        self.0.fetch_add(1, Ordering::Relaxed);
        Some(Bytes::from_static(b"-ERR max number of clients reached"))
    }
}

#[test]
fn past_the_client_limit_every_tls_connection_is_refused_even_one_whose_handshake_fails() {
    // A refusal is decided when the connection comes, before its
    // handshake, as Redis counts `rejected_connections` at accept: a
    // refused client that never completes its handshake is refused too.
    let pki = Pki::new("limit");
    let (ca, ca_path) = pki.ca("ca");
    let (cert, key) = pki.leaf(&ca, "server", &["localhost"], false);
    let rt = runtime(2);
    let refusals = Arc::new(AtomicUsize::new(0));
    let counted = refusals.clone();
    let mut config = ServerConfig::default();
    config.max_clients = Some(1);
    let acceptor = TlsAcceptor::from_pem_files(&cert, &key)
        .unwrap()
        .with_handshake_timeout(Duration::from_millis(300));
    let server = Server::builder(LengthDelimited::new(), move |_| {
        CountingRefusals(counted.clone())
    })
    .config(config)
    .tls(acceptor)
    .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
    .unwrap();
    let addr = server.local_addr();
    let mut served = tls_client(addr, &ca_path, "localhost", &[]).unwrap();
    assert_eq!(round_trip(&mut served, b"first"), b"first");

    // A refused client that completes its handshake reads why, sealed.
    let mut told = tls_client(addr, &ca_path, "localhost", &[]).unwrap();
    assert_eq!(
        read_frame(&mut told).unwrap(),
        b"-ERR max number of clients reached"
    );
    // A refused client whose handshake fails: no TLS at all.
    let mut garbage = TcpStream::connect(addr).unwrap();
    garbage
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    garbage.write_all(b"PING\r\n").unwrap();
    let _ = garbage.read_to_end(&mut Vec::new());
    // One that says nothing until the handshake times out.
    let silent = TcpStream::connect(addr).unwrap();
    wait_for(&server, "a refusal and two failed handshakes", |s| {
        s.closed(CloseKind::ClientLimit) == 1 && s.closed(CloseKind::Tls) == 2
    });
    assert_eq!(refusals.load(Ordering::Relaxed), 3, "each refused once");
    drop(silent);
    assert_eq!(round_trip(&mut served, b"still"), b"still");
    drop((served, told));
    rt.block_on(server.shutdown());
}

#[test]
fn an_expired_certificate_is_refused_by_the_client_and_a_reload_replaces_it() {
    let pki = Pki::new("reload");
    let (ca, ca_path) = pki.ca("ca");
    let (old_cert, old_key) = pki.leaf(&ca, "expired", &["localhost"], true);
    let (new_cert, new_key) = pki.leaf(&ca, "fresh", &["localhost"], false);
    let rt = runtime(1);
    let acceptor = TlsAcceptor::from_pem_files(&old_cert, &old_key).unwrap();
    let server = echo_server(&rt, acceptor.clone());
    let addr = server.local_addr();
    let err = tls_client(addr, &ca_path, "localhost", &[]).expect_err("an expired certificate");
    assert!(err.to_string().contains("certificate expired"), "{err}");
    wait_for(&server, "the refused handshake", |s| {
        s.closed(CloseKind::Tls) == 1
    });

    // A reload from files that do not parse keeps the certificate in use.
    let bad = pki.write("bad.pem", "not a certificate\n");
    assert!(matches!(
        acceptor.reload_pem_files(&bad, &new_key),
        Err(TlsError::NoCertificate(_))
    ));
    // A key that belongs to another certificate is refused too.
    assert!(matches!(
        acceptor.reload_pem_files(&new_cert, &old_key),
        Err(TlsError::Rustls(_))
    ));
    assert!(tls_client(addr, &ca_path, "localhost", &[]).is_err());

    acceptor.reload_pem_files(&new_cert, &new_key).unwrap();
    let mut c = tls_client(addr, &ca_path, "localhost", &[]).unwrap();
    assert_eq!(round_trip(&mut c, b"renewed"), b"renewed");
    drop(c);
    rt.block_on(server.shutdown());
}

#[test]
fn a_framed_tls_client_drives_a_tls_server_and_refuses_an_untrusted_one() {
    let pki = Pki::new("framed");
    let (ca, ca_path) = pki.ca("ca");
    let (_other, other_path) = pki.ca("other");
    let (cert, key) = pki.leaf(&ca, "server", &["localhost"], false);
    let mut server_tls = tls::server_config_from_pem_files(&cert, &key).unwrap();
    server_tls.alpn_protocols = vec![b"h2".to_vec(), b"mr/1".to_vec()];
    let rt = runtime(2);
    let server = echo_server(&rt, TlsAcceptor::new(server_tls));
    let addr = server.local_addr();
    let mut good = tls::client_config_from_ca_pem_file(&ca_path).unwrap();
    good.alpn_protocols = vec![b"mr/1".to_vec()];
    let good = Arc::new(good);
    let untrusted = Arc::new(tls::client_config_from_ca_pem_file(&other_path).unwrap());
    rt.block_on_local(move || async move {
        let mut c = Framed::connect_tls(addr, "localhost", good.clone(), LengthDelimited::new())
            .await
            .unwrap();
        let info = c.tls_info().unwrap();
        assert_eq!(info.alpn.as_deref(), Some(&b"mr/1"[..]));
        assert_eq!(info.version, Some(rustls::ProtocolVersion::TLSv1_3));
        // Pipelined frames, one of them past a TLS record.
        let big = Bytes::from(vec![9u8; 100_000]);
        for i in 0..16u8 {
            c.feed(Bytes::from(vec![i; 10])).unwrap();
        }
        c.feed(big.clone()).unwrap();
        c.flush().await.unwrap();
        for i in 0..16u8 {
            assert_eq!(c.recv().await.unwrap().unwrap(), vec![i; 10]);
        }
        assert_eq!(c.recv().await.unwrap().unwrap(), big);
        // close_notify, then the server's own end.
        c.close_write().await.unwrap();
        assert!(c.recv().await.unwrap().is_none());

        let err = Framed::connect_tls(addr, "localhost", untrusted, LengthDelimited::new())
            .await
            .expect_err("an untrusted certificate");
        let failure = err
            .get_ref()
            .and_then(|e| e.downcast_ref::<TlsFailure>())
            .cloned();
        assert!(
            matches!(&failure, Some(TlsFailure::Protocol(e)) if e.contains("UnknownIssuer")),
            "{err:?}"
        );
        let err = Framed::connect_tls(addr, "not a name!", good, LengthDelimited::new())
            .await
            .expect_err("a bad server name");
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    });
    wait_for(&server, "the closes", |s| {
        s.closed(CloseKind::PeerClosed) == 1 && s.closed(CloseKind::Tls) == 1
    });
    rt.block_on(server.shutdown());
}

#[test]
fn shutdown_ends_a_waiting_handshake_without_its_timeout() {
    let pki = Pki::new("shutdown");
    let (ca, _) = pki.ca("ca");
    let (cert, key) = pki.leaf(&ca, "server", &["localhost"], false);
    let rt = runtime(1);
    let server = echo_server(
        &rt,
        TlsAcceptor::from_pem_files(&cert, &key)
            .unwrap()
            .with_handshake_timeout(Duration::from_secs(600)),
    );
    let silent = TcpStream::connect(server.local_addr()).unwrap();
    wait_for(&server, "the accept", |s| s.total(|s| s.accepted) == 1);
    let started = Instant::now();
    let stats = server.stats();
    let report = rt.block_on(server.shutdown());
    assert_eq!(report.open_at_start, 1);
    assert_eq!(report.forced, 0, "a handshake holds nothing to finish");
    assert!(started.elapsed() < Duration::from_secs(60));
    assert_eq!(stats.closed(CloseKind::Tls), 0);
    drop(silent);
}

#[test]
fn pem_files_that_are_missing_empty_or_mismatched_are_typed_errors() {
    let pki = Pki::new("pem");
    let (ca, ca_path) = pki.ca("ca");
    let (cert, key) = pki.leaf(&ca, "a", &["localhost"], false);
    let (_cert_b, key_b) = pki.leaf(&ca, "b", &["localhost"], false);
    let missing = pki.dir.join("missing.pem");
    assert!(matches!(
        tls::server_config_from_pem_files(&missing, &key),
        Err(TlsError::Pem { .. })
    ));
    let empty = pki.write("empty.pem", "");
    assert!(matches!(
        tls::certificates_from_pem_file(&empty),
        Err(TlsError::NoCertificate(_))
    ));
    assert!(matches!(
        tls::private_key_from_pem_file(&ca_path),
        Err(TlsError::Pem { .. })
    ));
    let err = tls::server_config_from_pem_files(&cert, &key_b).unwrap_err();
    assert!(matches!(err, TlsError::Rustls(_)), "{err}");
    assert!(err.to_string().contains("TLS configuration"), "{err}");
    assert!(tls::server_config_from_pem_files(&cert, &key).is_ok());
}

/// Holds its first frame's reply forever (reading stops at a window of 1).
struct Stall;

impl Session for Stall {
    type Codec = LengthDelimited;
    type Key = ();

    async fn on_frame(&mut self, _frame: Bytes, cx: &mut SessionCtx<Self>) {
        cx.reply_later(std::future::pending());
    }
}

#[test]
fn a_tls_send_dropped_part_way_fails_the_next_instead_of_corrupting_the_stream() {
    let pki = Pki::new("cancel");
    let (ca, ca_path) = pki.ca("ca");
    let (cert, key) = pki.leaf(&ca, "server", &["localhost"], false);
    let rt = runtime(1);
    let mut config = ServerConfig::default();
    config.pipeline_window = 1;
    config.shutdown_grace = Duration::from_millis(50);
    let server = Server::builder(LengthDelimited::new(), |_| Stall)
        .config(config)
        .tls(TlsAcceptor::from_pem_files(&cert, &key).unwrap())
        .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
        .unwrap();
    let addr = server.local_addr();
    let client = Arc::new(tls::client_config_from_ca_pem_file(&ca_path).unwrap());
    rt.block_on_local(move || async move {
        let mut c = Framed::connect_tls(addr, "localhost", client, LengthDelimited::new())
            .await
            .unwrap();
        c.send(Bytes::from_static(b"first")).await.unwrap();
        // Far more than the socket buffers hold while the server reads
        // nothing: the send cannot finish, and is dropped part way.
        for _ in 0..16 {
            c.feed(Bytes::from(vec![1u8; 4 << 20])).unwrap();
        }
        let cut = mailring::time::timeout(Duration::from_millis(300), c.flush()).await;
        assert!(cut.is_err(), "the send stalled: {cut:?}");
        let err = c.send(Bytes::from_static(b"after")).await.unwrap_err();
        let failure = err
            .get_ref()
            .and_then(|e| e.downcast_ref::<TlsFailure>())
            .cloned();
        assert!(
            matches!(&failure, Some(TlsFailure::Protocol(e)) if e.contains("abandoned")),
            "{err:?}"
        );
    });
    rt.block_on(server.shutdown());
}

/// A 2-shard steered TLS echo server, with a factory of rustls clients
/// over a given socket.
fn steered_tls_server(
    pki: &Pki,
) -> (
    mailring::Runtime,
    Server<Echo>,
    impl Fn(TcpStream) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream>,
) {
    let (ca, ca_path) = pki.ca("ca");
    let (cert, key) = pki.leaf(&ca, "server", &["localhost"], false);
    let rt = runtime(2);
    let server = echo_server(&rt, TlsAcceptor::from_pem_files(&cert, &key).unwrap());
    assert!(server.is_steered());
    let config = Arc::new(tls::client_config_from_ca_pem_file(&ca_path).unwrap());
    let client = move |sock: TcpStream| {
        let conn = rustls::ClientConnection::new(
            config.clone(),
            rustls::pki_types::ServerName::try_from("localhost").unwrap(),
        )
        .unwrap();
        rustls::StreamOwned::new(conn, sock)
    };
    (rt, server, client)
}

#[test]
fn a_handshake_in_progress_weighs_more_than_an_open_connection() {
    let pki = Pki::new("balance");
    let (rt, server, client) = steered_tls_server(&pki);
    let addr = server.local_addr();
    // Shard 1 serves one connection, done with its handshake.
    let mut served = client(connect_steered_to(addr, 1));
    assert_eq!(round_trip(&mut served, b"served"), b"served");
    // A client that says nothing holds a handshake open on shard 0.
    let silent = connect_steered_to(addr, 0);
    wait_for(&server, "the silent accept", |s| s.shards[0].accepted == 1);
    std::thread::sleep(Duration::from_millis(20));
    // One connection each, but the handshake is CPU to come: the next
    // connection of shard 0 handshakes on shard 1 instead.
    let mut c = client(connect_steered_to(addr, 0));
    assert_eq!(round_trip(&mut c, b"balanced"), b"balanced");
    let stats = server.stats();
    assert_eq!(stats.shards[0].accepted, 2);
    assert_eq!(stats.shards[0].handshakes_moved, 1, "{stats:#?}");
    assert_eq!(stats.shards[1].tls_handshakes, 2);
    assert_eq!(stats.shards[0].tls_handshakes, 0);
    drop((silent, served, c));
    rt.block_on(server.shutdown());
}

#[test]
fn a_fresh_tls_connection_goes_to_the_shard_with_fewer_connections() {
    let pki = Pki::new("spread");
    let (rt, server, tls_client) = steered_tls_server(&pki);
    let addr = server.local_addr();
    let client = |shard: usize| {
        let mut c = tls_client(connect_steered_to(addr, shard));
        assert_eq!(round_trip(&mut c, b"hello"), b"hello");
        c
    };
    // Connections the kernel's spread puts on shard 0, one after another,
    // each done with its handshake before the next: they split between
    // the shards as they come (a spread of 4 and 0 would leave shard 1
    // idle while shard 0 serves them all).
    let held: Vec<_> = (0..4).map(|_| client(0)).collect();
    let stats = server.stats();
    assert_eq!(stats.shards[0].accepted, 4);
    assert_eq!(stats.shards[0].tls_handshakes, 2, "{stats:#?}");
    assert_eq!(stats.shards[1].tls_handshakes, 2, "{stats:#?}");
    assert_eq!(stats.shards[0].handshakes_moved, 2, "{stats:#?}");
    assert_eq!((stats.shards[0].open, stats.shards[1].open), (2, 2));
    // Shards as busy as each other keep what comes to them.
    let one_more = client(0);
    assert_eq!(server.stats().shards[0].tls_handshakes, 3);
    // Connections that closed count no more: shard 0 keeps one, shard 1
    // none, and the next connection of shard 0 goes there.
    drop(held);
    wait_for(&server, "the closes", |s| {
        (s.shards[0].open, s.shards[1].open) == (1, 0)
    });
    let last = client(0);
    assert_eq!(server.stats().shards[1].tls_handshakes, 3);
    drop((one_more, last));
    rt.block_on(server.shutdown());
}

#[test]
fn clones_of_an_acceptor_share_reloads_whatever_their_handshake_timeout() {
    let pki = Pki::new("clones");
    let (ca, _) = pki.ca("ca");
    let (first_cert, first_key) = pki.leaf(&ca, "first", &["localhost"], false);
    let (next_cert, next_key) = pki.leaf(&ca, "next", &["localhost"], false);
    let acceptor = TlsAcceptor::from_pem_files(&first_cert, &first_key).unwrap();
    let quick = acceptor
        .clone()
        .with_handshake_timeout(Duration::from_millis(50));
    assert_eq!(quick.handshake_timeout(), Duration::from_millis(50));
    assert_eq!(
        acceptor.handshake_timeout(),
        TlsAcceptor::DEFAULT_HANDSHAKE_TIMEOUT
    );
    // A reload through the first is what the second serves from.
    acceptor.reload_pem_files(&next_cert, &next_key).unwrap();
    assert!(Arc::ptr_eq(&acceptor.config(), &quick.config()));
}

#[test]
fn key_updates_resumption_and_a_tampered_record_over_live_connections() {
    let pki = Pki::new("records");
    let (ca, ca_path) = pki.ca("ca");
    let (cert, key) = pki.leaf(&ca, "server", &["localhost"], false);
    let rt = runtime(2);
    let server = echo_server(&rt, TlsAcceptor::from_pem_files(&cert, &key).unwrap());
    let addr = server.local_addr();

    // rustls's own client asks for a key update before each request: the
    // server follows the client's new key and answers under a new key of
    // its own, which the client follows in turn.
    let mut updating = tls_client(addr, &ca_path, "localhost", &[]).unwrap();
    for i in 0..40u8 {
        updating.conn.refresh_traffic_keys().unwrap();
        let body = vec![i; 1000 + usize::from(i) * 500];
        assert_eq!(round_trip(&mut updating, &body), body);
    }

    // A record changed on the wire: the server refuses it with the alert
    // that says why and closes that connection only.
    let mut tampering = tls_client(addr, &ca_path, "localhost", &[]).unwrap();
    assert_eq!(round_trip(&mut tampering, b"before"), b"before");
    tampering
        .conn
        .writer()
        .write_all(&frame(b"tampered"))
        .unwrap();
    let mut records = Vec::new();
    while tampering.conn.wants_write() {
        tampering.conn.write_tls(&mut records).unwrap();
    }
    let last = records.len() - 1;
    records[last] ^= 0x40;
    tampering.sock.write_all(&records).unwrap();
    let mut told = None;
    let mut buf = [0u8; 4096];
    while told.is_none() {
        match tampering.sock.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let mut rd = &buf[..n];
                while !rd.is_empty() {
                    tampering.conn.read_tls(&mut rd).unwrap();
                    if let Err(e) = tampering.conn.process_new_packets() {
                        told = Some(e);
                        break;
                    }
                }
            }
        }
    }
    assert_eq!(
        told,
        Some(rustls::Error::AlertReceived(
            rustls::AlertDescription::BadRecordMac
        ))
    );
    wait_for(&server, "the tampered connection's close", |s| {
        s.closed(CloseKind::Tls) == 1
    });
    // The other connection goes on.
    assert_eq!(round_trip(&mut updating, b"after"), b"after");

    // Our client keeps the server's session tickets: a second connection
    // with the same configuration resumes.
    let config = Arc::new(tls::client_config_from_ca_pem_file(&ca_path).unwrap());
    rt.block_on_local(move || async move {
        let mut first =
            Framed::connect_tls(addr, "localhost", config.clone(), LengthDelimited::new())
                .await
                .unwrap();
        assert!(!first.tls_info().unwrap().resumed);
        // The tickets come after the handshake, ahead of this answer.
        first.send(Bytes::from_static(b"one")).await.unwrap();
        assert_eq!(first.recv().await.unwrap().unwrap(), &b"one"[..]);
        let mut second = Framed::connect_tls(addr, "localhost", config, LengthDelimited::new())
            .await
            .unwrap();
        assert!(second.tls_info().unwrap().resumed, "resumed with a ticket");
        second.send(Bytes::from_static(b"two")).await.unwrap();
        assert_eq!(second.recv().await.unwrap().unwrap(), &b"two"[..]);
    });
    rt.block_on(server.shutdown());
}

#[test]
fn a_receive_dropped_while_a_record_is_half_in_loses_nothing_of_it() {
    let pki = Pki::new("half-record");
    let (ca, ca_path) = pki.ca("ca");
    let (cert, key) = pki.leaf(&ca, "server", &["localhost"], false);
    let server_config = Arc::new(tls::server_config_from_pem_files(&cert, &key).unwrap());
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    // rustls's own server: after the handshake it sends one record of a
    // 2 KiB frame in two parts, the second once the client has dropped a
    // receive, then a second frame whole.
    let (dropped, wait_dropped) = std::sync::mpsc::channel::<()>();
    let peer = std::thread::spawn(move || {
        let (sock, _) = listener.accept().unwrap();
        sock.set_nodelay(true).unwrap();
        let conn = rustls::ServerConnection::new(server_config).unwrap();
        let mut tls = rustls::StreamOwned::new(conn, sock);
        while tls.conn.is_handshaking() {
            tls.conn.complete_io(&mut tls.sock).unwrap();
        }
        // Tickets and anything else queued go first, whole.
        while tls.conn.wants_write() {
            tls.conn.write_tls(&mut tls.sock).unwrap();
        }
        let mut body = vec![0u8; 2048];
        for (i, b) in body.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        tls.conn.writer().write_all(&frame(&body)).unwrap();
        let mut record = Vec::new();
        while tls.conn.wants_write() {
            tls.conn.write_tls(&mut record).unwrap();
        }
        let half = record.len() / 2;
        tls.sock.write_all(&record[..half]).unwrap();
        wait_dropped.recv().unwrap();
        tls.sock.write_all(&record[half..]).unwrap();
        tls.write_all(&frame(b"second")).unwrap();
        tls.flush().unwrap();
        // Until the client is done.
        let mut rest = Vec::new();
        let _ = tls.read_to_end(&mut rest);
        body
    });
    let client = Arc::new(tls::client_config_from_ca_pem_file(&ca_path).unwrap());
    let rt = runtime(1);
    let (first, second) = rt.block_on_local(move || async move {
        let mut c = Framed::connect_tls(addr, "localhost", client, LengthDelimited::new())
            .await
            .unwrap();
        // Dropped while the record's first half is in (or on its way) and
        // its second not sent.
        let early = mailring::time::timeout(Duration::from_millis(150), c.recv()).await;
        assert!(early.is_err(), "nothing whole had come yet: {early:?}");
        dropped.send(()).unwrap();
        let first = c.recv().await.unwrap().expect("the first frame");
        let second = c.recv().await.unwrap().expect("the second frame");
        c.close_write().await.unwrap();
        (first, second)
    });
    let body = peer.join().unwrap();
    assert_eq!(&first[..], &body[..]);
    assert_eq!(&second[..], b"second");
}

/// A client that sends a TLS record a byte at a time (a slow-loris inside
/// one record): the frame it carries has started once the record has,
/// and the frame timeout ends it, as it ends a plain client sending a
/// frame a byte at a time; the record layer's bytes count.
#[test]
fn a_record_sent_a_byte_at_a_time_is_cut_by_the_frame_timeout() {
    let pki = Pki::new("slow-record");
    let (ca, ca_path) = pki.ca("ca");
    let (cert, key) = pki.leaf(&ca, "server", &["localhost"], false);
    let rt = runtime(1);
    let mut config = ServerConfig::default();
    config.frame_timeout = Some(Duration::from_millis(300));
    let server = Server::builder(LengthDelimited::new(), |_| Echo)
        .config(config)
        .tls(TlsAcceptor::from_pem_files(&cert, &key).unwrap())
        .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
        .unwrap();
    let mut c = tls_client(server.local_addr(), &ca_path, "localhost", &[]).unwrap();
    assert_eq!(round_trip(&mut c, b"first"), b"first");
    // A record with no data (a key update), then a wait past the frame
    // timeout: no frame had started.
    c.conn.refresh_traffic_keys().unwrap();
    c.conn.complete_io(&mut c.sock).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(round_trip(&mut c, b"second"), b"second");
    assert_eq!(server.stats().closed(CloseKind::FrameTimeout), 0);
    // The next frame's record, a byte every 20 ms (4 s for 200 bytes).
    c.conn.writer().write_all(&frame(&[7u8; 180])).unwrap();
    let mut record = Vec::new();
    while c.conn.wants_write() {
        c.conn.write_tls(&mut record).unwrap();
    }
    let started = Instant::now();
    for byte in &record {
        if c.sock.write_all(std::slice::from_ref(byte)).is_err() {
            break;
        }
        if server.stats().closed(CloseKind::FrameTimeout) == 1 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    wait_for(&server, "the frame timeout", |s| {
        s.closed(CloseKind::FrameTimeout) == 1
    });
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "cut after {:?}",
        started.elapsed()
    );
    rt.block_on(server.shutdown());
}
