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
    /// In the actor of the stream named by argument 1.
    Stream,
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
        kind: Kind::Stream,
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
    conn("info", -1),
    conn("del", -2),
    conn("exists", -2),
    conn("type", 2),
    conn("keys", 2),
    conn("scan", -2),
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
];

/// The table row of `name` (any case).
pub fn lookup(name: &[u8]) -> Option<&'static Spec> {
    COMMANDS
        .iter()
        .find(|s| s.name.as_bytes().eq_ignore_ascii_case(name))
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
pub fn unknown_command(args: &[Bytes]) -> Reply {
    let mut text = format!(
        "unknown command '{}', with args beginning with: ",
        printable(&args[0], 128)
    );
    for a in &args[1..] {
        text.push_str(&format!("'{}' ", printable(a, 128)));
    }
    Reply::err(text)
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

/// `ERR value is not an integer or out of range`.
pub fn not_an_integer() -> Reply {
    Reply::err("value is not an integer or out of range")
}

fn int_arg(arg: &[u8]) -> Result<i64, Reply> {
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
            let n = int_arg(&args[i])?;
            if n < 0 {
                return Err(Reply::err("The MAXLEN argument must be >= 0."));
            }
            if matches!(to, Some(TrimTo::MinId(_))) {
                return Err(maxlen_and_minid());
            }
            to = Some(TrimTo::MaxLen(n as u64));
            i += 1;
        } else if a.eq_ignore_ascii_case(b"minid") && more >= 1 {
            let (ap, at) = approx_flag(args, i + 1, more);
            approx = ap;
            i = at;
            let min = parse_id(&args[i], 0, false)?;
            if matches!(to, Some(TrimTo::MaxLen(_))) {
                return Err(maxlen_and_minid());
            }
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
    if xadd {
        let fields = args.len() - i;
        if id.is_none() || fields < 2 || fields % 2 == 1 {
            return Err(wrong_arity("xadd"));
        }
    } else if to.is_none() {
        return Err(syntax_error());
    }
    if limit.is_some() && !approx {
        return Err(Reply::err(
            "syntax error, LIMIT cannot be used without the special ~ option",
        ));
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

/// `XREAD [COUNT n] [BLOCK ms] STREAMS key [key ...] id [id ...]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadArgs {
    /// `COUNT` (`None` or 0: no limit).
    pub count: Option<u64>,
    /// `BLOCK` in milliseconds (0: forever).
    pub block: Option<u64>,
    /// The streams.
    pub keys: Vec<Bytes>,
    /// Where each read starts: `None` for `$`.
    pub ids: Vec<Option<StreamId>>,
}

/// The index of the first key after `STREAMS`, if the option is there.
pub fn streams_at(args: &[Bytes]) -> Option<usize> {
    let mut i = 1;
    while i < args.len() {
        if args[i].eq_ignore_ascii_case(b"streams") {
            return Some(i + 1);
        }
        i += if args[i].eq_ignore_ascii_case(b"count") || args[i].eq_ignore_ascii_case(b"block") {
            2
        } else {
            1
        };
    }
    None
}

/// Parses `XREAD`.
///
/// # Errors
///
/// Redis's error reply.
pub fn parse_xread(args: &[Bytes]) -> Result<ReadArgs, Reply> {
    let mut count = None;
    let mut block = None;
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
            block = Some(ms as u64);
            i += 2;
        } else if a.eq_ignore_ascii_case(b"streams") && more >= 1 {
            break i + 1;
        } else {
            return Err(syntax_error());
        }
    };
    let rest = &args[streams..];
    if rest.len() % 2 == 1 {
        return Err(Reply::err(
            "Unbalanced XREAD list of streams: for each stream key an ID or '$' must be specified.",
        ));
    }
    let (keys, ids) = rest.split_at(rest.len() / 2);
    let ids = ids
        .iter()
        .map(|id| match id.as_ref() {
            b"$" => Ok(None),
            b">" => Err(Reply::err(
                "The > ID can be specified only when calling XREADGROUP using the GROUP <group> <consumer> option.",
            )),
            _ => parse_id(id, 0, true).map(Some),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ReadArgs {
        count,
        block,
        keys: keys.to_vec(),
        ids,
    })
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
    fn table_lookup_ignores_case_and_checks_arity() {
        let spec = lookup(b"XaDd").unwrap();
        assert_eq!(spec.name, "xadd");
        assert!(!arity_ok(spec, 4));
        assert!(arity_ok(spec, 5));
        assert!(arity_ok(lookup(b"xlen").unwrap(), 2));
        assert!(!arity_ok(lookup(b"xlen").unwrap(), 3));
        assert_eq!(
            unknown_command(&a(&["FOO", "a", "b"])),
            Reply::err("unknown command 'FOO', with args beginning with: 'a' 'b' ")
        );
    }
}
