//! `MULTI`/`EXEC` over several streams of one shard.
//!
//! The stream whose name sorts first coordinates: its actor asks each
//! other stream, in name order, to join ([`Join`]). A stream that joins
//! holds: its handler waits for the coordinator's steps, so no other
//! message of it runs until the transaction ends. Because every
//! transaction takes its streams in name order, and a stream waits only
//! for streams after it, two transactions never wait on each other.
//!
//! Once every stream has joined, the coordinator runs the commands in
//! order, each in the actor of the stream it names (its own, or a step
//! sent to a joined stream), so each sees the transaction's earlier
//! commands and nobody else's. Then each stream seals its changes as one
//! record, the coordinator appends the records as one group (see
//! [`crate::log::encode_group`]), and tells each stream where its record
//! went: after a crash every stream has the transaction's changes or none
//! has. If the group cannot be logged, or a stream's actor fails midway,
//! every stream drops what the commands changed in memory and reads
//! itself back from the log.
//!
//! A stream that lives on another shard cannot join (its changes go to
//! another log, which cannot commit with this one): the transaction is
//! refused before any command runs.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use mailring::sync::oneshot;
use mailring::ShardId;
use mailring_actors::{Ctx, Handler, Message};

use super::{BatchAnswer, ExecBatch, GroupFrom, GroupRead, Signal, StreamActor};
use crate::command;
use crate::id::StreamId;
use crate::log::{Loc, Op, Record};
use crate::resp::{Protocol, Reply};
use crate::server::Shared;
use crate::store::{StorageError, Ticket};
use crate::stream::Fields;

/// Asks a stream to take part in a transaction that another stream of
/// shard `shard` coordinates (see the module's documentation).
#[derive(Debug, Message)]
pub struct Join {
    /// The coordinator's shard: a stream elsewhere declines.
    pub shard: ShardId,
    /// The broker (its id: a message touches no shared reference count).
    pub broker: u64,
    /// Where the stream says whether it joined.
    pub ready: oneshot::Sender<Joined>,
}

/// A stream's answer to [`Join`].
#[derive(Debug)]
pub struct Joined {
    /// The stream's shard.
    shard: ShardId,
    /// Where the coordinator sends the first step; `None`: it declined
    /// (another shard, or the broker is stopping).
    next: Option<oneshot::Sender<Turn>>,
    /// Whether the stream exists.
    exists: bool,
    /// The log's number of the stream's last append (what a read of it
    /// waits to be flushed).
    last_lsn: u64,
}

/// What the coordinator tells a joined stream.
#[derive(Debug)]
enum Turn {
    /// Do this, answer there.
    Step(Step, oneshot::Sender<Stepped>),
    /// Keep the changes: the stream's record went to `loc` (no place:
    /// it had none), flushed with `ticket`; say when they are kept (the
    /// catalog told), so `EXEC`'s reply comes after.
    Commit(Ticket, Loc, oneshot::Sender<()>),
    /// Drop the changes.
    Abort,
}

/// Commands, each with the protocol in force when it runs.
type Commands = Vec<(Vec<Bytes>, Protocol)>;

/// One step of a transaction in one stream.
#[derive(Debug)]
enum Step {
    /// A command naming this stream.
    Run(Vec<Bytes>, Protocol),
    /// Commands naming this stream alone, in order: a run of the
    /// transaction's commands, each of which names one stream.
    RunMany(Commands),
    /// `XREAD`'s read of this stream: entries after the id (`None`: `$`).
    Read(Option<StreamId>, Option<u64>),
    /// Whether the stream has this group.
    HasGroup(Bytes),
    /// `XREADGROUP`'s read of this stream.
    ReadGroup {
        group: Bytes,
        consumer: Bytes,
        from: GroupFrom,
        count: Option<u64>,
        noack: bool,
    },
    /// The stream's changes as one record (none if it has none), whether
    /// the stream was missing before the transaction, and the log's
    /// number of its last append.
    Seal,
}

/// A step's result.
#[derive(Debug)]
enum Done {
    Reply(Reply),
    Replies(Vec<Reply>),
    Entries(Vec<(StreamId, Fields)>),
    HasGroup(bool),
    Group(GroupRead),
    Sealed(Option<Record>, bool, u64),
}

/// A step's answer, with where the next turn goes.
#[derive(Debug)]
struct Stepped {
    done: Done,
    exists: bool,
    /// Whether the transaction has changed the stream so far.
    changed: bool,
    next: oneshot::Sender<Turn>,
}

/// A joined stream, as the coordinator sees it.
#[derive(Debug)]
struct Member {
    name: Bytes,
    next: Option<oneshot::Sender<Turn>>,
    exists: bool,
    /// Whether it existed as it joined (as the catalog has it, since
    /// only the stream tells the catalog, and it is held).
    existed: bool,
    /// Whether the transaction has changed the stream (only then is it
    /// asked for a record, and its commit waited for).
    changed: bool,
}

