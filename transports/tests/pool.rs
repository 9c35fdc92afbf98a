//! Outbound pools against real upstreams on loopback: reuse and the bound
//! per shard (each shard its own connections), waiting callers bounded and
//! timed out, a dead upstream failing fast during backoff and recovered
//! once it is back, a connect that times out, TLS and Unix upstreams, a
//! request abandoned mid-way whose connection is not reused, and use off
//! the shards.

use std::net::{SocketAddr, TcpListener as StdListener};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use mailring_actors::ShardId;
use mailring_transports::codec::LengthDelimited;
use mailring_transports::pool::{Pool, PoolConfig, PoolError, Upstream};
use mailring_transports::tls::{self, TlsAcceptor};
use mailring_transports::{Server, Session, SessionCtx};

mod common;

fn runtime() -> mailring::Runtime {
    mailring::Runtime::builder()
        .shards(2)
        .build()
        .expect("io_uring available")
}

/// Echoes; a frame starting `slow` is answered after 300 ms, one starting
/// `hang` never.
struct Upstreamish;

impl Session for Upstreamish {
    type Codec = LengthDelimited;
    type Key = ();

    async fn on_frame(&mut self, frame: Bytes, cx: &mut SessionCtx<Self>) {
        if frame.starts_with(b"last") {
            cx.send_frame(frame);
            cx.close();
        } else if frame.starts_with(b"hang") {
            cx.reply_later(std::future::pending());
        } else if frame.starts_with(b"slow") {
            cx.reply_later(async move {
                mailring::time::sleep(Duration::from_millis(300)).await;
                frame
            });
        } else {
            cx.send_frame(frame);
        }
    }
}

fn upstream(rt: &mailring::Runtime, addr: SocketAddr) -> Server<Upstreamish> {
    Server::builder(LengthDelimited::new(), |_| Upstreamish)
        .bind(rt.handle(), addr)
        .unwrap()
}

fn config() -> PoolConfig {
    let mut c = PoolConfig::default();
    c.max_connections = 2;
    c.connect_timeout = Duration::from_millis(300);
    c.checkout_timeout = Duration::from_millis(300);
    c.initial_backoff = Duration::from_millis(100);
    c
}

/// A pool to `server` for the tests' two shards.
fn pool_to(server: &Server<Upstreamish>, config: PoolConfig) -> Pool<LengthDelimited> {
    Pool::new(
        Upstream::Tcp(server.local_addr()),
        LengthDelimited::new(),
        config,
        2,
    )
}

/// A pool of one connection per shard to `server`, with one caller let
/// wait, for `checkout` at most.
fn one_connection_pool(server: &Server<Upstreamish>, checkout: Duration) -> Pool<LengthDelimited> {
    let mut c = config();
    c.max_connections = 1;
    c.max_waiting = 1;
    c.checkout_timeout = checkout;
    pool_to(server, c)
}

/// A runtime, an upstream on it, and a pool of one connection per shard
/// to it (the tests' config, changed by `tune`).
fn one_upstream_connection(
    tune: impl FnOnce(&mut PoolConfig),
) -> (
    mailring::Runtime,
    Server<Upstreamish>,
    Pool<LengthDelimited>,
) {
    let rt = runtime();
    let server = upstream(&rt, "127.0.0.1:0".parse().unwrap());
    let mut c = config();
    c.max_connections = 1;
    tune(&mut c);
    let pool = pool_to(&server, c);
    (rt, server, pool)
}

/// Asserts that a request of `frame` gets its own echo (not a reply
/// meant for another caller).
async fn echoed(p: &Pool<LengthDelimited>, frame: &'static [u8]) {
    assert_eq!(
        p.request(Bytes::from_static(frame)).await.unwrap(),
        frame,
        "a request got another's reply"
    );
}

/// Lets the shard's other local tasks run up to their next wait.
async fn let_others_run() {
    for _ in 0..3 {
        mailring::yield_now().await;
    }
}

