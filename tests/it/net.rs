//! TCP over loopback: accept, connect, send/recv with owned buffers, shutdown,
//! errors, and cancellation of pending accepts and receives.

use std::io::ErrorKind;
use std::net::{Shutdown, SocketAddr};
use std::time::Duration;

use mailring::net::{TcpListener, TcpStream};
use mailring::{Placement, ShardId};

use crate::rt2;

fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

#[test]
fn echo_many_connections_across_shards() {
    let rt = rt2();
    let total = rt.block_on(async {
        let listener = TcpListener::bind(any_port()).unwrap();
        let addr = listener.local_addr();
        const CLIENTS: usize = 20;
        // The server accepts on shard 0 and echoes each connection on shard 0.
        let server = mailring::spawn_local(async move {
            let mut handles = Vec::new();
            for _ in 0..CLIENTS {
                let (conn, peer) = listener.accept().await.unwrap();
                assert_eq!(peer.ip(), addr.ip());
                handles.push(mailring::spawn_local(async move {
                    let mut buf = Vec::with_capacity(1024);
                    loop {
                        let (n, back) = conn.recv(buf).await;
                        let n = n.unwrap();
                        if n == 0 {
                            break;
                        }
                        let (r, back) = conn.send_all(back).await;
                        r.unwrap();
                        buf = back;
                        buf.clear();
                    }
                }));
            }
            for h in handles {
                h.await.unwrap();
            }
        });
        // Clients on both shards, each sending 100 messages.
        let mut clients = Vec::new();
        for c in 0..CLIENTS {
            clients.push(mailring::spawn_with(
                Placement::Pinned(ShardId::new(c % 2)),
                async move {
                    let stream = TcpStream::connect(addr).await.unwrap();
                    stream.set_nodelay(true).unwrap();
                    assert!(stream.nodelay().unwrap());
                    assert_eq!(stream.peer_addr().unwrap(), addr);
                    let mut echoed = 0usize;
                    for i in 0..100u32 {
                        let msg = format!("client {c} message {i}").into_bytes();
                        let len = msg.len();
                        let (r, _) = stream.send_all(msg).await;
                        r.unwrap();
                        let mut got = Vec::new();
                        while got.len() < len {
                            let (n, buf) = stream.recv(Vec::with_capacity(len - got.len())).await;
                            assert!(n.unwrap() > 0);
                            got.extend_from_slice(&buf);
                        }
                        assert_eq!(got, format!("client {c} message {i}").into_bytes());
                        echoed += len;
                    }
                    stream.shutdown(Shutdown::Write).await.unwrap();
                    echoed
                },
            ));
        }
        let mut total = 0;
        for c in clients {
            total += c.await.unwrap();
        }
        server.await.unwrap();
        total
    });
    assert!(total > 20 * 100 * 15);
}

#[test]
fn large_transfer_with_short_sends_and_receives() {
    let rt = rt2();
    rt.block_on(async {
        let listener = TcpListener::bind(any_port()).unwrap();
        let addr = listener.local_addr();
        let payload: Vec<u8> = (0..8u32 << 20).map(|i| (i % 253) as u8).collect();
        let expected = payload.clone();
        let sender = mailring::spawn_local(async move {
            let (conn, _) = listener.accept().await.unwrap();
            let (r, _) = conn.send_all(payload).await;
            r.unwrap();
            conn.shutdown(Shutdown::Write).await.unwrap();
        });
        let stream = TcpStream::connect(addr).await.unwrap();
        let mut got = Vec::with_capacity(expected.len());
        loop {
            let (n, buf) = stream.recv(Vec::with_capacity(64 * 1024)).await;
            if n.unwrap() == 0 {
                break;
            }
            got.extend_from_slice(&buf);
        }
        sender.await.unwrap();
        assert_eq!(got.len(), expected.len());
        assert!(got == expected);
    });
}

#[test]
fn connect_refused_and_bind_in_use_are_errors() {
    let rt = rt2();
    rt.block_on(async {
        // Bind a port, then close it: connecting must be refused.
        let port = std::net::TcpListener::bind(any_port())
            .unwrap()
            .local_addr()
            .unwrap();
        let err = TcpStream::connect(port).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ConnectionRefused);
        assert!(err.to_string().contains(&port.to_string()), "{err}");
        let held = std::net::TcpListener::bind(any_port()).unwrap();
        let err = TcpListener::bind(held.local_addr().unwrap()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::AddrInUse);
    });
}

#[test]
fn dropped_accepts_and_receives_are_cancelled() {
    let rt = rt2();
    rt.block_on(async {
        let listener = TcpListener::bind(any_port()).unwrap();
        let addr = listener.local_addr();
        for _ in 0..500 {
            assert!(mailring::time::timeout(Duration::ZERO, listener.accept())
                .await
                .is_err());
        }
        // The listener still works after its cancelled accepts.
        let client = mailring::spawn_local(async move { TcpStream::connect(addr).await.unwrap() });
        // Right after the cancellations, in the same tick: the new accept must
        // not lose the connection to a cancelled one.
        let accepted = mailring::time::timeout(Duration::from_secs(5), listener.accept()).await;
        let (server_side, _) = accepted
            .expect("a cancelled accept swallowed the connection")
            .unwrap();
        let client = client.await.unwrap();
        for _ in 0..500 {
            let recv = server_side.recv(vec![0u8; 1024]);
            assert!(mailring::time::timeout(Duration::ZERO, recv).await.is_err());
        }
        // Everything cancelled settles back to the shard's own armed operations.
        let mut settled = false;
        for _ in 0..200 {
            mailring::time::sleep(Duration::from_millis(1)).await;
            if mailring::Handle::current().stats().shards[0].ops_in_flight <= 2 {
                settled = true;
                break;
            }
        }
        assert!(settled, "cancelled operations still in flight");
        let (r, _) = client.send_all(b"after".to_vec()).await;
        r.unwrap();
        let (n, buf) = server_side.recv(Vec::with_capacity(16)).await;
        assert_eq!(n.unwrap(), 5);
        assert_eq!(buf, b"after");
    });
}

#[test]
fn udp_datagrams_keep_boundaries_and_senders() {
    let rt = rt2();
    rt.block_on(async {
        use mailring::net::UdpSocket;
        let a = UdpSocket::bind(any_port()).unwrap();
        let b = UdpSocket::bind(any_port()).unwrap();
        let (a_addr, b_addr) = (a.local_addr().unwrap(), b.local_addr().unwrap());
        for i in 0..50u8 {
            let (r, _) = a.send_to(vec![i; 1 + i as usize], b_addr).await;
            assert_eq!(r.unwrap(), 1 + i as usize);
        }
        for i in 0..50u8 {
            let (r, buf) = b.recv_from(Vec::with_capacity(256)).await;
            let (n, from) = r.unwrap();
            assert_eq!((n, from), (1 + i as usize, a_addr));
            assert!(buf.iter().all(|&x| x == i));
        }
        // Truncation: a datagram longer than the buffer is cut, not split.
        a.send_to(vec![9u8; 100], b_addr).await.0.unwrap();
        let (r, buf) = b.recv_from(Vec::with_capacity(10)).await;
        assert_eq!(r.unwrap().0, 10);
        assert_eq!(buf.len(), 10);
        // Connected sockets.
        a.connect(b_addr).unwrap();
        b.connect(a_addr).unwrap();
        a.send(b"connected".to_vec()).await.0.unwrap();
        let (n, buf) = b.recv(Vec::with_capacity(32)).await;
        assert_eq!(n.unwrap(), 9);
        assert_eq!(buf, b"connected");
    });
}

