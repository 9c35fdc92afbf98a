//! The command table (names, arities, which argument is the key) and the
//! argument parsing of the stream commands, with Redis's error texts.

use bytes::Bytes;

use crate::id::{parse_id, parse_range, AddId, StreamId};
use crate::resp::{parse_int, Reply};
use crate::stream::{Trim, TrimTo};

/// Where a command runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// On the connection's session (no stream, or only the catalog).
    Connection,
    /// In the actor of the stream named by this argument.
    Stream(usize),
    /// On the session, asking the actors of the streams after `STREAMS`.
    Read,
}

/// One command-table row.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// Lower-case name, as error texts show it.
    pub name: &'static str,
    /// Redis's arity: `n` exactly n arguments with the name, `-n` at least n.
    pub arity: i32,
    /// Where it runs.
    pub kind: Kind,
}

/// Whether a command changes a stream (Redis flags it `write`): what a
/// log that takes no appends refuses. `XGROUP HELP` only reads.
pub fn writes(args: &[Bytes]) -> bool {
    let Some(spec) = lookup(&args[0]) else {
        return false;
    };
    match spec.name {
        "xgroup" => !args.get(1).is_some_and(|s| s.eq_ignore_ascii_case(b"help")),
        name => is_write_command(name),
    }
}

/// Whether the command called `name` (lower case) is flagged `write`.
pub fn is_write_command(name: &str) -> bool {
    matches!(
        name,
        "xadd"
            | "xtrim"
            | "xdel"
            | "xack"
            | "xclaim"
            | "xautoclaim"
            | "xsetid"
            | "xgroup"
            | "xreadgroup"
            | "del"
    )
}

const fn conn(name: &'static str, arity: i32) -> Spec {
    Spec {
        name,
        arity,
        kind: Kind::Connection,
    }
}

const fn stream(name: &'static str, arity: i32) -> Spec {
    Spec {
        name,
        arity,
        kind: Kind::Stream(1),
    }
}

/// A command with a subcommand before its key (`XGROUP CREATE key ...`).
const fn stream_sub(name: &'static str, arity: i32) -> Spec {
    Spec {
        name,
        arity,
        kind: Kind::Stream(2),
    }
}

/// Every command the broker knows.
pub const COMMANDS: &[Spec] = &[
    conn("ping", -1),
    conn("echo", 2),
    conn("hello", -1),
    conn("auth", -2),
    conn("client", -2),
    conn("select", 2),
    conn("quit", -1),
    conn("command", -1),
    conn("config", -2),
    conn("latency", -2),
    conn("info", -1),
    conn("del", -2),
    conn("exists", -2),
    conn("type", 2),
    conn("keys", 2),
    conn("dbsize", 1),
    conn("time", 1),
    conn("scan", -2),
    conn("multi", 1),
    conn("exec", 1),
    conn("discard", 1),
    conn("watch", -2),
    conn("unwatch", 1),
    conn("reset", 1),
    conn("shutdown", -1),
    stream("xadd", -5),
    stream("xlen", 2),
    stream("xrange", -4),
    stream("xrevrange", -4),
    stream("xdel", -3),
    stream("xtrim", -4),
    Spec {
        name: "xread",
        arity: -4,
        kind: Kind::Read,
    },
    Spec {
        name: "xreadgroup",
        arity: -7,
        kind: Kind::Read,
    },
    stream_sub("xgroup", -2),
    stream_sub("xinfo", -2),
    stream_sub("memory", -2),
    stream("xack", -4),
    stream("xpending", -3),
    stream("xclaim", -6),
    stream("xautoclaim", -6),
    stream("xsetid", -3),
];