/// A member's actor went away midway (it panicked, or the broker
/// stopped).
#[derive(Debug)]
struct Gone(Bytes);

impl Member {
    async fn step(&mut self, step: Step) -> Result<Done, Gone> {
        let answer = self.send(step)?;
        self.receive(answer).await
    }

    /// Sends `step`; its answer comes to [`Member::receive`] (meanwhile
    /// the member runs it, and the coordinator may send other members
    /// theirs).
    fn send(&mut self, step: Step) -> Result<oneshot::Receiver<Stepped>, Gone> {
        let next = self.next.take().ok_or_else(|| Gone(self.name.clone()))?;
        let (tx, rx) = oneshot::channel();
        next.send(Turn::Step(step, tx))
            .map_err(|_| Gone(self.name.clone()))?;
        Ok(rx)
    }

    async fn receive(&mut self, answer: oneshot::Receiver<Stepped>) -> Result<Done, Gone> {
        let Stepped {
            done,
            exists,
            changed,
            next,
        } = answer.await.map_err(|_| Gone(self.name.clone()))?;
        self.next = Some(next);
        self.exists = exists;
        self.changed = changed;
        Ok(done)
    }

    fn end(&mut self, turn: Turn) {
        if let Some(next) = self.next.take() {
            let _ = next.send(turn);
        }
    }

    /// Tells the member to keep its part (its record at `loc`, or none):
    /// completes once it has (`None`: it was let go already).
    fn commit(&mut self, ticket: &Ticket, loc: Loc) -> Option<oneshot::Receiver<()>> {
        let next = self.next.take()?;
        let (kept, done) = oneshot::channel();
        next.send(Turn::Commit(ticket.clone(), loc, kept)).ok()?;
        Some(done)
    }
}

impl StreamActor {
    /// Brings back, through the ring, the evicted entries a read step is
    /// about to read (a read over several streams runs as a transaction
    /// of its own: without this each of its entries not in memory was a
    /// blocking read on the shard's thread). Other steps read back what
    /// they need as they run, as the commands of a `MULTI` do.
    async fn fetch_for(&mut self, step: &Step) {
        let wanted = match step {
            Step::Read(Some(after), count) => match (self.stream.as_ref(), after.next()) {
                (Some(s), Some(lo)) => s.missing_in_range(lo, StreamId::MAX, *count, false),
                _ => Vec::new(),
            },
            Step::ReadGroup {
                group,
                consumer,
                from,
                count,
                ..
            } => self.plan_read_group(group, consumer, from, *count),
            _ => Vec::new(),
        };
        self.fetch(wanted).await;
    }

    /// One step in this stream.
    fn step_here(&mut self, step: &Step, shared: &Shared) -> Done {
        match step {
            Step::Run(args, proto) => Done::Reply(self.exec_in_batch(args, *proto, shared)),
            Step::RunMany(commands) => Done::Replies(
                commands
                    .iter()
                    .map(|(args, proto)| self.exec_in_batch(args, *proto, shared))
                    .collect(),
            ),
            Step::Read(after, count) => Done::Entries(self.read_after(*after, *count)),
            Step::HasGroup(group) => Done::HasGroup(
                self.stream
                    .as_ref()
                    .is_some_and(|s| s.groups.contains_key(group)),
            ),
            Step::ReadGroup {
                group,
                consumer,
                from,
                count,
                noack,
            } => Done::Group(self.read_group(group, consumer, from, *count, *noack).0),
            // Only a member seals, in its own loop (which knows whether
            // the stream existed before); the coordinator seals itself.
            Step::Seal => unreachable!("a seal is answered by the member's loop"),
        }
    }

    /// [`Step::Seal`]'s answer (`was_missing`: the stream did not exist
    /// before the transaction).
    fn seal(&self, was_missing: bool) -> Done {
        let ops = self.batch.as_ref().filter(|ops| !ops.is_empty());
        let record = ops.map(|ops| Record {
            stream: self.name.clone(),
            op_no: self.op_no + 1,
            op: Op::Batch(ops.clone()),
        });
        Done::Sealed(record, was_missing, self.last_lsn)
    }

    /// `XREAD`'s entries of this stream after `after` (`None`: its last
    /// id), at most `count`.
    pub(super) fn read_after(
        &self,
        after: Option<StreamId>,
        count: Option<u64>,
    ) -> Vec<(StreamId, Fields)> {
        let after = after.unwrap_or_else(|| {
            self.stream
                .as_ref()
                .map_or(StreamId::MIN, crate::stream::Stream::last_id)
        });
        match (self.stream.as_ref(), after.next()) {
            (Some(s), Some(lo)) => s.range(lo, StreamId::MAX, count, false),
            _ => Vec::new(),
        }
    }

    /// Keeps a transaction's changes `ops`, logged as the record at
    /// `loc` flushed by `ticket` (`was_missing`: the stream did not exist
    /// before the transaction).
    pub(super) fn commit_batch(
        &mut self,
        ops: Vec<Op>,
        ticket: &Ticket,
        loc: Loc,
        was_missing: bool,
    ) {
        if ops.is_empty() || !loc.is_some() {
            return;
        }
        self.appended(&Op::Batch(ops), ticket, loc, was_missing);
        self.batch_logged(ticket, loc, was_missing);
    }

