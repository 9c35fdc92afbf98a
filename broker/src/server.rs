//! The broker's moving parts: a RESP session per connection (attached to
//! the shard of the first stream it names), a keyed actor per stream, the
//! catalog of stream names every shard can read, and [`Broker`], which
//! starts them on a mailring runtime.

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use mailring_actors::{Actor, ActorSystem, Ctx, Handler, Message, SystemConfig, SystemHandle};
use mailring_transports::{CloseReason, Route, Server, ServerConfig, Session, SessionCtx};

use crate::command::{self, Kind};
use crate::glob::glob_match;
use crate::log::{Op, Record};
use crate::resp::{Protocol, Reply, Request, RespCodec};
use crate::store::{
    self, DurableFiles, RecoveredStream, ShardLog, StorageError, StoreConfig, Ticket,
};
use crate::stream::{entry_reply, Fields, Stream};

/// The version `HELLO` and `INFO` report: the Redis release whose replies
/// the broker's are checked against.
pub const REDIS_VERSION: &str = "7.0.15";

/// Longest stream name accepted (Redis allows 512 MB; a name is stored in
/// every log record of its stream).
pub const MAX_KEY_LEN: usize = 64 * 1024;

/// How the broker is set up.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// Where it listens (loopback in tests).
    pub addr: SocketAddr,
    /// Shards (threads, rings) of its runtime.
    pub shards: usize,
    /// `requirepass`: clients must `AUTH` first.
    pub requirepass: Option<Bytes>,
    /// The data directory and flush policy.
    pub store: StoreConfig,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 6379)),
            shards: 2,
            requirepass: None,
            store: StoreConfig::default(),
        }
    }
}

/// The names of the streams that exist, readable from every shard
/// (`KEYS`, `SCAN`, `EXISTS`, `TYPE` answer from it without waking a
/// stream's actor).
#[derive(Debug, Default)]
pub struct Catalog {
    names: Mutex<BTreeSet<Bytes>>,
}

impl Catalog {
    fn insert(&self, name: &Bytes) {
        self.names
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.clone());
    }

    fn remove(&self, name: &[u8]) {
        self.names
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name);
    }

    /// Whether stream `name` exists.
    pub fn contains(&self, name: &[u8]) -> bool {
        self.names
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(name)
    }

    /// Names matching `pattern`, in byte order.
    pub fn matching(&self, pattern: &[u8]) -> Vec<Bytes> {
        self.names
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|n| glob_match(pattern, n, false))
            .cloned()
            .collect()
    }
}

/// What every session and stream actor of one broker shares.
#[derive(Debug)]
pub struct Shared {
    /// This broker among those of the process (finds its shard logs).
    id: u64,
    config: BrokerConfig,
    catalog: Catalog,
    next_client_id: AtomicU64,
    system: SystemHandle,
    /// Streams read back at start, each taken by its actor's first command.
    recovered: Mutex<HashMap<Bytes, RecoveredStream>>,
}

/// Brokers started by this process (their ids).
static NEXT_BROKER: AtomicU64 = AtomicU64::new(1);

/// One stream: a keyed actor owning its entries (key = the stream's name).
#[derive(Debug, Actor)]
#[actor(key = Bytes, activate = StreamActor::new, handles(Exec))]
pub struct StreamActor {
    name: Bytes,
    stream: Option<Stream>,
    /// Whether the recovered state was taken (at the first command).
    loaded: bool,
    /// The number of this stream's last logged operation.
    op_no: u64,
    /// This shard's log.
    log: Option<Rc<ShardLog>>,
}

impl StreamActor {
    fn new(name: &Bytes) -> Self {
        StreamActor {
            name: name.clone(),
            stream: None,
            loaded: false,
            op_no: 0,
            log: None,
        }
    }
}

/// A stream command's answer: the reply, and the flush it waits for.
#[derive(Debug)]
pub struct Answer {
    /// The reply.
    pub reply: Reply,
    /// Completes when what the command changed is flushed (per the
    /// `appendfsync` policy); the reply is written after it.
    pub durable: Option<Ticket>,
}

