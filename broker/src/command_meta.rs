//! What `COMMAND INFO` says of each command beyond its name and arity:
//! Redis's flags, key positions, ACL categories, tips and key
//! specifications for the commands and subcommands the broker has, as
//! redis-server 7.0.15's own `COMMAND INFO` gives them (`client|setinfo`,
//! which 7.2 added, as 7.2 gives it). Cluster-aware clients and proxies
//! route and classify by these (`readonly`, `movablekeys`, the key
//! specifications), so they are Redis's facts, not a reading of them.

/// One command's (or `container|sub`'s) description.
#[derive(Debug)]
pub(crate) struct Meta {
    /// Lower-case name, `container|sub` for a subcommand.
    pub(crate) name: &'static str,
    pub(crate) flags: &'static [&'static str],
    /// First key, last key (negative: from the end), step.
    pub(crate) keys: (i64, i64, i64),
    /// ACL categories.
    pub(crate) acl: &'static [&'static str],
    pub(crate) tips: &'static [&'static str],
    pub(crate) key_specs: &'static [KeySpec],
}

/// Where a command's keys are, and what it does with them.
#[derive(Debug)]
pub(crate) struct KeySpec {
    pub(crate) notes: Option<&'static str>,
    /// `RW`, `RO`, `RM`, ... and what happens to the key.
    pub(crate) flags: &'static [&'static str],
    pub(crate) begin: Begin,
    pub(crate) find: Range,
}

/// Where the search for the keys begins.
#[derive(Debug)]
pub(crate) enum Begin {
    /// At this argument.
    Index(i64),
    /// After this keyword, searched for from argument `startfrom`.
    Keyword {
        keyword: &'static str,
        startfrom: i64,
    },
}

/// Which arguments from there are keys: up to `lastkey` (negative: from
/// the end), every `keystep`-th; with `limit` > 1, that fraction of what
/// is left.
#[derive(Debug)]
pub(crate) struct Range {
    pub(crate) lastkey: i64,
    pub(crate) keystep: i64,
    pub(crate) limit: i64,
}

/// The description of `name` (lower case; `container|sub`).
pub(crate) fn meta(name: &str) -> Option<&'static Meta> {
    META.iter().find(|m| m.name == name)
}

