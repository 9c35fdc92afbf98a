//! Sessions against Tokio servers, over loopback, with the load generator
//! in a process of its own.
//!
//! ```text
//! cargo run --release -p mailring-bench --example sessions -- [pairs] [workload...]
//! ```
//!
//! Workloads (all frames length-delimited, 4-byte big-endian header):
//! - `echo64`: one connection, 20,000 round trips of 64 bytes.
//! - `stream4k`: 8 connections, each 10,000 frames of 4 KiB with up to 32
//!   in flight, echoed.
//! - `tenants1` / `tenants16`: 1,000 connections, each keyed to one of 100
//!   tenants by its first frame, then 100 requests each, routed to the
//!   tenant's actor (a counter) and answered; 1 or 16 in flight per
//!   connection.
//!
//! Contenders: mailring sessions (2 shards, reuseport steered, keyed
//! actors placed `"balanced"`, deferred replies) against Tokio (2 workers, tokio-util's
//! `LengthDelimitedCodec`), for tenants both with kameo actors and with
//! plain tasks and channels (requests pipelined the same way: an ordered
//! window of outstanding replies). Each pair runs the contenders in
//! alternating order; the server's CPU time per request is its process's
//! CPU time over the run (the load generator is another process).
//!
//! On a machine with cores to spare, keep the load generator off the
//! servers' cores: run the benchmark under `taskset -c 0,1`, and set
//! `SESSIONS_CLIENT_CPUS=LIST` (the load generator under `taskset -c
//! LIST`) and `SESSIONS_CLIENT_THREADS=N` (its connections over N threads).
//! `MAILRING_BALANCE=1` moves the echo workloads' fresh connections to the
//! least loaded shard (`ServerConfig::balance_plain_connections`).

use mailring_bench::{median_of as median, quartiles_of as quartiles};
use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

const TENANTS: usize = 100;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Workload {
    Echo64,
    Stream4k,
    Tenants(usize),
    /// Connections per second and first-reply latency: connect, name a
    /// tenant, one request, close.
    Connect,
}

impl Workload {
    fn parse(s: &str) -> Option<Workload> {
        Some(match s {
            "echo64" => Workload::Echo64,
            "stream4k" => Workload::Stream4k,
            "tenants1" => Workload::Tenants(1),
            "tenants16" => Workload::Tenants(16),
            "connect" => Workload::Connect,
            _ => return None,
        })
    }

    fn name(self) -> String {
        match self {
            Workload::Echo64 => "echo64".into(),
            Workload::Stream4k => "stream4k".into(),
            Workload::Tenants(w) => format!("tenants{w}"),
            Workload::Connect => "connect".into(),
        }
    }

    /// Connections, requests per connection, window.
    fn shape(self) -> (usize, usize, usize) {
        match self {
            Workload::Echo64 => (1, 20_000, 1),
            Workload::Stream4k => (8, 10_000, 32),
            Workload::Tenants(w) => (1_000, 100, w),
            Workload::Connect => (2_000, 1, 1),
        }
    }