#[test]
fn unix_streams_and_datagrams() {
    use mailring::net::{UnixDatagram, UnixListener, UnixStream};
    let dir = std::env::temp_dir().join(format!("mailring-unix-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let rt = rt2();
    let d = dir.clone();
    rt.block_on(async move {
        let sock = d.join("stream.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        let server = mailring::spawn_local(async move {
            let conn = listener.accept().await.unwrap();
            let (n, buf) = conn.recv(Vec::with_capacity(64)).await;
            n.unwrap();
            conn.send_all(buf).await.0.unwrap();
            conn.shutdown(Shutdown::Both).await.unwrap();
        });
        let client = UnixStream::connect(&sock).await.unwrap();
        client.send_all(b"over unix".to_vec()).await.0.unwrap();
        let (n, buf) = client.recv(Vec::with_capacity(64)).await;
        assert_eq!(n.unwrap(), 9);
        assert_eq!(buf, b"over unix");
        let (n, _) = client.recv(Vec::with_capacity(8)).await;
        assert_eq!(n.unwrap(), 0, "peer shut down");
        server.await.unwrap();
        let err = UnixStream::connect(d.join("missing.sock"))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound);

        let (x, y) = UnixStream::pair().unwrap();
        x.send(b"pair".to_vec()).await.0.unwrap();
        let (n, buf) = y.recv(Vec::with_capacity(8)).await;
        assert_eq!((n.unwrap(), &buf[..]), (4, &b"pair"[..]));

        let server_path = d.join("dgram.sock");
        let client_path = d.join("client.sock");
        let server = UnixDatagram::bind(&server_path).unwrap();
        let client = UnixDatagram::bind(&client_path).unwrap();
        client
            .send_to(b"dgram".to_vec(), &server_path)
            .await
            .0
            .unwrap();
        let (r, buf) = server.recv_from(Vec::with_capacity(16)).await;
        let (n, from) = r.unwrap();
        assert_eq!((n, &buf[..]), (5, &b"dgram"[..]));
        assert_eq!(from.as_deref(), Some(client_path.as_path()));
        let anon = UnixDatagram::unbound().unwrap();
        anon.send_to(b"anon".to_vec(), &server_path)
            .await
            .0
            .unwrap();
        let (r, _) = server.recv_from(Vec::with_capacity(16)).await;
        assert_eq!(r.unwrap().1, None);
    });
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn multishot_accept_queues_connections_for_dropped_accepts() {
    let rt = rt2();
    rt.block_on(async {
        let listener = TcpListener::bind(any_port()).unwrap();
        let addr = listener.local_addr();
        // Arm the multishot accept, then drop the future.
        assert!(mailring::time::timeout(Duration::ZERO, listener.accept())
            .await
            .is_err());
        // Ten clients connect while nobody is accepting.
        let mut clients = Vec::new();
        for _ in 0..10 {
            clients.push(TcpStream::connect(addr).await.unwrap());
        }
        // Each is still there, with dropped accepts in between.
        for i in 0..10 {
            assert!(
                mailring::time::timeout(Duration::ZERO, std::future::pending::<()>())
                    .await
                    .is_err()
            );
            let (conn, peer) = mailring::time::timeout(Duration::from_secs(5), listener.accept())
                .await
                .unwrap_or_else(|_| panic!("connection {i} was lost"))
                .unwrap();
            assert_eq!(peer.ip(), addr.ip());
            drop(conn);
        }
        drop(clients);
    });
}

#[test]
fn zero_copy_send_delivers_and_returns_the_buffer_after_release() {
    let rt = rt2();
    rt.block_on(async {
        let listener = TcpListener::bind(any_port()).unwrap();
        let addr = listener.local_addr();
        let payload: Vec<u8> = (0..4u32 << 20).map(|i| (i % 241) as u8).collect();
        let expected = payload.clone();
        let sender = mailring::spawn_local(async move {
            let (conn, _) = listener.accept().await.unwrap();
            let (r, back) = conn.send_all_zc(payload).await;
            r.unwrap();
            conn.shutdown(Shutdown::Write).await.unwrap();
            back.len()
        });
        let stream = TcpStream::connect(addr).await.unwrap();
        let mut got = Vec::with_capacity(expected.len());
        loop {
            let (n, buf) = stream.recv(Vec::with_capacity(256 * 1024)).await;
            if n.unwrap() == 0 {
                break;
            }
            got.extend_from_slice(&buf);
        }
        assert_eq!(
            sender.await.unwrap(),
            4 << 20,
            "the buffer comes back whole"
        );
        assert!(got == expected);
        // Nothing is left waiting for a notification.
        let mut settled = false;
        for _ in 0..100 {
            if mailring::Handle::current().stats().shards[0].ops_in_flight <= 3 {
                settled = true;
                break;
            }
            mailring::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(settled);
    });
}

#[test]
fn multishot_receive_with_a_buffer_ring_loses_nothing_when_buffers_run_out() {
    use mailring::buf::BufRing;
    let rt = rt2();
    rt.block_on(async {
        // Two 64-byte buffers for 64 KiB of data: the ring runs dry constantly.
        let ring = BufRing::new(2, 64).unwrap();
        let listener = TcpListener::bind(any_port()).unwrap();
        let addr = listener.local_addr();
        let payload: Vec<u8> = (0..64u32 << 10).map(|i| (i % 239) as u8).collect();
        let expected = payload.clone();
        let sender = mailring::spawn_local(async move {
            let stream = TcpStream::connect(addr).await.unwrap();
            stream.send_all(payload).await.0.unwrap();
            stream.shutdown(Shutdown::Write).await.unwrap();
        });
        let (conn, _) = listener.accept().await.unwrap();
        let mut incoming = conn.recv_multishot(&ring);
        let mut got = Vec::new();
        let mut held = Vec::new();
        while let Some(buf) = incoming.next().await {
            let buf = buf.unwrap();
            got.extend_from_slice(&buf);
            // Hold buffers for a while so the kernel hits ENOBUFS, then let go.
            held.push(buf);
            if held.len() == 2 {
                mailring::time::sleep(Duration::from_micros(200)).await;
                held.clear();
            }
        }
        sender.await.unwrap();
        assert_eq!(got.len(), expected.len());
        assert!(got == expected, "data lost or reordered");
    });
}

#[test]
fn connections_share_a_buffer_ring_and_dropped_receives_return_buffers() {
    use mailring::buf::BufRing;
    let rt = rt2();
    rt.block_on(async {
        let ring = BufRing::new(8, 1024).unwrap();
        let listener = TcpListener::bind(any_port()).unwrap();
        let addr = listener.local_addr();
        let mut servers = Vec::new();
        let mut clients = Vec::new();
        for _ in 0..4 {
            clients.push(TcpStream::connect(addr).await.unwrap());
            servers.push(listener.accept().await.unwrap().0);
        }
        for round in 0..20u8 {
            for (i, c) in clients.iter().enumerate() {
                c.send_all(vec![round ^ i as u8; 100]).await.0.unwrap();
            }
            for (i, s) in servers.iter().enumerate() {
                let mut incoming = s.recv_multishot(&ring);
                let mut n = 0;
                while n < 100 {
                    let buf = incoming.next().await.unwrap().unwrap();
                    assert!(buf.iter().all(|&b| b == round ^ i as u8));
                    n += buf.len();
                }
                // Dropping the stream cancels the receive and returns its buffers:
                // with only 8 buffers, 80 receives would stall if any leaked.
                drop(incoming);
            }
        }
    });
}

#[test]
fn a_receive_that_finds_a_shared_ring_filled_for_another_connection_waits_for_a_buffer() {
    a_receive_finds_a_shared_ring_filled(rt2());
}

/// The same where the kernel cannot say how many buffers it still holds
/// (before Linux 6.8): the receive waits, it does not end as if its peer
/// had closed.
#[test]
fn without_the_buffer_status_a_receive_on_a_shared_ring_filled_for_another_still_waits() {
    let mut faults = mailring::FaultInjection::default();
    faults.no_buf_ring_status = true;
    let rt = mailring::Runtime::builder()
        .shards(2)
        .fault_injection(faults)
        .build()
        .expect("io_uring runtime");
    a_receive_finds_a_shared_ring_filled(rt);
}

fn a_receive_finds_a_shared_ring_filled(rt: mailring::Runtime) {
    use mailring::buf::BufRing;
    rt.block_on(async {
        let ring = BufRing::new(2, 64).unwrap();
        let listener = TcpListener::bind(any_port()).unwrap();
        let addr = listener.local_addr();
        let client_a = TcpStream::connect(addr).await.unwrap();
        let (server_a, _) = listener.accept().await.unwrap();
        let client_b = TcpStream::connect(addr).await.unwrap();
        let (server_b, _) = listener.accept().await.unwrap();
        // A's receive is armed, and its peer's bytes fill both buffers;
        // A's task does not take them yet.
        let mut in_a = server_a.recv_multishot(&ring);
        {
            let mut first = std::pin::pin!(in_a.next());
            std::future::poll_fn(|cx| {
                assert!(std::future::Future::poll(first.as_mut(), cx).is_pending());
                std::task::Poll::Ready(())
            })
            .await;
        }
        client_a.send_all(vec![b'a'; 200]).await.0.unwrap();
        mailring::time::sleep(Duration::from_millis(20)).await;
        // B finds no buffer in the kernel's hands: it waits, it does not
        // fail (nor end).
        client_b.send_all(vec![b'b'; 10]).await.0.unwrap();
        let mut in_b = server_b.recv_multishot(&ring);
        let early = mailring::time::timeout(Duration::from_millis(200), in_b.next()).await;
        assert!(
            early.is_err(),
            "B's receive ended: {:?}",
            early.map(|r| r.map(|b| b.map(|b| b.len())))
        );
        // A takes its bytes and lets the buffers go; B then gets its own.
        let mut a_got = 0;
        while a_got < 200 {
            a_got += in_a.next().await.unwrap().unwrap().len();
        }
        let b = in_b.next().await.unwrap().unwrap();
        assert_eq!(&b[..], &[b'b'; 10][..]);
    });
}

#[test]
fn an_accept_waiting_when_another_task_pauses_the_listener_still_gets_connections() {
    use std::sync::Arc;
    let rt = rt2();
    rt.block_on(async {
        let listener = Arc::new(TcpListener::bind(any_port()).unwrap());
        let addr = listener.local_addr();
        let took_first = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let waiting = mailring::spawn_local({
            let listener = listener.clone();
            let took_first = took_first.clone();
            async move {
                let a = listener.accept().await.unwrap().1;
                took_first.store(true, std::sync::atomic::Ordering::SeqCst);
                // Waiting here when another task pauses the listener.
                let b = listener.accept().await.unwrap().1;
                (a, b)
            }
        });
        let first = TcpStream::connect(addr).await.unwrap();
        while !took_first.load(std::sync::atomic::Ordering::SeqCst) {
            mailring::time::sleep(Duration::from_millis(1)).await;
        }
        mailring::time::sleep(Duration::from_millis(20)).await;
        listener.pause_accepting();
        let second = TcpStream::connect(addr).await.unwrap();
        let got = mailring::time::timeout(Duration::from_secs(2), waiting)
            .await
            .expect("the waiting accept was never woken after the pause")
            .unwrap();
        assert_eq!(
            got,
            (first.local_addr().unwrap(), second.local_addr().unwrap())
        );
    });
}

/// Connections the kernel accepts while a pause's cancel is under way
/// (here: the whole backlog, accepted by a multishot submitted just before
/// the pause) are kept for the next `accept()`, not closed: their clients
/// would see a reset.
#[test]
fn connections_accepted_while_a_pause_cancels_the_accept_are_kept() {
    use std::future::Future;
    let rt = rt2();
    rt.block_on(async {
        let listener = TcpListener::bind(any_port()).unwrap();
        let addr = listener.local_addr();
        // Clients that wait in the listen backlog (connected as far as
        // the kernel is concerned).
        let mut clients = Vec::new();
        for _ in 0..20 {
            clients.push(std::net::TcpStream::connect(addr).unwrap());
        }
        {
            // An accept polled once (its multishot goes to the ring), then
            // a pause before any of its results is taken.
            let mut first = std::pin::pin!(listener.accept());
            std::future::poll_fn(|cx| {
                if let std::task::Poll::Ready(r) = first.as_mut().poll(cx) {
                    // Served at once: it took a kept connection; keep it too.
                    drop(r);
                    panic!("the first accept had nothing to take yet");
                }
                std::task::Poll::Ready(())
            })
            .await;
            listener.pause_accepting();
        }
        mailring::time::sleep(Duration::from_millis(50)).await;
        let mut peers = std::collections::HashSet::new();
        for _ in 0..clients.len() {
            let (_, peer) = mailring::time::timeout(Duration::from_secs(2), listener.accept())
                .await
                .expect("a connection of the backlog never came: closed during the pause")
                .unwrap();
            peers.insert(peer);
        }
        let ours: std::collections::HashSet<_> =
            clients.iter().map(|c| c.local_addr().unwrap()).collect();
        assert_eq!(peers, ours);
    });
}

/// A connected pair (client, server) whose server side had a `recv`
/// dropped after the kernel filled its buffer with `data`.
async fn pair_with_lost_bytes(data: &'static [u8]) -> (TcpStream, TcpStream) {
    use std::future::Future;
    let listener = TcpListener::bind(any_port()).unwrap();
    let client = TcpStream::connect(listener.local_addr()).await.unwrap();
    let (server, _) = listener.accept().await.unwrap();
    {
        let mut pending = std::pin::pin!(server.recv(Vec::with_capacity(64)));
        // Submit the receive, then let the data land in its buffer.
        std::future::poll_fn(|cx| {
            assert!(pending.as_mut().poll(cx).is_pending());
            std::task::Poll::Ready(())
        })
        .await;
        client.send_all(data.to_vec()).await.0.unwrap();
        mailring::time::sleep(Duration::from_millis(20)).await;
    } // dropped with the bytes in its buffer
    (client, server)
}

#[test]
fn data_taken_by_a_dropped_recv_is_reported_not_silently_lost() {
    let rt = rt2();
    rt.block_on(async {
        let (client, server) = pair_with_lost_bytes(b"0123456789").await;
        let (r, _) = server.recv(Vec::with_capacity(64)).await;
        let err = r.unwrap_err();
        assert!(err.to_string().contains("10 bytes"), "{err}");
        // Typed: a framed protocol above tells it from other errors.
        assert!(mailring::net::LostBytes::is(&err), "{err:?}");
        let lost = err
            .get_ref()
            .and_then(|e| e.downcast_ref::<mailring::net::LostBytes>());
        assert_eq!(lost.map(|l| l.bytes), Some(10));
        // The stream goes on.
        client.send_all(b"next".to_vec()).await.0.unwrap();
        let (n, buf) = server.recv(Vec::with_capacity(64)).await;
        assert_eq!((n.unwrap(), &buf[..]), (4, &b"next"[..]));
    });
}

/// Bytes a dropped `recv` took are reported by the stream's next `recv`,
/// also when the stream was to move meanwhile: `into_std` gives the stream
/// back until they are, rather than hand over a descriptor whose data has
/// a gap nobody would be told of.
#[test]
fn a_stream_with_unreported_lost_bytes_is_not_turned_into_a_std_stream() {
    let rt = rt2();
    rt.block_on(async {
        let (client, server) = pair_with_lost_bytes(b"abcdefgh").await;
        let server = match server.into_std() {
            Ok(_) => panic!("moved with 8 lost bytes unreported"),
            Err(server) => server,
        };
        let (r, _) = server.recv(Vec::with_capacity(64)).await;
        let err = r.unwrap_err();
        assert!(err.to_string().contains("8 bytes"), "{err}");
        // Reported: it moves now.
        let std_stream = server.into_std().expect("moves once reported");
        let server = TcpStream::from_std(std_stream).unwrap();
        client.send_all(b"next".to_vec()).await.0.unwrap();
        let (n, buf) = server.recv(Vec::with_capacity(64)).await;
        assert_eq!((n.unwrap(), &buf[..]), (4, &b"next"[..]));
    });
}

#[test]
fn a_stream_moves_to_another_shard_explicitly_and_host_names_resolve() {
    let rt = rt2();
    let handle = rt.handle().clone();
    rt.block_on(async move {
        let listener = TcpListener::bind(any_port()).unwrap();
        let port = listener.local_addr().port();
        let client = TcpStream::connect_host(&format!("localhost:{port}"))
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        // Move the server side to shard 1 and use it there.
        let std_stream = server.into_std().unwrap();
        let echoed = handle.spawn_on(ShardId::new(1), async move {
            let server = TcpStream::from_std(std_stream).unwrap();
            let (n, buf) = server.recv(Vec::with_capacity(16)).await;
            n.unwrap();
            server.send_all(buf).await.0.unwrap();
            mailring::current_shard()
        });
        client.send_all(b"moved".to_vec()).await.0.unwrap();
        let (n, buf) = client.recv(Vec::with_capacity(16)).await;
        assert_eq!((n.unwrap(), &buf[..]), (5, &b"moved"[..]));
        assert_eq!(echoed.await.unwrap(), Some(ShardId::new(1)));
        // No port: rejected by the resolver without any lookup.
        let err = TcpStream::connect_host("localhost").await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    });
}

#[test]
fn incremental_buffer_rings_pack_small_messages_into_one_buffer() {
    use mailring::buf::BufRing;
    let rt = rt2();
    rt.block_on(async {
        // One 4 KiB buffer: without incremental consumption, holding three
        // received messages at once would need three buffers.
        let ring = BufRing::new(1, 4096).unwrap();
        if !ring.is_incremental() {
            eprintln!("skipping: the kernel lacks IOU_PBUF_RING_INC");
            return;
        }
        let (a, b) = mailring::net::UnixStream::pair().unwrap();
        let mut incoming = b.recv_multishot(&ring);
        let mut held = Vec::new();
        for i in 0..3u8 {
            a.send_all(vec![i; 100]).await.0.unwrap();
            let buf = incoming.next().await.unwrap().unwrap();
            assert_eq!(&buf[..], &[i; 100][..]);
            held.push(buf);
        }
        assert!(held.iter().all(|b| b.len() == 100));
        drop(held);
        // The buffer comes back once all three are dropped; traffic continues.
        for round in 0..50u8 {
            a.send_all(vec![round; 1000]).await.0.unwrap();
            let mut got = 0;
            while got < 1000 {
                let buf = incoming.next().await.unwrap().unwrap();
                assert!(buf.iter().all(|&x| x == round));
                got += buf.len();
            }
        }
    });
}

#[test]
fn multishot_datagram_receive_keeps_each_datagram_and_its_sender_when_buffers_run_out() {
    use mailring::buf::BufRing;
    use mailring::net::UdpSocket;
    let rt = rt2();
    rt.block_on(async {
        // Two buffers for 200 datagrams from two peers: the ring runs dry
        // constantly and the receive is armed again each time.
        let ring = BufRing::whole(2, 256).unwrap();
        let server = UdpSocket::bind(any_port()).unwrap();
        let to = server.local_addr().unwrap();
        let a = UdpSocket::bind(any_port()).unwrap();
        let b = UdpSocket::bind(any_port()).unwrap();
        let mut incoming = server.recv_from_multishot(&ring);
        for i in 0..100u32 {
            a.send_to(format!("a{i}").into_bytes(), to).await.0.unwrap();
            b.send_to(format!("b{i}").into_bytes(), to).await.0.unwrap();
        }
        let mut next = [0u32; 2];
        let mut held = Vec::new();
        for k in 0..200 {
            let d = mailring::time::timeout(Duration::from_secs(5), incoming.next())
                .await
                .expect("no datagram lost")
                .expect("armed")
                .unwrap_or_else(|e| panic!("datagram {k}: {e}"));
            let which = if d.peer() == a.local_addr().unwrap() {
                0
            } else {
                assert_eq!(d.peer(), b.local_addr().unwrap());
                1
            };
            let want = format!("{}{}", ["a", "b"][which], next[which]);
            assert_eq!(d.payload(), want.as_bytes());
            assert!(!d.is_truncated());
            next[which] += 1;
            // Hold both buffers for a moment, so the kernel finds none.
            held.push(d);
            if held.len() == 2 {
                mailring::time::sleep(Duration::from_micros(200)).await;
                held.clear();
            }
        }
        assert_eq!(next, [100, 100]);
    });
}

#[test]
fn a_datagram_longer_than_a_multishot_buffer_is_cut_and_said_to_be() {
    use mailring::buf::BufRing;
    use mailring::net::UdpSocket;
    let rt = rt2();
    rt.block_on(async {
        // 256-byte buffers leave 212 bytes for a payload (16 of header, 28
        // of address).
        let ring = BufRing::whole(4, 256).unwrap();
        let server = UdpSocket::bind(any_port()).unwrap();
        let to = server.local_addr().unwrap();
        let peer = UdpSocket::bind(any_port()).unwrap();
        let mut incoming = server.recv_from_multishot(&ring);
        let long: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        peer.send_to(long.clone(), to).await.0.unwrap();
        peer.send_to(b"after".to_vec(), to).await.0.unwrap();
        let cut = incoming.next().await.unwrap().unwrap();
        assert!(cut.is_truncated());
        assert_eq!(cut.payload(), &long[..256 - 44]);
        let after = incoming.next().await.unwrap().unwrap();
        assert!(!after.is_truncated());
        assert_eq!(after.payload(), b"after");
        assert_eq!(after.peer(), peer.local_addr().unwrap());
    });
}

#[test]
fn a_multishot_datagram_receive_from_the_wrong_shard_or_ring_fails() {
    use mailring::buf::BufRing;
    use mailring::net::UdpSocket;
    let rt = rt2();
    let h = rt.handle().clone();
    rt.block_on(async move {
        let ring1 = h
            .spawn_on(ShardId::new(1), async { BufRing::whole(4, 256) })
            .await
            .unwrap()
            .unwrap();
        h.spawn_on(ShardId::new(0), async move {
            // A ring the kernel consumes a part at a time: refused.
            let server = UdpSocket::bind(any_port()).unwrap();
            let partial = BufRing::new(4, 256).unwrap();
            if partial.is_incremental() {
                let mut incoming = server.recv_from_multishot(&partial);
                let err = incoming
                    .next()
                    .await
                    .expect("an item")
                    .expect_err("a ring of parts");
                assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{err}");
                // Said once, then the stream ends: a loop that logs the
                // error and goes on does not spin on it.
                assert!(incoming.next().await.is_none());
            }
            let mut incoming = server.recv_from_multishot(&ring1);
            let err = mailring::time::timeout(Duration::from_secs(5), incoming.next())
                .await
                .expect("an answer")
                .expect("an item")
                .expect_err("a ring of shard 1");
            assert!(err.to_string().contains("another shard"), "{err}");
            assert!(incoming.next().await.is_none(), "ended after the error");
        })
        .await
        .unwrap();
    });
}

#[test]
fn multishot_datagram_receive_reads_ipv6_senders() {
    use mailring::buf::BufRing;
    use mailring::net::UdpSocket;
    let rt = rt2();
    rt.block_on(async {
        let Ok(server) = UdpSocket::bind("[::1]:0".parse().unwrap()) else {
            eprintln!("SKIPPED: no IPv6 loopback");
            return;
        };
        let ring = BufRing::whole(4, 256).unwrap();
        let to = server.local_addr().unwrap();
        let peer = UdpSocket::bind("[::1]:0".parse().unwrap()).unwrap();
        let mut incoming = server.recv_from_multishot(&ring);
        peer.send_to(b"six".to_vec(), to).await.0.unwrap();
        let d = mailring::time::timeout(Duration::from_secs(5), incoming.next())
            .await
            .expect("a datagram")
            .expect("armed")
            .unwrap();
        assert_eq!(d.payload(), b"six");
        assert_eq!(d.peer(), peer.local_addr().unwrap());
        assert!(d.peer().is_ipv6());
    });
}

#[test]
fn a_datagram_sent_at_once_arrives_and_is_refused_off_its_shard() {
    use mailring::net::UdpSocket;
    let rt = rt2();
    let h = rt.handle().clone();
    rt.block_on(async move {
        let (server, peer) = h
            .spawn_on(ShardId::new(0), async {
                let server = UdpSocket::bind(any_port()).unwrap();
                let peer = UdpSocket::bind(any_port()).unwrap();
                let to = server.local_addr().unwrap();
                for i in 0..20u8 {
                    assert_eq!(peer.try_send_to(&[i; 40], to).unwrap(), 40);
                }
                for i in 0..20u8 {
                    let (r, buf) = server.recv_from(Vec::with_capacity(64)).await;
                    let (n, from) = r.unwrap();
                    assert_eq!((n, from), (40, peer.local_addr().unwrap()));
                    assert!(buf.iter().all(|&x| x == i));
                }
                (server, peer)
            })
            .await
            .unwrap();
        // Off its shard, the send is refused, as the ring's would be.
        let to = server.local_addr().unwrap();
        let err = h
            .spawn_on(ShardId::new(1), async move { peer.try_send_to(b"x", to) })
            .await
            .unwrap()
            .expect_err("another shard's socket");
        assert!(err.to_string().contains("another shard"), "{err}");
    });
}

#[test]
fn datagrams_sent_together_arrive_each_at_its_peer_in_order() {
    use mailring::net::UdpSocket;
    let rt = rt2();
    let h = rt.handle().clone();
    rt.block_on(async move {
        let (server, a, b) = h
            .spawn_on(ShardId::new(0), async {
                let server = UdpSocket::bind(any_port()).unwrap();
                let a = UdpSocket::bind(any_port()).unwrap();
                let b = UdpSocket::bind(any_port()).unwrap();
                let (to_a, to_b) = (a.local_addr().unwrap(), b.local_addr().unwrap());
                // 150 datagrams, alternating peers, one call (sent in
                // groups of the kernel's limit).
                let payloads: Vec<Vec<u8>> =
                    (0..150u8).map(|i| vec![i; 1 + usize::from(i)]).collect();
                let batch: Vec<(&[u8], std::net::SocketAddr)> = payloads
                    .iter()
                    .enumerate()
                    .map(|(i, p)| (&p[..], if i % 2 == 0 { to_a } else { to_b }))
                    .collect();
                assert_eq!(server.try_send_to_many(&batch).unwrap(), 150);
                assert_eq!(server.try_send_to_many(&[]).unwrap(), 0);
                for (peer, first) in [(&a, 0u8), (&b, 1u8)] {
                    for i in (first..150).step_by(2) {
                        let (r, buf) = peer.recv_from(Vec::with_capacity(256)).await;
                        let (n, from) = r.unwrap();
                        assert_eq!(
                            (n, from),
                            (1 + usize::from(i), server.local_addr().unwrap())
                        );
                        assert!(buf.iter().all(|&x| x == i));
                    }
                }
                (server, a, b)
            })
            .await
            .unwrap();
        // Off its shard, refused as one send would be.
        let to = a.local_addr().unwrap();
        let err = h
            .spawn_on(ShardId::new(1), async move {
                server.try_send_to_many(&[(&b"x"[..], to)])
            })
            .await
            .unwrap()
            .expect_err("another shard's socket");
        assert!(err.to_string().contains("another shard"), "{err}");
        drop(b);
    });
}

/// What the send-at-once tests need of a stream, TCP or Unix.
trait AtOnce: Sized + Send + Sync + 'static {
    fn try_send(&self, buf: &[u8]) -> std::io::Result<usize>;
    fn send_all_vec(
        &self,
        buf: Vec<u8>,
    ) -> impl std::future::Future<Output = std::io::Result<()>> + Send;
    fn recv_vec(
        &self,
        buf: Vec<u8>,
    ) -> impl std::future::Future<Output = (std::io::Result<usize>, Vec<u8>)> + Send;
}

macro_rules! at_once_for {
    ($t:ty) => {
        impl AtOnce for $t {
            fn try_send(&self, buf: &[u8]) -> std::io::Result<usize> {
                <$t>::try_send(self, buf)
            }
            fn send_all_vec(
                &self,
                buf: Vec<u8>,
            ) -> impl std::future::Future<Output = std::io::Result<()>> + Send {
                async move { self.send_all(buf).await.0 }
            }
            fn recv_vec(
                &self,
                buf: Vec<u8>,
            ) -> impl std::future::Future<Output = (std::io::Result<usize>, Vec<u8>)> + Send {
                self.recv(buf)
            }
        }
    };
}

at_once_for!(TcpStream);
at_once_for!(mailring::net::UnixStream);

/// On shard 0 of `h`'s runtime: `client` sends at once until its socket,
/// whose peer does not read, says `WouldBlock`; everything it took arrives
/// in order, then a send through the ring. Then, from shard 1, a send at
/// once is refused with the off-shard error. Gives both streams back.
async fn send_at_once_then_ring<S: AtOnce>(
    h: &mailring::Handle,
    connect: impl std::future::Future<Output = (S, S)> + Send + 'static,
    chunk: usize,
) -> (S, S) {
    let (client, peer) = h
        .spawn_on(ShardId::new(0), async move {
            let (client, peer) = connect.await;
            let chunk = vec![7u8; chunk];
            let mut taken = 0usize;
            let full = loop {
                match client.try_send(&chunk) {
                    Ok(n) => {
                        assert!(n > 0 && n <= chunk.len());
                        taken += n;
                    }
                    Err(e) => break e,
                }
                assert!(taken < 1 << 30, "a socket that never fills");
            };
            assert_eq!(full.kind(), ErrorKind::WouldBlock, "{full}");
            // Everything taken arrives, in order, and the ring's send goes
            // on after it (it waits for the peer to read).
            let reader = mailring::spawn_local(async move {
                let mut got = 0usize;
                let mut last = Vec::new();
                while got < taken + 4 {
                    let (n, buf) = peer.recv_vec(Vec::with_capacity(256 << 10)).await;
                    let n = n.unwrap();
                    assert!(n > 0, "the peer saw the end early");
                    got += n;
                    last.extend_from_slice(&buf);
                    if last.len() > 8 {
                        last.drain(..last.len() - 8);
                    }
                }
                assert_eq!(&last[last.len() - 4..], b"tail");
                (got, peer)
            });
            client.send_all_vec(b"tail".to_vec()).await.unwrap();
            let (got, peer) = reader.await.unwrap();
            assert_eq!(got, taken + 4);
            (client, peer)
        })
        .await
        .unwrap();
    // Off its shard the send is refused, as the ring's would be.
    let (err, client) = h
        .spawn_on(
            ShardId::new(1),
            async move { (client.try_send(b"x"), client) },
        )
        .await
        .unwrap();
    let err = err.expect_err("another shard's socket");
    assert!(err.to_string().contains("another shard"), "{err}");
    (client, peer)
}

/// A connected loopback pair, made on the calling shard: (client, peer).
async fn tcp_pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind(any_port()).unwrap();
    let addr = listener.local_addr();
    let connecting = mailring::spawn_local(async move { TcpStream::connect(addr).await.unwrap() });
    let (peer, _) = listener.accept().await.unwrap();
    (connecting.await.unwrap(), peer)
}