    /// After a transaction's record is appended at `loc`: its entries
    /// know their place, and the catalog learns whether the stream was
    /// made or deleted (`was_missing`: before the transaction).
    pub(super) fn batch_logged(&mut self, ticket: &Ticket, loc: Loc, was_missing: bool) {
        if let Some(s) = self.stream.as_mut() {
            s.place(loc);
        }
        if was_missing != self.stream.is_none() {
            // Made or deleted: the catalog learns it now that it is
            // logged.
            if let Some(shared) = self.shared.clone() {
                self.tell_catalog(&shared, ticket);
            }
        }
    }
}

impl Handler<Join> for StreamActor {
    async fn handle(&mut self, m: Join, cx: &mut Ctx<Self>) {
        // (Boxed, as a transaction's coordinator is.)
        Box::pin(self.join(m, cx)).await;
    }
}

impl StreamActor {
    /// [`Join`]'s handling (see the module's documentation).
    async fn join(&mut self, m: Join, cx: &mut Ctx<Self>) {
        let shard = cx.shard();
        if shard == m.shard {
            // (A stream elsewhere declines without reading itself back
            // while the coordinator holds its other streams.)
            self.load(m.broker).await;
        }
        let (tx, mut turns) = oneshot::channel();
        let joins = shard == m.shard && self.shared.is_some();
        let joined = Joined {
            shard,
            next: joins.then_some(tx),
            exists: self.stream.is_some(),
            last_lsn: self.last_lsn,
        };
        if m.ready.send(joined).is_err() || !joins {
            self.end_if_nothing(cx);
            return;
        }
        let shared = self.shared.take().expect("checked above");
        let was_missing = self.stream.is_none();
        self.batch = Some(Vec::new());
        // Held here until the coordinator ends the transaction; its going
        // away (a panic, a stopping broker) aborts it.
        let commit = loop {
            let Ok(turn) = turns.await else {
                break None;
            };
            let (step, answer) = match turn {
                Turn::Step(step, answer) => (step, answer),
                Turn::Commit(ticket, loc, kept) => break Some((ticket, loc, kept)),
                Turn::Abort => break None,
            };
            let done = match step {
                Step::Seal => self.seal(was_missing),
                step => {
                    self.fetch_for(&step).await;
                    self.step_here(&step, &shared)
                }
            };
            let (tx, rx) = oneshot::channel();
            let stepped = Stepped {
                done,
                exists: self.stream.is_some(),
                changed: self.batch.as_ref().is_some_and(|ops| !ops.is_empty()),
                next: tx,
            };
            if answer.send(stepped).is_err() {
                break None;
            }
            turns = rx;
        };
        self.shared = Some(shared);
        let ops = self.batch.take().unwrap_or_default();
        match commit {
            Some((ticket, loc, kept)) => {
                self.commit_batch(ops, &ticket, loc, was_missing);
                let _ = kept.send(());
            }
            None => {
                self.signal = Signal::Quiet;
                if !ops.is_empty() {
                    // What the commands changed was never logged.
                    self.reload(m.broker).await;
                }
            }
        }
        self.wake_watchers();
        self.publish_need();
        self.settle();
        self.end_if_nothing(cx);
    }
}

/// Where a command of the transaction runs.
enum At {
    /// The coordinator's own stream.
    Here,
    /// A joined stream.
    Member(usize),
}

/// The other streams of a transaction, as the coordinator runs it.
struct Cohort<'a> {
    /// The joined streams, by name.
    members: &'a mut [Member],
    /// Streams nobody placed that the transaction does not make, by name:
    /// no stream, answered by a detached actor that logs nothing (so
    /// reading a missing name places and activates nothing).
    absent: &'a mut [StreamActor],
    /// Where each of them runs, when they are many.
    places: &'a Places,
}

/// Where each stream of a transaction runs, hashed by name when there
/// are many (a search among thousands of names per command would cost
/// more than the command).
#[derive(Debug, Default)]
struct Places(HashMap<Bytes, Place, foldhash::fast::RandomState>);

impl Places {
    /// Below this many streams, a binary search.
    const HASHED_FROM: usize = 16;

    fn of(members: &[Member], absent: &[StreamActor]) -> Places {
        if members.len() + absent.len() < Places::HASHED_FROM {
            return Places::default();
        }
        let members = members
            .iter()
            .enumerate()
            .map(|(i, m)| (m.name.clone(), Place::Member(i)));
        let absent = absent
            .iter()
            .enumerate()
            .map(|(i, a)| (a.name.clone(), Place::Absent(i)));
        Places(members.chain(absent).collect())
    }
}

