//! Per-command counts for `INFO commandstats`, kept as Redis 7.0 keeps
//! them: a command's `calls` once it ran (a blocking read once it
//! answered), `failed_calls` when it ran and answered with an error,
//! `rejected_calls` when it was refused before it ran (its arity, its
//! subcommand's arity, authentication, a command not allowed inside a
//! transaction), and `usec`, the time it took. A subcommand counts as
//! `container|sub` (`client|id`); an unknown command or subcommand counts
//! nowhere. Commands queued inside `MULTI` count when `EXEC` runs them, each
//! under its own name, and `EXEC` fails only when its own reply is an error
//! (`EXECABORT`), not for the errors of the commands it ran.
//!
//! Each shard counts in a table of its own (a session counts in the table
//! of the shard it runs on, chosen again when it moves), so shards never
//! write the same cache lines; `INFO` sums the tables.
//!
//! A command is counted when its reply is ready, so one whose reply never
//! is (its connection closed first, a `SHUTDOWN` that stops the broker, a
//! transaction whose record the log refused after it ran: that `EXEC`
//! counts as failed and its commands not at all) is not counted, where
//! Redis counts at execution.
//!
//! Time is the session's view: from when the session took the command (or
//! sent the run of pipelined commands it was gathered in, whose time is
//! shared out among them) to when its reply was ready, so a command sent to
//! a stream's actor on another shard counts the trip there and back, where
//! Redis counts its execution alone. A blocked read counts the time it
//! waited.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use crate::command::{self, COMMANDS, SUBCOMMANDS};
use crate::resp::Reply;

/// A command's place in the tables: [`COMMANDS`]' rows, then
/// [`SUBCOMMANDS`]' (as `container|sub`).
pub(crate) type Slot = u8;

/// Places in a table.
const SLOTS: usize = COMMANDS.len() + SUBCOMMANDS.len();

const _: () = assert!(SLOTS <= Slot::MAX as usize, "a slot is one byte");

/// The place of the command `args` names, where Redis counts it: its
/// subcommand's (with one given), or the command's; `None` for an unknown
/// command or subcommand.
pub(crate) fn slot_of(args: &[Bytes]) -> Option<Slot> {
    slot_in(command::lookup_row(&args[0])?, args)
}

/// [`slot_of`] for a command known to be [`COMMANDS`]' row `row`.
#[inline]
pub(crate) fn slot_in(row: usize, args: &[Bytes]) -> Option<Slot> {
    let first = FIRST_SUBCOMMAND[row];
    match args.get(1) {
        Some(sub) if first != NOT_A_CONTAINER => subcommand_slot(row, usize::from(first), sub),
        _ => Some(row as Slot),
    }
}

/// The slot of subcommand `sub` of container `row`, whose subcommands
/// start at `first` in [`SUBCOMMANDS`].
fn subcommand_slot(row: usize, first: usize, sub: &[u8]) -> Option<Slot> {
    let name = COMMANDS[row].name;
    SUBCOMMANDS[first..]
        .iter()
        .take_while(|(c, _, _)| *c == name)
        .position(|(_, s, _)| s.as_bytes().eq_ignore_ascii_case(sub))
        .map(|i| (COMMANDS.len() + first + i) as Slot)
}

/// A row of [`FIRST_SUBCOMMAND`] that has no subcommands.
const NOT_A_CONTAINER: u8 = u8::MAX;

/// For each of [`COMMANDS`]' rows, where its subcommands start in
/// [`SUBCOMMANDS`] (which lists each container's together), or
/// [`NOT_A_CONTAINER`]: built at compile time, so finding a plain
/// command's slot compares no names.
const FIRST_SUBCOMMAND: [u8; COMMANDS.len()] = {
    const fn same(a: &str, b: &str) -> bool {
        let (a, b) = (a.as_bytes(), b.as_bytes());
        if a.len() != b.len() {
            return false;
        }
        let mut i = 0;
        while i < a.len() {
            if a[i] != b[i] {
                return false;
            }
            i += 1;
        }
        true
    }
    assert!(SUBCOMMANDS.len() < NOT_A_CONTAINER as usize);
    let mut first = [NOT_A_CONTAINER; COMMANDS.len()];
    let mut row = 0;
    while row < COMMANDS.len() {
        let mut i = 0;
        while i < SUBCOMMANDS.len() {
            if same(SUBCOMMANDS[i].0, COMMANDS[row].name) {
                first[row] = i as u8;
                break;
            }
            i += 1;
        }
        row += 1;
    }
    first
};

