//! The RESP session: one per client connection, attached to the shard of
//! the first stream it names; runs the connection commands itself and
//! sends the stream commands to the streams' actors, writing replies in
//! request order once what they changed is flushed.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use mailring_actors::{AskError, RunNowError};
use mailring_transports::{CloseReason, Route, Session, SessionCtx};

use crate::actor::{
    storage_error, Answer, BlockedRead, Exec, GroupAnswer, GroupFrom, GroupRead, Notify, Read,
    ReadFrom, ReadGroup, Served, StreamActor, Watch,
};
use crate::command::{self, Kind};
use crate::command_stats::{self, Counted, ShardCounts};
use crate::glob::glob_match;
use crate::id::StreamId;
use crate::resp::{Protocol, Reply, Request, RespCodec};
use crate::server::{Own, Shared, MAX_KEY_LEN, REDIS_VERSION};
use crate::store::Ticket;
use crate::stream::Fields;

mod admin;
mod clients;
mod multi;
pub(crate) use self::multi::streams_of;
mod run;

pub(crate) use clients::Clients;
use clients::{BlockedMark, ClientCard};

/// One client connection's state.
#[derive(Debug)]
pub struct RespSession {
    shared: Arc<Shared>,
    proto: Protocol,
    authenticated: bool,
    /// `authenticated`, shared with the connection's decoder (which holds
    /// a client that has not authenticated to Redis's small limits).
    auth_seen: std::sync::Arc<std::sync::atomic::AtomicBool>,
    id: u64,
    name: Option<Bytes>,
    /// Inside `MULTI`: the queued commands.
    multi: Option<multi::Queue>,
    /// Stream commands gathered from pipelined requests, sent together
    /// when the requests run out or another kind of request comes.
    run: Option<run::Run>,
    /// The commands' list of the last run of one command, emptied, for the
    /// next run: a client that sends one request at a time would otherwise
    /// make and free one per request.
    spare_commands: run::Commands,
    /// What `CLIENT LIST` shows of this connection (listed once it
    /// opens).
    card: Arc<ClientCard>,
    /// `CLIENT KILL` named this connection: it closes after the reply.
    killed: bool,
    /// `CLIENT REPLY OFF`: no reply is written until `CLIENT REPLY ON`.
    replies_off: bool,
    /// `CLIENT REPLY SKIP`: the next request's replies are not written.
    skip_next_reply: bool,
    /// Where this shard counts commands (`INFO commandstats`), and the
    /// shard (its table is chosen again when the session runs elsewhere).
    counts: Arc<ShardCounts>,
    counts_shard: Option<mailring::ShardId>,
    /// What the reply to the request being handled counts, taken by the
    /// reply that answers it.
    counting: command_stats::Pending,
    /// The shard this connection is counted on in
    /// [`Shared::sessions_on`] (from its open).
    seat: Option<usize>,
    /// With `spread_connections`: the connection stays on the shard it
    /// runs on rather than follow its first stream (see [`spreads`]).
    stays: bool,
}

