//! `MULTI` / `EXEC` / `DISCARD`. A transaction's data commands run in the
//! actors of the streams they name, in order, with no other client's
//! command between them, and their changes are logged together (one
//! record, or one group of records for several streams), so after a crash
//! all of them are there or none (as Redis drops an incomplete `MULTI`
//! block from its log). Several streams must share a shard (see
//! [`crate::actor`]'s `transaction` module): a transaction over streams on
//! different shards is refused at `EXEC`, since their logs cannot commit
//! together.

use bytes::Bytes;
use mailring_transports::SessionCtx;

use super::RespSession;
use crate::actor::{storage_error, AbsentStreams, BatchAnswer, ExecBatch, StreamActor};
use crate::command::{self, Kind, Spec};
use crate::resp::{Protocol, Reply};

/// The commands queued since `MULTI`.
#[derive(Debug, Default)]
pub(crate) struct Queue {
    commands: Vec<Vec<Bytes>>,
    /// A command was refused while queuing: `EXEC` aborts.
    spoiled: bool,
}

/// Redis's reply to a command refused before it ran (unknown, arity,
/// authentication): inside `MULTI` it spoils the transaction, and `EXEC`
/// itself refused ends it with `EXECABORT`.
pub(super) fn reject(session: &mut RespSession, exec: bool, error: Reply) -> Reply {
    if exec {
        session.multi = None;
        let text: &[u8] = match &error {
            Reply::Error(t) => t.strip_prefix("ERR ").unwrap_or(t).as_bytes(),
            Reply::ErrorBytes(t) => t.strip_prefix(b"ERR ").unwrap_or(t),
            _ => b"",
        };
        return Reply::error_bytes(&[b"EXECABORT Transaction discarded because of: ", text]);
    }
    if let Some(q) = session.multi.as_mut() {
        q.spoiled = true;
    }
    error
}

impl Queue {
    /// Queues a command, its arguments copied into one allocation of
    /// their own (in place in their list): as slices of the read buffer
    /// they would keep a whole buffer alive per queued command, and a
    /// client that queues small commands one write at a time, never
    /// sending `EXEC`, would make the server hold about a thousand times
    /// what it sent.
    fn push(&mut self, mut args: Vec<Bytes>) {
        let mut own = bytes::BytesMut::with_capacity(args.iter().map(Bytes::len).sum());
        for arg in &args {
            own.extend_from_slice(arg);
        }
        let mut own = own.freeze();
        for arg in &mut args {
            *arg = own.split_to(arg.len());
        }
        self.commands.push(args);
    }

    /// Commands queued so far.
    pub(crate) fn len(&self) -> usize {
        self.commands.len()
    }

    /// The commands queued, in order.
    pub(crate) fn commands(&self) -> &[Vec<Bytes>] {
        &self.commands
    }

    /// Whether a command was refused while queuing (`EXEC` aborts).
    pub(crate) fn spoiled(&self) -> bool {
        self.spoiled
    }
}

/// Queues a command inside `MULTI`.
pub(super) fn queue(session: &mut RespSession, args: Vec<Bytes>) -> Reply {
    session
        .multi
        .as_mut()
        .expect("queue is called inside MULTI")
        .push(args);
    Reply::Status("QUEUED")
}

/// The streams a queued command names (its data), if any.
pub(crate) fn streams_of<'a>(spec: &Spec, args: &'a [Bytes]) -> Vec<&'a Bytes> {
    match spec.kind {
        Kind::Stream(at) => args.get(at).into_iter().collect(),
        Kind::Read => match command::streams_at(args) {
            Some(at) if at < args.len() => {
                let keys = (args.len() - at) / 2;
                args[at..at + keys].iter().collect()
            }
            _ => Vec::new(),
        },
        Kind::Connection => match spec.name {
            "del" | "exists" | "type" => args[1..].iter().collect(),
            _ => Vec::new(),
        },
    }
}

/// What [`RespSession::transaction_command`] did with a command.
pub(super) enum Handled {
    /// Answered: send this.
    Reply(Reply),
    /// Answered later (a transaction went to a stream's actor).
    Later,
    /// Not a transaction command.
    No,
}

