//! Sessions over real loopback sockets: echo, pipelining with replies
//! ready out of order, attach to the key's shard (both listener modes,
//! unread bytes carried), bad input and limits, shutdown.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use mailring_actors::{Actor, ActorSystem, Ctx, Handler, Message, ShardId, SystemConfig};
mod common;

use common::{client, connect_steered_to, frame, read_frame, round_trip, wait_for, Echo};
use mailring_transports::codec::{Codec, CodecError, LengthDelimited};
use mailring_transports::{
    CloseKind, Framed, ListenMode, Route, Server, ServerConfig, Session, SessionCloser, SessionCtx,
};

fn runtime(shards: usize) -> mailring::Runtime {
    mailring::Runtime::builder()
        .shards(shards)
        .build()
        .expect("io_uring available")
}

/// The key a `KEY <name>` frame names; "not yet" for any other frame.
fn key_named_by(frame: &Bytes) -> Route<String> {
    match frame.strip_prefix(b"KEY ") {
        Some(key) => Route::Key(String::from_utf8_lossy(key).into_owned()),
        None => Route::NotYet,
    }
}

/// A server on loopback with `config`, its sessions made by `make`.
fn one_shard_server<S: Session<Codec = LengthDelimited>>(
    rt: &mailring::Runtime,
    config: ServerConfig,
    make: impl Fn(Option<std::net::SocketAddr>) -> S + Send + Sync + 'static,
) -> Server<S> {
    Server::builder(LengthDelimited::new(), make)
        .config(config)
        .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
        .unwrap()
}

/// Frames `[0]`, `[1]`, ... `[n - 1]` in one buffer (one write: pipelined).
fn numbered_frames(n: u8) -> Vec<u8> {
    (0..n).flat_map(|i| frame(&[i])).collect()
}

#[test]
fn echo_over_reuseport_listeners_and_a_clean_peer_close() {
    let rt = runtime(2);
    let server = Server::builder(LengthDelimited::new(), |_| Echo)
        .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
        .unwrap();
    let mut clients: Vec<TcpStream> = (0..8).map(|_| client(server.local_addr())).collect();
    for round in 0..5 {
        for (i, c) in clients.iter_mut().enumerate() {
            let body = format!("client {i} round {round}");
            c.write_all(&frame(body.as_bytes())).unwrap();
            assert_eq!(read_frame(c).unwrap(), body.as_bytes());
        }
    }
    drop(clients);
    wait_for(&server, "8 peer closes", |s| {
        s.closed(CloseKind::PeerClosed) == 8
    });
    let stats = server.stats();
    assert_eq!(stats.total(|s| s.accepted), 8);
    assert_eq!(stats.total(|s| s.frames_in), 40);
    assert_eq!(stats.total(|s| s.io_off_owner), 0);
    let report = rt.block_on(server.shutdown());
    assert_eq!(report.open_at_start, 0);
    rt.shutdown();
}

#[test]
fn frames_of_every_size_around_the_small_read_buffer_come_back_whole() {
    // A connection whose reads are small receives into a small buffer
    // (2 KiB); a frame that fills it, or crosses it, or is far bigger,
    // is read on at once and comes back whole, one at a time, pipelined,
    // and after the reads have turned small again.
    let rt = runtime(1);
    let server = one_shard_server(&rt, ServerConfig::default(), |_| Echo);
    let mut c = client(server.local_addr());
    let body = |n: usize| -> Vec<u8> { (0..n).map(|i| (i * 7 + n) as u8).collect() };
    let sizes = [
        1, 2043, 2044, 2045, 2048, 4096, 100_000, 3, 2044, 1, 16_380, 16_384, 9, 70_000, 2,
    ];
    for round in 0..3 {
        for &n in &sizes {
            let b = body(n);
            c.write_all(&frame(&b)).unwrap();
            assert_eq!(read_frame(&mut c).unwrap(), b, "{n} bytes, round {round}");
        }
        // All at once.
        let wire: Vec<u8> = sizes.iter().flat_map(|&n| frame(&body(n))).collect();
        c.write_all(&wire).unwrap();
        for &n in &sizes {
            assert_eq!(read_frame(&mut c).unwrap(), body(n), "{n} bytes pipelined");
        }
    }
    drop(c);
    rt.block_on(server.shutdown());
    rt.shutdown();
}

#[test]
fn requests_of_a_few_kib_one_at_a_time_take_one_receive_each() {
    // Once reads are big, receives ask for whole chunks again and stay
    // there: a 4,000-byte request sent alone is one receive, not a small
    // buffer filled and a second receive for the rest (each request).
    let rt = runtime(1);
    let server = one_shard_server(&rt, ServerConfig::default(), |_| Echo);
    let mut c = client(server.local_addr());
    let body = vec![7u8; 4000];
    // The first fills the small buffer a fresh connection starts with.
    round_trip(&mut c, &body);
    let before = server.stats().total(|s| s.recv_ops);
    for _ in 0..50 {
        round_trip(&mut c, &body);
    }
    let receives = server.stats().total(|s| s.recv_ops) - before;
    // One per request (its bytes arrive together on loopback), and a few
    // spare for a request the kernel hands over in two parts.
    assert!(receives <= 55, "{receives} receives for 50 requests");
    drop(c);
    rt.block_on(server.shutdown());
    rt.shutdown();
}

#[test]
fn plain_connections_move_to_the_less_loaded_shard_only_when_asked() {
    let rt = runtime(2);
    let balanced = {
        let mut config = ServerConfig::default();
        config.balance_plain_connections = true;
        Server::builder(LengthDelimited::new(), |_| Echo)
            .config(config)
            .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
            .unwrap()
    };
    let plain = Server::builder(LengthDelimited::new(), |_| Echo)
        .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
        .unwrap();
    assert!(balanced.is_steered() && plain.is_steered());
    // Four connections the kernel sends to shard 0 of each, one after
    // another, each answered before the next.
    let mut held = Vec::new();
    for server in [&balanced, &plain] {
        for i in 0..4 {
            let mut c = connect_steered_to(server.local_addr(), 0);
            let body = format!("hello {i}");
            c.write_all(&frame(body.as_bytes())).unwrap();
            assert_eq!(read_frame(&mut c).unwrap(), body.as_bytes());
            held.push(c);
        }
    }
    // Asked: they split between the shards, each served where it went.
    let stats = balanced.stats();
    assert_eq!(stats.shards[0].accepted, 4);
    assert_eq!(stats.shards[0].balanced_away, 2, "{stats:#?}");
    assert_eq!((stats.shards[0].open, stats.shards[1].open), (2, 2));
    assert_eq!(stats.total(|s| s.io_off_owner), 0);
    // Not asked: they stay where the kernel put them.
    let stats = plain.stats();
    assert_eq!(stats.total(|s| s.balanced_away), 0);
    assert_eq!((stats.shards[0].open, stats.shards[1].open), (4, 0));
    drop(held);
    rt.block_on(balanced.shutdown());
    rt.block_on(plain.shutdown());
    rt.shutdown();
}

#[test]
fn a_burst_of_fresh_connections_splits_evenly_when_balanced() {
    let rt = runtime(2);
    let mut config = ServerConfig::default();
    config.balance_plain_connections = true;
    let server = Server::builder(LengthDelimited::new(), |_| Echo)
        .config(config)
        .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
        .unwrap();
    // Shard 0 is held while eight connections queue in its listener, so
    // it takes them all in one go: each must see the moves decided before
    // it, not only the connections that have arrived.
    let hold = rt.handle().spawn_on(mailring::ShardId::new(0), async {
        std::thread::sleep(std::time::Duration::from_millis(300));
    });
    let mut clients: Vec<TcpStream> = (0..8)
        .map(|_| connect_steered_to(server.local_addr(), 0))
        .collect();
    rt.block_on(hold).unwrap();
    for (i, c) in clients.iter_mut().enumerate() {
        let body = format!("burst {i}");
        c.write_all(&frame(body.as_bytes())).unwrap();
        assert_eq!(read_frame(c).unwrap(), body.as_bytes());
    }
    let stats = server.stats();
    assert_eq!(stats.shards[0].accepted, 8);
    assert_eq!(
        (stats.shards[0].open, stats.shards[1].open),
        (4, 4),
        "{stats:#?}"
    );
    drop(clients);
    rt.block_on(server.shutdown());
    rt.shutdown();
}

/// Each frame is a number `n`; its reply is deferred and becomes ready
/// after `(16 - n) ms`, so later replies are ready first.
struct Delayed {
    in_flight: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    ready_order: Arc<Mutex<Vec<u8>>>,
}

impl Delayed {
    /// Counts a request in flight (and the most at once); the counters its
    /// reply updates when ready.
    fn start(&self) -> (Arc<AtomicUsize>, Arc<Mutex<Vec<u8>>>) {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        (self.in_flight.clone(), self.ready_order.clone())
    }
}

impl Session for Delayed {
    type Codec = LengthDelimited;
    type Key = ();

    async fn on_frame(&mut self, frame: Bytes, cx: &mut SessionCtx<Self>) {
        let n = frame[0];
        let (in_flight, order) = self.start();
        cx.reply_later(async move {
            mailring::time::sleep(Duration::from_millis(u64::from(16 - n.min(16)) * 3)).await;
            in_flight.fetch_sub(1, Ordering::SeqCst);
            order.lock().unwrap().push(n);
            frame
        });
    }
}

/// As [`Delayed`], but reply n is ready once reply n + 1 is (15 at once):
/// the later request's reply is ready first whatever the timing of the
/// frames' handling. Bounded: with fewer than 16 in flight the order
/// breaks and the test says so, rather than hanging.
struct ReadyInReverse(Delayed);

impl Session for ReadyInReverse {
    type Codec = LengthDelimited;
    type Key = ();

    async fn on_frame(&mut self, frame: Bytes, cx: &mut SessionCtx<Self>) {
        let n = frame[0];
        let (in_flight, order) = self.0.start();
        cx.reply_later(async move {
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while n < 15
                && !order.lock().unwrap().contains(&(n + 1))
                && std::time::Instant::now() < deadline
            {
                mailring::time::sleep(Duration::from_millis(1)).await;
            }
            in_flight.fetch_sub(1, Ordering::SeqCst);
            order.lock().unwrap().push(n);
            frame
        });
    }
}

/// `BLOCK` defers its reply 100 ms and holds the frames after it; any
/// other frame is answered with whether the `BLOCK` reply was ready when
/// the frame was handled.
struct Blocking {
    done: Arc<AtomicUsize>,
}

impl Session for Blocking {
    type Codec = LengthDelimited;
    type Key = ();

    async fn on_frame(&mut self, frame: Bytes, cx: &mut SessionCtx<Self>) {
        if frame.as_ref() == b"BLOCK" {
            let done = self.done.clone();
            cx.reply_later(async move {
                mailring::time::sleep(Duration::from_millis(100)).await;
                done.fetch_add(1, Ordering::SeqCst);
                Bytes::from_static(b"unblocked")
            });
            cx.hold_frames_until_replied();
        } else {
            let n = self.done.load(Ordering::SeqCst);
            cx.send_frame(Bytes::from(format!(
                "{} {n}",
                String::from_utf8_lossy(&frame)
            )));
        }
    }
}

/// Gathers frames and answers each run of them with one deferred reply
/// of many, made in `on_drained`; `!now` is answered at once, after what
/// was gathered before it. Records each run's size.
struct Gathering {
    gathered: Vec<Bytes>,
    runs: Arc<Mutex<Vec<usize>>>,
}

impl Gathering {
    fn send_gathered(&mut self, cx: &mut SessionCtx<Self>) {
        if self.gathered.is_empty() {
            return;
        }
        let run = std::mem::take(&mut self.gathered);
        self.runs.lock().unwrap().push(run.len());
        cx.reply_later_many(run.len(), async move {
            mailring::time::sleep(Duration::from_millis(20)).await;
            run.into_iter()
                .map(|f| Bytes::from([&b"ok "[..], &f].concat()))
                .collect()
        });
    }
}

impl Session for Gathering {
    type Codec = LengthDelimited;
    type Key = ();

    async fn on_frame(&mut self, frame: Bytes, cx: &mut SessionCtx<Self>) {
        if frame.as_ref() == b"!now" {
            self.send_gathered(cx);
            cx.send_frame(frame);
        } else {
            self.gathered.push(frame);
        }
    }

    fn on_drained(&mut self, cx: &mut SessionCtx<Self>) {
        self.send_gathered(cx);
    }
}

#[test]
fn a_pipelined_run_is_answered_by_one_deferred_reply_of_many_in_order() {
    let rt = runtime(1);
    let runs = Arc::new(Mutex::new(Vec::new()));
    let r = runs.clone();
    let server = Server::builder(LengthDelimited::new(), move |_| Gathering {
        gathered: Vec::new(),
        runs: r.clone(),
    })
    .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
    .unwrap();
    let mut c = client(server.local_addr());
    let mut burst = Vec::new();
    for n in 0..8 {
        burst.extend(frame(format!("a{n}").as_bytes()));
    }
    burst.extend(frame(b"!now"));
    for n in 0..8 {
        burst.extend(frame(format!("b{n}").as_bytes()));
    }
    c.write_all(&burst).unwrap();
    for n in 0..8 {
        assert_eq!(read_frame(&mut c).unwrap(), format!("ok a{n}").as_bytes());
    }
    // Ready at once, written after the deferred run before it.
    assert_eq!(read_frame(&mut c).unwrap(), b"!now");
    for n in 0..8 {
        assert_eq!(read_frame(&mut c).unwrap(), format!("ok b{n}").as_bytes());
    }
    // One write, read whole: two runs of eight (the second sent when the
    // frames ran out). Without `on_drained` the second run never goes.
    assert_eq!(*runs.lock().unwrap(), [8, 8]);
    // A run cut by the end of the bytes goes when they run out, too.
    c.write_all(&frame(b"c")).unwrap();
    assert_eq!(read_frame(&mut c).unwrap(), b"ok c");
    // And when the peer closes right after it: answered, then closed.
    c.write_all(&frame(b"d")).unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    assert_eq!(read_frame(&mut c).unwrap(), b"ok d");
    let mut rest = Vec::new();
    c.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    drop(c);
    rt.block_on(server.shutdown());
    rt.shutdown();
}