impl RespSession {
    /// A session for a connection; it becomes a client (an id, counted
    /// as connected) when it opens: one refused past `maxclients` never
    /// does, as in Redis.
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        let counts = shared.command_stats.of(mailring::current_shard());
        RespSession {
            authenticated: shared.config.requirepass.is_none(),
            auth_seen: std::sync::Arc::new(std::sync::atomic::AtomicBool::new(
                shared.config.requirepass.is_none(),
            )),
            shared,
            proto: Protocol::Resp2,
            id: 0,
            name: None,
            multi: None,
            run: None,
            spare_commands: Vec::new(),
            card: Arc::new(ClientCard::new(0)),
            killed: false,
            replies_off: false,
            skip_next_reply: false,
            counts,
            counts_shard: mailring::current_shard(),
            counting: command_stats::Pending::default(),
            seat: None,
            stays: false,
        }
    }

    /// Names the connection (`CLIENT SETNAME`, `HELLO ... SETNAME`,
    /// `RESET`).
    fn set_name(&mut self, name: Option<Bytes>) {
        self.card.set_name(name.clone());
        self.name = name;
    }

    fn reply(&self, r: Reply, cx: &mut SessionCtx<Self>) {
        if let Some(counted) = self.counting.take() {
            self.counts.answered(counted, &r);
        }
        cx.send_frame(r.frame(self.proto));
    }

    /// Counts the request being handled, which ran and has no reply
    /// (`CLIENT REPLY OFF`).
    fn ran_without_reply(&self) {
        if let Some(counted) = self.counting.take() {
            self.counts.answered(counted, &Reply::OK);
        }
    }

    /// Queues a reply made later, counted for the request being handled
    /// once it is ready.
    fn reply_later(
        &self,
        cx: &mut SessionCtx<Self>,
        frame: impl std::future::Future<Output = (Protocol, Reply)> + 'static,
    ) {
        cx.reply_later(counting(self.count_later(), frame));
    }

    /// What the request being handled counts, for a reply made later
    /// (wrapped in [`counting`]).
    fn count_later(&self) -> Option<(Arc<ShardCounts>, Counted)> {
        self.counting
            .take()
            .map(|counted| (self.counts.clone(), counted))
    }

    /// Sends `args` to the actor of the stream `args[at]`; the reply is
    /// written in order when it comes.
    fn to_stream(
        &self,
        name: &'static str,
        at: usize,
        args: Vec<Bytes>,
        counted: Option<Counted>,
        cx: &mut SessionCtx<Self>,
    ) {
        self.counting.set(counted);
        let system = &self.shared.system;
        let proto = self.proto;
        // At once when its actor sits idle on this shard (see `run`); the
        // reference is made only to send.
        match system.run_now_keyed::<StreamActor, _, _>(&args[at], |a| a.one_at_once(name, &args)) {
            Ok(Some((answer, ends))) => {
                if ends {
                    // As its handler would have ended it.
                    system.keyed::<StreamActor>(args[at].clone()).stop();
                }
                return match answer.durable {
                    None => self.reply(answer.reply, cx),
                    Some(_) => {
                        self.reply_later(cx, async move { settle(Ok(answer)).await.frame(proto) })
                    }
                };
            }
            Ok(None) | Err(RunNowError::NotIdle(_)) => {}
            Err(RunNowError::Panicked) => return self.reply(unavailable(AskError::Panicked), cx),
        }
        let ask = system.keyed::<StreamActor>(args[at].clone()).ask(Exec {
            name,
            args,
            broker: self.shared.id,
        });
        self.reply_later(cx, async move { settle(ask.await).await.frame(proto) });
    }

    /// Records whether the client authenticated, for the session and its
    /// decoder.
    pub(super) fn set_authenticated(&mut self, yes: bool) {
        self.authenticated = yes;
        self.auth_seen
            .store(yes, std::sync::atomic::Ordering::Release);
    }

    fn check_password(&self, user: Option<&[u8]>, pass: &[u8]) -> Result<(), Reply> {
        let Some(want) = &self.shared.config.requirepass else {
            // No password: the default user takes any (Redis's `nopass`);
            // another user does not exist.
            return match user {
                Some(b"default") => Ok(()),
                Some(_) => Err(Reply::Error(
                    "WRONGPASS invalid username-password pair or user is disabled.".to_owned(),
                )),
                None => Err(Reply::err(
                    "AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
                )),
            };
        };
        if user.is_some_and(|u| u != b"default") || !same_secret(pass, want.as_ref()) {
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
        // Each option takes effect where it stands, as in Redis 7.0: a
        // name is checked and set there (even before authentication), and
        // an error stops the rest.
        while i < args.len() {
            let more = args.len() - i - 1;
            if args[i].eq_ignore_ascii_case(b"auth") && more >= 2 {
                if let Err(e) = self.check_password(Some(&args[i + 1]), &args[i + 2]) {
                    return e;
                }
                self.set_authenticated(true);
                i += 3;
            } else if args[i].eq_ignore_ascii_case(b"setname") && more >= 1 {
                let n = &args[i + 1];
                if let Err(e) = check_client_name(n) {
                    return e;
                }
                self.set_name((!n.is_empty()).then(|| Bytes::copy_from_slice(n)));
                i += 2;
            } else {
                return Reply::error_bytes(&[
                    b"ERR Syntax error in HELLO option '",
                    command::c_string(&args[i]),
                    b"'",
                ]);
            }
        }
        if !self.authenticated {
            return noauth_hello();
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

    /// Before a request whose replies `CLIENT REPLY SKIP` drops: the
    /// gathered run goes first, with its replies.
    #[cold]
    fn begin_skipped_request(&mut self, cx: &mut SessionCtx<Self>) {
        self.skip_next_reply = false;
        self.send_run(cx);
        cx.discard_replies(true);
    }

    /// After it: its own run goes, dropped too, and the replies are as the
    /// request left them (`CLIENT REPLY ON` or `OFF` included).
    #[cold]
    fn end_skipped_request(&mut self, cx: &mut SessionCtx<Self>) {
        self.send_run(cx);
        cx.discard_replies(self.replies_off);
    }

    /// `CLIENT REPLY ON|OFF|SKIP`, as Redis: `OFF` and `SKIP` are not
    /// answered; `SKIP` drops the replies of the next request (none while
    /// `OFF`); `ON` answers `OK`.
    fn client_reply(&mut self, mode: &[u8], cx: &mut SessionCtx<Self>) {
        if mode.eq_ignore_ascii_case(b"on") {
            self.replies_off = false;
            self.skip_next_reply = false;
            cx.discard_replies(false);
            self.reply(Reply::OK, cx);
        } else if mode.eq_ignore_ascii_case(b"off") {
            self.replies_off = true;
            cx.discard_replies(true);
            self.ran_without_reply();
        } else if mode.eq_ignore_ascii_case(b"skip") {
            self.skip_next_reply = !self.replies_off;
            self.ran_without_reply();
        } else {
            self.reply(command::syntax_error(), cx);
        }
    }

    fn client(&mut self, args: &[Bytes]) -> Reply {
        let sub = args[1].to_ascii_lowercase();
        match (sub.as_slice(), args.len()) {
            (b"id", 2) => Reply::Int(self.id as i64),
            (b"getname", 2) => self.name.clone().map_or(Reply::Nil, Reply::Bulk),
            (b"setname", 3) => match check_client_name(&args[2]) {
                Ok(()) => {
                    self.set_name((!args[2].is_empty()).then(|| Bytes::copy_from_slice(&args[2])));
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
            (b"info", 2) => Reply::Verbatim(self.client_info_line()),
            (b"list", _) => {
                // Its own request was just read.
                self.card.touch();
                clients::list(&self.shared.clients, args, self.shared.listening_on())
            }
            (b"unblock", _) => clients::unblock(&self.shared.clients, args),
            // Outside a transaction it never comes here (`client_reply`).
            (b"reply", _) => Reply::err("CLIENT REPLY is not run inside a transaction here"),
            (b"kill", _) => {
                let killed = clients::kill(
                    &self.shared.clients,
                    self.id,
                    args,
                    self.shared.listening_on(),
                );
                self.killed |= killed.me;
                killed.reply
            }
            // Nothing is ever evicted here.
            (b"no-evict", 3) => {
                if args[2].eq_ignore_ascii_case(b"on") || args[2].eq_ignore_ascii_case(b"off") {
                    Reply::OK
                } else {
                    command::syntax_error()
                }
            }
            (b"help", 2) => subcommand_help(
                "CLIENT",
                &[
                    ("GETNAME", "Return the name of this connection."),
                    ("ID", "Return the ID of this connection."),
                    ("INFO", "Return information about this connection."),
                    (
                        "KILL <ip:port>",
                        "Kill connections made from <ip:port>.",
                    ),
                    (
                        "KILL <option> <value> [<option> <value> [...]]",
                        "Kill connections. Options: ID <client-id>, TYPE <normal|master|replica|pubsub>, USER <username>, ADDR <ip:port>, LADDR <ip:port>, SKIPME (YES|NO) (default YES: the calling connection is spared).",
                    ),
                    (
                        "LIST [TYPE <normal|master|replica|pubsub>] [ID <client-id> [...]]",
                        "Return information about client connections (every client is of type normal here).",
                    ),
                    (
                        "NO-EVICT (ON|OFF)",
                        "Accepted; the broker evicts no client.",
                    ),
                    (
                        "SETINFO <LIB-NAME|LIB-VER> <value>",
                        "Accepted (redis-py 5 sends it).",
                    ),
                    (
                        "REPLY (ON|OFF|SKIP)",
                        "Control the replies sent to the current connection.",
                    ),
                    ("SETNAME <name>", "Name this connection."),
                    (
                        "UNBLOCK <clientid> [TIMEOUT|ERROR]",
                        "Unblock the specified blocked client.",
                    ),
                ],
            ),
            (
                b"id" | b"getname" | b"setname" | b"setinfo" | b"info" | b"no-evict" | b"help",
                _,
            ) => {
                command::wrong_arity(&format!("client|{}", String::from_utf8_lossy(&sub)))
            }
            _ => command::unknown_subcommand("client", &args[1]),
        }
    }

    /// `CLIENT INFO`'s line: this connection's in `CLIENT LIST`.
    fn client_info_line(&self) -> String {
        // Its request was just read.
        self.card.touch();
        self.card.line(self.shared.listening_on())
    }

    fn config(&self, args: &[Bytes]) -> Reply {
        let sub = args[1].to_ascii_lowercase();
        match (sub.as_slice(), args.len()) {
            // As Redis: the error counts and refused connections; the
            // connection and command totals are counted per client here
            // and kept.
            (b"resetstat", 2) => {
                self.shared.errors.reset();
                self.shared.command_stats.reset();
                self.shared.rejected.store(0, Ordering::Relaxed);
                self.shared.reset_net_bytes();
                return Reply::OK;
            }
            (b"resetstat", _) => return command::wrong_arity("config|resetstat"),
            (b"help", 2) => return subcommand_help(
                "CONFIG",
                &[
                    (
                        "GET <pattern> [<pattern> ...]",
                        "Return the parameters matching the glob-like patterns and their values.",
                    ),
                    (
                        "RESETSTAT",
                        "Reset the command and error counts and the count of refused connections.",
                    ),
                ],
            ),
            (b"help", _) => return command::wrong_arity("config|help"),
            _ => {}
        }
        if sub != b"get" {
            return command::unknown_subcommand("config", &args[1]);
        }
        if args.len() < 3 {
            return command::wrong_arity("config|get");
        }
        let config = &self.shared.config;
        let percentiles: Vec<String> = command_stats::LATENCY_PERCENTILES
            .iter()
            .map(|(p, _)| p.to_string())
            .collect();
        let text = |t: &str| Bytes::from(t.to_owned());
        let params: Vec<(&str, Bytes)> = vec![
            ("appendonly", text("yes")),
            ("appendfsync", text(config.store.fsync.name())),
            // The address it listens on (Redis lists its `bind` addresses).
            ("bind", text(&self.shared.listening_on().ip().to_string())),
            ("cluster-enabled", text("no")),
            ("databases", text("1")),
            ("dir", text(&config.store.dir.display().to_string())),
            // The latency monitor is off (`LATENCY` answers so); each
            // command's latency is tracked.
            ("latency-monitor-threshold", text("0")),
            ("latency-tracking", text("yes")),
            (
                "latency-tracking-info-percentiles",
                text(&percentiles.join(" ")),
            ),
            ("maxclients", text(&config.max_clients.to_string())),
            ("maxmemory", text("0")),
            // Nothing is ever evicted.
            ("maxmemory-policy", text("noeviction")),
            // No keyspace notifications are sent.
            ("notify-keyspace-events", text("")),
            ("port", text(&self.shared.listening_on().port().to_string())),
            (
                "proto-max-bulk-len",
                text(&crate::resp::DEFAULT_MAX_BULK.to_string()),
            ),
            // As Redis, which shows it to a client allowed to ask.
            (
                "requirepass",
                config.requirepass.clone().unwrap_or_default(),
            ),
            ("save", text("")),
            (
                "stream-node-max-bytes",
                text(&crate::stream::NODE_MAX_BYTES.to_string()),
            ),
            (
                "stream-node-max-entries",
                text(&crate::stream::NODE_MAX_ENTRIES.to_string()),
            ),
            // No idle client is closed (Redis's default, `timeout 0`).
            ("timeout", text("0")),
        ];
        // A name without glob characters is looked up exactly and echoed as
        // typed; a pattern lists the canonical names it matches.
        let mut pairs: Vec<(Reply, Reply)> = Vec::new();
        let mut seen: Vec<&str> = Vec::new();
        for pattern in &args[2..] {
            let glob = pattern.iter().any(|b| matches!(b, b'*' | b'?' | b'['));
            for (name, value) in &params {
                let hit = if glob {
                    glob_match(pattern, name.as_bytes(), true)
                } else {
                    pattern.eq_ignore_ascii_case(name.as_bytes())
                };
                if hit && !seen.contains(name) {
                    seen.push(name);
                    let key = if glob {
                        Reply::bulk(*name)
                    } else {
                        Reply::Bulk(pattern.clone())
                    };
                    pairs.push((key, Reply::Bulk(value.clone())));
                }
            }
        }
        Reply::Map(pairs)
    }

    /// Asks each stream of `keys` to run `name` (`DEL`, `EXISTS`) on
    /// itself, now, behind this connection's requests before it.
    fn ask_each(
        &self,
        name: &'static str,
        keys: Vec<Bytes>,
    ) -> Vec<impl std::future::Future<Output = Result<Answer, mailring_actors::AskError>> + use<>>
    {
        keys.into_iter()
            .map(|k| {
                let args = vec![Bytes::from_static(name.as_bytes()), k.clone()];
                self.shared.system.keyed::<StreamActor>(k).ask(Exec {
                    name,
                    args,
                    broker: self.shared.id,
                })
            })
            .collect()
    }

    /// Runs a command that is not a stream's.
    fn connection_command(&mut self, args: Vec<Bytes>, cx: &mut SessionCtx<Self>) {
        let name = args[0].to_ascii_lowercase();
        match name.as_slice() {
            // Arity checked with the subcommand.
            b"client" if args[1].eq_ignore_ascii_case(b"reply") => self.client_reply(&args[2], cx),
            // Run at once, inside a transaction too.
            b"reset" => {
                // Replies on again, unless this very request's are
                // skipped (`CLIENT REPLY SKIP` before it), as in Redis.
                let skipped = cx.discards_replies() && !self.replies_off;
                self.reset();
                if !skipped {
                    cx.discard_replies(false);
                }
                self.reply(Reply::Status("RESET"), cx);
            }
            b"quit" => {
                self.reply(Reply::OK, cx);
                cx.close();
            }
            b"shutdown" => match self.shutdown(&args) {
                // The server goes; this connection closes without a reply,
                // as Redis's does.
                Ok(()) => cx.close(),
                Err(e) => self.reply(e, cx),
            },
            b"exists" | b"type" | b"keys" | b"scan" | b"info" | b"dbsize"
                if cx.pending_replies() > 0 =>
            {
                // Requests before it, still in flight to their streams'
                // actors, may make or delete streams: answered from the
                // catalog once they are done, and nothing after it runs
                // before (a later request could change what it reads).
                // The catalog is read at one point, under one lock, so a
                // block's or a `DEL`'s names are counted all or none.
                let shared = self.shared.clone();
                let proto = self.proto;
                let count = self.count_later();
                cx.reply_later_in_turn(move || {
                    let reply = catalog_reply(&shared, proto, &args, &[]);
                    let unflushed = if shows_names(&args) {
                        shared.catalog.unflushed()
                    } else {
                        Vec::new()
                    };
                    counting(count, async move {
                        match flushed(unflushed).await {
                            Ok(()) => reply,
                            Err(e) => e,
                        }
                        .frame(proto)
                    })
                });
                cx.hold_frames_until_replied();
            }
            b"del" => {
                // Each existing stream's actor drops it; the replies are
                // summed in order with the rest. With requests in flight,
                // one may be making a stream named here: every placed name
                // is asked then (a request that may make a stream placed
                // its name when it was sent), not only those in the
                // catalog now.
                let in_flight = cx.pending_replies() > 0;
                let system = &self.shared.system;
                let named = args[1..]
                    .iter()
                    .filter(|k| {
                        if in_flight {
                            system.placed_shard::<StreamActor>(k).is_some()
                        } else {
                            self.shared.catalog.contains(k)
                        }
                    })
                    .cloned()
                    .collect::<Vec<_>>();
                if self.one_shard_of_several(&named) {
                    // Deleted all at once, as a block of its own, so no
                    // reader sees some of them gone and others not yet.
                    return self.run_as_transaction(&args, cx);
                }
                let asks = self.ask_each("del", named);
                let proto = self.proto;
                // A name left out as missing may have gone by a deletion
                // still flushing.
                let unflushed = self.shared.catalog.unflushed();
                self.reply_later(cx, async move {
                    let mut n = 0;
                    for a in asks {
                        match settle(a.await).await {
                            Reply::Int(d) => n += d,
                            e @ (Reply::Error(_) | Reply::ErrorBytes(_)) => return e.frame(proto),
                            _ => {}
                        }
                    }
                    match flushed(unflushed).await {
                        Ok(()) => Reply::Int(n),
                        Err(e) => e,
                    }
                    .frame(proto)
                });
            }
            _ => {
                let r = self.local_reply(&args);
                if shows_names(&args) {
                    self.reply_once_flushed(r, cx);
                } else {
                    self.reply(r, cx);
                }
            }
        }
    }

    /// Writes `r`, which shows the catalog of streams, once the catalog's
    /// changes are flushed (at once when they are).
    fn reply_once_flushed(&self, r: Reply, cx: &mut SessionCtx<Self>) {
        let unflushed = self.shared.catalog.unflushed();
        if unflushed.is_empty() {
            return self.reply(r, cx);
        }
        let proto = self.proto;
        self.reply_later(cx, async move {
            match flushed(unflushed).await {
                Ok(()) => r,
                Err(e) => e,
            }
            .frame(proto)
        });
    }

    /// A command the session answers at once, from its own state and the
    /// catalog (also inside `EXEC`).
    fn local_reply(&mut self, args: &[Bytes]) -> Reply {
        let name = args[0].to_ascii_lowercase();
        match name.as_slice() {
            b"ping" => match args.len() {
                1 => Reply::Status("PONG"),
                2 => Reply::Bulk(args[1].clone()),
                _ => command::wrong_arity("ping"),
            },
            b"echo" => Reply::Bulk(args[1].clone()),
            // The clock's seconds and microseconds, as two bulk strings.
            b"time" => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                Reply::Array(vec![
                    Reply::bulk(now.as_secs().to_string()),
                    Reply::bulk(now.subsec_micros().to_string()),
                ])
            }
            b"hello" => self.hello(args),
            b"auth" => {
                let res = match args.len() {
                    2 => self.check_password(None, &args[1]),
                    3 => self.check_password(Some(&args[1]), &args[2]),
                    _ => Err(command::syntax_error()),
                };
                match res {
                    Ok(()) => {
                        self.set_authenticated(true);
                        Reply::OK
                    }
                    Err(e) => e,
                }
            }
            b"client" => self.client(args),
            b"select" => match crate::resp::parse_int(&args[1]) {
                Some(0) => Reply::OK,
                Some(n) if i32::try_from(n).is_ok() => Reply::err("DB index is out of range"),
                Some(_) => Reply::err(
                    "value is out of range, value must between -2147483648 and 2147483647",
                ),
                None => command::not_an_integer(),
            },
            b"config" => self.config(args),
            b"latency" => self.latency(args),
            b"exists" | b"type" | b"keys" | b"scan" | b"info" | b"dbsize" => {
                catalog_reply(&self.shared, self.proto, args, &[])
            }
            b"command" => self.command(args),
            b"watch" => Reply::err(
                "WATCH is not supported: a MULTI/EXEC runs in the actors of its streams, which run no other client's command until it ends, so there is nothing to watch",
            ),
            b"unwatch" => Reply::OK,
            // Queued in a transaction with no stream found: its options
            // do not parse (the error they give alone).
            b"xread" | b"xreadgroup" => {
                match command::parse_read(args, name.as_slice() == b"xreadgroup") {
                    Err(e) => e,
                    Ok(_) => command::syntax_error(),
                }
            }
            // Queued in a transaction with no stream named: only `HELP`
            // (checked as it was queued).
            b"xgroup" => help("xgroup"),
            b"xinfo" => help("xinfo"),
            b"memory" => help("memory"),
            _ => command::unknown_command(args),
        }
    }
}

/// `frame`, counted as `count` says once it is ready (see
/// [`RespSession::count_later`]).
async fn counting(
    count: Option<(Arc<ShardCounts>, Counted)>,
    frame: impl std::future::Future<Output = (Protocol, Reply)>,
) -> (Protocol, Reply) {
    let frame = frame.await;
    if let Some((counts, counted)) = count {
        counts.answered(counted, &frame.1);
    }
    frame
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
        Err(e) => unavailable(e),
    }
}

impl RespSession {
    /// `XREAD` / `XREADGROUP`'s options, or the error replied.
    fn read_args(
        &self,
        args: &[Bytes],
        group: bool,
        cx: &mut SessionCtx<Self>,
    ) -> Option<command::ReadArgs> {
        let p = match command::parse_read(args, group) {
            Ok(p) => p,
            Err(e) => {
                self.reply(e, cx);
                return None;
            }
        };
        if let Some(long) = p.keys.iter().find(|k| k.len() > MAX_KEY_LEN) {
            self.reply(key_too_long(long), cx);
            return None;
        }
        Some(p)
    }

    /// Whether `names` are several streams that all live on one shard.
    fn one_shard_of_several(&self, names: &[Bytes]) -> bool {
        names.len() > 1
            && self
                .several_on_one_shard(names, &vec![false; names.len()])
                .is_some()
    }

    /// The shard of `keys` (those not `missing`) when they are several
    /// streams that all live on one shard.
    fn several_on_one_shard(&self, keys: &[Bytes], missing: &[bool]) -> Option<mailring::ShardId> {
        if keys.len() < 2 {
            // The common read: nothing to gather.
            return None;
        }
        let mut named: Vec<&Bytes> = keys
            .iter()
            .zip(missing)
            .filter(|(_, m)| !**m)
            .map(|(k, _)| k)
            .collect();
        named.sort();
        named.dedup();
        if named.len() < 2 {
            return None;
        }
        let system = &self.shared.system;
        let shard = system.placed_shard::<StreamActor>(named[0])?;
        named[1..]
            .iter()
            .all(|k| system.placed_shard::<StreamActor>(k) == Some(shard))
            .then_some(shard)
    }

    /// Whether stream `key` does not exist as far as this connection can
    /// tell: never placed, with nothing of this connection in flight and
    /// no run gathered. Every stream that exists (or is being made by a
    /// request in flight) was placed when it was made or the request sent
    /// (or at start, recovered); a name this shard has routed before is
    /// answered from its cache without a lock, so the common case costs
    /// about what the routing it precedes costs.
    fn reads_missing(&self, key: &Bytes) -> bool {
        // A request of this connection that may make the stream placed
        // its name when its ask was sent: every ask is sent as its
        // request is handled (a request whose ask starts later holds the
        // frames after it), so requests in flight do not matter here,
        // but for the gathered run, whose names are placed when it goes.
        !self.run.as_ref().is_some_and(|run| run.names(key))
            && self
                .shared
                .system
                .placed_shard::<StreamActor>(key)
                .is_none()
    }

    /// `XREAD`: a read of each stream; when nothing is there and `BLOCK`
    /// is given, a watch on each, and a read of the first that fires.
    fn xread(&mut self, args: &[Bytes], cx: &mut SessionCtx<Self>) {
        let Some(p) = self.read_args(args, false, cx) else {
            return;
        };
        let ids = match p
            .ids
            .iter()
            .map(|i| command::xread_id(i))
            .collect::<Result<Vec<_>, _>>()
        {
            Ok(ids) => ids,
            Err(e) => return self.reply(e, cx),
        };
        // Streams never named by anyone (nor by a request of this
        // connection in flight) have nothing to read: no actor is asked,
        // so a read naming many of them places none (a blocking one waits
        // for their making in the broker's table, see `next_append`).
        let missing: Vec<bool> = p.keys.iter().map(|k| self.reads_missing(k)).collect();
        if p.block.is_none() && missing.iter().all(|m| *m) {
            return self.reply(Reply::NilArray, cx);
        }
        let broker = self.shared.id;
        // For a blocking read only (it registers its wake-up).
        let shared = p.block.map(|_| self.shared.clone());
        let card = p.block.map(|_| self.card.clone());
        let proto = self.proto;
        let actors: Vec<_> = p
            .keys
            .iter()
            .map(|k| self.shared.system.keyed::<StreamActor>(k.clone()))
            .collect();
        let read_of = |id: &Option<StreamId>| Read {
            from: id.map_or(ReadFrom::Last, ReadFrom::After),
            count: p.count,
            broker,
        };
        let shared_shard = if p.block.is_none() {
            self.several_on_one_shard(&p.keys, &missing)
        } else {
            None
        };
        if shared_shard.is_some_and(|s| s != cx.shard()) {
            // Several streams of another shard: one snapshot there, as a
            // transaction of its own (this shard cannot see whether they
            // are idle).
            return self.run_as_transaction(args, cx);
        }
        let reads: Vec<_> = if shared_shard.is_some() {
            // Several streams of this shard: one snapshot of them all,
            // read at once; with any of them busy (a transaction may hold
            // it), the read runs as a transaction of its own, so it never
            // sees a transaction in one stream and not yet in another.
            let mut reads = Vec::with_capacity(actors.len());
            for ((a, id), missing) in actors.iter().zip(&ids).zip(&missing) {
                if *missing {
                    reads.push(None);
                    continue;
                }
                let m = read_of(id);
                match a.run_now(|actor| actor.read_at_once(&m)) {
                    Ok(Some((answer, ends))) => {
                        if ends {
                            a.stop();
                        }
                        reads.push(Some(NowOr::Now(Some(Ok(answer)))));
                    }
                    Ok(None) | Err(RunNowError::NotIdle(_)) => {
                        return self.run_as_transaction(args, cx);
                    }
                    Err(RunNowError::Panicked) => {
                        reads.push(Some(NowOr::Now(Some(Err(AskError::Panicked)))));
                    }
                }
            }
            reads
        } else {
            actors
                .iter()
                .zip(&ids)
                .zip(&missing)
                .map(|((a, id), missing)| (!missing).then(|| read_now_or_ask(a, read_of(id))))
                .collect()
        };
        let block = p.block;
        self.reply_later(cx, async move {
            let mut after = Vec::with_capacity(reads.len());
            let mut found = Vec::new();
            let mut visible = Vec::new();
            for (i, r) in reads.into_iter().enumerate() {
                let Some(r) = r else {
                    // A stream that does not exist: `$` is its last id, 0-0.
                    after.push(ids[i].unwrap_or(StreamId::MIN));
                    continue;
                };
                match r.await {
                    Ok(r) => {
                        after.push(r.after);
                        if !r.entries.is_empty() {
                            found.push((p.keys[i].clone(), r.entries));
                            visible.extend(r.visible);
                        }
                    }
                    Err(e) => return unavailable(e).frame(proto),
                }
            }
            if !found.is_empty() {
                // Written once what it shows is flushed.
                if let Err(e) = flushed(visible).await {
                    return e.frame(proto);
                }
                return streams_reply(found, proto).frame(proto);
            }
            let (Some(block), Some(shared)) = (block, shared.as_deref()) else {
                return Reply::NilArray.frame(proto);
            };
            let deadline = block_deadline(block);
            let read = BlockedRead::Plain { count: p.count };
            let blocked = card.map(BlockedMark::new);
            // A stream named twice is watched once, after the id it was
            // given first, as Redis keeps the first id of a key it blocks
            // on (a later, smaller one would wake the read too early).
            let mut named = std::collections::HashSet::with_capacity(p.keys.len());
            let firsts: Vec<usize> = (0..p.keys.len())
                .filter(|&i| named.insert(&p.keys[i]))
                .collect();
            let actors: Vec<_> = firsts.iter().map(|&i| actors[i].clone()).collect();
            let keys: Vec<Bytes> = firsts.iter().map(|&i| p.keys[i].clone()).collect();
            let after: Vec<StreamId> = firsts.iter().map(|&i| after[i]).collect();
            loop {
                let (fired, served) = match next_append(
                    &actors,
                    &keys,
                    &after,
                    &read,
                    deadline,
                    shared,
                    blocked.as_ref().map(BlockedMark::card),
                )
                .await
                {
                    Ok(fired) => fired,
                    Err(ended) => return ended.frame(proto),
                };
                if let Some(Served::Entries(entries, visible)) = served {
                    // Served by the stream at its signal, as Redis serves a
                    // blocked client after the command that signalled.
                    if let Some(t) = visible {
                        if let Err(e) = t.await {
                            return storage_error(&e).frame(proto);
                        }
                    }
                    return streams_reply(vec![(keys[fired].clone(), entries)], proto).frame(proto);
                }
                // Only the stream that fired is read, as Redis serves the
                // one key that unblocked the client.
                let r = read_now_or_ask(
                    &actors[fired],
                    Read {
                        from: ReadFrom::After(after[fired]),
                        count: p.count,
                        broker,
                    },
                )
                .await;
                match r {
                    // An entry added and removed at once (`MAXLEN 0`, or
                    // `XDEL` in the same transaction) still answers, with
                    // no entry: Redis serves a reader once the stream's
                    // last id passes its own.
                    Ok(r) if !r.entries.is_empty() || r.last_id > Some(after[fired]) => {
                        if let Some(t) = r.visible {
                            if let Err(e) = t.await {
                                return storage_error(&e).frame(proto);
                            }
                        }
                        return streams_reply(vec![(keys[fired].clone(), r.entries)], proto)
                            .frame(proto);
                    }
                    Ok(_) => {}
                    Err(e) => return unavailable(e).frame(proto),
                }
            }
        });
        if block.is_some() {
            // A blocked Redis client's next command runs after the answer;
            // one that goes away meanwhile is dropped.
            cx.block_until_replied();
        }
    }
}

impl RespSession {
    /// `XREADGROUP`: every group checked (several streams), then each
    /// stream read (`>` delivers); when nothing is new and `BLOCK` is
    /// given, a watch on each, and a `>` read of the first that fires.
    fn xreadgroup(&mut self, args: &[Bytes], cx: &mut SessionCtx<Self>) {
        let Some(p) = self.read_args(args, true, cx) else {
            return;
        };
        let (group, consumer) = p.group.clone().expect("parse_read checks GROUP");
        let group_name = group.clone();
        let consumer_name = consumer.clone();
        // Streams nobody ever named have no group: their error, without
        // asking (placing) them.
        let missing: Vec<bool> = p.keys.iter().map(|k| self.reads_missing(k)).collect();
        if p.keys.len() == 1 && missing[0] {
            // No stream, so no group: Redis checks that first.
            let r = crate::actor::no_group_in_readgroup(&p.keys[0], &group);
            return self.reply(r, cx);
        }
        let one_shard = match p.block {
            None => self.several_on_one_shard(&p.keys, &missing),
            Some(_) => None,
        };
        if one_shard.is_some_and(|s| s != cx.shard()) {
            // Several streams of another shard: every group checked, then
            // each stream read, as a block of its own there, so the read
            // sees another block in all of them or in none.
            return self.run_as_transaction(args, cx);
        }
        let broker = self.shared.id;
        let proto = self.proto;
        let actors: Vec<_> = p
            .keys
            .iter()
            .map(|k| self.shared.system.keyed::<StreamActor>(k.clone()))
            .collect();
        let watch_actors = actors.clone();
        let watch_shared = p.block.map(|_| self.shared.clone());
        let card = p.block.map(|_| self.card.clone());
        // Run at once on the stream's actor when it is idle on this shard
        // (the future runs in the session's task, on its shard), asked
        // otherwise.
        let ask = move |i: usize, from: GroupFrom, check_only: bool, blocked: bool| {
            let m = ReadGroup {
                group: group.clone(),
                consumer: consumer.clone(),
                from,
                count: p.count,
                noack: p.noack,
                check_only,
                blocked,
                broker,
            };
            group_read_now_or_ask(&actors[i], m)
        };
        let keys = p.keys.clone();
        let ids = p.ids.clone();
        let block = p.block;
        let n = keys.len();
        // One stream: its one read is made now (at once on its actor when
        // that is idle on this shard, or asked), before any later request
        // of the connection is handled, so pipelined commands after it
        // find it done (the actor checks the group, then the id). `$`
        // asks the group only: its error comes first, then the id's.
        let first = (n == 1).then(|| {
            let (from, check_only, dollar) = match command::xreadgroup_id(&ids[0]) {
                Ok(None) => (GroupFrom::New, false, None),
                Err(e) if ids[0].as_ref() == b"$" => (GroupFrom::New, true, Some(e)),
                Ok(Some(_)) | Err(_) => (GroupFrom::History(ids[0].clone()), false, None),
            };
            let m = ReadGroup {
                group: group_name.clone(),
                consumer: consumer_name.clone(),
                from: from.clone(),
                count: p.count,
                noack: p.noack,
                check_only,
                blocked: false,
                broker,
            };
            (from, group_read_now_or_ask(&watch_actors[0], m), dollar)
        });
        // Several streams of this shard: every group checked, then each
        // stream read, now, on their idle actors, as of one instant (what
        // other shards deliver meanwhile is taken in after: nothing else
        // runs on the shard), so the read is one snapshot of them all.
        // With one busy (a transaction may hold it) or a read that must
        // fetch entries first, nothing is delivered: it runs as a block of
        // its own.
        let mut given = Vec::new();
        let mut checked = Vec::new();
        if one_shard.is_some() {
            let mut reads = Vec::with_capacity(n);
            for (i, id) in ids.iter().enumerate() {
                if missing[i] {
                    let e = crate::actor::no_group_in_readgroup(&keys[i], &group_name);
                    return self.reply(e, cx);
                }
                let from = command::xreadgroup_id(id).map(|parsed| match parsed {
                    None => GroupFrom::New,
                    Some(_) => GroupFrom::History(id.clone()),
                });
                let m = ReadGroup {
                    group: group_name.clone(),
                    consumer: consumer_name.clone(),
                    from: from.clone().unwrap_or(GroupFrom::New),
                    count: p.count,
                    noack: p.noack,
                    check_only: false,
                    blocked: false,
                    broker,
                };
                let ready = |a: &mut StreamActor| a.group_read_ready(&m);
                let ready = if i == 0 {
                    watch_actors[i].run_now(ready)
                } else {
                    watch_actors[i].run_now_as_taken(ready)
                };
                match ready {
                    Ok(Ok(true)) => {}
                    // Its group's error first, then its id's.
                    Ok(Err(e)) => return self.reply(e, cx),
                    Ok(Ok(false)) | Err(RunNowError::NotIdle(_)) => {
                        return self.run_as_transaction(args, cx)
                    }
                    Err(RunNowError::Panicked) => {
                        return self.reply(unavailable(AskError::Panicked), cx)
                    }
                }
                match from {
                    Ok(from) => checked.push(from),
                    Err(e) => return self.reply(e, cx),
                }
                reads.push(m);
            }
            for ((actor, from), mut m) in watch_actors.iter().zip(&checked).zip(reads) {
                m.from = from.clone();
                // (Found ready above, on a shard where nothing ran since:
                // asked only if that were not so.)
                given.push(now_or_ask(actor, m, StreamActor::read_group_at_once, false));
            }
        }
        self.reply_later(cx, async move {
            let fail = |e: mailring_actors::AskError| unavailable(e).frame(proto);
            let mut froms = Vec::with_capacity(n);
            let mut asked = None;
            let mut given = given.into_iter();
            if !checked.is_empty() {
                froms = checked;
            } else if let Some((from, answer, dollar)) = first {
                if let Some(e) = dollar {
                    return match answer.await {
                        Ok(GroupAnswer {
                            read: GroupRead::Error(g),
                            durable,
                            ..
                        }) => once_flushed(durable, g).await.frame(proto),
                        Ok(GroupAnswer { durable, .. }) => {
                            once_flushed(durable, e).await.frame(proto)
                        }
                        Err(a) => fail(a),
                    };
                }
                froms.push(from);
                asked = Some(answer);
            } else {
                // Several streams: each one's group must exist and its id
                // be valid, in order, before anything is delivered.
                for (i, id) in ids.iter().enumerate() {
                    if missing[i] {
                        let e = crate::actor::no_group_in_readgroup(&keys[i], &group_name);
                        return e.frame(proto);
                    }
                    match ask(i, GroupFrom::New, true, false).await {
                        Ok(GroupAnswer {
                            read: GroupRead::Error(e),
                            durable,
                            ..
                        }) => return once_flushed(durable, e).await.frame(proto),
                        Ok(_) => {}
                        Err(e) => return fail(e),
                    }
                    match command::xreadgroup_id(id) {
                        Ok(None) => froms.push(GroupFrom::New),
                        Ok(Some(_)) => froms.push(GroupFrom::History(id.clone())),
                        Err(e) => return e.frame(proto),
                    }
                }
            }
            let mut found = Vec::new();
            let mut last_ids = Vec::with_capacity(n);
            for (i, from) in froms.iter().enumerate() {
                let answer = match asked.take().or_else(|| given.next()) {
                    Some(answer) => answer.await,
                    None => ask(i, from.clone(), false, false).await,
                };
                // A stream whose group went away after the checks (another
                // client's XGROUP DESTROY or DEL) is left out once entries
                // of an earlier stream were delivered: they are pending
                // already, and an error alone would hide them from this
                // reader.
                // So is a stream whose actor failed (panicked, stopped).
                let delivered = found
                    .iter()
                    .any(|(_, e): &(Bytes, GroupEntries)| !e.is_empty());
                let answer = match answer {
                    Ok(a) => a,
                    Err(_) if delivered => continue,
                    Err(e) => return fail(e),
                };
                last_ids.push(answer.last_id);
                let entries = match answer.read {
                    GroupRead::Entries(e) => e,
                    GroupRead::Error(_) if delivered => continue,
                    GroupRead::Error(e) => {
                        return once_flushed(answer.durable, e).await.frame(proto)
                    }
                };
                if let Some(t) = answer.durable {
                    if let Err(e) = t.await {
                        return storage_error(&e).frame(proto);
                    }
                }
                if !entries.is_empty() || matches!(from, GroupFrom::History(_)) {
                    found.push((keys[i].clone(), entries));
                }
            }
            if !found.is_empty() {
                return group_streams_reply(found, proto).frame(proto);
            }
            let (Some(block), Some(shared)) = (block, watch_shared.as_deref()) else {
                return Reply::NilArray.frame(proto);
            };
            let deadline = block_deadline(block);
            let read = BlockedRead::Group {
                group: group_name,
                consumer: consumer_name,
                count: p.count,
                noack: p.noack,
            };
            let blocked = card.map(BlockedMark::new);
            loop {
                let (fired, served) = match next_append(
                    &watch_actors,
                    &keys,
                    &last_ids,
                    &read,
                    deadline,
                    shared,
                    blocked.as_ref().map(BlockedMark::card),
                )
                .await
                {
                    Ok(fired) => fired,
                    Err(ended) => return ended.frame(proto),
                };
                if let Some(Served::Group(read, durable)) = served {
                    // Served by the stream at its signal (its delivery
                    // logged there), as Redis serves a blocked client
                    // after the command that signalled.
                    return match read {
                        GroupRead::Entries(e) => {
                            if let Some(t) = durable {
                                if let Err(err) = t.await {
                                    return storage_error(&err).frame(proto);
                                }
                            }
                            group_streams_reply(vec![(keys[fired].clone(), e)], proto).frame(proto)
                        }
                        GroupRead::Error(e) => once_flushed(durable, e).await.frame(proto),
                    };
                }
                let answer = match ask(fired, GroupFrom::New, false, true).await {
                    Ok(a) => a,
                    Err(e) => return fail(e),
                };
                last_ids[fired] = answer.last_id;
                match answer.read {
                    // With no entry when served all the same (an entry
                    // added and removed at once).
                    GroupRead::Entries(e) if !e.is_empty() || answer.served => {
                        if let Some(t) = answer.durable {
                            if let Err(err) = t.await {
                                return storage_error(&err).frame(proto);
                            }
                        }
                        return group_streams_reply(vec![(keys[fired].clone(), e)], proto)
                            .frame(proto);
                    }
                    GroupRead::Entries(_) => {}
                    // The group went away while blocked.
                    GroupRead::Error(e) => {
                        return once_flushed(answer.durable, e).await.frame(proto)
                    }
                }
            }
        });
        if block.is_some() {
            // Blocked: a Redis client's next command runs after the
            // answer; one that goes away meanwhile is dropped.
            cx.block_until_replied();
        } else if n > 1 {
            // Several streams: their reads are asked once every group is
            // checked, so the requests after it wait for them.
            cx.hold_frames_until_replied();
        }
    }
}

/// `EXISTS`, `TYPE`, `KEYS`, `SCAN`, `DBSIZE` and `INFO`, answered from the catalog
/// of streams (no actor is asked) in protocol `proto`, with `own` as its
/// transaction left it (inside a stream's transaction). The caller's
/// reply waits for [`Catalog::unflushed`](crate::server::Catalog::unflushed).
pub(crate) fn catalog_reply(
    shared: &Shared,
    proto: Protocol,
    args: &[Bytes],
    own: Own<'_>,
) -> Reply {
    let name = args[0].to_ascii_lowercase();
    let exists = |k: &Bytes| match own.iter().find(|(name, _)| name == k) {
        Some((_, exists)) => *exists,
        None => shared.catalog.contains(k),
    };
    match name.as_slice() {
        // (Under one lock: a transaction's or a `DEL`'s names change in
        // the catalog all at once, and are counted all or none.)
        b"exists" => Reply::Int(shared.catalog.count_with(&args[1..], own) as i64),
        b"type" => Reply::Status(if exists(&args[1]) { "stream" } else { "none" }),
        b"keys" => Reply::Array(
            shared
                .catalog
                .matching_with(&args[1], own)
                .into_iter()
                .map(Reply::Bulk)
                .collect(),
        ),
        b"info" => RespSession::info(shared, proto, args, own),
        b"dbsize" => Reply::Int(shared.catalog.len_with(own) as i64),
        _ => RespSession::scan(shared, args, own),
    }
}

/// `reply` once `durable` (the flush of what it shows) is done, or the
/// error of its flush.
async fn once_flushed(durable: Option<Ticket>, reply: Reply) -> Reply {
    match durable {
        Some(t) => match t.await {
            Ok(()) => reply,
            Err(e) => storage_error(&e),
        },
        None => reply,
    }
}

/// Whether `command` shows the catalog of streams (`EXISTS`, `TYPE`,
/// `KEYS`, `SCAN`, `DBSIZE`, and `INFO` with its keyspace section).
pub(crate) fn shows_names(command: &[Bytes]) -> bool {
    let is = |name: &[u8]| command[0].eq_ignore_ascii_case(name);
    if is(b"info") {
        return command.len() == 1
            || command[1..].iter().any(|s| {
                [&b"keyspace"[..], b"default", b"all", b"everything"]
                    .iter()
                    .any(|w| s.eq_ignore_ascii_case(w))
            });
    }
    is(b"exists") || is(b"type") || is(b"keys") || is(b"scan") || is(b"dbsize")
}

/// Waits for the flush of `tickets` (reads' tickets): the error to reply
/// instead if one will never come (under `always`, its log failed: see
/// [`ShardLog::read_ticket`](crate::store::ShardLog::read_ticket)).
pub(crate) async fn flushed(tickets: Vec<Ticket>) -> Result<(), Reply> {
    for t in tickets {
        t.await.map_err(|e| storage_error(&e))?;
    }
    Ok(())
}

/// When a `BLOCK ms` read gives up (`0`: never).
fn block_deadline(ms: u64) -> Option<std::time::Instant> {
    (ms > 0).then(|| mailring::time::deadline_in(std::time::Duration::from_millis(ms)))
}

/// Watches each stream for what serves a blocked reader (an append after
/// its id, a group destroyed, the stream deleted); the index of the first
/// that fires, and what it served the reader with (`None`: the reader
/// reads for itself), or the reply of a read that ended unserved (at the
/// deadline, when the broker stops, at `CLIENT UNBLOCK`). `card`: the
/// blocked client's, which `CLIENT UNBLOCK` finds the wake-up through.
async fn next_append(
    actors: &[mailring_actors::Addr<StreamActor>],
    keys: &[Bytes],
    after: &[StreamId],
    read: &BlockedRead,
    deadline: Option<std::time::Instant>,
    shared: &Shared,
    card: Option<&ClientCard>,
) -> Result<(usize, Option<Served>), Reply> {
    /// Marks the wake-up given up however the read ends (fired, timed
    /// out, or dropped with its connection), and has each stream that did
    /// not fire it drop its watcher now: an actor holding nothing else
    /// then ends (a timed-out read of a missing stream leaves none); a
    /// watcher still waiting in the broker's table for its stream's
    /// making leaves it.
    struct GiveUpOnDrop<'a> {
        notify: Arc<Notify>,
        actors: &'a [mailring_actors::Addr<StreamActor>],
        keys: &'a [Bytes],
        /// Watchers left in [`Shared::awaiting`], by index.
        awaiting: Vec<bool>,
        shared: &'a Shared,
    }
    impl Drop for GiveUpOnDrop<'_> {
        fn drop(&mut self) {
            let fired = self.notify.give_up().map(|(i, _)| i);
            let closing = fired == Some(Shared::CLOSING);
            for (i, a) in self.actors.iter().enumerate() {
                if Some(i) == fired {
                    continue;
                }
                if self.awaiting[i] && self.shared.stop_awaiting(&self.keys[i], &self.notify, i) {
                    // Its stream was never made: no actor holds it.
                    continue;
                }
                if closing {
                    // The broker stops: no actor needs sweeping.
                    continue;
                }
                {
                    let _ = a.tell(Watch {
                        after: StreamId::MAX,
                        notify: self.notify.clone(),
                        index: i,
                        reader: None,
                        broker: self.shared.id,
                    });
                }
            }
        }
    }
    let notify = Notify::new();
    {
        let mut blocked = shared.blocked.lock().unwrap_or_else(|p| p.into_inner());
        if shared.closing.load(Ordering::Acquire) {
            return Err(Reply::NilArray);
        }
        blocked.retain(|w| w.strong_count() > 0);
        blocked.push(Arc::downgrade(&notify));
    }
    if let Some(card) = card {
        card.blocks_on(&notify);
    }
    let mut give_up = GiveUpOnDrop {
        notify: notify.clone(),
        actors,
        keys,
        awaiting: vec![false; actors.len()],
        shared,
    };
    for (i, (a, after)) in actors.iter().zip(after).enumerate() {
        // A plain reader of a stream nobody ever named waits for its
        // making in the broker's table, placing nothing (a read of many
        // such names would otherwise record each in the directory for
        // good); its maker's actor adopts it.
        if matches!(read, BlockedRead::Plain { .. })
            && shared.await_making(&keys[i], *after, &notify, i, read)
        {
            give_up.awaiting[i] = true;
            continue;
        }
        let _ = a.tell(Watch {
            after: *after,
            notify: notify.clone(),
            index: i,
            reader: Some(read.clone()),
            broker: shared.id,
        });
    }
    let fired = match deadline {
        // At the deadline, given up, unless a stream served it first (then
        // it is answered with that: a group's entries were delivered).
        Some(d) => match mailring::time::timeout_at(d, notify.fired()).await {
            Ok(fired) => Some(fired),
            Err(_) => notify.give_up(),
        },
        None => Some(notify.fired().await),
    };
    match fired {
        // Ended unserved: its time ran out, the broker stops, or `CLIENT
        // UNBLOCK` (as a time-out, or with Redis's error).
        None => Err(Reply::NilArray),
        Some((Shared::CLOSING | Shared::UNBLOCKED, _)) => Err(Reply::NilArray),
        Some((Shared::UNBLOCKED_WITH_ERROR, _)) => Err(Reply::Error(
            "UNBLOCKED client unblocked via CLIENT UNBLOCK".to_owned(),
        )),
        Some(fired) => Ok(fired),
    }
}

