//! The server commands a client runs around its streams: `INFO`,
//! `COMMAND` (what `redis-cli` asks for), `LATENCY`, `SCAN`, `SHUTDOWN`,
//! `RESET`.

use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::RespSession;
use crate::command::{self, Kind, COMMANDS};
use crate::command_meta;
use crate::glob::glob_match;
use crate::resp::{parse_int, Protocol, Reply};
use crate::server::REDIS_VERSION;

/// `INFO`'s sections, in order, and whether `INFO` without arguments
/// shows them.
const SECTIONS: &[&str] = &[
    "server",
    "clients",
    "memory",
    "persistence",
    "stats",
    "replication",
    "cpu",
    "modules",
    "commandstats",
    "errorstats",
    "latencystats",
    "cluster",
    "keyspace",
    "mailring",
];

/// One line per shard of the runtime's counters: where a shard's time
/// goes (tasks polled, parks, spins that found work, doorbells to other
/// shards), for `INFO mailring`.
fn shard_counters(system: &mailring_actors::SystemHandle) -> Vec<String> {
    system
        .runtime()
        .stats()
        .shards
        .iter()
        .map(|s| {
            format!(
                "shard{}:polls={},parks={},spin_wakeups={},spins_skipped={},doorbells_sent={},doorbells_coalesced={},prewakes={},ops_in_flight={},ops_offloaded={},timers_armed={},tasks_stolen={},cq_overflows={},ring_errors={}",
                s.shard,
                s.polls,
                s.parks,
                s.spin_wakeups,
                s.spins_skipped,
                s.doorbells_sent,
                s.doorbells_coalesced,
                s.prewakes,
                s.ops_in_flight,
                s.ops_offloaded,
                s.timers_armed,
                s.tasks_stolen,
                s.cq_overflows,
                s.ring_errors,
            )
        })
        .collect()
}