impl From<Reply> for Answer {
    fn from(reply: Reply) -> Self {
        Answer {
            reply,
            durable: None,
        }
    }
}

/// The reply to a command whose change could not be logged.
fn storage_error(e: &StorageError) -> Reply {
    Reply::Error(format!("MISCONF {e}"))
}

/// A stream command, run in the stream's actor.
#[derive(Debug, Message)]
#[message(reply = Answer)]
pub struct Exec {
    /// The command and its arguments (argument 1 is this stream).
    pub args: Vec<Bytes>,
    /// The broker the command came through.
    pub shared: Arc<Shared>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Handler<Exec> for StreamActor {
    async fn handle(&mut self, m: Exec, _cx: &mut Ctx<Self>) -> Answer {
        if !self.loaded {
            self.loaded = true;
            let recovered = m
                .shared
                .recovered
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&self.name);
            if let Some(r) = recovered {
                self.stream = r.stream;
                self.op_no = r.op_no;
            }
            self.log = store::shard_log(m.shared.id);
        }
        self.exec(&m.args, &m.shared)
    }
}

impl StreamActor {
    /// Logs `op` as this stream's next operation.
    fn log(&mut self, op: Op) -> Result<Ticket, StorageError> {
        let log = self.log.as_ref().ok_or(StorageError::Closed)?;
        let ticket = log.append(&Record {
            stream: self.name.clone(),
            op_no: self.op_no + 1,
            op,
        })?;
        self.op_no += 1;
        Ok(ticket)
    }

    fn exec(&mut self, args: &[Bytes], shared: &Shared) -> Answer {
        let name = args[0].to_ascii_lowercase();
        match name.as_slice() {
            b"xadd" => {
                let p = match command::parse_add_or_trim(args, true) {
                    Ok(p) => p,
                    Err(e) => return e.into(),
                };
                if self.stream.is_none() && p.no_mkstream {
                    return Reply::Nil.into();
                }
                let fresh = Stream::new();
                let stream = self.stream.as_ref().unwrap_or(&fresh);
                let id = match stream.next_id(p.id, now_ms()) {
                    Ok(id) => id,
                    Err(e) => return e.into(),
                };
                let fields: Vec<Bytes> = args[p.fields_at..].to_vec();
                let mut ticket = match self.log(Op::Add {
                    id,
                    fields: fields.clone(),
                }) {
                    Ok(t) => t,
                    Err(e) => return storage_error(&e).into(),
                };
                if self.stream.is_none() {
                    self.stream = Some(Stream::new());
                    shared.catalog.insert(&self.name);
                }
                let stream = self.stream.as_mut().expect("made above");
                stream.insert(id, Fields::from(fields));
                if let Some(trim) = p.trim {
                    let n = stream.trim_plan(&trim);
                    if n > 0 {
                        let through = stream.remove_oldest(n).expect("n > 0 entries");
                        match self.log(Op::TrimThrough { through }) {
                            Ok(t) => ticket = t,
                            Err(e) => return storage_error(&e).into(),
                        }
                    }
                }
                Answer {
                    reply: id.reply(),
                    durable: Some(ticket),
                }
            }
            b"xlen" => Reply::Int(self.stream.as_ref().map_or(0, |s| s.len() as i64)).into(),
            b"xrange" | b"xrevrange" => {
                let rev = name == b"xrevrange";
                let (lo, hi, count) = match command::parse_range_args(args, rev) {
                    Ok(r) => r,
                    Err(e) => return e.into(),
                };
                let Some(stream) = &self.stream else {
                    return Reply::Array(Vec::new()).into();
                };
                if count == Some(0) {
                    return Reply::Array(Vec::new()).into();
                }
                Reply::Array(
                    stream
                        .range(lo, hi, count, rev)
                        .iter()
                        .map(|(id, f)| entry_reply(*id, f))
                        .collect(),
                )
                .into()
            }
            b"xdel" => {
                let mut ids = match command::parse_ids(&args[2..]) {
                    Ok(ids) => ids,
                    Err(e) => return e.into(),
                };
                let Some(stream) = &self.stream else {
                    return Reply::Int(0).into();
                };
                ids.sort_unstable();
                ids.dedup();
                ids.retain(|id| stream.get(*id).is_some());
                if ids.is_empty() {
                    return Reply::Int(0).into();
                }
                let ticket = match self.log(Op::Delete { ids: ids.clone() }) {
                    Ok(t) => t,
                    Err(e) => return storage_error(&e).into(),
                };
                let n = self.stream.as_mut().expect("checked").delete(&ids);
                Answer {
                    reply: Reply::Int(n as i64),
                    durable: Some(ticket),
                }
            }
            b"xtrim" => {
                let p = match command::parse_add_or_trim(args, false) {
                    Ok(p) => p,
                    Err(e) => return e.into(),
                };
                let (Some(stream), Some(trim)) = (self.stream.as_mut(), p.trim) else {
                    return Reply::Int(0).into();
                };
                let n = stream.trim_plan(&trim);
                if n == 0 {
                    return Reply::Int(0).into();
                }
                let through = stream.remove_oldest(n).expect("n > 0 entries");
                match self.log(Op::TrimThrough { through }) {
                    Ok(t) => Answer {
                        reply: Reply::Int(n as i64),
                        durable: Some(t),
                    },
                    Err(e) => storage_error(&e).into(),
                }
            }
            b"del" => {
                if self.stream.is_none() {
                    return Reply::Int(0).into();
                }
                let ticket = match self.log(Op::Drop) {
                    Ok(t) => t,
                    Err(e) => return storage_error(&e).into(),
                };
                self.stream = None;
                shared.catalog.remove(&self.name);
                Answer {
                    reply: Reply::Int(1),
                    durable: Some(ticket),
                }
            }
            _ => command::unknown_command(args).into(),
        }
    }
}