/// `XREADGROUP`'s reply: like `XREAD`'s, a deleted entry read from the
/// history without its fields.
/// A stream's entries read by a group (a deleted one without fields).
type GroupEntries = Vec<(StreamId, Option<Fields>)>;

pub(crate) fn group_streams_reply(found: Vec<(Bytes, GroupEntries)>, proto: Protocol) -> Reply {
    let per_stream = found
        .into_iter()
        .map(|(key, entries)| (Reply::Bulk(key), Reply::Entries(entries)));
    match proto {
        Protocol::Resp3 => Reply::Map(per_stream.collect()),
        Protocol::Resp2 => {
            Reply::Array(per_stream.map(|(k, v)| Reply::Array(vec![k, v])).collect())
        }
    }
}

/// `XREAD`'s reply: per stream with entries, its name and the entries (a
/// map in RESP3).
pub(crate) fn streams_reply(
    found: Vec<(Bytes, Vec<(StreamId, Fields)>)>,
    proto: Protocol,
) -> Reply {
    group_streams_reply(
        found
            .into_iter()
            .map(|(key, entries)| {
                let entries = entries.into_iter().map(|(id, f)| (id, Some(f))).collect();
                (key, entries)
            })
            .collect(),
        proto,
    )
}

/// The reply when a stream's actor could not answer.
pub(crate) fn unavailable(e: mailring_actors::AskError) -> Reply {
    Reply::err(format!("stream unavailable: {e}"))
}