impl RespSession {
    /// `INFO [section ...]` in protocol `proto` (its stream count read
    /// from the catalog).
    pub(super) fn info(
        shared: &crate::server::Shared,
        proto: Protocol,
        args: &[Bytes],
        own: crate::server::Own<'_>,
    ) -> Reply {
        let wanted: Vec<String> = args[1..]
            .iter()
            .map(|a| String::from_utf8_lossy(a).to_ascii_lowercase())
            .collect();
        let all = wanted.is_empty()
            || wanted
                .iter()
                .any(|w| matches!(w.as_str(), "default" | "all" | "everything"));
        let streams = shared.catalog.len_with(own);
        let mut text = String::new();
        for section in SECTIONS {
            let asked = wanted.iter().any(|w| w == section);
            // The runtime's counters only when asked for (or with
            // `everything`): Redis clients parse the default sections.
            let shown = if *section == "mailring" {
                asked || wanted.iter().any(|w| w == "everything")
            } else if matches!(*section, "commandstats" | "latencystats") {
                // Not default sections, as in Redis.
                asked || wanted.iter().any(|w| w == "all" || w == "everything")
            } else {
                all || asked
            };
            if !shown {
                continue;
            }
            if !text.is_empty() {
                text.push_str("\r\n");
            }
            let lines: Vec<String> = match *section {
                "server" => vec![
                    format!("redis_version:{REDIS_VERSION}"),
                    format!("mailring_broker_version:{}", env!("CARGO_PKG_VERSION")),
                    "redis_mode:standalone".to_owned(),
                    format!("os:{} {}", std::env::consts::OS, std::env::consts::ARCH),
                    format!("arch_bits:{}", usize::BITS),
                    format!("process_id:{}", std::process::id()),
                    format!("run_id:{}", shared.run_id),
                    format!("tcp_port:{}", shared.listening_on().port()),
                    format!(
                        "server_time_usec:{}",
                        std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .unwrap_or_default()
                            .as_micros()
                    ),
                    format!("uptime_in_seconds:{}", shared.started.elapsed().as_secs()),
                    format!(
                        "uptime_in_days:{}",
                        shared.started.elapsed().as_secs() / 86_400
                    ),
                    format!("shards:{}", shared.config.shards),
                ],
                "clients" => vec![
                    format!(
                        "connected_clients:{}",
                        shared.connected.load(Ordering::Relaxed)
                    ),
                    format!("blocked_clients:{}", shared.blocked_reads()),
                    format!("maxclients:{}", shared.config.max_clients),
                ],
                "persistence" => vec![
                    "loading:0".to_owned(),
                    // No snapshot is ever taken, nor the log rewritten.
                    "rdb_bgsave_in_progress:0".to_owned(),
                    "aof_enabled:1".to_owned(),
                    "aof_rewrite_in_progress:0".to_owned(),
                    "aof_rewrite_scheduled:0".to_owned(),
                    format!("appendfsync:{}", shared.config.store.fsync.name()),
                    format!("dir:{}", shared.config.store.dir.display()),
                ],
                "memory" => {
                    // No allocator count is kept: the resident memory
                    // stands for it (`redis-cli --stat` reads it).
                    let rss = mailring::process::resident_bytes().unwrap_or(0);
                    let peak = mailring::process::peak_resident_bytes()
                        .unwrap_or(0)
                        .max(rss);
                    vec![
                        format!("used_memory:{rss}"),
                        format!("used_memory_human:{}", human_bytes(rss)),
                        format!("used_memory_rss:{rss}"),
                        format!("used_memory_rss_human:{}", human_bytes(rss)),
                        format!("used_memory_peak:{peak}"),
                        format!("used_memory_peak_human:{}", human_bytes(peak)),
                        "maxmemory:0".to_owned(),
                        "maxmemory_human:0B".to_owned(),
                        "maxmemory_policy:noeviction".to_owned(),
                        format!("stream_cache_bytes:{}", shared.cached_bytes.total()),
                        format!(
                            "stream_cache_limit_per_stream:{}",
                            shared.config.store.stream_cache_bytes
                        ),
                    ]
                }
                "stats" => {
                    let (ops, kbps_in, kbps_out) = shared.rates.current();
                    let (bytes_in, bytes_out) = shared.net_bytes();
                    vec![
                        format!(
                            "total_connections_received:{}",
                            shared.next_client_id.load(Ordering::Relaxed)
                        ),
                        format!("total_commands_processed:{}", shared.clients.commands()),
                        format!("instantaneous_ops_per_sec:{ops}"),
                        format!("total_net_input_bytes:{bytes_in}"),
                        format!("total_net_output_bytes:{bytes_out}"),
                        format!("instantaneous_input_kbps:{kbps_in:.2}"),
                        format!("instantaneous_output_kbps:{kbps_out:.2}"),
                        format!(
                            "rejected_connections:{}",
                            shared.rejected.load(Ordering::Relaxed)
                        ),
                        // Nothing expires or is evicted, and there is no
                        // publish/subscribe.
                        "expired_keys:0".to_owned(),
                        "evicted_keys:0".to_owned(),
                        "evicted_clients:0".to_owned(),
                        "pubsub_channels:0".to_owned(),
                        "pubsub_patterns:0".to_owned(),
                        format!("total_error_replies:{}", shared.errors.total()),
                        format!(
                            "entries_read_back_ahead:{}",
                            crate::actor::FETCHED_READS.load(Ordering::Relaxed)
                        ),
                        format!(
                            "entries_read_back_blocking:{}",
                            crate::stream::BLOCKING_READS.load(Ordering::Relaxed)
                        ),
                    ]
                }
                // A standalone server: clients that ask for their
                // topology (`role`, `cluster_enabled`) find it as Redis
                // gives it.
                "replication" => vec![
                    "role:master".to_owned(),
                    "connected_slaves:0".to_owned(),
                    "master_failover_state:no-failover".to_owned(),
                    format!("master_replid:{:040x}", shared.id),
                    "master_replid2:0000000000000000000000000000000000000000".to_owned(),
                    "master_repl_offset:0".to_owned(),
                    "second_repl_offset:-1".to_owned(),
                    "repl_backlog_active:0".to_owned(),
                    "repl_backlog_size:0".to_owned(),
                    "repl_backlog_first_byte_offset:0".to_owned(),
                    "repl_backlog_histlen:0".to_owned(),
                ],
                "cpu" => {
                    use mailring::process::{cpu_time, CpuOf};
                    let this = cpu_time(CpuOf::This).unwrap_or_default();
                    let children = cpu_time(CpuOf::Children).unwrap_or_default();
                    vec![
                        format!("used_cpu_sys:{:.6}", this.system.as_secs_f64()),
                        format!("used_cpu_user:{:.6}", this.user.as_secs_f64()),
                        format!("used_cpu_sys_children:{:.6}", children.system.as_secs_f64()),
                        format!("used_cpu_user_children:{:.6}", children.user.as_secs_f64()),
                    ]
                }
                "commandstats" => shared.command_stats.lines(),
                "errorstats" => shared.errors.lines(),
                "latencystats" => shared.command_stats.latency_lines(),
                "cluster" => vec!["cluster_enabled:0".to_owned()],
                "mailring" => {
                    let mut lines = shard_counters(&shared.system);
                    // Under `always` with direct writes: how each log's
                    // batches were made durable (docs/broker.md, "Where
                    // a direct write's flush runs").
                    let store = &shared.config.store;
                    lines.extend(
                        shared
                            .flush_stats
                            .iter()
                            .enumerate()
                            .filter(|(_, stats)| stats.direct())
                            .map(|(n, stats)| {
                                format!(
                                    "log{n}:always_flush={},{}",
                                    store.always_flush.name(),
                                    stats.info_fields()
                                )
                            }),
                    );
                    lines
                }
                "keyspace" if streams > 0 => {
                    vec![format!("db0:keys={streams},expires=0,avg_ttl=0")]
                }
                _ => Vec::new(),
            };
            let title = match *section {
                "cpu" => "CPU".to_owned(),
                _ => format!("{}{}", section[..1].to_ascii_uppercase(), &section[1..]),
            };
            text.push_str(&format!("# {title}\r\n"));
            for l in lines {
                text.push_str(&l);
                text.push_str("\r\n");
            }
        }
        match proto {
            Protocol::Resp2 => Reply::bulk(text),
            Protocol::Resp3 => Reply::Verbatim(text),
        }
    }

