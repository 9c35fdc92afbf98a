//! UDP datagram sessions over real loopback sockets: one session per peer
//! address, sessions keyed by their first datagram and placed on the key's
//! shard (several peers of one key sharing a session), garbage dropped and
//! counted while other peers are served, idle expiry and a new session
//! after it, the cap on sessions, a panicking session closing alone, and
//! shutdown.

use std::net::{SocketAddr, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use mailring_actors::ShardId;
use mailring_transports::datagram::{
    DatagramClose, DatagramConfig, DatagramCtx, DatagramServer, DatagramSession, DatagramShardStats,
};

fn runtime() -> mailring::Runtime {
    mailring::Runtime::builder()
        .shards(2)
        .build()
        .expect("io_uring available")
}

/// A loopback UDP client whose receives give up after 5 s.
fn peer() -> UdpSocket {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

fn ask(s: &UdpSocket, to: SocketAddr, body: &[u8]) -> String {
    s.send_to(body, to).unwrap();
    let mut buf = [0u8; 2048];
    let (n, from) = s.recv_from(&mut buf).expect("a reply");
    assert_eq!(from, to, "replies come from the server's address");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

fn total(stats: &[DatagramShardStats], f: impl Fn(&DatagramShardStats) -> u64) -> u64 {
    stats.iter().map(f).sum()
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// One session per peer address: answers `"<n> <peer> <datagram>"`, `n`
/// counting the datagrams this session handled.
struct PerPeer {
    seen: u32,
    closes: Arc<Mutex<Vec<DatagramClose>>>,
}

impl DatagramSession for PerPeer {
    type Key = SocketAddr;

    fn key(_datagram: &[u8], peer: SocketAddr) -> Option<SocketAddr> {
        Some(peer)
    }

    async fn on_datagram(&mut self, datagram: Bytes, cx: &mut DatagramCtx) {
        if &datagram[..] == b"panic" {
            panic!("a session's handler panics");
        }
        if &datagram[..] == b"reply, then panic" {
            cx.reply(Bytes::from_static(b"half done"));
            panic!("a session's handler panics after its reply");
        }
        if &datagram[..] == b"stuck" {
            std::future::pending::<()>().await;
        }
        if &datagram[..] == b"reply, then stuck" {
            cx.reply(Bytes::from_static(b"half done"));
            std::future::pending::<()>().await;
        }
        self.seen += 1;
        let mut out = format!("{} {} ", self.seen, cx.peer()).into_bytes();
        out.extend_from_slice(&datagram);
        cx.reply(Bytes::from(out));
        if &datagram[..] == b"bye" {
            cx.close();
        }
    }

    fn on_close(&mut self, reason: DatagramClose, _cx: &mut DatagramCtx) {
        self.closes.lock().unwrap().push(reason);
    }
}

fn per_peer_server(
    rt: &mailring::Runtime,
    config: DatagramConfig,
) -> (DatagramServer<PerPeer>, Arc<Mutex<Vec<DatagramClose>>>) {
    let closes = Arc::new(Mutex::new(Vec::new()));
    let c = closes.clone();
    let server = DatagramServer::builder(move |_peer: &SocketAddr| PerPeer {
        seen: 0,
        closes: c.clone(),
    })
    .config(config)
    .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
    .unwrap();
    (server, closes)
}

#[test]
fn each_peer_gets_its_own_session_and_a_panic_closes_only_its_own() {
    each_peer_gets_its_own_session_under(DatagramConfig::default());
}

/// The receive path of kernels before 6.0: single receives in flight.
#[test]
fn each_peer_gets_its_own_session_through_single_receives() {
    let mut config = DatagramConfig::default();
    config.multishot_receive = false;
    each_peer_gets_its_own_session_under(config);
}

fn each_peer_gets_its_own_session_under(config: DatagramConfig) {
    let rt = runtime();
    let (server, closes) = per_peer_server(&rt, config);
    let addr = server.local_addr();
    let peers: Vec<UdpSocket> = (0..16).map(|_| peer()).collect();
    for round in 1..=3 {
        for p in &peers {
            let me = p.local_addr().unwrap();
            assert_eq!(ask(p, addr, b"hi"), format!("{round} {me} hi"));
        }
    }
    assert_eq!(server.sessions(), 16);
    // A handler that panics ends its session (counted, no on_close); the
    // peer's next datagram opens a fresh one, and nobody else notices.
    peers[0].send_to(b"panic", addr).unwrap();
    wait_until("the panic", || {
        total(&server.stats(), |s| s.panicked) == 1 && server.sessions() == 15
    });
    let me = peers[0].local_addr().unwrap();
    assert_eq!(ask(&peers[0], addr, b"again"), format!("1 {me} again"));
    let other = peers[1].local_addr().unwrap();
    assert_eq!(ask(&peers[1], addr, b"on"), format!("4 {other} on"));
    // The counter follows the send's completion, after the peer has it.
    wait_until("every reply counted", || {
        total(&server.stats(), |s| s.datagrams_out) == 16 * 3 + 2
    });
    let stats = server.stats();
    assert_eq!(total(&stats, |s| s.opened), 17);
    assert_eq!(total(&stats, |s| s.datagrams_in), 16 * 3 + 3);
    assert_eq!(rt.block_on(server.shutdown()), 16);
    let closes = closes.lock().unwrap();
    assert_eq!(closes.len(), 16);
    assert!(closes.iter().all(|c| *c == DatagramClose::Shutdown));
}

/// Keyed by the tenant its first datagram names (`KEY <n>`); a datagram
/// of an unknown peer without it is garbage. Answers
/// `"<tenant> <shard> <count>"`, the count over every peer of the tenant.
struct Tenant {
    name: String,
    count: u32,
}

impl DatagramSession for Tenant {
    type Key = String;

    fn key(datagram: &[u8], _peer: SocketAddr) -> Option<String> {
        let rest = datagram.strip_prefix(b"KEY ")?;
        Some(String::from_utf8_lossy(rest).into_owned())
    }

    async fn on_datagram(&mut self, _datagram: Bytes, cx: &mut DatagramCtx) {
        assert_eq!(
            mailring::current_shard().map(|s| s.index()),
            Some(cx.shard().index())
        );
        self.count += 1;
        let out = format!("{} {} {}", self.name, cx.shard().index(), self.count);
        cx.reply(Bytes::from(out));
    }
}

#[test]
fn first_datagram_keys_place_sessions_on_their_shard_and_garbage_is_dropped() {
    let rt = runtime();
    let server = DatagramServer::builder(|key: &String| Tenant {
        name: key.clone(),
        count: 0,
    })
    // Tenant n lives on shard n % 2.
    .placement(|key: &String, n| ShardId::new(key.parse::<usize>().unwrap_or(0) % n))
    .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
    .unwrap();
    let addr = server.local_addr();
    // Two peers per tenant, 6 tenants: the peers of a tenant share its
    // session, wherever the kernel delivered their datagrams.
    let mut count = [0u32; 6];
    let peers: Vec<(usize, UdpSocket)> = (0..12).map(|i| (i % 6, peer())).collect();
    for (tenant, p) in &peers {
        count[*tenant] += 1;
        assert_eq!(
            ask(p, addr, format!("KEY {tenant}").as_bytes()),
            format!("{tenant} {} {}", tenant % 2, count[*tenant])
        );
    }
    // Known peers need not repeat the key.
    for (tenant, p) in &peers {
        count[*tenant] += 1;
        assert_eq!(
            ask(p, addr, b"more"),
            format!("{tenant} {} {}", tenant % 2, count[*tenant])
        );
    }
    // Garbage from unknown peers: dropped, counted, never answered.
    let stranger = peer();
    stranger
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    for junk in [&b"GET / HTTP/1.1"[..], b"", &[0xff; 1500]] {
        stranger.send_to(junk, addr).unwrap();
    }
    let mut buf = [0u8; 64];
    assert!(
        stranger.recv_from(&mut buf).is_err(),
        "no answer to garbage"
    );
    wait_until("three garbage datagrams", || {
        total(&server.stats(), |s| s.garbage) == 3
    });
    // Everyone else is still served.
    let (tenant, p) = &peers[0];
    assert_eq!(
        ask(p, addr, b"still"),
        format!("{tenant} 0 {}", count[*tenant] + 1)
    );
    assert_eq!(server.sessions(), 6);
    rt.block_on(server.shutdown());
}

#[test]
fn idle_sessions_expire_and_the_cap_refuses_new_peers_until_one_does() {
    let rt = runtime();
    let mut config = DatagramConfig::default();
    config.idle_timeout = Duration::from_millis(150);
    config.max_sessions = 3;
    let (server, closes) = per_peer_server(&rt, config);
    let addr = server.local_addr();
    let peers: Vec<UdpSocket> = (0..4).map(|_| peer()).collect();
    for p in &peers[..3] {
        let me = p.local_addr().unwrap();
        assert_eq!(ask(p, addr, b"x"), format!("1 {me} x"));
    }
    // A fourth peer is over the cap: dropped and counted.
    peers[3]
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    peers[3].send_to(b"x", addr).unwrap();
    let mut buf = [0u8; 64];
    assert!(peers[3].recv_from(&mut buf).is_err());
    wait_until("the refusal", || {
        total(&server.stats(), |s| s.over_capacity) >= 1
    });
    // Idle, they expire; the fourth gets in, and a returning peer starts
    // over with a new session.
    wait_until("three idle expiries", || server.sessions() == 0);
    assert_eq!(total(&server.stats(), |s| s.expired), 3);
    assert_eq!(
        closes.lock().unwrap().as_slice(),
        &[DatagramClose::IdleTimeout; 3]
    );
    peers[3]
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let me = peers[3].local_addr().unwrap();
    assert_eq!(ask(&peers[3], addr, b"in"), format!("1 {me} in"));
    let me = peers[0].local_addr().unwrap();
    assert_eq!(ask(&peers[0], addr, b"back"), format!("1 {me} back"));
    rt.block_on(server.shutdown());
}

#[test]
fn a_datagram_past_the_copied_size_arrives_whole_and_the_next_small_one_too() {
    a_big_datagram_then_a_small_one_under(DatagramConfig::default());
}

#[test]
fn a_big_datagram_then_a_small_one_through_single_receives() {
    let mut config = DatagramConfig::default();
    config.multishot_receive = false;
    a_big_datagram_then_a_small_one_under(config);
}

fn a_big_datagram_then_a_small_one_under(config: DatagramConfig) {
    let rt = runtime();
    let (server, _closes) = per_peer_server(&rt, config);
    let addr = server.local_addr();
    let p = peer();
    let me = p.local_addr().unwrap();
    // 60,000 bytes: more than a receive copies out, less than UDP's limit.
    let big: Vec<u8> = (0..60_000u32).map(|i| (i % 251) as u8).collect();
    p.send_to(&big, addr).unwrap();
    let mut buf = vec![0u8; 65_536];
    let (n, _) = p.recv_from(&mut buf).expect("the big echo");
    let prefix = format!("1 {me} ");
    assert_eq!(&buf[..prefix.len()], prefix.as_bytes());
    assert_eq!(&buf[prefix.len()..n], &big[..]);
    assert_eq!(ask(&p, addr, b"small"), format!("2 {me} small"));
    rt.block_on(server.shutdown());
}

/// The runtime shut down under a server still receiving (no
/// `server.shutdown()` first): the armed receives are cancelled and their
/// buffers given back, nothing left to leak, on both receive paths.
#[test]
fn a_runtime_shut_down_under_a_receiving_server_leaks_nothing() {
    for multishot in [true, false] {
        let rt = runtime();
        let mut config = DatagramConfig::default();
        config.multishot_receive = multishot;
        let (server, _closes) = per_peer_server(&rt, config);
        let addr = server.local_addr();
        let p = peer();
        let me = p.local_addr().unwrap();
        assert_eq!(ask(&p, addr, b"hi"), format!("1 {me} hi"));
        // More on the way while the runtime goes.
        for _ in 0..100 {
            let _ = p.send_to(b"more", addr);
        }
        let report = rt.shutdown();
        assert_eq!(report.ops_leaked, 0, "multishot {multishot}: {report:?}");
        assert!(
            report.panic_records.is_empty(),
            "multishot {multishot}: {report:?}"
        );
        drop(server);
    }
}

/// A kernel that refuses multishot datagram receives (before 6.0, shown
/// here by fault injection): every shard goes on with single receives,
/// and peers are served as before.
#[test]
fn shards_fall_back_to_single_receives_where_the_kernel_refuses_multishot_ones() {
    let mut faults = mailring::FaultInjection::default();
    faults.multishot_recvmsg_errno = Some(libc::EINVAL);
    let rt = mailring::Runtime::builder()
        .shards(2)
        .fault_injection(faults)
        .build()
        .expect("io_uring available");
    let (server, _closes) = per_peer_server(&rt, DatagramConfig::default());
    let addr = server.local_addr();
    let peers: Vec<UdpSocket> = (0..8).map(|_| peer()).collect();
    for round in 1..=2 {
        for p in &peers {
            let me = p.local_addr().unwrap();
            assert_eq!(ask(p, addr, b"hi"), format!("{round} {me} hi"));
        }
    }
    assert_eq!(rt.block_on(server.shutdown()), 8);
}

/// A datagram past `max_datagram` is dropped and counted, never handed on
/// cut; one of exactly that size arrives whole; on both receive paths.
#[test]
fn a_datagram_past_the_size_limit_is_dropped_and_counted_never_cut() {
    for multishot in [true, false] {
        let rt = runtime();
        let mut config = DatagramConfig::default();
        config.multishot_receive = multishot;
        config.max_datagram = 1000;
        let (server, _closes) = per_peer_server(&rt, config);
        let addr = server.local_addr();
        let p = peer();
        let me = p.local_addr().unwrap();
        p.send_to(&[b'x'; 1001], addr).unwrap();
        let exact = vec![b'y'; 1000];
        p.send_to(&exact, addr).unwrap();
        let mut buf = vec![0u8; 4096];
        let (n, _) = p.recv_from(&mut buf).expect("the exact one's echo");
        let prefix = format!("1 {me} ");
        assert_eq!(
            &buf[..prefix.len()],
            prefix.as_bytes(),
            "multishot {multishot}"
        );
        assert_eq!(&buf[prefix.len()..n], &exact[..], "multishot {multishot}");
        assert_eq!(ask(&p, addr, b"small"), format!("2 {me} small"));
        let stats = server.stats();
        assert_eq!(
            total(&stats, |s| s.oversized),
            1,
            "multishot {multishot}: {stats:?}"
        );
        rt.block_on(server.shutdown());
    }
}

/// Extreme limits are taken as the nearest bound: 0 as 1 byte,
/// `usize::MAX` as 65,536 (nothing overflows sizing the buffers).
#[test]
fn extreme_size_limits_are_taken_as_their_bounds() {
    for multishot in [true, false] {
        let rt = runtime();
        let mut config = DatagramConfig::default();
        config.multishot_receive = multishot;
        config.max_datagram = 0;
        let (server, _closes) = per_peer_server(&rt, config.clone());
        let addr = server.local_addr();
        let p = peer();
        let me = p.local_addr().unwrap();
        p.send_to(b"no", addr).unwrap();
        assert_eq!(
            ask(&p, addr, b"y"),
            format!("1 {me} y"),
            "multishot {multishot}"
        );
        assert_eq!(total(&server.stats(), |s| s.oversized), 1);
        rt.block_on(server.shutdown());

        config.max_datagram = usize::MAX;
        let (server, _closes) = per_peer_server(&rt, config);
        let addr = server.local_addr();
        let big = vec![b'z'; 60_000];
        p.send_to(&big, addr).unwrap();
        let mut buf = vec![0u8; 65_536];
        let (n, _) = p.recv_from(&mut buf).expect("the big echo");
        assert_eq!(
            n,
            format!("1 {me} ").len() + big.len(),
            "multishot {multishot}"
        );
        rt.block_on(server.shutdown());
    }
}

/// A one-shard runtime (every peer remembered by one socket's table) and
/// a configuration with room for two sessions.
fn one_shard_room_for_two() -> (mailring::Runtime, DatagramConfig) {
    let rt = mailring::Runtime::builder()
        .shards(1)
        .build()
        .expect("io_uring available");
    let mut config = DatagramConfig::default();
    config.max_sessions = 2;
    (rt, config)
}

#[test]
fn a_flood_of_newcomers_to_a_full_peer_table_is_refused_without_a_look_at_every_peer_each() {
    // Two peers heard from just now fill the table; none can be quiet for
    // a quarter of the idle timeout (10 s here). Each newcomer is refused;
    // only the first looks through the table for a quiet peer to forget.
    let (rt, mut config) = one_shard_room_for_two();
    config.idle_timeout = Duration::from_secs(40);
    let (server, _closes) = per_peer_server(&rt, config);
    let addr = server.local_addr();
    let members: Vec<UdpSocket> = (0..2).map(|_| peer()).collect();
    for p in &members {
        let me = p.local_addr().unwrap();
        assert_eq!(ask(p, addr, b"in"), format!("1 {me} in"));
    }
    let newcomers: Vec<UdpSocket> = (0..100).map(|_| peer()).collect();
    for p in &newcomers {
        p.send_to(b"let me in", addr).unwrap();
    }
    wait_until("100 refusals", || {
        total(&server.stats(), |s| s.over_capacity) == 100
    });
    assert_eq!(total(&server.stats(), |s| s.quiet_peer_looks), 1);
    // The members are still served.
    for p in &members {
        let me = p.local_addr().unwrap();
        assert_eq!(ask(p, addr, b"still"), format!("2 {me} still"));
    }
    rt.block_on(server.shutdown());
}

#[test]
fn a_session_that_closes_gives_back_its_place_and_its_queued_datagrams_go_to_a_new_one() {
    // One shard: every peer is remembered by the same socket's table.
    let (rt, mut config) = one_shard_room_for_two();
    config.idle_timeout = Duration::from_millis(400);
    let (server, closes) = per_peer_server(&rt, config);
    let addr = server.local_addr();
    let peers: Vec<UdpSocket> = (0..3).map(|_| peer()).collect();
    // Two peers fill the cap and close: once they have been quiet for a
    // quarter of the idle timeout, a third gets in (they are remembered,
    // but no session of theirs holds a place).
    for p in &peers[..2] {
        let me = p.local_addr().unwrap();
        assert_eq!(ask(p, addr, b"bye"), format!("1 {me} bye"));
    }
    wait_until("two closes", || closes.lock().unwrap().len() == 2);
    std::thread::sleep(Duration::from_millis(150));
    let me = peers[2].local_addr().unwrap();
    assert_eq!(ask(&peers[2], addr, b"in"), format!("1 {me} in"));
    // A datagram queued behind the one that closes its session is handled
    // by the next session of its key, not dropped.
    let p = &peers[0];
    let me = p.local_addr().unwrap();
    for round in 0..20 {
        p.send_to(b"bye", addr).unwrap();
        p.send_to(b"hello", addr).unwrap();
        let mut replies = Vec::new();
        let mut buf = [0u8; 256];
        for _ in 0..2 {
            let (n, _) = p.recv_from(&mut buf).unwrap_or_else(|e| {
                panic!("round {round}: a reply is missing ({e}); got {replies:?}")
            });
            replies.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        assert_eq!(replies, [format!("1 {me} bye"), format!("1 {me} hello")]);
        // Close that session too, and wait for it to end (the first one's
        // close ran before its queued datagram went to the second).
        let closed = closes.lock().unwrap().len();
        assert_eq!(ask(p, addr, b"bye"), format!("2 {me} bye"));
        wait_until("the close", || closes.lock().unwrap().len() > closed);
    }
    rt.block_on(server.shutdown());
}

#[test]
fn a_panicking_placement_drops_its_datagram_and_every_shard_keeps_serving() {
    let rt = runtime();
    let server = DatagramServer::builder(|key: &String| Tenant {
        name: key.clone(),
        count: 0,
    })
    .placement(|key: &String, n| {
        assert_ne!(key, "boom", "a placement that panics");
        ShardId::new(key.parse::<usize>().unwrap_or(0) % n)
    })
    .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
    .unwrap();
    let addr = server.local_addr();
    // Enough strangers that the kernel hands some to each shard's socket.
    let strangers: Vec<UdpSocket> = (0..16).map(|_| peer()).collect();
    for s in &strangers {
        s.send_to(b"KEY boom", addr).unwrap();
    }
    wait_until("sixteen refusals", || {
        total(&server.stats(), |s| s.garbage) == 16
    });
    // Every shard's socket still serves (the same peers: the kernel
    // keeps each on its socket).
    for (i, s) in strangers.iter().enumerate() {
        let tenant = i % 4;
        assert_eq!(
            ask(s, addr, format!("KEY {tenant}").as_bytes()),
            format!("{tenant} {} {}", tenant % 2, i / 4 + 1)
        );
    }
    rt.block_on(server.shutdown());
}

#[test]
fn a_server_dropped_without_shutdown_stops_and_frees_its_port() {
    let rt = runtime();
    let (server, _) = per_peer_server(&rt, DatagramConfig::default());
    let addr = server.local_addr();
    let p = peer();
    let me = p.local_addr().unwrap();
    assert_eq!(ask(&p, addr, b"x"), format!("1 {me} x"));
    drop(server);
    wait_until("the port free again", || UdpSocket::bind(addr).is_ok());
}

/// A full peer table where one peer fell quiet: the first newcomer's look
/// forgets it and takes its place; later ones are refused without a look
/// until another may have fallen quiet (a look that frees a place or two
/// does not invite the next newcomer to walk the whole table again).
#[test]
fn a_look_that_frees_few_places_is_not_repeated_for_each_newcomer() {
    let rt = mailring::Runtime::builder()
        .shards(1)
        .build()
        .expect("io_uring available");
    let mut config = DatagramConfig::default();
    config.max_sessions = 8;
    // Quiet after a quarter of this: 500 ms.
    config.idle_timeout = Duration::from_secs(2);
    let (server, _closes) = per_peer_server(&rt, config);
    let addr = server.local_addr();
    let members: Vec<UdpSocket> = (0..8).map(|_| peer()).collect();
    let me = members[0].local_addr().unwrap();
    assert_eq!(ask(&members[0], addr, b"bye"), format!("1 {me} bye"));
    std::thread::sleep(Duration::from_millis(600));
    for p in &members[1..] {
        let me = p.local_addr().unwrap();
        assert_eq!(ask(p, addr, b"bye"), format!("1 {me} bye"));
    }
    let newcomers: Vec<UdpSocket> = (0..20).map(|_| peer()).collect();
    for p in &newcomers {
        p.send_to(b"let me in", addr).unwrap();
    }
    wait_until("19 refusals", || {
        total(&server.stats(), |s| s.over_capacity) == 19
    });
    assert_eq!(total(&server.stats(), |s| s.quiet_peer_looks), 1);
    rt.block_on(server.shutdown());
}

#[test]
fn peers_heard_from_lately_keep_their_key_when_the_table_is_full() {
    // One shard, room for two: the key comes in a peer's first datagram
    // only, so forgetting a live peer would make its next one garbage.
    let (rt, config) = one_shard_room_for_two();
    let server = DatagramServer::builder(|key: &String| Tenant {
        name: key.clone(),
        count: 0,
    })
    .config(config)
    .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
    .unwrap();
    let addr = server.local_addr();
    let peers: Vec<UdpSocket> = (0..3).map(|_| peer()).collect();
    assert_eq!(ask(&peers[0], addr, b"KEY a"), "a 0 1");
    assert_eq!(ask(&peers[1], addr, b"KEY b"), "b 0 1");
    // A third peer, the others heard from just now: refused.
    peers[2]
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    peers[2].send_to(b"KEY c", addr).unwrap();
    assert!(peers[2].recv_from(&mut [0u8; 64]).is_err());
    wait_until("the refusal", || {
        total(&server.stats(), |s| s.over_capacity) == 1
    });
    // The first two still have their keys.
    assert_eq!(ask(&peers[0], addr, b"x"), "a 0 2");
    assert_eq!(ask(&peers[1], addr, b"x"), "b 0 2");
    assert_eq!(total(&server.stats(), |s| s.garbage), 0);
    rt.block_on(server.shutdown());
}

#[test]
fn a_shutdown_waits_for_a_stuck_handler_only_its_grace() {
    let rt = runtime();
    let mut config = DatagramConfig::default();
    config.shutdown_grace = Duration::from_millis(100);
    let (server, _) = per_peer_server(&rt, config);
    let addr = server.local_addr();
    let p = peer();
    let me = p.local_addr().unwrap();
    assert_eq!(ask(&p, addr, b"x"), format!("1 {me} x"));
    p.send_to(b"stuck", addr).unwrap();
    wait_until("the stuck datagram", || {
        total(&server.stats(), |s| s.datagrams_in) == 2
    });
    let started = Instant::now();
    assert_eq!(rt.block_on(server.shutdown()), 1);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let report = rt.shutdown();
    assert!(
        report
            .drained
            .iter()
            .any(|l| l.dropped == 1 && l.drained == 0),
        "{report:?}"
    );
}

/// Every peer's session lives on shard 1; `"hold"` blocks that shard's
/// thread (not only the session) until `release` is set, so datagrams that
/// shard 0 receives and hands over wait in shard 1's inbox of closures.
struct OnShardOne {
    held: Arc<std::sync::atomic::AtomicBool>,
    release: Arc<std::sync::atomic::AtomicBool>,
}

impl DatagramSession for OnShardOne {
    type Key = SocketAddr;

    fn key(_datagram: &[u8], peer: SocketAddr) -> Option<SocketAddr> {
        Some(peer)
    }

    async fn on_datagram(&mut self, datagram: Bytes, cx: &mut DatagramCtx) {
        use std::sync::atomic::Ordering;
        if &datagram[..] == b"hold" {
            self.held.store(true, Ordering::SeqCst);
            let until = Instant::now() + Duration::from_secs(10);
            while !self.release.load(Ordering::SeqCst) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        cx.reply(datagram);
    }
}

#[test]
fn datagrams_handed_to_a_busy_shard_are_bounded_and_the_rest_dropped_and_counted() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let rt = runtime();
    let mut config = DatagramConfig::default();
    config.handoff_queue = 8;
    let (held, release) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let (h, r) = (held.clone(), release.clone());
    let server = DatagramServer::builder(move |_peer: &SocketAddr| OnShardOne {
        held: h.clone(),
        release: r.clone(),
    })
    .config(config)
    .placement(|_key: &SocketAddr, _n| ShardId::new(1))
    .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
    .unwrap();
    let addr = server.local_addr();
    let holder = peer();
    holder.send_to(b"hold", addr).unwrap();
    wait_until("shard 1 held", || held.load(Ordering::SeqCst));
    let before = server.stats()[0].clone();
    // 16 peers: the kernel spreads them over both shards' sockets; those
    // on shard 0 are handed to the held shard 1.
    let peers: Vec<UdpSocket> = (0..16).map(|_| peer()).collect();
    for p in &peers {
        for _ in 0..40 {
            p.send_to(b"x", addr).unwrap();
        }
    }
    wait_until("shard 0 refusing hand-offs past the bound", || {
        server.stats()[0].handoff_full > 0
    });
    let during = server.stats()[0].clone();
    assert!(
        during.forwarded - before.forwarded <= 8,
        "at most handoff_queue datagrams wait for the held shard: {during:?}"
    );
    release.store(true, Ordering::SeqCst);
    let mut buf = [0u8; 64];
    let (n, _) = holder
        .recv_from(&mut buf)
        .expect("the held datagram's reply");
    assert_eq!(&buf[..n], b"hold");
    // Once shard 1 takes its inbox, hand-offs flow again and everyone is
    // answered. Until it has (it may not have yet), a hand-off past the
    // bound is dropped as designed: a datagram is sent again until its
    // reply comes (past the replies to earlier datagrams, which may come
    // first).
    let answered = |p: &UdpSocket, body: &[u8]| {
        p.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut got = [0u8; 64];
        loop {
            assert!(
                Instant::now() < deadline,
                "never answered: {:?}",
                server.stats()
            );
            p.send_to(body, addr).unwrap();
            while let Ok((n, _)) = p.recv_from(&mut got) {
                if &got[..n] == body {
                    return;
                }
                assert_eq!(&got[..n], b"x");
            }
        }
    };
    let late = peer();
    answered(&late, b"after");
    for p in &peers {
        answered(p, b"again");
    }
    rt.block_on(server.shutdown());
}

/// Panics outside its future's poll: on an empty datagram before making
/// its future, and on `drop` as the finished future is dropped; echoes
/// anything else.
struct PanicsOutsidePoll;

/// Panics when dropped.
struct PanicOnDrop;

impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        panic!("a handler's future panics as it is dropped");
    }
}

/// Finished at once, holding what it holds until it is dropped.
struct Finished(#[allow(dead_code)] Option<PanicOnDrop>);

impl std::future::Future for Finished {
    type Output = ();
    fn poll(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        std::task::Poll::Ready(())
    }
}

impl DatagramSession for PanicsOutsidePoll {
    type Key = SocketAddr;

    fn key(_datagram: &[u8], peer: SocketAddr) -> Option<SocketAddr> {
        Some(peer)
    }

    fn on_datagram(
        &mut self,
        datagram: Bytes,
        cx: &mut DatagramCtx,
    ) -> impl std::future::Future<Output = ()> {
        // Indexing a datagram the peer chose: panics on an empty one.
        let first = datagram[0];
        cx.reply(datagram.clone());
        // (Made only when asked for: made and dropped here, it panics.)
        if first == b'd' && &datagram[..] == b"drop" {
            Finished(Some(PanicOnDrop))
        } else {
            Finished(None)
        }
    }
}

#[test]
fn a_panic_outside_a_handler_s_poll_ends_only_its_session_and_gives_back_its_place() {
    // Room for one session: a place not given back would refuse the next.
    let (rt, mut config) = one_shard_room_for_two();
    config.max_sessions = 1;
    let server = DatagramServer::builder(|_peer: &SocketAddr| PanicsOutsidePoll)
        .config(config)
        .bind(rt.handle(), "127.0.0.1:0".parse().unwrap())
        .unwrap();
    let addr = server.local_addr();
    let p = peer();
    assert_eq!(ask(&p, addr, b"one"), "one");
    // An empty datagram: the panic comes before the handler's future.
    p.send_to(b"", addr).unwrap();
    wait_until("the first panic", || {
        total(&server.stats(), |s| s.panicked) == 1 && server.sessions() == 0
    });
    assert_eq!(ask(&p, addr, b"two"), "two");
    // The finished future panics as it is dropped, after its reply.
    assert_eq!(ask(&p, addr, b"drop"), "drop");
    wait_until("the second panic", || {
        total(&server.stats(), |s| s.panicked) == 2 && server.sessions() == 0
    });
    // Its place went back: the peer's next datagram opens the one session
    // there is room for.
    assert_eq!(ask(&p, addr, b"three"), "three");
    assert_eq!(server.sessions(), 1);
    rt.block_on(server.shutdown());
}

/// Sessions whose handlers are stuck cannot make a shard hold more than
/// `max_queued_bytes` of datagrams in their queues, however many sessions
/// there are: past it, datagrams are dropped and counted.
#[test]
fn the_datagrams_queued_on_a_shard_are_bounded_in_bytes_over_all_its_sessions() {
    let rt = mailring::Runtime::builder()
        .shards(1)
        .build()
        .expect("io_uring available");
    let mut config = DatagramConfig::default();
    config.max_queued_bytes = 20_000;
    config.shutdown_grace = Duration::from_millis(50);
    let (server, _) = per_peer_server(&rt, config);
    let addr = server.local_addr();
    let peers: Vec<UdpSocket> = (0..4).map(|_| peer()).collect();
    for p in &peers {
        p.send_to(b"stuck", addr).unwrap();
    }
    let body = vec![b'x'; 1000];
    for _ in 0..10 {
        for p in &peers {
            p.send_to(&body, addr).unwrap();
            // Not faster than the shard takes them (the socket's own
            // buffer would drop them first).
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    wait_until("every datagram", || {
        total(&server.stats(), |s| s.datagrams_in) == 44
    });
    let stats = server.stats();
    let dropped = total(&stats, |s| s.queued_bytes_full);
    // 40 of 1,000 bytes (each counted with its overhead) against 20,000:
    // at most 19 are queued.
    assert!(dropped >= 21, "{stats:?}");
    assert_eq!(total(&stats, |s| s.queue_full), 0, "{stats:?}");
    rt.block_on(server.shutdown());
}

/// A handler that queued a reply and then panicked sends nothing: its
/// session ends as a connection's does, with what it had not sent yet
/// (its state may be half changed); the peer's next datagram opens a new
/// session.
#[test]
fn a_handler_that_panics_after_queueing_a_reply_sends_nothing() {
    let rt = runtime();
    let (server, _) = per_peer_server(&rt, DatagramConfig::default());
    let addr = server.local_addr();
    let p = peer();
    let me = p.local_addr().unwrap();
    p.send_to(b"reply, then panic", addr).unwrap();
    wait_until("the panic", || total(&server.stats(), |s| s.panicked) == 1);
    assert_eq!(
        ask(&p, addr, b"x"),
        format!("1 {me} x"),
        "a new session, and no half-done reply"
    );
    rt.block_on(server.shutdown());
}

/// A session stuck past the shutdown's grace does not keep its shard's
/// socket open: a server bound to the same address afterwards gets every
/// peer's datagrams (a socket left in the port's reuse group, read by
/// nobody, would take some of them).
#[test]
fn a_session_stuck_past_the_grace_does_not_keep_the_port() {
    let rt = runtime();
    let mut config = DatagramConfig::default();
    config.shutdown_grace = Duration::from_millis(50);
    let (server, _) = per_peer_server(&rt, config.clone());
    let addr = server.local_addr();
    let stuck = peer();
    stuck.send_to(b"stuck", addr).unwrap();
    wait_until("the stuck datagram", || {
        total(&server.stats(), |s| s.datagrams_in) == 1
    });
    assert_eq!(rt.block_on(server.shutdown()), 1);
    // The stuck session lives on, past its grace.
    std::thread::sleep(Duration::from_millis(100));
    let closes = Arc::new(Mutex::new(Vec::new()));
    let c = closes.clone();
    let again = DatagramServer::builder(move |_peer: &SocketAddr| PerPeer {
        seen: 0,
        closes: c.clone(),
    })
    .config(config)
    .bind(rt.handle(), addr)
    .unwrap();
    for _ in 0..16 {
        let p = peer();
        p.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let me = p.local_addr().unwrap();
        assert_eq!(ask(&p, addr, b"hi"), format!("1 {me} hi"));
    }
    rt.block_on(again.shutdown());
}

/// A handler that never finishes is given up at the handler timeout: its
/// session ends (`on_close` is told why), what it queued is not sent (its
/// state may be half changed), and the peer's next datagrams, those queued
/// behind it included, go to a new session: a stuck handler does not pin
/// its key until shutdown.
#[test]
fn a_handler_past_the_handler_timeout_ends_its_session_and_frees_its_key() {
    assert_eq!(
        DatagramConfig::default().handler_timeout,
        Some(Duration::from_secs(30))
    );
    let rt = runtime();
    let mut config = DatagramConfig::default();
    config.handler_timeout = Some(Duration::from_millis(100));
    let (server, closes) = per_peer_server(&rt, config);
    let addr = server.local_addr();
    for stuck in [&b"stuck"[..], b"reply, then stuck"] {
        let p = peer();
        let me = p.local_addr().unwrap();
        p.send_to(stuck, addr).unwrap();
        // Queued behind the stuck one: handled by the next session.
        p.send_to(b"behind", addr).unwrap();
        let mut buf = [0u8; 2048];
        let (n, _) = p.recv_from(&mut buf).expect("a reply");
        assert_eq!(
            std::str::from_utf8(&buf[..n]).unwrap(),
            format!("1 {me} behind"),
            "nothing of the stuck handler's is sent"
        );
        assert_eq!(ask(&p, addr, b"again"), format!("2 {me} again"));
    }
    assert_eq!(
        *closes.lock().unwrap(),
        vec![DatagramClose::HandlerTimeout; 2]
    );
    assert_eq!(total(&server.stats(), |s| s.handler_timeouts), 2);
    assert_eq!(total(&server.stats(), |s| s.panicked), 0);
    rt.block_on(server.shutdown());
}

/// With no handler timeout, a slow handler is waited for however long it
/// takes, and neither the idle expiry (six times shorter than the wait
/// here) nor anything else ends its session meanwhile: the peer's next
/// datagram queues behind it instead of opening a session of its own.
#[test]
fn without_a_handler_timeout_a_slow_handler_is_waited_for() {
    let rt = runtime();
    let mut config = DatagramConfig::default();
    config.handler_timeout = None;
    config.idle_timeout = Duration::from_millis(50);
    config.shutdown_grace = Duration::from_millis(50);
    let (server, closes) = per_peer_server(&rt, config);
    let addr = server.local_addr();
    let p = peer();
    p.send_to(b"stuck", addr).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    p.send_to(b"behind", addr).unwrap();
    wait_until("the datagram behind", || {
        total(&server.stats(), |s| s.datagrams_in) == 2
    });
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        closes.lock().unwrap().is_empty(),
        "{:?}",
        closes.lock().unwrap()
    );
    assert_eq!(total(&server.stats(), |s| s.handler_timeouts), 0);
    assert_eq!(total(&server.stats(), |s| s.opened), 1, "one session");
    assert_eq!(
        rt.block_on(server.shutdown()),
        1,
        "the slow handler outlives the grace"
    );
}