impl RespSession {
    /// `MULTI`, `EXEC`, `DISCARD` (and `WATCH` inside a transaction).
    pub(super) fn transaction_command(
        &mut self,
        spec: &Spec,
        cx: &mut SessionCtx<Self>,
    ) -> Handled {
        let reply = match spec.name {
            "multi" if self.multi.is_some() => Reply::err("MULTI calls can not be nested"),
            "multi" => {
                self.multi = Some(Queue::default());
                Reply::OK
            }
            "discard" => match self.multi.take() {
                Some(_) => Reply::OK,
                None => Reply::err("DISCARD without MULTI"),
            },
            "watch" if self.multi.is_some() => Reply::err("WATCH inside MULTI is not allowed"),
            "exec" => {
                let Some(queue) = self.multi.take() else {
                    return Handled::Reply(Reply::err("EXEC without MULTI"));
                };
                if queue.spoiled {
                    return Handled::Reply(Reply::Error(
                        "EXECABORT Transaction discarded because of previous errors.".to_owned(),
                    ));
                }
                return match self.exec(queue.commands, false, cx) {
                    Some(r) => Handled::Reply(r),
                    None => Handled::Later,
                };
            }
            _ => return Handled::No,
        };
        Handled::Reply(reply)
    }

    /// Runs a transaction: its reply now (no stream, or refused), or
    /// `None` when it went to a stream's actor and answers later.
    /// `bare`: the block is one command run as a transaction (see
    /// [`RespSession::run_as_transaction`]), answered with its own reply
    /// instead of an array of one.
    pub(super) fn exec(
        &mut self,
        commands: Vec<Vec<Bytes>>,
        bare: bool,
        cx: &mut SessionCtx<Self>,
    ) -> Option<Reply> {
        let specs: Vec<&'static Spec> = commands
            .iter()
            .map(|c| command::lookup(&c[0]).expect("queued commands were looked up"))
            .collect();
        let mut streams: Vec<&Bytes> = commands
            .iter()
            .zip(&specs)
            .flat_map(|(c, s)| streams_of(s, c))
            .collect();
        if streams.len() > 32 {
            // Many commands: duplicates go first, and the names sorted are
            // the distinct ones.
            let mut seen = std::collections::HashSet::with_capacity(streams.len());
            streams.retain(|s| seen.insert(*s));
        }
        streams.sort_unstable();
        streams.dedup();
        // Over several streams, those that do not exist and that no
        // command makes are absent: no stream, answered as missing by the
        // coordinator, placing and activating nothing. A name nobody
        // placed is no stream; nor is one the catalog lacks, when no
        // request of this connection is in flight (which may be making
        // it), and it was placed on another shard than the block's (a
        // deleted stream keeps its shard). The others are held: they must
        // share a shard (each shard logs its own; those placed already say
        // so now, the coordinator checks the rest as they join), the first
        // coordinates, and those not placed yet go on the placed ones'
        // shard. A name the catalog lacks on the block's shard is held all
        // the same: another client's transaction may be making it, and the
        // block sees that transaction in all its streams or in none.
        let multi = streams.len() > 1;
        let (mut held, mut absent): (Vec<Bytes>, Vec<Bytes>) = (Vec::new(), Vec::new());
        // Whether an absent name was placed: the catalog may lack it for
        // a deletion not flushed yet, which the reply waits for.
        let mut absent_placed = false;
        if multi {
            // The names some command may make, gathered once (asking
            // every command about every name would cost their product).
            let mut made: Vec<&Bytes> = commands
                .iter()
                .zip(&specs)
                .filter_map(|(c, spec)| match spec.kind {
                    Kind::Stream(at) if StreamActor::makes_stream(spec.name, c) => c.get(at),
                    _ => None,
                })
                .collect();
            made.sort_unstable();
            made.dedup();
            let makes = |s: &Bytes| made.binary_search(&s).is_ok();
            let settled = cx.pending_replies() == 0 && self.run.is_none();
            let system = &self.shared.system;
            let mut placed: Option<(&Bytes, mailring::ShardId)> = None;
            let mut missing = Vec::new();
            for s in &streams {
                let shard = system.placed_shard::<StreamActor>(s);
                let exists = match shard {
                    None => false,
                    Some(_) => !settled || self.shared.catalog.contains(s),
                };
                if !exists && !makes(s) {
                    missing.push((*s, shard));
                    continue;
                }
                if let Some(shard) = shard {
                    match placed {
                        Some(first) if first.1 != shard => {
                            return Some(crate::actor::across_shards(first, (s, shard)));
                        }
                        Some(_) => {}
                        None => placed = Some((s, shard)),
                    }
                }
                held.push((*s).clone());
            }
            // The block's shard: its placed streams', else this
            // connection's (where the streams it makes go).
            let home = placed.map_or(cx.shard(), |(_, shard)| shard);
            let holds = missing.iter().any(|(_, shard)| *shard == Some(home));
            for (s, shard) in missing {
                if shard == Some(home) {
                    held.push(s.clone());
                } else {
                    absent_placed |= shard.is_some();
                    absent.push(s.clone());
                }
            }
            if holds {
                held.sort_unstable();
            }
            // Every held name is placed now, on the block's shard: a
            // reader of several of them sees them all placed there, and
            // reads them as one snapshot (new ones too, which the block
            // would otherwise place one by one as it joins them).
            for s in &held {
                // A stream placed elsewhere meanwhile: the coordinator
                // finds it out as that stream declines.
                let _ = system.place::<StreamActor>(s.clone(), home);
            }
            let reads = commands.iter().any(|c| reads_catalog(c));
            if held.is_empty() && !reads && cx.pending_replies() == 0 {
                return self.answer_absent(&commands, &specs, &absent, absent_placed, bare, cx);
            }
            if held.is_empty() {
                // Catalog reads in turn: the first coordinates all the same.
                held.push(absent.remove(0));
            }
        }
        let streams: Vec<&Bytes> = if multi {
            held.iter().collect()
        } else {
            streams
        };
        let Some(stream) = streams.first().map(|s| (*s).clone()) else {
            // No stream: every command answers here, in order. `KEYS`,
            // `SCAN` and `INFO` read the catalog, which requests before this one may
            // still be changing: with replies pending they answer in turn,
            // and the requests after the transaction wait for it.
            // Each reply in the protocol in force when its command runs
            // (a `HELLO` among them switches it for those after).
            let mut protos = Vec::with_capacity(commands.len());
            let mut replies: Vec<Option<Reply>> = Vec::with_capacity(commands.len());
            for c in &commands {
                replies.push((!reads_catalog(c)).then(|| self.local_reply(c)));
                protos.push(self.proto);
            }
            let shows_names = commands.iter().any(|c| super::shows_names(c));
            if cx.pending_replies() == 0 || replies.iter().all(Option::is_some) {
                let replies = replies
                    .into_iter()
                    .zip(&commands)
                    .zip(&protos)
                    .map(|((r, c), p)| {
                        r.unwrap_or_else(|| super::catalog_reply(&self.shared, *p, c, &[]))
                    })
                    .collect();
                let reply = replies_of(replies, &protos, bare);
                if !shows_names {
                    return Some(reply);
                }
                self.reply_once_flushed(reply, cx);
                return None;
            }
            let (shared, proto) = (self.shared.clone(), self.proto);
            let count = self.count_later();
            cx.reply_later_in_turn(move || {
                for ((r, c), p) in replies.iter_mut().zip(&commands).zip(&protos) {
                    if r.is_none() {
                        *r = Some(super::catalog_reply(&shared, *p, c, &[]));
                    }
                }
                let replies = replies.into_iter().flatten().collect();
                let reply = replies_of(replies, &protos, bare);
                let unflushed = shared.catalog.unflushed();
                super::counting(count, async move {
                    match super::flushed(unflushed).await {
                        Ok(()) => reply,
                        Err(e) => e,
                    }
                    .frame(proto)
                })
            });
            cx.hold_frames_until_replied();
            return None;
        };
        // A name never placed is no stream, and a transaction that only
        // asks whether it exists makes none: answered here, placing
        // nothing (with nothing of the connection in flight, which may be
        // making it).
        let only_asks = commands.iter().zip(&specs).all(|(c, spec)| {
            streams_of(spec, c).is_empty() || matches!(spec.name, "exists" | "type")
        });
        // Nor one whose stream commands none may make it: each sees a
        // missing stream, answered here as its actor would answer (a
        // client reading names nobody made in transactions would otherwise
        // leave a record of each for good).
        let reads_only_missing = commands
            .iter()
            .zip(&specs)
            .all(|(c, spec)| match spec.kind {
                Kind::Stream(_) => !StreamActor::makes_stream(spec.name, c),
                _ => streams_of(spec, c).is_empty() && !reads_catalog(c),
            });
        if !multi
            && ((only_asks && cx.pending_replies() == 0) || reads_only_missing)
            && self
                .shared
                .system
                .placed_shard::<StreamActor>(&stream)
                .is_none()
        {
            let mut protos = Vec::with_capacity(commands.len());
            let mut replies = Vec::with_capacity(commands.len());
            for (c, spec) in commands.iter().zip(&specs) {
                replies.push(match (spec.name, spec.kind) {
                    ("exists", _) => Reply::Int(0),
                    ("type", _) => Reply::Status("none"),
                    // (A stream command that names no stream, `XINFO
                    // HELP`, answers as it does alone.)
                    (_, Kind::Stream(_)) if !streams_of(spec, c).is_empty() => {
                        StreamActor::answer_missing(spec.name, &stream, c, &self.shared)
                    }
                    _ => self.local_reply(c),
                });
                protos.push(self.proto);
            }
            let reply = replies_of(replies, &protos, bare);
            if !commands.iter().any(|c| super::shows_names(c)) {
                return Some(reply);
            }
            self.reply_once_flushed(reply, cx);
            return None;
        }
        // The session's own commands answer now; the data commands go to
        // the stream's actor as one batch, and the replies are merged back
        // in order. `KEYS`, `SCAN` and `INFO` go with them, answered at their place
        // in the batch (the actor updates the catalog as each command
        // runs).
        let mut local: Vec<Option<Reply>> = Vec::with_capacity(commands.len());
        let mut protos = Vec::with_capacity(commands.len());
        let mut batch = Vec::new();
        let mut batch_protos = Vec::new();
        for (c, spec) in commands.into_iter().zip(&specs) {
            if streams_of(spec, &c).is_empty() && !reads_catalog(&c) {
                local.push(Some(self.local_reply(&c)));
            } else {
                local.push(None);
                batch.push(c);
                batch_protos.push(self.proto);
            }
            protos.push(self.proto);
        }
        // `KEYS`, `SCAN`, `INFO` read the catalog, which the connection's
        // requests to other streams change: with replies pending, the
        // batch goes once they are ready (so it sees them), and the
        // requests after the transaction wait for it (so it sees none of
        // them).
        let reads = batch.iter().any(|c| reads_catalog(c));
        // (What names show, and what absent ones do not, waits for the
        // catalog's flush.)
        let shows_names = absent_placed || batch.iter().any(|c| super::shows_names(c));
        let (system, broker, proto) = (self.shared.system.clone(), self.shared.id, self.proto);
        let shared = self.shared.clone();
        let start = move || {
            let ask = system.keyed::<StreamActor>(stream).ask(ExecBatch {
                commands: batch,
                protos: batch_protos,
                broker,
                streams: if multi { held.clone() } else { Vec::new() },
                absent: absent.clone(),
                bare,
            });
            async move {
                let mut data = match ask.await {
                    Ok(BatchAnswer { replies, durable }) => {
                        if let Some(t) = durable {
                            if let Err(e) = t.await {
                                return storage_error(&e).frame(proto);
                            }
                        }
                        if shows_names {
                            // What it read of the names may still be
                            // flushing.
                            if let Err(e) = super::flushed(shared.catalog.unflushed()).await {
                                return e.frame(proto);
                            }
                        }
                        match replies {
                            Ok(replies) => replies.into_iter(),
                            Err(refused) if bare => return unwrapped(refused).frame(proto),
                            Err(refused) => return refused.frame(proto),
                        }
                    }
                    Err(e) => return super::unavailable(e).frame(proto),
                };
                let replies = local
                    .into_iter()
                    .map(|r| r.unwrap_or_else(|| data.next().unwrap_or(Reply::NilArray)))
                    .collect();
                replies_of(replies, &protos, bare).frame(proto)
            }
        };
        let count = self.count_later();
        if reads {
            cx.reply_later_in_turn(move || super::counting(count, start()));
            cx.hold_frames_until_replied();
        } else {
            cx.reply_later(super::counting(count, start()));
            if multi {
                // The streams after the first join as the coordinator
                // reaches them: the connection's next requests wait, so
                // none of them runs in a stream before the transaction.
                cx.hold_frames_until_replied();
            }
        }
        None
    }
}