    fn contenders(self) -> &'static [Contender] {
        match self {
            Workload::Echo64 | Workload::Stream4k => &[Contender::Mailring, Contender::Tokio],
            Workload::Tenants(_) => &[Contender::Mailring, Contender::Tokio, Contender::TokioKameo],
            Workload::Connect => &[
                Contender::Mailring,
                Contender::MailringHandOff,
                Contender::MailringHandOffDirect,
                Contender::MailringUnsteered,
            ],
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Contender {
    Mailring,
    /// Tokio; for tenants, tasks + channels.
    Tokio,
    TokioKameo,
    /// Tenants: one acceptor, every other shard's connection moves.
    MailringHandOff,
    /// The same, moving direct descriptors over `IORING_MSG_SEND_FD`.
    MailringHandOffDirect,
    /// Tenants: reuseport without source-port steering, ordinary clients.
    MailringUnsteered,
}

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Contender::Mailring => "mailring",
            Contender::Tokio => "tokio",
            Contender::TokioKameo => "tokio+kameo",
            Contender::MailringHandOff => "mailring single acceptor (hand-off)",
            Contender::MailringHandOffDirect => "mailring single acceptor (direct hand-off)",
            Contender::MailringUnsteered => "mailring reuseport unsteered",
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("client") {
        let workload = Workload::parse(&args[1]).expect("workload");
        let addr: SocketAddr = args[2].parse().expect("address");
        client(
            workload,
            addr,
            args.get(3).map(String::as_str) == Some("steer"),
        );
        return;
    }
    let pairs: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(5);
    let mut workloads: Vec<Workload> = args.iter().filter_map(|a| Workload::parse(a)).collect();
    if workloads.is_empty() {
        workloads = vec![
            Workload::Echo64,
            Workload::Stream4k,
            Workload::Tenants(1),
            Workload::Tenants(16),
            Workload::Connect,
        ];
    }
    println!("sessions benchmark: {pairs} alternating pairs per workload, 2 server threads, load generator in its own process");
    for w in workloads {
        run_workload(w, pairs);
    }
}

/// One run's figures.
#[derive(Clone, Copy, Debug)]
struct Run {
    wall: Duration,
    p50: Duration,
    p99: Duration,
    server_cpu: Duration,
    requests: u64,
}

fn run_workload(w: Workload, pairs: usize) {
    // SESSIONS_ONLY=<name>: run one contender (for profiling).
    let only = std::env::var("SESSIONS_ONLY").ok();
    let contenders: Vec<Contender> = w
        .contenders()
        .iter()
        .copied()
        .filter(|c| only.as_deref().is_none_or(|o| o == c.name()))
        .collect();
    let runs: Vec<Vec<Run>> = mailring_bench::alternating_pairs(pairs, contenders.len(), |i| {
        serve_once(contenders[i], w)
    });
    println!("\n## {}", w.name());
    println!("| contender | median wall | req/s | p50 | p99 | server CPU/req | wall ratio vs mailring (median [q1, q3]) |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for (i, c) in contenders.iter().enumerate() {
        let r = &runs[i];
        let wall = median(r.iter().map(|x| x.wall.as_secs_f64()).collect());
        let p50 = median(r.iter().map(|x| x.p50.as_secs_f64()).collect());
        let p99 = median(r.iter().map(|x| x.p99.as_secs_f64()).collect());
        let cpu = median(
            r.iter()
                .map(|x| x.server_cpu.as_secs_f64() / x.requests as f64)
                .collect(),
        );
        let reqs = r[0].requests as f64;
        // Per pair: this contender's wall over mailring's (>1: mailring faster).
        let ratios: Vec<f64> = r
            .iter()
            .zip(&runs[0])
            .map(|(x, m)| x.wall.as_secs_f64() / m.wall.as_secs_f64())
            .collect();
        let (q1, med, q3) = quartiles(ratios);
        println!(
            "| {} | {:.1} ms | {:.0} | {:.1} µs | {:.1} µs | {:.2} µs | {med:.2} [{q1:.2}, {q3:.2}] |",
            c.name(),
            wall * 1e3,
            reqs / wall,
            p50 * 1e6,
            p99 * 1e6,
            cpu * 1e6,
        );
    }
}

/// Starts `c`'s server, runs the load generator against it in another
/// process, stops the server.
fn serve_once(c: Contender, w: Workload) -> Run {
    let server = match c {
        Contender::Mailring
        | Contender::MailringHandOff
        | Contender::MailringHandOffDirect
        | Contender::MailringUnsteered => ServerHandle::mailring(w, c),
        Contender::Tokio | Contender::TokioKameo => ServerHandle::tokio(c, w),
    };
    // Only the steered contender's clients pick their source port.
    let steer = if w == Workload::Connect && c == Contender::Mailring {
        "steer"
    } else {
        "plain"
    };
    // SESSIONS_CLIENT_CPUS=LIST: the load generator under `taskset -c
    // LIST` (run the benchmark itself under taskset to keep the servers
    // on other CPUs).
    let command = mailring_bench::load_generator(
        "SESSIONS_CLIENT_CPUS",
        ["client", &w.name(), &server.addr.to_string(), steer],
    );
    let run = mailring_bench::drive(command, c.name(), || server.stop());
    let (f, server_cpu) = (run.figures, run.server_cpu);
    Run {
        wall: Duration::from_nanos(f[0]),
        p50: Duration::from_nanos(f[1]),
        p99: Duration::from_nanos(f[2]),
        requests: f[3],
        server_cpu,
    }
}

/// Stops a mailring server on its runtime.
type StopFn = Box<dyn FnOnce(&mailring::Runtime)>;

enum ServerKind {
    Mailring {
        rt: mailring::Runtime,
        system: Option<mailring_actors::ActorSystem>,
        stop: StopFn,
    },
    Tokio {
        rt: tokio::runtime::Runtime,
        stop: tokio::sync::watch::Sender<bool>,
    },
}

struct ServerHandle {
    addr: SocketAddr,
    kind: ServerKind,
}

impl ServerHandle {
    fn stop(self) {
        match self.kind {
            ServerKind::Mailring { rt, system, stop } => {
                stop(&rt);
                if let Some(s) = system {
                    s.shutdown();
                }
                rt.shutdown();
            }
            ServerKind::Tokio { rt, stop } => {
                let _ = stop.send(true);
                rt.shutdown_timeout(Duration::from_secs(1));
            }
        }
    }
}

// ------------------------------------------------------------ mailring

mod mailring_side {
    use bytes::Bytes;
    use mailring_actors::{Actor, Addr, Ctx, Handler, Message, SystemHandle};
    use mailring_transports::codec::LengthDelimited;
    use mailring_transports::{Route, Session, SessionCtx};