/// `SET n` stores `n` after a delay (a deferred reply); `GET` answers
/// the stored value in turn, once every reply before it is ready, holding
/// the frames after it until then (a later `SET` would change what it
/// reads); `PEEK` answers it at once.
struct InTurn {
    value: Arc<AtomicUsize>,
}

impl Session for InTurn {
    type Codec = LengthDelimited;
    type Key = ();

    async fn on_frame(&mut self, frame: Bytes, cx: &mut SessionCtx<Self>) {
        let value = self.value.clone();
        match frame.as_ref() {
            b"GET" => {
                cx.reply_in_turn(move || {
                    Bytes::from(format!("got {}", value.load(Ordering::SeqCst)))
                });
                cx.hold_frames_until_replied();
            }
            b"LATER" => {
                // Its future made in turn: it reads the value then, after
                // a wait of its own.
                cx.reply_later_in_turn(move || async move {
                    let seen = value.load(Ordering::SeqCst);
                    mailring::time::sleep(Duration::from_millis(5)).await;
                    Bytes::from(format!("later {seen}"))
                });
                cx.hold_frames_until_replied();
            }
            b"PEEK" => cx.send_frame(Bytes::from(format!(
                "peek {}",
                value.load(Ordering::SeqCst)
            ))),
            set => {
                let n: usize = String::from_utf8_lossy(&set[4..]).parse().unwrap();
                cx.reply_later(async move {
                    mailring::time::sleep(Duration::from_millis(30)).await;
                    value.store(n, Ordering::SeqCst);
                    Bytes::from(format!("set {n}"))
                });
            }
        }
    }
}

#[test]
fn a_reply_in_turn_sees_what_the_replies_before_it_did() {
    let rt = runtime(1);
    let server = Server::builder(LengthDelimited::new(), |_| InTurn {
        value: Arc::new(AtomicUsize::new(0)),
    })
    .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
    .unwrap();
    let mut c = client(server.local_addr());
    let mut burst = Vec::new();
    for f in [&b"SET 1"[..], b"PEEK", b"GET", b"SET 2", b"GET", b"GET"] {
        burst.extend(frame(f));
    }
    c.write_all(&burst).unwrap();
    let replies: Vec<Vec<u8>> = (0..6).map(|_| read_frame(&mut c).unwrap()).collect();
    assert_eq!(
        replies,
        [
            &b"set 1"[..],
            b"peek 0",
            b"got 1",
            b"set 2",
            b"got 2",
            b"got 2"
        ]
    );
    // With nothing pending it is answered at once.
    c.write_all(&frame(b"GET")).unwrap();
    assert_eq!(read_frame(&mut c).unwrap(), b"got 2");
    // A deferred reply made in turn starts after the replies before it.
    let mut burst = Vec::new();
    for f in [&b"SET 3"[..], b"LATER", b"SET 4", b"LATER", b"LATER"] {
        burst.extend(frame(f));
    }
    c.write_all(&burst).unwrap();
    let replies: Vec<Vec<u8>> = (0..5).map(|_| read_frame(&mut c).unwrap()).collect();
    assert_eq!(
        replies,
        [&b"set 3"[..], b"later 3", b"set 4", b"later 4", b"later 4"]
    );
    drop(c);
    rt.block_on(server.shutdown());
    rt.shutdown();
}

#[test]
fn a_second_reuseport_server_on_a_taken_port_is_refused() {
    // Another process's reuseport group on the same port would get half the
    // connections; the bind must fail instead, as a plain listener's does.
    let rt = runtime(2);
    let first = Server::builder(LengthDelimited::new(), |_| Echo)
        .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
        .unwrap();
    let second =
        Server::builder(LengthDelimited::new(), |_| Echo).bind(rt.handle(), first.local_addr());
    let Err(err) = second else {
        panic!("the port is taken");
    };
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
    // The first server still answers.
    let mut c = client(first.local_addr());
    c.write_all(&frame(b"still here")).unwrap();
    assert_eq!(read_frame(&mut c).unwrap(), b"still here");
}

#[test]
fn a_held_session_handles_no_frame_until_its_replies_are_written() {
    let rt = runtime(1);
    let done = Arc::new(AtomicUsize::new(0));
    let d = done.clone();
    let server = Server::builder(LengthDelimited::new(), move |_| Blocking {
        done: d.clone(),
    })
    .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
    .unwrap();
    let mut c = client(server.local_addr());
    let mut burst = frame(b"a");
    burst.extend(frame(b"BLOCK"));
    burst.extend(frame(b"b"));
    c.write_all(&burst).unwrap();
    assert_eq!(read_frame(&mut c).unwrap(), b"a 0");
    assert_eq!(read_frame(&mut c).unwrap(), b"unblocked");
    // Handled only after the blocking reply was ready.
    assert_eq!(read_frame(&mut c).unwrap(), b"b 1");
    // The hold ends with it.
    c.write_all(&frame(b"c")).unwrap();
    assert_eq!(read_frame(&mut c).unwrap(), b"c 1");
}

#[test]
fn pipelined_requests_are_handled_at_once_and_answered_in_order() {
    let rt = runtime(2);
    let in_flight = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let ready_order = Arc::new(Mutex::new(Vec::new()));
    let (f, m, o) = (in_flight.clone(), most.clone(), ready_order.clone());
    let server = Server::builder(LengthDelimited::new(), move |_| {
        ReadyInReverse(Delayed {
            in_flight: f.clone(),
            most: m.clone(),
            ready_order: o.clone(),
        })
    })
    .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
    .unwrap();
    let mut c = client(server.local_addr());
    c.write_all(&numbered_frames(16)).unwrap();
    for n in 0..16u8 {
        assert_eq!(
            read_frame(&mut c).unwrap(),
            [n],
            "replies leave in request order"
        );
    }
    assert_eq!(
        most.load(Ordering::SeqCst),
        16,
        "all 16 pipelined requests were in flight at once"
    );
    let order = ready_order.lock().unwrap().clone();
    assert_eq!(
        order.first(),
        Some(&15),
        "reply 15 was ready first: {order:?}"
    );
    assert_eq!(order.last(), Some(&0), "reply 0 was ready last: {order:?}");
    drop(c);
    rt.block_on(server.shutdown());
    rt.shutdown();
}

#[test]
fn reading_pauses_while_the_pipeline_window_is_full() {
    let rt = runtime(1);
    let in_flight = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let (f, m) = (in_flight.clone(), most.clone());
    let mut config = ServerConfig::default();
    config.pipeline_window = 4;
    let server = Server::builder(LengthDelimited::new(), move |_| Delayed {
        in_flight: f.clone(),
        most: m.clone(),
        ready_order: Default::default(),
    })
    .config(config)
    .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
    .unwrap();
    let mut c = client(server.local_addr());
    c.write_all(&numbered_frames(16)).unwrap();
    for n in 0..16u8 {
        assert_eq!(read_frame(&mut c).unwrap(), [n]);
    }
    assert_eq!(most.load(Ordering::SeqCst), 4, "never more than the window");
    drop(c);
    rt.block_on(server.shutdown());
    rt.shutdown();
}

/// A tenant's actor, placed by a custom function that is not the sticky
/// hash (so a session that did not follow it would land elsewhere).
#[derive(Actor)]
#[actor(key = String, activate = Tenant::new, placement = by_last_digit, handles(WhereAreYou))]
struct Tenant;

impl Tenant {
    fn new(_key: &String) -> Self {
        Tenant
    }
}

// The placement function takes the actor's key type.
#[allow(clippy::ptr_arg)]
fn by_last_digit(key: &String, shards: usize) -> ShardId {
    let digit = key
        .bytes()
        .last()
        .map_or(0, |b| usize::from(b.wrapping_sub(b'0')));
    ShardId::new(digit % shards)
}

#[derive(Message)]
#[message(reply = usize)]
struct WhereAreYou;

impl Handler<WhereAreYou> for Tenant {
    async fn handle(&mut self, _m: WhereAreYou, cx: &mut Ctx<Self>) -> usize {
        cx.shard().index()
    }
}

/// A tenant's actor placed by `placement = "balanced"`: the fewest keys
/// per shard, recorded in a directory.
#[derive(Actor)]
#[actor(key = String, activate = BalancedTenant::new, placement = "balanced", handles(WhereAreYou))]
struct BalancedTenant;

impl BalancedTenant {
    fn new(_key: &String) -> Self {
        BalancedTenant
    }
}

impl Handler<WhereAreYou> for BalancedTenant {
    async fn handle(&mut self, _m: WhereAreYou, cx: &mut Ctx<Self>) -> usize {
        cx.shard().index()
    }
}

/// First frame: `KEY <tenant>`; before it, `PING` is answered where the
/// connection is. After it, each frame is answered with
/// `"<session shard> <actor shard> <frame>"`, the actor being the key's
/// `A` (`Tenant` unless said).
struct TenantSession<A = Tenant> {
    system: mailring_actors::SystemHandle,
    actor: std::marker::PhantomData<fn() -> A>,
}

impl<A> TenantSession<A> {
    fn new(system: mailring_actors::SystemHandle) -> Self {
        TenantSession {
            system,
            actor: std::marker::PhantomData,
        }
    }
}

impl<A> Session for TenantSession<A>
where
    A: Actor<Key = String> + mailring_actors::Accepts<WhereAreYou>,
    A::Envelope: Send,
{
    type Codec = LengthDelimited;
    type Key = String;

    fn route(&mut self, frame: &Bytes, _cx: &SessionCtx<Self>) -> Route<String> {
        key_named_by(frame)
    }

    fn refusal(&mut self, _reason: &mailring_transports::CloseReason) -> Option<Bytes> {
        Some(Bytes::from_static(b"-ERR max number of clients reached"))
    }

    async fn on_frame(&mut self, frame: Bytes, cx: &mut SessionCtx<Self>) {
        let Some(key) = cx.key().cloned() else {
            cx.send_frame(Bytes::from_static(b"PONG"));
            return;
        };
        let actor = self.system.keyed::<A>(key);
        let here = cx.shard().index();
        let session_shard = mailring::current_shard().map(|s| s.index());
        assert_eq!(session_shard, Some(here));
        cx.reply_later(async move {
            let there = actor.ask(WhereAreYou).await.unwrap_or(usize::MAX);
            let mut out = format!("{here} {there} ").into_bytes();
            out.extend_from_slice(&frame);
            Bytes::from(out)
        });
    }
}

/// An actor system on `rt` and a server of `TenantSession`s following
/// `Tenant`'s placement, on loopback.
fn tenant_server(
    rt: &mailring::Runtime,
    config: ServerConfig,
) -> (ActorSystem, Server<TenantSession>) {
    tenant_server_of::<Tenant>(rt, config)
}

/// As [`tenant_server`], with sessions following the actor type `A`.
fn tenant_server_of<A>(
    rt: &mailring::Runtime,
    config: ServerConfig,
) -> (ActorSystem, Server<TenantSession<A>>)
where
    A: Actor<Key = String> + mailring_actors::Accepts<WhereAreYou>,
    A::Envelope: Send,
{
    let system = ActorSystem::start_on(rt.handle(), SystemConfig::default()).unwrap();
    let sys = system.handle();
    let server = Server::builder(LengthDelimited::new(), move |_| {
        TenantSession::<A>::new(sys.clone())
    })
    .config(config)
    .follow::<A>(system.handle())
    .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
    .unwrap();
    (system, server)
}

/// Connects `n` clients of tenants `tenant-0..n`: a `PING` before the key
/// (answered wherever the connection was accepted), then the key and three
/// more frames in one write (the unread bytes travel with the connection),
/// each answered on the tenant's shard. Returns each client with its
/// tenant's shard.
fn attach_tenants<A>(
    server: &Server<TenantSession<A>>,
    system: &ActorSystem,
    n: usize,
) -> Vec<(TcpStream, usize)>
where
    A: Actor<Key = String> + mailring_actors::Accepts<WhereAreYou>,
    A::Envelope: Send,
{
    let mut clients = Vec::new();
    for t in 0..n {
        let tenant = format!("tenant-{t}");
        let owner = system.shard_of::<A>(&tenant).index();
        let mut c = client(server.local_addr());
        c.write_all(&frame(b"PING")).unwrap();
        assert_eq!(read_frame(&mut c).unwrap(), b"PONG");
        let mut burst = frame(format!("KEY {tenant}").as_bytes());
        for i in 0..3 {
            burst.extend_from_slice(&frame(format!("req {i}").as_bytes()));
        }
        c.write_all(&burst).unwrap();
        let expect_key = format!("{owner} {owner} KEY {tenant}");
        assert_eq!(read_frame(&mut c).unwrap(), expect_key.as_bytes());
        for i in 0..3 {
            let expect = format!("{owner} {owner} req {i}");
            assert_eq!(read_frame(&mut c).unwrap(), expect.as_bytes());
        }
        clients.push((c, owner));
    }
    clients
}