/// The name a slot is listed under.
fn slot_name(slot: usize) -> String {
    match slot.checked_sub(COMMANDS.len()) {
        None => COMMANDS[slot].name.to_owned(),
        Some(i) => format!("{}|{}", SUBCOMMANDS[i].0, SUBCOMMANDS[i].1),
    }
}

/// One command's counts on one shard.
#[derive(Debug, Default)]
struct Counts {
    calls: AtomicU64,
    usec: AtomicU64,
    rejected: AtomicU64,
    failed: AtomicU64,
}

/// One shard's table. Only that shard's sessions write it (atomics all
/// the same: a session used elsewhere still counts right).
#[derive(Debug)]
#[repr(align(64))]
pub(crate) struct ShardCounts {
    slots: [Counts; SLOTS],
}

impl Default for ShardCounts {
    fn default() -> Self {
        ShardCounts {
            slots: std::array::from_fn(|_| Counts::default()),
        }
    }
}

/// Whether a reply, as the client gets it, is an error.
fn is_error(reply: &Reply) -> bool {
    match reply {
        Reply::Error(_) | Reply::ErrorBytes(_) => true,
        Reply::Encoded(b) => b.first() == Some(&b'-'),
        _ => false,
    }
}

impl ShardCounts {
    /// A command ran and answered `reply` after `usec`.
    pub(crate) fn ran(&self, slot: Slot, reply: &Reply, usec: u64) {
        let c = &self.slots[usize::from(slot)];
        c.calls.fetch_add(1, Ordering::Relaxed);
        if usec > 0 {
            c.usec.fetch_add(usec, Ordering::Relaxed);
        }
        if is_error(reply) {
            c.failed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A command was refused before it ran.
    pub(crate) fn rejected(&self, slot: Slot) {
        self.slots[usize::from(slot)]
            .rejected
            .fetch_add(1, Ordering::Relaxed);
    }

    /// What a request's reply counts, now that it is ready.
    pub(crate) fn answered(&self, counted: Counted, reply: &Reply) {
        let usec = counted.since.elapsed().as_micros() as u64;
        match counted.what {
            What::One(slot) => self.ran(slot, reply, usec),
            What::Exec { exec, inner } => {
                self.ran(exec, reply, usec);
                // The commands it ran, each with its own reply; none when
                // it was refused (its reply is then an error).
                if let Reply::Array(items) = reply {
                    if items.len() == inner.len() {
                        for (slot, item) in inner.iter().zip(items) {
                            if let Some(slot) = slot {
                                self.ran(*slot, item, 0);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Counts the commands of a run as their replies are made, in order:
/// neighbours of one command (a pipeline of `XADD`s) with one update of
/// each count, and the run's time shared out among them.
pub(crate) struct RunCount<'a> {
    counts: &'a ShardCounts,
    /// The run's time, in microseconds, and its number of commands.
    usec: u64,
    commands: u64,
    /// (slot, calls, failed) of the neighbours noted and not yet counted.
    group: Option<(Slot, u64, u64)>,
}

impl<'a> RunCount<'a> {
    /// A run of `commands` commands begun `since`, answered now.
    pub(crate) fn new(counts: &'a ShardCounts, commands: usize, since: Instant) -> Self {
        RunCount {
            counts,
            usec: since.elapsed().as_micros() as u64,
            commands: commands.max(1) as u64,
            group: None,
        }
    }

    /// The next command of the run (in `slot`, if counted) answered
    /// `reply`.
    #[inline]
    pub(crate) fn note(&mut self, slot: Option<Slot>, reply: &Reply) {
        let Some(slot) = slot else { return };
        let failed = u64::from(is_error(reply));
        match &mut self.group {
            Some((s, calls, f)) if *s == slot => {
                *calls += 1;
                *f += failed;
            }
            _ => {
                let done = self.group.replace((slot, 1, failed));
                self.count(done);
            }
        }
    }

    fn count(&self, group: Option<(Slot, u64, u64)>) {
        let Some((slot, calls, failed)) = group else {
            return;
        };
        let c = &self.counts.slots[usize::from(slot)];
        c.calls.fetch_add(calls, Ordering::Relaxed);
        // Its share of the run's time, in whole microseconds.
        let share = self.usec * calls / self.commands;
        if share > 0 {
            c.usec.fetch_add(share, Ordering::Relaxed);
        }
        if failed > 0 {
            c.failed.fetch_add(failed, Ordering::Relaxed);
        }
    }
}

impl Drop for RunCount<'_> {
    fn drop(&mut self) {
        let group = self.group.take();
        self.count(group);
    }
}

/// What a request's reply will count.
#[derive(Debug)]
pub(crate) struct Counted {
    what: What,
    /// When the session took the request.
    since: Instant,
}

#[derive(Debug)]
enum What {
    One(Slot),
    /// `EXEC` and the places of the commands it runs, in order.
    Exec {
        exec: Slot,
        inner: Vec<Option<Slot>>,
    },
}

impl Counted {
    /// A command in `slot`, taken now.
    pub(crate) fn one(slot: Slot) -> Self {
        Self::one_since(slot, Instant::now())
    }

    /// A command in `slot`, taken at `since`.
    pub(crate) fn one_since(slot: Slot, since: Instant) -> Self {
        Counted {
            what: What::One(slot),
            since,
        }
    }

    /// `EXEC` (in `exec`) running `commands`, taken now.
    pub(crate) fn exec(exec: Slot, commands: &[Vec<Bytes>]) -> Self {
        Counted {
            what: What::Exec {
                exec,
                inner: commands.iter().map(|c| slot_of(c)).collect(),
            },
            since: Instant::now(),
        }
    }
}

/// The count a request's reply is to make, taken by the reply that
/// answers it (a session's; set while the request is handled).
#[derive(Default)]
pub(crate) struct Pending(std::cell::Cell<Option<Counted>>);

impl Pending {
    pub(crate) fn set(&self, counted: Option<Counted>) {
        self.0.set(counted);
    }

    pub(crate) fn take(&self) -> Option<Counted> {
        self.0.take()
    }
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pending")
    }
}

/// The tables of one broker, one per shard.
#[derive(Debug)]
pub(crate) struct CommandStats {
    shards: Vec<Arc<ShardCounts>>,
}

impl CommandStats {
    pub(crate) fn new(shards: usize) -> Self {
        CommandStats {
            shards: (0..shards.max(1))
                .map(|_| Arc::new(ShardCounts::default()))
                .collect(),
        }
    }

    /// The table of `shard` (the first one off the shards).
    pub(crate) fn of(&self, shard: Option<mailring::ShardId>) -> Arc<ShardCounts> {
        let i = shard.map_or(0, |s| s.index());
        self.shards[i % self.shards.len()].clone()
    }

    /// `INFO commandstats`' lines: each command counted since the start
    /// or the last `CONFIG RESETSTAT`, in the table's order.
    pub(crate) fn lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for slot in 0..SLOTS {
            let sum = |f: fn(&Counts) -> &AtomicU64| -> u64 {
                self.shards
                    .iter()
                    .map(|s| f(&s.slots[slot]).load(Ordering::Relaxed))
                    .sum()
            };
            let calls = sum(|c| &c.calls);
            let rejected = sum(|c| &c.rejected);
            let failed = sum(|c| &c.failed);
            if calls == 0 && rejected == 0 && failed == 0 {
                continue;
            }
            let usec = sum(|c| &c.usec);
            // As Redis prints it: a float's quotient, two places.
            let per_call = if calls == 0 {
                0.0
            } else {
                usec as f32 / calls as f32
            };
            lines.push(format!(
                "cmdstat_{}:calls={calls},usec={usec},usec_per_call={per_call:.2},rejected_calls={rejected},failed_calls={failed}",
                slot_name(slot)
            ));
        }
        lines
    }

    /// `CONFIG RESETSTAT`.
    pub(crate) fn reset(&self) {
        for shard in &self.shards {
            for c in &shard.slots {
                c.calls.store(0, Ordering::Relaxed);
                c.usec.store(0, Ordering::Relaxed);
                c.rejected.store(0, Ordering::Relaxed);
                c.failed.store(0, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> Vec<Bytes> {
        words
            .iter()
            .map(|w| Bytes::copy_from_slice(w.as_bytes()))
            .collect()
    }

    #[test]
    fn commands_and_subcommands_have_their_own_places_and_unknown_ones_none() {
        let name = |w: &[&str]| slot_of(&args(w)).map(usize::from).map(slot_name);
        assert_eq!(name(&["XADD", "s", "*", "f", "v"]).as_deref(), Some("xadd"));
        assert_eq!(name(&["client", "ID"]).as_deref(), Some("client|id"));
        assert_eq!(name(&["CLIENT"]).as_deref(), Some("client"));
        assert_eq!(name(&["COMMAND"]).as_deref(), Some("command"));
        assert_eq!(name(&["client", "nope"]), None);
        assert_eq!(name(&["nope"]), None);
        // Every subcommand has its own place, found by its container.
        for (i, (c, s, _)) in SUBCOMMANDS.iter().enumerate() {
            assert_eq!(
                slot_of(&args(&[c, &s.to_ascii_uppercase()])).map(usize::from),
                Some(COMMANDS.len() + i)
            );
            assert!(command::has_subcommands(c));
        }
    }

    #[test]
    fn shards_sum_and_a_reset_clears_every_count() {
        let stats = CommandStats::new(2);
        let xlen = slot_of(&args(&["xlen", "s"])).unwrap();
        stats.shards[0].ran(xlen, &Reply::Int(1), 3);
        stats.shards[1].ran(xlen, &Reply::err("no"), 4);
        stats.shards[1].rejected(xlen);
        assert_eq!(
            stats.lines(),
            ["cmdstat_xlen:calls=2,usec=7,usec_per_call=3.50,rejected_calls=1,failed_calls=1"]
        );
        stats.reset();
        assert!(stats.lines().is_empty());
    }

    #[test]
    fn a_run_counts_each_command_once_and_shares_out_its_time() {
        let stats = CommandStats::new(1);
        let xadd = slot_of(&args(&["xadd"])).unwrap();
        let xlen = slot_of(&args(&["xlen"])).unwrap();
        let since = Instant::now() - std::time::Duration::from_micros(1000);
        {
            let mut run = RunCount::new(&stats.shards[0], 5, since);
            run.note(Some(xadd), &Reply::Int(1));
            run.note(Some(xadd), &Reply::err("too small"));
            run.note(Some(xlen), &Reply::Int(2));
            run.note(None, &Reply::Int(0));
            run.note(Some(xadd), &Reply::Int(3));
        }
        let counts = |slot: Slot| {
            let c = &stats.shards[0].slots[usize::from(slot)];
            let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
            (load(&c.calls), load(&c.usec), load(&c.failed))
        };
        let (calls, usec, failed) = counts(xadd);
        assert_eq!((calls, failed), (3, 1));
        // Three fifths of at least a millisecond, counted in two groups.
        assert!(usec >= 599, "{usec}");
        let (calls, usec, failed) = counts(xlen);
        assert_eq!((calls, failed), (1, 0));
        assert!(usec >= 200, "{usec}");
    }

    #[test]
    fn exec_fails_only_for_its_own_error_and_counts_what_it_ran() {
        let stats = CommandStats::new(1);
        let exec = slot_of(&args(&["exec"])).unwrap();
        let queued = [args(&["xadd", "s", "1-1", "f", "v"]), args(&["xlen", "s"])];
        let ran = Reply::Array(vec![Reply::err("too small"), Reply::Int(1)]);
        stats.shards[0].answered(Counted::exec(exec, &queued), &ran);
        stats.shards[0].answered(
            Counted::exec(exec, &queued),
            &Reply::err("EXECABORT Transaction discarded"),
        );
        let lines: Vec<String> = stats
            .lines()
            .iter()
            .map(|l| {
                // The times are the test's own.
                let (head, rest) = l.split_once(",usec=").unwrap();
                let (_, tail) = rest.split_once(",rejected").unwrap();
                format!("{head},rejected{tail}")
            })
            .collect();
        assert_eq!(
            lines,
            [
                "cmdstat_exec:calls=2,rejected_calls=0,failed_calls=1",
                "cmdstat_xadd:calls=1,rejected_calls=0,failed_calls=1",
                "cmdstat_xlen:calls=1,rejected_calls=0,failed_calls=0",
            ]
        );
    }
}
