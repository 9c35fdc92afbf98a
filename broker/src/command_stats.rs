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
//! waited. Each command of a run, and each of the commands an `EXEC` ran,
//! is recorded in its histogram at its share of the time.
//!
//! A histogram is made the first time its command runs on a shard (most
//! of the table's commands never do): 592 counters, log-linear over
//! nanoseconds (exact below 16 ns, then 16 steps between each power of
//! two and the next, so a value is at most 1/16 below the bound it is
//! reported at), up to 2^40 ns (18 minutes; longer waits count there).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
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
    /// The calls' time, in nanoseconds (`INFO` shows microseconds).
    nanos: AtomicU64,
    rejected: AtomicU64,
    failed: AtomicU64,
    /// Its calls' latencies, made at its first call.
    latency: OnceLock<Histogram>,
}

impl Counts {
    /// `calls` calls that took `nanos` each, in the histogram.
    #[inline]
    fn record(&self, nanos: u64, calls: u64) {
        self.latency
            .get_or_init(Histogram::new)
            .record(nanos, calls);
    }
}

/// Steps between one power of two and the next, as a power of two.
const SUB_BITS: u32 = 4;
const SUB: u64 = 1 << SUB_BITS;
/// Values at and past this many nanoseconds count in the last bucket.
const LATENCY_LIMIT_BITS: u32 = 40;
/// Buckets of a histogram: `SUB` exact ones below `SUB`, then `SUB` for
/// each power of two from `SUB` up to the limit.
const BUCKETS: usize = ((LATENCY_LIMIT_BITS - SUB_BITS + 1) * SUB as u32) as usize;

/// The bucket of a latency of `nanos`.
#[inline]
fn bucket_of(nanos: u64) -> usize {
    let v = nanos.min((1 << LATENCY_LIMIT_BITS) - 1);
    if v < SUB {
        return v as usize;
    }
    // `v` lies in [2^e, 2^(e+1)), cut in SUB steps of 2^(e - SUB_BITS).
    let e = 63 - v.leading_zeros();
    let step = (v >> (e - SUB_BITS)) & (SUB - 1);
    ((e - SUB_BITS + 1) as usize) * SUB as usize + step as usize
}

/// The highest latency, in nanoseconds, that counts in `bucket`.
fn bucket_bound(bucket: usize) -> u64 {
    let (group, step) = (bucket as u64 / SUB, bucket as u64 % SUB);
    if group == 0 {
        return step;
    }
    let shift = group - 1;
    ((SUB + step + 1) << shift) - 1
}

/// A histogram of latencies in nanoseconds.
#[derive(Debug)]
struct Histogram {
    buckets: Box<[AtomicU64]>,
}

impl Histogram {
    fn new() -> Self {
        Histogram {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    #[inline]
    fn record(&self, nanos: u64, calls: u64) {
        self.buckets[bucket_of(nanos)].fetch_add(calls, Ordering::Relaxed);
    }

    fn clear(&self) {
        for b in self.buckets.iter() {
            b.store(0, Ordering::Relaxed);
        }
    }
}

/// The percentiles `INFO latencystats` shows, and their names.
pub(crate) const LATENCY_PERCENTILES: [(f64, &str); 3] =
    [(50.0, "p50"), (99.0, "p99"), (99.9, "p99.9")];

/// One command's histogram summed over the shards.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Latencies {
    counts: Vec<u64>,
    total: u64,
}

impl Latencies {
    fn sum<'a>(of: impl Iterator<Item = &'a Histogram>) -> Self {
        let mut counts = vec![0; BUCKETS];
        for h in of {
            for (sum, b) in counts.iter_mut().zip(h.buckets.iter()) {
                *sum += b.load(Ordering::Relaxed);
            }
        }
        let total = counts.iter().sum();
        Latencies { counts, total }
    }

    /// The calls recorded.
    pub(crate) fn calls(&self) -> u64 {
        self.total
    }