impl RespSession {
    /// A transaction over streams that are all absent (see
    /// [`AbsentStreams`]): answered here, in order, placing nothing
    /// (`placed`: some of them were placed, and the reply waits for the
    /// catalog's flush, which may be of their deletion).
    fn answer_absent(
        &mut self,
        commands: &[Vec<Bytes>],
        specs: &[&'static Spec],
        absent: &[Bytes],
        placed: bool,
        bare: bool,
        cx: &mut SessionCtx<Self>,
    ) -> Option<Reply> {
        let mut streams = AbsentStreams::new(absent);
        let mut protos = Vec::with_capacity(commands.len());
        let mut replies = Vec::with_capacity(commands.len());
        for (c, spec) in commands.iter().zip(specs) {
            replies.push(if streams_of(spec, c).is_empty() {
                self.local_reply(c)
            } else {
                streams.answer(c, self.proto, &self.shared)
            });
            protos.push(self.proto);
        }
        let reply = replies_of(replies, &protos, bare);
        if !placed && !commands.iter().any(|c| super::shows_names(c)) {
            return Some(reply);
        }
        self.reply_once_flushed(reply, cx);
        None
    }
}

/// A command run as a transaction of its own answers a refusal with its
/// cause, as the command alone would (`-MISCONF ...`), without the
/// transaction's `EXECABORT` wrapping.
fn unwrapped(refused: Reply) -> Reply {
    const WRAP: &str = "EXECABORT Transaction discarded because of: ";
    let Reply::Error(e) = refused else {
        return refused;
    };
    match e.strip_prefix(WRAP) {
        // A cause with its own code (`MISCONF`, `ERR`).
        Some(cause)
            if cause
                .split(' ')
                .next()
                .is_some_and(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_uppercase())) =>
        {
            Reply::Error(cause.to_owned())
        }
        Some(cause) => Reply::Error(format!("ERR {cause}")),
        None => Reply::Error(e),
    }
}