/// The commands for members gathered since the last command that runs
/// alone (see [`StreamActor::run_all`]).
struct Wave {
    /// Per member: where its commands' replies go, and the commands.
    runs: Vec<(Vec<Sink>, Commands)>,
    /// The members with commands in the wave.
    touched: Vec<usize>,
}

impl Wave {
    /// Sends each member its commands, all at once, and puts the replies
    /// in their places.
    async fn run(&mut self, replies: &mut [Reply], cohort: &mut Cohort<'_>) -> Result<(), Gone> {
        let mut waiting = Vec::with_capacity(self.touched.len());
        for i in self.touched.drain(..) {
            let (ats, run) = std::mem::take(&mut self.runs[i]);
            // (A member that fails drops the answers not taken yet: the
            // other members of the wave abort.)
            waiting.push((i, ats, cohort.members[i].send(Step::RunMany(run))?));
        }
        for (i, ats, answer) in waiting {
            match cohort.members[i].receive(answer).await? {
                Done::Replies(done) => {
                    for (sink, reply) in ats.into_iter().zip(done) {
                        sink.put(reply, replies);
                    }
                }
                _ => unreachable!("commands answer with their replies"),
            }
        }
        Ok(())
    }
}

/// Where a reply of a wave goes.
#[derive(Debug, Clone, Copy)]
enum Sink {
    /// It is the reply of the command at this place.
    At(usize),
    /// A stream's count (`EXISTS`, `DEL` of several streams), added to the
    /// reply at this place this many times (a name given twice is counted
    /// twice by `EXISTS`).
    Count(usize, i64),
}

impl Sink {
    fn put(self, reply: Reply, replies: &mut [Reply]) {
        match (self, reply) {
            (Sink::At(at), reply) => replies[at] = reply,
            (Sink::Count(at, times), Reply::Int(n)) => {
                if let Reply::Int(total) = &mut replies[at] {
                    *total += n * times;
                }
            }
            // (A stream's count answers with a count.)
            (Sink::Count(at, _), other) => replies[at] = other,
        }
    }
}

/// Where a stream of a transaction runs its commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// The coordinator's own stream.
    Here,
    /// A joined stream.
    Member(usize),
    /// An absent stream's detached actor.
    Absent(usize),
}

impl Cohort<'_> {
    /// Where `stream` runs (one of the transaction's streams: a member,
    /// an absent one, or else the coordinator's).
    fn place_of(&self, stream: &Bytes) -> Place {
        if !self.places.0.is_empty() {
            return self.places.0.get(stream).copied().unwrap_or(Place::Here);
        }
        if let Ok(i) = self.members.binary_search_by(|m| m.name.cmp(stream)) {
            return Place::Member(i);
        }
        if let Ok(i) = self.absent.binary_search_by(|a| a.name.cmp(stream)) {
            return Place::Absent(i);
        }
        Place::Here
    }

    /// Where `args` runs, if it is a command that names one stream and
    /// needs nothing but that stream (see [`StreamActor::run_all`]).
    fn alone_in(&self, spec: &command::Spec, args: &[Bytes]) -> Option<Place> {
        if matches!(
            spec.name,
            "keys" | "scan" | "info" | "dbsize" | "exists" | "del"
        ) {
            return None;
        }
        let named = crate::session::streams_of(spec, args);
        let (first, rest) = named.split_first()?;
        if rest.iter().any(|s| s != first) {
            return None;
        }
        Some(self.place_of(first))
    }
}

impl StreamActor {
    /// A stream nobody placed: answers as a missing stream, logs nothing.
    fn detached(name: &Bytes) -> StreamActor {
        let mut actor = StreamActor::new(name);
        actor.loaded = true;
        actor
    }