#[test]
fn a_tcp_send_at_once_takes_what_the_socket_holds_then_would_block() {
    let rt = rt2();
    let h = rt.handle().clone();
    rt.block_on(async move {
        let connect = tcp_pair();
        drop(send_at_once_then_ring(&h, connect, 64 << 10).await);
    });
}

#[test]
fn a_unix_send_at_once_takes_what_the_socket_holds_then_would_block() {
    use mailring::net::UnixStream;
    let rt = rt2();
    let h = rt.handle().clone();
    rt.block_on(async move {
        let connect = async { UnixStream::pair().unwrap() };
        let (client, peer) = send_at_once_then_ring(&h, connect, 16 << 10).await;
        // A peer gone: the OS error, no signal.
        drop(peer);
        let client = h
            .spawn_on(ShardId::new(0), async move {
                let err = client.try_send(b"x").expect_err("the peer is gone");
                assert_eq!(err.kind(), ErrorKind::BrokenPipe, "{err}");
                client
            })
            .await
            .unwrap();
        drop(client);
    });
}

/// Polls `fut` once, with a waker that does nothing.
fn poll_once<F: std::future::Future>(fut: F) -> std::task::Poll<F::Output> {
    let mut fut = std::pin::pin!(fut);
    fut.as_mut()
        .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
}