/// One client connection's state.
#[derive(Debug)]
pub struct RespSession {
    shared: Arc<Shared>,
    proto: Protocol,
    authenticated: bool,
    id: u64,
    name: Option<Bytes>,
}

impl RespSession {
    fn new(shared: Arc<Shared>) -> Self {
        let id = shared.next_client_id.fetch_add(1, Ordering::Relaxed) + 1;
        RespSession {
            authenticated: shared.config.requirepass.is_none(),
            shared,
            proto: Protocol::Resp2,
            id,
            name: None,
        }
    }

    fn reply(&self, r: Reply, cx: &mut SessionCtx<Self>) {
        cx.send_frame(r.to_bytes(self.proto));
    }

    /// Sends `args` to the actor of the stream `args[1]`; the reply is
    /// written in order when it comes.
    fn to_stream(&self, args: Vec<Bytes>, cx: &mut SessionCtx<Self>) {
        let addr = self.shared.system.keyed::<StreamActor>(args[1].clone());
        let proto = self.proto;
        let ask = addr.ask(Exec {
            args,
            shared: self.shared.clone(),
        });
        cx.reply_later(async move { settle(ask.await).await.to_bytes(proto) });
    }

    fn check_password(&self, user: Option<&[u8]>, pass: &[u8]) -> Result<(), Reply> {
        let Some(want) = &self.shared.config.requirepass else {
            return Err(Reply::err(
                "AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
            ));
        };
        if user.is_some_and(|u| u != b"default") || pass != want.as_ref() {
            return Err(Reply::Error(
                "WRONGPASS invalid username-password pair or user is disabled.".to_owned(),
            ));
        }
        Ok(())
    }

