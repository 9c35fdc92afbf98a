//! Real peers that are not our code: `curl --http2` (TLS with ALPN, and
//! HTTP/2 with prior knowledge) against hyper served on mailring through
//! the adapters, and `openssl s_client` against a TLS session server. Each
//! skips with a printed reason when its tool is missing. Built with
//! `--features tokio-io,futures-io,hyper` (`.ci/run` does).

use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::process::{Command, Stdio};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response};
use mailring_actors::ShardId;
use mailring_transports::codec::Lines;
use mailring_transports::compat::{CompatStream, ShardExecutor, ShardTimer};
use mailring_transports::tls::{self, TlsAcceptor};
use mailring_transports::{Server, Session, SessionCtx};

mod common;

fn runtime() -> mailring::Runtime {
    mailring::Runtime::builder()
        .shards(2)
        .build()
        .expect("io_uring available")
}

fn have(tool: &str) -> bool {
    let found = Command::new(tool).arg("--version").output().is_ok()
        || Command::new(tool).arg("version").output().is_ok();
    if !found {
        eprintln!("SKIPPED: {tool} is not installed");
    }
    found
}

/// `"<version> <method> <path> <body>"`, the HTTP version as hyper saw it.
async fn describe(
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let head = format!("{:?} {} {} ", req.version(), req.method(), req.uri().path());
    let body = req.into_body().collect().await.map(|b| b.to_bytes());
    let mut out = head.into_bytes();
    out.extend_from_slice(&body.unwrap_or_default());
    Ok(Response::new(Full::new(Bytes::from(out))))
}

/// Serves hyper on shard 0: over TLS, HTTP/2 when ALPN chose `h2` and
/// HTTP/1.1 otherwise; in clear text, HTTP/2 only (prior knowledge).
fn serve(rt: &mailring::Runtime, tls: Option<TlsAcceptor>) -> SocketAddr {
    common::accept_on(rt, ShardId::new(0), move |stream| {
        let tls = tls.clone();
        async move {
            let io = match &tls {
                Some(a) => match CompatStream::accept_tls(stream, a).await {
                    Ok(io) => io,
                    Err(_) => return,
                },
                None => CompatStream::tcp(stream),
            };
            let h2 =
                tls.is_none() || io.tls_info().and_then(|t| t.alpn.as_deref()) == Some(&b"h2"[..]);
            let service = hyper::service::service_fn(describe);
            let _ = if h2 {
                hyper::server::conn::http2::Builder::new(ShardExecutor::current())
                    .timer(ShardTimer)
                    .serve_connection(io, service)
                    .await
            } else {
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await
            };
        }
    })
}

fn curl(args: &[&str]) -> String {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10"])
        .args(args)
        .output()
        .expect("run curl");
    assert!(
        out.status.success(),
        "curl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn curl_speaks_http2_to_hyper_on_mailring_over_tls_and_in_clear() {
    if !have("curl") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("mailring-curl-{}", std::process::id()));
    let (cert, key) = common::self_signed_localhost(&dir);
    let mut config = tls::server_config_from_pem_files(&cert, &key).unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let rt = runtime();
    let tls_addr = serve(&rt, Some(TlsAcceptor::new(config)));
    let clear_addr = serve(&rt, None);
    let resolve = format!("localhost:{}:127.0.0.1", tls_addr.port());
    let url = format!("https://localhost:{}/tls", tls_addr.port());
    let cacert = cert.to_str().unwrap();
    // ALPN picks h2; and HTTP/1.1 when curl asks for it only.
    let h2 = curl(&[
        "--http2",
        "--cacert",
        cacert,
        "--resolve",
        &resolve,
        "-d",
        "body",
        &url,
    ]);
    assert_eq!(h2, "HTTP/2.0 POST /tls body");
    let h1 = curl(&["--http1.1", "--cacert", cacert, "--resolve", &resolve, &url]);
    assert_eq!(h1, "HTTP/1.1 GET /tls ");
    // h2c with prior knowledge.
    let clear = curl(&[
        "--http2-prior-knowledge",
        &format!("http://127.0.0.1:{}/clear", clear_addr.port()),
    ]);
    assert_eq!(clear, "HTTP/2.0 GET /clear ");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Echoes one line, then closes.
struct OneLine;

impl Session for OneLine {
    type Codec = Lines;
    type Key = ();

    async fn on_frame(&mut self, line: Bytes, cx: &mut SessionCtx<Self>) {
        let mut reply = b"echo: ".to_vec();
        reply.extend_from_slice(&line);
        cx.send_frame(Bytes::from(reply));
        cx.close();
    }
}

#[test]
fn openssl_s_client_handshakes_with_a_tls_session_and_is_answered() {
    if !have("openssl") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("mailring-s-client-{}", std::process::id()));
    let (cert, key) = common::self_signed_localhost(&dir);
    let rt = runtime();
    let server = Server::builder(Lines::new(), |_| OneLine)
        .tls(TlsAcceptor::from_pem_files(&cert, &key).unwrap())
        .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
        .unwrap();
    let mut child = Command::new("openssl")
        .args([
            "s_client",
            "-quiet",
            "-verify_return_error",
            "-servername",
            "localhost",
        ])
        .args(["-connect", &server.local_addr().to_string(), "-CAfile"])
        .arg(&cert)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run openssl");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"hello from openssl\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "openssl s_client: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout.trim(), "echo: hello from openssl");
    assert_eq!(server.stats().total(|s| s.tls_handshakes), 1);
    rt.block_on(server.shutdown());
    let _ = std::fs::remove_dir_all(&dir);
}