    /// Runs `m`, a transaction over the streams `m.streams` (sorted, this
    /// one first) and `m.absent`, as the module's documentation says.
    pub(super) async fn exec_multi(
        &mut self,
        mut m: ExecBatch,
        shared: Arc<Shared>,
        cx: &mut Ctx<Self>,
    ) -> BatchAnswer {
        let here = cx.shard();
        // (What the transaction reads waits for the flush of the
        // streams' last appends.)
        let mut last_lsn = self.last_lsn;
        let mut members: Vec<Member> = Vec::with_capacity(m.streams.len().saturating_sub(1));
        let abort_all = |members: &mut Vec<Member>| {
            for member in members.iter_mut() {
                member.end(Turn::Abort);
            }
        };
        for name in m.streams.iter().skip(1) {
            let (ready, joined) = oneshot::channel();
            let join = Join {
                shard: here,
                broker: m.broker,
                ready,
            };
            let sent = shared
                .system
                .keyed::<StreamActor>(name.clone())
                .tell(join)
                .is_ok();
            let refusal = match (sent, joined.await) {
                (
                    true,
                    Ok(Joined {
                        next: Some(next),
                        exists,
                        last_lsn: lsn,
                        ..
                    }),
                ) => {
                    last_lsn = last_lsn.max(lsn);
                    members.push(Member {
                        name: name.clone(),
                        next: Some(next),
                        exists,
                        existed: exists,
                        changed: false,
                    });
                    continue;
                }
                (true, Ok(Joined { shard, .. })) if shard != here => {
                    across_shards((&self.name, here), (name, shard))
                }
                // Its actor panicked before it could answer (its log
                // could not give it back).
                (true, Err(_)) => failed_in(name, "before it ran"),
                _ => super::broker_gone(),
            };
            abort_all(&mut members);
            return self.refused_before_running(refusal, shared, cx);
        }
        // The names the session found absent are still no stream now
        // that every held stream has joined (the point where the block
        // runs): one made meanwhile cannot be answered as missing, nor
        // joined out of name order.
        let made = (!m.bare)
            .then(|| m.absent.iter().find(|name| shared.catalog.contains(name)))
            .flatten();
        if let Some(name) = made {
            let refusal = match shared.system.placed_shard::<StreamActor>(name) {
                Some(shard) if shard != here => across_shards((&self.name, here), (name, shard)),
                _ => made_meanwhile(name),
            };
            abort_all(&mut members);
            return self.refused_before_running(refusal, shared, cx);
        }
        let mut absent: Vec<StreamActor> = m.absent.iter().map(StreamActor::detached).collect();

        let was_missing = self.stream.is_none();
        self.batch = Some(Vec::new());
        let mut failed = None;
        let places = Places::of(&members, &absent);
        let mut cohort = Cohort {
            members: &mut members,
            absent: &mut absent,
            places: &places,
        };
        let commands = std::mem::take(&mut m.commands);
        let protos = std::mem::take(&mut m.protos);
        let replies = match self.run_all(commands, protos, &mut cohort, &shared).await {
            Ok(replies) => replies,
            Err(Gone(name)) => {
                failed = Some(name);
                Vec::new()
            }
        };
        // Each stream's changes as one record, in name order.
        let mine = self.batch.take().unwrap_or_default();
        let mut records = Vec::new();
        let mut owners = Vec::new();
        if !mine.is_empty() {
            records.push(Record {
                stream: self.name.clone(),
                op_no: self.op_no + 1,
                op: Op::Batch(mine.clone()),
            });
            owners.push((At::Here, was_missing));
        }
        if failed.is_none() {
            // Every member the transaction changed seals at once; their
            // records are taken in name order.
            let sealing: Result<Vec<_>, Gone> = members
                .iter_mut()
                .enumerate()
                .filter(|(_, member)| member.changed)
                .map(|(i, member)| Ok((i, member.send(Step::Seal)?)))
                .collect();
            match sealing {
                Ok(sealing) => {
                    for (i, sealed) in sealing {
                        match members[i].receive(sealed).await {
                            Ok(Done::Sealed(record, starts, lsn)) => {
                                last_lsn = last_lsn.max(lsn);
                                if let Some(r) = record {
                                    records.push(r);
                                    owners.push((At::Member(i), starts));
                                }
                            }
                            Ok(_) => unreachable!("a seal answers with its record"),
                            Err(Gone(name)) => {
                                failed = Some(name);
                                break;
                            }
                        }
                    }
                }
                Err(Gone(name)) => failed = Some(name),
            }
        }
        self.shared = Some(shared);
        let appended = match (&failed, &self.log) {
            (Some(name), _) => Err(failed_in(name, "while it ran")),
            (None, _) if records.is_empty() => Ok(None),
            (None, Some(log)) => match log.append_group(&records) {
                Ok((ticket, locs)) => {
                    // The log knows at once the streams the group made: a
                    // member that had to read itself back from it (its
                    // coordinator gone before telling it) finds them.
                    for ((_, starts), (record, loc)) in owners.iter().zip(records.iter().zip(&locs))
                    {
                        if *starts {
                            log.note_making(&record.stream, loc.segment, record.op_no);
                        }
                    }
                    Ok(Some((ticket, locs)))
                }
                Err(e) => Err(super::exec_refused(&e)),
            },
            (None, None) => Err(super::exec_refused(&StorageError::Closed)),
        };
        let appended = match appended {
            Ok(appended) => appended,
            Err(refusal) => {
                // Nothing was logged: every stream drops what the commands
                // changed.
                abort_all(&mut members);
                self.signal = Signal::Quiet;
                if !mine.is_empty() {
                    self.reload(m.broker).await;
                }
                self.end_if_nothing(cx);
                return BatchAnswer {
                    replies: Err(refusal),
                    durable: None,
                };
            }
        };
        let (ticket, locs) = match (appended, &self.log) {
            (Some((ticket, locs)), _) => (ticket, locs),
            // Only reads: members are released, and the reply waits for
            // the flush of what they read.
            (None, Some(log)) => (log.no_wait(), Vec::new()),
            (None, None) => {
                abort_all(&mut members);
                self.end_if_nothing(cx);
                return BatchAnswer {
                    replies: Err(super::broker_gone()),
                    durable: None,
                };
            }
        };
        // The catalog learns every stream the block made or deleted at
        // once, so that another client's read of the names sees the block
        // in all of them or in none (each stream tells it again as it
        // keeps its part, changing nothing).
        let mut made_or_gone: Vec<(Bytes, bool)> = members
            .iter()
            .filter(|m| m.exists != m.existed)
            .map(|m| (m.name.clone(), m.exists))
            .collect();
        if was_missing != self.stream.is_none() {
            made_or_gone.push((self.name.clone(), self.stream.is_some()));
        }
        if let (false, Some(shared)) = (made_or_gone.is_empty(), &self.shared) {
            shared.catalog.apply(&made_or_gone, Some(ticket.for_read()));
        }
        let mut mine = Some(mine);
        let mut kept = Vec::with_capacity(members.len());
        for ((owner, _), loc) in owners.iter().zip(locs) {
            match owner {
                At::Here => {
                    let ops = mine.take().unwrap_or_default();
                    self.commit_batch(ops, &ticket, loc, was_missing);
                }
                At::Member(i) => kept.push(members[*i].commit(&ticket, loc)),
            }
        }
        // Members that changed nothing are released (with nothing to
        // keep, they are not waited for).
        for member in &mut members {
            let keeping = member.commit(&ticket, Loc::NONE);
            if member.changed {
                kept.push(keeping);
            }
        }
        let durable = if ticket.lsn() == 0 {
            self.log.as_ref().and_then(|log| log.read_ticket(last_lsn))
        } else {
            Some(ticket)
        };
        self.wake_watchers();
        self.publish_need();
        self.settle();
        self.end_if_nothing(cx);
        // Every member has kept its part (told the catalog) before the
        // reply: the connection's next request sees the whole transaction.
        for k in kept.into_iter().flatten() {
            let _ = k.await;
        }
        BatchAnswer {
            replies: Ok(replies),
            durable,
        }
    }