/// Subcommands of `XGROUP` and `XINFO` with their arities (name included).
pub const SUBCOMMANDS: &[(&str, &str, i32)] = &[
    ("xgroup", "create", -5),
    ("xgroup", "setid", -5),
    ("xgroup", "destroy", 4),
    ("xgroup", "createconsumer", 5),
    ("xgroup", "delconsumer", 5),
    ("xgroup", "help", 2),
    ("xinfo", "stream", -3),
    ("xinfo", "groups", 3),
    ("xinfo", "consumers", 4),
    ("xinfo", "help", 2),
    ("memory", "usage", -3),
    ("memory", "help", 2),
    ("client", "id", 2),
    ("client", "getname", 2),
    ("client", "setname", 3),
    ("client", "info", 2),
    ("client", "no-evict", 3),
    ("client", "help", 2),
    ("client", "list", -2),
    ("client", "kill", -3),
    ("client", "unblock", -3),
    ("client", "reply", 3),
    // Redis 7.2's, taken because redis-py 5 sends it.
    ("client", "setinfo", 4),
    ("config", "get", -3),
    ("config", "resetstat", 2),
    ("config", "help", 2),
    ("latency", "doctor", 2),
    ("latency", "graph", 3),
    ("latency", "help", 2),
    ("latency", "histogram", -2),
    ("latency", "history", 3),
    ("latency", "latest", 2),
    ("latency", "reset", -2),
    ("command", "count", 2),
    ("command", "help", 2),
    ("command", "docs", -2),
    ("command", "info", -2),
    ("command", "getkeys", -4),
    ("command", "getkeysandflags", -4),
    ("command", "list", -2),
];

/// Whether a command is a container of subcommands (checked, with their
/// arity, before authentication and as they are queued in `MULTI`).
pub fn has_subcommands(command: &str) -> bool {
    matches!(
        command,
        "xgroup" | "xinfo" | "memory" | "client" | "config" | "command" | "latency"
    )
}

/// Checks a command's subcommand: `Ok` when it exists and its arity fits.
///
/// # Errors
///
/// Redis's unknown-subcommand or wrong-arity error.
pub fn check_subcommand(command: &str, args: &[Bytes]) -> Result<&'static str, Reply> {
    let sub = args[1].to_ascii_lowercase();
    let Some((_, name, arity)) = SUBCOMMANDS
        .iter()
        .find(|(c, s, _)| *c == command && s.as_bytes() == sub.as_slice())
    else {
        return Err(unknown_subcommand(command, &args[1]));
    };
    let argc = args.len() as i64;
    let ok = if *arity >= 0 {
        argc == i64::from(*arity)
    } else {
        argc >= -i64::from(*arity)
    };
    if !ok {
        return Err(wrong_arity(&format!("{command}|{name}")));
    }
    Ok(name)
}

/// Buckets of [`COMMAND_INDEX`].
const COMMAND_BUCKETS: usize = 64;

/// Rows per bucket of [`COMMAND_INDEX`].
const BUCKET_ROWS: usize = 2;

/// An empty place in a bucket.
const NO_ROW: u8 = u8::MAX;

/// The bucket of a command name, from its length and its first and last
/// bytes with the ASCII case bit set (letters in either case meet; other
/// bytes land anywhere, and the name comparison rejects them).
const fn command_bucket(name: &[u8]) -> Option<usize> {
    let (Some(first), Some(last)) = (name.first(), name.last()) else {
        return None;
    };
    let len = name.len().wrapping_mul(5);
    Some((len + (*first | 0x20) as usize * 3 + (*last | 0x20) as usize * 3) % COMMAND_BUCKETS)
}

/// [`COMMANDS`]' rows by [`command_bucket`]: a lookup compares at most
/// [`BUCKET_ROWS`] names, where a scan of the table compared every name of
/// the same length before the one wanted (about 300 instructions an
/// `XADD`, the most of any step of parsing it). Built at compile time; a row
/// that would make a bucket overflow stops the build.
const COMMAND_INDEX: [[u8; BUCKET_ROWS]; COMMAND_BUCKETS] = {
    assert!(COMMANDS.len() < NO_ROW as usize);
    let mut index = [[NO_ROW; BUCKET_ROWS]; COMMAND_BUCKETS];
    let mut row = 0;
    while row < COMMANDS.len() {
        let name = COMMANDS[row].name.as_bytes();
        let mut i = 0;
        while i < name.len() {
            // What lets `lookup` compare with `| 0x20`.
            assert!(name[i].is_ascii_lowercase(), "a command name not in a-z");
            i += 1;
        }
        let Some(bucket) = command_bucket(name) else {
            panic!("a command with an empty name");
        };
        let mut place = 0;
        while index[bucket][place] != NO_ROW {
            place += 1;
            assert!(
                place < BUCKET_ROWS,
                "command bucket overflow: change command_bucket's factors"
            );
        }
        index[bucket][place] = row as u8;
        row += 1;
    }
    index
};