/// On a shard: a `send_all` the socket has room for completes on its first
/// poll (no operation on the ring to wait for); one that does not fit sends
/// what fits at once and waits on the ring for the rest; once that write
/// completed, sends complete at once again; the peer gets every byte in
/// order.
async fn send_all_at_once_then_ring_then_at_once<S: AtOnce>(
    connect: impl std::future::Future<Output = (S, S)>,
    big: usize,
) {
    let (client, peer) = connect.await;
    let first = poll_once(client.send_all_vec(vec![1u8; 100]));
    assert!(
        matches!(first, std::task::Poll::Ready(Ok(()))),
        "a send with room completes at once"
    );
    let client = std::sync::Arc::new(client);
    let sender = client.clone();
    let big_send = mailring::spawn_local(async move { sender.send_all_vec(vec![2u8; big]).await });
    // Let the big send fill the socket and wait on the ring before reading.
    mailring::time::sleep(Duration::from_millis(20)).await;
    assert!(!big_send.is_finished(), "{big} bytes cannot fit unread");
    let reader = mailring::spawn_local(async move {
        let mut got = Vec::with_capacity(big + 200);
        while got.len() < 100 + big + 4 {
            let (n, buf) = peer.recv_vec(Vec::with_capacity(256 << 10)).await;
            assert!(n.unwrap() > 0, "the peer saw the end early");
            got.extend_from_slice(&buf);
        }
        (got, peer)
    });
    big_send.await.unwrap().unwrap();
    let again = poll_once(client.send_all_vec(b"tail".to_vec()));
    assert!(
        matches!(again, std::task::Poll::Ready(Ok(()))),
        "after the ring's write completed, a send with room completes at once"
    );
    let (got, _peer) = reader.await.unwrap();
    assert_eq!(got.len(), 100 + big + 4);
    assert!(got[..100].iter().all(|&b| b == 1));
    assert!(got[100..100 + big].iter().all(|&b| b == 2));
    assert_eq!(&got[100 + big..], b"tail");
}