    fn hello(&mut self, args: &[Bytes]) -> Reply {
        let mut proto = self.proto;
        let mut i = 1;
        if let Some(v) = args.get(1) {
            match crate::resp::parse_int(v) {
                Some(2) => proto = Protocol::Resp2,
                Some(3) => proto = Protocol::Resp3,
                Some(_) => {
                    return Reply::Error("NOPROTO unsupported protocol version".to_owned());
                }
                None => {
                    return Reply::err("Protocol version is not an integer or out of range");
                }
            }
            i = 2;
        }
        let mut name = None;
        while i < args.len() {
            let more = args.len() - i - 1;
            if args[i].eq_ignore_ascii_case(b"auth") && more >= 2 {
                if let Err(e) = self.check_password(Some(&args[i + 1]), &args[i + 2]) {
                    return e;
                }
                self.authenticated = true;
                i += 3;
            } else if args[i].eq_ignore_ascii_case(b"setname") && more >= 1 {
                name = Some(args[i + 1].clone());
                i += 2;
            } else {
                return Reply::err(format!(
                    "Syntax error in HELLO option '{}'",
                    command::printable(&args[i], 128)
                ));
            }
        }
        if !self.authenticated {
            return noauth_hello();
        }
        if let Some(n) = name {
            if let Err(e) = check_client_name(&n) {
                return e;
            }
            self.name = (!n.is_empty()).then_some(n);
        }
        self.proto = proto;
        let p = |s: &'static str| Reply::bulk(s);
        Reply::Map(vec![
            (p("server"), p("redis")),
            (p("version"), p(REDIS_VERSION)),
            (
                p("proto"),
                Reply::Int(if proto == Protocol::Resp3 { 3 } else { 2 }),
            ),
            (p("id"), Reply::Int(self.id as i64)),
            (p("mode"), p("standalone")),
            (p("role"), p("master")),
            (p("modules"), Reply::Array(Vec::new())),
        ])
    }

    fn client(&mut self, args: &[Bytes]) -> Reply {
        let sub = args[1].to_ascii_lowercase();
        match (sub.as_slice(), args.len()) {
            (b"id", 2) => Reply::Int(self.id as i64),
            (b"getname", 2) => self.name.clone().map_or(Reply::Nil, Reply::Bulk),
            (b"setname", 3) => match check_client_name(&args[2]) {
                Ok(()) => {
                    self.name = (!args[2].is_empty()).then(|| args[2].clone());
                    Reply::OK
                }
                Err(e) => e,
            },
            (b"setinfo", 4) => {
                let attr = args[2].to_ascii_lowercase();
                if attr != b"lib-name" && attr != b"lib-ver" {
                    return Reply::err(format!(
                        "Unrecognized option '{}'",
                        command::printable(&args[2], 128)
                    ));
                }
                Reply::OK
            }
            (b"id" | b"getname" | b"setname" | b"setinfo", _) => {
                command::wrong_arity(&format!("client|{}", String::from_utf8_lossy(&sub)))
            }
            _ => Reply::err(format!(
                "unknown subcommand '{}'. Try CLIENT HELP.",
                command::printable(&args[1], 128)
            )),
        }
    }

    fn config(&self, args: &[Bytes]) -> Reply {
        let sub = args[1].to_ascii_lowercase();
        if sub != b"get" {
            return Reply::err(format!(
                "unknown subcommand '{}'. Try CONFIG HELP.",
                command::printable(&args[1], 128)
            ));
        }
        if args.len() < 3 {
            return command::wrong_arity("config|get");
        }
        let port = self.shared.config.addr.port().to_string();
        let params: [(&str, String); 6] = [
            ("appendonly", "yes".to_owned()),
            ("appendfsync", "always".to_owned()),
            ("databases", "1".to_owned()),
            ("port", port),
            ("save", String::new()),
            ("stream-node-max-entries", "100".to_owned()),
        ];
        let mut pairs = Vec::new();
        for (name, value) in &params {
            if args[2..]
                .iter()
                .any(|p| glob_match(p, name.as_bytes(), true))
            {
                pairs.push((Reply::bulk(*name), Reply::bulk(value.clone())));
            }
        }
        Reply::Map(pairs)
    }