#[rustfmt::skip]
const META: &[Meta] = &[
    Meta { name: "ping", flags: &["fast"], keys: (0, 0, 0), acl: &["@fast", "@connection"], tips: &["request_policy:all_shards", "response_policy:all_succeeded"], key_specs: &[] },
    Meta { name: "echo", flags: &["loading", "stale", "fast"], keys: (0, 0, 0), acl: &["@fast", "@connection"], tips: &[], key_specs: &[] },
    Meta { name: "hello", flags: &["noscript", "loading", "stale", "fast", "no_auth", "allow_busy"], keys: (0, 0, 0), acl: &["@fast", "@connection"], tips: &[], key_specs: &[] },
    Meta { name: "auth", flags: &["noscript", "loading", "stale", "fast", "no_auth", "allow_busy"], keys: (0, 0, 0), acl: &["@fast", "@connection"], tips: &[], key_specs: &[] },
    Meta { name: "client", flags: &[], keys: (0, 0, 0), acl: &["@slow"], tips: &[], key_specs: &[] },
    Meta { name: "select", flags: &["loading", "stale", "fast"], keys: (0, 0, 0), acl: &["@fast", "@connection"], tips: &[], key_specs: &[] },
    Meta { name: "quit", flags: &["noscript", "loading", "stale", "fast", "no_auth", "allow_busy"], keys: (0, 0, 0), acl: &["@fast", "@connection"], tips: &[], key_specs: &[] },
    Meta { name: "command", flags: &["loading", "stale"], keys: (0, 0, 0), acl: &["@slow", "@connection"], tips: &["nondeterministic_output_order"], key_specs: &[] },
    Meta { name: "config", flags: &[], keys: (0, 0, 0), acl: &["@slow"], tips: &[], key_specs: &[] },
    Meta { name: "latency", flags: &[], keys: (0, 0, 0), acl: &["@slow"], tips: &[], key_specs: &[] },
    Meta { name: "info", flags: &["loading", "stale"], keys: (0, 0, 0), acl: &["@slow", "@dangerous"], tips: &["nondeterministic_output", "request_policy:all_shards", "response_policy:special"], key_specs: &[] },
    Meta { name: "del", flags: &["write"], keys: (1, -1, 1), acl: &["@keyspace", "@write", "@slow"], tips: &["request_policy:multi_shard", "response_policy:agg_sum"], key_specs: &[KeySpec { notes: None, flags: &["RM", "delete"], begin: Begin::Index(1), find: Range { lastkey: -1, keystep: 1, limit: 0 } }] },
    Meta { name: "exists", flags: &["readonly", "fast"], keys: (1, -1, 1), acl: &["@keyspace", "@read", "@fast"], tips: &["request_policy:multi_shard", "response_policy:agg_sum"], key_specs: &[KeySpec { notes: None, flags: &["RO"], begin: Begin::Index(1), find: Range { lastkey: -1, keystep: 1, limit: 0 } }] },
    Meta { name: "type", flags: &["readonly", "fast"], keys: (1, 1, 1), acl: &["@keyspace", "@read", "@fast"], tips: &[], key_specs: &[KeySpec { notes: None, flags: &["RO"], begin: Begin::Index(1), find: Range { lastkey: 0, keystep: 1, limit: 0 } }] },
    Meta { name: "keys", flags: &["readonly"], keys: (0, 0, 0), acl: &["@keyspace", "@read", "@slow", "@dangerous"], tips: &["request_policy:all_shards", "nondeterministic_output_order"], key_specs: &[] },
    Meta { name: "dbsize", flags: &["readonly", "fast"], keys: (0, 0, 0), acl: &["@keyspace", "@read", "@fast"], tips: &["request_policy:all_shards", "response_policy:agg_sum"], key_specs: &[] },
    Meta { name: "time", flags: &["loading", "stale", "fast"], keys: (0, 0, 0), acl: &["@fast"], tips: &["nondeterministic_output"], key_specs: &[] },
    Meta { name: "scan", flags: &["readonly"], keys: (0, 0, 0), acl: &["@keyspace", "@read", "@slow"], tips: &["nondeterministic_output", "request_policy:special"], key_specs: &[] },
    Meta { name: "multi", flags: &["noscript", "loading", "stale", "fast", "allow_busy"], keys: (0, 0, 0), acl: &["@fast", "@transaction"], tips: &[], key_specs: &[] },
    Meta { name: "exec", flags: &["noscript", "loading", "stale", "skip_slowlog"], keys: (0, 0, 0), acl: &["@slow", "@transaction"], tips: &[], key_specs: &[] },
    Meta { name: "discard", flags: &["noscript", "loading", "stale", "fast", "allow_busy"], keys: (0, 0, 0), acl: &["@fast", "@transaction"], tips: &[], key_specs: &[] },
    Meta { name: "watch", flags: &["noscript", "loading", "stale", "fast", "allow_busy"], keys: (1, -1, 1), acl: &["@fast", "@transaction"], tips: &[], key_specs: &[KeySpec { notes: None, flags: &["RO"], begin: Begin::Index(1), find: Range { lastkey: -1, keystep: 1, limit: 0 } }] },
    Meta { name: "unwatch", flags: &["noscript", "loading", "stale", "fast", "allow_busy"], keys: (0, 0, 0), acl: &["@fast", "@transaction"], tips: &[], key_specs: &[] },
    Meta { name: "reset", flags: &["noscript", "loading", "stale", "fast", "no_auth", "allow_busy"], keys: (0, 0, 0), acl: &["@fast", "@connection"], tips: &[], key_specs: &[] },
    Meta { name: "shutdown", flags: &["admin", "noscript", "loading", "stale", "no_multi", "allow_busy"], keys: (0, 0, 0), acl: &["@admin", "@slow", "@dangerous"], tips: &[], key_specs: &[] },
    Meta { name: "xadd", flags: &["write", "denyoom", "fast"], keys: (1, 1, 1), acl: &["@write", "@stream", "@fast"], tips: &["nondeterministic_output"], key_specs: &[KeySpec { notes: Some("UPDATE instead of INSERT because of the optional trimming feature"), flags: &["RW", "update"], begin: Begin::Index(1), find: Range { lastkey: 0, keystep: 1, limit: 0 } }] },
    Meta { name: "xlen", flags: &["readonly", "fast"], keys: (1, 1, 1), acl: &["@read", "@stream", "@fast"], tips: &[], key_specs: &[KeySpec { notes: None, flags: &["RO"], begin: Begin::Index(1), find: Range { lastkey: 0, keystep: 1, limit: 0 } }] },
    Meta { name: "xrange", flags: &["readonly"], keys: (1, 1, 1), acl: &["@read", "@stream", "@slow"], tips: &[], key_specs: &[KeySpec { notes: None, flags: &["RO", "access"], begin: Begin::Index(1), find: Range { lastkey: 0, keystep: 1, limit: 0 } }] },
    Meta { name: "xrevrange", flags: &["readonly"], keys: (1, 1, 1), acl: &["@read", "@stream", "@slow"], tips: &[], key_specs: &[KeySpec { notes: None, flags: &["RO", "access"], begin: Begin::Index(1), find: Range { lastkey: 0, keystep: 1, limit: 0 } }] },
    Meta { name: "xdel", flags: &["write", "fast"], keys: (1, 1, 1), acl: &["@write", "@stream", "@fast"], tips: &[], key_specs: &[KeySpec { notes: None, flags: &["RW", "delete"], begin: Begin::Index(1), find: Range { lastkey: 0, keystep: 1, limit: 0 } }] },
    Meta { name: "xtrim", flags: &["write"], keys: (1, 1, 1), acl: &["@write", "@stream", "@slow"], tips: &["nondeterministic_output"], key_specs: &[KeySpec { notes: None, flags: &["RW", "delete"], begin: Begin::Index(1), find: Range { lastkey: 0, keystep: 1, limit: 0 } }] },
    Meta { name: "xgroup", flags: &[], keys: (0, 0, 0), acl: &["@slow"], tips: &[], key_specs: &[] },
    Meta { name: "xinfo", flags: &[], keys: (0, 0, 0), acl: &["@slow"], tips: &[], key_specs: &[] },
    Meta { name: "memory", flags: &[], keys: (0, 0, 0), acl: &["@slow"], tips: &[], key_specs: &[] },
    Meta { name: "xack", flags: &["write", "fast"], keys: (1, 1, 1), acl: &["@write", "@stream", "@fast"], tips: &[], key_specs: &[KeySpec { notes: None, flags: &["RW", "update"], begin: Begin::Index(1), find: Range { lastkey: 0, keystep: 1, limit: 0 } }] },
    Meta { name: "xpending", flags: &["readonly"], keys: (1, 1, 1), acl: &["@read", "@stream", "@slow"], tips: &["nondeterministic_output"], key_specs: &[KeySpec { notes: None, flags: &["RO", "access"], begin: Begin::Index(1), find: Range { lastkey: 0, keystep: 1, limit: 0 } }] },
    Meta { name: "xclaim", flags: &["write", "fast"], keys: (1, 1, 1), acl: &["@write", "@stream", "@fast"], tips: &["nondeterministic_output"], key_specs: &[KeySpec { notes: None, flags: &["RW", "update"], begin: Begin::Index(1), find: Range { lastkey: 0, keystep: 1, limit: 0 } }] },
    Meta { name: "xautoclaim", flags: &["write", "fast"], keys: (1, 1, 1), acl: &["@write", "@stream", "@fast"], tips: &["nondeterministic_output"], key_specs: &[KeySpec { notes: None, flags: &["RW", "delete"], begin: Begin::Index(1), find: Range { lastkey: 0, keystep: 1, limit: 0 } }] },
    Meta { name: "xsetid", flags: &["write", "denyoom", "fast"], keys: (1, 1, 1), acl: &["@write", "@stream", "@fast"], tips: &[], key_specs: &[KeySpec { notes: None, flags: &["RW", "update"], begin: Begin::Index(1), find: Range { lastkey: 0, keystep: 1, limit: 0 } }] },
    Meta { name: "xread", flags: &["readonly", "blocking", "movablekeys"], keys: (0, 0, 0), acl: &["@read", "@stream", "@slow", "@blocking"], tips: &[], key_specs: &[KeySpec { notes: None, flags: &["RO", "access"], begin: Begin::Keyword { keyword: "STREAMS", startfrom: 1 }, find: Range { lastkey: -1, keystep: 1, limit: 2 } }] },
    Meta { name: "xreadgroup", flags: &["write", "blocking", "movablekeys"], keys: (0, 0, 0), acl: &["@write", "@stream", "@slow", "@blocking"], tips: &[], key_specs: &[KeySpec { notes: None, flags: &["RO", "access"], begin: Begin::Keyword { keyword: "STREAMS", startfrom: 4 }, find: Range { lastkey: -1, keystep: 1, limit: 2 } }] },
    Meta { name: "xgroup|create", flags: &["write", "denyoom"], keys: (2, 2, 1), acl: &["@write", "@stream", "@slow"], tips: &[], key_specs: &[KeySpec { notes: None, flags: &["RW", "insert"], begin: Begin::Index(2), find: Range { lastkey: 0, keystep: 1, limit: 0 } }] },
    Meta { name: "xgroup|setid", flags: &["write"], keys: (2, 2, 1), acl: &["@write", "@stream", "@slow"], tips: &[], key_specs: &[KeySpec { notes: None, flags: &["RW", "update"], begin: Begin::Index(2), find: Range { lastkey: 0, keystep: 1, limit: 0 } }] },
    Meta { name: "xgroup|destroy", flags: &["write"], keys: (2, 2, 1), acl: &["@write", "@stream", "@slow"], tips: &[], key_specs: &[KeySpec { notes: None, flags: &["RW", "delete"], begin: Begin::Index(2), find: Range { lastkey: 0, keystep: 1, limit: 0 } }] },
    Meta { name: "xgroup|createconsumer", flags: &["write", "denyoom"], keys: (2, 2, 1), acl: &["@write", "@stream", "@slow"], tips: &[], key_specs: &[KeySpec { notes: None, flags: &["RW", "insert"], begin: Begin::Index(2), find: Range { lastkey: 0, keystep: 1, limit: 0 } }] },
    Meta { name: "xgroup|delconsumer", flags: &["write"], keys: (2, 2, 1), acl: &["@write", "@stream", "@slow"], tips: &[], key_specs: &[KeySpec { notes: None, flags: &["RW", "delete"], begin: Begin::Index(2), find: Range { lastkey: 0, keystep: 1, limit: 0 } }] },
    Meta { name: "xgroup|help", flags: &["loading", "stale"], keys: (0, 0, 0), acl: &["@stream", "@slow"], tips: &[], key_specs: &[] },
    Meta { name: "xinfo|stream", flags: &["readonly"], keys: (2, 2, 1), acl: &["@read", "@stream", "@slow"], tips: &[], key_specs: &[KeySpec { notes: None, flags: &["RO", "access"], begin: Begin::Index(2), find: Range { lastkey: 0, keystep: 1, limit: 0 } }] },
    Meta { name: "xinfo|groups", flags: &["readonly"], keys: (2, 2, 1), acl: &["@read", "@stream", "@slow"], tips: &[], key_specs: &[KeySpec { notes: None, flags: &["RO", "access"], begin: Begin::Index(2), find: Range { lastkey: 0, keystep: 1, limit: 0 } }] },
    Meta { name: "xinfo|consumers", flags: &["readonly"], keys: (2, 2, 1), acl: &["@read", "@stream", "@slow"], tips: &["nondeterministic_output"], key_specs: &[KeySpec { notes: None, flags: &["RO", "access"], begin: Begin::Index(2), find: Range { lastkey: 0, keystep: 1, limit: 0 } }] },
    Meta { name: "xinfo|help", flags: &["loading", "stale"], keys: (0, 0, 0), acl: &["@stream", "@slow"], tips: &[], key_specs: &[] },
    Meta { name: "memory|usage", flags: &["readonly"], keys: (2, 2, 1), acl: &["@read", "@slow"], tips: &[], key_specs: &[KeySpec { notes: None, flags: &["RO"], begin: Begin::Index(2), find: Range { lastkey: 0, keystep: 1, limit: 0 } }] },
    Meta { name: "memory|help", flags: &["loading", "stale"], keys: (0, 0, 0), acl: &["@slow"], tips: &[], key_specs: &[] },
    Meta { name: "client|id", flags: &["noscript", "loading", "stale"], keys: (0, 0, 0), acl: &["@slow", "@connection"], tips: &[], key_specs: &[] },
    Meta { name: "client|getname", flags: &["noscript", "loading", "stale"], keys: (0, 0, 0), acl: &["@slow", "@connection"], tips: &[], key_specs: &[] },
    Meta { name: "client|setname", flags: &["noscript", "loading", "stale"], keys: (0, 0, 0), acl: &["@slow", "@connection"], tips: &[], key_specs: &[] },
    Meta { name: "client|info", flags: &["noscript", "loading", "stale"], keys: (0, 0, 0), acl: &["@slow", "@connection"], tips: &["nondeterministic_output"], key_specs: &[] },
    Meta { name: "client|no-evict", flags: &["admin", "noscript", "loading", "stale"], keys: (0, 0, 0), acl: &["@admin", "@slow", "@dangerous", "@connection"], tips: &[], key_specs: &[] },
    Meta { name: "client|help", flags: &["loading", "stale"], keys: (0, 0, 0), acl: &["@slow", "@connection"], tips: &[], key_specs: &[] },
    Meta { name: "client|list", flags: &["admin", "noscript", "loading", "stale"], keys: (0, 0, 0), acl: &["@admin", "@slow", "@dangerous", "@connection"], tips: &["nondeterministic_output"], key_specs: &[] },
    Meta { name: "client|kill", flags: &["admin", "noscript", "loading", "stale"], keys: (0, 0, 0), acl: &["@admin", "@slow", "@dangerous", "@connection"], tips: &[], key_specs: &[] },
    Meta { name: "client|unblock", flags: &["admin", "noscript", "loading", "stale"], keys: (0, 0, 0), acl: &["@admin", "@slow", "@dangerous", "@connection"], tips: &[], key_specs: &[] },
    Meta { name: "client|reply", flags: &["noscript", "loading", "stale"], keys: (0, 0, 0), acl: &["@slow", "@connection"], tips: &[], key_specs: &[] },
    Meta { name: "client|setinfo", flags: &["noscript", "loading", "stale"], keys: (0, 0, 0), acl: &["@slow", "@connection"], tips: &["request_policy:all_nodes", "response_policy:all_succeeded"], key_specs: &[] },
    Meta { name: "config|get", flags: &["admin", "noscript", "loading", "stale"], keys: (0, 0, 0), acl: &["@admin", "@slow", "@dangerous"], tips: &[], key_specs: &[] },
    Meta { name: "config|resetstat", flags: &["admin", "noscript", "loading", "stale"], keys: (0, 0, 0), acl: &["@admin", "@slow", "@dangerous"], tips: &[], key_specs: &[] },
    Meta { name: "config|help", flags: &["loading", "stale"], keys: (0, 0, 0), acl: &["@slow"], tips: &[], key_specs: &[] },
    Meta { name: "latency|doctor", flags: &["admin", "noscript", "loading", "stale"], keys: (0, 0, 0), acl: &["@admin", "@slow", "@dangerous"], tips: &["nondeterministic_output", "request_policy:all_nodes", "response_policy:special"], key_specs: &[] },
    Meta { name: "latency|graph", flags: &["admin", "noscript", "loading", "stale"], keys: (0, 0, 0), acl: &["@admin", "@slow", "@dangerous"], tips: &["nondeterministic_output", "request_policy:all_nodes", "response_policy:special"], key_specs: &[] },
    Meta { name: "latency|help", flags: &["loading", "stale"], keys: (0, 0, 0), acl: &["@slow"], tips: &[], key_specs: &[] },
    Meta { name: "latency|histogram", flags: &["admin", "noscript", "loading", "stale"], keys: (0, 0, 0), acl: &["@admin", "@slow", "@dangerous"], tips: &["nondeterministic_output", "request_policy:all_nodes", "response_policy:special"], key_specs: &[] },
    Meta { name: "latency|history", flags: &["admin", "noscript", "loading", "stale"], keys: (0, 0, 0), acl: &["@admin", "@slow", "@dangerous"], tips: &["nondeterministic_output", "request_policy:all_nodes", "response_policy:special"], key_specs: &[] },
    Meta { name: "latency|latest", flags: &["admin", "noscript", "loading", "stale"], keys: (0, 0, 0), acl: &["@admin", "@slow", "@dangerous"], tips: &["nondeterministic_output", "request_policy:all_nodes", "response_policy:special"], key_specs: &[] },
    Meta { name: "latency|reset", flags: &["admin", "noscript", "loading", "stale"], keys: (0, 0, 0), acl: &["@admin", "@slow", "@dangerous"], tips: &["request_policy:all_nodes", "response_policy:all_succeeded"], key_specs: &[] },
    Meta { name: "command|count", flags: &["loading", "stale"], keys: (0, 0, 0), acl: &["@slow", "@connection"], tips: &[], key_specs: &[] },
    Meta { name: "command|help", flags: &["loading", "stale"], keys: (0, 0, 0), acl: &["@slow", "@connection"], tips: &[], key_specs: &[] },
    Meta { name: "command|docs", flags: &["loading", "stale"], keys: (0, 0, 0), acl: &["@slow", "@connection"], tips: &["nondeterministic_output_order"], key_specs: &[] },
    Meta { name: "command|info", flags: &["loading", "stale"], keys: (0, 0, 0), acl: &["@slow", "@connection"], tips: &["nondeterministic_output_order"], key_specs: &[] },
    Meta { name: "command|getkeys", flags: &["loading", "stale"], keys: (0, 0, 0), acl: &["@slow", "@connection"], tips: &[], key_specs: &[] },
    Meta { name: "command|list", flags: &["loading", "stale"], keys: (0, 0, 0), acl: &["@slow", "@connection"], tips: &["nondeterministic_output_order"], key_specs: &[] },
    Meta { name: "command|getkeysandflags", flags: &["loading", "stale"], keys: (0, 0, 0), acl: &["@slow", "@connection"], tips: &[], key_specs: &[] },
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{has_subcommands, COMMANDS, SUBCOMMANDS};

    #[test]
    fn every_command_and_subcommand_is_described_once() {
        let names: Vec<String> = COMMANDS
            .iter()
            .map(|c| c.name.to_owned())
            .chain(SUBCOMMANDS.iter().map(|(c, s, _)| format!("{c}|{s}")))
            .collect();
        for name in &names {
            assert!(meta(name).is_some(), "{name} is not described");
        }
        assert_eq!(META.len(), names.len(), "described but not a command");
        // A container has no keys of its own (its subcommands have).
        for c in COMMANDS.iter().filter(|c| has_subcommands(c.name)) {
            let m = meta(c.name).unwrap();
            assert!(m.key_specs.is_empty() && m.keys == (0, 0, 0), "{}", c.name);
        }
    }
}