#[test]
fn a_tcp_send_all_with_room_completes_at_once_and_a_full_one_waits_in_order() {
    let rt = rt2();
    rt.block_on(async {
        let connect = tcp_pair();
        send_all_at_once_then_ring_then_at_once(connect, 16 << 20).await;
    });
}

#[test]
fn a_unix_send_all_with_room_completes_at_once_and_a_full_one_waits_in_order() {
    let rt = rt2();
    rt.block_on(async {
        let connect = async { mailring::net::UnixStream::pair().unwrap() };
        send_all_at_once_then_ring_then_at_once(connect, 4 << 20).await;
    });
}

#[test]
fn a_task_that_only_sends_at_once_still_lets_its_shards_other_tasks_run() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    const SENDS: usize = 20_000;
    let rt = rt2();
    let seen_at = rt.block_on(async {
        let listener = TcpListener::bind(any_port()).unwrap();
        let addr = listener.local_addr();
        // The peer drains on a thread of its own, so the socket keeps room
        // and every send could complete at once.
        let drain = std::thread::spawn(move || {
            let mut peer = std::net::TcpStream::connect(addr).unwrap();
            let mut got = 0usize;
            let mut buf = vec![0u8; 64 << 10];
            while got < SENDS {
                let n = std::io::Read::read(&mut peer, &mut buf).unwrap();
                assert!(n > 0);
                got += n;
            }
        });
        let (client, _) = listener.accept().await.unwrap();
        let sender = mailring::spawn_local(async move {
            // Queued behind the sender, on its shard, once it runs.
            let ran = Arc::new(AtomicBool::new(false));
            let flag = ran.clone();
            let other = mailring::spawn_local(async move { flag.store(true, Ordering::SeqCst) });
            let mut seen_at = None;
            let mut buf = vec![9u8; 1];
            for i in 0..SENDS {
                let (res, back) = client.send_all(buf).await;
                res.unwrap();
                buf = back;
                if seen_at.is_none() && ran.load(Ordering::SeqCst) {
                    seen_at = Some(i);
                }
            }
            (seen_at, other)
        });
        let (seen_at, other) = sender.await.unwrap();
        other.await.unwrap();
        drain.join().unwrap();
        seen_at
    });
    let at = seen_at.expect("the other task ran while the sender was sending");
    assert!(at < SENDS / 2, "the other task waited {at} sends");
}

