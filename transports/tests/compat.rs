//! The ecosystem adapters over real sockets: hyper HTTP/1.1 and HTTP/2
//! servers and clients on mailring shards (HTTP/2 also over TLS with ALPN),
//! an HTTP/1.1 upgrade whose connection hyper boxes as `Send`, tokio-util
//! codecs and futures-io on a `CompatStream`, and the off-shard error.
//! Built with `--features tokio-io,futures-io,hyper` (`.ci/run` does).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response};
use mailring_actors::mailring::net::{TcpListener, UnixStream};
use mailring_actors::ShardId;
use mailring_transports::compat::{CompatStream, ShardExecutor, ShardTimer};
use mailring_transports::tls::{self, TlsAcceptor};

mod common;

fn runtime() -> mailring::Runtime {
    mailring::Runtime::builder()
        .shards(2)
        .build()
        .expect("io_uring available")
}

/// Answers with the request's method, path and body, and the shard that
/// served it in `x-shard`.
async fn echo(req: Request<hyper::body::Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let shard = mailring::current_shard().map_or(usize::MAX, |s| s.index());
    let head = format!("{} {} ", req.method(), req.uri().path());
    let body = req.into_body().collect().await.map(|b| b.to_bytes());
    let mut out = head.into_bytes();
    out.extend_from_slice(&body.unwrap_or_default());
    Ok(Response::builder()
        .header("x-shard", shard.to_string())
        .body(Full::new(Bytes::from(out)))
        .unwrap())
}

#[derive(Clone, Copy, PartialEq)]
enum Http {
    One,
    /// HTTP/1.1 whose headers must come within this long.
    OneWithHeaderTimeout(std::time::Duration),
    Two,
}

/// A TCP listener on `shard` whose connections hyper serves there; TLS
/// first when an acceptor is given. Returns its address.
fn serve(
    rt: &mailring::Runtime,
    shard: ShardId,
    http: Http,
    tls: Option<TlsAcceptor>,
) -> SocketAddr {
    common::accept_on(rt, shard, move |stream| {
        let tls = tls.clone();
        async move {
            let io = match &tls {
                Some(acceptor) => match CompatStream::accept_tls(stream, acceptor).await {
                    Ok(io) => io,
                    Err(_) => return,
                },
                None => CompatStream::tcp(stream),
            };
            let service = hyper::service::service_fn(echo);
            let _ = match http {
                Http::One => {
                    hyper::server::conn::http1::Builder::new()
                        .timer(ShardTimer)
                        .serve_connection(io, service)
                        .await
                }
                Http::OneWithHeaderTimeout(limit) => {
                    hyper::server::conn::http1::Builder::new()
                        .timer(ShardTimer)
                        .header_read_timeout(limit)
                        .serve_connection(io, service)
                        .await
                }
                Http::Two => {
                    hyper::server::conn::http2::Builder::new(ShardExecutor::current())
                        .timer(ShardTimer)
                        .serve_connection(io, service)
                        .await
                }
            };
        }
    })
}

