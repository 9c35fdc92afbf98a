//! Pipelined stream commands gathered into runs. While a connection's
//! requests are parsed, consecutive single-stream commands (key first:
//! `XADD`, `XLEN`, `XRANGE`, `XACK`...) are gathered instead of sent one by
//! one. When the parsed requests run out (`on_drained`), another kind of
//! request comes, [`RUN_MAX`] are gathered, or their replies may hold more
//! than [`RUN_ENTRIES_MAX`] entries, the run goes out:
//!
//! - all on one stream: one [`ExecRun`] ask to that stream's actor;
//! - over several streams: one `ExecRun` per stream, each sent at once to
//!   its actor, wherever it lives (asks from one connection to one actor
//!   arrive in the order sent, so a stream's commands keep their order
//!   across runs and the requests around them).
//!
//! Either way, a stream whose actor sits idle on this shard runs its
//! commands at once, in this task (`LocalActors::run_now`, the actor found
//! by key in this shard's table: no ask, no task switch, no `Addr` made),
//! up to the first that must read evicted entries back from the
//! log; what is left goes in the `ExecRun`. An actor with anything queued
//! (an earlier ask of this connection included) is not idle, so the
//! order above holds.
//!
//! Each command still runs as it would alone and gets its own reply; the
//! replies are written in request order. Commands on different streams
//! may run in another order than they came, as they may when sent one by
//! one to actors on different shards; a stream's own commands keep their
//! order.

use bytes::Bytes;
use mailring_transports::SessionCtx;

use mailring_actors::{AskError, RunNowError};

use super::{settle, unavailable, RespSession};
use crate::actor::{Answer, ExecRun, StreamActor};
use crate::command::{self, Kind};
use crate::command_stats::{Counted, RunCount, Slot};
use crate::resp::Reply;
use crate::server::MAX_KEY_LEN;

/// The most commands one run gathers (it counts towards no pipeline
/// window while gathered).
pub(super) const RUN_MAX: usize = 64;

/// The most entries the replies of one run's range reads may hold
/// together (by their `COUNT`s) before the run goes: a read with no
/// `COUNT`, or a big one, ends its run. Between runs the connection takes
/// a request only while less than its outbound limit waits to be sent, so
/// a client that sends many big reads and does not read the replies has a
/// few of them queued, not a whole run's (Redis queues every one).
pub(super) const RUN_ENTRIES_MAX: u64 = 4096;

/// Stream commands (key first) from consecutive requests, in order.
#[derive(Debug)]
pub(super) struct Run {
    commands: Commands,
    /// Where each command counts (`INFO commandstats`), in order.
    slots: [Option<Slot>; RUN_MAX],
    /// The most entries their replies may hold ([`reply_entries`]).
    entries: u64,
    /// When its first command was taken (`INFO commandstats`' time).
    since: std::time::Instant,
}