    /// `EXEC`'s answer when the transaction was refused before any command
    /// ran (its members let go already).
    fn refused_before_running(
        &mut self,
        refusal: Reply,
        shared: Arc<Shared>,
        cx: &mut Ctx<Self>,
    ) -> BatchAnswer {
        self.shared = Some(shared);
        self.end_if_nothing(cx);
        BatchAnswer {
            replies: Err(refusal),
            durable: None,
        }
    }

    /// Runs a transaction's commands over the streams of `cohort` and
    /// this one: their replies, in order. A command that names one stream
    /// goes into a wave with the commands after it that do too, and each
    /// member runs its commands of the wave as one step, every member's
    /// at once (this stream's and absent ones' run as they come): a
    /// stream's commands keep their order, and commands on different
    /// streams see nothing of each other. `EXISTS` and `DEL` join the wave
    /// as one count per stream, summed. Any other command (one naming
    /// several streams or none, or reading the catalog) waits for the wave
    /// before it and runs alone.
    async fn run_all(
        &mut self,
        commands: Vec<Vec<Bytes>>,
        protos: Vec<Protocol>,
        cohort: &mut Cohort<'_>,
        shared: &Shared,
    ) -> Result<Vec<Reply>, Gone> {
        let mut replies = Vec::with_capacity(commands.len());
        let mut wave = Wave {
            runs: std::iter::repeat_with(Default::default)
                .take(cohort.members.len())
                .collect(),
            touched: Vec::new(),
        };
        let protos = protos.into_iter().chain(std::iter::repeat(Protocol::Resp2));
        for (args, proto) in commands.into_iter().zip(protos) {
            let spec = command::lookup(&args[0]);
            let counted = spec
                .map(|spec| spec.name)
                .filter(|name| matches!(*name, "exists" | "del") && args.len() > 1);
            if let Some(counted) = counted {
                // `EXISTS` / `DEL`: each stream counts itself, in the
                // wave, asked once (a stream named twice is counted twice
                // by `EXISTS`, deleted once by `DEL`).
                let at = replies.len();
                replies.push(Reply::Int(0));
                let mut streams: Vec<&Bytes> = args[1..].iter().collect();
                streams.sort_unstable();
                for group in streams.chunk_by(|a, b| a == b) {
                    let times = if counted == "exists" {
                        group.len() as i64
                    } else {
                        1
                    };
                    let one = vec![args[0].clone(), group[0].clone()];
                    let sink = Sink::Count(at, times);
                    self.gather(
                        cohort.place_of(group[0]),
                        sink,
                        one,
                        proto,
                        &mut wave,
                        &mut replies,
                        cohort,
                        shared,
                    );
                }
                continue;
            }
            match spec.and_then(|spec| cohort.alone_in(spec, &args)) {
                Some(place) => {
                    let at = replies.len();
                    // (Its reply, once it has run.)
                    replies.push(Reply::NilArray);
                    self.gather(
                        place,
                        Sink::At(at),
                        args,
                        proto,
                        &mut wave,
                        &mut replies,
                        cohort,
                        shared,
                    );
                }
                None => {
                    wave.run(&mut replies, cohort).await?;
                    let reply = self.run_one(&args, proto, cohort, shared).await?;
                    replies.push(reply);
                }
            }
        }
        wave.run(&mut replies, cohort).await?;
        Ok(replies)
    }

