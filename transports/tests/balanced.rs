//! `BalancedListener` over real loopback sockets: connections that the
//! kernel's spread sends to one shard are served evenly on both, each
//! handler on the shard it is counted on; a panicking handler gives its
//! count back; `close` stops accepting while served connections go on; a
//! taken port is refused.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mailring_transports::BalancedListener;

mod common;
use common::connect_steered_to;

fn runtime(shards: usize) -> mailring::Runtime {
    mailring::Runtime::builder()
        .shards(shards)
        .build()
        .expect("io_uring available")
}

/// Echoes until the peer closes; records the shard it ran on. A message
/// `panic` panics instead.
fn echo_recording(rt: &mailring::Runtime, shards_seen: Arc<Mutex<Vec<usize>>>) -> BalancedListener {
    BalancedListener::bind(
        rt.handle(),
        "127.0.0.1:0".parse().unwrap(),
        move |stream, _peer| {
            let shards_seen = shards_seen.clone();
            async move {
                let here = mailring::current_shard().expect("on a shard").index();
                shards_seen.lock().unwrap().push(here);
                let mut buf = Vec::with_capacity(256);
                loop {
                    let (n, got) = stream.recv(buf).await;
                    match n {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                    assert!(got != b"panic", "asked to panic");
                    let (res, sent) = stream.send_all(got).await;
                    if res.is_err() {
                        return;
                    }
                    buf = sent;
                    buf.clear();
                }
            }
        },
    )
    .unwrap()
}

fn round_trip(c: &mut TcpStream, body: &[u8]) {
    c.write_all(body).unwrap();
    let mut got = vec![0u8; body.len()];
    c.read_exact(&mut got).unwrap();
    assert_eq!(got, body);
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn connections_the_kernel_sends_to_one_shard_are_served_evenly_on_both() {
    let rt = runtime(2);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let listener = echo_recording(&rt, seen.clone());
    assert!(listener.is_steered());
    let addr = listener.local_addr();
    // Four connections steered to shard 0, one after another, each
    // answered before the next: two are served there, two on shard 1.
    let mut clients: Vec<TcpStream> = (0..4)
        .map(|i| {
            let mut c = connect_steered_to(addr, 0);
            round_trip(&mut c, format!("hello {i}").as_bytes());
            c
        })
        .collect();
    assert_eq!(listener.open_per_shard(), vec![2, 2]);
    assert_eq!(listener.moved(), 2);
    let mut shards = seen.lock().unwrap().clone();
    shards.sort_unstable();
    assert_eq!(
        shards,
        vec![0, 0, 1, 1],
        "each handler ran where it was counted"
    );
    // Every connection is served, wherever it went.
    for (i, c) in clients.iter_mut().enumerate() {
        round_trip(c, format!("again {i}").as_bytes());
    }
    // Closed connections count no more.
    drop(clients);
    wait_until("the handlers to return", || {
        listener.open_per_shard() == vec![0, 0]
    });
    drop(listener);
    rt.shutdown();
}

#[test]
fn a_panicking_handler_gives_its_count_back_and_the_listener_goes_on() {
    let rt = runtime(2);
    let listener = echo_recording(&rt, Arc::new(Mutex::new(Vec::new())));
    let addr = listener.local_addr();
    let mut bad = connect_steered_to(addr, 1);
    bad.write_all(b"panic").unwrap();
    // The handler's panic drops the connection.
    let mut rest = Vec::new();
    let _ = bad.read_to_end(&mut rest);
    wait_until("the panicked handler's count", || {
        listener.open_per_shard() == vec![0, 0]
    });
    let mut good = connect_steered_to(addr, 1);
    round_trip(&mut good, b"still serving");
    assert_eq!(listener.open_per_shard(), vec![0, 1]);
    drop(good);
    drop(listener);
    rt.shutdown();
}

#[test]
fn close_stops_accepting_while_served_connections_go_on() {
    let rt = runtime(2);
    let listener = echo_recording(&rt, Arc::new(Mutex::new(Vec::new())));
    let addr = listener.local_addr();
    let mut served = TcpStream::connect(addr).unwrap();
    round_trip(&mut served, b"before");
    listener.close();
    wait_until("the listeners to close", || {
        TcpStream::connect(addr).is_err()
    });
    round_trip(&mut served, b"after the close");
    drop(listener);
    rt.shutdown();
}

#[test]
fn a_port_something_listens_on_is_refused() {
    let rt = runtime(2);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr: SocketAddr = taken.local_addr().unwrap();
    let err = BalancedListener::bind(rt.handle(), addr, |_s, _p| async {}).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
    rt.shutdown();
}

/// A listener whose accepts keep failing (its sockets shut down under it,
/// so every accept says `EINVAL`) is retried with pauses that grow, not in
/// a busy loop, and the connections it served go on.
#[test]
fn accepts_that_keep_failing_are_retried_with_pauses_not_at_once() {
    let rt = runtime(2);
    let listener = echo_recording(&rt, Arc::new(Mutex::new(Vec::new())));
    let addr = listener.local_addr();
    let mut good = TcpStream::connect(addr).unwrap();
    good.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    round_trip(&mut good, b"before");
    let fds = common::listening_fds(addr);
    assert!(!fds.is_empty(), "the listeners' sockets");
    for fd in fds {
        // SAFETY: a socket of this process's; only its receiving side is
        // shut down.
        assert_eq!(unsafe { libc::shutdown(fd, libc::SHUT_RD) }, 0);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while listener.accept_errors() == 0 {
        assert!(Instant::now() < deadline, "no failed accept");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(500));
    let errors = listener.accept_errors();
    assert!(errors < 100, "{errors} failed accepts in half a second");
    round_trip(&mut good, b"still served");
}