fn request(path: &str, body: &'static str) -> Request<Full<Bytes>> {
    Request::post(path)
        .header("host", "localhost")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

async fn read_response(res: Response<hyper::body::Incoming>) -> (String, String) {
    let shard = res.headers()["x-shard"].to_str().unwrap().to_owned();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (shard, String::from_utf8(body.to_vec()).unwrap())
}

#[test]
fn hyper_http1_keep_alive_between_shards() {
    let rt = runtime();
    let addr = serve(&rt, ShardId::new(0), Http::One, None);
    let got = rt.block_on(async move {
        mailring::spawn_on(ShardId::new(1), async move {
            let io = CompatStream::connect(addr).await.unwrap();
            let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
            drop(mailring::spawn_local(conn));
            let mut out = Vec::new();
            for i in 0..20 {
                let res = sender
                    .send_request(request(&format!("/item/{i}"), "payload"))
                    .await
                    .unwrap();
                assert_eq!(res.status(), 200);
                out.push(read_response(res).await);
            }
            out
        })
        .await
        .unwrap()
    });
    for (i, (shard, body)) in got.into_iter().enumerate() {
        assert_eq!(shard, "0", "served on the listener's shard");
        assert_eq!(body, format!("POST /item/{i} payload"));
    }
}

#[test]
fn hyper_http2_multiplexes_on_the_shard_executor() {
    let rt = runtime();
    let addr = serve(&rt, ShardId::new(1), Http::Two, None);
    let got = rt.block_on(async move {
        mailring::spawn_on(ShardId::new(0), async move {
            let io = CompatStream::connect(addr).await.unwrap();
            let (sender, conn) = hyper::client::conn::http2::Builder::new(ShardExecutor::current())
                .timer(ShardTimer)
                .handshake(io)
                .await
                .unwrap();
            drop(mailring::spawn_local(conn));
            // 32 requests in flight at once on one connection.
            let calls: Vec<_> = (0..32)
                .map(|i| {
                    let mut sender = sender.clone();
                    mailring::spawn_local(async move {
                        let res = sender
                            .send_request(request(&format!("/s/{i}"), "h2"))
                            .await
                            .unwrap();
                        read_response(res).await
                    })
                })
                .collect();
            let mut out = Vec::new();
            for c in calls {
                out.push(c.await.unwrap());
            }
            out
        })
        .await
        .unwrap()
    });
    for (i, (shard, body)) in got.into_iter().enumerate() {
        assert_eq!(shard, "1");
        assert_eq!(body, format!("POST /s/{i} h2"));
    }
}

#[test]
fn hyper_http2_over_tls_negotiated_by_alpn() {
    let dir = std::env::temp_dir().join(format!("mailring-compat-tls-{}", std::process::id()));
    common::self_signed_localhost(&dir);
    let mut server_config =
        tls::server_config_from_pem_files(dir.join("cert.pem"), dir.join("key.pem")).unwrap();
    server_config.alpn_protocols = vec![b"h2".to_vec()];
    let mut client_config = tls::client_config_from_ca_pem_file(dir.join("cert.pem")).unwrap();
    client_config.alpn_protocols = vec![b"h2".to_vec()];
    let client_config = Arc::new(client_config);
    let rt = runtime();
    let addr = serve(
        &rt,
        ShardId::new(0),
        Http::Two,
        Some(TlsAcceptor::new(server_config)),
    );
    let (alpn, got) = rt.block_on(async move {
        mailring::spawn_on(ShardId::new(0), async move {
            let io = CompatStream::connect_tls(addr, "localhost", client_config)
                .await
                .unwrap();
            let alpn = io.tls_info().and_then(|t| t.alpn.clone());
            let (mut sender, conn) =
                hyper::client::conn::http2::Builder::new(ShardExecutor::current())
                    .handshake(io)
                    .await
                    .unwrap();
            drop(mailring::spawn_local(conn));
            let res = sender
                .send_request(request("/tls", "secret"))
                .await
                .unwrap();
            (alpn, read_response(res).await)
        })
        .await
        .unwrap()
    });
    assert_eq!(alpn.as_deref(), Some(&b"h2"[..]));
    assert_eq!(got.1, "POST /tls secret");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_upgraded_http1_connection_is_boxed_as_send_and_comes_back_out() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rt = runtime();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    // The server: answers 101, then echoes whatever the upgraded
    // connection carries.
    drop(
        rt.handle()
            .spawn_local_on(ShardId::new(0), move || async move {
                let listener = TcpListener::from_std(listener).unwrap();
                let (stream, _) = listener.accept().await.unwrap();
                let service = hyper::service::service_fn(
                    |mut req: Request<hyper::body::Incoming>| async move {
                        let upgrade = hyper::upgrade::on(&mut req);
                        drop(mailring::spawn_local(async move {
                            let upgraded = upgrade.await.unwrap();
                            let parts = upgraded.downcast::<CompatStream>().expect("our stream");
                            let mut io = parts.io;
                            let mut buf = parts.read_buf.to_vec();
                            let mut more = [0u8; 64];
                            while buf.len() < 5 {
                                let n = io.read(&mut more).await.unwrap();
                                buf.extend_from_slice(&more[..n]);
                            }
                            io.write_all(&buf).await.unwrap();
                            io.flush().await.unwrap();
                        }));
                        Ok::<_, Infallible>(
                            Response::builder()
                                .status(101)
                                .header("connection", "upgrade")
                                .header("upgrade", "echo")
                                .body(Full::new(Bytes::new()))
                                .unwrap(),
                        )
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(CompatStream::tcp(stream), service)
                    .with_upgrades()
                    .await;
            }),
    );
    let echoed = rt.block_on(async move {
        mailring::spawn_on(ShardId::new(0), async move {
            let io = CompatStream::connect(addr).await.unwrap();
            let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
            drop(mailring::spawn_local(conn.with_upgrades()));
            let req = Request::get("/")
                .header("host", "localhost")
                .header("connection", "upgrade")
                .header("upgrade", "echo")
                .body(Full::new(Bytes::new()))
                .unwrap();
            let res = sender.send_request(req).await.unwrap();
            assert_eq!(res.status(), 101);
            let upgraded = hyper::upgrade::on(res).await.unwrap();
            let mut io = upgraded.downcast::<CompatStream>().expect("our stream").io;
            io.write_all(b"hello").await.unwrap();
            io.flush().await.unwrap();
            let mut got = [0u8; 5];
            io.read_exact(&mut got).await.unwrap();
            got
        })
        .await
        .unwrap()
    });
    assert_eq!(&echoed, b"hello");
}

#[test]
fn tokio_util_codecs_and_futures_io_run_on_a_compat_stream() {
    use futures::{AsyncReadExt as _, AsyncWriteExt as _, SinkExt, StreamExt};
    let rt = runtime();
    rt.block_on_local(|| async {
        // tokio-util: lines both ways over a Unix pair.
        let (a, b) = UnixStream::pair().unwrap();
        let mut a = tokio_util::codec::Framed::new(
            CompatStream::unix(a),
            tokio_util::codec::LinesCodec::new(),
        );
        let mut b = tokio_util::codec::Framed::new(
            CompatStream::unix(b),
            tokio_util::codec::LinesCodec::new(),
        );
        for i in 0..100 {
            a.send(format!("line {i}")).await.unwrap();
        }
        for i in 0..100 {
            assert_eq!(b.next().await.unwrap().unwrap(), format!("line {i}"));
        }
        // futures-io: a write bigger than the stream's buffer goes out in
        // pieces and arrives whole.
        let (c, d) = UnixStream::pair().unwrap();
        let (mut c, mut d) = (CompatStream::unix(c), CompatStream::unix(d));
        let big: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
        let sent = big.clone();
        let writer = mailring::spawn_local(async move {
            futures::AsyncWriteExt::write_all(&mut c, &sent)
                .await
                .unwrap();
            futures::AsyncWriteExt::close(&mut c).await.unwrap();
        });
        let mut got = Vec::new();
        futures::AsyncReadExt::read_to_end(&mut d, &mut got)
            .await
            .unwrap();
        writer.await.unwrap();
        assert_eq!(got, big);
        let _ = (d.read(&mut [0u8; 1]).await, d.close().await);
    });
}

#[test]
fn a_compat_stream_used_off_its_shard_fails_each_operation() {
    let rt = runtime();
    let (stream, _peer) = rt.block_on_local(|| async {
        let (a, b) = UnixStream::pair().unwrap();
        (CompatStream::unix(a), CompatStream::unix(b))
    });
    // `Send`: it can travel; used from a plain thread, its I/O fails
    // instead of touching another ring.
    let err = std::thread::spawn(move || {
        let mut stream = stream;
        futures::executor::block_on(async {
            use futures::AsyncWriteExt;
            stream.write_all(b"x").await?;
            stream.flush().await
        })
    })
    .join()
    .unwrap()
    .unwrap_err();
    assert!(
        err.to_string().contains("shard"),
        "the off-shard error: {err}"
    );
}

/// Writes 7s into `socket` (made non-blocking) until the kernel takes no
/// more; how many it took.
fn fill_until_full(socket: &std::os::unix::net::UnixStream) -> usize {
    use std::io::Write;
    socket.set_nonblocking(true).unwrap();
    let mut filled = 0usize;
    let mut writer = socket;
    loop {
        match writer.write(&[7u8; 4096]) {
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return filled,
            Err(e) => panic!("{e}"),
        }
    }
}

/// `n` bytes counting 0 to 250 over and over.
fn patterned(n: u32) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

/// What `peer` receives until the end, read on another thread.
fn read_to_the_end(mut peer: std::os::unix::net::UnixStream) -> Vec<u8> {
    use std::io::Read;
    let reader = std::thread::spawn(move || {
        peer.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let mut got = Vec::new();
        peer.read_to_end(&mut got).map(|_| got)
    });
    reader.join().unwrap().expect("read to the end")
}

/// A flush waits for what was written to be handed to a send, not for the
/// peer to make room for it (a Tokio `TcpStream` flush is just as quick:
/// the kernel holds the bytes); a stream dropped with a send in flight
/// finishes it in the background, so nothing a write accepted is lost.
#[test]
fn a_flush_does_not_wait_for_the_peer_and_a_drop_loses_no_accepted_byte() {
    use tokio::io::AsyncWriteExt;
    let rt = runtime();
    let (ours, peer) = std::os::unix::net::UnixStream::pair().unwrap();
    // Fill the socket until the kernel takes no more: the peer reads
    // nothing yet.
    let filled = fill_until_full(&ours);
    let tail = patterned(10_000);
    let sent = tail.clone();
    let flushed = rt.block_on_local(move || async move {
        let mut stream = CompatStream::unix(UnixStream::from_std(ours).unwrap());
        stream.write_all(&sent).await.unwrap();
        let flushed = mailring::time::timeout(std::time::Duration::from_secs(2), stream.flush())
            .await
            .map(|res| res.is_ok());
        drop(stream);
        flushed
    });
    assert_eq!(flushed, Ok(true), "the flush came back, and well");
    // Now the peer reads: the filler, then every byte of the tail, then
    // the end (the background send closed the stream when it was done).
    let got = read_to_the_end(peer);
    assert_eq!(got.len(), filled + tail.len());
    assert_eq!(&got[filled..], &tail[..]);
    drop(rt);
}

/// A stream dropped off its shard (it is `Send`: hyper may box it and
/// drop it on any thread) with a send in flight and bytes queued behind
/// it: its shard finishes them, so nothing a write accepted is lost.
#[test]
fn a_stream_dropped_off_its_shard_still_sends_every_accepted_byte() {
    use tokio::io::AsyncWriteExt;
    let rt = runtime();
    let (ours, peer) = std::os::unix::net::UnixStream::pair().unwrap();
    let filled = fill_until_full(&ours);
    // More than the stream's own buffer: a send in flight (stuck: the peer
    // reads nothing yet) and a full buffer behind it.
    let tail = patterned(200_000);
    let sent = tail.clone();
    let (stream, accepted) = rt.block_on_local(move || async move {
        let mut stream = CompatStream::unix(UnixStream::from_std(ours).unwrap());
        let mut accepted = 0;
        // Writes until one would wait for room.
        while accepted < sent.len() {
            let write = stream.write(&sent[accepted..]);
            match mailring::time::timeout(std::time::Duration::from_millis(50), write).await {
                Ok(n) => accepted += n.unwrap(),
                Err(_) => break,
            }
        }
        (stream, accepted)
    });
    assert!(accepted > 0 && accepted < tail.len(), "{accepted}");
    // Dropped on another thread, not the shard's.
    std::thread::spawn(move || drop(stream)).join().unwrap();
    let got = read_to_the_end(peer);
    assert_eq!(got.len(), filled + accepted, "every accepted byte");
    assert_eq!(&got[filled..], &tail[..accepted]);
    drop(rt);
}

/// A send that the kernel takes only in part (the peer's buffer nearly
/// full) goes on while the task only reads: a request written and flushed,
/// then a wait for the answer, is not left half sent.
#[test]
fn a_send_taken_in_part_goes_on_while_the_task_reads() {
    request_then_answer(true, false);
}

/// As above without a flush: a Tokio `TcpStream` needs none (the kernel
/// holds what a write took), and the bytes a write accepted behind a send
/// in flight go out when it ends, while the task only reads.
#[test]
fn bytes_written_behind_a_send_in_flight_go_out_while_the_task_reads_without_a_flush() {
    request_then_answer(false, false);
}

/// As above, the stream split between a task that writes (then waits for
/// something else, not the stream) and one that reads.
#[test]
fn bytes_written_behind_a_send_in_flight_go_out_while_another_task_reads() {
    request_then_answer(false, true);
}

/// A 2 MiB request to a peer that reads it slowly (after 200 ms, 1 KiB at
/// a time) and then answers `done`; the request flushed or not, written
/// and read by one task or by two (`split`).
fn request_then_answer(flush: bool, split: bool) {
    use std::io::{Read, Write};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rt = runtime();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let request: Vec<u8> = (0..(2u32 << 20)).map(|i| (i % 253) as u8).collect();
    let expected = request.len();
    // The peer reads nothing for a while (the sends are taken in part),
    // then reads the whole request and answers.
    let peer_side = std::thread::spawn(move || {
        let (mut peer, _) = listener.accept().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        peer.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        // Slowly, a little at a time: the kernel makes room for our sends
        // in small steps, and takes each in part.
        let mut got = vec![0u8; expected];
        let mut at = 0;
        while at < expected {
            let n = peer.read(&mut got[at..(at + 1024).min(expected)])?;
            if n == 0 {
                break;
            }
            at += n;
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
        peer.write_all(b"done")?;
        Ok::<_, std::io::Error>(got[..at].to_vec())
    });
    let answer = rt.block_on_local(move || async move {
        // A small send buffer: the kernel takes a batch in parts.
        let std_tcp = std::net::TcpStream::connect(addr).unwrap();
        socket2::SockRef::from(&std_tcp)
            .set_send_buffer_size(8 << 10)
            .unwrap();
        let tcp = mailring::net::TcpStream::from_std(std_tcp).unwrap();
        let mut stream = CompatStream::tcp(tcp);
        let mut answer = [0u8; 4];
        if split {
            let (mut reader, mut writer) = tokio::io::split(stream);
            let (done, done_rx) = mailring::sync::oneshot::channel::<()>();
            let writing = mailring::spawn_local(async move {
                writer.write_all(&request).await.unwrap();
                // Waits for something else, not the stream.
                let _ = done_rx.await;
                writer
            });
            let got = mailring::time::timeout(
                std::time::Duration::from_secs(10),
                reader.read_exact(&mut answer),
            )
            .await
            .map(|r| r.map(|_| answer));
            let _ = done.send(());
            let _ = writing.await;
            return got;
        }
        stream.write_all(&request).await.unwrap();
        if flush {
            stream.flush().await.unwrap();
        }
        mailring::time::timeout(
            std::time::Duration::from_secs(10),
            stream.read_exact(&mut answer),
        )
        .await
        .map(|r| r.map(|_| answer))
    });
    let got = peer_side.join().unwrap();
    assert_eq!(
        answer
            .expect("no answer: the request was left half sent")
            .unwrap(),
        *b"done"
    );
    assert_eq!(got.unwrap().len(), expected);
    drop(rt);
}

/// A send that the kernel takes only in part goes on while the task that
/// flushed it waits for something else and polls the stream no more (as
/// a Tokio `TcpStream`'s kernel buffer drains whatever its task does):
/// a message written and flushed reaches the peer whole.
#[test]
fn a_send_taken_in_part_goes_on_while_the_task_polls_the_stream_no_more() {
    use std::io::Read;
    use tokio::io::AsyncWriteExt;
    let rt = runtime();
    let (ours, mut peer) = std::os::unix::net::UnixStream::pair().unwrap();
    // A small send buffer, filled until the kernel takes no more: the
    // send of the message waits for room, and each time takes the little
    // that the peer's slow reads make (a unix socket is writable again
    // once three quarters of its buffer are free: less than the message).
    socket2::SockRef::from(&ours)
        .set_send_buffer_size(4 << 10)
        .unwrap();
    let filled = fill_until_full(&ours);
    let message: Vec<u8> = (0..60_000u32).map(|i| (i % 251) as u8).collect();
    let expected_len = filled + message.len();
    let (got_all, got_all_rx) = futures::channel::oneshot::channel::<Vec<u8>>();
    // The peer waits a little, then reads slowly, a little at a time,
    // until it has everything or nothing more comes.
    let peer_side = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(100));
        peer.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let mut got = vec![0u8; expected_len];
        let mut at = 0;
        while at < got.len() {
            let end = (at + 512).min(got.len());
            match peer.read(&mut got[at..end]) {
                Ok(0) | Err(_) => break,
                Ok(n) => at += n,
            }
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
        got.truncate(at);
        let _ = got_all.send(got);
    });
    let sent = message.clone();
    let got = rt.block_on_local(move || async move {
        let mut stream = CompatStream::unix(UnixStream::from_std(ours).unwrap());
        stream.write_all(&sent).await.unwrap();
        stream.flush().await.unwrap();
        // The stream is kept, and not polled, until the peer has read.
        let got = mailring::time::timeout(std::time::Duration::from_secs(20), got_all_rx).await;
        drop(stream);
        got
    });
    peer_side.join().unwrap();
    let got = got.expect("the peer never said").unwrap();
    assert_eq!(
        got.len(),
        expected_len,
        "the message was left part sent while its stream was not polled"
    );
    assert_eq!(&got[filled..], &message[..], "the bytes arrived in order");
    drop(rt);
}

/// A stream dropped while its peer reads nothing leaves a send behind
/// it; shutting the runtime down then does not wait out the linger.
#[test]
fn a_runtime_shuts_down_promptly_past_a_lingering_send() {
    use std::io::Write;
    use tokio::io::AsyncWriteExt;
    let rt = runtime();
    let (ours, peer) = std::os::unix::net::UnixStream::pair().unwrap();
    ours.set_nonblocking(true).unwrap();
    let mut ours_w = &ours;
    while ours_w.write(&[1u8; 4096]).is_ok() {}
    rt.block_on_local(move || async move {
        let mut stream = CompatStream::unix(UnixStream::from_std(ours).unwrap());
        stream.write_all(&[2u8; 1000]).await.unwrap();
        stream.flush().await.unwrap();
        // Dropped with its send stuck behind the full socket.
    });
    let started = std::time::Instant::now();
    let report = rt.shutdown();
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "shutdown waited {:?} for the linger",
        started.elapsed()
    );
    assert_eq!(report.ops_leaked, 0, "{report:?}");
    drop(peer);
}

/// hyper's header read timeout on `ShardTimer`: its deadlines are taken
/// on the runtime's clock (`Timer::now`), the clock its sleeps wait on, so
/// a test clock moved an hour ahead neither fires them at once nor holds
/// them back. A client sending its headers in two parts is served; one
/// that stalls in them is closed.
#[test]
fn the_header_read_timeout_runs_on_the_runtime_clock_and_closes_a_stalled_client() {
    use std::io::{Read, Write};
    let rt = runtime();
    rt.handle()
        .advance_clock(std::time::Duration::from_secs(3600));
    let addr = serve(
        &rt,
        ShardId::new(0),
        Http::OneWithHeaderTimeout(std::time::Duration::from_secs(2)),
        None,
    );
    let guard = Some(std::time::Duration::from_secs(20));
    // Headers in two parts, 50 ms apart: answered.
    let mut good = std::net::TcpStream::connect(addr).unwrap();
    good.set_read_timeout(guard).unwrap();
    good.write_all(b"GET /split HTTP/1.1\r\n").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50));
    good.write_all(b"host: x\r\n\r\n").unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.ends_with(b"GET /split ") {
        let n = good.read(&mut buf).expect("an answer");
        assert!(
            n > 0,
            "closed before its answer: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    // Half a request, then silence: the server closes it.
    let mut stalled = std::net::TcpStream::connect(addr).unwrap();
    stalled.set_read_timeout(guard).unwrap();
    stalled.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n").unwrap();
    let mut rest = Vec::new();
    let closed = stalled.read_to_end(&mut rest);
    assert!(
        closed.is_ok()
            || closed
                .as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "closed by the server, not by the 20 s guard: {closed:?}"
    );
    drop(rt);
}

/// Requests `slow` has begun to serve.
static SLOW_STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Answers after `ms` milliseconds (the path), on a mailring timer.
async fn slow(req: Request<hyper::body::Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    SLOW_STARTED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let ms: u64 = req
        .uri()
        .path()
        .trim_start_matches('/')
        .parse()
        .unwrap_or(0);
    mailring::time::sleep(std::time::Duration::from_millis(ms)).await;
    Ok(Response::new(Full::new(Bytes::from(format!("after {ms}")))))
}

#[test]
fn a_drain_lets_requests_in_flight_finish_and_takes_no_more() {
    use mailring_transports::compat::{serve_until, Drain};
    let rt = runtime();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let drain = Drain::new();
    let served = drain.clone();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let finished = done.clone();
    drop(
        rt.handle()
            .spawn_local_on(ShardId::new(0), move || async move {
                let listener = TcpListener::from_std(listener).unwrap();
                for http in [Http::One, Http::Two] {
                    let (stream, _) = listener.accept().await.unwrap();
                    let (drain, finished) = (served.clone(), finished.clone());
                    drop(mailring::spawn_local(async move {
                        let io = CompatStream::tcp(stream);
                        let service = hyper::service::service_fn(slow);
                        let res = match http {
                            Http::One | Http::OneWithHeaderTimeout(_) => {
                                let conn = hyper::server::conn::http1::Builder::new()
                                    .timer(ShardTimer)
                                    .serve_connection(io, service);
                                serve_until(conn, drain.signaled()).await
                            }
                            Http::Two => {
                                let conn = hyper::server::conn::http2::Builder::new(
                                    ShardExecutor::current(),
                                )
                                .timer(ShardTimer)
                                .serve_connection(io, service);
                                serve_until(conn, drain.signaled()).await
                            }
                        };
                        assert!(res.is_ok(), "{res:?}");
                        finished.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }));
                }
            }),
    );
    let trigger = drain.clone();
    let (one, two) = rt
        .block_on(
            rt.handle()
                .spawn_local_on(ShardId::new(1), move || async move {
                    let io = CompatStream::connect(addr).await.unwrap();
                    let (mut h1, conn1) = hyper::client::conn::http1::handshake(io).await.unwrap();
                    let conn1 = mailring::spawn_local(conn1);
                    let io = CompatStream::connect(addr).await.unwrap();
                    let (mut h2, conn2) =
                        hyper::client::conn::http2::Builder::new(ShardExecutor::current())
                            .handshake(io)
                            .await
                            .unwrap();
                    let conn2 = mailring::spawn_local(conn2);
                    // Two slow requests in flight when the drain starts.
                    let get = |path: &str| {
                        Request::get(path)
                            .header("host", "localhost")
                            .body(Full::new(Bytes::new()))
                            .unwrap()
                    };
                    let r1 = h1.send_request(get("/200"));
                    let r2 = h2.send_request(get("/200"));
                    let trigger_later = mailring::spawn_local(async move {
                        // Once the server serves both (not on a timer: the
                        // drain could otherwise come before the requests).
                        while SLOW_STARTED.load(std::sync::atomic::Ordering::SeqCst) < 2 {
                            mailring::time::sleep(std::time::Duration::from_millis(1)).await;
                        }
                        trigger.trigger();
                    });
                    let (r1, r2) = futures::join!(r1, r2);
                    trigger_later.await.unwrap();
                    let one = read_body(r1.unwrap()).await;
                    let two = read_body(r2.unwrap()).await;
                    // Nothing new: HTTP/1.1 closed after its answer, HTTP/2 sent GOAWAY.
                    assert!(h2.send_request(get("/0")).await.is_err());
                    conn1.await.unwrap().unwrap();
                    conn2.await.unwrap().unwrap();
                    assert!(h1.send_request(get("/0")).await.is_err());
                    (one, two)
                }),
        )
        .unwrap();
    assert_eq!((one.as_str(), two.as_str()), ("after 200", "after 200"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while done.load(std::sync::atomic::Ordering::SeqCst) < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "both connections ended"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

async fn read_body(res: Response<hyper::body::Incoming>) -> String {
    let body = res.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}

/// A write that waits for room while the peer reads nothing, then the
/// peer drains the socket: the writer is woken and finishes, even when
/// the send it then starts completes at once (the kernel takes it whole),
/// leaving nothing on the ring to wake it. A peer that goes away instead
/// ends the write with an error, not a hang.
#[test]
fn a_write_waiting_for_room_finishes_once_the_peer_reads_or_fails_once_it_goes() {
    use std::io::Read;
    use tokio::io::AsyncWriteExt;
    let rt = runtime();
    for peer_goes in [false, true] {
        let (ours, mut peer) = std::os::unix::net::UnixStream::pair().unwrap();
        let reader = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            if peer_goes {
                return 0;
            }
            let mut got = Vec::new();
            peer.read_to_end(&mut got).map_or(0, |_| got.len())
        });
        let wrote = rt.block_on_local(move || async move {
            let mut stream = CompatStream::unix(UnixStream::from_std(ours).unwrap());
            let writing = async {
                stream.write_all(&vec![5u8; 4 << 20]).await?;
                stream.shutdown().await
            };
            mailring::time::timeout(std::time::Duration::from_secs(10), writing).await
        });
        let read = reader.join().unwrap();
        match wrote {
            Ok(Ok(())) => assert!(!peer_goes && read == 4 << 20, "read {read}"),
            Ok(Err(e)) => assert!(peer_goes, "{e}"),
            Err(_) => panic!("the write hung (peer gone: {peer_goes})"),
        }
    }
}

/// A stream shut down twice (tokio's `shutdown`, or futures' `close`
/// repeated by a sink): the second says `Ok` too.
#[test]
fn a_stream_shut_down_twice_says_ok_twice() {
    use tokio::io::AsyncWriteExt;
    let rt = runtime();
    rt.block_on_local(|| async {
        let (a, _b) = UnixStream::pair().unwrap();
        let mut a = CompatStream::unix(a);
        a.write_all(b"x").await.unwrap();
        a.shutdown().await.unwrap();
        a.shutdown().await.unwrap();
        assert!(a.write_all(b"y").await.is_err(), "no write after shutdown");
    });
}

/// Futures waiting on a drain that were dropped (a connection that
/// finished) leave nothing behind: the drain holds no waker of theirs.
#[test]
fn a_drain_keeps_no_waker_of_a_future_dropped_before_it_fired() {
    use std::future::Future;
    use std::task::{Context, Wake, Waker};
    struct Counted;
    impl Wake for Counted {
        fn wake(self: Arc<Self>) {}
    }
    let drain = mailring_transports::compat::Drain::new();
    let counted = Arc::new(Counted);
    let waker = Waker::from(counted.clone());
    for _ in 0..3 {
        let mut signaled = Box::pin(drain.signaled());
        let mut cx = Context::from_waker(&waker);
        assert!(signaled.as_mut().poll(&mut cx).is_pending());
        assert!(signaled.as_mut().poll(&mut cx).is_pending());
    }
    drop(waker);
    assert_eq!(Arc::strong_count(&counted), 1, "a waker was kept");
    // One still waiting is woken when it fires.
    let mut signaled = Box::pin(drain.signaled());
    let mut cx = Context::from_waker(std::task::Waker::noop());
    assert!(signaled.as_mut().poll(&mut cx).is_pending());
    drain.trigger();
    assert!(signaled.as_mut().poll(&mut cx).is_ready());
}

/// A TLS stream written from another thread: the write fails there
/// before any record is sealed, so the connection, back on its shard,
/// still speaks with the peer (a sealed record thrown away would leave a
/// gap in the record numbers, and the peer would refuse every later one).
#[test]
fn a_tls_write_refused_off_its_shard_leaves_the_connection_whole() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = std::env::temp_dir().join(format!("mailring-compat-tls-off-{}", std::process::id()));
    let (cert, key) = common::self_signed_localhost(&dir);
    let acceptor = TlsAcceptor::from_pem_files(&cert, &key).unwrap();
    let client_config = Arc::new(tls::client_config_from_ca_pem_file(&cert).unwrap());
    let rt = runtime();
    let (client, server) = rt.block_on_local(move || async move {
        let listener = TcpListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr();
        let accepting = mailring::spawn_local(async move {
            let (s, _) = listener.accept().await.unwrap();
            CompatStream::accept_tls(s, &acceptor).await.unwrap()
        });
        let client = CompatStream::connect_tls(addr, "localhost", client_config)
            .await
            .unwrap();
        (client, accepting.await.unwrap())
    });
    let client = std::thread::spawn(move || {
        let mut client = client;
        let res = futures::executor::block_on(async {
            client.write_all(b"x").await?;
            client.flush().await
        });
        assert!(res.is_err(), "the write off its shard failed");
        client
    })
    .join()
    .unwrap();
    let got = rt.block_on_local(move || async move {
        let (mut client, mut server) = (client, server);
        client.write_all(b"y").await.unwrap();
        client.flush().await.unwrap();
        let mut got = [0u8; 1];
        let read = mailring::time::timeout(
            std::time::Duration::from_secs(5),
            server.read_exact(&mut got),
        )
        .await;
        (read.map(|r| r.map(|_| got)), client)
    });
    match got.0 {
        Ok(Ok(got)) => assert_eq!(&got, b"y"),
        other => panic!("the peer did not read the later write: {other:?}"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A TLS stream whose last send is stuck behind a peer that reads
/// nothing, and which then only reads (as a task may): a bad record from
/// the peer ends the read with an error at once. The read does not wait
/// to send its alert behind the stuck send, whose future nobody polls.
#[test]
fn a_bad_record_ends_a_read_while_an_unpolled_send_is_stuck() {
    use std::io::Write;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir =
        std::env::temp_dir().join(format!("mailring-compat-tls-stuck-{}", std::process::id()));
    let (cert, key) = common::self_signed_localhost(&dir);
    let server_config = Arc::new(tls::server_config_from_pem_files(&cert, &key).unwrap());
    let client_config = Arc::new(tls::client_config_from_ca_pem_file(&cert).unwrap());
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (go, sent_garbage) = std::sync::mpsc::channel::<()>();
    let (done, finished) = std::sync::mpsc::channel::<()>();
    // The peer: a handshake, then (when told) a record that fails to
    // decrypt, and never a byte read after the handshake.
    let peer = std::thread::spawn(move || {
        let (mut sock, _) = listener.accept().unwrap();
        let mut conn = rustls::ServerConnection::new(server_config).unwrap();
        while conn.is_handshaking() {
            conn.complete_io(&mut sock).unwrap();
        }
        let _ = sent_garbage.recv();
        let mut record = vec![0x17, 0x03, 0x03, 0x00, 0x40];
        record.extend([0xa5u8; 64]);
        sock.write_all(&record).unwrap();
        let _ = finished.recv_timeout(std::time::Duration::from_secs(10));
    });
    let rt = runtime();
    let read = rt.block_on_local(move || async move {
        let mut stream = CompatStream::connect_tls(addr, "localhost", client_config)
            .await
            .unwrap();
        // Write until a write stops for want of room: a send is stuck on
        // the ring, its future left unpolled from then on.
        let chunk = vec![1u8; 64 << 10];
        for _ in 0..1000 {
            let wrote = mailring::time::timeout(
                std::time::Duration::from_millis(50),
                stream.write_all(&chunk),
            )
            .await;
            if wrote.is_err() {
                break;
            }
        }
        go.send(()).unwrap();
        let mut buf = [0u8; 16];
        mailring::time::timeout(std::time::Duration::from_secs(5), stream.read(&mut buf)).await
    });
    done.send(()).unwrap();
    match read {
        Ok(Err(e)) => assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}"),
        other => panic!("the read should fail at once, got {other:?}"),
    }
    peer.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A stream split into a reading task and a writing task (a WebSocket's
/// halves, any full-duplex protocol run in two tasks): the reader's polls
/// do not take the writer's wake-up. The writer waits for a send in flight
/// (the peer echoes, so the kernel takes the 8 MiB a part at a time) while
/// the reader is polled for every echoed part.
#[test]
fn a_stream_split_into_a_reading_and_a_writing_task_moves_both_ways() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const TOTAL: usize = 8 << 20;
    let rt = runtime();
    let (ours, peer) = std::os::unix::net::UnixStream::pair().unwrap();
    let echo = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let mut peer = peer;
        peer.set_read_timeout(Some(std::time::Duration::from_secs(20)))
            .unwrap();
        let mut buf = vec![0u8; 64 << 10];
        let mut echoed = 0;
        while echoed < TOTAL {
            let n = peer.read(&mut buf)?;
            if n == 0 {
                break;
            }
            peer.write_all(&buf[..n])?;
            echoed += n;
        }
        Ok::<_, std::io::Error>(echoed)
    });
    let (wrote, read) = rt.block_on_local(move || async move {
        let stream = CompatStream::unix(UnixStream::from_std(ours).unwrap());
        let (mut rx, mut tx) = tokio::io::split(stream);
        let reader = mailring::spawn_local(async move {
            let mut buf = vec![0u8; 64 << 10];
            let mut got = 0;
            while got < TOTAL {
                match rx.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got += n,
                }
            }
            got
        });
        let writer = mailring::spawn_local(async move {
            let data = patterned(TOTAL as u32);
            tx.write_all(&data).await?;
            tx.flush().await?;
            Ok::<_, std::io::Error>(tx)
        });
        let limit = std::time::Duration::from_secs(10);
        let wrote = mailring::time::timeout(limit, writer).await;
        let read = mailring::time::timeout(limit, reader).await;
        (
            wrote.map(|w| w.unwrap().map(|_| ()).is_ok()),
            read.map(|r| r.unwrap()),
        )
    });
    assert_eq!(wrote, Ok(true), "the writer hung or failed");
    assert_eq!(read, Ok(TOTAL), "the reader hung");
    assert_eq!(echo.join().unwrap().unwrap(), TOTAL);
    drop(rt);
}
