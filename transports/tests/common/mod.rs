//! What the transports' test binaries share: a loopback client, frames of
//! the 4-byte length-delimited codec, and an echo session.

// Not every binary uses every helper.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use bytes::Bytes;
use mailring_transports::codec::LengthDelimited;
use mailring_transports::{Session, SessionCtx};

/// A loopback TCP listener on `shard` of `rt`: each accepted connection is
/// handed to `serve`, in a task of its own on that shard, for as long as
/// the runtime runs. Returns the listener's address.
pub(crate) fn accept_on<F, Fut>(
    rt: &mailring_actors::mailring::Runtime,
    shard: mailring_actors::ShardId,
    serve: F,
) -> SocketAddr
where
    F: Fn(mailring_actors::mailring::net::TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(rt.handle().spawn_local_on(shard, move || async move {
        let listener = mailring_actors::mailring::net::TcpListener::from_std(listener).unwrap();
        while let Ok((stream, _)) = listener.accept().await {
            drop(mailring_actors::mailring::spawn_local(serve(stream)));
        }
    }));
    addr
}

/// A blocking loopback client whose reads give up after 10 s.
pub(crate) fn client(addr: SocketAddr) -> TcpStream {
    let c = TcpStream::connect(addr).expect("connect to loopback");
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.set_nodelay(true).unwrap();
    c
}

/// `body` as one length-delimited frame.
pub(crate) fn frame(body: &[u8]) -> Vec<u8> {
    let mut v = (body.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(body);
    v
}

/// Reads one frame's body.
pub(crate) fn read_frame(c: &mut impl Read) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    c.read_exact(&mut len)?;
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    c.read_exact(&mut body)?;
    Ok(body)
}

/// Sends `body` and checks that it comes back.
pub(crate) fn round_trip(c: &mut TcpStream, body: &[u8]) {
    c.write_all(&frame(body)).unwrap();
    assert_eq!(read_frame(c).unwrap(), body, "the echo");
}

/// Echoes each frame.
pub(crate) struct Echo;

impl Session for Echo {
    type Codec = LengthDelimited;
    type Key = ();

    async fn on_frame(&mut self, frame: Bytes, cx: &mut SessionCtx<Self>) {
        cx.send_frame(frame);
    }
}

/// Waits (bounded) for `cond` on the server's stats.
pub(crate) fn wait_for<S: mailring_transports::Session>(
    server: &mailring_transports::Server<S>,
    what: &str,
    cond: impl Fn(&mailring_transports::ServerStats) -> bool,
) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let stats = server.stats();
        if cond(&stats) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}: {stats:#?}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A self-signed certificate for `localhost` and its key, written to
/// `dir/cert.pem` and `dir/key.pem` (the certificate is its own CA).
pub(crate) fn self_signed_localhost(
    dir: &std::path::Path,
) -> (std::path::PathBuf, std::path::PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let paths = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&paths.0, cert.pem()).unwrap();
    std::fs::write(&paths.1, key.serialize_pem()).unwrap();
    paths
}

/// A TCP connection from a source port the server's steered group sends
/// to `shard` of 2.
pub(crate) fn connect_steered_to(addr: SocketAddr, shard: usize) -> TcpStream {
    let mut port = 40_000u16;
    loop {
        port += 1;
        if mailring::net::steered_index(port, 2) != shard {
            continue;
        }
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        if s.bind(&SocketAddr::from(([127, 0, 0, 1], port)).into())
            .is_err()
        {
            continue;
        }
        s.connect(&addr.into()).unwrap();
        let s: TcpStream = s.into();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        return s;
    }
}

/// The listening sockets of this process bound to `addr` (every shard's
/// with `ReusePort`), found among its descriptors.
pub(crate) fn listening_fds(addr: std::net::SocketAddr) -> Vec<i32> {
    let mut fds = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: all zeros is a valid `sockaddr_in` (plain integers).
        let mut storage: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        // SAFETY: `storage` is a writable `sockaddr_in` of `len` bytes.
        let named = unsafe { libc::getsockname(fd, (&raw mut storage).cast(), &mut len) };
        let mut listening: libc::c_int = 0;
        let mut olen = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `listening` is a writable `c_int` of `olen` bytes.
        let asked = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_ACCEPTCONN,
                (&raw mut listening).cast(),
                &mut olen,
            )
        };
        if named == 0
            && asked == 0
            && listening == 1
            && storage.sin_family == libc::AF_INET as libc::sa_family_t
            && u16::from_be(storage.sin_port) == addr.port()
        {
            fds.push(fd);
        }
    }
    fds
}