/// `EXEC`'s reply: the commands' replies, each in the protocol in force
/// when it ran; `bare`: the one command's reply alone.
fn replies_of(replies: Vec<Reply>, protos: &[Protocol], bare: bool) -> Reply {
    if bare {
        return replies.into_iter().next().unwrap_or(Reply::NilArray);
    }
    Reply::array_in_protocols(replies, protos)
}

impl RespSession {
    /// A command over several streams of one shard (an `XREAD` of
    /// streams some of which are busy, as a transaction may hold them, an
    /// `XREADGROUP`, a `DEL`): run as a transaction of its one command,
    /// its streams joined in name order, so it reads or changes them all
    /// at one point between transactions instead of some before one and
    /// some after.
    pub(super) fn run_as_transaction(&mut self, args: &[Bytes], cx: &mut SessionCtx<Self>) {
        if let Some(reply) = self.exec(vec![args.to_vec()], true, cx) {
            self.reply(reply, cx);
        }
    }
}

/// Whether a session command reads the catalog of streams (`KEYS`,
/// `SCAN`, `INFO`'s count), which the stream commands before it may
/// change.
fn reads_catalog(command: &[Bytes]) -> bool {
    [&b"keys"[..], b"scan", b"info", b"dbsize"]
        .iter()
        .any(|c| command[0].eq_ignore_ascii_case(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `part` lies inside `whole`'s bytes.
    fn inside(part: &Bytes, whole: &Bytes) -> bool {
        let (p, w) = (part.as_ptr() as usize, whole.as_ptr() as usize);
        p >= w && p < w + whole.len()
    }

    #[test]
    fn a_queued_command_keeps_none_of_the_read_buffer() {
        let read = Bytes::from(vec![b'x'; 16 << 10]);
        let args = vec![
            read.slice(0..4),
            read.slice(4..5),
            read.slice(9..9),
            read.slice(5..9),
        ];
        let mut queue = Queue::default();
        queue.push(args.clone());
        let queued = &queue.commands()[0];
        assert_eq!(queued, &args);
        assert!(queued.iter().all(|a| a.is_empty() || !inside(a, &read)));
    }
}