    /// `LATENCY HISTOGRAM [name ...]`: each command's calls in cumulative
    /// buckets, as Redis 7.0 answers (see [`crate::command_stats`]). The
    /// latency monitor's subcommands answer as a Redis whose monitor is
    /// off, its default: no events are recorded.
    pub(super) fn latency(&self, args: &[Bytes]) -> Reply {
        let sub = args[1].to_ascii_lowercase();
        match sub.as_slice() {
            b"histogram" => Reply::Map(
                self.shared
                    .command_stats
                    .histograms(&args[2..])
                    .into_iter()
                    .map(|(name, latencies)| {
                        let buckets = latencies
                            .cumulative()
                            .into_iter()
                            .map(|(bound, calls)| {
                                (Reply::Int(bound as i64), Reply::Int(calls as i64))
                            })
                            .collect();
                        let fields = vec![
                            (Reply::bulk("calls"), Reply::Int(latencies.calls() as i64)),
                            (Reply::bulk("histogram_usec"), Reply::Map(buckets)),
                        ];
                        (Reply::bulk(name), Reply::Map(fields))
                    })
                    .collect(),
            ),
            b"latest" | b"history" => Reply::Array(Vec::new()),
            b"reset" => Reply::Int(0),
            b"graph" => Reply::error_bytes(&[
                b"ERR No samples available for event '",
                &args[2],
                b"'",
            ]),
            b"doctor" => Reply::Verbatim(
                "The latency monitor is off: no latency events are recorded, so there is nothing to diagnose. Each command's latency is tracked: see INFO latencystats and LATENCY HISTOGRAM.".to_owned(),
            ),
            b"help" => super::subcommand_help(
                "LATENCY",
                &[
                    ("DOCTOR", "Return a report on latency events (the monitor is off)."),
                    ("GRAPH <event>", "Return a graph of an event's samples (none are recorded)."),
                    ("HISTORY <event>", "Return an event's samples (none are recorded)."),
                    ("LATEST", "Return the latest sample of each event (none are recorded)."),
                    ("RESET [<event> ...]", "Reset events' samples; return how many were reset."),
                    (
                        "HISTOGRAM [<command-name> ...]",
                        "Return each named command's latencies in cumulative buckets, or every command's that ran.",
                    ),
                ],
            ),
            _ => command::unknown_subcommand("latency", &args[1]),
        }
    }