    /// Puts command `args` for the stream at `place` in `wave` (a
    /// member's), or runs it now (this stream's, an absent one's), its
    /// reply to `sink`.
    #[allow(clippy::too_many_arguments)]
    fn gather(
        &mut self,
        place: Place,
        sink: Sink,
        args: Vec<Bytes>,
        proto: Protocol,
        wave: &mut Wave,
        replies: &mut [Reply],
        cohort: &mut Cohort<'_>,
        shared: &Shared,
    ) {
        match place {
            Place::Member(i) => {
                let (sinks, run) = &mut wave.runs[i];
                if run.is_empty() {
                    wave.touched.push(i);
                }
                sinks.push(sink);
                run.push((args, proto));
            }
            Place::Here => sink.put(self.exec_in_batch(&args, proto, shared), replies),
            Place::Absent(i) => {
                sink.put(
                    cohort.absent[i].exec_in_batch(&args, proto, shared),
                    replies,
                );
            }
        }
    }

    /// Runs one command of a transaction over several streams, in the
    /// actor of each stream it names.
    async fn run_one(
        &mut self,
        args: &[Bytes],
        proto: Protocol,
        cohort: &mut Cohort<'_>,
        shared: &Shared,
    ) -> Result<Reply, Gone> {
        let name = command::lookup(&args[0]).map_or("", |s| s.name);
        match name {
            "keys" | "scan" | "info" | "dbsize" => {
                // The catalog with every stream as the transaction left it
                // so far: those it made or deleted, and the absent ones
                // (the others are as the catalog has them: held).
                let mut own = vec![(self.name.clone(), self.stream.is_some())];
                own.extend(
                    cohort
                        .members
                        .iter()
                        .filter(|m| m.exists != m.existed)
                        .map(|m| (m.name.clone(), m.exists)),
                );
                // (Absent names stay missing to the block, whatever other
                // shards make meanwhile: it answered them as missing.)
                own.extend(cohort.absent.iter().map(|a| (a.name.clone(), false)));
                Ok(crate::session::catalog_reply(shared, proto, args, &own))
            }
            "exists" | "del" => {
                // Each stream counts itself: asked once, with its name
                // once (a stream named twice is counted twice by
                // `EXISTS`, deleted once by `DEL`).
                let mut streams: Vec<&Bytes> = args[1..].iter().collect();
                streams.sort();
                let mut total = 0;
                for group in streams.chunk_by(|a, b| a == b) {
                    let stream = group[0];
                    let step = Step::Run(vec![args[0].clone(), stream.clone()], proto);
                    match self.step_in(stream, step, cohort, shared).await? {
                        Done::Reply(Reply::Int(n)) if name == "exists" => {
                            total += n * group.len() as i64;
                        }
                        Done::Reply(Reply::Int(n)) => total += n,
                        Done::Reply(other) => return Ok(other),
                        _ => unreachable!("a command answers with its reply"),
                    }
                }
                Ok(Reply::Int(total))
            }
            "xread" | "xreadgroup" if names_several(args) => {
                self.read_many(name == "xreadgroup", args, proto, cohort, shared)
                    .await
            }
            _ => {
                let spec = command::lookup(&args[0]).expect("queued commands were looked up");
                let step = Step::Run(args.to_vec(), proto);
                let done = match crate::session::streams_of(spec, args).first() {
                    Some(stream) => self.step_in(stream, step, cohort, shared).await?,
                    None => self.step_here(&step, shared),
                };
                match done {
                    Done::Reply(r) => Ok(r),
                    _ => unreachable!("a command answers with its reply"),
                }
            }
        }
    }

    /// Runs `step` in the actor of `stream`: this one, a member, or an
    /// absent stream's detached actor.
    async fn step_in(
        &mut self,
        stream: &Bytes,
        step: Step,
        cohort: &mut Cohort<'_>,
        shared: &Shared,
    ) -> Result<Done, Gone> {
        match cohort.place_of(stream) {
            Place::Member(i) => cohort.members[i].step(step).await,
            Place::Absent(i) => Ok(cohort.absent[i].step_here(&step, shared)),
            Place::Here => {
                self.fetch_for(&step).await;
                Ok(self.step_here(&step, shared))
            }
        }
    }