    pub(crate) struct Echo;

    impl Session for Echo {
        type Codec = LengthDelimited;
        type Key = ();

        async fn on_frame(&mut self, frame: Bytes, cx: &mut SessionCtx<Self>) {
            cx.send_frame(frame);
        }
    }

    /// A tenant's counter. Balanced placement: the 100 tenants split 50/50
    /// over the 2 shards (a hash of their names splits them 45/55, and the
    /// busier shard bounds the rate).
    #[derive(Actor)]
    #[actor(key = String, activate = Tenant::new, placement = "balanced", handles(Inc))]
    pub(crate) struct Tenant {
        count: u64,
    }

    impl Tenant {
        fn new(_key: &String) -> Self {
            Tenant { count: 0 }
        }
    }

    /// The same counter placed by its name's hash (sticky): a client can
    /// compute its shard, as the connect workload's steered clients do.
    #[derive(Actor)]
    #[actor(key = String, activate = StickyTenant::new, handles(Inc))]
    pub(crate) struct StickyTenant {
        count: u64,
    }

    impl StickyTenant {
        fn new(_key: &String) -> Self {
            StickyTenant { count: 0 }
        }
    }

    #[derive(Message)]
    #[message(reply = u64)]
    pub(crate) struct Inc;

    impl Handler<Inc> for Tenant {
        async fn handle(&mut self, _m: Inc, _cx: &mut Ctx<Self>) -> u64 {
            self.count += 1;
            self.count
        }
    }

    impl Handler<Inc> for StickyTenant {
        async fn handle(&mut self, _m: Inc, _cx: &mut Ctx<Self>) -> u64 {
            self.count += 1;
            self.count
        }
    }

    /// A session's tenant: the actor of one of the two types.
    pub(crate) enum TenantAddr {
        Balanced(Addr<Tenant>),
        Sticky(Addr<StickyTenant>),
    }

    /// `KEY <tenant>` first, then each frame increments the tenant (a
    /// `StickyTenant` when `sticky`, else a `Tenant`).
    pub(crate) struct TenantSession {
        pub(crate) system: SystemHandle,
        pub(crate) sticky: bool,
        pub(crate) tenant: Option<TenantAddr>,
    }

    impl Session for TenantSession {
        type Codec = LengthDelimited;
        type Key = String;

        fn route(&mut self, frame: &Bytes, _cx: &SessionCtx<Self>) -> Route<String> {
            match frame.strip_prefix(b"KEY ") {
                Some(k) => Route::Key(String::from_utf8_lossy(k).into_owned()),
                None => Route::NotYet,
            }
        }