    /// `COMMAND`, `COMMAND COUNT`, `COMMAND INFO name ...`, `COMMAND DOCS`
    /// (empty: `redis-cli` then uses its own hints).
    pub(super) fn command(&self, args: &[Bytes]) -> Reply {
        let Some(sub) = args.get(1) else {
            return Reply::Array(COMMANDS.iter().map(command_info).collect());
        };
        match sub.to_ascii_lowercase().as_slice() {
            b"count" if args.len() == 2 => Reply::Int(COMMANDS.len() as i64),
            b"docs" => Reply::Map(Vec::new()),
            // No names: every command.
            b"info" if args.len() == 2 => Reply::Array(COMMANDS.iter().map(command_info).collect()),
            b"info" => Reply::Array(
                args[2..]
                    .iter()
                    .map(|n| match command::lookup(n) {
                        Some(spec) => command_info(spec),
                        // A null bulk string, as Redis answers.
                        None => subcommand_info(n).unwrap_or(Reply::Nil),
                    })
                    .collect(),
            ),
            b"help" if args.len() == 2 => super::subcommand_help(
                "COMMAND",
                &[
                    (
                        "(no subcommand)",
                        "Return details about all the commands the broker takes.",
                    ),
                    ("COUNT", "Return the number of commands the broker takes."),
                    (
                        "DOCS [<command-name> ...]",
                        "Return an empty map (redis-cli then uses its own hints).",
                    ),
                    (
                        "GETKEYS <full-command>",
                        "Return the keys from a full command.",
                    ),
                    (
                        "GETKEYSANDFLAGS <full-command>",
                        "Return the keys and the access flags from a full command.",
                    ),
                    (
                        "INFO [<command-name> ...]",
                        "Return details about the named commands, or all.",
                    ),
                    (
                        "LIST [FILTERBY (MODULE <module-name>|ACLCAT <category>|PATTERN <pattern>)]",
                        "Return the names of the commands and subcommands, filtered.",
                    ),
                ],
            ),
            b"getkeys" => getkeys(&args[2..]),
            b"getkeysandflags" => getkeys_and_flags(&args[2..]),
            b"list" => command_list(&args[2..]),
            b"help" => command::wrong_arity("command|help"),
            b"count" => command::wrong_arity("command|count"),
            _ => command::unknown_subcommand("command", sub),
        }
    }

    /// `SCAN cursor [MATCH pattern] [COUNT n] [TYPE type]`: the cursor is
    /// a position in the catalog's `SCAN` order (see [`Catalog::page`]).
    ///
    /// [`Catalog::page`]: crate::server::Catalog::page
    pub(super) fn scan(
        shared: &crate::server::Shared,
        args: &[Bytes],
        own: crate::server::Own<'_>,
    ) -> Reply {
        let Some(cursor) = scan_cursor(&args[1]) else {
            return Reply::err("invalid cursor");
        };
        let mut pattern: Option<&[u8]> = None;
        let mut count = 10usize;
        let mut type_ok = true;
        let mut i = 2;
        while i < args.len() {
            if i + 1 >= args.len() {
                return command::syntax_error();
            }
            let opt = args[i].to_ascii_lowercase();
            match opt.as_slice() {
                b"match" => pattern = Some(&args[i + 1]),
                b"count" => match parse_int(&args[i + 1]) {
                    Some(n) if n >= 1 => count = n as usize,
                    Some(_) => return command::syntax_error(),
                    None => return command::not_an_integer(),
                },
                b"type" => type_ok = args[i + 1].eq_ignore_ascii_case(b"stream"),
                _ => return command::syntax_error(),
            }
            i += 2;
        }
        let (names, next) = shared.catalog.page_with(cursor, count, own);
        let page: Vec<Reply> = names
            .into_iter()
            .filter(|n| type_ok && pattern.is_none_or(|p| glob_match(p, n, false)))
            .map(Reply::Bulk)
            .collect();
        Reply::Array(vec![Reply::bulk(next.to_string()), Reply::Array(page)])
    }