fn attach_test(mode: ListenMode) {
    let rt = runtime(2);
    let mut config = ServerConfig::default();
    config.listen = mode;
    let (system, server) = tenant_server(&rt, config);
    let mut clients = attach_tenants(&server, &system, 12);
    // Later traffic stays on the owner.
    for (c, owner) in &mut clients {
        c.write_all(&frame(b"again")).unwrap();
        assert_eq!(
            read_frame(c).unwrap(),
            format!("{owner} {owner} again").as_bytes()
        );
    }
    let stats = server.stats();
    assert_eq!(
        stats.total(|s| s.io_off_owner),
        0,
        "every recv and send ran on its owner"
    );
    assert_eq!(stats.total(|s| s.attached), 12);
    if let ListenMode::SingleAcceptor(acceptor) = mode {
        let moved = clients
            .iter()
            .filter(|(_, o)| *o != acceptor.index())
            .count() as u64;
        assert!(moved > 0, "some tenant lives on the other shard");
        assert_eq!(stats.total(|s| s.handed_off), moved);
        assert_eq!(stats.shards[acceptor.index()].accepted, 12);
    }
    drop(clients);
    wait_for(&server, "12 peer closes", |s| {
        s.closed(CloseKind::PeerClosed) == 12
    });
    rt.block_on(server.shutdown());
    system.shutdown();
}

#[test]
fn sessions_following_a_balanced_type_split_evenly_and_run_beside_their_actor() {
    let rt = runtime(2);
    let (system, server) = tenant_server_of::<BalancedTenant>(&rt, ServerConfig::default());
    // `attach_tenants` checks that each session and its tenant's actor run
    // on the shard `shard_of` names, before the actor exists and after.
    let clients = attach_tenants(&server, &system, 12);
    let on_first = clients.iter().filter(|(_, owner)| *owner == 0).count();
    assert_eq!(on_first, 6, "12 balanced tenants on 2 shards: 6 each");
    assert_eq!(server.stats().total(|s| s.io_off_owner), 0);
    drop(clients);
    wait_for(&server, "12 peer closes", |s| {
        s.closed(CloseKind::PeerClosed) == 12
    });
    rt.block_on(server.shutdown());
    system.shutdown();
}

#[test]
fn a_session_attaches_to_its_tenants_shard_with_reuseport_listeners() {
    attach_test(ListenMode::ReusePort);
}

#[test]
fn a_session_attaches_to_its_tenants_shard_from_a_single_acceptor() {
    attach_test(ListenMode::SingleAcceptor(ShardId::new(0)));
}