        async fn on_frame(&mut self, frame: Bytes, cx: &mut SessionCtx<Self>) {
            if frame.starts_with(b"KEY ") {
                cx.send_frame(Bytes::from_static(b"OK"));
                return;
            }
            if self.tenant.is_none() {
                let Some(key) = cx.key().cloned() else {
                    cx.send_frame(Bytes::from_static(b"ERR no key"));
                    return;
                };
                self.tenant = Some(if self.sticky {
                    TenantAddr::Sticky(self.system.keyed::<StickyTenant>(key))
                } else {
                    TenantAddr::Balanced(self.system.keyed::<Tenant>(key))
                });
            }
            // The ask is sent now; the deferred reply only awaits it.
            match self.tenant.as_ref().expect("set above") {
                TenantAddr::Balanced(a) => {
                    let reply = a.ask(Inc);
                    cx.reply_later(async move {
                        let n = reply.await.unwrap_or(0);
                        Bytes::copy_from_slice(&n.to_le_bytes())
                    });
                }
                TenantAddr::Sticky(a) => {
                    let reply = a.ask(Inc);
                    cx.reply_later(async move {
                        let n = reply.await.unwrap_or(0);
                        Bytes::copy_from_slice(&n.to_le_bytes())
                    });
                }
            }
        }
    }
}

impl ServerHandle {
    fn mailring(w: Workload, c: Contender) -> ServerHandle {
        use mailring_transports::codec::LengthDelimited;
        use mailring_transports::Server;
        let mut builder = mailring::Runtime::builder().shards(2);
        // MAILRING_SPIN_US: the shards' idle spin budget (0: block at once;
        // `poll`: never block).
        let spin = std::env::var("MAILRING_SPIN_US").ok();
        if spin.as_deref() == Some("poll") {
            builder = builder.idle_policy(mailring::IdlePolicy::Poll);
        } else if let Some(us) = spin.and_then(|v| v.parse::<u64>().ok()) {
            builder = builder.idle_policy(if us == 0 {
                mailring::IdlePolicy::Block
            } else {
                mailring::IdlePolicy::Spin(Duration::from_micros(us))
            });
        }
        if c == Contender::MailringHandOffDirect {
            builder = builder.direct_descriptors(4096);
        }
        let rt = builder.build().unwrap();
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        match w {
            Workload::Echo64 | Workload::Stream4k => {
                let mut config = mailring_transports::ServerConfig::default();
                // MAILRING_READ_CHUNK: bytes asked of each receive.
                if let Some(n) = std::env::var("MAILRING_READ_CHUNK")
                    .ok()
                    .and_then(|v| v.parse().ok())
                {
                    config.read_chunk = n;
                }
                // MAILRING_BALANCE=1: fresh connections to the least loaded
                // shard (ServerConfig::balance_plain_connections).
                config.balance_plain_connections =
                    std::env::var("MAILRING_BALANCE").is_ok_and(|v| v == "1");
                let server = Server::builder(LengthDelimited::new(), |_| mailring_side::Echo)
                    .config(config)
                    .bind(rt.handle(), any)
                    .unwrap();
                let addr = server.local_addr();
                ServerHandle {
                    addr,
                    kind: ServerKind::Mailring {
                        rt,
                        system: None,
                        stop: Box::new(move |rt| {
                            rt.block_on(server.shutdown());
                        }),
                    },
                }
            }
            Workload::Tenants(_) | Workload::Connect => {
                let mut config = mailring_transports::ServerConfig::default();
                match c {
                    Contender::MailringHandOff => {
                        config.listen = mailring_transports::ListenMode::SingleAcceptor(
                            mailring::ShardId::new(0),
                        );
                    }
                    Contender::MailringHandOffDirect => {
                        config.listen = mailring_transports::ListenMode::SingleAcceptor(
                            mailring::ShardId::new(0),
                        );
                        config.hand_off = mailring_transports::HandOff::Direct;
                    }
                    Contender::MailringUnsteered => config.source_port_steering = false,
                    _ => {}
                }
                let system = mailring_actors::ActorSystem::start_on(
                    rt.handle(),
                    mailring_actors::SystemConfig::default(),
                )
                .unwrap();
                let sys = system.handle();
                // Connect: tenants placed by their names' hash, which the
                // steered clients compute (and the hand-offs counted).
                let sticky = w == Workload::Connect;
                let builder = Server::builder(LengthDelimited::new(), move |_| {
                    mailring_side::TenantSession {
                        system: sys.clone(),
                        sticky,
                        tenant: None,
                    }
                })
                .config(config);
                let builder = if sticky {
                    builder.follow::<mailring_side::StickyTenant>(system.handle())
                } else {
                    builder.follow::<mailring_side::Tenant>(system.handle())
                };
                let server = builder.bind(rt.handle(), any).unwrap();
                let addr = server.local_addr();
                let stop: StopFn = Box::new(move |rt| {
                    if sticky {
                        let handed: u64 = server.stats().shards.iter().map(|s| s.handed_off).sum();
                        eprintln!("# {}: {handed} connections handed off", c.name());
                    }
                    rt.block_on(server.shutdown());
                });
                ServerHandle {
                    addr,
                    kind: ServerKind::Mailring {
                        rt,
                        system: Some(system),
                        stop,
                    },
                }
            }
        }
    }
}

// --------------------------------------------------------------- Tokio

mod tokio_side {
    use std::collections::HashMap;
    use std::sync::Arc;