    /// `SHUTDOWN [NOSAVE|SAVE] [NOW] [FORCE] [ABORT]`: the broker flushes
    /// and stops (every write is in the log already; there is no snapshot
    /// to save).
    pub(super) fn shutdown(&self, args: &[Bytes]) -> Result<(), Reply> {
        let (mut save, mut nosave, mut other, mut abort) = (false, false, false, false);
        for a in &args[1..] {
            match a.to_ascii_lowercase().as_slice() {
                b"nosave" => nosave = true,
                b"save" => save = true,
                b"now" | b"force" => other = true,
                b"abort" => abort = true,
                _ => return Err(command::syntax_error()),
            }
        }
        // Redis's illegal combinations: `ABORT` with anything, `SAVE` with
        // `NOSAVE`.
        if (abort && (save || nosave || other)) || (save && nosave) {
            return Err(command::syntax_error());
        }
        if abort {
            return Err(Reply::err("No shutdown in progress."));
        }
        self.shared.shutdown.fire(0);
        Ok(())
    }

    /// `RESET`: out of any transaction, RESP2, no name, replies on
    /// (`CLIENT REPLY`; the caller tells the connection), and not
    /// authenticated if a password is required.
    pub(super) fn reset(&mut self) {
        self.multi = None;
        self.replies_off = false;
        self.skip_next_reply = false;
        self.set_name(None);
        self.proto = Protocol::Resp2;
        self.set_authenticated(self.shared.config.requirepass.is_none());
    }
}

/// A `SCAN` cursor as Redis reads it with `strtoul` (a C string, up to a
/// NUL): refused if it starts with a blank, has anything after its
/// digits, or overflows; an optional sign (`-1` wraps to the largest);
/// no digits at all read as 0 only for the empty string.
fn scan_cursor(arg: &[u8]) -> Option<u64> {
    let text = command::c_string(arg);
    match text.first() {
        None => Some(0),
        Some(&b) if crate::resp::c_isspace(b) => None,
        Some(_) => crate::resp::strtoull_whole(text),
    }
}

/// `COMMAND GETKEYS <command> <arg> ...`: the streams `command` names,
/// found as redis-server 7.0 finds them (a stream command's key, every
/// name of `DEL`/`EXISTS`, the first half of what follows `STREAMS` for
/// `XREAD`/`XREADGROUP`, a subcommand's stream), with its errors.
fn getkeys(command: &[Bytes]) -> Reply {
    match keys_of(command) {
        Ok((keys, _)) => Reply::Array(keys.iter().cloned().map(Reply::Bulk).collect()),
        Err(e) => e,
    }
}

/// `COMMAND GETKEYSANDFLAGS <command> <arg> ...`: each of [`getkeys`]'
/// streams with the flags of the key specification that found it.
fn getkeys_and_flags(command: &[Bytes]) -> Reply {
    match keys_of(command) {
        Ok((keys, flags)) => Reply::Array(
            keys.iter()
                .map(|k| {
                    Reply::Array(vec![
                        Reply::Bulk(k.clone()),
                        Reply::Set(flags.iter().map(|f| Reply::Status(f)).collect()),
                    ])
                })
                .collect(),
        ),
        Err(e) => e,
    }
}