#[test]
fn a_recv_after_the_kernel_said_bytes_remain_takes_them_at_once() {
    use mailring::net::UnixStream;
    const QUEUED: usize = 64 << 10;
    let rt = rt2();
    rt.block_on(async {
        let (client, peer) = UnixStream::pair().unwrap();
        let sent: Vec<u8> = (0..QUEUED).map(|i| (i % 251) as u8).collect();
        peer.send_all(sent.clone()).await.0.unwrap();
        let mut got = Vec::with_capacity(QUEUED);
        // The first receive goes through the ring (nothing says bytes are
        // queued yet) and fills its 4 KiB.
        let (n, buf) = client.recv(Vec::with_capacity(4096)).await;
        assert_eq!(n.unwrap(), 4096);
        got.extend_from_slice(&buf);
        // Every later one while bytes remain completes on its first poll.
        while got.len() < QUEUED {
            match poll_once(client.recv(Vec::with_capacity(4096))) {
                std::task::Poll::Ready((n, buf)) => {
                    assert_eq!(n.unwrap(), buf.len());
                    got.extend_from_slice(&buf);
                }
                std::task::Poll::Pending => {
                    panic!("queued bytes at {} waited on the ring", got.len())
                }
            }
        }
        assert_eq!(got, sent, "every byte, in order");
        // Nothing queued now: the receive that finds nothing goes on to the
        // ring and gets the next bytes when they come.
        let later = mailring::spawn_local(async move {
            let (n, buf) = client.recv(Vec::with_capacity(4096)).await;
            (n.unwrap(), buf, client)
        });
        mailring::time::sleep(Duration::from_millis(20)).await;
        assert!(!later.is_finished());
        peer.send_all(b"later".to_vec()).await.0.unwrap();
        let (n, buf, client) = later.await.unwrap();
        assert_eq!((n, &buf[..]), (5, &b"later"[..]));
        // A short receive ends taking at once: the next waits on the ring.
        assert!(poll_once(client.recv(Vec::with_capacity(4096))).is_pending());
    });
}

#[test]
fn once_a_multishot_receive_was_armed_no_receive_is_taken_at_once() {
    use mailring::buf::BufRing;
    use mailring::net::UnixStream;
    let rt = rt2();
    rt.block_on(async {
        let (client, peer) = UnixStream::pair().unwrap();
        peer.send_all(vec![3u8; 64 << 10]).await.0.unwrap();
        let (n, _) = client.recv(Vec::with_capacity(4096)).await;
        assert_eq!(n.unwrap(), 4096);
        // Bytes remain: the next receive would be taken at once...
        let ring = BufRing::new(2, 4096).unwrap();
        // ...but a multishot receive armed on the socket (here dropped
        // unpolled) takes its bytes through the ring from now on.
        drop(client.recv_multishot(&ring));
        assert!(
            poll_once(client.recv(Vec::with_capacity(4096))).is_pending(),
            "a receive taken at once beside a multishot receive"
        );
        let (n, _) = client.recv(Vec::with_capacity(4096)).await;
        assert_eq!(n.unwrap(), 4096);
    });
}