    /// Runs a command that is not a stream's.
    fn connection_command(&mut self, args: Vec<Bytes>, cx: &mut SessionCtx<Self>) {
        let name = args[0].to_ascii_lowercase();
        let reply = match name.as_slice() {
            b"ping" => match args.len() {
                1 => Reply::Status("PONG"),
                2 => Reply::Bulk(args[1].clone()),
                _ => command::wrong_arity("ping"),
            },
            b"echo" => Reply::Bulk(args[1].clone()),
            b"hello" => self.hello(&args),
            b"auth" => {
                let res = match args.len() {
                    2 => self.check_password(None, &args[1]),
                    3 => self.check_password(Some(&args[1]), &args[2]),
                    _ => Err(command::syntax_error()),
                };
                match res {
                    Ok(()) => {
                        self.authenticated = true;
                        Reply::OK
                    }
                    Err(e) => e,
                }
            }
            b"client" => self.client(&args),
            b"select" => match crate::resp::parse_int(&args[1]) {
                Some(0) => Reply::OK,
                Some(_) => Reply::err("DB index is out of range"),
                None => command::not_an_integer(),
            },
            b"quit" => {
                self.reply(Reply::OK, cx);
                cx.close();
                return;
            }
            b"config" => self.config(&args),
            b"exists" => Reply::Int(
                args[1..]
                    .iter()
                    .filter(|k| self.shared.catalog.contains(k))
                    .count() as i64,
            ),
            b"type" => Reply::Status(if self.shared.catalog.contains(&args[1]) {
                "stream"
            } else {
                "none"
            }),
            b"keys" => Reply::Array(
                self.shared
                    .catalog
                    .matching(&args[1])
                    .into_iter()
                    .map(Reply::Bulk)
                    .collect(),
            ),
            b"del" => {
                // Each existing stream's actor drops it; the replies are
                // summed in order with the rest.
                let asks: Vec<_> = args[1..]
                    .iter()
                    .filter(|k| self.shared.catalog.contains(k))
                    .map(|k| {
                        self.shared
                            .system
                            .keyed::<StreamActor>(k.clone())
                            .ask(Exec {
                                args: vec![Bytes::from_static(b"del"), k.clone()],
                                shared: self.shared.clone(),
                            })
                    })
                    .collect();
                let proto = self.proto;
                cx.reply_later(async move {
                    let mut n = 0;
                    for a in asks {
                        match settle(a.await).await {
                            Reply::Int(d) => n += d,
                            e @ Reply::Error(_) => return e.to_bytes(proto),
                            _ => {}
                        }
                    }
                    Reply::Int(n).to_bytes(proto)
                });
                return;
            }
            _ => command::unknown_command(&args),
        };
        self.reply(reply, cx);
    }
}

/// The reply to send for a stream command's answer, once what it changed
/// is flushed.
async fn settle(answer: Result<Answer, mailring_actors::AskError>) -> Reply {
    match answer {
        Ok(Answer {
            reply,
            durable: Some(t),
        }) => match t.await {
            Ok(()) => reply,
            Err(e) => storage_error(&e),
        },
        Ok(Answer {
            reply,
            durable: None,
        }) => reply,
        Err(e) => Reply::err(format!("stream unavailable: {e}")),
    }
}