/// The table row of `name` (any case).
pub fn lookup(name: &[u8]) -> Option<&'static Spec> {
    lookup_row(name).map(|row| &COMMANDS[row])
}

/// The index in [`COMMANDS`] of `name` (any case).
pub fn lookup_row(name: &[u8]) -> Option<usize> {
    let bucket = &COMMAND_INDEX[command_bucket(name)?];
    bucket
        .iter()
        .take_while(|&&row| row != NO_ROW)
        .map(|&row| usize::from(row))
        .find(|&row| {
            // Table names are a-z only, and the bytes that give one of
            // them with the case bit set are exactly its two cases.
            let s = COMMANDS[row].name;
            s.len() == name.len() && s.bytes().zip(name).all(|(t, &b)| b | 0x20 == t)
        })
}

/// Whether `args` (name included) fit the arity.
pub fn arity_ok(spec: &Spec, argc: usize) -> bool {
    let argc = argc as i64;
    let arity = i64::from(spec.arity);
    if arity >= 0 {
        argc == arity
    } else {
        argc >= -arity
    }
}

/// `ERR wrong number of arguments for '<name>' command`.
pub fn wrong_arity(name: &str) -> Reply {
    Reply::err(format!("wrong number of arguments for '{name}' command"))
}

/// Redis's reply to a command it does not know.
///
/// As Redis formats it: each argument as a C string (up to a NUL), the
/// name cut at 128 bytes, and arguments added while the list is under 128
/// bytes, each cut to the room left.
pub fn unknown_command(args: &[Bytes]) -> Reply {
    let mut list: Vec<u8> = Vec::new();
    for a in &args[1..] {
        if list.len() >= 128 {
            break;
        }
        let room = 128 - list.len();
        list.push(b'\'');
        list.extend_from_slice(&c_string(a)[..c_string(a).len().min(room)]);
        list.extend_from_slice(b"' ");
    }
    let name = c_string(&args[0]);
    Reply::error_bytes(&[
        b"ERR unknown command '",
        &name[..name.len().min(128)],
        b"', with args beginning with: ",
        &list,
    ])
}

/// Redis's reply to a subcommand of `command` it does not know.
pub fn unknown_subcommand(command: &str, sub: &[u8]) -> Reply {
    subcommand_error(b"ERR unknown subcommand '", command, sub)
}

/// `<opening>'<sub>'. Try <COMMAND> HELP.`, the subcommand as the client
/// sent it, cut at 128 bytes and at a NUL.
fn subcommand_error(opening: &[u8], command: &str, sub: &[u8]) -> Reply {
    let sub = c_string(sub);
    Reply::error_bytes(&[
        opening,
        &sub[..sub.len().min(128)],
        b"'. Try ",
        command.to_ascii_uppercase().as_bytes(),
        b" HELP.",
    ])
}

/// An argument as C's string functions see it: up to its first NUL.
pub fn c_string(arg: &[u8]) -> &[u8] {
    &arg[..arg.iter().position(|&b| b == 0).unwrap_or(arg.len())]
}

/// An argument shown in an error text: at most `max` bytes, lossy UTF-8,
/// line ends replaced so the error stays one line.
pub fn printable(arg: &[u8], max: usize) -> String {
    let cut = &arg[..arg.len().min(max)];
    String::from_utf8_lossy(cut).replace(['\r', '\n'], " ")
}

/// `ERR syntax error`.
pub fn syntax_error() -> Reply {
    Reply::err("syntax error")
}

/// Redis's reply to a known subcommand given the wrong arguments in a
/// way its own handler checks (`addReplySubcommandSyntaxError`).
pub fn subcommand_syntax_error(command: &str, sub: &[u8]) -> Reply {
    subcommand_error(
        b"ERR unknown subcommand or wrong number of arguments for '",
        command,
        sub,
    )
}