    /// The latency, in nanoseconds, that `percentile` per cent of the
    /// calls took at most (the bound of the bucket the call at that rank
    /// counts in; the rank rounded to the nearest, at least the first).
    pub(crate) fn percentile(&self, percentile: f64) -> u64 {
        let rank = ((percentile / 100.0 * self.total as f64 + 0.5) as u64).max(1);
        let mut seen = 0;
        for (bucket, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return bucket_bound(bucket);
            }
        }
        bucket_bound(BUCKETS - 1)
    }

    /// `LATENCY HISTOGRAM`'s cumulative buckets: for each power of two
    /// of 1,024 ns that adds calls, its bound in whole microseconds as
    /// Redis 7.0 writes it, and the calls at or under it.
    pub(crate) fn cumulative(&self) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut seen = 0;
        let mut bucket = 0;
        let mut bound: u64 = 1024;
        while seen < self.total {
            // Every bucket below `bound` (a power of two at least `SUB`,
            // so a bucket edge).
            let before = seen;
            while bucket < BUCKETS && bucket_bound(bucket) < bound {
                seen += self.counts[bucket];
                bucket += 1;
            }
            if bucket == BUCKETS {
                seen = self.total;
            }
            if seen > before {
                // Redis reports a bound as its histogram's highest value
                // equivalent to it, 1/128 above.
                out.push(((bound + bound / 128 - 1) / 1000, seen));
            }
            bound *= 2;
        }
        out
    }
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
    /// A command ran and answered `reply` after `nanos`.
    pub(crate) fn ran(&self, slot: Slot, reply: &Reply, nanos: u64) {
        let c = &self.slots[usize::from(slot)];
        c.calls.fetch_add(1, Ordering::Relaxed);
        if nanos > 0 {
            c.nanos.fetch_add(nanos, Ordering::Relaxed);
        }
        if is_error(reply) {
            c.failed.fetch_add(1, Ordering::Relaxed);
        }
        c.record(nanos, 1);
    }

    /// A command was refused before it ran.
    pub(crate) fn rejected(&self, slot: Slot) {
        self.slots[usize::from(slot)]
            .rejected
            .fetch_add(1, Ordering::Relaxed);
    }

    /// What a request's reply counts, now that it is ready.
    pub(crate) fn answered(&self, counted: Counted, reply: &Reply) {
        let nanos = nanos_since(counted.since);
        match counted.what {
            What::One(slot) => self.ran(slot, reply, nanos),
            What::Exec { exec, inner } => {
                self.ran(exec, reply, nanos);
                // The commands it ran, each with its own reply and a
                // share of its time; none when it was refused (its reply
                // is then an error).
                if let Reply::Array(items) = reply {
                    if items.len() == inner.len() {
                        let share = nanos / inner.len().max(1) as u64;
                        for (slot, item) in inner.iter().zip(items) {
                            if let Some(slot) = slot {
                                self.ran(*slot, item, share);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Nanoseconds from `since` to now (saturating past 584 years).
fn nanos_since(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Counts the commands of a run as their replies are made, in order:
/// neighbours of one command (a pipeline of `XADD`s) with one update of
/// each count, and the run's time shared out among them.
pub(crate) struct RunCount<'a> {
    counts: &'a ShardCounts,
    /// The run's time, in nanoseconds, and its number of commands.
    nanos: u64,
    commands: u64,
    /// (slot, calls, failed) of the neighbours noted and not yet counted.
    group: Option<(Slot, u64, u64)>,
}

impl<'a> RunCount<'a> {
    /// A run of `commands` commands begun `since`, answered now.
    pub(crate) fn new(counts: &'a ShardCounts, commands: usize, since: Instant) -> Self {
        RunCount {
            counts,
            nanos: nanos_since(since),
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
        // Its share of the run's time, and each call's.
        let each = self.nanos / self.commands;
        if each > 0 {
            c.nanos.fetch_add(each * calls, Ordering::Relaxed);
        }
        if failed > 0 {
            c.failed.fetch_add(failed, Ordering::Relaxed);
        }
        c.record(each, calls);
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
            let usec = sum(|c| &c.nanos) / 1000;
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

    /// The latencies of the command in `slot`, summed over the shards;
    /// `None` when none was recorded.
    fn latencies(&self, slot: usize) -> Option<Latencies> {
        let latencies = Latencies::sum(
            self.shards
                .iter()
                .filter_map(|s| s.slots[slot].latency.get()),
        );
        (latencies.total > 0).then_some(latencies)
    }

    /// `INFO latencystats`' lines: each command that ran since the start
    /// or the last `CONFIG RESETSTAT`, its percentiles in microseconds.
    pub(crate) fn latency_lines(&self) -> Vec<String> {
        (0..SLOTS)
            .filter_map(|slot| {
                let latencies = self.latencies(slot)?;
                let values: Vec<String> = LATENCY_PERCENTILES
                    .iter()
                    .map(|(p, name)| {
                        let usec = latencies.percentile(*p) as f64 / 1000.0;
                        format!("{name}={usec:.3}")
                    })
                    .collect();
                Some(format!(
                    "latency_percentiles_usec_{}:{}",
                    slot_name(slot),
                    values.join(",")
                ))
            })
            .collect()
    }

    /// `LATENCY HISTOGRAM [name ...]`'s commands and their latencies: all
    /// that ran with no names given; else each named one that ran (`x|y`
    /// names a subcommand) and a named container's subcommands that ran.
    pub(crate) fn histograms(&self, names: &[Bytes]) -> Vec<(String, Latencies)> {
        // Each name looked up once (a request may name a million).
        let mut wanted = [names.is_empty(); SLOTS];
        for name in names {
            let (command, sub) = match name.iter().position(|&b| b == b'|') {
                Some(at) => (&name[..at], Some(&name[at + 1..])),
                None => (&name[..], None),
            };
            let Some(row) = command::lookup_row(command) else {
                continue;
            };
            let first = FIRST_SUBCOMMAND[row];
            match sub {
                Some(sub) if first != NOT_A_CONTAINER => {
                    if let Some(slot) = subcommand_slot(row, usize::from(first), sub) {
                        wanted[usize::from(slot)] = true;
                    }
                }
                Some(_) => {}
                None => {
                    wanted[row] = true;
                    if first != NOT_A_CONTAINER {
                        let first = usize::from(first);
                        let name = COMMANDS[row].name;
                        let subs = SUBCOMMANDS[first..]
                            .iter()
                            .take_while(|(c, _, _)| *c == name)
                            .count();
                        for i in first..first + subs {
                            wanted[COMMANDS.len() + i] = true;
                        }
                    }
                }
            }
        }
        (0..SLOTS)
            .filter(|slot| wanted[*slot])
            .filter_map(|slot| Some((slot_name(slot), self.latencies(slot)?)))
            .collect()
    }

    /// `CONFIG RESETSTAT`.
    pub(crate) fn reset(&self) {
        for shard in &self.shards {
            for c in &shard.slots {
                c.calls.store(0, Ordering::Relaxed);
                c.nanos.store(0, Ordering::Relaxed);
                c.rejected.store(0, Ordering::Relaxed);
                c.failed.store(0, Ordering::Relaxed);
                if let Some(h) = c.latency.get() {
                    h.clear();
                }
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
        stats.shards[0].ran(xlen, &Reply::Int(1), 3_000);
        stats.shards[1].ran(xlen, &Reply::err("no"), 4_400);
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
            (load(&c.calls), load(&c.nanos) / 1000, load(&c.failed))
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
    fn a_latency_counts_in_the_bucket_whose_bound_is_at_most_a_sixteenth_above_it() {
        let mut values: Vec<u64> = (0..5000).collect();
        for e in 4..64 {
            let p = 1u64 << e;
            values.extend([p - 1, p, p + 1, p + p / 3]);
        }
        values.push(u64::MAX);
        let mut last = (0, 0);
        values.sort_unstable();
        for v in values {
            let b = bucket_of(v);
            assert!(b < BUCKETS, "{v}");
            assert!(b >= last.1, "buckets rise with values: {v}");
            last = (v, b);
            let bound = bucket_bound(b);
            if v < 1 << LATENCY_LIMIT_BITS {
                assert!(bound >= v, "{v} counts under {bound}");
                assert!(bound - v <= v / SUB, "{v} reported as {bound}");
                assert!(b == 0 || bucket_bound(b - 1) < v, "{v} belongs lower");
            } else {
                assert_eq!(b, BUCKETS - 1, "{v} counts in the last bucket");
            }
        }
        assert_eq!(bucket_bound(BUCKETS - 1), (1 << LATENCY_LIMIT_BITS) - 1);
    }

    #[test]
    fn percentiles_and_cumulative_buckets_come_from_every_shard() {
        let stats = CommandStats::new(2);
        let xadd = slot_of(&args(&["xadd"])).unwrap();
        // 1..=100 us, half on each shard.
        for us in 1..=100u64 {
            stats.shards[(us % 2) as usize].ran(xadd, &Reply::Int(1), us * 1000);
        }
        let latencies = stats.latencies(usize::from(xadd)).unwrap();
        assert_eq!(latencies.calls(), 100);
        let near = |p: f64, us: u64| {
            let got = latencies.percentile(p);
            assert!(
                got >= us * 1000 && got <= us * 1000 + us * 1000 / SUB,
                "p{p}: {got} ns for {us} us"
            );
        };
        near(50.0, 50);
        near(99.0, 99);
        near(99.9, 100);
        near(0.0, 1);
        near(100.0, 100);
        // The same in microseconds, three places.
        let line = &stats.latency_lines()[0];
        let us = |p: f64| format!("{:.3}", latencies.percentile(p) as f64 / 1000.0);
        assert_eq!(
            *line,
            format!(
                "latency_percentiles_usec_xadd:p50={},p99={},p99.9={}",
                us(50.0),
                us(99.0),
                us(99.9)
            )
        );
        // Powers of two of 1,024 ns, written in whole us as Redis writes
        // them (1.031 us, 2.063, ...); each one that adds calls, with the
        // calls under it.
        let cumulative = latencies.cumulative();
        assert_eq!(
            cumulative,
            [
                (1, 1),
                (2, 2),
                (4, 4),
                (8, 8),
                (16, 16),
                (33, 32),
                (66, 65),
                (132, 100)
            ]
        );
        // One call under a microsecond and two of five.
        let xlen = slot_of(&args(&["xlen"])).unwrap();
        stats.shards[0].ran(xlen, &Reply::Int(1), 500);
        stats.shards[1].ran(xlen, &Reply::Int(1), 5_000);
        stats.shards[1].ran(xlen, &Reply::Int(1), 5_000);
        let xlen_latencies = stats.latencies(usize::from(xlen)).unwrap();
        assert_eq!(xlen_latencies.cumulative(), [(1, 1), (8, 3)]);
        // Past the histogram's range: counted at its end.
        let del = slot_of(&args(&["del"])).unwrap();
        stats.shards[0].ran(del, &Reply::Int(1), u64::MAX);
        let del_latencies = stats.latencies(usize::from(del)).unwrap();
        assert_eq!(
            del_latencies.percentile(50.0),
            (1 << LATENCY_LIMIT_BITS) - 1
        );
        assert_eq!(del_latencies.cumulative().last().map(|c| c.1), Some(1));
        // Names: all, one, a container's subcommands, none unknown.
        let names = |n: &[&str]| -> Vec<String> {
            stats
                .histograms(&args(n))
                .into_iter()
                .map(|(name, _)| name)
                .collect()
        };
        assert_eq!(names(&[]), ["del", "xadd", "xlen"]);
        assert_eq!(names(&["XLEN", "nope"]), ["xlen"]);
        let client_id = slot_of(&args(&["client", "id"])).unwrap();
        stats.shards[0].ran(client_id, &Reply::Int(1), 10);
        assert_eq!(names(&["client"]), ["client|id"]);
        assert_eq!(names(&["CLIENT|ID"]), ["client|id"]);
        assert!(names(&["client|list"]).is_empty());
        assert!(names(&["xlen|x", "nope|id", "client|", "|"]).is_empty());
        stats.reset();
        assert!(stats.latency_lines().is_empty());
        assert!(names(&[]).is_empty());
    }

    #[test]
    fn a_runs_commands_are_recorded_at_their_share_of_its_time() {
        let stats = CommandStats::new(1);
        let xadd = slot_of(&args(&["xadd"])).unwrap();
        let since = Instant::now() - std::time::Duration::from_micros(4000);
        {
            let mut run = RunCount::new(&stats.shards[0], 4, since);
            for _ in 0..4 {
                run.note(Some(xadd), &Reply::Int(1));
            }
        }
        let latencies = stats.latencies(usize::from(xadd)).unwrap();
        assert_eq!(latencies.calls(), 4);
        // Each at least a quarter of 4 ms; far under 4 ms.
        let p = latencies.percentile(100.0);
        assert!((1_000_000..2_000_000).contains(&p), "{p}");
        // `EXEC`'s commands share its time too.
        let exec = slot_of(&args(&["exec"])).unwrap();
        let queued = [
            args(&["xadd", "s", "*", "f", "v"]),
            args(&["xadd", "s", "*", "f", "v"]),
        ];
        let counted = Counted {
            what: What::Exec {
                exec,
                inner: queued.iter().map(|c| slot_of(c)).collect(),
            },
            since: Instant::now() - std::time::Duration::from_micros(8000),
        };
        let ran = Reply::Array(vec![Reply::Int(1), Reply::Int(2)]);
        stats.shards[0].answered(counted, &ran);
        let latencies = stats.latencies(usize::from(xadd)).unwrap();
        assert_eq!(latencies.calls(), 6);
        let p = latencies.percentile(100.0);
        assert!((4_000_000..8_000_000).contains(&p), "{p}");
        let exec_latencies = stats.latencies(usize::from(exec)).unwrap();
        assert!(exec_latencies.percentile(50.0) >= 8_000_000);
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
