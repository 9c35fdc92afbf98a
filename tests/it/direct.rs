//! Direct descriptors: a socket moved into a shard's table, used by slot,
//! sent to another shard's ring with `IORING_MSG_SEND_FD`, and closed, with
//! the occupied slots counted back to zero.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use mailring::net::{DirectStream, TcpListener};
use mailring::{Runtime, ShardId};

/// A runtime of two shards, each with a table of `slots` direct
/// descriptors.
fn two_shards_with_slots(slots: u32) -> Runtime {
    Runtime::builder()
        .shards(2)
        .direct_descriptors(slots)
        .build()
        .unwrap()
}

fn slots(rt: &Runtime) -> Vec<u64> {
    rt.stats()
        .shards
        .iter()
        .map(|s| s.direct_descriptors)
        .collect()
}

/// Waits (bounded) until the gauges read `want` (they are refreshed by the
/// shards themselves).
fn wait_slots(rt: &Runtime, want: &[u64]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while slots(rt) != want {
        assert!(
            Instant::now() < deadline,
            "slots {:?}, want {want:?}",
            slots(rt)
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Listens on loopback (its address sent on `tx`), accepts one connection
/// and moves it into this shard's table.
async fn accept_direct(
    tx: std::sync::mpsc::Sender<std::net::SocketAddr>,
) -> (DirectStream, std::net::SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    tx.send(listener.local_addr()).unwrap();
    let (stream, peer) = listener.accept().await.unwrap();
    let direct = DirectStream::from_tcp(stream)
        .await
        .map_err(|(e, _)| e)
        .unwrap();
    (direct, peer)
}

fn echo_once(client: &mut std::net::TcpStream, msg: &[u8]) {
    client.write_all(msg).unwrap();
    let mut got = vec![0u8; msg.len()];
    client.read_exact(&mut got).unwrap();
    assert_eq!(got, msg);
}

#[test]
fn a_direct_stream_moves_to_another_ring_and_its_slots_return_to_zero() {
    let rt = two_shards_with_slots(64);
    let features = rt.stats();
    let _ = features;
    let (tx, rx) = std::sync::mpsc::channel();
    let server = rt.handle().spawn_on(ShardId::new(0), async move {
        let (direct, peer) = accept_direct(tx).await;
        assert_eq!(direct.peer_addr(), Some(peer), "kept beside the slot");
        // Echo once here, by slot.
        let (n, buf) = direct.recv(Vec::with_capacity(64)).await;
        assert_eq!(n.unwrap(), 4);
        direct.send_all(buf).await.0.unwrap();
        let ticket = direct
            .send_to_shard(ShardId::new(1))
            .await
            .map_err(|(e, _)| e)
            .unwrap();
        assert_eq!(ticket.target(), ShardId::new(1));
        ticket
    });
    let mut client = std::net::TcpStream::connect(rx.recv().unwrap()).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    echo_once(&mut client, b"ping");
    let ticket = rt.block_on(server).unwrap();
    // On shard 1 now: echo there, then drop it.
    let moved = rt.handle().spawn_on(ShardId::new(1), async move {
        let direct = ticket.receive().await.unwrap();
        let (n, buf) = direct.recv(Vec::with_capacity(64)).await;
        assert_eq!(n.unwrap(), 4);
        direct.send_all(buf).await.0.unwrap();
        mailring::current_shard().map(|s| s.index())
    });
    echo_once(&mut client, b"pong");
    assert_eq!(rt.block_on(moved).unwrap(), Some(1));
    wait_slots(&rt, &[0, 0]);
    drop(client);
    rt.shutdown();
}

#[test]
fn a_ticket_dropped_unredeemed_closes_its_slot_on_the_target() {
    let rt = two_shards_with_slots(16);
    let (tx, rx) = std::sync::mpsc::channel();
    let server = rt.handle().spawn_on(ShardId::new(0), async move {
        let (direct, _) = accept_direct(tx).await;
        let ticket = direct
            .send_to_shard(ShardId::new(1))
            .await
            .map_err(|(e, _)| e)
            .unwrap();
        drop(ticket);
    });
    let mut client = std::net::TcpStream::connect(rx.recv().unwrap()).unwrap();
    rt.block_on(server).unwrap();
    wait_slots(&rt, &[0, 0]);
    // The socket is closed: the client reads the end.
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    assert_eq!(client.read(&mut [0u8; 8]).unwrap(), 0);
    rt.shutdown();
}

#[test]
fn without_a_table_direct_streams_are_unsupported_and_the_stream_is_not_lost() {
    let rt = Runtime::builder().shards(1).build().unwrap();
    let err = rt.block_on_local(|| async {
        let listener = TcpListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr();
        let mut client = std::net::TcpStream::connect(addr).unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        let (err, stream) = DirectStream::from_tcp(stream).await.unwrap_err();
        // The plain stream comes back and still works.
        client.write_all(b"ok").unwrap();
        let (n, buf) = stream.recv(Vec::with_capacity(8)).await;
        assert_eq!(n.unwrap(), 2);
        assert_eq!(buf, b"ok");
        err
    });
    assert_eq!(err.kind(), std::io::ErrorKind::Unsupported);
    rt.shutdown();
}

/// Polls `fut` once on this task (so its operation is submitted), then
/// drops it: a caller that gave up (a timeout, a `select!`) right after.
async fn submit_then_drop<F: std::future::Future>(fut: F) {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| {
        assert!(
            fut.as_mut().poll(cx).is_pending(),
            "the operation went to the ring"
        );
        std::task::Poll::Ready(())
    })
    .await;
}

/// A client whose server side is made direct by `serve` (given the
/// accepted stream on shard 0), then expected to close: the client reads
/// the end within 5 s.
fn the_peer_sees_the_end(
    serve: impl FnOnce(mailring::net::TcpStream) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>
        + Send
        + 'static,
) {
    let rt = two_shards_with_slots(16);
    let (tx, rx) = std::sync::mpsc::channel();
    let server = rt
        .handle()
        .spawn_local_on(ShardId::new(0), move || async move {
            let listener = TcpListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
            tx.send(listener.local_addr()).unwrap();
            let (stream, _) = listener.accept().await.unwrap();
            serve(stream).await;
            // Time for the completion and its cleanup to run.
            mailring::time::sleep(Duration::from_millis(50)).await;
        });
    let mut client = std::net::TcpStream::connect(rx.recv().unwrap()).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    rt.block_on(server).unwrap();
    let mut buf = [0u8; 8];
    match client.read(&mut buf) {
        Ok(0) => {}
        other => panic!("the server's socket stayed open: {other:?}"),
    }
    wait_slots(&rt, &[0, 0]);
    rt.shutdown();
}

#[test]
fn a_conversion_to_direct_dropped_mid_way_closes_the_slot_it_filled() {
    the_peer_sees_the_end(|stream| {
        Box::pin(async move {
            submit_then_drop(DirectStream::from_tcp(stream)).await;
        })
    });
}

#[test]
fn a_move_to_another_ring_dropped_mid_way_closes_the_slot_sent_there() {
    the_peer_sees_the_end(|stream| {
        Box::pin(async move {
            let direct = DirectStream::from_tcp(stream)
                .await
                .map_err(|(e, _)| e)
                .unwrap();
            submit_then_drop(direct.send_to_shard(ShardId::new(1))).await;
        })
    });
}

/// A move that finds the target's table full gives the stream back; made a
/// plain stream again (`IORING_OP_FIXED_FD_INSTALL`), it keeps its
/// connection, moves as a process descriptor, and leaves no slot behind.
#[test]
fn a_direct_stream_whose_move_finds_the_table_full_goes_on_as_a_plain_stream() {
    let rt = two_shards_with_slots(1);
    // Shard 1's only slot, taken by another connection.
    let (tx, rx) = std::sync::mpsc::channel();
    let filler = rt
        .handle()
        .spawn_on(ShardId::new(1), async move { accept_direct(tx).await.0 });
    let filler_client = std::net::TcpStream::connect(rx.recv().unwrap()).unwrap();
    let filler = rt.block_on(filler).unwrap();
    wait_slots(&rt, &[0, 1]);
    let (tx, rx) = std::sync::mpsc::channel();
    let server = rt.handle().spawn_on(ShardId::new(0), async move {
        let (direct, peer) = accept_direct(tx).await;
        let Err((e, direct)) = direct.send_to_shard(ShardId::new(1)).await else {
            panic!("shard 1's table had room");
        };
        assert_eq!(e.raw_os_error(), Some(23), "ENFILE: {e}");
        let plain = direct.into_tcp().await.map_err(|(e, _)| e).unwrap();
        assert_eq!(plain.peer_addr().unwrap(), peer);
        // The connection is whole: echo once here.
        let (n, buf) = plain.recv(Vec::with_capacity(64)).await;
        assert_eq!(n.unwrap(), 4);
        plain.send_all(buf).await.0.unwrap();
        plain.into_std().unwrap()
    });
    let mut client = std::net::TcpStream::connect(rx.recv().unwrap()).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    echo_once(&mut client, b"ping");
    let std_stream = rt.block_on(server).unwrap();
    // Shard 0's slot went with the conversion.
    wait_slots(&rt, &[0, 1]);
    let moved = rt.handle().spawn_on(ShardId::new(1), async move {
        let stream = mailring::net::TcpStream::from_std(std_stream).unwrap();
        let (n, buf) = stream.recv(Vec::with_capacity(64)).await;
        assert_eq!(n.unwrap(), 4);
        stream.send_all(buf).await.0.unwrap();
    });
    echo_once(&mut client, b"pong");
    rt.block_on(moved).unwrap();
    drop(filler);
    wait_slots(&rt, &[0, 0]);
    drop(filler_client);
    rt.shutdown();
}

/// A move the kernel could not announce: the socket went into a slot of
/// the target's table, but the completion that tells the target which one
/// could not be posted (`EOVERFLOW`: its completion queue and overflow
/// list were full), so nobody can reach that slot. Simulated by the fault
/// injection (the move is sent without a completion for the target). The
/// socket must be shut down so its peer sees the end, not a silence.
#[test]
fn a_move_the_target_was_never_told_of_shuts_the_socket_down_for_its_peer() {
    let mut faults = mailring::FaultInjection::default();
    faults.unannounced_fd_moves = true;
    let rt = Runtime::builder()
        .shards(2)
        .direct_descriptors(16)
        .fault_injection(faults)
        .build()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let server = rt.handle().spawn_on(ShardId::new(0), async move {
        let (direct, _) = accept_direct(tx).await;
        let Err((e, direct)) = direct.send_to_shard(ShardId::new(1)).await else {
            panic!("the move was announced");
        };
        // EOVERFLOW.
        assert_eq!(e.raw_os_error(), Some(75), "{e}");
        drop(direct);
    });
    let mut client = std::net::TcpStream::connect(rx.recv().unwrap()).unwrap();
    rt.block_on(server).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    assert_eq!(
        client.read(&mut [0u8; 8]).map_err(|e| e.kind()),
        Ok(0),
        "the peer waits on a socket nobody can reach"
    );
    // The moving shard's slot went; the target's is out of reach.
    wait_slots(&rt, &[0, 0]);
    rt.shutdown();
}

/// Without `IORING_OP_FIXED_FD_INSTALL` (hidden here, as on a kernel
/// before 6.8) the conversion says so and gives the stream back whole.
#[test]
fn without_fixed_fd_install_a_direct_stream_stays_direct_and_whole() {
    let mut faults = mailring::FaultInjection::default();
    faults.hide_opcode = Some(54); // IORING_OP_FIXED_FD_INSTALL
    let rt = Runtime::builder()
        .shards(1)
        .direct_descriptors(4)
        .fault_injection(faults)
        .build()
        .unwrap();
    assert!(!rt.stats().shards[0].ring.op_fixed_fd_install);
    let (tx, rx) = std::sync::mpsc::channel();
    let server = rt.handle().spawn_on(ShardId::new(0), async move {
        let (direct, _) = accept_direct(tx).await;
        let Err((e, direct)) = direct.into_tcp().await else {
            panic!("converted with the operation hidden");
        };
        assert_eq!(e.kind(), std::io::ErrorKind::Unsupported, "{e}");
        assert!(e.to_string().contains("6.8"), "{e}");
        let (n, buf) = direct.recv(Vec::with_capacity(64)).await;
        assert_eq!(n.unwrap(), 4);
        direct.send_all(buf).await.0.unwrap();
    });
    let mut client = std::net::TcpStream::connect(rx.recv().unwrap()).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    echo_once(&mut client, b"ping");
    rt.block_on(server).unwrap();
    wait_slots(&rt, &[0]);
    rt.shutdown();
}

/// A `recv` dropped right before the stream changes form (made a plain
/// stream, or moved to another ring) may still take bytes: its operation
/// runs when the tick's submissions go, after the change. Those bytes are
/// reported by the next `recv` of the stream in its new form, not lost
/// without a word (the new form started a count of its own).
#[test]
fn bytes_a_recv_dropped_before_a_change_of_form_took_are_reported_after_it() {
    for to_tcp in [true, false] {
        let rt = two_shards_with_slots(8);
        let (tx, rx) = std::sync::mpsc::channel();
        let (sent_tx, sent_rx) = std::sync::mpsc::channel::<()>();
        let server = rt.handle().spawn_on(ShardId::new(0), async move {
            let (direct, _) = accept_direct(tx).await;
            // The client's bytes are queued on the socket before the
            // receive is even submitted: it takes them when it goes.
            sent_rx.recv().unwrap();
            submit_then_drop(direct.recv(Vec::with_capacity(64))).await;
            if to_tcp {
                let tcp = direct.into_tcp().await.map_err(|(e, _)| e).unwrap();
                let (r, _) = tcp.recv(Vec::with_capacity(64)).await;
                r.map(|n| n as u64).map_err(|e| e.to_string())
            } else {
                let ticket = direct
                    .send_to_shard(ShardId::new(1))
                    .await
                    .map_err(|(e, _)| e)
                    .unwrap();
                mailring::spawn_with(mailring::Placement::Pinned(ShardId::new(1)), async move {
                    let moved = ticket.receive().await.unwrap();
                    let (r, _) = moved.recv(Vec::with_capacity(64)).await;
                    r.map(|n| n as u64).map_err(|e| e.to_string())
                })
                .await
                .unwrap()
            }
        });
        let mut client = std::net::TcpStream::connect(rx.recv().unwrap()).unwrap();
        client.write_all(b"0123456789").unwrap();
        std::thread::sleep(Duration::from_millis(50));
        sent_tx.send(()).unwrap();
        // Unblocks a `recv` that waited in vain (the bytes lost unsaid).
        std::thread::sleep(Duration::from_millis(200));
        client.write_all(b"late").unwrap();
        let got = rt.block_on(server).unwrap();
        let err = got.expect_err("the next recv reports the bytes the dropped one took");
        assert!(err.contains("10 bytes"), "to_tcp {to_tcp}: {err}");
        drop(client);
        rt.shutdown();
    }
}