/// Runs the future `make` builds on `shard` (a pool's futures are the
/// shard's own: not `Send`).
fn on<T, F>(rt: &mailring::Runtime, shard: usize, make: impl FnOnce() -> F + Send + 'static) -> T
where
    T: Send + 'static,
    F: std::future::Future<Output = T> + 'static,
{
    rt.block_on(rt.handle().spawn_local_on(ShardId::new(shard), make))
        .unwrap()
}

#[test]
fn connections_are_reused_bounded_and_kept_per_shard() {
    let rt = runtime();
    let server = upstream(&rt, "127.0.0.1:0".parse().unwrap());
    let pool = pool_to(&server, config());
    let p = pool.clone();
    on(&rt, 0, move || async move {
        for i in 0..10u8 {
            assert_eq!(p.request(Bytes::from(vec![i])).await.unwrap(), vec![i]);
        }
    });
    let s = &pool.stats()[0];
    assert_eq!((s.connects, s.reused, s.open, s.idle), (1, 9, 1, 1));
    // 8 at once with a bound of 2: two connections, everyone served.
    let p = pool.clone();
    on(&rt, 0, move || async move {
        let calls: Vec<_> = (0..8u8)
            .map(|i| {
                let p = p.clone();
                mailring::spawn_local(async move { p.request(Bytes::from(vec![i])).await })
            })
            .collect();
        for (i, c) in calls.into_iter().enumerate() {
            assert_eq!(c.await.unwrap().unwrap(), vec![i as u8]);
        }
    });
    assert_eq!(pool.stats()[0].connects, 2);
    assert_eq!(pool.stats()[0].open, 2);
    // Shard 1 opens its own.
    let p = pool.clone();
    on(&rt, 1, move || async move {
        assert_eq!(
            p.request(Bytes::from_static(b"x")).await.unwrap(),
            &b"x"[..]
        );
    });
    assert_eq!(pool.stats()[1].connects, 1);
    assert_eq!(server.live_connections(), 3);
    rt.block_on(server.shutdown());
}

#[test]
fn waiting_callers_are_bounded_and_time_out() {
    let rt = runtime();
    let server = upstream(&rt, "127.0.0.1:0".parse().unwrap());
    let pool = one_connection_pool(&server, config().checkout_timeout);
    let p = pool.clone();
    on(&rt, 0, move || async move {
        let held = p.get().await.unwrap();
        // One caller may wait; the next is refused at once.
        let p2 = p.clone();
        let waiter = mailring::spawn_local(async move { p2.get().await.map(|_| ()) });
        // Let the waiter run up to its wait (a local task: next in line).
        let_others_run().await;
        assert!(matches!(
            p.get().await,
            Err(PoolError::Saturated {
                connections: 1,
                waiting: 1
            })
        ));
        // The waiter gets the connection when it comes back.
        drop(held);
        waiter.await.unwrap().unwrap();
        // Held again: a caller waits out the checkout timeout.
        let _held = p.get().await.unwrap();
        assert!(matches!(p.get().await, Err(PoolError::CheckoutTimeout)));
    });
    assert_eq!(pool.stats()[0].connects, 1);
    assert_eq!(pool.stats()[0].saturated, 1);
    rt.block_on(server.shutdown());
}

#[test]
fn a_dead_upstream_fails_fast_and_is_used_again_once_back() {
    let rt = runtime();
    // A port with no listener: connects are refused.
    let addr = StdListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let pool = Pool::new(Upstream::Tcp(addr), LengthDelimited::new(), config(), 2);
    let p = pool.clone();
    on(&rt, 0, move || async move {
        assert!(matches!(
            p.request(Bytes::from_static(b"a")).await,
            Err(PoolError::Connect { .. })
        ));
        // Backing off: no connect, an answer at once.
        for _ in 0..5 {
            match p.get().await {
                Err(PoolError::Unhealthy { retry_in, .. }) => {
                    assert!(retry_in <= Duration::from_millis(125));
                }
                other => panic!("expected Unhealthy, got {other:?}"),
            }
        }
    });
    let s = &pool.stats()[0];
    assert_eq!((s.connects, s.connect_failures, s.failed_fast), (1, 1, 5));
    // Back: after the backoff, the next caller connects and is served.
    let server = upstream(&rt, addr);
    let p = pool.clone();
    on(&rt, 0, move || async move {
        mailring::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(
            p.request(Bytes::from_static(b"b")).await.unwrap(),
            &b"b"[..]
        );
        assert_eq!(
            p.request(Bytes::from_static(b"c")).await.unwrap(),
            &b"c"[..]
        );
    });
    assert_eq!(pool.stats()[0].connects, 2);
    rt.block_on(server.shutdown());
}

#[test]
fn a_connect_that_hangs_times_out_as_a_failure() {
    // A listener whose accept queue is full: the kernel drops further
    // SYNs, and a connect waits for retransmits.
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket
        .bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
        .unwrap();
    socket.listen(0).unwrap();
    let addr = socket.local_addr().unwrap().as_socket().unwrap();
    let mut fillers = Vec::new();
    for _ in 0..4 {
        let f = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        f.set_nonblocking(true).unwrap();
        let _ = f.connect(&addr.into());
        fillers.push(f);
    }
    std::thread::sleep(Duration::from_millis(50));
    let rt = runtime();
    let pool = Pool::new(Upstream::Tcp(addr), LengthDelimited::new(), config(), 2);
    let p = pool.clone();
    let err = on(&rt, 0, move || async move {
        p.get().await.map(|_| ()).unwrap_err()
    });
    match err {
        PoolError::Connect { source, .. } => {
            assert_eq!(source.kind(), std::io::ErrorKind::TimedOut, "{source}")
        }
        other => panic!("expected a connect timeout, got {other:?}"),
    }
    assert_eq!(pool.stats()[0].connect_failures, 1);
    drop((socket, fillers));
}

#[test]
fn tls_and_unix_upstreams() {
    let rt = runtime();
    let dir = std::env::temp_dir().join(format!("mailring-pool-{}", std::process::id()));
    let (cert, key) = common::self_signed_localhost(&dir);
    let tls_server = Server::builder(LengthDelimited::new(), |_| Upstreamish)
        .tls(TlsAcceptor::from_pem_files(&cert, &key).unwrap())
        .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
        .unwrap();
    let path = dir.join("upstream.sock");
    let unix_server = Server::builder(LengthDelimited::new(), |_| Upstreamish)
        .bind_unix(rt.handle(), &path)
        .unwrap();
    let tls_pool = Pool::new(
        Upstream::Tls {
            addr: tls_server.local_addr(),
            server_name: "localhost".into(),
            config: Arc::new(tls::client_config_from_ca_pem_file(&cert).unwrap()),
        },
        LengthDelimited::new(),
        config(),
        2,
    );
    let unix_pool = Pool::new(Upstream::Unix(path), LengthDelimited::new(), config(), 2);
    let (t, u) = (tls_pool.clone(), unix_pool.clone());
    on(&rt, 1, move || async move {
        for i in 0..3u8 {
            assert_eq!(t.request(Bytes::from(vec![i])).await.unwrap(), vec![i]);
            assert_eq!(u.request(Bytes::from(vec![i])).await.unwrap(), vec![i]);
        }
    });
    assert_eq!(tls_pool.stats()[1].connects, 1);
    assert_eq!(unix_pool.stats()[1].connects, 1);
    assert_eq!(tls_server.stats().total(|s| s.tls_handshakes), 1);
    // An upstream that closes an idle connection (TLS: `close_notify`,
    // then the end): the next request goes on a new one.
    let (t, u) = (tls_pool.clone(), unix_pool.clone());
    on(&rt, 1, move || async move {
        for pool in [t, u] {
            assert_eq!(
                pool.request(Bytes::from_static(b"last")).await.unwrap(),
                &b"last"[..]
            );
            mailring::time::sleep(Duration::from_millis(50)).await;
            assert_eq!(
                pool.request(Bytes::from_static(b"next")).await.unwrap(),
                &b"next"[..]
            );
        }
    });
    for pool in [&tls_pool, &unix_pool] {
        let s = &pool.stats()[1];
        assert_eq!((s.connects, s.discarded), (2, 1), "{s:?}");
    }
    rt.block_on(tls_server.shutdown());
    rt.block_on(unix_server.shutdown());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_request_abandoned_mid_way_does_not_hand_its_reply_to_the_next_caller() {
    let (rt, server, pool) = one_upstream_connection(|_| {});
    let p = pool.clone();
    on(&rt, 0, move || async move {
        let cut = mailring::time::timeout(
            Duration::from_millis(50),
            p.request(Bytes::from_static(b"slow one")),
        )
        .await;
        assert!(cut.is_err(), "the caller gave up");
        // The next caller gets its own reply, on a new connection.
        echoed(&p, b"fast").await;
    });
    let s = &pool.stats()[0];
    assert_eq!((s.connects, s.discarded), (2, 1));
    rt.block_on(server.shutdown());
}

#[test]
fn a_connection_dropped_mid_exchange_after_a_checkout_is_not_handed_to_the_next_caller() {
    let (rt, server, pool) = one_upstream_connection(|_| {});
    let p = pool.clone();
    on(&rt, 0, move || async move {
        // A request sent through `get`, its caller gone before the reply
        // (a task aborted, an outer timeout).
        let mut conn = p.get().await.unwrap();
        conn.send(Bytes::from_static(b"slow one")).await.unwrap();
        drop(conn);
        echoed(&p, b"fast").await;
        // A receive cut off mid-way.
        let mut conn = p.get().await.unwrap();
        conn.send(Bytes::from_static(b"slow two")).await.unwrap();
        let cut = mailring::time::timeout(Duration::from_millis(50), conn.recv()).await;
        assert!(cut.is_err(), "the receive was cut off");
        drop(conn);
        echoed(&p, b"fast again").await;
        // A whole exchange through `get` leaves it fit for the next.
        let mut conn = p.get().await.unwrap();
        conn.send(Bytes::from_static(b"mine")).await.unwrap();
        assert_eq!(conn.recv().await.unwrap().unwrap(), &b"mine"[..]);
    });
    let s = &pool.stats()[0];
    assert_eq!((s.connects, s.discarded), (3, 2));
    assert_eq!(s.idle, 1, "the last one went back");
    rt.block_on(server.shutdown());
}

#[test]
fn a_request_to_an_upstream_that_stops_answering_times_out_and_drops_its_connection() {
    let (rt, server, pool) =
        one_upstream_connection(|c| c.request_timeout = Duration::from_millis(200));
    let p = pool.clone();
    on(&rt, 0, move || async move {
        match p.request(Bytes::from_static(b"hang")).await {
            Err(PoolError::RequestTimeout { after, .. }) => {
                assert_eq!(after, Duration::from_millis(200));
            }
            other => panic!("a request nobody answers: {other:?}"),
        }
        // Its place is free again: the next caller gets a connection.
        echoed(&p, b"fast").await;
    });
    let s = &pool.stats()[0];
    assert_eq!((s.connects, s.discarded), (2, 1));
    rt.block_on(server.shutdown());
}

#[test]
fn a_waiter_whose_connection_a_newcomer_took_keeps_its_turn() {
    // One connection, room for one waiter. W waits; the connection comes
    // back and W is woken, but before W runs a newcomer takes it and
    // another caller fills the queue behind. W is neither refused as
    // saturated nor sent to the back: it gets the connection next.
    let (rt, server, pool) = one_upstream_connection(|c| {
        c.max_waiting = 1;
        c.checkout_timeout = Duration::from_secs(5);
    });
    let p = pool.clone();
    on(&rt, 0, move || async move {
        let holder = p.get().await.unwrap();
        let w = mailring::spawn_local({
            let p = p.clone();
            async move { p.get().await.map(|_| ()) }
        });
        let_others_run().await;
        drop(holder);
        // Before W runs: the newcomer takes the connection at once, and
        // a third caller queues behind W.
        let newcomer = p.get().await.unwrap();
        let mut third = std::pin::pin!(p.get());
        std::future::poll_fn(|cx| {
            assert!(
                std::future::Future::poll(third.as_mut(), cx).is_pending(),
                "the third queues"
            );
            std::task::Poll::Ready(())
        })
        .await;
        let_others_run().await;
        drop(newcomer);
        assert!(
            matches!(w.await, Ok(Ok(()))),
            "the first waiter was refused or passed over"
        );
        assert!(third.await.is_ok());
    });
    assert_eq!(pool.stats()[0].saturated, 0);
    rt.block_on(server.shutdown());
}

#[test]
fn a_pool_used_off_the_shards_says_so() {
    let pool = Pool::new(
        Upstream::Tcp("127.0.0.1:9".parse().unwrap()),
        LengthDelimited::new(),
        config(),
        2,
    );
    let got = futures::executor::block_on(pool.get());
    assert!(matches!(got, Err(PoolError::OffShard)));
}

#[test]
fn durations_past_any_instant_are_taken_without_overflow() {
    let rt = runtime();
    let addr = StdListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut c = config();
    c.checkout_timeout = Duration::MAX;
    c.connect_timeout = Duration::MAX;
    c.initial_backoff = Duration::MAX;
    c.max_backoff = Duration::MAX;
    let pool = Pool::new(Upstream::Tcp(addr), LengthDelimited::new(), c, 2);
    let p = pool.clone();
    on(&rt, 0, move || async move {
        // Refused at once; then backing off "forever"; then again.
        assert!(matches!(p.get().await, Err(PoolError::Connect { .. })));
        for _ in 0..2 {
            assert!(matches!(p.get().await, Err(PoolError::Unhealthy { .. })));
        }
    });
    assert_eq!(pool.stats()[0].connects, 1);
}

/// A listener whose accept queue is full: connects to it hang until their
/// timeout. Keep the returned sockets alive for as long as it is needed.
fn hanging_upstream() -> (SocketAddr, Vec<socket2::Socket>) {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket
        .bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
        .unwrap();
    socket.listen(0).unwrap();
    let addr = socket.local_addr().unwrap().as_socket().unwrap();
    let mut keep = vec![socket];
    for _ in 0..4 {
        let f = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        f.set_nonblocking(true).unwrap();
        let _ = f.connect(&addr.into());
        keep.push(f);
    }
    std::thread::sleep(Duration::from_millis(50));
    (addr, keep)
}

#[test]
fn a_connect_cancelled_mid_way_gives_its_place_back() {
    let (addr, _keep) = hanging_upstream();
    let rt = runtime();
    let mut c = config();
    c.max_connections = 1;
    let pool = Pool::new(Upstream::Tcp(addr), LengthDelimited::new(), c, 2);
    let p = pool.clone();
    let second = on(&rt, 0, move || async move {
        // A caller queued behind the connect, which is then cancelled.
        let p2 = p.clone();
        let queued = mailring::spawn_local(async move { p2.get().await.map(|_| ()) });
        let cut = mailring::time::timeout(Duration::from_millis(50), p.get()).await;
        assert!(cut.is_err(), "the caller gave up on its connect");
        // The queued caller is not left waiting for a place nobody holds:
        // it connects itself (and times out, as the upstream hangs).
        let queued = queued.await.unwrap();
        assert!(
            matches!(&queued, Err(PoolError::Connect { source, .. }) if source.kind() == std::io::ErrorKind::TimedOut),
            "{queued:?}"
        );
        mailring::time::sleep(Duration::from_millis(150)).await;
        p.get().await.map(|_| ())
    });
    match second {
        Err(PoolError::Connect { source, .. }) => {
            assert_eq!(source.kind(), std::io::ErrorKind::TimedOut, "{source}")
        }
        other => panic!("expected a connect of its own, got {other:?}"),
    }
    assert_eq!(pool.stats()[0].open, 0);
    assert_eq!(pool.stats()[0].connects, 3);
}

#[test]
fn a_caller_that_stops_waiting_leaves_the_queue_and_the_next_gets_the_connection() {
    let rt = runtime();
    let server = upstream(&rt, "127.0.0.1:0".parse().unwrap());
    let pool = one_connection_pool(&server, Duration::from_secs(5));
    let p = pool.clone();
    on(&rt, 0, move || async move {
        let held = p.get().await.unwrap();
        // A caller waits, then gives up.
        let gave_up = mailring::time::timeout(Duration::from_millis(10), p.get()).await;
        assert!(gave_up.is_err());
        // Its place in the queue is free again...
        let p2 = p.clone();
        let next = mailring::spawn_local(async move {
            let started = std::time::Instant::now();
            p2.get().await.map(|_| started.elapsed())
        });
        let_others_run().await;
        // ...and the connection goes to the caller still waiting.
        drop(held);
        let waited = next.await.unwrap().expect("the live waiter is served");
        assert!(waited < Duration::from_secs(4), "{waited:?}");
        // A waiter woken and then dropped before it ran passes the
        // connection on to the one behind it.
        let held = p.get().await.unwrap();
        let (p2, p3) = (p.clone(), p.clone());
        let woken_then_dropped = mailring::spawn_local(async move { p2.get().await.map(|_| ()) });
        let_others_run().await;
        drop(held);
        woken_then_dropped.abort();
        let behind = mailring::spawn_local(async move { p3.get().await.map(|_| ()) });
        assert!(behind.await.unwrap().is_ok());
    });
    assert_eq!(pool.stats()[0].saturated, 0);
    rt.block_on(server.shutdown());
}

#[test]
fn dropping_every_clone_of_a_pool_closes_its_idle_connections() {
    let rt = runtime();
    let server = upstream(&rt, "127.0.0.1:0".parse().unwrap());
    let pool = pool_to(&server, config());
    for shard in 0..2 {
        let p = pool.clone();
        on(&rt, shard, move || async move {
            p.request(Bytes::from_static(b"x")).await.unwrap();
        });
    }
    assert_eq!(server.live_connections(), 2);
    drop(pool);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while server.live_connections() != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "{} upstream connections still open",
            server.live_connections()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    rt.block_on(server.shutdown());
}

#[test]
fn after_a_backoff_one_caller_tries_the_upstream_and_the_others_fail_fast() {
    let (addr, _keep) = hanging_upstream();
    let rt = runtime();
    let mut c = config();
    c.max_connections = 4;
    c.max_backoff = Duration::from_secs(10);
    let pool = Pool::new(Upstream::Tcp(addr), LengthDelimited::new(), c, 2);
    let p = pool.clone();
    on(&rt, 0, move || async move {
        assert!(matches!(p.get().await, Err(PoolError::Connect { .. })));
        mailring::time::sleep(Duration::from_millis(150)).await;
        let calls: Vec<_> = (0..4)
            .map(|_| {
                let p = p.clone();
                mailring::spawn_local(async move { p.get().await.map(|_| ()) })
            })
            .collect();
        let mut connects = 0;
        let mut fast = 0;
        for call in calls {
            match call.await.unwrap() {
                Err(PoolError::Connect { .. }) => connects += 1,
                Err(PoolError::Unhealthy { .. }) => fast += 1,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!((connects, fast), (1, 3));
        // One failure more: the backoff doubled once (200 ms, ±25%).
        match p.get().await {
            Err(PoolError::Unhealthy { retry_in, .. }) => {
                assert!(retry_in <= Duration::from_millis(250), "{retry_in:?}")
            }
            other => panic!("{other:?}"),
        }
    });
    assert_eq!(pool.stats()[0].connects, 2);
}

/// Four requests on `p`, 50 ms apart, each answered with its own frame.
async fn four_requests_50_ms_apart(p: Pool<LengthDelimited>) {
    for frame in [&b"one"[..], b"two", b"three", b"four"] {
        let reply = p.request(Bytes::from_static(frame)).await;
        assert_eq!(reply.unwrap(), frame);
        mailring::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An upstream on a std thread: it accepts connections in turn and, on
/// each, echoes bytes. `then(n)` says what happens after the first echo
/// on connection `n`: more bytes sent unasked, a close, or nothing.
fn scripted_upstream(then: fn(usize) -> Option<&'static [u8]>) -> SocketAddr {
    use std::io::{Read, Write};
    let listener = StdListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for (n, conn) in listener.incoming().enumerate().take(8) {
            let Ok(mut conn) = conn else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 256];
                let mut first = true;
                loop {
                    let Ok(k) = conn.read(&mut buf) else { return };
                    if k == 0 || conn.write_all(&buf[..k]).is_err() {
                        return;
                    }
                    if std::mem::take(&mut first) {
                        match then(n) {
                            Some(b"") => return,
                            Some(extra) => {
                                let _ = conn.write_all(extra);
                            }
                            None => {}
                        }
                    }
                }
            });
        }
    });
    addr
}

#[test]
fn an_idle_connection_that_was_closed_or_sent_bytes_unasked_is_not_handed_out() {
    // Connection 0 sends a frame nobody asked for after its first reply;
    // connection 1 closes after its first reply; connection 2 behaves.
    let addr = scripted_upstream(|n| match n {
        0 => Some(b"\0\0\0\x04junk"),
        1 => Some(b""),
        _ => None,
    });
    let rt = runtime();
    let pool = Pool::new(Upstream::Tcp(addr), LengthDelimited::new(), config(), 2);
    let p = pool.clone();
    on(&rt, 0, move || four_requests_50_ms_apart(p));
    let s = &pool.stats()[0];
    assert_eq!((s.connects, s.discarded, s.reused), (3, 2, 1), "{s:?}");
}

#[test]
fn a_failed_connect_neither_refuses_an_idle_connection_nor_outlasts_good_service() {
    // One connection accepted, then the listener is gone: later connects
    // are refused while the first connection keeps serving.
    use std::io::{Read, Write};
    let listener = StdListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        drop(listener);
        let mut buf = [0u8; 256];
        while let Ok(k) = conn.read(&mut buf) {
            if k == 0 || conn.write_all(&buf[..k]).is_err() {
                return;
            }
        }
    });
    let rt = runtime();
    let pool = Pool::new(Upstream::Tcp(addr), LengthDelimited::new(), config(), 2);
    let p = pool.clone();
    on(&rt, 0, move || async move {
        let mut held = p.get().await.unwrap();
        held.send(Bytes::from_static(b"a")).await.unwrap();
        assert_eq!(held.recv().await.unwrap().unwrap(), &b"a"[..]);
        // A second connection is refused: the pool backs off...
        assert!(matches!(p.get().await, Err(PoolError::Connect { .. })));
        drop(held);
        // ...but the idle connection still serves.
        assert_eq!(
            p.request(Bytes::from_static(b"b")).await.unwrap(),
            &b"b"[..]
        );
        // The upstream served well: a later failure backs off from the
        // first step again, not from a doubled one.
        mailring::time::sleep(Duration::from_millis(150)).await;
        let held = p.get().await.unwrap();
        assert!(matches!(p.get().await, Err(PoolError::Connect { .. })));
        drop(held);
        let mut held = p.get().await.unwrap();
        match p.get().await {
            Err(PoolError::Unhealthy { retry_in, .. }) => {
                assert!(retry_in <= Duration::from_millis(125), "{retry_in:?}")
            }
            other => panic!("{other:?}"),
        }
        held.discard();
    });
    let s = &pool.stats()[0];
    assert_eq!((s.connects, s.connect_failures), (3, 2), "{s:?}");
}