/// `ERR value is not an integer or out of range`.
pub fn not_an_integer() -> Reply {
    Reply::err("value is not an integer or out of range")
}

pub(crate) fn int_arg(arg: &[u8]) -> Result<i64, Reply> {
    parse_int(arg).ok_or_else(not_an_integer)
}

/// `XADD`'s and `XTRIM`'s shared options, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddArgs {
    /// `NOMKSTREAM`.
    pub no_mkstream: bool,
    /// `MAXLEN` / `MINID`, with `~` and `LIMIT`.
    pub trim: Option<Trim>,
    /// The id argument.
    pub id: AddId,
    /// Index of the first field in the arguments.
    pub fields_at: usize,
}

/// Parses `XADD key [NOMKSTREAM] [MAXLEN|MINID [=|~] threshold [LIMIT n]]
/// id field value [field value ...]` (`xadd`) or `XTRIM key MAXLEN|MINID
/// [=|~] threshold [LIMIT n]`.
///
/// # Errors
///
/// Redis's error reply for the first bad argument.
pub fn parse_add_or_trim(args: &[Bytes], xadd: bool) -> Result<AddArgs, Reply> {
    let mut i = 2;
    let mut no_mkstream = false;
    let mut to: Option<TrimTo> = None;
    let mut approx = false;
    let mut limit: Option<i64> = None;
    let mut id = None;
    while i < args.len() {
        let more = args.len() - i - 1;
        let a = &args[i];
        if xadd && a.as_ref() == b"*" {
            // The id: fields follow.
            id = Some(AddId::Auto);
            i += 1;
            break;
        } else if a.eq_ignore_ascii_case(b"maxlen") && more >= 1 {
            let (ap, at) = approx_flag(args, i + 1, more);
            approx = ap;
            i = at;
            if to.is_some() {
                return Err(maxlen_and_minid());
            }
            let n = int_arg(&args[i])?;
            if n < 0 {
                return Err(Reply::err("The MAXLEN argument must be >= 0."));
            }
            to = Some(TrimTo::MaxLen(n as u64));
            i += 1;
        } else if a.eq_ignore_ascii_case(b"minid") && more >= 1 {
            let (ap, at) = approx_flag(args, i + 1, more);
            approx = ap;
            i = at;
            if to.is_some() {
                return Err(maxlen_and_minid());
            }
            let min = parse_id(&args[i], 0, true)?;
            to = Some(TrimTo::MinId(min));
            i += 1;
        } else if a.eq_ignore_ascii_case(b"limit") && more >= 1 {
            let n = int_arg(&args[i + 1])?;
            if n < 0 {
                return Err(Reply::err("The LIMIT argument must be >= 0."));
            }
            limit = Some(n);
            i += 2;
        } else if xadd && a.eq_ignore_ascii_case(b"nomkstream") {
            no_mkstream = true;
            i += 1;
        } else if xadd {
            id = Some(AddId::parse(a)?);
            i += 1;
            break;
        } else {
            return Err(syntax_error());
        }
    }
    if limit.is_some_and(|l| l != 0) && to.is_none() {
        return Err(Reply::err(
            "syntax error, LIMIT cannot be used without specifying a trimming strategy",
        ));
    }
    if !xadd && to.is_none() {
        return Err(Reply::err(
            "syntax error, XTRIM must be called with a trimming strategy",
        ));
    }
    if limit.is_some() && !approx {
        return Err(Reply::err(
            "syntax error, LIMIT cannot be used without the special ~ option",
        ));
    }
    if xadd {
        let fields = args.len() - i;
        if id.is_none() || fields < 2 || fields % 2 == 1 {
            return Err(wrong_arity("xadd"));
        }
    }
    if let Some(AddId::Explicit(StreamId { ms: 0, seq: 0 })) = id {
        return Err(Reply::err(
            "The ID specified in XADD must be greater than 0-0",
        ));
    }
    Ok(AddArgs {
        no_mkstream,
        trim: to.map(|to| Trim {
            to,
            approx,
            limit: limit.map(|n| n as u64),
        }),
        id: id.unwrap_or(AddId::Auto),
        fields_at: i,
    })
}