#[test]
fn a_send_at_once_waits_for_a_write_on_the_ring_to_finish() {
    let rt = rt2();
    rt.block_on(async {
        let (client, peer) = tcp_pair().await;
        // A send on the ring, submitted (polled once) but not completed.
        let mut on_ring = std::pin::pin!(client.send(vec![1u8; 100]));
        let waker = std::task::Waker::noop();
        let polled =
            std::future::Future::poll(on_ring.as_mut(), &mut std::task::Context::from_waker(waker));
        assert!(
            polled.is_pending(),
            "a send on the ring completes at the tick's end"
        );
        // The socket has room, but these bytes would overtake the ring's.
        let err = client.try_send(b"x").expect_err("a write is on the ring");
        assert_eq!(err.kind(), ErrorKind::WouldBlock, "{err}");
        let (n, _) = on_ring.await;
        assert_eq!(n.unwrap(), 100);
        assert_eq!(client.try_send(b"y").unwrap(), 1);
        let mut got = Vec::new();
        while got.len() < 101 {
            let (n, buf) = peer.recv(Vec::with_capacity(256)).await;
            assert!(n.unwrap() > 0);
            got.extend_from_slice(&buf);
        }
        assert!(got[..100].iter().all(|&b| b == 1));
        assert_eq!(got[100], b'y');
    });
}

#[test]
fn a_task_that_only_receives_queued_bytes_still_lets_its_shards_other_tasks_run() {
    use mailring::net::UnixStream;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    // 100-byte receives of 150 KB queued at once: 1,500 receives that could
    // all complete at once.
    const QUEUED: usize = 150_000;
    let rt = rt2();
    let seen_at = rt.block_on(async {
        let (client, peer) = UnixStream::pair().unwrap();
        peer.send_all(vec![5u8; QUEUED]).await.0.unwrap();
        let reader = mailring::spawn_local(async move {
            let (n, _) = client.recv(Vec::with_capacity(100)).await;
            let mut got = n.unwrap();
            // Queued behind the reader, on its shard, once it runs.
            let ran = Arc::new(AtomicBool::new(false));
            let flag = ran.clone();
            let other = mailring::spawn_local(async move { flag.store(true, Ordering::SeqCst) });
            let mut seen_at = None;
            let mut reads = 0usize;
            while got < QUEUED {
                let (n, _) = client.recv(Vec::with_capacity(100)).await;
                got += n.unwrap();
                reads += 1;
                if seen_at.is_none() && ran.load(Ordering::SeqCst) {
                    seen_at = Some(reads);
                }
            }
            (seen_at, other, peer)
        });
        let (seen_at, other, _peer) = reader.await.unwrap();
        other.await.unwrap();
        seen_at
    });
    let at = seen_at.expect("the other task ran while the reader was reading");
    assert!(at < 1_000, "the other task waited {at} receives");
}

#[test]
fn a_receive_into_an_appending_buffer_keeps_what_it_held() {
    use bytes::BytesMut;
    use mailring::buf::Appending;
    let rt = rt2();
    rt.block_on(async {
        let listener = TcpListener::bind(any_port()).unwrap();
        let addr = listener.local_addr();
        let sender = mailring::spawn_local(async move {
            let (conn, _) = listener.accept().await.unwrap();
            let (r, _) = conn.send_all(b"world".to_vec()).await;
            r.unwrap();
        });
        let stream = TcpStream::connect(addr).await.unwrap();
        let mut held = BytesMut::with_capacity(64);
        held.extend_from_slice(b"hello ");
        let (n, buf) = stream.recv(Appending::new(held)).await;
        let n = n.unwrap();
        let buf = buf.into_inner();
        assert!((1..=5).contains(&n), "{n}");
        assert_eq!(buf.len(), 6 + n);
        assert_eq!(&buf[..], &b"hello world"[..6 + n]);
        sender.await.unwrap();
    });
}