#[test]
fn a_connection_whose_write_side_was_shut_is_not_handed_out_again() {
    // The caller ends its request with a half-close; the upstream echoes,
    // reads the end and keeps its side open a while (a slow close): the
    // connection can send nothing more, so the next caller gets another.
    use std::io::{Read, Write};
    let listener = StdListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming().take(4) {
            let Ok(mut conn) = conn else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 256];
                loop {
                    match conn.read(&mut buf) {
                        Ok(0) => {
                            std::thread::sleep(Duration::from_secs(2));
                            return;
                        }
                        Ok(k) => {
                            if conn.write_all(&buf[..k]).is_err() {
                                return;
                            }
                        }
                        Err(_) => return,
                    }
                }
            });
        }
    });
    let rt = runtime();
    let pool = Pool::new(Upstream::Tcp(addr), LengthDelimited::new(), config(), 2);
    let p = pool.clone();
    on(&rt, 0, move || async move {
        let mut c = p.get().await.unwrap();
        c.send(Bytes::from_static(b"a")).await.unwrap();
        assert_eq!(c.recv().await.unwrap().unwrap(), &b"a"[..]);
        c.close_write().await.unwrap();
        drop(c);
        assert_eq!(
            p.request(Bytes::from_static(b"b")).await.unwrap(),
            &b"b"[..]
        );
    });
    let s = &pool.stats()[0];
    assert_eq!((s.connects, s.reused, s.discarded), (2, 0, 1), "{s:?}");
}