fn maxlen_and_minid() -> Reply {
    Reply::err("syntax error, MAXLEN and MINID options at the same time are not compatible")
}

/// `=` or `~` after `MAXLEN`/`MINID`: whether it was `~`, and the index of
/// the threshold.
fn approx_flag(args: &[Bytes], at: usize, more: usize) -> (bool, usize) {
    if more >= 2 {
        match args[at].as_ref() {
            b"~" => return (true, at + 1),
            b"=" => return (false, at + 1),
            _ => {}
        }
    }
    (false, at)
}

/// `XRANGE key start end [COUNT n]` (for `XREVRANGE`, `end start`): the
/// inclusive bounds and the count (`None`: all).
///
/// # Errors
///
/// Redis's error reply.
pub fn parse_range_args(
    args: &[Bytes],
    rev: bool,
) -> Result<(StreamId, StreamId, Option<u64>), Reply> {
    let (start, end) = if rev {
        (&args[3], &args[2])
    } else {
        (&args[2], &args[3])
    };
    let (lo, hi) = parse_range(start, end)?;
    let mut count = None;
    let mut i = 4;
    while i < args.len() {
        if args[i].eq_ignore_ascii_case(b"count") && i + 1 < args.len() {
            let n = int_arg(&args[i + 1])?;
            count = Some(n.max(0) as u64);
            i += 2;
        } else {
            return Err(syntax_error());
        }
    }
    Ok((lo, hi, count))
}

/// `XREAD [COUNT n] [BLOCK ms] STREAMS key [key ...] id [id ...]`, or
/// `XREADGROUP GROUP group consumer [COUNT n] [BLOCK ms] [NOACK] STREAMS ...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadArgs {
    /// `COUNT` (`None` or 0: no limit).
    pub count: Option<u64>,
    /// `BLOCK` in milliseconds (0: forever).
    pub block: Option<u64>,
    /// `GROUP group consumer` (`XREADGROUP`).
    pub group: Option<(Bytes, Bytes)>,
    /// `NOACK` (`XREADGROUP`).
    pub noack: bool,
    /// The streams.
    pub keys: Vec<Bytes>,
    /// Where each read starts, as given (`$`, `>` or an id).
    pub ids: Vec<Bytes>,
}

/// The index of the first key after `STREAMS`, if the option is there.
pub fn streams_at(args: &[Bytes]) -> Option<usize> {
    let mut i = 1;
    while i < args.len() {
        let a = &args[i];
        if a.eq_ignore_ascii_case(b"streams") {
            return Some(i + 1);
        }
        i += if a.eq_ignore_ascii_case(b"count") || a.eq_ignore_ascii_case(b"block") {
            2
        } else if a.eq_ignore_ascii_case(b"group") {
            3
        } else {
            1
        };
    }
    None
}

/// Parses `XREAD` or (with `xreadgroup`) `XREADGROUP`'s options; the ids
/// are checked by the caller, after the groups, as Redis orders it.
///
/// # Errors
///
/// Redis's error reply.
pub fn parse_read(args: &[Bytes], xreadgroup: bool) -> Result<ReadArgs, Reply> {
    let mut count = None;
    let mut block = None;
    let mut group = None;
    let mut noack = false;
    let mut i = 1;
    let streams = loop {
        if i >= args.len() {
            return Err(syntax_error());
        }
        let more = args.len() - i - 1;
        let a = &args[i];
        if a.eq_ignore_ascii_case(b"count") && more >= 1 {
            let n = int_arg(&args[i + 1])?;
            count = (n > 0).then_some(n as u64);
            i += 2;
        } else if a.eq_ignore_ascii_case(b"block") && more >= 1 {
            let ms = parse_int(&args[i + 1])
                .ok_or_else(|| Reply::err("timeout is not an integer or out of range"))?;
            if ms < 0 {
                return Err(Reply::err("timeout is negative"));
            }
            // Redis 7.0 takes any timeout up to `i64::MAX` (and blocks).
            block = Some(ms as u64);
            i += 2;
        } else if a.eq_ignore_ascii_case(b"streams") && more >= 1 {
            break i + 1;
        } else if a.eq_ignore_ascii_case(b"group") && more >= 2 {
            if !xreadgroup {
                return Err(Reply::err(
                    "The GROUP option is only supported by XREADGROUP. You called XREAD instead.",
                ));
            }
            group = Some((args[i + 1].clone(), args[i + 2].clone()));
            i += 3;
        } else if a.eq_ignore_ascii_case(b"noack") {
            if !xreadgroup {
                return Err(Reply::err(
                    "The NOACK option is only supported by XREADGROUP. You called XREAD instead.",
                ));
            }
            noack = true;
            i += 1;
        } else {
            return Err(syntax_error());
        }
    };
    let rest = &args[streams..];
    if rest.len() % 2 == 1 {
        // Redis 7.0 names XREAD here for XREADGROUP too.
        return Err(Reply::err(
            "Unbalanced XREAD list of streams: for each stream key an ID or '$' must be specified.",
        ));
    }
    if xreadgroup && group.is_none() {
        return Err(Reply::err("Missing GROUP option for XREADGROUP"));
    }
    let (keys, ids) = rest.split_at(rest.len() / 2);
    Ok(ReadArgs {
        count,
        block,
        group,
        noack,
        keys: keys.to_vec(),
        ids: ids.to_vec(),
    })
}