fn key_too_long(_key: &[u8]) -> Reply {
    Reply::err(format!(
        "stream name longer than the limit of {MAX_KEY_LEN} bytes"
    ))
}

/// `XGROUP HELP` / `XINFO HELP`.
/// `<COMMAND> HELP`: Redis's layout (a status line per line) of the
/// subcommands the broker takes, each with what it does.
pub(crate) fn subcommand_help(command: &str, subcommands: &[(&str, &str)]) -> Reply {
    let mut lines = vec![Reply::StatusOwned(format!(
        "{command} <subcommand> [<arg> [value] [opt] ...]. Subcommands are:"
    ))];
    for (usage, what) in subcommands.iter().chain(&[("HELP", "Prints this help.")]) {
        lines.push(Reply::StatusOwned((*usage).to_owned()));
        lines.push(Reply::StatusOwned(format!("    {what}")));
    }
    Reply::Array(lines)
}

fn help(command: &str) -> Reply {
    let lines: &[&str] = if command == "memory" {
        &[
            "MEMORY <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
            "USAGE <key> [SAMPLES <count>]",
            "    Return an estimate of the bytes <key> holds in memory: its entries'",
            "    index, the entries cached in memory (the rest is read back from",
            "    the log), its groups' pending entries and consumers (SAMPLES is",
            "    accepted; nothing is sampled).",
            "HELP",
            "    Prints this help.",
        ]
    } else if command == "xgroup" {
        &[
            "XGROUP <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
            "CREATE <key> <groupname> <id|$> [option]",
            "    Create a new consumer group. Options are:",
            "    * MKSTREAM",
            "      Create the empty stream if it does not exist.",
            "    * ENTRIESREAD entries_read",
            "      Set the group's entries_read counter (internal use).",
            "CREATECONSUMER <key> <groupname> <consumer>",
            "    Create a new consumer in the specified group.",
            "DELCONSUMER <key> <groupname> <consumer>",
            "    Remove the specified consumer.",
            "DESTROY <key> <groupname>",
            "    Remove the specified group.",
            "SETID <key> <groupname> <id|$> [ENTRIESREAD entries_read]",
            "    Set the current group ID and entries_read counter.",
            "HELP",
            "    Prints this help.",
        ]
    } else {
        &[
            "XINFO <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
            "CONSUMERS <key> <groupname>",
            "    Show consumers of <groupname>.",
            "GROUPS <key>",
            "    Show the stream consumer groups.",
            "STREAM <key> [FULL [COUNT <count>]",
            "    Show information about the stream.",
            "HELP",
            "    Prints this help.",
        ]
    };
    Reply::Array(
        lines
            .iter()
            .map(|l| Reply::StatusOwned((*l).to_owned()))
            .collect(),
    )
}

