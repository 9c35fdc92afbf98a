//! Pipelined stream commands gathered into runs. While a connection's
//! requests are parsed, consecutive single-stream commands (key first:
//! `XADD`, `XLEN`, `XRANGE`, `XACK`...) are gathered instead of sent one by
//! one. When the parsed requests run out (`on_drained`), another kind of
//! request comes, or [`RUN_MAX`] are gathered, the run goes out:
//!
//! - all on one stream: one [`ExecRun`] ask to that stream's actor;
//! - over several streams: one `ExecRun` per stream, each sent at once to
//!   its actor, wherever it lives (asks from one connection to one actor
//!   arrive in the order sent, so a stream's commands keep their order
//!   across runs and the requests around them).
//!
//! Either way, a stream whose actor sits idle on this shard runs its
//! commands at once, in this task (`Addr::run_now`: no ask, no task
//! switch), up to the first that must read evicted entries back from the
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

use mailring_actors::{AskError, RunNowError, SystemHandle};

use super::{settle, unavailable, RespSession};
use crate::actor::{Answer, ExecRun, StreamActor};
use crate::command::{self, Kind};
use crate::resp::{Protocol, Reply};
use crate::server::MAX_KEY_LEN;

/// The most commands one run gathers (it counts towards no pipeline
/// window while gathered).
pub(super) const RUN_MAX: usize = 64;