    use bytes::Bytes;
    use futures::stream::FuturesOrdered;
    use futures::{SinkExt, StreamExt};
    use kameo::actor::{ActorRef, Spawn};
    use kameo::message::{Context, Message};
    use tokio::net::TcpStream;
    use tokio::sync::{mpsc, oneshot};
    use tokio_util::codec::{Framed, LengthDelimitedCodec};

    /// The echo server's connection: frames out as they come in, flushed
    /// when nothing more is buffered.
    pub(crate) async fn echo(stream: TcpStream) {
        let _ = stream.set_nodelay(true);
        mailring_bench::codec_echo(stream).await;
    }

    #[derive(kameo::Actor, Default)]
    pub(crate) struct KTenant {
        count: u64,
    }

    pub(crate) struct Inc;

    impl Message<Inc> for KTenant {
        type Reply = u64;

        async fn handle(&mut self, _m: Inc, _cx: &mut Context<Self, Self::Reply>) -> u64 {
            self.count += 1;
            self.count
        }
    }

    /// Where a tenant's requests go.
    #[derive(Clone)]
    pub(crate) enum Tenants {
        Kameo(Arc<HashMap<Bytes, ActorRef<KTenant>>>),
        Tasks(Arc<HashMap<Bytes, mpsc::UnboundedSender<oneshot::Sender<u64>>>>),
    }

    impl Tenants {
        pub(crate) fn kameo(n: usize) -> Tenants {
            Tenants::Kameo(Arc::new(
                (0..n)
                    .map(|i| {
                        let key = Bytes::from(format!("tenant-{i}"));
                        let actor = KTenant::spawn_with_mailbox(
                            KTenant::default(),
                            kameo::mailbox::unbounded(),
                        );
                        (key, actor)
                    })
                    .collect(),
            ))
        }

        pub(crate) fn tasks(n: usize) -> Tenants {
            Tenants::Tasks(Arc::new(
                (0..n)
                    .map(|i| {
                        let key = Bytes::from(format!("tenant-{i}"));
                        let (tx, mut rx) = mpsc::unbounded_channel::<oneshot::Sender<u64>>();
                        tokio::spawn(async move {
                            let mut count = 0u64;
                            while let Some(reply) = rx.recv().await {
                                count += 1;
                                let _ = reply.send(count);
                            }
                        });
                        (key, tx)
                    })
                    .collect(),
            ))
        }

        async fn inc(&self, key: &Bytes) -> u64 {
            match self {
                Tenants::Kameo(map) => match map.get(key) {
                    Some(a) => a.ask(Inc).send().await.unwrap_or(0),
                    None => 0,
                },
                Tenants::Tasks(map) => {
                    let (tx, rx) = oneshot::channel();
                    match map.get(key) {
                        Some(t) if t.send(tx).is_ok() => rx.await.unwrap_or(0),
                        _ => 0,
                    }
                }
            }
        }
    }