/// An `XREAD` id: `None` for `$`.
///
/// # Errors
///
/// `>` (a group's), or an invalid id.
pub fn xread_id(arg: &[u8]) -> Result<Option<StreamId>, Reply> {
    match arg {
        b"$" => Ok(None),
        b">" => Err(Reply::err(
            "The > ID can be specified only when calling XREADGROUP using the GROUP <group> <consumer> option.",
        )),
        _ => parse_id(arg, 0, true).map(Some),
    }
}

/// An `XREADGROUP` id: `None` for `>` (and for the last possible id,
/// which Redis reads as `>`).
///
/// # Errors
///
/// `$` (meaningless for a group), or an invalid id.
pub fn xreadgroup_id(arg: &[u8]) -> Result<Option<StreamId>, Reply> {
    match arg {
        b">" => Ok(None),
        b"$" => Err(Reply::err(
            "The $ ID is meaningless in the context of XREADGROUP: you want to read the history of this consumer by specifying a proper ID, or use the > ID to get new messages. The $ ID would just return an empty result set.",
        )),
        // Redis holds `>` as the last possible id, so that id given
        // explicitly reads new entries as `>` does.
        _ => parse_id(arg, 0, true).map(|id| (id != StreamId::MAX).then_some(id)),
    }
}

/// The ids of `XDEL key id [id ...]`.
///
/// # Errors
///
/// An invalid id (Redis checks them all before deleting any).
pub fn parse_ids(args: &[Bytes]) -> Result<Vec<StreamId>, Reply> {
    args.iter().map(|a| parse_id(a, 0, true)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(v: &[&str]) -> Vec<Bytes> {
        v.iter()
            .map(|s| Bytes::copy_from_slice(s.as_bytes()))
            .collect()
    }

    #[test]
    fn xadd_options_parse_in_any_order_before_the_id() {
        let p = parse_add_or_trim(
            &a(&[
                "XADD",
                "s",
                "NOMKSTREAM",
                "MAXLEN",
                "~",
                "10",
                "LIMIT",
                "5",
                "7-*",
                "f",
                "v",
            ]),
            true,
        )
        .unwrap();
        assert!(p.no_mkstream);
        assert_eq!(
            p.trim,
            Some(Trim {
                to: TrimTo::MaxLen(10),
                approx: true,
                limit: Some(5)
            })
        );
        assert_eq!(p.id, AddId::Partial(7));
        assert_eq!(p.fields_at, 9);
    }

    #[test]
    fn xadd_errors_are_redis_texts() {
        let err = |v: &[&str]| parse_add_or_trim(&a(v), true).unwrap_err();
        assert_eq!(err(&["XADD", "s", "*", "f"]), wrong_arity("xadd"));
        assert_eq!(
            err(&["XADD", "s", "0-0", "f", "v"]),
            Reply::err("The ID specified in XADD must be greater than 0-0")
        );
        assert_eq!(
            err(&["XADD", "s", "MAXLEN", "-1", "*", "f", "v"]),
            Reply::err("The MAXLEN argument must be >= 0.")
        );
        assert_eq!(
            err(&["XADD", "s", "MAXLEN", "x", "*", "f", "v"]),
            not_an_integer()
        );
        assert_eq!(
            err(&["XADD", "s", "MAXLEN", "1", "LIMIT", "1", "*", "f", "v"]),
            Reply::err("syntax error, LIMIT cannot be used without the special ~ option")
        );
        assert_eq!(
            err(&["XADD", "s", "MAXLEN", "1", "MINID", "1", "*", "f", "v"]),
            Reply::err(
                "syntax error, MAXLEN and MINID options at the same time are not compatible"
            )
        );
    }

    #[test]
    fn every_command_is_found_in_any_case_and_nothing_else_is() {
        for spec in COMMANDS {
            let upper = spec.name.to_ascii_uppercase();
            let mixed: String = spec
                .name
                .chars()
                .enumerate()
                .map(|(i, c)| {
                    if i % 2 == 0 {
                        c.to_ascii_uppercase()
                    } else {
                        c
                    }
                })
                .collect();
            for name in [spec.name, &upper, &mixed] {
                let found = lookup(name.as_bytes()).map(|s| s.name);
                assert_eq!(found, Some(spec.name), "{name}");
            }
            // One byte more, one less, one changed, the first letter made
            // a control byte with the same low bits: none of them is a
            // command unless the table has it.
            let mut longer = spec.name.as_bytes().to_vec();
            longer.push(b'x');
            let shorter = &spec.name.as_bytes()[..spec.name.len() - 1];
            let mut changed = spec.name.as_bytes().to_vec();
            changed[1] ^= 0x01;
            let mut twin = spec.name.as_bytes().to_vec();
            twin[0] &= 0x1f;
            for name in [&longer[..], shorter, &changed, &twin] {
                assert!(
                    lookup(name).is_none_or(|s| s.name.as_bytes() == name),
                    "{:?}",
                    String::from_utf8_lossy(name)
                );
            }
        }
        for name in [&b""[..], b"x", b"\0", b"xadd\0", &[0xff; 300]] {
            assert!(lookup(name).is_none());
        }
    }

    #[test]
    fn table_lookup_ignores_case_and_checks_arity() {
        let spec = lookup(b"XaDd").unwrap();
        assert_eq!(spec.name, "xadd");
        assert!(!arity_ok(spec, 4));
        assert!(arity_ok(spec, 5));
        assert!(arity_ok(lookup(b"xlen").unwrap(), 2));
        assert!(!arity_ok(lookup(b"xlen").unwrap(), 3));
        let text = |r: Reply| match r {
            Reply::ErrorBytes(b) => String::from_utf8_lossy(&b).into_owned(),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            text(unknown_command(&a(&["FOO", "a", "b"]))),
            "ERR unknown command 'FOO', with args beginning with: 'a' 'b' "
        );
        // Arguments while the list is under 128 bytes, each cut to the
        // room left; names and arguments end at a NUL.
        let many: Vec<&str> = std::iter::once("FOO").chain(["a"; 40]).collect();
        let listed = text(unknown_command(&a(&many)));
        assert_eq!(listed.matches("'a' ").count(), 32, "{listed}");
        let long = "x".repeat(200);
        assert_eq!(
            text(unknown_command(&a(&["FOO", "ab", &long, "c"]))),
            format!(
                "ERR unknown command 'FOO', with args beginning with: 'ab' '{}' ",
                "x".repeat(123)
            )
        );
        assert_eq!(
            text(unknown_command(&a(&["EX\0STS", "k\0ey"]))),
            "ERR unknown command 'EX', with args beginning with: 'k' "
        );
        // Bytes that are not UTF-8 are echoed as sent.
        assert_eq!(
            unknown_command(&[Bytes::from_static(b"F\xff"), Bytes::from_static(b"\xfe")]),
            Reply::ErrorBytes(Bytes::from_static(
                b"ERR unknown command 'F\xff', with args beginning with: '\xfe' "
            ))
        );
    }
}