/// Stream commands (key first) from consecutive requests, in order.
#[derive(Debug, Default)]
pub(super) struct Run {
    commands: Vec<(&'static str, Vec<Bytes>)>,
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

/// A run's commands for one stream, with their places in the run.
struct StreamPart {
    stream: Bytes,
    /// [`key_tag`] of `stream`, compared before its bytes.
    tag: u64,
    at: Places,
    commands: Vec<(&'static str, Vec<Bytes>)>,
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
    /// run once that fills it (not with the next command: that one would
    /// then wait alone behind a full pipeline window and go as a run of
    /// one).
    pub(super) fn gather(
        &mut self,
        name: &'static str,
        args: Vec<Bytes>,
        cx: &mut SessionCtx<Self>,
    ) {
        let run = self.run.get_or_insert_with(Run::default);
        run.commands.push((name, args));
        if run.commands.len() >= RUN_MAX {
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
            return self.to_stream(name, 1, args, cx);
        }
        let proto = self.proto;
        let broker = self.shared.id;
        let system = &self.shared.system;
        let first = &run.commands[0].1[1];
        let parts: Vec<(Places, PartReply)> =
            if run.commands.iter().all(|(_, args)| args[1] == *first) {
                let stream = first.clone();
                let all = Places(if n == 64 { u64::MAX } else { (1 << n) - 1 });
                vec![(all, run_part(system, stream, run.commands, broker))]
            } else {
                // One ask per stream (for what does not run at once), each
                // sent now, to its actor wherever it lives: a stream's asks
                // from this connection arrive in the order they were sent (a
                // task spawned on the stream's shard to ask there could run
                // after a later ask sent straight to the actor, and the
                // stream would see a later request first).
                by_stream(run.commands)
                    .into_iter()
                    .map(|part| {
                        (
                            part.at,
                            run_part(system, part.stream, part.commands, broker),
                        )
                    })
                    .collect()
            };
        if parts.iter().all(|(_, p)| p.is_ready()) {
            // Everything answered now: the replies go out in order, with
            // no future to wait on.
            let mut frames: Vec<Option<(Protocol, Reply)>> = vec![None; n];
            for (at, part) in parts {
                part.fill_ready(at, proto, &mut frames);
            }
            for f in frames {
                cx.send_frame(f.unwrap_or_else(|| no_answer().frame(proto)));
            }
            return;
        }
        cx.reply_later_many(n, async move {
            // Each place filled as its stream's answers come (settled:
            // what they changed is flushed), then all in request order.
            let mut frames: Vec<Option<(Protocol, Reply)>> = vec![None; n];
            for (at, part) in parts {
                part.fill(at, proto, &mut frames).await;
            }
            frames
                .into_iter()
                // Not reached: every place is filled by its stream's answers.
                .map(|f| f.unwrap_or_else(|| no_answer().frame(proto)))
                .collect()
        });
    }
}

/// The reply in a place no answer filled (not reached).
fn no_answer() -> Reply {
    Reply::err("stream unavailable: no answer")
}

/// Where a stream's answers to a run come from: those of the first
/// commands, run at once on the idle actor, then those of the rest,
/// asked; or, when a command run at once panicked (the actor is
/// restarted), the answers of those before it, and `failed` for it and
/// every command after it (which did not run).
pub(super) struct PartReply {
    now: Vec<Answer>,
    later: Option<mailring_actors::Reply<Vec<Answer>>>,
    failed: Option<AskError>,
}

/// Runs `commands` (all on `stream`) on its actor: at once when it is
/// idle on this shard, up to the first command that needs its handler's
/// await; the rest (or all) in an `ExecRun` ask, sent now.
pub(super) fn run_part(
    system: &SystemHandle,
    stream: Bytes,
    mut commands: Vec<(&'static str, Vec<Bytes>)>,
    broker: u64,
) -> PartReply {
    let addr = system.keyed::<StreamActor>(stream);
    let mut now = Vec::new();
    match addr.run_now(|a| a.run_at_once(&mut commands, &mut now)) {
        Ok(ends) => {
            if ends {
                // As its handler would have ended it.
                addr.stop();
            }
        }
        Err(RunNowError::NotIdle(_)) => {}
        Err(RunNowError::Panicked) => {
            return PartReply {
                now,
                later: None,
                failed: Some(AskError::Panicked),
            }
        }
    }
    let later = (!commands.is_empty()).then(|| addr.ask(ExecRun { commands, broker }));
    PartReply {
        now,
        later,
        failed: None,
    }
}

impl PartReply {
    /// Whether every reply is known now (nothing asked, nothing to flush
    /// first).
    fn is_ready(&self) -> bool {
        self.later.is_none() && self.now.iter().all(|a| a.durable.is_none())
    }

    /// Fills `frames` at places `at` from a part that [`is_ready`](Self::is_ready).
    fn fill_ready(self, at: Places, proto: Protocol, frames: &mut [Option<(Protocol, Reply)>]) {
        let mut places = at.iter();
        // `now` first: once it runs out, no place is taken.
        for (answer, i) in self.now.into_iter().zip(places.by_ref()) {
            frames[i] = Some(answer.reply.frame(proto));
        }
        if let Some(e) = self.failed {
            let reply = unavailable(e);
            for i in places {
                frames[i] = Some(reply.clone().frame(proto));
            }
        }
    }

    /// Fills `frames` at places `at`, in order, each answer settled (what
    /// it changed flushed) and the asked ones once they come.
    async fn fill(self, at: Places, proto: Protocol, frames: &mut [Option<(Protocol, Reply)>]) {
        let mut places = at.iter();
        let asked = at.len() - self.now.len();
        for (answer, i) in self.now.into_iter().zip(places.by_ref()) {
            frames[i] = Some(settle(Ok(answer)).await.frame(proto));
        }
        let failed = match (self.failed, self.later) {
            (Some(e), _) => e,
            (None, None) => return,
            (None, Some(later)) => match later.await {
                Ok(answers) => {
                    debug_assert_eq!(answers.len(), asked, "one answer per command");
                    for (answer, i) in answers.into_iter().zip(places.by_ref()) {
                        frames[i] = Some(settle(Ok(answer)).await.frame(proto));
                    }
                    return;
                }
                Err(e) => e,
            },
        };
        let reply = unavailable(failed);
        for i in places {
            frames[i] = Some(reply.clone().frame(proto));
        }
    }
}

/// `commands` grouped by stream (argument 1), streams in order of first
/// appearance, each stream's commands in order.
fn by_stream(commands: Vec<(&'static str, Vec<Bytes>)>) -> Vec<StreamPart> {
    let mut parts: Vec<StreamPart> = Vec::with_capacity(commands.len());
    for (i, (name, args)) in commands.into_iter().enumerate() {
        let tag = key_tag(&args[1]);
        // Keys compared by their tag first (`s:1`, `s:2`... differ there).
        match parts
            .iter_mut()
            .find(|p| p.tag == tag && p.stream == args[1])
        {
            Some(p) => {
                p.at.add(i);
                p.commands.push((name, args));
            }
            None => {
                let mut at = Places::default();
                at.add(i);
                parts.push(StreamPart {
                    stream: args[1].clone(),
                    tag,
                    at,
                    commands: vec![(name, args)],
                });
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
        let parts = by_stream(keys.iter().map(|k| xadd(k)).collect());
        let got: Vec<(&[u8], Vec<usize>)> = parts
            .iter()
            .map(|p| (&p.stream[..], p.at.iter().collect()))
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
            assert_eq!(p.commands.len(), p.at.len());
            assert!(p.commands.iter().all(|(_, args)| args[1] == p.stream));
        }
        assert_eq!(key_tag(b"a-1234567"), key_tag(b"b-1234567"));
        assert_ne!(key_tag(b"s:1"), key_tag(b"s:10"));
        assert_eq!(key_tag(b""), 0);
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
        let parts = by_stream(order.iter().map(|k| xadd(k)).collect());
        let mut seen = 0;
        for p in &parts {
            for i in p.at.iter() {
                assert_eq!(order[i].as_bytes(), &p.stream[..]);
                seen += 1;
            }
            assert_eq!(p.commands.len(), p.at.len());
        }
        assert_eq!(seen, order.len());
        assert_eq!(parts.len(), RUN_MAX / 2 + RUN_MAX / 4);
        assert!(keys
            .iter()
            .all(|k| key_tag(k.as_bytes()) == key_tag(keys[0].as_bytes())));
    }
}