#[test]
fn an_idle_tls_connection_sent_data_unasked_is_not_handed_out() {
    // A TLS upstream (rustls on a std thread) echoes frames; on its first
    // connection it sends one more frame, unasked, after the first echo.
    // Records come unasked over TLS anyway (its session tickets): the idle
    // connection's queued records are read through the record layer at
    // checkout, and one holding data is dropped, not handed out (its frame
    // would be read as the next caller's reply, and every reply after it
    // would be one behind).
    idle_tls_connection_sent_unasked(false);
}

#[test]
fn an_idle_tls_connection_sent_part_of_a_record_unasked_is_not_handed_out() {
    // As above, with only the first half of the unasked record sent (the
    // rest on its way, as a long record's are): the connection is not
    // handed out either (its next reply would be read behind those bytes).
    idle_tls_connection_sent_unasked(true);
}

/// A TLS echo upstream that sends a frame unasked after its first echo on
/// its first connection (only the first half of its record if `half`);
/// four requests 50 ms apart through a pool all get their own replies,
/// and the pool drops the connection that was sent the frame.
fn idle_tls_connection_sent_unasked(half: bool) {
    use std::io::{Read, Write};
    let dir = std::env::temp_dir().join(format!("mailring-pool-tls-{}-{half}", std::process::id()));
    let (cert, key) = common::self_signed_localhost(&dir);
    let server_config = Arc::new(tls::server_config_from_pem_files(&cert, &key).unwrap());
    let listener = StdListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for (n, tcp) in listener.incoming().enumerate().take(4) {
            let Ok(tcp) = tcp else { return };
            let config = server_config.clone();
            std::thread::spawn(move || {
                let conn = rustls::ServerConnection::new(config).unwrap();
                let mut tls = rustls::StreamOwned::new(conn, tcp);
                let mut first = true;
                loop {
                    let mut len = [0u8; 4];
                    if tls.read_exact(&mut len).is_err() {
                        return;
                    }
                    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
                    if tls.read_exact(&mut body).is_err() {
                        return;
                    }
                    let _ = tls.write_all(&len);
                    let _ = tls.write_all(&body);
                    let _ = tls.flush();
                    if std::mem::take(&mut first) && n == 0 {
                        std::thread::sleep(Duration::from_millis(20));
                        if half {
                            let _ = tls.conn.writer().write_all(b"\0\0\0\x04junk");
                            let mut record = Vec::new();
                            let _ = tls.conn.write_tls(&mut record);
                            let _ = tls.sock.write_all(&record[..record.len() / 2]);
                            let _ = tls.sock.flush();
                            // The rest is late (the connection stays
                            // open meanwhile): it is not to be used again.
                            std::thread::sleep(Duration::from_secs(2));
                            return;
                        }
                        let _ = tls.write_all(b"\0\0\0\x04junk");
                        let _ = tls.flush();
                    }
                }
            });
        }
    });
    let rt = runtime();
    let pool = Pool::new(
        Upstream::Tls {
            addr,
            server_name: "localhost".into(),
            config: Arc::new(tls::client_config_from_ca_pem_file(&cert).unwrap()),
        },
        LengthDelimited::new(),
        config(),
        2,
    );
    let p = pool.clone();
    on(&rt, 0, move || four_requests_50_ms_apart(p));
    let s = &pool.stats()[0];
    assert_eq!((s.connects, s.discarded, s.reused), (2, 1, 2), "{s:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A task that panics while it holds a connection (its exchange finished,
/// so the frame counts balance) does not give the connection back: what
/// the user's code had set up on it (a transaction begun, a database
/// selected) is unknown. The next caller gets a fresh connection.
#[test]
fn a_connection_held_by_a_task_that_panics_is_not_given_back() {
    let rt = runtime();
    let server = upstream(&rt, "127.0.0.1:0".parse().unwrap());
    let pool = pool_to(&server, config());
    let p = pool.clone();
    let panicked = rt.block_on(
        rt.handle()
            .spawn_local_on(ShardId::new(0), move || async move {
                let mut c = p.get().await.unwrap();
                c.send(Bytes::from_static(b"BEGIN")).await.unwrap();
                assert_eq!(c.recv().await.unwrap().unwrap(), &b"BEGIN"[..]);
                panic!("the caller's code panics with the connection in hand");
            }),
    );
    assert!(panicked.is_err(), "the task panicked");
    let p = pool.clone();
    on(&rt, 0, move || async move { echoed(&p, b"after").await });
    let s = &pool.stats()[0];
    assert_eq!((s.connects, s.reused, s.discarded), (2, 0, 1), "{s:?}");
}

/// A connection left idle longer than the pool's idle timeout is closed
/// at the next checkout, not handed out: a server's own idle close, or a
/// NAT that forgot the flow, may have ended it without a word (a caller
/// would then wait its whole request timeout on a connection nobody
/// answers).
#[test]
fn a_connection_idle_past_the_idle_timeout_is_not_handed_out() {
    let rt = runtime();
    let server = upstream(&rt, "127.0.0.1:0".parse().unwrap());
    let mut c = config();
    c.idle_timeout = Duration::from_millis(50);
    let pool = pool_to(&server, c);
    let p = pool.clone();
    on(&rt, 0, move || async move {
        echoed(&p, b"one").await;
        echoed(&p, b"two").await;
        mailring::time::sleep(Duration::from_millis(120)).await;
        echoed(&p, b"three").await;
    });
    let s = &pool.stats()[0];
    assert_eq!((s.connects, s.reused, s.discarded), (2, 1, 1), "{s:?}");
}