/// Completes when either future does.
async fn futures_lite_select<A, B>(mut a: std::pin::Pin<&mut A>, mut b: std::pin::Pin<&mut B>)
where
    A: std::future::Future<Output = ()>,
    B: std::future::Future<Output = ()>,
{
    std::future::poll_fn(|cx| {
        if a.as_mut().poll(cx).is_ready() || b.as_mut().poll(cx).is_ready() {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
}

fn noauth_hello() -> Reply {
    Reply::Error(
        "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time".to_owned(),
    )
}

fn check_client_name(name: &[u8]) -> Result<(), Reply> {
    if name.iter().any(|&b| !(b'!'..=b'~').contains(&b)) {
        return Err(Reply::err(
            "Client names cannot contain spaces, newlines or special characters.",
        ));
    }
    Ok(())
}

/// The stream a command names first, if it is a stream command.
fn first_stream(args: &[Bytes]) -> Option<&Bytes> {
    let spec = command::lookup(&args[0])?;
    (spec.kind == Kind::Stream && command::arity_ok(spec, args.len())).then(|| &args[1])
}

impl Session for RespSession {
    type Codec = RespCodec;
    type Key = Bytes;

    fn route(&mut self, req: &Request, cx: &SessionCtx<Self>) -> Route<Bytes> {
        if cx.key().is_some() || !self.authenticated {
            return Route::NotYet;
        }
        match req {
            Request::Command(args) => match first_stream(args) {
                Some(key) if key.len() <= MAX_KEY_LEN => Route::Key(key.clone()),
                _ => Route::NotYet,
            },
            Request::Broken(_) => Route::NotYet,
        }
    }

    async fn on_frame(&mut self, req: Request, cx: &mut SessionCtx<Self>) {
        let args = match req {
            Request::Command(args) => args,
            Request::Broken(e) => {
                self.reply(Reply::err(format!("Protocol error: {e}")), cx);
                cx.close();
                return;
            }
        };
        let Some(spec) = command::lookup(&args[0]) else {
            self.reply(command::unknown_command(&args), cx);
            return;
        };
        if !command::arity_ok(spec, args.len()) {
            self.reply(command::wrong_arity(spec.name), cx);
            return;
        }
        if !self.authenticated && !matches!(spec.name, "auth" | "hello" | "quit") {
            self.reply(
                Reply::Error("NOAUTH Authentication required.".to_owned()),
                cx,
            );
            return;
        }
        match spec.kind {
            Kind::Stream if args[1].len() > MAX_KEY_LEN => self.reply(
                Reply::err(format!(
                    "stream name longer than the limit of {MAX_KEY_LEN} bytes"
                )),
                cx,
            ),
            Kind::Stream => self.to_stream(args, cx),
            Kind::Connection => self.connection_command(args, cx),
        }
    }

    fn on_close(&mut self, _reason: &CloseReason, _cx: &mut SessionCtx<Self>) {}
}

/// A running broker: its runtime, actor system and listening server.
pub struct Broker {
    runtime: Option<mailring::Runtime>,
    system: Option<ActorSystem>,
    server: Option<Server<RespSession>>,
    addr: SocketAddr,
    id: u64,
    /// Each shard's log flusher.
    flushers: Vec<mailring::JoinHandle<io::Result<()>>>,
    durable: DurableFiles,
    recovery: RecoveryReport,
}

/// What the broker found in its data directory at start.
#[derive(Debug, Clone, Default)]
pub struct RecoveryReport {
    /// Streams found (existing ones).
    pub streams: usize,
    /// Records replayed.
    pub records: u64,
    /// Bytes of valid records read.
    pub bytes: u64,
    /// Segments whose torn or corrupt tails were cut, with the bytes cut.
    pub cut: Vec<(std::path::PathBuf, u64)>,
    /// How long recovery took.
    pub elapsed: std::time::Duration,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker").field("addr", &self.addr).finish()
    }
}

impl Broker {
    /// Starts a broker: a runtime of `config.shards` shards, its actor
    /// system, and the server listening on `config.addr`.
    ///
    /// # Errors
    ///
    /// The runtime's start-up error (no io_uring) or the bind's.
    pub fn start(config: BrokerConfig) -> io::Result<Broker> {
        let recovered = store::recover(&config.store.dir)?;
        let recovery = RecoveryReport {
            streams: recovered
                .streams
                .values()
                .filter(|s| s.stream.is_some())
                .count(),
            records: recovered.records,
            bytes: recovered.bytes,
            cut: recovered.cut.clone(),
            elapsed: recovered.elapsed,
        };
        let shards = config.shards.clamp(1, usize::from(u16::MAX));
        let runtime = mailring::Runtime::builder()
            .shards(shards)
            .build()
            .map_err(|e| io::Error::other(format!("starting the runtime: {e}")))?;
        let system = ActorSystem::start_on(runtime.handle(), SystemConfig::default())
            .map_err(|e| io::Error::other(format!("starting the actor system: {e}")))?;
        let id = NEXT_BROKER.fetch_add(1, Ordering::Relaxed);
        let catalog = Catalog::default();
        for (name, s) in &recovered.streams {
            if s.stream.is_some() {
                catalog.insert(name);
            }
        }
        let durable = DurableFiles::default();
        let mut flushers = Vec::with_capacity(shards);
        for shard in 0..shards {
            let log_no = shard as u16;
            let last = recovered.last_segment.get(&log_no).copied();
            let store_config = config.store.clone();
            let durable = durable.clone();
            flushers.push(runtime.handle().spawn_local_on(
                mailring::ShardId::new(shard),
                move || async move {
                    let log = ShardLog::new(&store_config.dir, log_no, &store_config, durable);
                    store::register(id, log.clone());
                    let res = log.clone().run(last).await;
                    store::unregister(id);
                    res
                },
            ));
        }
        let shared = Arc::new(Shared {
            id,
            config: config.clone(),
            catalog,
            next_client_id: AtomicU64::new(0),
            system: system.handle(),
            recovered: Mutex::new(recovered.streams),
        });
        let server = Server::builder(RespCodec::new(), move |_| RespSession::new(shared.clone()))
            .config(ServerConfig::default())
            .follow::<StreamActor>(system.handle())
            .bind(runtime.handle(), config.addr)?;
        let addr = server.local_addr();
        Ok(Broker {
            runtime: Some(runtime),
            system: Some(system),
            server: Some(server),
            addr,
            id,
            flushers,
            durable,
            recovery,
        })
    }

    /// What recovery found at start.
    pub fn recovery(&self) -> &RecoveryReport {
        &self.recovery
    }

    /// Each segment file written by this broker with the length a power
    /// loss now would leave of it (covered by a completed flush): crash
    /// tests cut the files to these lengths before restarting.
    pub fn durable_files(&self) -> HashMap<std::path::PathBuf, u64> {
        self.durable.snapshot()
    }

    /// The address it listens on (the port chosen for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Blocks until Ctrl-C (SIGINT) or SIGTERM.
    ///
    /// # Errors
    ///
    /// The error of installing the signal handlers.
    pub fn wait_for_signal(&self) -> io::Result<()> {
        use mailring::signal::{signal, SignalKind};
        let rt = self.runtime.as_ref().expect("running until shutdown");
        let mut int = signal(SignalKind::interrupt())?;
        let mut term = signal(SignalKind::terminate())?;
        rt.block_on(async move {
            let a = std::pin::pin!(int.recv());
            let b = std::pin::pin!(term.recv());
            futures_lite_select(a, b).await;
        });
        Ok(())
    }

    /// Stops accepting, lets connections finish within the grace period,
    /// and stops the actors and the runtime.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let (Some(server), Some(rt)) = (self.server.take(), self.runtime.as_ref()) {
            rt.block_on(server.shutdown());
        }
        if let Some(system) = self.system.take() {
            let _ = system.shutdown();
        }
        // The logs flush what the actors appended, then their flushers end.
        if let Some(rt) = self.runtime.as_ref() {
            let id = self.id;
            for shard in 0..rt.handle().shards() {
                let closer =
                    rt.handle()
                        .spawn_local_on(mailring::ShardId::new(shard), move || async move {
                            if let Some(log) = store::shard_log(id) {
                                log.close();
                            }
                        });
                let _ = rt.block_on(closer);
            }
            for f in self.flushers.drain(..) {
                if let Ok(Err(e)) = rt.block_on(f) {
                    eprintln!("broker: flushing the log at shutdown: {e}");
                }
            }
        }
        if let Some(rt) = self.runtime.take() {
            let _ = rt.shutdown();
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.stop();
    }
}