    /// A tenant connection: `KEY <tenant>`, then requests answered in order
    /// with up to `window` outstanding.
    pub(crate) async fn tenant_conn(stream: TcpStream, tenants: Tenants, window: usize) {
        let _ = stream.set_nodelay(true);
        let mut framed = Framed::new(stream, LengthDelimitedCodec::new());
        let key = match framed.next().await {
            Some(Ok(f)) => f.freeze().slice(4..),
            _ => return,
        };
        if framed.send(Bytes::from_static(b"OK")).await.is_err() {
            return;
        }
        let mut pending = FuturesOrdered::new();
        let mut open = true;
        loop {
            tokio::select! {
                frame = framed.next(), if open && pending.len() < window => match frame {
                    Some(Ok(_)) => {
                        let (t, k) = (tenants.clone(), key.clone());
                        pending.push_back(async move { t.inc(&k).await });
                    }
                    _ => open = false,
                },
                Some(n) = pending.next(), if !pending.is_empty() => {
                    let reply = Bytes::copy_from_slice(&n.to_le_bytes());
                    if framed.feed(reply).await.is_err() {
                        return;
                    }
                    if (pending.is_empty() || framed.read_buffer().is_empty())
                        && SinkExt::<Bytes>::flush(&mut framed).await.is_err()
                    {
                        return;
                    }
                }
                else => return,
            }
        }
    }
}

impl ServerHandle {
    fn tokio(c: Contender, w: Workload) -> ServerHandle {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let tenants = rt.block_on(async {
            match (c, w) {
                (Contender::TokioKameo, _) => Some(tokio_side::Tenants::kameo(TENANTS)),
                (_, Workload::Tenants(_)) => Some(tokio_side::Tenants::tasks(TENANTS)),
                _ => None,
            }
        });
        let window = w.shape().2;
        rt.spawn(async move {
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        match &tenants {
                            Some(t) => {
                                tokio::spawn(tokio_side::tenant_conn(stream, t.clone(), window));
                            }
                            None => {
                                tokio::spawn(tokio_side::echo(stream));
                            }
                        }
                    }
                    _ = stopped.changed() => return,
                }
            }
        });
        ServerHandle {
            addr,
            kind: ServerKind::Tokio { rt, stop },
        }
    }
}

// ------------------------------------------------------- load generator

/// Runs `w` against `addr` on a current-thread Tokio runtime and prints
/// `wall_ns p50_ns p99_ns requests`.
fn client(w: Workload, addr: SocketAddr, steer: bool) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (conns, per_conn, _) = w.shape();
    let body: Bytes = match w {
        Workload::Echo64 => Bytes::from(vec![7u8; 64]),
        Workload::Stream4k => Bytes::from(vec![7u8; 4096]),
        Workload::Tenants(_) | Workload::Connect => Bytes::from_static(b"INC"),
    };
    // SESSIONS_CLIENT=uring: the load generator on one io_uring shard
    // (mailring's own `Framed`), whose submissions batch the system calls
    // of a whole tick: less client CPU per request, so more of the 2 cores
    // left to the server under test.
    let uring = std::env::var("SESSIONS_CLIENT").as_deref() == Ok("uring");
    let local = tokio::task::LocalSet::new();
    let (wall, mut lat) = if uring && w != Workload::Connect {
        uring_client(w, addr, &body)
    } else if w == Workload::Connect {
        local.block_on(&rt, connect_storm(addr, conns, steer))
    } else {
        // SESSIONS_CLIENT_THREADS=N: the connections split over N threads,
        // each a current-thread runtime, started together (on a machine
        // with cores to spare, so that one client thread does not bound
        // the server under test).
        let threads = std::env::var("SESSIONS_CLIENT_THREADS")
            .ok()
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or(1)
            .clamp(1, conns);
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(threads));
        let parts: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = barrier.clone();
                let body = body.clone();
                let ids: Vec<usize> = (t..conns).step_by(threads).collect();
                std::thread::spawn(move || tokio_client_part(w, addr, ids, body, &barrier))
            })
            .collect();
        let mut first_start: Option<Instant> = None;
        let mut last_end: Option<Instant> = None;
        let mut lat = Vec::with_capacity(conns * per_conn);
        for p in parts {
            let (start, end, part) = p.join().expect("load generator thread");
            first_start = Some(first_start.map_or(start, |s| s.min(start)));
            last_end = Some(last_end.map_or(end, |e| e.max(end)));
            lat.extend(part);
        }
        (last_end.unwrap() - first_start.unwrap(), lat)
    };
    lat.sort_unstable();
    let q = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize].as_nanos();
    println!("{} {} {} {}", wall.as_nanos(), q(0.5), q(0.99), lat.len());
}