/// The streams `command` names and the flags its key specification gives
/// them, or `COMMAND GETKEYS`' error.
fn keys_of(command: &[Bytes]) -> Result<(&[Bytes], &'static [&'static str]), Reply> {
    let invalid = |what: &str| Reply::err(format!("Invalid {what} specified for command"));
    let Some(spec) = command::lookup(&command[0]) else {
        return Err(Reply::err("Invalid command specified"));
    };
    if !command::arity_ok(spec, command.len()) {
        return Err(invalid("number of arguments"));
    }
    let no_keys = || Reply::err("The command has no key arguments");
    // The name its key specification is under.
    let mut described = spec.name.to_owned();
    let keys: &[Bytes] = match spec.kind {
        _ if command::has_subcommands(spec.name) => {
            let Ok(sub) = command::check_subcommand(spec.name, command) else {
                return Err(
                    match command::SUBCOMMANDS.iter().any(|(c, s, _)| {
                        *c == spec.name && s.as_bytes() == command[1].to_ascii_lowercase()
                    }) {
                        true => invalid("number of arguments"),
                        false => Reply::err("Invalid command specified"),
                    },
                );
            };
            let on_stream =
                matches!(spec.name, "xgroup" | "xinfo") || (spec.name, sub) == ("memory", "usage");
            if sub == "help" || !on_stream {
                return Err(no_keys());
            }
            described = format!("{}|{sub}", spec.name);
            &command[2..3]
        }
        Kind::Stream(at) => &command[at..=at],
        Kind::Read => {
            // `STREAMS` searched from the first argument that may hold
            // it (after `GROUP g c` for a group read); the names are the
            // first half of what follows.
            let from = if spec.name == "xreadgroup" { 4 } else { 1 };
            let Some(at) = command
                .iter()
                .skip(from)
                .position(|a| a.eq_ignore_ascii_case(b"streams"))
                .map(|i| i + from + 1)
            else {
                return Err(invalid("arguments"));
            };
            let n = (command.len() - at) / 2;
            if n == 0 {
                return Err(invalid("arguments"));
            }
            &command[at..at + n]
        }
        Kind::Connection if matches!(spec.name, "del" | "exists" | "watch") => &command[1..],
        Kind::Connection if spec.name == "type" => &command[1..2],
        Kind::Connection => return Err(no_keys()),
    };
    let flags = command_meta::meta(&described)
        .and_then(|m| m.key_specs.first())
        .map_or(&[][..], |k| k.flags);
    Ok((keys, flags))
}

/// `COMMAND INFO`'s 10-element description of a command: its name and
/// arity, then Redis 7.0's flags, key positions, ACL categories, tips and
/// key specifications ([`crate::command_meta`]); a container's
/// subcommands, each described the same way.
fn command_info(spec: &command::Spec) -> Reply {
    let subcommands = command::has_subcommands(spec.name).then(|| {
        command::SUBCOMMANDS
            .iter()
            .filter(|(c, _, _)| *c == spec.name)
            .map(|&(c, s, arity)| info_reply(&format!("{c}|{s}"), arity, None))
            .collect()
    });
    info_reply(spec.name, spec.arity, subcommands)
}

/// `COMMAND INFO container|sub` (`xgroup|create`); `None` for a name the
/// broker has not.
fn subcommand_info(name: &[u8]) -> Option<Reply> {
    let name = std::str::from_utf8(name).ok()?.to_ascii_lowercase();
    let (container, sub) = name.split_once('|')?;
    let &(_, _, arity) = command::SUBCOMMANDS
        .iter()
        .find(|(c, s, _)| *c == container && *s == sub)?;
    Some(info_reply(&name, arity, None))
}