/// A run's commands: each one's name and arguments.
pub(super) type Commands = Vec<(&'static str, Vec<Bytes>)>;

impl Run {
    /// A run that gathers into `commands` (empty; its room is kept).
    fn with_commands(commands: Commands) -> Self {
        debug_assert!(commands.is_empty());
        Run {
            commands,
            slots: [None; RUN_MAX],
            entries: 0,
            since: std::time::Instant::now(),
        }
    }
}

/// The most entries the reply of stream command `name` may hold where
/// its arguments bound it (the range reads' `COUNT`, `XPENDING`'s count;
/// none: without bound); 1 for the other commands, whose replies are
/// small or bounded by the request's own size.
fn reply_entries(name: &str, args: &[Bytes]) -> u64 {
    let count = |n: &Bytes| {
        std::str::from_utf8(n)
            .ok()
            .and_then(|n| n.parse::<i64>().ok())
            .map_or(1, |n| n.max(0) as u64)
    };
    match (name, args) {
        ("xrange" | "xrevrange", [_, _, _, _]) => u64::MAX,
        ("xrange" | "xrevrange", [_, _, _, _, word, n]) if word.eq_ignore_ascii_case(b"count") => {
            count(n)
        }
        // `XPENDING key group [[IDLE ms] start end count [consumer]]`.
        ("xpending", [_, _, _, idle, _, _, _, n, ..]) if idle.eq_ignore_ascii_case(b"idle") => {
            count(n)
        }
        ("xpending", [_, _, _, _, _, n, ..]) => count(n),
        _ => 1,
    }
}

impl Run {
    /// Whether every command gathered so far is on stream `key`.
    pub(super) fn is_on(&self, key: &[u8]) -> bool {
        self.commands.iter().all(|(_, args)| args[1] == key)
    }

    /// Whether a command gathered so far is on stream `key`. A command is
    /// gathered only for a name placed, or one it or an earlier command
    /// of the run may make (the names are placed when the run is sent):
    /// either way not a missing stream for the commands after it.
    pub(super) fn names(&self, key: &[u8]) -> bool {
        self.commands.iter().any(|(_, args)| args[1] == key)
    }
}

/// Places in a run (bit `i`: the run's command `i`); a run holds at most
/// [`RUN_MAX`] = 64 commands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Places(u64);

const _: () = assert!(RUN_MAX <= 64, "a run's places are the bits of a u64");

impl Places {
    fn add(&mut self, i: usize) {
        self.0 |= 1 << i;
    }

    fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    fn has(self, i: usize) -> bool {
        self.0 & (1 << i) != 0
    }

    /// The places in increasing order.
    fn iter(self) -> impl Iterator<Item = usize> {
        let mut rest = self.0;
        std::iter::from_fn(move || {
            (rest != 0).then(|| {
                let i = rest.trailing_zeros() as usize;
                rest &= rest - 1;
                i
            })
        })
    }
}

/// A run's commands for one stream: their places in the run.
struct StreamPart {
    /// The place of its first command, whose key (argument 1) names the
    /// stream.
    first: usize,
    /// [`key_tag`] of the stream, compared before its bytes.
    tag: u64,
    at: Places,
}

/// The commands of one stream sent in an `ExecRun` ask (those that did not
/// run at once), with their places.
struct Asked {
    at: Places,
    reply: mailring_actors::Reply<Vec<Answer>>,
}

impl RespSession {
    /// Whether `args` (the command `spec`) may join the gathered run: an
    /// authenticated stream command (key first) of the right arity,
    /// outside `MULTI`.
    pub(super) fn joins_run(&self, spec: Option<&command::Spec>, args: &[Bytes]) -> bool {
        let Some(spec) = spec else {
            return false;
        };
        self.run.is_some()
            && self.authenticated
            && self.multi.is_none()
            && matches!(spec.kind, Kind::Stream(1))
            && command::arity_ok(spec, args.len())
            // A key past the limit is answered at once, after the run.
            && args[1].len() <= MAX_KEY_LEN
    }

    /// Adds stream command `name` (key first) to the run, and sends the
    /// run once that fills it, in commands or in the entries its replies
    /// may hold (not with the next command: that one would then wait alone
    /// behind a full pipeline window and go as a run of one).
    pub(super) fn gather(
        &mut self,
        name: &'static str,
        slot: Option<Slot>,
        args: Vec<Bytes>,
        cx: &mut SessionCtx<Self>,
    ) {
        let run = match &mut self.run {
            Some(run) => run,
            none => none.insert(Run::with_commands(std::mem::take(&mut self.spare_commands))),
        };
        run.entries = run.entries.saturating_add(reply_entries(name, &args));
        run.slots[run.commands.len()] = slot;
        run.commands.push((name, args));
        if run.commands.len() >= RUN_MAX || run.entries > RUN_ENTRIES_MAX {
            self.send_run(cx);
        }
    }

    /// Sends the gathered run (see the module's doc); its replies are
    /// written in order once all have come. A single command goes alone.
    pub(super) fn send_run(&mut self, cx: &mut SessionCtx<Self>) {
        let Some(mut run) = self.run.take() else {
            return;
        };
        let n = run.commands.len();
        if n == 1 {
            let (name, args) = run.commands.pop().expect("one command");
            let counted = run.slots[0].map(|slot| Counted::one_since(slot, run.since));
            self.spare_commands = run.commands;
            // The request being handled keeps its own count.
            let current = self.counting.take();
            self.to_stream(name, 1, args, counted, cx);
            self.counting.set(current);
            return;
        }
        // Counted once the replies are ready.
        let (slots, counts, since) = (run.slots, self.counts.clone(), run.since);
        let proto = self.proto;
        let broker = self.shared.id;
        let system = &self.shared.system;
        let mut commands = run.commands;
        let first = &commands[0].1[1];
        let parts = if commands.iter().all(|(_, args)| args[1] == *first) {
            let all = Places(if n == 64 { u64::MAX } else { (1 << n) - 1 });
            vec![StreamPart {
                first: 0,
                tag: 0,
                at: all,
            }]
        } else {
            by_stream(&commands)
        };
        // Each command's answer, in its place, as it comes.
        let mut answers: Vec<Option<Answer>> = Vec::with_capacity(n);
        answers.resize_with(n, || None);
        // Per stream, what did not run at once is asked, now: a stream's
        // asks from this connection arrive in the order they were sent (a
        // task spawned on the stream's shard to ask there could run after a
        // later ask sent straight to the actor, and the stream would see a
        // later request first).
        let mut asked: Vec<Asked> = Vec::new();
        // Commands that did not run, their stream's actor having panicked
        // at one run before them.
        let mut panicked = Places::default();
        // No reference made (nor its key copied) for a stream run at once:
        // the actor is found in this shard's table by key.
        let here = system.local_actors::<StreamActor>();
        for part in parts {
            let stream = &commands[part.first].1[1];
            let run = |a: &mut StreamActor| {
                a.run_at_once(part.at.iter().map(|i| (i, &commands[i])), &mut answers)
            };
            let ran = match &here {
                Some(here) => here.run_now(stream, run),
                None => Err(RunNowError::NotIdle(run)),
            };
            let panic = match ran {
                Ok(true) => {
                    // Left holding nothing, as its handler would have
                    // ended it.
                    system.keyed::<StreamActor>(stream.clone()).stop();
                    false
                }
                Ok(false) | Err(RunNowError::NotIdle(_)) => false,
                Err(RunNowError::Panicked) => true,
            };
            let mut rest = Places::default();
            for i in part.at.iter().filter(|&i| answers[i].is_none()) {
                rest.add(i);
            }
            if rest == Places::default() {
                continue;
            }
            if panic {
                panicked.0 |= rest.0;
                continue;
            }
            // Before its commands are taken: `first` is one of them.
            let addr = system.keyed::<StreamActor>(commands[part.first].1[1].clone());
            let commands = rest
                .iter()
                .map(|i| (commands[i].0, std::mem::take(&mut commands[i].1)))
                .collect();
            let reply = addr.ask(ExecRun { commands, broker });
            asked.push(Asked { at: rest, reply });
        }
        drop(commands);
        if asked.is_empty() && answers.iter().flatten().all(|a| a.durable.is_none()) {
            // Everything answered now: the replies go out in order, with
            // no future to wait on.
            let mut count = RunCount::new(&counts, n, since);
            for (answer, slot) in answers.into_iter().zip(slots) {
                let reply = match answer {
                    Some(a) => a.reply,
                    None => unavailable(AskError::Panicked),
                };
                count.note(slot, &reply);
                cx.send_frame(reply.frame(proto));
            }
            return;
        }
        cx.reply_later_many(n, async move {
            for Asked { at, reply } in asked {
                match reply.await {
                    Ok(got) => {
                        debug_assert_eq!(got.len(), at.len(), "one answer per command");
                        for (answer, i) in got.into_iter().zip(at.iter()) {
                            answers[i] = Some(answer);
                        }
                    }
                    Err(e) => {
                        for i in at.iter() {
                            answers[i] = Some(unavailable(e).into());
                        }
                    }
                }
            }
            let mut frames = Vec::with_capacity(n);
            for (i, answer) in answers.into_iter().enumerate() {
                let reply = match answer {
                    // Settled: what it changed is flushed.
                    Some(a) => settle(Ok(a)).await,
                    None if panicked.has(i) => unavailable(AskError::Panicked),
                    // Not reached: every place is answered.
                    None => Reply::err("stream unavailable: no answer"),
                };
                frames.push(reply.frame(proto));
            }
            // Counted once all are ready (flushes included, as for a
            // command sent alone).
            let mut count = RunCount::new(&counts, n, since);
            for (frame, slot) in frames.iter().zip(slots) {
                count.note(slot, &frame.1);
            }
            drop(count);
            frames
        });
    }
}

/// `commands` grouped by stream (argument 1), streams in order of first
/// appearance, with each stream's places in the run.
fn by_stream(commands: &[(&'static str, Vec<Bytes>)]) -> Vec<StreamPart> {
    // Parts found by their key's tag in a small open-addressed table: slot
    // `s` holds a part's index plus one (0: empty). At most half full.
    const SLOTS: usize = 2 * RUN_MAX;
    // Places are bits of a u64, and the table stays at most half full.
    assert!(
        commands.len() <= RUN_MAX,
        "a run holds at most RUN_MAX commands"
    );
    let mut table = [0u8; SLOTS];
    let mut parts: Vec<StreamPart> = Vec::with_capacity(commands.len());
    for (i, (_, args)) in commands.iter().enumerate() {
        let key = &args[1];
        let tag = key_tag(key);
        let mut slot = (tag.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 57) as usize % SLOTS;
        loop {
            match table[slot] {
                0 => {
                    parts.push(StreamPart {
                        first: i,
                        tag,
                        at: Places(1 << i),
                    });
                    table[slot] = parts.len() as u8;
                    break;
                }
                n => {
                    // Keys compared by their tag first (`s:1`, `s:2`...
                    // differ there).
                    let part = &mut parts[usize::from(n) - 1];
                    if part.tag == tag && commands[part.first].1[1] == *key {
                        part.at.add(i);
                        break;
                    }
                    slot = (slot + 1) % SLOTS;
                }
            }
        }
    }
    parts
}

/// A word that two equal keys share: the last (up to) seven bytes and the
/// length's low byte.
fn key_tag(key: &[u8]) -> u64 {
    let tail = &key[key.len().saturating_sub(7)..];
    let mut word = [0u8; 8];
    word[..tail.len()].copy_from_slice(tail);
    word[7] = key.len() as u8;
    u64::from_le_bytes(word)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &str) -> Vec<Bytes> {
        words
            .split(' ')
            .map(|w| Bytes::copy_from_slice(w.as_bytes()))
            .collect()
    }

    #[test]
    fn reply_entries_are_bounded_by_counts_and_unbounded_without() {
        let cases = [
            ("xrange", "XRANGE s - +", u64::MAX),
            ("xrevrange", "XREVRANGE s + -", u64::MAX),
            ("xrange", "XRANGE s - + COUNT 100", 100),
            ("xrange", "XRANGE s - + count 5000", 5000),
            ("xrange", "XRANGE s - + COUNT -3", 0),
            // Refused by the command itself: weighs as one.
            ("xrange", "XRANGE s - + COUNT x", 1),
            ("xrange", "XRANGE s - + LIMIT 5", 1),
            ("xpending", "XPENDING s g", 1),
            ("xpending", "XPENDING s g - + 7000", 7000),
            ("xpending", "XPENDING s g - + 10 alice", 10),
            ("xpending", "XPENDING s g IDLE 100 - + 9000", 9000),
            ("xadd", "XADD s * f v", 1),
            ("xlen", "XLEN s", 1),
        ];
        for (name, words, want) in cases {
            assert_eq!(reply_entries(name, &args(words)), want, "{words}");
        }
    }

    fn xadd(key: &str) -> (&'static str, Vec<Bytes>) {
        let args = ["XADD", key, "*", "f", "v"];
        (
            "xadd",
            args.iter()
                .map(|a| Bytes::copy_from_slice(a.as_bytes()))
                .collect(),
        )
    }

    #[test]
    fn places_iterate_in_order_up_to_the_last_bit() {
        let mut at = Places::default();
        for i in [63, 0, 5, 6] {
            at.add(i);
        }
        assert_eq!(at.len(), 4);
        assert_eq!(at.iter().collect::<Vec<_>>(), [0, 5, 6, 63]);
        assert_eq!(Places::default().iter().count(), 0);
    }

    #[test]
    fn a_run_groups_by_stream_in_order_of_first_appearance() {
        // `a-1234567` and `b-1234567` share a tag (length, last seven
        // bytes): the bytes still tell them apart.
        let keys = ["s:1", "a-1234567", "s:1", "b-1234567", "s:10", "a-1234567"];
        let commands: Vec<_> = keys.iter().map(|k| xadd(k)).collect();
        let parts = by_stream(&commands);
        let got: Vec<(&[u8], Vec<usize>)> = parts
            .iter()
            .map(|p| (&commands[p.first].1[1][..], p.at.iter().collect()))
            .collect();
        assert_eq!(
            got,
            [
                (&b"s:1"[..], vec![0, 2]),
                (&b"a-1234567"[..], vec![1, 5]),
                (&b"b-1234567"[..], vec![3]),
                (&b"s:10"[..], vec![4]),
            ]
        );
        for p in &parts {
            assert_eq!(p.at.iter().next(), Some(p.first), "its first place");
            assert!(p
                .at
                .iter()
                .all(|i| commands[i].1[1] == commands[p.first].1[1]));
        }
        assert_eq!(key_tag(b"a-1234567"), key_tag(b"b-1234567"));
        assert_ne!(key_tag(b"s:1"), key_tag(b"s:10"));
        assert_eq!(key_tag(b""), 0);
    }

    /// Random runs over few or many keys (some sharing tags) group as a
    /// plain search of the parts so far groups them.
    #[test]
    fn a_run_groups_as_a_linear_search_would() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for round in 0..500 {
            let n = 1 + (next() % RUN_MAX as u64) as usize;
            let keys = 1 + next() % [2, 16, 100, 1000][round % 4];
            let names: Vec<String> = (0..n)
                .map(|_| match next() % keys {
                    // Same length, same last seven bytes: one tag.
                    k if k % 3 == 0 => format!("{k:04}-1234567"),
                    k => format!("s:{k}"),
                })
                .collect();
            let commands: Vec<_> = names.iter().map(|k| xadd(k)).collect();
            let mut want: Vec<(String, Vec<usize>)> = Vec::new();
            for (i, k) in names.iter().enumerate() {
                match want.iter_mut().find(|(w, _)| w == k) {
                    Some((_, at)) => at.push(i),
                    None => want.push((k.clone(), vec![i])),
                }
            }
            let got: Vec<(String, Vec<usize>)> = by_stream(&commands)
                .iter()
                .map(|p| (names[p.first].clone(), p.at.iter().collect()))
                .collect();
            assert_eq!(got, want, "round {round}");
        }
    }

    #[test]
    fn a_full_run_groups_by_stream_when_every_key_shares_a_tag() {
        // 64 keys of one tag (same length, same last seven bytes): told
        // apart by their bytes.
        let keys: Vec<String> = (0..RUN_MAX).map(|i| format!("{i:02}-1234567")).collect();
        let mut order: Vec<&str> = keys.iter().map(String::as_str).collect();
        // Half the streams twice: the second command joins the first.
        order.extend(keys.iter().step_by(2).map(String::as_str));
        let order = &order[RUN_MAX / 2..RUN_MAX + RUN_MAX / 2];
        let commands: Vec<_> = order.iter().map(|k| xadd(k)).collect();
        let parts = by_stream(&commands);
        let mut seen = 0;
        for p in &parts {
            for i in p.at.iter() {
                assert_eq!(order[i].as_bytes(), &commands[p.first].1[1][..]);
                seen += 1;
            }
        }
        assert_eq!(seen, order.len());
        assert_eq!(parts.len(), RUN_MAX / 2 + RUN_MAX / 4);
        assert!(keys
            .iter()
            .all(|k| key_tag(k.as_bytes()) == key_tag(keys[0].as_bytes())));
    }
}