/// One load-generator thread: connects `ids` (their tenants by index),
/// waits for the other threads, runs them; returns its start, its end and
/// its latencies.
fn tokio_client_part(
    w: Workload,
    addr: SocketAddr,
    ids: Vec<usize>,
    body: Bytes,
    barrier: &std::sync::Barrier,
) -> (Instant, Instant, Vec<Duration>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (_, per_conn, window) = w.shape();
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let mut streams = Vec::with_capacity(ids.len());
        for &i in &ids {
            let s = tokio::net::TcpStream::connect(addr).await.expect("connect");
            s.set_nodelay(true).unwrap();
            let mut s = Conn::new(s);
            if let Workload::Tenants(_) = w {
                s.request(format!("KEY tenant-{}", i % TENANTS).as_bytes())
                    .await
                    .unwrap();
            }
            streams.push(s);
        }
        barrier.wait();
        let start = Instant::now();
        let tasks: Vec<_> = streams
            .into_iter()
            .map(|mut s| {
                let body = body.clone();
                tokio::task::spawn_local(async move { s.run(&body, per_conn, window).await })
            })
            .collect();
        let mut lat = Vec::with_capacity(ids.len() * per_conn);
        for t in tasks {
            lat.extend(t.await.unwrap().unwrap());
        }
        (start, Instant::now(), lat)
    })
}

/// The request workloads on a one-shard mailring runtime: `Framed` per
/// connection, the window fed and flushed as one send, replies timed.
fn uring_client(w: Workload, addr: SocketAddr, body: &Bytes) -> (Duration, Vec<Duration>) {
    use mailring_transports::codec::LengthDelimited;
    use mailring_transports::Framed;
    let (conns, per_conn, window) = w.shape();
    // It blocks when idle instead of spinning: the cores are the server's.
    let rt = mailring::Runtime::builder()
        .shards(1)
        .idle_policy(mailring::IdlePolicy::Block)
        .build()
        .unwrap();
    let body = body.clone();
    let result = rt.block_on_local(move || async move {
        let mut streams = Vec::with_capacity(conns);
        for i in 0..conns {
            let mut c = Framed::connect_tcp(addr, LengthDelimited::new())
                .await
                .expect("connect");
            if let Workload::Tenants(_) = w {
                c.send(Bytes::from(format!("KEY tenant-{}", i % TENANTS)))
                    .await
                    .unwrap();
                c.recv().await.unwrap().expect("KEY reply");
            }
            streams.push(c);
        }
        let start = Instant::now();
        let tasks: Vec<_> = streams
            .into_iter()
            .map(|mut c| {
                let body = body.clone();
                mailring::spawn_local(async move {
                    let mut sent_at = VecDeque::with_capacity(window);
                    let mut lat = Vec::with_capacity(per_conn);
                    let mut sent = 0;
                    while lat.len() < per_conn {
                        let room = (window - sent_at.len()).min(per_conn - sent);
                        if room > 0 {
                            for _ in 0..room {
                                c.feed(body.clone()).unwrap();
                            }
                            c.flush().await.unwrap();
                            let now = Instant::now();
                            sent_at.extend(std::iter::repeat_n(now, room));
                            sent += room;
                        }
                        c.recv().await.unwrap().expect("a reply");
                        lat.push(sent_at.pop_front().expect("outstanding").elapsed());
                    }
                    lat
                })
            })
            .collect();
        let mut lat = Vec::with_capacity(conns * per_conn);
        for t in tasks {
            lat.extend(t.await.unwrap());
        }
        (start.elapsed(), lat)
    });
    rt.shutdown();
    result
}