/// Bad clients each close only their own connection, with a counted
/// reason, while a good client keeps getting correct replies.
#[test]
fn bad_clients_close_only_their_connection_with_a_counted_reason() {
    let rt = runtime(2);
    let mut config = ServerConfig::default();
    config.frame_timeout = Some(Duration::from_millis(300));
    config.idle_timeout = Some(Duration::from_millis(600));
    let server = Server::builder(LengthDelimited::new().max_frame(1024), |_| Echo)
        .config(config)
        .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
        .unwrap();
    let addr = server.local_addr();
    let mut good = client(addr);
    let check_good = |good: &mut TcpStream, i: usize| {
        let body = format!("still here {i}");
        good.write_all(&frame(body.as_bytes())).unwrap();
        assert_eq!(read_frame(good).unwrap(), body.as_bytes());
    };
    check_good(&mut good, 0);

    // Oversized: refused from its header.
    let mut big = client(addr);
    big.write_all(&(1u32 << 30).to_be_bytes()).unwrap();
    check_good(&mut good, 1);
    wait_for(&server, "oversized frame", |s| {
        s.closed(CloseKind::BadFrame) == 1
    });
    assert_eq!(
        big.read(&mut [0u8; 8]).unwrap_or(0),
        0,
        "the server closed it"
    );

    // Truncated: half a frame, then the peer closes.
    let mut half = client(addr);
    half.write_all(&frame(b"0123456789")[..7]).unwrap();
    half.shutdown(Shutdown::Write).unwrap();
    check_good(&mut good, 2);
    wait_for(&server, "truncated frame", |s| {
        s.closed(CloseKind::BadFrame) == 2
    });

    // A byte now and then: the frame deadline closes it.
    let mut slow = client(addr);
    slow.write_all(&frame(b"abcdef")[..5]).unwrap();
    check_good(&mut good, 3);
    wait_for(&server, "frame timeout", |s| {
        s.closed(CloseKind::FrameTimeout) == 1
    });

    // Connects and sends nothing: the idle timeout closes it (the good
    // client keeps talking meanwhile, so its own idle timer never fires).
    let silent = client(addr);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut i = 4;
    while server.stats().closed(CloseKind::IdleTimeout) == 0 {
        assert!(Instant::now() < deadline, "no idle timeout");
        check_good(&mut good, i);
        i += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(server.stats().closed(CloseKind::IdleTimeout), 1);
    check_good(&mut good, i);
    drop((big, half, slow, silent));
    let stats = server.stats();
    assert_eq!(stats.closed(CloseKind::PeerClosed), 0);
    assert_eq!(server.live_connections(), 1, "only the good client is left");
    drop(good);
    rt.block_on(server.shutdown());
    rt.shutdown();
}

/// Sends `n` frames of 64 KiB on the first frame it gets.
struct Firehose;

impl Session for Firehose {
    type Codec = LengthDelimited;
    type Key = ();

    async fn on_frame(&mut self, _frame: Bytes, cx: &mut SessionCtx<Self>) {
        let chunk = Bytes::from(vec![7u8; 64 << 10]);
        for _ in 0..64 {
            cx.send_frame(chunk.clone());
        }
    }
}

#[test]
fn a_peer_that_stops_reading_is_closed_past_the_outbound_limit() {
    let rt = runtime(1);
    let mut config = ServerConfig::default();
    config.outbound_high_water = 256 << 10;
    config.outbound_limit = 1 << 20;
    config.slow_reader_grace = Duration::from_millis(300);
    let server = Server::builder(LengthDelimited::new(), |_| Firehose)
        .config(config)
        .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
        .unwrap();
    let mut c = client(server.local_addr());
    // 4 MiB per request, never read: the socket buffers fill, the queue
    // grows past the limit.
    for _ in 0..4 {
        if c.write_all(&frame(b"go")).is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    wait_for(&server, "slow reader close", |s| {
        s.closed(CloseKind::SlowReader) == 1
    });
    drop(c);
    rt.block_on(server.shutdown());
    rt.shutdown();
}

#[test]
fn the_listener_stops_accepting_at_its_connection_limit() {
    let rt = runtime(1);
    let mut config = ServerConfig::default();
    config.max_connections = 2;
    let server = one_shard_server(&rt, config, |_| Echo);
    let addr = server.local_addr();
    let mut a = client(addr);
    let mut b = client(addr);
    for c in [&mut a, &mut b] {
        c.write_all(&frame(b"x")).unwrap();
        assert_eq!(read_frame(c).unwrap(), b"x");
    }
    // The third connects (the kernel's backlog) but is not served.
    let mut third = client(addr);
    third
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    third.write_all(&frame(b"wait")).unwrap();
    assert!(read_frame(&mut third).is_err(), "not served at the limit");
    wait_for(&server, "accept paused", |s| {
        s.total(|s| s.accept_paused) >= 1
    });
    drop(a);
    third
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    assert_eq!(
        read_frame(&mut third).unwrap(),
        b"wait",
        "served once one closed"
    );
    drop((b, third));
    rt.block_on(server.shutdown());
    rt.shutdown();
}

#[test]
fn shutdown_finishes_outstanding_replies_and_closes_idle_connections() {
    let rt = runtime(2);
    let server = Server::builder(LengthDelimited::new(), |_| Delayed {
        in_flight: Default::default(),
        most: Default::default(),
        ready_order: Default::default(),
    })
    .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
    .unwrap();
    let addr = server.local_addr();
    let mut busy = client(addr);
    let mut idle = client(addr);
    idle.write_all(&frame(&[15])).unwrap();
    assert_eq!(read_frame(&mut idle).unwrap(), [15]);
    // 48 ms of work outstanding when the shutdown starts.
    busy.write_all(&frame(&[0])).unwrap();
    std::thread::sleep(Duration::from_millis(5));
    let report = rt.block_on(server.shutdown());
    assert_eq!(report.open_at_start, 2);
    assert_eq!(report.forced, 0);
    assert_eq!(
        read_frame(&mut busy).unwrap(),
        [0],
        "the outstanding reply was written"
    );
    assert_eq!(busy.read(&mut [0u8; 1]).unwrap(), 0, "then closed");
    assert_eq!(idle.read(&mut [0u8; 1]).unwrap(), 0, "the idle one closed");
    // The runtime's report says it too.
    let runtime_report = rt.shutdown();
    assert_eq!(runtime_report.drained.len(), 1);
    let line = &runtime_report.drained[0];
    assert!(line.name.starts_with("server 127.0.0.1:"), "{line:?}");
    assert_eq!((line.drained, line.dropped), (2, 0));
}

#[test]
fn unix_sessions_move_to_their_tenants_shard_and_a_framed_client_drives_them() {
    let rt = runtime(2);
    let system = ActorSystem::start_on(rt.handle(), SystemConfig::default()).unwrap();
    let sys = system.handle();
    let path = std::env::temp_dir().join(format!("mailring-sessions-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let server = Server::builder(LengthDelimited::new(), move |peer| {
        assert_eq!(peer, None, "Unix peers have no address");
        TenantSession::<Tenant>::new(sys.clone())
    })
    .follow::<Tenant>(system.handle())
    .bind_unix(rt.handle(), &path)
    .unwrap();
    let tenants: Vec<(String, usize)> = (0..6)
        .map(|t| {
            let tenant = format!("unix-{t}");
            let owner = system.shard_of::<Tenant>(&tenant).index();
            (tenant, owner)
        })
        .collect();
    let client_path = path.clone();
    let expected = tenants.clone();
    rt.block_on_local(move || async move {
        for (tenant, owner) in expected {
            let mut c = Framed::connect_unix(&client_path, LengthDelimited::new())
                .await
                .unwrap();
            c.send(Bytes::from_static(b"PING")).await.unwrap();
            assert_eq!(c.recv().await.unwrap().unwrap(), &b"PONG"[..]);
            c.feed(Bytes::from(format!("KEY {tenant}"))).unwrap();
            c.feed(Bytes::from_static(b"one")).unwrap();
            c.flush().await.unwrap();
            let first = c.recv().await.unwrap().unwrap();
            assert_eq!(first, format!("{owner} {owner} KEY {tenant}").as_bytes());
            let second = c.recv().await.unwrap().unwrap();
            assert_eq!(second, format!("{owner} {owner} one").as_bytes());
            c.close_write().await.unwrap();
            assert_eq!(
                c.recv().await.unwrap(),
                None,
                "the server closes after the peer"
            );
        }
    });
    wait_for(&server, "6 peer closes", |s| {
        s.closed(CloseKind::PeerClosed) == 6
    });
    let stats = server.stats();
    let moved = tenants.iter().filter(|(_, o)| *o != 0).count() as u64;
    assert!(moved > 0, "some tenant lives on shard 1");
    assert_eq!(stats.total(|s| s.handed_off), moved);
    assert_eq!(stats.total(|s| s.io_off_owner), 0);
    rt.block_on(server.shutdown());
    assert!(!path.exists(), "shutdown removes the socket's path");
    system.shutdown();
}

#[test]
fn a_push_reaches_every_live_session_of_a_key_and_none_else() {
    let rt = runtime(2);
    let (system, server) = tenant_server(&rt, ServerConfig::default());
    let attach = |tenant: &str| {
        let mut c = client(server.local_addr());
        c.write_all(&frame(format!("KEY {tenant}").as_bytes()))
            .unwrap();
        read_frame(&mut c).unwrap();
        c
    };
    let mut ones: Vec<TcpStream> = (0..3).map(|_| attach("tenant-1")).collect();
    let mut other = attach("tenant-2");
    let sessions = server.sessions();
    // From a task on some shard, with the count coming back.
    let s = sessions.clone();
    let reached = rt
        .block_on(rt.spawn(async move {
            s.push_counted(&"tenant-1".to_string(), |_session, cx| {
                cx.send_frame(Bytes::from_static(b"PUSH"));
            })
            .await
        }))
        .unwrap();
    assert_eq!(reached, 3);
    for c in &mut ones {
        assert_eq!(read_frame(c).unwrap(), b"PUSH");
    }
    // The other tenant got nothing: its next reply is its own.
    other.write_all(&frame(b"mine")).unwrap();
    assert!(read_frame(&mut other).unwrap().ends_with(b" mine"));
    // No session: a counted dead letter, by round trip and fire-and-forget.
    let nobody = "nobody".to_string();
    let s = sessions.clone();
    let n2 = nobody.clone();
    assert_eq!(
        rt.block_on(async move { s.push_counted(&n2, |_, _| {}).await }),
        0
    );
    sessions.push(&nobody, |_, _| panic!("no session runs this"));
    wait_for(&server, "2 dead letters", |s| {
        s.total(|s| s.push_dead_letters) == 2
    });
    // A closed session leaves the key's table.
    drop(ones.pop());
    wait_for(&server, "a close", |s| s.closed(CloseKind::PeerClosed) == 1);
    let s = sessions.clone();
    let reached = rt.block_on(async move {
        s.push_counted(&"tenant-1".to_string(), |_, cx| {
            cx.send_frame(Bytes::from_static(b"AGAIN"))
        })
        .await
    });
    assert_eq!(reached, 2);
    for c in &mut ones {
        assert_eq!(read_frame(c).unwrap(), b"AGAIN");
    }
    assert_eq!(server.stats().total(|s| s.pushes_delivered), 5);
    drop((ones, other));
    rt.block_on(server.shutdown());
    system.shutdown();
}

#[test]
fn a_push_to_a_session_past_its_outbound_limit_waits_without_stopping_its_shard() {
    // A push made a session's output pass its outbound limit (its client
    // stopped reading), and another push came: pushes wait while the
    // output is past the limit, and the session used to go round its loop
    // for them without ever yielding, so its shard served nothing more
    // (not even the send or the timer that would end the slow reader).
    let (rt, system, server, slow) = pushed_past_the_limit(Duration::from_millis(300));
    // The shard still serves another client, and ends the slow reader.
    let mut other = client(server.local_addr());
    other.write_all(&frame(b"PING")).unwrap();
    assert_eq!(read_frame(&mut other).unwrap(), b"PONG");
    wait_for(&server, "slow reader close", |s| {
        s.closed(CloseKind::SlowReader) == 1
    });
    drop((slow, other));
    rt.block_on(server.shutdown());
    system.shutdown();
}

#[test]
fn a_push_held_by_the_outbound_limit_runs_once_the_client_reads() {
    // As above, but the client reads again before its grace ends: the
    // waiting push runs once the output is back under the limit.
    let (rt, system, server, mut c) = pushed_past_the_limit(Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(50));
    for _ in 0..32 {
        assert_eq!(read_frame(&mut c).unwrap().len(), 1 << 20);
    }
    assert_eq!(read_frame(&mut c).unwrap(), b"after");
    assert_eq!(server.stats().closed(CloseKind::SlowReader), 0);
    drop(c);
    rt.block_on(server.shutdown());
    system.shutdown();
}

/// A one-shard tenant server (outbound limit 1 MiB, slow readers closed
/// after `grace`) and a client of `tenant-1` that reads nothing after its
/// key's answer, pushed 32 frames of 1 MiB and then, 50 ms later, a frame
/// `after`.
fn pushed_past_the_limit(
    grace: Duration,
) -> (
    mailring::Runtime,
    ActorSystem,
    Server<TenantSession>,
    TcpStream,
) {
    let rt = runtime(1);
    let mut config = ServerConfig::default();
    config.outbound_high_water = 256 << 10;
    config.outbound_limit = 1 << 20;
    config.slow_reader_grace = grace;
    let (system, server) = tenant_server(&rt, config);
    let mut c = client(server.local_addr());
    c.write_all(&frame(b"KEY tenant-1")).unwrap();
    read_frame(&mut c).unwrap();
    let sessions = server.sessions();
    let chunk = Bytes::from(vec![7u8; 1 << 20]);
    sessions.push(&"tenant-1".to_string(), move |_, cx| {
        for _ in 0..32 {
            cx.send_frame(chunk.clone());
        }
    });
    std::thread::sleep(Duration::from_millis(50));
    sessions.push(&"tenant-1".to_string(), |_, cx| {
        cx.send_frame(Bytes::from_static(b"after"));
    });
    (rt, system, server, c)
}

/// Echoes, but panics on `boom` (in the handler), on `later` (in a
/// deferred reply) and after `drained` (in `on_drained`).
#[derive(Default)]
struct Fragile {
    drain_panics: bool,
}

impl Session for Fragile {
    type Codec = LengthDelimited;
    type Key = ();

    async fn on_frame(&mut self, frame: Bytes, cx: &mut SessionCtx<Self>) {
        match &frame[..] {
            b"boom" => panic!("session handler panics on purpose"),
            b"later" => cx.reply_later(async { panic!("deferred reply panics on purpose") }),
            b"drained" => self.drain_panics = true,
            b"many-short" => {
                cx.reply_later_many(2, async { vec![Bytes::from_static(b"only one")] })
            }
            b"many-panic" => {
                cx.reply_later_many(2, async { panic!("deferred replies panic on purpose") })
            }
            _ => cx.send_frame(frame),
        }
    }

    fn on_drained(&mut self, _cx: &mut SessionCtx<Self>) {
        if self.drain_panics {
            panic!("on_drained panics on purpose");
        }
    }
}

#[test]
fn a_panicking_session_or_factory_closes_only_its_connection() {
    let rt = runtime(2);
    let made = Arc::new(AtomicUsize::new(0));
    let m = made.clone();
    let server = Server::builder(LengthDelimited::new(), move |_| {
        if m.fetch_add(1, Ordering::SeqCst) == 6 {
            panic!("factory panics on purpose");
        }
        Fragile::default()
    })
    .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
    .unwrap();
    let addr = server.local_addr();
    let mut good = client(addr);
    let echo = |c: &mut TcpStream, body: &[u8]| {
        c.write_all(&frame(body)).unwrap();
        assert_eq!(read_frame(c).unwrap(), body);
    };
    echo(&mut good, b"before");
    let poisons = [
        &b"boom"[..],
        b"later",
        b"drained",
        b"many-short",
        b"many-panic",
    ];
    for (n, poison) in poisons.into_iter().enumerate() {
        let mut bad = client(addr);
        echo(&mut bad, b"fine so far");
        bad.write_all(&frame(poison)).unwrap();
        assert_eq!(
            bad.read(&mut [0u8; 8]).unwrap_or(0),
            0,
            "closed after the panic"
        );
        wait_for(&server, "a panic close", |s| {
            s.closed(CloseKind::Panicked) == n as u64 + 1
        });
        echo(&mut good, b"still served");
    }
    // The seventh connection's factory panics: that connection is dropped.
    let mut refused = client(addr);
    refused.write_all(&frame(b"anyone?")).unwrap();
    assert_eq!(refused.read(&mut [0u8; 8]).unwrap_or(0), 0);
    wait_for(&server, "the factory's panic", |s| {
        s.closed(CloseKind::Panicked) == 6
    });
    // The listener still accepts.
    let mut after = client(addr);
    echo(&mut after, b"accepted after");
    echo(&mut good, b"and still served");
    assert_eq!(server.live_connections(), 2);
    let panics = rt
        .stats()
        .shards
        .iter()
        .map(|s| s.panics.total())
        .sum::<u64>();
    assert_eq!(panics, 6, "each panic reported to the runtime");
    drop((good, after));
    rt.block_on(server.shutdown());
    rt.shutdown();
}

#[test]
fn past_the_per_key_limit_a_session_is_refused_through_its_codec() {
    let rt = runtime(2);
    let mut config = ServerConfig::default();
    config.max_per_key = Some(2);
    let (system, server) = tenant_server(&rt, config);
    let key_frame = frame(b"KEY tenant-7");
    let attach = || {
        let mut c = client(server.local_addr());
        c.write_all(&key_frame).unwrap();
        let reply = read_frame(&mut c).unwrap();
        (c, reply)
    };
    let (a, ra) = attach();
    let (_b, rb) = attach();
    assert!(ra.ends_with(b"KEY tenant-7") && rb.ends_with(b"KEY tenant-7"));
    for _ in 0..2 {
        let (mut refused, reply) = attach();
        assert_eq!(reply, b"-ERR max number of clients reached");
        assert_eq!(refused.read(&mut [0u8; 8]).unwrap_or(0), 0, "then closed");
    }
    wait_for(&server, "2 refusals", |s| {
        s.closed(CloseKind::KeyLimit) == 2
    });
    // Another key is not affected; and a slot freed is a slot taken.
    let mut other = client(server.local_addr());
    other.write_all(&frame(b"KEY tenant-8")).unwrap();
    assert!(read_frame(&mut other).unwrap().ends_with(b"KEY tenant-8"));
    drop(a);
    wait_for(&server, "a close", |s| s.closed(CloseKind::PeerClosed) == 1);
    let (_c, rc) = attach();
    assert!(
        rc.ends_with(b"KEY tenant-7"),
        "{:?}",
        String::from_utf8_lossy(&rc)
    );
    rt.block_on(server.shutdown());
    system.shutdown();
}

#[test]
fn past_the_servers_client_limit_a_connection_is_told_and_closed() {
    let rt = runtime(2);
    let mut config = ServerConfig::default();
    config.max_clients = Some(2);
    let (system, server) = tenant_server(&rt, config);
    let ping = |c: &mut TcpStream| {
        c.write_all(&frame(b"PING")).unwrap();
        read_frame(c).unwrap()
    };
    let mut a = client(server.local_addr());
    let mut b = client(server.local_addr());
    assert_eq!(ping(&mut a), b"PONG");
    assert_eq!(ping(&mut b), b"PONG");
    for _ in 0..3 {
        // Told at once, before it sends anything, then closed.
        let mut refused = client(server.local_addr());
        assert_eq!(
            read_frame(&mut refused).unwrap(),
            b"-ERR max number of clients reached"
        );
        assert_eq!(refused.read(&mut [0u8; 8]).unwrap_or(0), 0, "then closed");
    }
    wait_for(&server, "3 refusals", |s| {
        s.closed(CloseKind::ClientLimit) == 3
    });
    // Those served are not affected; a place freed is a place taken.
    assert_eq!(ping(&mut a), b"PONG");
    drop(b);
    wait_for(&server, "a close", |s| s.closed(CloseKind::PeerClosed) == 1);
    let mut c = client(server.local_addr());
    assert_eq!(ping(&mut c), b"PONG");
    rt.block_on(server.shutdown());
    system.shutdown();
}

#[test]
fn a_client_that_picks_its_source_port_lands_on_its_keys_shard_without_a_hand_off() {
    let rt = runtime(2);
    let (system, server) = tenant_server(&rt, ServerConfig::default());
    assert!(server.is_steered(), "the kernel here takes the program");
    let addr = server.local_addr();
    let tenants: Vec<(String, usize)> = (0..10)
        .map(|t| {
            let tenant = format!("steered-{t}");
            let owner = system.shard_of::<Tenant>(&tenant).index();
            (tenant, owner)
        })
        .collect();
    let expected = tenants.clone();
    rt.block_on_local(move || async move {
        let mut open = Vec::new();
        for (tenant, owner) in expected {
            let mut c =
                Framed::connect_tcp_to_shard(addr, ShardId::new(owner), 2, LengthDelimited::new())
                    .await
                    .unwrap();
            c.send(Bytes::from(format!("KEY {tenant}"))).await.unwrap();
            let reply = c.recv().await.unwrap().unwrap();
            assert_eq!(reply, format!("{owner} {owner} KEY {tenant}").as_bytes());
            open.push(c);
        }
    });
    let stats = server.stats();
    assert_eq!(stats.total(|s| s.handed_off), 0, "{stats:#?}");
    assert_eq!(stats.total(|s| s.attached), 10);
    for shard in 0..2 {
        let owned = tenants.iter().filter(|(_, o)| *o == shard).count() as u64;
        assert_eq!(stats.shards[shard].accepted, owned, "shard {shard}");
    }
    rt.block_on(server.shutdown());
    system.shutdown();
}

#[test]
fn ordinary_clients_spread_over_the_steered_listeners() {
    // Linux gives connect() even ephemeral ports (bind() gets the odd
    // ones): steering by `port % shards` sent every ordinary client to
    // shard 0 of 2.
    let rt = runtime(2);
    let server = Server::builder(LengthDelimited::new(), |_| Echo)
        .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
        .unwrap();
    assert!(server.is_steered(), "the kernel here takes the program");
    let clients: Vec<TcpStream> = (0..32).map(|_| client(server.local_addr())).collect();
    wait_for(&server, "32 accepts", |s| s.total(|s| s.accepted) == 32);
    let per_shard: Vec<u64> = server.stats().shards.iter().map(|s| s.accepted).collect();
    assert!(per_shard.iter().all(|&n| n >= 6), "{per_shard:?}");
    drop(clients);
    rt.block_on(server.shutdown());
}

#[test]
fn a_shard_past_the_group_is_refused_before_connecting() {
    let rt = runtime(1);
    let err = rt.block_on_local(|| async {
        Framed::connect_tcp_to_shard(
            "127.0.0.1:9".parse().unwrap(),
            ShardId::new(2),
            2,
            LengthDelimited::new(),
        )
        .await
        .unwrap_err()
    });
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    rt.shutdown();
}

#[test]
fn a_session_that_names_no_key_in_time_is_closed_and_a_keyed_one_is_not() {
    let rt = runtime(2);
    let mut config = ServerConfig::default();
    config.handshake_timeout = Some(Duration::from_millis(300));
    let (system, server) = tenant_server(&rt, config);
    let mut keyed = client(server.local_addr());
    keyed.write_all(&frame(b"KEY tenant-3")).unwrap();
    assert!(read_frame(&mut keyed).unwrap().ends_with(b"KEY tenant-3"));
    let mut chatty = client(server.local_addr());
    // Talks, but never names a key.
    for _ in 0..3 {
        chatty.write_all(&frame(b"PING")).unwrap();
        assert_eq!(read_frame(&mut chatty).unwrap(), b"PONG");
    }
    wait_for(&server, "handshake timeout", |s| {
        s.closed(CloseKind::HandshakeTimeout) == 1
    });
    assert_eq!(chatty.read(&mut [0u8; 8]).unwrap_or(0), 0);
    std::thread::sleep(Duration::from_millis(400));
    keyed.write_all(&frame(b"later")).unwrap();
    assert!(
        read_frame(&mut keyed).unwrap().ends_with(b" later"),
        "the keyed one stays"
    );
    drop(keyed);
    rt.block_on(server.shutdown());
    system.shutdown();
}

#[test]
fn frames_streamed_during_the_hand_off_are_all_handled_in_order_on_the_owner() {
    let rt = runtime(2);
    let mut config = ServerConfig::default();
    config.listen = ListenMode::SingleAcceptor(ShardId::new(0));
    let (system, server) = tenant_server(&rt, config);
    // A tenant of shard 1: its connection moves.
    let tenant = (0..100)
        .map(|t| format!("tenant-{t}"))
        .find(|t| system.shard_of::<Tenant>(t).index() == 1)
        .unwrap();
    let c = client(server.local_addr());
    let mut writer = c.try_clone().unwrap();
    let key_frame = frame(format!("KEY {tenant}").as_bytes());
    // Keep writing while the connection moves: the key, then 2,000 frames
    // in small writes.
    let sender = std::thread::spawn(move || {
        writer.write_all(&key_frame).unwrap();
        for i in 0..2_000u32 {
            writer.write_all(&frame(&i.to_be_bytes())).unwrap();
        }
    });
    let mut reader = c;
    let first = read_frame(&mut reader).unwrap();
    assert_eq!(first, format!("1 1 KEY {tenant}").as_bytes());
    for i in 0..2_000u32 {
        let reply = read_frame(&mut reader).unwrap();
        assert_eq!(&reply[..4], b"1 1 ", "frame {i} handled on the owner");
        assert_eq!(&reply[4..], i.to_be_bytes(), "frame {i} in order");
    }
    sender.join().unwrap();
    let stats = server.stats();
    assert_eq!(stats.total(|s| s.handed_off), 1);
    assert_eq!(stats.total(|s| s.io_off_owner), 0);
    drop(reader);
    rt.block_on(server.shutdown());
    system.shutdown();
}

/// Two shards with `slots` direct descriptors each, and a tenant server
/// accepting on shard 0 that hands connections off as direct descriptors.
fn direct_tenant_server(slots: u32) -> (mailring::Runtime, ActorSystem, Server<TenantSession>) {
    let rt = mailring::Runtime::builder()
        .shards(2)
        .direct_descriptors(slots)
        .build()
        .unwrap();
    let mut config = ServerConfig::default();
    config.listen = ListenMode::SingleAcceptor(ShardId::new(0));
    config.hand_off = mailring_transports::HandOff::Direct;
    let (system, server) = tenant_server(&rt, config);
    (rt, system, server)
}

/// `n` tenants whose actors live on shard 1.
fn tenants_on_shard_1(system: &ActorSystem, n: usize) -> Vec<String> {
    (0..1000)
        .map(|t| format!("tenant-{t}"))
        .filter(|t| system.shard_of::<Tenant>(t).index() == 1)
        .take(n)
        .collect()
}

/// A client that names `tenant` (of shard 1), answered on shard 1.
fn key_served_on_shard_1(server: &Server<TenantSession>, tenant: &str) -> TcpStream {
    let mut c = client(server.local_addr());
    c.write_all(&frame(format!("KEY {tenant}").as_bytes()))
        .unwrap();
    assert_eq!(
        read_frame(&mut c).unwrap(),
        format!("1 1 KEY {tenant}").as_bytes()
    );
    c
}

/// The occupied direct-descriptor slots of each shard.
fn slots_in_use(rt: &mailring::Runtime) -> Vec<u64> {
    rt.stats()
        .shards
        .iter()
        .map(|s| s.direct_descriptors)
        .collect()
}

/// Waits (bounded) until no shard holds a direct-descriptor slot.
fn wait_no_slots(rt: &mailring::Runtime) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while slots_in_use(rt).iter().any(|&n| n != 0) {
        assert!(Instant::now() < deadline, "slots left: {:?}", rt.stats());
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn direct_descriptors_move_over_msg_ring_and_their_slots_are_all_given_back() {
    let (rt, system, server) = direct_tenant_server(256);
    let clients = attach_tenants(&server, &system, 12);
    let stats = server.stats();
    let moved = clients.iter().filter(|(_, o)| *o != 0).count() as u64;
    assert!(moved > 0);
    assert_eq!(stats.total(|s| s.handed_off), moved);
    assert_eq!(
        stats.total(|s| s.direct_refused),
        0,
        "every connection went direct"
    );
    assert_eq!(stats.total(|s| s.io_off_owner), 0);
    // Every connection holds a slot on its owner's ring, none is left on
    // the acceptor's for the moved ones.
    let in_use = slots_in_use(&rt);
    let on_one = moved;
    assert_eq!(in_use, vec![12 - on_one, on_one], "slots per shard");
    drop(clients);
    wait_for(&server, "12 peer closes", |s| {
        s.closed(CloseKind::PeerClosed) == 12
    });
    wait_no_slots(&rt);
    rt.block_on(server.shutdown());
    system.shutdown();
}

#[test]
fn without_a_table_direct_hand_off_falls_back_to_descriptors() {
    let rt = runtime(2);
    let mut config = ServerConfig::default();
    config.listen = ListenMode::SingleAcceptor(ShardId::new(0));
    config.hand_off = mailring_transports::HandOff::Direct;
    let (system, server) = tenant_server(&rt, config);
    let tenant = &tenants_on_shard_1(&system, 1)[0];
    let c = key_served_on_shard_1(&server, tenant);
    let stats = server.stats();
    assert_eq!(stats.total(|s| s.direct_refused), 1);
    assert_eq!(stats.total(|s| s.handed_off), 1);
    drop(c);
    rt.block_on(server.shutdown());
    system.shutdown();
}

/// Under `HandOff::Direct`, a connection whose move finds its owner's
/// table full becomes a plain descriptor again and travels as one: served
/// on its owner, counted as refused, and no slot left anywhere.
#[test]
fn a_direct_move_to_a_full_table_travels_as_a_plain_descriptor() {
    let (rt, system, server) = direct_tenant_server(2);
    // Each is served on its owner, the third too (its move found shard
    // 1's two slots taken by the first two).
    let mut clients: Vec<_> = tenants_on_shard_1(&system, 3)
        .iter()
        .map(|tenant| key_served_on_shard_1(&server, tenant))
        .collect();
    let stats = server.stats();
    assert_eq!(stats.total(|s| s.handed_off), 3);
    assert_eq!(stats.total(|s| s.direct_refused), 1, "the third went plain");
    assert_eq!(stats.total(|s| s.io_off_owner), 0);
    let in_use = slots_in_use(&rt);
    assert_eq!(in_use, vec![0, 2], "slots per shard");
    // The plain one goes on like the others.
    let last = clients.last_mut().unwrap();
    last.write_all(&frame(b"again")).unwrap();
    assert_eq!(read_frame(last).unwrap(), b"1 1 again");
    drop(clients);
    wait_for(&server, "3 peer closes", |s| {
        s.closed(CloseKind::PeerClosed) == 3
    });
    wait_no_slots(&rt);
    rt.block_on(server.shutdown());
    system.shutdown();
}

/// Never answers: its reply waits forever.
struct Stuck;

impl Session for Stuck {
    type Codec = LengthDelimited;
    type Key = ();

    async fn on_frame(&mut self, _frame: Bytes, cx: &mut SessionCtx<Self>) {
        cx.reply_later(std::future::pending());
    }
}

/// Serves one connection whose session never completes its first frame,
/// then shuts down with a 100 ms grace: the connection is cut off, and the
/// runtime's report says so.
fn cut_off_after_grace<S: Session<Codec = LengthDelimited>>(make: fn() -> S) {
    let rt = runtime(1);
    let mut config = ServerConfig::default();
    config.shutdown_grace = Duration::from_millis(100);
    let server = Server::builder(LengthDelimited::new(), move |_| make())
        .config(config)
        .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
        .unwrap();
    let mut stuck = client(server.local_addr());
    stuck.write_all(&frame(b"never answered")).unwrap();
    wait_for(&server, "the frame", |s| s.total(|s| s.frames_in) == 1);
    let started = Instant::now();
    let report = rt.block_on(server.shutdown());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "shutdown was bounded"
    );
    assert_eq!((report.open_at_start, report.forced), (1, 1));
    assert_eq!(stuck.read(&mut [0u8; 8]).unwrap_or(0), 0, "closed");
    let line = rt.shutdown().drained[0].clone();
    assert_eq!((line.drained, line.dropped), (0, 1));
}

#[test]
fn shutdown_cuts_off_a_reply_that_outlives_its_grace_and_says_so() {
    cut_off_after_grace(|| Stuck);
}

/// Its handler never finishes.
struct Hung;

impl Session for Hung {
    type Codec = LengthDelimited;
    type Key = ();

    async fn on_frame(&mut self, _frame: Bytes, _cx: &mut SessionCtx<Self>) {
        std::future::pending::<()>().await;
    }
}

#[test]
fn shutdown_cuts_off_a_handler_that_never_finishes() {
    cut_off_after_grace(|| Hung);
}

#[test]
fn dropping_the_server_stops_it_like_a_shutdown() {
    let rt = runtime(2);
    let server = Server::builder(LengthDelimited::new(), |_| Echo)
        .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
        .unwrap();
    let addr = server.local_addr();
    let mut open = client(addr);
    open.write_all(&frame(b"hi")).unwrap();
    assert_eq!(read_frame(&mut open).unwrap(), b"hi");
    drop(server);
    // The idle connection is closed, and nothing listens any more.
    assert_eq!(open.read(&mut [0u8; 8]).unwrap_or(0), 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(addr).is_ok() {
        assert!(Instant::now() < deadline, "still accepting");
        std::thread::sleep(Duration::from_millis(5));
    }
    rt.shutdown();
}

/// Echo keyed by the frame's text, placed by a function that names a shard
/// the runtime lacks for the key `nowhere`.
struct Misplaced;

impl Session for Misplaced {
    type Codec = LengthDelimited;
    type Key = String;

    fn route(&mut self, frame: &Bytes, _cx: &SessionCtx<Self>) -> Route<String> {
        Route::Key(String::from_utf8_lossy(frame).into_owned())
    }

    async fn on_frame(&mut self, frame: Bytes, cx: &mut SessionCtx<Self>) {
        cx.send_frame(frame);
    }
}

#[test]
fn a_key_placed_past_the_last_shard_closes_only_its_connection() {
    let rt = runtime(2);
    let server = Server::builder(LengthDelimited::new(), |_| Misplaced)
        .placement(|key: &String, n| {
            if key == "nowhere" {
                ShardId::new(99)
            } else {
                mailring::sticky_shard(key, n)
            }
        })
        .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
        .unwrap();
    let mut lost = client(server.local_addr());
    lost.write_all(&frame(b"nowhere")).unwrap();
    assert_eq!(
        lost.read(&mut [0u8; 8]).unwrap_or(0),
        0,
        "closed, not panicked"
    );
    wait_for(&server, "a hand-off close", |s| {
        s.closed(CloseKind::HandOff) == 1
    });
    let mut fine = client(server.local_addr());
    fine.write_all(&frame(b"somewhere")).unwrap();
    assert_eq!(read_frame(&mut fine).unwrap(), b"somewhere");
    // Pushes to it are dead letters, not a panic in the caller.
    let sessions = server.sessions();
    sessions.push(&"nowhere".to_string(), |_, _| {});
    let reached = rt.block_on(async move {
        sessions
            .push_counted(&"nowhere".to_string(), |_, _| {})
            .await
    });
    assert_eq!(reached, 0);
    assert_eq!(server.stats().total(|s| s.push_dead_letters), 2);
    assert_eq!(server.stats().closed(CloseKind::Panicked), 0);
    drop(fine);
    rt.block_on(server.shutdown());
    rt.shutdown();
}

#[test]
fn a_reply_larger_than_the_outbound_limit_is_sent_not_taken_for_a_slow_reader() {
    let rt = runtime(1);
    let mut config = ServerConfig::default();
    config.outbound_high_water = 256 << 10;
    config.outbound_limit = 1 << 20;
    let server = Server::builder(LengthDelimited::new().max_frame(4 << 20), |_| Echo)
        .config(config)
        .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
        .unwrap();
    let mut c = client(server.local_addr());
    let big: Vec<u8> = (0..(2 << 20)).map(|i| (i % 251) as u8).collect();
    let writer = {
        let mut w = c.try_clone().unwrap();
        let framed = frame(&big);
        std::thread::spawn(move || w.write_all(&framed).unwrap())
    };
    assert_eq!(
        read_frame(&mut c).unwrap(),
        big,
        "2 MiB echoed past a 1 MiB limit"
    );
    writer.join().unwrap();
    assert_eq!(server.stats().closed(CloseKind::SlowReader), 0);
    drop(c);
    rt.block_on(server.shutdown());
    rt.shutdown();
}

/// Answers frame `n` with 256 KiB, 20 + 3n ms later: a pipeline's replies
/// pile up behind the send in flight once the kernel's buffers are full.
struct BigLater;

impl Session for BigLater {
    type Codec = LengthDelimited;
    type Key = ();

    async fn on_frame(&mut self, frame: Bytes, cx: &mut SessionCtx<Self>) {
        // One every 3 ms: once the kernel's buffers are full, each comes
        // ready while a send waits for the reader.
        let n = u32::from_be_bytes(frame[..4].try_into().unwrap());
        cx.reply_later(async move {
            let wait = 20 + 3 * u64::from(n);
            mailring::time::sleep(Duration::from_millis(wait)).await;
            let mut reply = frame.to_vec();
            reply.resize(256 << 10, 7);
            Bytes::from(reply)
        });
    }
}

/// A client that reads as fast as it can is not a slow reader because
/// the replies of its pipeline, ready together, pass the outbound limit
/// for a moment: every reply arrives (Redis closes no normal client for
/// its output). Only a send stuck past `slow_reader_grace` is.
#[test]
fn a_reader_that_keeps_up_gets_every_reply_of_a_pipeline_past_the_limit() {
    let rt = runtime(1);
    let mut config = ServerConfig::default();
    config.outbound_high_water = 256 << 10;
    config.outbound_limit = 1 << 20;
    let server = one_shard_server(&rt, config, |_| BigLater);
    // A small receive buffer, and the reading starts 400 ms late: the
    // first reply's send waits for the reader while the others queue
    // behind it, past the limit; then the reader takes everything.
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(32 << 10).unwrap();
    socket.connect(&server.local_addr().into()).unwrap();
    let mut c: TcpStream = socket.into();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut wire = Vec::new();
    for i in 0..64u32 {
        wire.extend(frame(&i.to_be_bytes()));
    }
    c.write_all(&wire).unwrap();
    std::thread::sleep(Duration::from_millis(400));
    for i in 0..64u32 {
        let reply = read_frame(&mut c).expect("every reply of the pipeline");
        assert_eq!(reply.len(), 256 << 10);
        assert_eq!(&reply[..4], i.to_be_bytes(), "in order");
    }
    assert_eq!(server.stats().closed(CloseKind::SlowReader), 0);
    drop(c);
    rt.block_on(server.shutdown());
    rt.shutdown();
}

/// Answers each frame with 8 MiB.
struct Huge;

impl Session for Huge {
    type Codec = LengthDelimited;
    type Key = ();

    async fn on_frame(&mut self, frame: Bytes, cx: &mut SessionCtx<Self>) {
        let mut reply = frame.to_vec();
        reply.resize(8 << 20, 3);
        cx.send_frame(Bytes::from(reply));
    }
}

/// A client that reads steadily, but slower than one send of its replies
/// takes, is not a slow reader: the grace is for a send that makes no
/// progress, not for one whose bytes keep going (a pipeline of two big
/// `XRANGE`s read at a few MB/s was cut mid-reply).
#[test]
fn a_steady_reader_of_replies_longer_than_the_grace_gets_them_all() {
    let rt = runtime(1);
    let mut config = ServerConfig::default();
    config.outbound_high_water = 256 << 10;
    config.outbound_limit = 1 << 20;
    config.slow_reader_grace = Duration::from_millis(500);
    let server = Server::builder(LengthDelimited::new().max_frame(16 << 20), |_| Huge)
        .config(config)
        .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
        .unwrap();
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(64 << 10).unwrap();
    socket.connect(&server.local_addr().into()).unwrap();
    let mut c: TcpStream = socket.into();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut wire = Vec::new();
    for i in 0..2u32 {
        wire.extend(frame(&i.to_be_bytes()));
    }
    c.write_all(&wire).unwrap();
    // 16 MiB at about 16 MB/s: a second or so, each 8 MiB reply far
    // longer in flight than the grace.
    let started = std::time::Instant::now();
    let mut got = 0usize;
    let mut buf = vec![0u8; 64 << 10];
    let want = 2 * (4 + (8 << 20));
    while got < want {
        match c.read(&mut buf) {
            Ok(0) => panic!(
                "closed after {got} of {want} bytes, {:?} in: {:?}",
                started.elapsed(),
                server.stats().closed(CloseKind::SlowReader)
            ),
            Ok(n) => got += n,
            Err(e) => panic!("{e} after {got} bytes"),
        }
        std::thread::sleep(Duration::from_millis(4));
    }
    assert_eq!(server.stats().closed(CloseKind::SlowReader), 0);
    drop(c);
    rt.block_on(server.shutdown());
    rt.shutdown();
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn at_its_limit_the_listener_leaves_a_flood_in_the_backlog_not_in_descriptors() {
    let rt = runtime(1);
    let mut config = ServerConfig::default();
    config.max_connections = 1;
    let server = Server::builder(LengthDelimited::new(), |_| Echo)
        .config(config)
        .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
        .unwrap();
    let addr = server.local_addr();
    let mut first = client(addr);
    first.write_all(&frame(b"x")).unwrap();
    assert_eq!(read_frame(&mut first).unwrap(), b"x");
    wait_for(&server, "a pause", |s| s.total(|s| s.accept_paused) >= 1);
    let before = open_fds();
    // 40 more connect (the kernel completes them into the backlog).
    let flood: Vec<TcpStream> = (0..40).map(|_| client(addr)).collect();
    std::thread::sleep(Duration::from_millis(100));
    let grew = open_fds() - before;
    // The 40 client sockets, and not 40 accepted ones beside them.
    assert!(grew < 40 + 8, "descriptors grew by {grew}");
    assert_eq!(server.stats().total(|s| s.accepted), 1);
    // Freed, the listener takes them again.
    drop(first);
    let mut next = flood.into_iter().next().unwrap();
    next.write_all(&frame(b"served")).unwrap();
    assert_eq!(read_frame(&mut next).unwrap(), b"served");
    drop(next);
    rt.block_on(server.shutdown());
    rt.shutdown();
}

#[test]
fn timeouts_and_grace_of_duration_max_mean_never_not_a_panic() {
    let rt = runtime(1);
    let mut config = ServerConfig::default();
    config.idle_timeout = Some(Duration::MAX);
    config.frame_timeout = Some(Duration::MAX);
    config.handshake_timeout = Some(Duration::MAX);
    config.shutdown_grace = Duration::MAX;
    let server = Server::builder(LengthDelimited::new(), |_| Echo)
        .config(config)
        .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
        .unwrap();
    let mut c = client(server.local_addr());
    // A partial frame arms the frame deadline too.
    c.write_all(&frame(b"whole")[..3]).unwrap();
    c.write_all(&frame(b"whole")[3..]).unwrap();
    assert_eq!(read_frame(&mut c).unwrap(), b"whole");
    assert_eq!(server.stats().closed(CloseKind::Panicked), 0);
    drop(c);
    wait_for(&server, "the close", |s| {
        s.closed(CloseKind::PeerClosed) == 1
    });
    let report = rt.block_on(server.shutdown());
    assert_eq!(report.forced, 0);
    rt.shutdown();
}

/// `slow` is answered by a deferred reply that never comes; every other
/// frame at once, behind it; `none` by a deferred run of no replies;
/// `close-panics` makes `on_close` panic.
struct Owing {
    close_panics: bool,
}

impl Session for Owing {
    type Codec = LengthDelimited;
    type Key = ();

    async fn on_frame(&mut self, frame: Bytes, cx: &mut SessionCtx<Self>) {
        match &frame[..] {
            b"slow" => cx.reply_later(std::future::pending()),
            b"block" => {
                cx.reply_later(std::future::pending());
                cx.block_until_replied();
            }
            b"hold" => {
                cx.reply_later(async {
                    mailring::time::sleep(Duration::from_millis(100)).await;
                    Bytes::from_static(b"held")
                });
                cx.hold_frames_until_replied();
            }
            b"none" => cx.reply_later_many(0, async { Vec::new() }),
            b"close-panics" => {
                self.close_panics = true;
                cx.send_frame(frame);
            }
            _ => cx.send_frame(frame),
        }
    }

    fn on_close(&mut self, _reason: &mailring_transports::CloseReason, _cx: &mut SessionCtx<Self>) {
        if self.close_panics {
            panic!("on_close panics on purpose");
        }
    }
}

fn owing_server(rt: &mailring::Runtime, config: ServerConfig) -> Server<Owing> {
    Server::builder(LengthDelimited::new(), |_| Owing {
        close_panics: false,
    })
    .config(config)
    .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
    .unwrap()
}

#[test]
fn replies_held_behind_a_stuck_one_count_against_the_window() {
    let rt = runtime(1);
    let mut config = ServerConfig::default();
    config.pipeline_window = 8;
    let server = owing_server(&rt, config);
    let mut c = client(server.local_addr());
    // One stuck reply, then far more frames than the window: those
    // answered at once wait behind it, and reading stops once the window
    // holds them, instead of gathering every reply in memory.
    let mut wire = frame(b"slow");
    for _ in 0..20_000 {
        wire.extend(frame(b"x"));
    }
    c.set_nonblocking(true).unwrap();
    let mut sent = 0;
    let deadline = Instant::now() + Duration::from_secs(5);
    while sent < wire.len() && Instant::now() < deadline {
        match c.write(&wire[sent..]) {
            Ok(n) => sent += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => panic!("{e}"),
        }
    }
    std::thread::sleep(Duration::from_millis(100));
    let handled = server.stats().total(|s| s.frames_in);
    assert!(
        handled <= 9,
        "{handled} frames handled behind a stuck reply"
    );
    drop(c);
    rt.block_on(server.shutdown());
    rt.shutdown();
}

#[test]
fn a_deferred_run_of_no_replies_holds_nothing_up() {
    let rt = runtime(1);
    let server = owing_server(&rt, ServerConfig::default());
    let mut c = client(server.local_addr());
    c.write_all(&frame(b"none")).unwrap();
    c.write_all(&frame(b"after")).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(read_frame(&mut c).unwrap(), b"after");
    drop(c);
    rt.block_on(server.shutdown());
    rt.shutdown();
}

#[test]
fn a_panicking_on_close_is_counted_once_under_its_reason() {
    let rt = runtime(1);
    let server = owing_server(&rt, ServerConfig::default());
    let mut c = client(server.local_addr());
    c.write_all(&frame(b"close-panics")).unwrap();
    assert_eq!(read_frame(&mut c).unwrap(), b"close-panics");
    drop(c);
    wait_for(&server, "the close", |s| {
        s.closed(CloseKind::PeerClosed) == 1
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    let panics = || {
        rt.stats()
            .shards
            .iter()
            .map(|s| s.panics.total())
            .sum::<u64>()
    };
    while panics() == 0 {
        assert!(
            Instant::now() < deadline,
            "the panic was not reported to the runtime"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let stats = server.stats();
    assert_eq!(stats.closed(CloseKind::Panicked), 0, "{stats:#?}");
    assert_eq!(panics(), 1);
    rt.block_on(server.shutdown());
    rt.shutdown();
}

/// Keyed by `KEY <name>`; `work` keeps the session in its handler for
/// 300 ms (pushes wait meanwhile); anything else is echoed.
struct Busy;

impl Session for Busy {
    type Codec = LengthDelimited;
    type Key = String;

    fn route(&mut self, frame: &Bytes, _cx: &SessionCtx<Self>) -> Route<String> {
        key_named_by(frame)
    }

    async fn on_frame(&mut self, frame: Bytes, cx: &mut SessionCtx<Self>) {
        if frame.as_ref() == b"QUIT" {
            cx.send_frame(Bytes::from_static(b"bye"));
            cx.close();
            return;
        }
        if frame.as_ref() == b"owe" {
            cx.reply_later(async {
                // Long past the pushes' rounds, even on a loaded machine.
                mailring::time::sleep(Duration::from_secs(2)).await;
                Bytes::from_static(b"owed")
            });
            return;
        }
        if frame.as_ref() == b"work" {
            mailring::time::sleep(Duration::from_millis(300)).await;
        }
        cx.send_frame(frame);
    }
}

/// A one-shard server of [`Busy`] sessions with a push queue of 100, and
/// a client of key `t` that has sent `request` (50 ms ago).
fn busy_session_asked(request: &[u8]) -> (mailring::Runtime, Server<Busy>, TcpStream) {
    let rt = runtime(1);
    let mut config = ServerConfig::default();
    config.push_queue = 100;
    let server = one_shard_server(&rt, config, |_| Busy);
    let mut c = client(server.local_addr());
    c.write_all(&frame(b"KEY t")).unwrap();
    assert_eq!(read_frame(&mut c).unwrap(), b"KEY t");
    c.write_all(&frame(request)).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    (rt, server, c)
}

/// Echoes; its `Drop` panics.
struct DropPanics;

impl Session for DropPanics {
    type Codec = LengthDelimited;
    type Key = ();

    async fn on_frame(&mut self, frame: Bytes, cx: &mut SessionCtx<Self>) {
        cx.send_frame(frame);
    }
}

impl Drop for DropPanics {
    fn drop(&mut self) {
        panic!("a session's Drop panics on purpose");
    }
}

#[test]
fn a_session_whose_drop_panics_is_counted_closed_once() {
    // Its close is counted with its reason (the peer closed); the panic of
    // its `Drop` is reported as a `Drop` panic, not counted as a second
    // close.
    let rt = runtime(1);
    let server = one_shard_server(&rt, ServerConfig::default(), |_| DropPanics);
    let mut c = client(server.local_addr());
    c.write_all(&frame(b"hi")).unwrap();
    assert_eq!(read_frame(&mut c).unwrap(), b"hi");
    drop(c);
    wait_for(&server, "the close", |s| {
        s.closed(CloseKind::PeerClosed) == 1
    });
    // The panic hook may take a while (a backtrace): until the connection
    // is gone.
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.live_connections() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(server.live_connections(), 0);
    assert_eq!(server.stats().closed(CloseKind::Panicked), 0);
    let drops: u64 = rt
        .stats()
        .shards
        .iter()
        .map(|s| s.panics.get(mailring::panic::CallbackKind::Drop))
        .sum();
    assert_eq!(drops, 1);
    rt.block_on(server.shutdown());
    rt.shutdown();
}

#[test]
fn a_session_that_closes_ends_though_pushes_keep_coming() {
    // A thread pushes 64 KiB frames to the session faster than its client
    // reads them; the client says QUIT (the session closes once what is
    // queued is written). Pushes are no longer taken once it closes: its
    // output runs dry and it ends, rather than write pushes as long as
    // they come.
    let (rt, server, mut c) = busy_session_asked(b"KEY t");
    let sessions = server.sessions();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pushing = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let chunk = Bytes::from(vec![7u8; 64 << 10]);
            let until = Instant::now() + Duration::from_secs(5);
            while !stop.load(Ordering::Relaxed) && Instant::now() < until {
                let chunk = chunk.clone();
                sessions.push(&"t".to_string(), move |_, cx| cx.send_frame(chunk.clone()));
                std::thread::sleep(Duration::from_micros(500));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    c.write_all(&frame(b"QUIT")).unwrap();
    let asked = Instant::now();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    while read_frame(&mut c).is_ok() {
        std::thread::sleep(Duration::from_millis(1));
    }
    let took = asked.elapsed();
    stop.store(true, Ordering::Relaxed);
    pushing.join().unwrap();
    assert!(
        took < Duration::from_secs(2),
        "the closing session wrote pushes for {took:?}"
    );
    drop(c);
    rt.block_on(server.shutdown());
    rt.shutdown();
}

#[test]
fn a_request_sent_in_time_behind_a_long_handler_is_not_cut_by_the_idle_timeout() {
    // The handler of `work` takes 300 ms, past the 200 ms idle timeout;
    // the client sends `ping` 100 ms after it. The idle timer is due by
    // the time the server reads again: a period in which a frame was
    // handled is not idle, and `ping` is answered.
    let rt = runtime(1);
    let mut config = ServerConfig::default();
    config.idle_timeout = Some(Duration::from_millis(200));
    let server = one_shard_server(&rt, config, |_| Busy);
    let mut c = client(server.local_addr());
    c.write_all(&frame(b"work")).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    c.write_all(&frame(b"ping")).unwrap();
    assert_eq!(read_frame(&mut c).unwrap(), b"work");
    assert_eq!(read_frame(&mut c).unwrap(), b"ping");
    assert_eq!(server.stats().closed(CloseKind::IdleTimeout), 0);
    // Idle for real: closed one idle period after the last reply, not two.
    let quiet = Instant::now();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert!(read_frame(&mut c).is_err(), "closed");
    let took = quiet.elapsed();
    assert!(
        took < Duration::from_millis(350),
        "closed {took:?} after the last reply (the idle timeout is 200 ms)"
    );
    assert_eq!(server.stats().closed(CloseKind::IdleTimeout), 1);
    drop(c);
    rt.block_on(server.shutdown());
    rt.shutdown();
}

#[test]
fn pushes_to_a_session_owing_a_reply_are_bounded_and_those_refused_are_counted() {
    // The session waits for a deferred reply: pushed frames queue behind
    // it, unwritten. They count against the push queue (they took no
    // room in the output yet, which the outbound limit measures), and
    // pushes past it are refused and counted, not held without end.
    let (rt, server, mut c) = busy_session_asked(b"owe");
    let sessions = server.sessions();
    // In rounds the session takes in between (a burst would find the
    // queue full at once, whatever the session holds).
    for _ in 0..10 {
        for _ in 0..100 {
            sessions.push(&"t".to_string(), |_, cx| {
                cx.send_frame(Bytes::from_static(b"P"))
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    wait_for(&server, "the pushes refused", |s| {
        s.total(|s| s.pushes_dropped) == 800
    });
    assert_eq!(read_frame(&mut c).unwrap(), b"owed");
    for _ in 0..200 {
        assert_eq!(read_frame(&mut c).unwrap(), b"P");
    }
    drop(c);
    rt.block_on(server.shutdown());
    rt.shutdown();
}

#[test]
fn pushes_to_a_busy_session_are_bounded_and_those_refused_are_counted() {
    let (rt, server, mut c) = busy_session_asked(b"work");
    let sessions = server.sessions();
    for _ in 0..1000 {
        sessions.push(&"t".to_string(), |_, cx| {
            cx.send_frame(Bytes::from_static(b"P"))
        });
    }
    wait_for(&server, "the pushes refused", |s| {
        s.total(|s| s.pushes_dropped) == 900
    });
    assert_eq!(read_frame(&mut c).unwrap(), b"work");
    for _ in 0..100 {
        assert_eq!(read_frame(&mut c).unwrap(), b"P");
    }
    assert_eq!(server.stats().total(|s| s.pushes_delivered), 100);
    drop(c);
    rt.block_on(server.shutdown());
    rt.shutdown();
}

#[test]
fn a_client_gone_while_its_frames_are_held_is_noticed_when_asked_for() {
    use mailring_transports::PeerClose;
    let rt = runtime(1);
    for policy in [PeerClose::CloseWhileBlocked, PeerClose::FinishReplies] {
        let mut config = ServerConfig::default();
        config.on_peer_close = policy;
        // The reply owed never comes: the shutdown cuts it after this.
        config.shutdown_grace = Duration::from_millis(100);
        let server = owing_server(&rt, config);
        let mut c = client(server.local_addr());
        // Blocked on a reply that never comes, a frame held behind it.
        c.write_all(&frame(b"block")).unwrap();
        c.write_all(&frame(b"after")).unwrap();
        wait_for(&server, "the frame", |s| s.total(|s| s.frames_in) == 1);
        drop(c);
        if policy == PeerClose::CloseWhileBlocked {
            wait_for(&server, "the close", |s| {
                s.closed(CloseKind::PeerClosed) == 1
            });
            assert_eq!(server.live_connections(), 0);
        } else {
            // By default the end is seen only by a read, and the owed
            // reply is waited for.
            std::thread::sleep(Duration::from_millis(200));
            assert_eq!(server.live_connections(), 1);
        }
        rt.block_on(server.shutdown());
    }
    // Watched for only while blocked: a client that half-closes behind a
    // hold that is not a block gets every reply; one blocked gets those
    // before its block, then the end.
    let mut config = ServerConfig::default();
    config.on_peer_close = PeerClose::CloseWhileBlocked;
    let server = owing_server(&rt, config);
    let mut c = client(server.local_addr());
    c.write_all(&[frame(b"hold"), frame(b"after")].concat())
        .unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    assert_eq!(read_frame(&mut c).unwrap(), b"held");
    assert_eq!(read_frame(&mut c).unwrap(), b"after");
    let mut c = client(server.local_addr());
    c.write_all(&[frame(b"hold"), frame(b"block"), frame(b"never")].concat())
        .unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    assert_eq!(read_frame(&mut c).unwrap(), b"held");
    let mut rest = Vec::new();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.read_to_end(&mut rest).expect("the end, not a timeout");
    assert!(rest.is_empty(), "{rest:?}");
    rt.block_on(server.shutdown());
    rt.shutdown();
}

/// Echoes; its decoder hook panics for the first connection only.
struct DecoderPanics {
    first: bool,
}

impl Session for DecoderPanics {
    type Codec = LengthDelimited;
    type Key = ();

    fn decoder(&mut self, server_codec: &LengthDelimited) -> LengthDelimited {
        assert!(!self.first, "a decoder hook that panics on purpose");
        *server_codec
    }

    async fn on_frame(&mut self, frame: Bytes, cx: &mut SessionCtx<Self>) {
        cx.send_frame(frame);
    }
}

#[test]
fn a_panicking_decoder_hook_closes_its_connection_and_the_listener_goes_on() {
    let rt = runtime(1);
    let made = Arc::new(AtomicUsize::new(0));
    let m = made.clone();
    let server = one_shard_server(&rt, ServerConfig::default(), move |_| DecoderPanics {
        first: m.fetch_add(1, Ordering::SeqCst) == 0,
    });
    let mut first = client(server.local_addr());
    first.write_all(&frame(b"x")).unwrap();
    assert_eq!(first.read(&mut [0u8; 8]).unwrap_or(0), 0, "dropped");
    wait_for(&server, "the panic", |s| s.closed(CloseKind::Panicked) == 1);
    let mut second = client(server.local_addr());
    second.write_all(&frame(b"y")).unwrap();
    assert_eq!(read_frame(&mut second).unwrap(), b"y");
    drop(second);
    rt.block_on(server.shutdown());
    rt.shutdown();
}

/// Keyed by `KEY <name>`; `block` is answered 30 ms later and blocks the
/// frames behind it (its end watched under `CloseWhileBlocked`); anything
/// else is echoed.
struct BlocksThenNames;

impl Session for BlocksThenNames {
    type Codec = LengthDelimited;
    type Key = String;

    fn route(&mut self, frame: &Bytes, _cx: &SessionCtx<Self>) -> Route<String> {
        key_named_by(frame)
    }

    async fn on_frame(&mut self, frame: Bytes, cx: &mut SessionCtx<Self>) {
        if frame.as_ref() == b"block" {
            cx.reply_later(async {
                mailring::time::sleep(Duration::from_millis(30)).await;
                Bytes::from_static(b"done")
            });
            cx.block_until_replied();
        } else {
            cx.send_frame(frame);
        }
    }
}

#[test]
fn a_move_right_after_a_block_ends_waits_for_the_dropped_watch() {
    // The watch for the peer's end, armed while blocked and dropped when
    // the reply comes, holds the socket until its cancellation lands; the
    // key named right after must still move the connection, not close it.
    use mailring_transports::PeerClose;
    let rt = runtime(2);
    let mut config = ServerConfig::default();
    config.on_peer_close = PeerClose::CloseWhileBlocked;
    let server = Server::builder(LengthDelimited::new(), |_| BlocksThenNames)
        .config(config)
        // Every key on the shard that is not the one placing it.
        .placement(|_key: &String, n| {
            ShardId::new((mailring::current_shard().map_or(0, |s| s.index()) + 1) % n)
        })
        .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
        .unwrap();
    for _ in 0..5 {
        let mut c = client(server.local_addr());
        c.write_all(&[frame(b"block"), frame(b"KEY k")].concat())
            .unwrap();
        assert_eq!(read_frame(&mut c).unwrap(), b"done");
        assert_eq!(read_frame(&mut c).unwrap(), b"KEY k");
    }
    let stats = server.stats();
    assert_eq!(stats.closed(CloseKind::HandOff), 0, "{stats:#?}");
    assert_eq!(stats.total(|s| s.handed_off), 5);
    rt.block_on(server.shutdown());
    rt.shutdown();
}

/// Registers each session's closer under its peer's address; `WAIT` is
/// answered never (a reply that stays pending), anything else echoed.
struct Closable {
    peer: Option<std::net::SocketAddr>,
    closers: Closers,
}

impl Session for Closable {
    type Codec = LengthDelimited;
    type Key = String;

    fn route(&mut self, frame: &Bytes, _cx: &SessionCtx<Self>) -> Route<String> {
        key_named_by(frame)
    }

    fn on_open(&mut self, cx: &mut SessionCtx<Self>) {
        let peer = self.peer.expect("a TCP peer");
        self.closers.lock().unwrap().insert(peer, cx.closer());
    }

    async fn on_frame(&mut self, frame: Bytes, cx: &mut SessionCtx<Self>) {
        if frame.as_ref() == b"WAIT" {
            cx.reply_later(std::future::pending());
            cx.block_until_replied();
        } else if frame.as_ref() == b"LOCAL" {
            let local = cx.local_addr().map(|a| a.to_string()).unwrap_or_default();
            cx.send_frame(Bytes::from(local));
        } else if frame.as_ref() == b"HANG" {
            // A handler that never finishes.
            std::future::pending::<()>().await;
        } else {
            cx.send_frame(frame);
        }
    }
}

type Closers = Arc<Mutex<std::collections::HashMap<std::net::SocketAddr, SessionCloser>>>;

/// A server of [`Closable`] sessions with `config`, every key placed on
/// shard `keys_on`; the closers they register.
fn closable_server(
    rt: &mailring::Runtime,
    config: ServerConfig,
    keys_on: ShardId,
) -> (Server<Closable>, Closers) {
    let closers = Closers::default();
    let make = {
        let closers = closers.clone();
        move |peer| Closable {
            peer,
            closers: closers.clone(),
        }
    };
    let server = Server::builder(LengthDelimited::new(), make)
        .config(config)
        .placement(move |_, _| keys_on)
        .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
        .unwrap();
    (server, closers)
}

#[test]
fn a_session_closed_by_its_handle_from_another_thread_ends_at_once_and_alone() {
    // An operator's kick (Redis's CLIENT KILL): the connection ends
    // whatever it is doing (here: idle, blocked on a reply that never
    // comes, and in a handler that never finishes), from a thread that is
    // no shard; the others go on.
    let rt = runtime(2);
    let (server, closers) = closable_server(&rt, ServerConfig::default(), ShardId::new(0));
    let mut idle = client(server.local_addr());
    let mut blocked = client(server.local_addr());
    let mut hung = client(server.local_addr());
    let mut other = client(server.local_addr());
    let gone = client(server.local_addr());
    for c in [&mut idle, &mut blocked, &mut hung, &mut other] {
        c.write_all(&frame(b"hi")).unwrap();
        assert_eq!(read_frame(c).unwrap(), b"hi");
    }
    blocked.write_all(&frame(b"WAIT")).unwrap();
    hung.write_all(&frame(b"HANG")).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let closer = |c: &TcpStream| {
        closers
            .lock()
            .unwrap()
            .get(&c.local_addr().unwrap())
            .cloned()
            .expect("the session registered its closer")
    };
    // A connection that ended: its closer does nothing.
    let kick_gone = closer(&gone);
    drop(gone);
    wait_for(&server, "the peer's close", |s| {
        s.closed(CloseKind::PeerClosed) == 1
    });
    assert!(kick_gone.is_closed());
    assert!(!kick_gone.close(), "a close after the end closes nothing");
    let (kick_idle, kick_blocked) = (closer(&idle), closer(&blocked));
    assert!(!kick_idle.is_closed());
    assert!(kick_idle.close(), "the first close closes");
    assert!(!kick_idle.close(), "a second close does nothing");
    assert!(kick_idle.is_closed());
    assert!(kick_blocked.close());
    assert!(closer(&hung).close());
    for (what, c) in [
        ("idle", &mut idle),
        ("blocked", &mut blocked),
        ("hung in its handler", &mut hung),
    ] {
        let mut b = [0u8; 16];
        match c.read(&mut b) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            other => panic!("the {what} connection was not closed: {other:?}"),
        }
    }
    other.write_all(&frame(b"still here")).unwrap();
    assert_eq!(read_frame(&mut other).unwrap(), b"still here");
    // The address the connection was accepted on, as the client sees it.
    other.write_all(&frame(b"LOCAL")).unwrap();
    let local = String::from_utf8(read_frame(&mut other).unwrap()).unwrap();
    assert_eq!(local, other.peer_addr().unwrap().to_string());
    wait_for(&server, "three connections closed by their handles", |s| {
        s.closed(CloseKind::ClosedByHandle) == 3
    });
    // A closer outliving its connection does nothing.
    assert!(!closer(&idle).close());
    drop(other);
    rt.block_on(server.shutdown());
}

/// Hands out its closer only from inside a handler that then never
/// finishes.
struct ClosesLate {
    peer: Option<std::net::SocketAddr>,
    closers: Closers,
}

impl Session for ClosesLate {
    type Codec = LengthDelimited;
    type Key = ();

    async fn on_frame(&mut self, _frame: Bytes, cx: &mut SessionCtx<Self>) {
        let peer = self.peer.expect("a TCP peer");
        self.closers.lock().unwrap().insert(peer, cx.closer());
        std::future::pending::<()>().await;
    }
}

#[test]
fn a_closer_handed_out_by_a_handler_that_never_finishes_ends_it() {
    let rt = runtime(2);
    let closers = Closers::default();
    let make = {
        let closers = closers.clone();
        move |peer| ClosesLate {
            peer,
            closers: closers.clone(),
        }
    };
    let server = Server::builder(LengthDelimited::new(), make)
        .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
        .unwrap();
    let mut c = client(server.local_addr());
    c.write_all(&frame(b"register and hang")).unwrap();
    let me = c.local_addr().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let closer = loop {
        if let Some(closer) = closers.lock().unwrap().get(&me).cloned() {
            break closer;
        }
        assert!(std::time::Instant::now() < deadline, "no closer handed out");
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(closer.close());
    let mut b = [0u8; 16];
    match c.read(&mut b) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("the connection was not closed: {other:?}"),
    }
    wait_for(&server, "the close by its handle", |s| {
        s.closed(CloseKind::ClosedByHandle) == 1
    });
    rt.block_on(server.shutdown());
}

#[test]
fn a_session_moved_to_its_key_s_shard_is_still_closed_by_its_handle() {
    // The handle is taken on the accepting shard; the connection then
    // moves to its key's shard and blocks there.
    let rt = runtime(2);
    let mut config = ServerConfig::default();
    config.listen = ListenMode::SingleAcceptor(ShardId::new(0));
    let (server, closers) = closable_server(&rt, config, ShardId::new(1));
    let mut c = client(server.local_addr());
    c.write_all(&frame(b"KEY far")).unwrap();
    assert_eq!(read_frame(&mut c).unwrap(), b"KEY far");
    // Its local address travels with it too.
    c.write_all(&frame(b"LOCAL")).unwrap();
    let local = String::from_utf8(read_frame(&mut c).unwrap()).unwrap();
    assert_eq!(local, c.peer_addr().unwrap().to_string());
    c.write_all(&frame(b"WAIT")).unwrap();
    wait_for(&server, "the hand-off", |s| s.total(|s| s.handed_off) == 1);
    std::thread::sleep(Duration::from_millis(50));
    let closer = closers
        .lock()
        .unwrap()
        .get(&c.local_addr().unwrap())
        .cloned()
        .expect("the session registered its closer");
    assert!(closer.close());
    let mut b = [0u8; 16];
    match c.read(&mut b) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("the moved connection was not closed: {other:?}"),
    }
    wait_for(&server, "closed by its handle", |s| {
        s.closed(CloseKind::ClosedByHandle) == 1
    });
    rt.block_on(server.shutdown());
}

/// `OFF` / `ON` drop or write the replies queued from then on (`ON` is
/// answered); `NOW x` sends at once, `LATER n` defers its reply 3n ms,
/// `TURN x` answers in turn, `MANY x` defers two replies in one future.
struct Muting {
    ran: Arc<AtomicUsize>,
}

/// Length-delimited frames; keeps the text of each reply it is given to
/// discard.
#[derive(Clone, Default)]
struct KeepingDiscards {
    frames: LengthDelimited,
    discarded: Arc<Mutex<Vec<String>>>,
}

impl Codec for KeepingDiscards {
    type In = Bytes;
    type Out = Bytes;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Bytes>, CodecError> {
        self.frames.decode(buf)
    }

    fn encode(&mut self, frame: Bytes, dst: &mut BytesMut) -> Result<(), CodecError> {
        self.frames.encode(frame, dst)
    }

    fn discard(&mut self, frame: Bytes) {
        let text = String::from_utf8_lossy(&frame).into_owned();
        self.discarded.lock().unwrap().push(text);
    }
}

impl Session for Muting {
    type Codec = KeepingDiscards;
    type Key = ();

    async fn on_frame(&mut self, frame: Bytes, cx: &mut SessionCtx<Self>) {
        let text = String::from_utf8_lossy(&frame).into_owned();
        let (verb, arg) = text.split_once(' ').unwrap_or((text.as_str(), ""));
        let arg = arg.to_owned();
        let ran = self.ran.clone();
        match verb {
            "OFF" => cx.discard_replies(true),
            "ON" => {
                cx.discard_replies(false);
                cx.send_frame(Bytes::from_static(b"ON"));
            }
            "NOW" => cx.send_frame(Bytes::from(format!("now {arg}"))),
            "LATER" => cx.reply_later(async move {
                let n: u64 = arg.parse().unwrap_or(0);
                mailring::time::sleep(Duration::from_millis(3 * n)).await;
                ran.fetch_add(1, Ordering::SeqCst);
                Bytes::from(format!("later {arg}"))
            }),
            "TURN" => cx.reply_in_turn(move || {
                ran.fetch_add(1, Ordering::SeqCst);
                Bytes::from(format!("turn {arg}"))
            }),
            "MANY" => cx.reply_later_many(2, async move {
                ran.fetch_add(1, Ordering::SeqCst);
                vec![
                    Bytes::from(format!("many {arg} 1")),
                    Bytes::from(format!("many {arg} 2")),
                ]
            }),
            _ => cx.send_frame(Bytes::from_static(b"?")),
        }
    }
}

#[test]
fn replies_queued_while_discarded_are_dropped_in_order_and_their_work_still_runs() {
    let rt = runtime(1);
    let ran = Arc::new(AtomicUsize::new(0));
    let counted = ran.clone();
    let codec = KeepingDiscards::default();
    let discarded = codec.discarded.clone();
    let server = Server::builder(codec, move |_| Muting {
        ran: counted.clone(),
    })
    .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
    .unwrap();
    let mut c = client(server.local_addr());
    let frames: Vec<&[u8]> = vec![
        b"LATER 5", b"OFF", b"LATER 1", b"NOW a", b"TURN b", b"MANY c", b"LATER 2", b"ON",
        b"NOW d", b"TURN e", b"OFF", b"NOW f", b"ON",
    ];
    let wire: Vec<u8> = frames.iter().flat_map(|f| frame(f)).collect();
    c.write_all(&wire).unwrap();
    let mut got = Vec::new();
    for _ in 0..5 {
        got.push(String::from_utf8(read_frame(&mut c).unwrap()).unwrap());
    }
    assert_eq!(got, ["later 5", "ON", "now d", "turn e", "ON"]);
    // Nothing dropped comes late: the next reply is the next one's.
    c.write_all(&frame(b"NOW g")).unwrap();
    assert_eq!(read_frame(&mut c).unwrap(), b"now g");
    // The dropped replies' work ran: 2 LATER, a TURN and a MANY, with
    // the written LATER and TURN.
    assert_eq!(ran.load(Ordering::SeqCst), 6);
    // The codec saw each dropped reply, in order (a Redis server counts
    // the errors among them).
    assert_eq!(
        *discarded.lock().unwrap(),
        ["later 1", "now a", "turn b", "many c 1", "many c 2", "later 2", "now f"]
    );
    drop(c);
    rt.block_on(server.shutdown());
    rt.shutdown();
}

/// Answers each frame with 4 MiB, then takes 20 ms more (its handler
/// still running while the reply before goes out).
struct BigThenSlow;

impl Session for BigThenSlow {
    type Codec = LengthDelimited;
    type Key = ();

    async fn on_frame(&mut self, frame: Bytes, cx: &mut SessionCtx<Self>) {
        let mut reply = frame.to_vec();
        reply.resize(4 << 20, 9);
        cx.send_frame(Bytes::from(reply));
        mailring::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn every_byte_sent_is_counted_sends_that_end_while_a_handler_runs_too() {
    let rt = runtime(1);
    let mut config = ServerConfig::default();
    config.outbound_high_water = 8 << 20;
    config.outbound_limit = 64 << 20;
    let server = one_shard_server(&rt, config, |_| BigThenSlow);
    let mut c = client(server.local_addr());
    // Frames 5 ms apart, read as they come: each arrives while the reply
    // before it is still being sent.
    let mut writer = c.try_clone().unwrap();
    let sent = std::thread::spawn(move || {
        let mut n = 0;
        for i in 0..8u32 {
            let f = frame(&i.to_be_bytes());
            writer.write_all(&f).unwrap();
            n += f.len();
            std::thread::sleep(Duration::from_millis(5));
        }
        n
    });
    for i in 0..8u32 {
        let reply = read_frame(&mut c).unwrap();
        assert_eq!(&reply[..4], i.to_be_bytes());
    }
    let sent = sent.join().unwrap();
    // The last send's completion may be taken just after its bytes were.
    wait_for(&server, "every byte counted", |s| {
        s.total(|s| s.bytes_out) == 8 * (4 + (4 << 20))
    });
    assert_eq!(server.stats().total(|s| s.bytes_in), sent as u64);
    drop(c);
    rt.block_on(server.shutdown());
    rt.shutdown();
}

/// A session whose handler waits for ever on a `stuck` frame, after
/// queueing a reply; it echoes anything else. Its close reasons are kept.
struct StuckOnAsk {
    closes: Arc<Mutex<Vec<CloseKind>>>,
}

impl Session for StuckOnAsk {
    type Codec = LengthDelimited;
    type Key = ();

    async fn on_frame(&mut self, frame: Bytes, cx: &mut SessionCtx<Self>) {
        if &frame[..] == b"stuck" {
            cx.send_frame(Bytes::from_static(b"half done"));
            std::future::pending::<()>().await;
        }
        cx.send_frame(frame);
    }

    fn on_close(&mut self, reason: &mailring_transports::CloseReason, _cx: &mut SessionCtx<Self>) {
        self.closes.lock().unwrap().push(reason.kind());
    }
}

/// A handler still running at `ServerConfig::handler_timeout` (an
/// upstream that never answers) is dropped and its connection closed with
/// a counted reason, the replies it queued unsent; other connections are
/// served meanwhile. Without the timeout (the default) it is waited for.
#[test]
fn a_handler_past_the_handler_timeout_closes_its_connection() {
    assert_eq!(ServerConfig::default().handler_timeout, None);
    let rt = runtime(1);
    let closes = Arc::new(Mutex::new(Vec::new()));
    let c = closes.clone();
    let mut config = ServerConfig::default();
    config.handler_timeout = Some(Duration::from_millis(100));
    let server = one_shard_server(&rt, config, move |_| StuckOnAsk { closes: c.clone() });
    let addr = server.local_addr();
    let mut good = client(addr);
    let mut stuck = client(addr);
    stuck.write_all(&frame(b"first")).unwrap();
    assert_eq!(read_frame(&mut stuck).unwrap(), b"first");
    stuck.write_all(&frame(b"stuck")).unwrap();
    good.write_all(&frame(b"served meanwhile")).unwrap();
    assert_eq!(read_frame(&mut good).unwrap(), b"served meanwhile");
    let mut rest = Vec::new();
    stuck
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let _ = stuck.read_to_end(&mut rest);
    assert!(rest.is_empty(), "nothing of the stuck handler's: {rest:?}");
    wait_for(&server, "the handler timeout", |s| {
        s.closed(CloseKind::HandlerTimeout) == 1
    });
    assert_eq!(*closes.lock().unwrap(), vec![CloseKind::HandlerTimeout]);
    good.write_all(&frame(b"still")).unwrap();
    assert_eq!(read_frame(&mut good).unwrap(), b"still");
    drop(good);
    rt.block_on(server.shutdown());
    rt.shutdown();
}

/// A listener whose accepts keep failing (here its socket was shut down
/// under the server, so every accept says `EINVAL`) is not retried in a
/// busy loop: each failure waits, longer while they last, as one out of
/// descriptors does, and the shard goes on serving its connections.
#[test]
fn a_listener_whose_accepts_keep_failing_is_retried_with_pauses_not_at_once() {
    let rt = runtime(1);
    let server = one_shard_server(&rt, ServerConfig::default(), |_| Echo);
    let addr = server.local_addr();
    let mut good = client(addr);
    round_trip(&mut good, b"before");
    let fds = common::listening_fds(addr);
    assert!(!fds.is_empty(), "the listener's socket");
    for fd in fds {
        // SAFETY: a socket of this process's; only its receiving side is
        // shut down.
        assert_eq!(unsafe { libc::shutdown(fd, libc::SHUT_RD) }, 0);
    }
    wait_for(&server, "a failed accept", |s| {
        s.total(|s| s.accept_errors) > 0
    });
    std::thread::sleep(Duration::from_millis(500));
    let errors = server.stats().total(|s| s.accept_errors);
    // Pauses of 10 ms doubling: under ten in half a second (a busy loop
    // makes hundreds of thousands).
    assert!(errors < 100, "{errors} failed accepts in half a second");
    round_trip(&mut good, b"still served");
    drop(good);
    rt.block_on(server.shutdown());
    rt.shutdown();
}