/// The description of `name` (a command, or `container|sub`) of `arity`,
/// with `subcommands` for a container. The sets are RESP3 sets where
/// Redis sends sets (flags, categories, tips, key specifications; a
/// command without subcommands an empty set), its subcommands an array.
fn info_reply(name: &str, arity: i32, subcommands: Option<Vec<Reply>>) -> Reply {
    let meta = command_meta::meta(name);
    let statuses =
        |words: &[&'static str]| Reply::Set(words.iter().map(|w| Reply::Status(w)).collect());
    let (first, last, step) = meta.map_or((0, 0, 0), |m| m.keys);
    Reply::Array(vec![
        Reply::bulk(name.to_owned()),
        Reply::Int(i64::from(arity)),
        statuses(meta.map_or(&[][..], |m| m.flags)),
        Reply::Int(first),
        Reply::Int(last),
        Reply::Int(step),
        statuses(meta.map_or(&[][..], |m| m.acl)),
        Reply::Set(
            meta.map_or(&[][..], |m| m.tips)
                .iter()
                .map(|t| Reply::bulk(*t))
                .collect(),
        ),
        Reply::Set(
            meta.map_or(&[][..], |m| m.key_specs)
                .iter()
                .map(key_spec_reply)
                .collect(),
        ),
        match subcommands {
            Some(infos) => Reply::Array(infos),
            None => Reply::Set(Vec::new()),
        },
    ])
}

/// A key specification as `COMMAND INFO` gives it: a map of its notes,
/// flags, where the search begins and how the keys are found.
fn key_spec_reply(spec: &command_meta::KeySpec) -> Reply {
    let text = |t: &'static str| Reply::bulk(t);
    let mut fields = Vec::with_capacity(4);
    if let Some(notes) = spec.notes {
        fields.push((text("notes"), text(notes)));
    }
    fields.push((
        text("flags"),
        Reply::Set(spec.flags.iter().map(|f| Reply::Status(f)).collect()),
    ));
    let begin = match spec.begin {
        command_meta::Begin::Index(i) => vec![
            (text("type"), text("index")),
            (
                text("spec"),
                Reply::Map(vec![(text("index"), Reply::Int(i))]),
            ),
        ],
        command_meta::Begin::Keyword { keyword, startfrom } => vec![
            (text("type"), text("keyword")),
            (
                text("spec"),
                Reply::Map(vec![
                    (text("keyword"), text(keyword)),
                    (text("startfrom"), Reply::Int(startfrom)),
                ]),
            ),
        ],
    };
    fields.push((text("begin_search"), Reply::Map(begin)));
    let find = &spec.find;
    fields.push((
        text("find_keys"),
        Reply::Map(vec![
            (text("type"), text("range")),
            (
                text("spec"),
                Reply::Map(vec![
                    (text("lastkey"), Reply::Int(find.lastkey)),
                    (text("keystep"), Reply::Int(find.keystep)),
                    (text("limit"), Reply::Int(find.limit)),
                ]),
            ),
        ]),
    ));
    Reply::Map(fields)
}

/// `COMMAND LIST [FILTERBY MODULE name | ACLCAT category | PATTERN
/// pattern]`: the names of the commands and subcommands (no module adds
/// any).
fn command_list(args: &[Bytes]) -> Reply {
    let names = COMMANDS.iter().map(|c| c.name.to_owned()).chain(
        command::SUBCOMMANDS
            .iter()
            .map(|(c, s, _)| format!("{c}|{s}")),
    );
    let keep: Box<dyn Fn(&str) -> bool> = match args {
        [] => Box::new(|_| true),
        [filterby, kind, value] if filterby.eq_ignore_ascii_case(b"filterby") => {
            match kind.to_ascii_lowercase().as_slice() {
                b"module" => Box::new(|_| false),
                b"aclcat" => {
                    let category = format!("@{}", String::from_utf8_lossy(value));
                    Box::new(move |name| {
                        command_meta::meta(name).is_some_and(|m| {
                            m.acl.iter().any(|c| c.eq_ignore_ascii_case(&category))
                        })
                    })
                }
                b"pattern" => {
                    let pattern = value.clone();
                    Box::new(move |name| glob_match(&pattern, name.as_bytes(), true))
                }
                _ => return command::syntax_error(),
            }
        }
        _ => return command::syntax_error(),
    };
    Reply::Array(names.filter(|n| keep(n)).map(Reply::bulk).collect())
}

/// Bytes as Redis's `*_human` fields write them (`1.50M`).
fn human_bytes(n: u64) -> String {
    const UNITS: [(&str, f64); 4] = [
        ("T", 1024.0 * 1024.0 * 1024.0 * 1024.0),
        ("G", 1024.0 * 1024.0 * 1024.0),
        ("M", 1024.0 * 1024.0),
        ("K", 1024.0),
    ];
    let x = n as f64;
    UNITS.iter().find(|(_, size)| x >= *size).map_or_else(
        || format!("{n}B"),
        |(unit, size)| format!("{:.2}{unit}", x / size),
    )
}