/// `n` connections, 4 at a time: connect (from a source port of the
/// tenant's shard when `steer`), `KEY`, one request, close; the latency of
/// each from connect to its request's reply.
async fn connect_storm(addr: SocketAddr, n: usize, steer: bool) -> (Duration, Vec<Duration>) {
    const AT_ONCE: usize = 4;
    let next_port = std::rc::Rc::new(std::cell::Cell::new(
        20_000 + (std::process::id() as u16 % 20_000),
    ));
    let start = Instant::now();
    let tasks: Vec<_> = (0..AT_ONCE)
        .map(|lane| {
            let next_port = next_port.clone();
            tokio::task::spawn_local(async move {
                let mut lat = Vec::new();
                for i in (lane..n).step_by(AT_ONCE) {
                    let tenant = format!("tenant-{}", i % TENANTS);
                    let t0 = Instant::now();
                    let stream = if steer {
                        // The server steers by a hash of the source port.
                        let shard = mailring::sticky_shard(&tenant, 2).index();
                        loop {
                            let mut p = next_port.get();
                            while mailring::net::steered_index(p, 2) != shard {
                                p = p.wrapping_add(1).max(20_000);
                            }
                            next_port.set(p.wrapping_add(1).max(20_000));
                            let socket = tokio::net::TcpSocket::new_v4().unwrap();
                            // Ports of earlier runs wait in TIME_WAIT here.
                            socket.set_reuseaddr(true).unwrap();
                            if socket.bind(SocketAddr::from(([127, 0, 0, 1], p))).is_err() {
                                continue;
                            }
                            break socket.connect(addr).await.expect("connect");
                        }
                    } else {
                        tokio::net::TcpStream::connect(addr).await.expect("connect")
                    };
                    stream.set_nodelay(true).unwrap();
                    let mut c = Conn::new(stream);
                    c.request(format!("KEY {tenant}").as_bytes()).await.unwrap();
                    c.request(b"INC").await.unwrap();
                    lat.push(t0.elapsed());
                }
                lat
            })
        })
        .collect();
    let mut lat = Vec::with_capacity(n);
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    (start.elapsed(), lat)
}

/// The load generator's side of a connection.
struct Conn {
    stream: tokio::net::TcpStream,
    rbuf: BytesMut,
}

impl Conn {
    fn new(stream: tokio::net::TcpStream) -> Conn {
        Conn {
            stream,
            rbuf: BytesMut::with_capacity(64 << 10),
        }
    }

    async fn send_frames(&mut self, body: &[u8], n: usize) -> io::Result<()> {
        use tokio::io::AsyncWriteExt;
        let mut out = Vec::with_capacity(n * (body.len() + 4));
        for _ in 0..n {
            out.extend_from_slice(&(body.len() as u32).to_be_bytes());
            out.extend_from_slice(body);
        }
        self.stream.write_all(&out).await
    }

    async fn read_frame(&mut self) -> io::Result<Bytes> {
        use tokio::io::AsyncReadExt;
        loop {
            if self.rbuf.len() >= 4 {
                let len = u32::from_be_bytes(self.rbuf[..4].try_into().unwrap()) as usize;
                if self.rbuf.len() >= 4 + len {
                    let mut f = self.rbuf.split_to(4 + len);
                    return Ok(f.split_off(4).freeze());
                }
            }
            if self.stream.read_buf(&mut self.rbuf).await? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
    }

    async fn request(&mut self, body: &[u8]) -> io::Result<Bytes> {
        self.send_frames(body, 1).await?;
        self.read_frame().await
    }

    /// `n` requests, up to `window` outstanding; the latency of each.
    async fn run(&mut self, body: &[u8], n: usize, window: usize) -> io::Result<Vec<Duration>> {
        let mut sent_at = VecDeque::with_capacity(window);
        let mut lat = Vec::with_capacity(n);
        let mut sent = 0;
        while lat.len() < n {
            let room = (window - sent_at.len()).min(n - sent);
            if room > 0 {
                self.send_frames(body, room).await?;
                let now = Instant::now();
                sent_at.extend(std::iter::repeat_n(now, room));
                sent += room;
            }
            self.read_frame().await?;
            let t0 = sent_at.pop_front().expect("a request outstanding");
            lat.push(t0.elapsed());
        }
        Ok(lat)
    }
}