fn noauth_hello() -> Reply {
    Reply::Error(
        "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time".to_owned(),
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

/// Whether command `args` may make the stream it names (see
/// [`StreamActor::makes_stream`]).
fn may_make_stream(args: &[Bytes]) -> bool {
    command::lookup(&args[0]).is_some_and(|spec| StreamActor::makes_stream(spec.name, args))
}

/// The stream a command names first, if it is a stream command.
fn first_stream(args: &[Bytes]) -> Option<&Bytes> {
    let spec = command::lookup(&args[0])?;
    if !command::arity_ok(spec, args.len()) {
        return None;
    }
    match spec.kind {
        Kind::Stream(at) => args.get(at),
        Kind::Read => args.get(command::streams_at(args)?),
        Kind::Connection => None,
    }
}

impl Session for RespSession {
    type Codec = RespCodec;
    type Key = Bytes;

    fn decoder(&mut self, server_codec: &RespCodec) -> RespCodec {
        if self.shared.config.requirepass.is_some() {
            server_codec
                .clone()
                .until_authenticated(self.auth_seen.clone())
        } else {
            server_codec.clone()
        }
    }

    fn route(&mut self, req: &Request, cx: &SessionCtx<Self>) -> Route<Bytes> {
        // Inside `MULTI` commands are only queued: a stream they name is
        // placed by the transaction if it runs (a refused one must leave
        // no name placed).
        if cx.key().is_some() || !self.authenticated || self.multi.is_some() || self.stays {
            return Route::NotYet;
        }
        match req {
            // A name nobody placed is placed (on this connection's shard)
            // only by a command that may make its stream: a read of it
            // leaves it unplaced, as a hostile client naming many would
            // otherwise leave a record of each.
            Request::Command(args) => match first_stream(args) {
                Some(key) if key.len() <= MAX_KEY_LEN => {
                    let placed = self.shared.system.placed_shard::<StreamActor>(key);
                    if placed.is_none() && !may_make_stream(args) {
                        return Route::NotYet;
                    }
                    if let Some(home) = placed {
                        if self.shared.config.spread_connections
                            && spreads(&self.shared.sessions_on, cx.shard().index(), home.index())
                        {
                            self.stays = true;
                            return Route::NotYet;
                        }
                    }
                    Route::Key(key.clone())
                }
                _ => Route::NotYet,
            },
            Request::Broken(_) => Route::NotYet,
        }
    }

    async fn on_frame(&mut self, req: Request, cx: &mut SessionCtx<Self>) {
        if self.counts_shard != Some(cx.shard()) {
            self.sit(cx.shard().index());
            // Moved (to its key's shard, or a less loaded one): counted
            // in the table of the shard it runs on now.
            self.counts_shard = Some(cx.shard());
            self.counts = self.shared.command_stats.of(self.counts_shard);
        }
        // `CLIENT REPLY SKIP` before: this request's replies are dropped,
        // its gathered run's too (sent before the next request comes).
        let skip = self.skip_next_reply;
        if skip {
            self.begin_skipped_request(cx);
        }
        self.handle_request(req, cx).await;
        if skip {
            self.end_skipped_request(cx);
        }
        self.card.mirror(
            match self.proto {
                Protocol::Resp2 => 2,
                Protocol::Resp3 => 3,
            },
            self.multi.as_ref().map(multi::Queue::len),
        );
        if std::mem::take(&mut self.killed) {
            // `CLIENT KILL` named this connection: it goes once its reply
            // is written.
            cx.close();
        }
    }

    fn on_drained(&mut self, cx: &mut SessionCtx<Self>) {
        self.card.touch();
        self.send_run(cx);
    }

    fn on_open(&mut self, cx: &mut SessionCtx<Self>) {
        self.id = self.shared.next_client_id.fetch_add(1, Ordering::Relaxed) + 1;
        self.shared.connected.fetch_add(1, Ordering::Relaxed);
        self.card = Arc::new(ClientCard::new(self.id));
        self.card.open(cx.peer_addr(), cx.local_addr(), cx.closer());
        self.shared.clients.add(self.card.clone());
        self.sit(cx.shard().index());
    }

    fn refusal(&mut self, reason: &CloseReason) -> Option<(Protocol, Reply)> {
        match reason {
            CloseReason::ClientLimit => {
                self.shared.rejected.fetch_add(1, Ordering::Relaxed);
                Some(Reply::Raw(b"-ERR max number of clients reached\r\n").frame(self.proto))
            }
            _ => None,
        }
    }
}

impl RespSession {
    /// One request: [`Session::on_frame`]'s work.
    async fn handle_request(&mut self, req: Request, cx: &mut SessionCtx<Self>) {
        let args = match req {
            Request::Command(args) => args,
            Request::Broken(e) => {
                self.send_run(cx);
                self.counting.set(None);
                self.reply(Reply::err(format!("Protocol error: {e}")), cx);
                cx.close();
                return;
            }
        };
        let row = command::lookup_row(&args[0]);
        self.card.note_command(row, &args);
        let spec = row.map(|row| &command::COMMANDS[row]);
        if self.shared.config.debug_commands
            && self.authenticated
            && self.multi.is_none()
            && args.len() == 3
            && args[0].eq_ignore_ascii_case(b"debug")
            && args[1].eq_ignore_ascii_case(b"panic-stream")
        {
            // Joins a run as a stream command would (key first), so a test
            // can make an actor panic after other commands of its run.
            if self.run.as_ref().is_some_and(|run| !run.is_on(&args[2])) {
                self.send_run(cx);
            }
            let key_first = vec![args[0].clone(), args[2].clone()];
            return self.gather("debug-panic", None, key_first, cx);
        }
        // A gathered run goes before any request that cannot join it, so
        // replies keep the requests' order.
        if self.run.is_some() && !self.joins_run(spec, &args) {
            self.send_run(cx);
        }
        // Redis's order: unknown command, arity, unknown subcommand and its
        // arity, authentication; each of these rejects a command inside
        // MULTI and spoils the transaction.
        let checked = match spec {
            None => Err(command::unknown_command(&args)),
            Some(spec) if !command::arity_ok(spec, args.len()) => {
                Err(command::wrong_arity(spec.name))
            }
            Some(spec) if command::has_subcommands(spec.name) && args.len() >= 2 => {
                command::check_subcommand(spec.name, &args).map(|_| spec)
            }
            Some(spec) => Ok(spec),
        }
        .and_then(|spec| {
            if !self.authenticated && !matches!(spec.name, "auth" | "hello" | "quit" | "reset") {
                Err(Reply::Error("NOAUTH Authentication required.".to_owned()))
            } else {
                Ok(spec)
            }
        })
        .and_then(|spec| {
            // Refused inside a transaction, as Redis's `no-multi` commands.
            if self.multi.is_some() && spec.name == "shutdown" {
                Err(Reply::err("Command not allowed inside a transaction"))
            } else {
                Ok(spec)
            }
        });
        // Where Redis counts it (`INFO commandstats`): none for an
        // unknown command or subcommand.
        let slot = row.and_then(|row| command_stats::slot_in(row, &args));
        let spec = match checked {
            Ok(spec) => spec,
            Err(e) => {
                if let Some(slot) = slot {
                    self.counts.rejected(slot);
                }
                self.counting.set(None);
                let exec = args[0].eq_ignore_ascii_case(b"exec");
                let r = multi::reject(self, exec, e);
                return self.reply(r, cx);
            }
        };
        // Counted once it ran, by the reply that answers it (set on every
        // path but a gathered command's, which its run counts); `EXEC`
        // with the commands it runs.
        let count_now = |session: &Self| session.counting.set(slot.map(Counted::one));
        if spec.kind == Kind::Connection
            && matches!(spec.name, "multi" | "exec" | "discard" | "watch")
        {
            self.counting.set(slot.map(|slot| match &self.multi {
                Some(queue) if spec.name == "exec" && !queue.spoiled() => {
                    Counted::exec(slot, queue.commands())
                }
                _ => Counted::one(slot),
            }));
        }
        match self.transaction_command(spec, cx) {
            multi::Handled::Reply(r) => return self.reply(r, cx),
            multi::Handled::Later => return,
            multi::Handled::No => {}
        }
        // `RESET` and `QUIT` run at once, inside a transaction too (`RESET`
        // ends it), as Redis runs them.
        if self.multi.is_some() && !matches!(spec.name, "reset" | "quit") {
            // A stream name past the limit is refused as it is queued, and
            // spoils the transaction, as a wrong arity does.
            let long = multi::streams_of(spec, &args)
                .into_iter()
                .find(|k| k.len() > MAX_KEY_LEN)
                .cloned();
            // Queued: counted when `EXEC` runs it.
            self.counting.set(None);
            let r = match long {
                Some(k) => {
                    if let Some(slot) = slot {
                        self.counts.rejected(slot);
                    }
                    multi::reject(self, false, key_too_long(&k))
                }
                None => multi::queue(self, args),
            };
            return self.reply(r, cx);
        }
        match spec.kind {
            Kind::Stream(2) if args[1].eq_ignore_ascii_case(b"help") => {
                count_now(self);
                self.reply(help(spec.name), cx)
            }
            Kind::Stream(at) if args[at].len() > MAX_KEY_LEN => {
                count_now(self);
                self.reply(key_too_long(&args[at]), cx)
            }
            // `XADD` makes its stream: no lookup of the name first.
            Kind::Stream(at)
                if !StreamActor::makes_stream(spec.name, &args)
                    && self.reads_missing(&args[at]) =>
            {
                // The gathered run's replies come first.
                self.send_run(cx);
                count_now(self);
                let r = StreamActor::answer_missing(spec.name, &args[at], &args, &self.shared);
                self.reply(r, cx)
            }
            // Counted with its run.
            Kind::Stream(1) => self.gather(spec.name, slot, args, cx),
            Kind::Stream(at) => self.to_stream(spec.name, at, args, slot.map(Counted::one), cx),
            Kind::Read if spec.name == "xreadgroup" => {
                count_now(self);
                self.xreadgroup(&args, cx)
            }
            Kind::Read => {
                count_now(self);
                self.xread(&args, cx)
            }
            Kind::Connection => {
                count_now(self);
                self.connection_command(args, cx)
            }
        }
    }
}

/// An actor's answer: had at once on the idle actor (`Addr::run_now`), or
/// asked of it.
pub(crate) enum NowOr<T> {
    Now(Option<Result<T, AskError>>),
    Asked(mailring_actors::Reply<T>),
}

impl<T: Unpin> std::future::Future for NowOr<T> {
    type Output = Result<T, AskError>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        match self.get_mut() {
            NowOr::Now(answer) => {
                std::task::Poll::Ready(answer.take().expect("a NowOr is awaited once"))
            }
            NowOr::Asked(reply) => std::pin::Pin::new(reply).poll(cx),
        }
    }
}

/// `m` run at once on `addr`'s actor by `at_once` when the actor is idle
/// on this shard and `at_once` needs no await (as its handler would run
/// it); asked otherwise. `take`: other shards' deliveries are taken in
/// first (`Addr::run_now`); else the shard is seen as last taken in, with
/// other closures of the same instant (`Addr::run_now_as_taken`).
fn now_or_ask<M>(
    addr: &mailring_actors::Addr<StreamActor>,
    m: M,
    at_once: impl FnOnce(&mut StreamActor, &M) -> Option<(M::Reply, bool)>,
    take: bool,
) -> NowOr<M::Reply>
where
    M: mailring_actors::Message + Send,
    M::Reply: Send,
    StreamActor: mailring_actors::Accepts<M>,
{
    let run = |a: &mut StreamActor| at_once(a, &m);
    let ran = if take {
        addr.run_now(run)
    } else {
        addr.run_now_as_taken(run)
    };
    match ran {
        Ok(Some((answer, ends))) => {
            if ends {
                // As its handler would have ended it.
                addr.stop();
            }
            NowOr::Now(Some(Ok(answer)))
        }
        Ok(None) | Err(RunNowError::NotIdle(_)) => NowOr::Asked(addr.ask(m)),
        Err(RunNowError::Panicked) => NowOr::Now(Some(Err(AskError::Panicked))),
    }
}

fn group_read_now_or_ask(
    addr: &mailring_actors::Addr<StreamActor>,
    m: ReadGroup,
) -> NowOr<GroupAnswer> {
    now_or_ask(addr, m, StreamActor::read_group_at_once, true)
}

fn read_now_or_ask(
    addr: &mailring_actors::Addr<StreamActor>,
    m: Read,
) -> NowOr<crate::actor::ReadResult> {
    now_or_ask(addr, m, StreamActor::read_at_once, true)
}

impl Drop for RespSession {
    // However the connection ended (a panicked session runs no
    // `on_close`).
    fn drop(&mut self) {
        // Id 0: never opened (refused, or its TLS handshake failed).
        if self.id != 0 {
            self.shared.clients.remove(self.id);
            self.shared.connected.fetch_sub(1, Ordering::Relaxed);
        }
        if let Some(seat) = self.seat {
            self.shared.sessions_on[seat].fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl RespSession {
    /// Counts this connection on `shard` (and no longer where it was).
    fn sit(&mut self, shard: usize) {
        if self.seat == Some(shard) {
            return;
        }
        if let Some(old) = self.seat.replace(shard) {
            self.shared.sessions_on[old].fetch_sub(1, Ordering::Relaxed);
        }
        self.shared.sessions_on[shard].fetch_add(1, Ordering::Relaxed);
    }
}

/// Whether a connection on shard `here`, whose first stream lives on
/// `home`, stays here (`spread_connections`): when `home` serves more
/// connections than `here` by more than a sixteenth of all of them and
/// one. Connections over many streams come out about even on every shard
/// and follow their streams; those of one hot stream fill its shard that
/// far, and the rest stay where the kernel's reuseport spread put them.
fn spreads(sessions_on: &[std::sync::atomic::AtomicUsize], here: usize, home: usize) -> bool {
    if here == home {
        return false;
    }
    let count = |i: usize| sessions_on.get(i).map_or(0, |n| n.load(Ordering::Relaxed));
    let total: usize = (0..sessions_on.len()).map(count).sum();
    count(home) > count(here) + total / 16 + 1
}

/// Whether `given` is the password `want`, in a time that does not depend
/// on where they first differ (a byte-by-byte comparison that stops there
/// tells a client, by its timing, how much of a guess was right); it
/// depends only on the longer one's length.
fn same_secret(given: &[u8], want: &[u8]) -> bool {
    let len = given.len().max(want.len());
    let mut differ = u8::from(given.len() != want.len());
    for i in 0..len {
        let a = given.get(i).copied().unwrap_or(0);
        let b = want.get(i).copied().unwrap_or(0);
        differ |= a ^ b;
    }
    std::hint::black_box(differ) == 0
}

#[cfg(test)]
mod tests {
    use super::same_secret;

    #[test]
    fn a_secret_is_the_same_only_byte_for_byte_and_length_for_length() {
        assert!(same_secret(b"hunter2", b"hunter2"));
        assert!(same_secret(b"", b""));
        assert!(!same_secret(b"hunter", b"hunter2"));
        assert!(!same_secret(b"hunter2\0", b"hunter2"));
        assert!(!same_secret(b"hunter3", b"hunter2"));
        assert!(!same_secret(b"", b"x"));
    }
}