    /// `XREAD` / `XREADGROUP` naming several of the transaction's
    /// streams: checked whole first (as Redis checks every stream's group
    /// and id before it reads any), then each stream read in the order
    /// named.
    async fn read_many(
        &mut self,
        group_read: bool,
        args: &[Bytes],
        proto: Protocol,
        cohort: &mut Cohort<'_>,
        shared: &Shared,
    ) -> Result<Reply, Gone> {
        let p = match command::parse_read(args, group_read) {
            Ok(p) => p,
            Err(e) => return Ok(e),
        };
        let at = command::streams_at(args).expect("parse_read found the streams");
        let names: Vec<Bytes> = args[at..at + p.ids.len()].to_vec();
        let mut steps = Vec::with_capacity(names.len());
        match &p.group {
            None => {
                for raw in &p.ids {
                    match command::xread_id(raw) {
                        Ok(after) => steps.push(Step::Read(after, p.count)),
                        Err(e) => return Ok(e),
                    }
                }
            }
            Some((group, consumer)) => {
                for (stream, raw) in names.iter().zip(&p.ids) {
                    let has = self
                        .step_in(stream, Step::HasGroup(group.clone()), cohort, shared)
                        .await?;
                    if !matches!(has, Done::HasGroup(true)) {
                        return Ok(super::no_group_in_readgroup(stream, group));
                    }
                    let from = match command::xreadgroup_id(raw) {
                        Ok(None) => GroupFrom::New,
                        Ok(Some(_)) => GroupFrom::History(raw.clone()),
                        Err(e) => return Ok(e),
                    };
                    steps.push(Step::ReadGroup {
                        group: group.clone(),
                        consumer: consumer.clone(),
                        from,
                        count: p.count,
                        noack: p.noack,
                    });
                }
            }
        }
        let mut plain = Vec::new();
        let mut grouped = Vec::new();
        for (stream, step) in names.iter().zip(steps) {
            let history = matches!(
                step,
                Step::ReadGroup {
                    from: GroupFrom::History(_),
                    ..
                }
            );
            match self.step_in(stream, step, cohort, shared).await? {
                Done::Entries(e) if !e.is_empty() => plain.push((stream.clone(), e)),
                Done::Group(GroupRead::Error(e)) => return Ok(e),
                Done::Group(GroupRead::Entries(e)) if !e.is_empty() || history => {
                    grouped.push((stream.clone(), e));
                }
                _ => {}
            }
        }
        Ok(match (group_read, plain.is_empty() && grouped.is_empty()) {
            (_, true) => Reply::NilArray,
            (false, false) => crate::session::streams_reply(plain, proto),
            (true, false) => crate::session::group_streams_reply(grouped, proto),
        })
    }
}

/// The streams of a transaction that are all absent (nobody placed them,
/// none of its commands makes one): its commands are answered as missing
/// streams answer, by detached actors, activating and placing nothing.
#[derive(Debug)]
pub(crate) struct AbsentStreams {
    first: StreamActor,
    rest: Vec<StreamActor>,
    places: Places,
}

impl AbsentStreams {
    /// The streams `names` (sorted, at least one).
    pub(crate) fn new(names: &[Bytes]) -> AbsentStreams {
        let rest: Vec<StreamActor> = names[1..].iter().map(StreamActor::detached).collect();
        AbsentStreams {
            first: StreamActor::detached(&names[0]),
            places: Places::of(&[], &rest),
            rest,
        }
    }

    /// The reply to `args`, a command naming some of the streams.
    pub(crate) fn answer(&mut self, args: &[Bytes], proto: Protocol, shared: &Shared) -> Reply {
        let mut cohort = Cohort {
            members: &mut [],
            absent: &mut self.rest,
            places: &self.places,
        };
        let run = self.first.run_one(args, proto, &mut cohort, shared);
        let mut run = std::pin::pin!(run);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match std::future::Future::poll(run.as_mut(), &mut cx) {
            std::task::Poll::Ready(Ok(reply)) => reply,
            // Only a member's step waits, and there is none.
            _ => unreachable!("a transaction without members runs at once"),
        }
    }
}

/// The reply to a transaction over streams `a` and `b` on different
/// shards: refused, nothing done.
pub(crate) fn across_shards(a: (&Bytes, ShardId), b: (&Bytes, ShardId)) -> Reply {
    Reply::err(format!(
        "MULTI/EXEC over streams on different shards is not supported ('{}' is on shard {}, '{}' on shard {}): each shard logs its own streams, and a transaction commits as one record of one log; the transaction was discarded",
        command::printable(a.0, 64),
        a.1.index(),
        command::printable(b.0, 64),
        b.1.index(),
    ))
}

/// `EXEC`'s reply when the actor of member `name` failed (`when`).
fn failed_in(name: &Bytes, when: &str) -> Reply {
    Reply::Error(format!(
        "EXECABORT Transaction discarded because of: the actor of stream '{}' failed {when}; nothing was changed",
        command::printable(name, 64)
    ))
}

/// `EXEC`'s reply when stream `name`, missing as the transaction began,
/// was made by another client before it could run.
fn made_meanwhile(name: &Bytes) -> Reply {
    Reply::Error(format!(
        "EXECABORT Transaction discarded because of: stream '{}' was made by another client as the transaction began; nothing was changed",
        command::printable(name, 64)
    ))
}

/// Whether a command names more than one stream.
fn names_several(args: &[Bytes]) -> bool {
    let Some(spec) = command::lookup(&args[0]) else {
        return false;
    };
    let mut named = crate::session::streams_of(spec, args);
    named.sort();
    named.dedup();
    named.len() > 1
}