/// `try_peek` once the socket has something to show (bytes, or its end).
async fn peek_once_queued(stream: &TcpStream, buf: &mut [u8]) -> usize {
    loop {
        match stream.try_peek(buf) {
            Ok(n) => return n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                mailring::time::sleep(Duration::from_millis(1)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn a_peek_shows_queued_bytes_without_taking_them_and_the_end_as_zero() {
    let rt = rt2();
    let h = rt.handle().clone();
    rt.block_on(async move {
        let (client, peer) = tcp_pair().await;
        let mut buf = [0u8; 8];
        // Nothing queued.
        let err = client.try_peek(&mut buf).expect_err("nothing queued");
        assert_eq!(err.kind(), ErrorKind::WouldBlock, "{err}");
        let (res, _) = peer.send_all(b"abc".to_vec()).await;
        res.unwrap();
        let peeked = peek_once_queued(&client, &mut buf).await;
        assert_eq!(&buf[..peeked], b"abc");
        // Still there for a receive.
        let (n, got) = client.recv(vec![0u8; 8]).await;
        assert_eq!(&got[..n.unwrap()], b"abc");
        // Off the socket's shard: the wrong-shard error.
        let client = h
            .spawn_on(ShardId::new(1), async move {
                let err = client.try_peek(&mut [0u8; 1]).expect_err("off its shard");
                assert_ne!(err.kind(), ErrorKind::WouldBlock, "{err}");
                client
            })
            .await
            .unwrap();
        // The peer closes: the end reads as 0, again and again.
        drop(peer);
        let end = peek_once_queued(&client, &mut buf).await;
        assert_eq!(end, 0);
        assert_eq!(client.try_peek(&mut buf).unwrap(), 0);
    });
}

#[test]
fn a_peer_close_behind_queued_bytes_shows_in_the_tcp_state() {
    let rt = rt2();
    rt.block_on(async move {
        let (client, peer) = tcp_pair().await;
        assert!(!client.peer_closed().unwrap());
        let (res, _) = peer.send_all(b"last words".to_vec()).await;
        res.unwrap();
        drop(peer);
        // The bytes are still queued, so a peek shows them, not the end;
        // the TCP state shows the end.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !client.peer_closed().unwrap() {
            assert!(std::time::Instant::now() < deadline, "no end seen");
            mailring::time::sleep(Duration::from_millis(1)).await;
        }
        let mut buf = [0u8; 4];
        assert_eq!(peek_once_queued(&client, &mut buf).await, 4);
    });
}

#[test]
fn a_peer_close_wait_ends_at_the_peer_s_end_and_takes_no_byte() {
    let rt = rt2();
    rt.block_on(async move {
        let (client, peer) = tcp_pair().await;
        // Bytes arriving do not end it.
        let (res, _) = peer.send_all(b"queued".to_vec()).await;
        res.unwrap();
        let waited = mailring::time::timeout(Duration::from_millis(100), client.peer_close()).await;
        assert!(waited.is_err(), "ended with the peer still there");
        // Its end does; the bytes before it are all still there to read.
        drop(peer);
        mailring::time::timeout(Duration::from_secs(5), client.peer_close())
            .await
            .expect("the end was seen")
            .unwrap();
        let mut got = Vec::new();
        loop {
            let (n, buf) = client.recv(vec![0u8; 64]).await;
            match n.unwrap() {
                0 => break,
                n => got.extend_from_slice(&buf[..n]),
            }
        }
        assert_eq!(got, b"queued");
    });
}

/// A buffer that owns another connection's receive in flight: dropping
/// the buffer drops that receive (an operation of the same shard).
struct HoldsAnOp {
    bytes: Vec<u8>,
    /// Only dropped, with the buffer.
    _other: Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>>,
}

// SAFETY: delegates to the Vec, whose heap buffer does not move.
unsafe impl mailring::buf::IoBuf for HoldsAnOp {
    fn stable_ptr(&self) -> *const u8 {
        self.bytes.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.bytes.len()
    }
}

// SAFETY: as for the Vec it delegates to.
unsafe impl mailring::buf::IoBufMut for HoldsAnOp {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.bytes.as_mut_ptr()
    }
    fn bytes_total(&mut self) -> usize {
        self.bytes.capacity()
    }
    unsafe fn set_init(&mut self, n: usize) {
        // SAFETY: the caller's promise, passed on.
        unsafe { self.bytes.set_len(n) }
    }
}

#[test]
fn an_abandoned_operation_s_buffer_is_dropped_where_its_drop_may_drop_operations() {
    // The last completion of an abandoned receive drops its buffer; a
    // buffer's `Drop` is anyone's code and here drops another receive in
    // flight, which needs the shard's table of operations: the buffer
    // must not be dropped while the table is borrowed.
    let rt = rt2();
    let on_shard = rt.handle().spawn_local_on(ShardId::new(0), || async {
        let listener = TcpListener::bind(any_port()).unwrap();
        let addr = listener.local_addr();
        let pair = || async {
            let client =
                mailring::spawn_local(async move { TcpStream::connect(addr).await.unwrap() });
            let (server, _) = listener.accept().await.unwrap();
            (client.await.unwrap(), server)
        };
        let (a_client, a_server) = pair().await;
        let (_b_client, b_server) = pair().await;
        let b_server = std::rc::Rc::new(b_server);
        let waiting = b_server.clone();
        let mut other: std::pin::Pin<Box<dyn std::future::Future<Output = ()>>> =
            Box::pin(async move {
                let _ = waiting.recv(vec![0u8; 16]).await;
            });
        // Submitted: its receive is in flight.
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(other.as_mut().poll(&mut cx).is_pending());
        let holder = HoldsAnOp {
            bytes: Vec::with_capacity(16),
            _other: Some(other),
        };
        // Abandoned in flight, then completed by data.
        let recv = a_server.recv(holder);
        assert!(mailring::time::timeout(Duration::from_millis(5), recv)
            .await
            .is_err());
        let (r, _) = a_client.send_all(b"done".to_vec()).await;
        r.unwrap();
        mailring::time::sleep(Duration::from_millis(50)).await;
        // The shard goes on: a new receive on the same socket works.
        let (r, _) = a_client.send_all(b"more".to_vec()).await;
        r.unwrap();
        let (n, buf) = a_server.recv(Vec::with_capacity(16)).await;
        assert!(n.unwrap() > 0, "{buf:?}");
    });
    rt.block_on(on_shard).unwrap();
    let report = rt.shutdown();
    assert_eq!(report.panics.total(), 0, "{:?}", report.panic_records);
}

/// A client that connects and resets before the server accepts (a health
/// check or scanner closing with `SO_LINGER` 0) leaves a dead connection in
/// the accept queue: `accept()` passes over it to the next, it does not
/// fail (an accept loop written `accept().await?` would end on it).
#[test]
fn a_connection_reset_before_its_accept_does_not_fail_the_accept() {
    let rt = rt2();
    let (got, second) = rt.block_on(async {
        let listener = TcpListener::bind(any_port()).unwrap();
        let addr = listener.local_addr();
        let reset = std::net::TcpStream::connect(addr).unwrap();
        socket2::SockRef::from(&reset)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(reset);
        mailring::time::sleep(Duration::from_millis(20)).await;
        let second = std::net::TcpStream::connect(addr).unwrap();
        let got = mailring::time::timeout(Duration::from_secs(5), listener.accept())
            .await
            .expect("accept hung")
            .map(|(_, peer)| peer);
        (got, second)
    });
    assert_eq!(got.unwrap(), second.local_addr().unwrap());
}

/// `try_recv` takes what is queued without waiting: `WouldBlock` when
/// nothing is, the bytes when some are, 0 at the peer's end; and it does
/// not look while a receive is on the ring (the bytes would be its).
#[test]
fn try_recv_takes_queued_bytes_without_waiting() {
    use std::future::Future;
    let rt = rt2();
    rt.block_on(async {
        let listener = TcpListener::bind(any_port()).unwrap();
        let client = TcpStream::connect(listener.local_addr()).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let mut buf = [0u8; 16];
        assert_eq!(
            server.try_recv(&mut buf).unwrap_err().kind(),
            ErrorKind::WouldBlock
        );
        client.send_all(b"hello".to_vec()).await.0.unwrap();
        mailring::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(server.try_recv(&mut buf).unwrap(), 5);
        assert_eq!(&buf[..5], b"hello");
        {
            // A receive on the ring: try_recv does not take its bytes.
            let mut pending = std::pin::pin!(server.recv(Vec::with_capacity(8)));
            std::future::poll_fn(|cx| {
                assert!(pending.as_mut().poll(cx).is_pending());
                std::task::Poll::Ready(())
            })
            .await;
            assert_eq!(
                server.try_recv(&mut buf).unwrap_err().kind(),
                ErrorKind::WouldBlock
            );
            client.send_all(b"ring".to_vec()).await.0.unwrap();
            let (n, got) = pending.await;
            assert_eq!((n.unwrap(), &got[..]), (4, &b"ring"[..]));
        }
        drop(client);
        mailring::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(server.try_recv(&mut buf).unwrap(), 0);
    });
}

/// A `recv` dropped while on the ring (cancelled, nothing received) does
/// not keep the stream's non-blocking receives and peeks refused: once its
/// cancellation has landed, `try_recv` and `try_peek` take queued bytes.
#[test]
fn a_dropped_recv_does_not_refuse_try_recv_for_good() {
    use std::future::Future;
    let rt = rt2();
    rt.block_on(async {
        let listener = TcpListener::bind(any_port()).unwrap();
        let client = TcpStream::connect(listener.local_addr()).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        {
            let mut pending = std::pin::pin!(server.recv(Vec::with_capacity(8)));
            std::future::poll_fn(|cx| {
                assert!(pending.as_mut().poll(cx).is_pending());
                std::task::Poll::Ready(())
            })
            .await;
        }
        // The cancellation lands within a tick or two.
        mailring::time::sleep(Duration::from_millis(20)).await;
        client.send_all(b"after".to_vec()).await.0.unwrap();
        mailring::time::sleep(Duration::from_millis(20)).await;
        let mut buf = [0u8; 16];
        assert_eq!(server.try_peek(&mut buf).unwrap(), 5);
        assert_eq!(server.try_recv(&mut buf).unwrap(), 5);
        assert_eq!(&buf[..5], b"after");
    });
}

/// A send dropped while on the ring (the peer's window full) does not keep
/// `try_send` refused for good: once the kernel is done with it, and the
/// peer has read, the stream sends without the ring again.
#[test]
fn a_dropped_send_does_not_refuse_try_send_for_good() {
    use std::future::Future;
    let rt = rt2();
    rt.block_on(async {
        let listener = TcpListener::bind(any_port()).unwrap();
        let client = TcpStream::connect(listener.local_addr()).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        // Fill both socket buffers until a send has to wait on the ring.
        let chunk = vec![7u8; 1 << 20];
        let mut sent = 0usize;
        {
            let mut pending = loop {
                let mut send = Box::pin(server.send_all(chunk.clone()));
                let ready = std::future::poll_fn(|cx| {
                    std::task::Poll::Ready(send.as_mut().poll(cx).is_ready())
                })
                .await;
                if !ready {
                    break send;
                }
                sent += chunk.len();
                assert!(sent < 1 << 30, "the peer's buffers never filled");
            };
            assert_eq!(
                server.try_send(b"x").unwrap_err().kind(),
                ErrorKind::WouldBlock
            );
            // Dropped while on the ring.
            std::future::poll_fn(|cx| {
                let _ = pending.as_mut().poll(cx);
                std::task::Poll::Ready(())
            })
            .await;
        }
        // Drain what the client has, so that the socket has room again.
        let mut drained = 0usize;
        loop {
            match mailring::time::timeout(
                Duration::from_millis(200),
                client.recv(Vec::with_capacity(1 << 20)),
            )
            .await
            {
                Ok((Ok(0), _)) | Err(_) => break,
                Ok((Ok(n), _)) => drained += n,
                Ok((Err(e), _)) => panic!("client recv failed: {e}"),
            }
        }
        assert!(drained >= sent, "drained {drained} of {sent}");
        assert_eq!(server.try_send(b"x").unwrap(), 1);
    });
}
