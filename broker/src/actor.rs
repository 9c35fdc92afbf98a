//! The stream actor: one keyed actor per stream (key = its name) owning
//! its entries, logging every change to its shard's commit log before it
//! answers.

use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use mailring_actors::{Actor, Ctx, Handler, Message};

mod groups;
mod transaction;

pub(crate) use self::groups::no_group_in_readgroup;
pub use self::groups::{GroupFrom, GroupRead};
pub(crate) use self::transaction::across_shards;
pub(crate) use self::transaction::AbsentStreams;
pub use self::transaction::{Join, Joined};

use crate::command;
use crate::id::{parse_id, StreamId};
use crate::log::{Loc, Op, Record};
use crate::resp::{Protocol, Reply};
use crate::server::Shared;
use crate::store::retention::{need_of, Need};
use crate::store::{self, ShardLog, StorageError, Ticket};
use crate::stream::{Fields, Stream};

/// One stream: a keyed actor owning its entries (key = the stream's name).
/// A new stream lives on the shard of the connection that first names it
/// (first-sender placement), so a client's own streams log on its shard;
/// at start each recovered stream is placed back on the shard whose log
/// holds it.
#[derive(Debug, Actor)]
#[actor(key = Bytes, activate = StreamActor::new, placement = "first_sender", handles(Exec, Read, Watch, ReadGroup, ExecBatch, ExecRun, Checkpoint, Join))]
pub struct StreamActor {
    name: Bytes,
    stream: Option<Stream>,
    /// Whether the recovered state was taken (at the first command).
    loaded: bool,
    /// The number of this stream's last logged operation.
    op_no: u64,
    /// This shard's log.
    log: Option<Rc<ShardLog>>,
    /// Blocked readers, served (or woken) at the next signal (below).
    watchers: Vec<Watcher>,
    /// What the commands since the watchers were last woken did that
    /// Redis signals its blocked readers for: an entry added (even one
    /// trimmed at once), a group destroyed; and the stream deleted.
    signal: Signal,
    /// While a transaction runs: its operations, logged as one record.
    batch: Option<Vec<Op>>,
    /// The broker, found at the first message.
    shared: Option<Arc<Shared>>,
    /// Where its history in the log starts (see [`store::retention`]):
    /// its last snapshot's segment, or its first record's.
    meta_segment: u32,
    /// Where its entries are: runs of ids, each from an id on, in a
    /// segment.
    runs: VecDeque<(StreamId, u32)>,
    /// The segment of its last record.
    last_segment: u32,
    /// The need last told to the log.
    published: Option<Option<Need>>,
    /// A record made the stream since the log was last told its need (the
    /// log holds that record's segment until told).
    made_untold: bool,
    /// Where the last record appended went ([`Loc::NONE`] inside a
    /// transaction, until its record is appended).
    appended_at: Loc,
    /// The log's number of this stream's last append (at activation, the
    /// log's last: a record of an earlier activation may still be
    /// flushing). A read answers once it is flushed.
    last_lsn: u64,
    /// Bytes of entries a stream keeps in memory.
    cache_budget: u64,
    /// Cached bytes counted in the broker's total.
    counted: u64,
    /// The broker's total of cached bytes.
    gauge: Option<Arc<crate::server::CacheGauge>>,
}

/// What the commands did that wakes blocked readers (Redis's "key
/// ready" signals), weakest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Signal {
    /// Nothing to wake readers for.
    Quiet,
    /// An entry added, a group destroyed: readers look.
    Ready,
    /// The stream deleted: a group's readers fail.
    Deleted,
}

impl StreamActor {
    fn new(name: &Bytes) -> Self {
        StreamActor {
            name: name.clone(),
            stream: None,
            loaded: false,
            op_no: 0,
            log: None,
            watchers: Vec::new(),
            signal: Signal::Quiet,
            batch: None,
            shared: None,
            meta_segment: 0,
            runs: VecDeque::new(),
            last_segment: 0,
            published: None,
            made_untold: false,
            appended_at: Loc::NONE,
            last_lsn: 0,
            cache_budget: store::DEFAULT_STREAM_CACHE,
            counted: 0,
            gauge: None,
        }
    }
}

/// A stream command's answer: the reply, and the flush it waits for.
#[derive(Debug)]
pub struct Answer {
    /// The reply.
    pub reply: Reply,
    /// Completes when what the command changed is flushed (per the
    /// `appendfsync` policy); the reply is written after it.
    pub durable: Option<Ticket>,
}

impl From<Reply> for Answer {
    fn from(reply: Reply) -> Self {
        Answer {
            reply,
            durable: None,
        }
    }
}

/// Entries read back from segments ahead of the commands that read them
/// (through the shard's ring).
pub static FETCHED_READS: AtomicU64 = AtomicU64::new(0);

impl Drop for StreamActor {
    fn drop(&mut self) {
        if let Some(gauge) = &self.gauge {
            gauge.add(self.counted.wrapping_neg());
        }
        // Readers still blocked (its handler panicked) are woken as their
        // watchers drop (see `Watcher`'s `Drop`).
    }
}

/// The reply to a command that arrives after its broker stopped.
fn broker_gone() -> Reply {
    Reply::err("the broker is shutting down")
}

/// The reply to a command whose change could not be logged.
pub(crate) fn storage_error(e: &StorageError) -> Reply {
    Reply::Error(format!("MISCONF {e}"))
}

/// A stream command, run in the stream's actor.
#[derive(Debug, Message)]
#[message(reply = Answer)]
pub struct Exec {
    /// The command's lower-case name (from the command table).
    pub name: &'static str,
    /// The command and its arguments (argument 1 is this stream).
    pub args: Vec<Bytes>,
    /// The broker the command came through (its id: a message touches no
    /// shared reference count).
    pub broker: u64,
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Handler<Exec> for StreamActor {
    async fn handle(&mut self, m: Exec, cx: &mut Ctx<Self>) -> Answer {
        self.load(m.broker).await;
        let answer = self.run_command(m.name, &m.args).await;
        self.after_commands();
        self.end_if_nothing(cx);
        answer
    }
}

impl StreamActor {
    /// One stream command as it runs alone: the evicted entries it reads
    /// fetched, the command run, and what was fetched for it dropped.
    async fn run_command(&mut self, name: &'static str, args: &[Bytes]) -> Answer {
        let wanted = self.plan_reads(name, args);
        self.fetch(wanted).await;
        self.run_fetched(name, args)
    }

    /// [`StreamActor::run_command`] once what it reads is in memory.
    fn run_fetched(&mut self, name: &'static str, args: &[Bytes]) -> Answer {
        // Taken out for the command (it reads the catalog), put back after.
        let Some(shared) = self.shared.take() else {
            return broker_gone().into();
        };
        let mut answer = self.exec(name, args, &shared);
        self.shared = Some(shared);
        if answer.durable.is_none() {
            // What it read may still be flushing: its reply waits.
            answer.durable = self.read_ticket();
        }
        // Redis serves blocked readers after each command: a reader gets
        // what this command left, before the next one of a pipeline runs.
        self.wake_watchers();
        self.settle();
        answer
    }

    /// After one or more commands: wakes blocked readers if the commands
    /// signalled them, and tells the log what the stream needs.
    fn after_commands(&mut self) {
        self.wake_watchers();
        self.publish_need();
    }

    /// Whether commands can run without an await: the recovered state
    /// taken, the broker known, no transaction open.
    fn runs_at_once(&self) -> bool {
        self.loaded && self.shared.is_some() && self.batch.is_none()
    }

    /// A stream command run at once, as in a handler, when it reads
    /// nothing evicted (`None`: it needs a handler's await first).
    fn command_at_once(&mut self, name: &'static str, args: &[Bytes]) -> Option<Answer> {
        self.plan_reads(name, args)
            .is_empty()
            .then(|| self.run_fetched(name, args))
    }

    /// One stream command run on the idle actor by a session on its shard
    /// (through [`Addr::run_now`](mailring_actors::Addr::run_now)), as
    /// [`Exec`] would run it, when it needs no await; `None` otherwise (then
    /// nothing ran: send `Exec`). With the answer, whether the activation
    /// holds nothing now and should end (as [`Exec`] would end it).
    pub(crate) fn one_at_once(
        &mut self,
        name: &'static str,
        args: &[Bytes],
    ) -> Option<(Answer, bool)> {
        if !self.runs_at_once() {
            return None;
        }
        let answer = self.command_at_once(name, args)?;
        Some((answer, self.finish_at_once()))
    }

    /// [`StreamActor::one_at_once`] for a run of commands (as [`ExecRun`]
    /// runs them), each with its place in `answers`: runs them in order up
    /// to the first that needs an await, putting each answer in its place
    /// as it comes (a command that panics leaves those of the commands
    /// before it there). The commands left unanswered go in an `ExecRun`,
    /// after them. Returns whether every command ran and the activation
    /// holds nothing now (it should end).
    pub(crate) fn run_at_once<'a>(
        &mut self,
        run: impl Iterator<Item = (usize, &'a (&'static str, Vec<Bytes>))>,
        answers: &mut [Option<Answer>],
    ) -> bool {
        if !self.runs_at_once() {
            return false;
        }
        let mut ran_all = true;
        let mut ran_any = false;
        for (at, (name, args)) in run {
            match self.command_at_once(name, args) {
                Some(answer) => {
                    answers[at] = Some(answer);
                    ran_any = true;
                }
                None => {
                    ran_all = false;
                    break;
                }
            }
        }
        if !ran_any {
            return false;
        }
        // Commands left for a handler keep it.
        self.finish_at_once() && ran_all
    }

    /// What a handler does after its commands, less the stop: whether the
    /// activation holds nothing now.
    fn finish_at_once(&mut self) -> bool {
        self.after_commands();
        self.drop_abandoned_watchers();
        self.holds_nothing()
    }
}

/// A run of stream commands for one stream, taken from a connection's
/// pipelined requests: one ask instead of one per command. Each command
/// runs as it would alone, in order, and gets its own answer (and its own
/// record: unlike [`ExecBatch`], no command's change waits on another's).
#[derive(Debug, Message)]
#[message(reply = Vec<Answer>)]
pub struct ExecRun {
    /// Each command's lower-case name (from the command table) and its
    /// arguments (argument 1 is this stream).
    pub commands: Vec<(&'static str, Vec<Bytes>)>,
    /// The broker (its id: a message touches no shared reference count).
    pub broker: u64,
}

impl Handler<ExecRun> for StreamActor {
    async fn handle(&mut self, m: ExecRun, cx: &mut Ctx<Self>) -> Vec<Answer> {
        self.load(m.broker).await;
        let mut answers = Vec::with_capacity(m.commands.len());
        for (name, args) in &m.commands {
            answers.push(self.run_command(name, args).await);
        }
        self.after_commands();
        self.end_if_nothing(cx);
        answers
    }
}

/// Asks a stream to log a snapshot of its counters and groups, so the
/// segments holding its older history can go (sent by its log's
/// collector).
#[derive(Debug, Message)]
#[message(reply = ())]
pub struct Checkpoint {
    /// The broker (its id).
    pub broker: u64,
}

impl Handler<Checkpoint> for StreamActor {
    async fn handle(&mut self, m: Checkpoint, cx: &mut Ctx<Self>) {
        self.load(m.broker).await;
        self.checkpoint().await;
        self.settle();
        // Asked for a stream deleted meanwhile: no actor stays for it.
        self.end_if_nothing(cx);
    }
}

impl StreamActor {
    async fn checkpoint(&mut self) {
        let (Some(stream), Some(log)) = (&self.stream, &self.log) else {
            return;
        };
        let small = store::small_stream_bytes(log.segment_bytes());
        let Some(need) = need_of(Some(stream), self.meta_segment, &mut self.runs, small) else {
            return;
        };
        let op = if need.by_history {
            // Its entries are newer: a snapshot of the rest is enough.
            store::snapshot_of(stream)
        } else if need.movable {
            // A few old entries: write the whole stream again, as one
            // record (replay starts it afresh there).
            let wanted = stream.missing_in_range(StreamId::MIN, StreamId::MAX, None, false);
            self.fetch(wanted).await;
            let Some(stream) = &self.stream else {
                return;
            };
            let mut ops = vec![Op::Drop];
            ops.extend(
                stream
                    .range(StreamId::MIN, StreamId::MAX, None, false)
                    .into_iter()
                    .map(|(id, fields)| Op::Add { id, fields }),
            );
            ops.push(store::snapshot_of(stream));
            Op::Batch(ops)
        } else {
            return;
        };
        let rewrite = matches!(op, Op::Batch(_));
        // A failed log refuses every write anyway; nothing to answer.
        if self.append(op, false).is_ok() && rewrite {
            let loc = self.appended_at;
            if let Some(s) = self.stream.as_mut() {
                // Every entry was fetched for the rewrite: each keeps its
                // fields until the new record is written.
                s.relocate(loc);
            }
        }
        self.publish_need();
    }
}

/// Where a read starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadFrom {
    /// After this id.
    After(StreamId),
    /// After the stream's last id now (`$`).
    Last,
}

/// `XREAD`'s read of one stream: entries after an id.
#[derive(Debug, Message)]
#[message(reply = ReadResult)]
pub struct Read {
    /// Where to start.
    pub from: ReadFrom,
    /// At most this many (`None`: all).
    pub count: Option<u64>,
    /// The broker (its id: a message touches no shared reference count).
    pub broker: u64,
}

/// What a [`Read`] found.
#[derive(Debug)]
pub struct ReadResult {
    /// The entries, oldest first.
    pub entries: Vec<(StreamId, Fields)>,
    /// The id the read started after (`$` resolved to the last id).
    pub after: StreamId,
    /// The stream's last id (`None`: no stream): a blocked reader woken
    /// with no entry for it is still answered when this passed its id (an
    /// entry added and removed at once), as Redis answers it.
    pub last_id: Option<StreamId>,
    /// Completes when what it read is flushed: the reply waits for it.
    pub visible: Option<Ticket>,
}

impl Handler<Read> for StreamActor {
    async fn handle(&mut self, m: Read, cx: &mut Ctx<Self>) -> ReadResult {
        self.load(m.broker).await;
        // A read makes nothing: a stream missing now stays so.
        self.end_if_nothing(cx);
        let mut result = self.read(&m).await;
        result.visible = self.read_ticket();
        self.settle();
        result
    }
}

impl StreamActor {
    async fn read(&mut self, m: &Read) -> ReadResult {
        let wanted = self.plan_read(m);
        self.fetch(wanted).await;
        self.read_fetched(m)
    }

    /// The evicted entries a plain read reads.
    fn plan_read(&self, m: &Read) -> Vec<(StreamId, Loc)> {
        match (&self.stream, m.from) {
            (Some(stream), ReadFrom::After(id)) => match id.next() {
                Some(lo) => stream.missing_in_range(lo, StreamId::MAX, m.count, false),
                None => Vec::new(),
            },
            _ => Vec::new(),
        }
    }

    /// A plain read once what it reads is in memory.
    fn read_fetched(&self, m: &Read) -> ReadResult {
        let Some(stream) = &self.stream else {
            let after = match m.from {
                ReadFrom::After(id) => id,
                ReadFrom::Last => StreamId::MIN,
            };
            return ReadResult {
                entries: Vec::new(),
                after,
                last_id: None,
                visible: None,
            };
        };
        let after = match m.from {
            ReadFrom::After(id) => id,
            ReadFrom::Last => stream.last_id(),
        };
        let entries = match after.next() {
            Some(lo) => stream.range(lo, StreamId::MAX, m.count, false),
            None => Vec::new(),
        };
        ReadResult {
            entries,
            after,
            last_id: Some(stream.last_id()),
            visible: None,
        }
    }

    /// A plain read run on the idle actor by a session on its shard (see
    /// [`StreamActor::one_at_once`]), as [`Read`]'s handler runs it, when
    /// it reads nothing evicted; `None` otherwise (nothing ran). With the
    /// answer, whether the activation holds nothing and should end.
    pub(crate) fn read_at_once(&mut self, m: &Read) -> Option<(ReadResult, bool)> {
        if !self.runs_at_once() || !self.plan_read(m).is_empty() {
            return None;
        }
        let mut result = self.read_fetched(m);
        result.visible = self.read_ticket();
        self.settle();
        // A read makes no stream: what the handler decides before the
        // read holds after it.
        self.drop_abandoned_watchers();
        Some((result, self.holds_nothing()))
    }
}

/// `XREADGROUP`'s read of one stream.
#[derive(Debug, Message)]
#[message(reply = GroupAnswer)]
pub struct ReadGroup {
    /// The group.
    pub group: Bytes,
    /// The consumer.
    pub consumer: Bytes,
    /// `>` or the consumer's history after an id.
    pub from: GroupFrom,
    /// At most this many (`None`: all).
    pub count: Option<u64>,
    /// `NOACK`: delivered entries are not made pending.
    pub noack: bool,
    /// Only say whether the group exists (checked for every stream before
    /// any is read, as Redis does).
    pub check_only: bool,
    /// A blocked reader's read, after its wake-up: a missing stream or
    /// group fails with Redis's texts for a blocked client, and the
    /// stream's last id past the group's serves the reader even with no
    /// entry for it ([`GroupAnswer::served`]).
    pub blocked: bool,
    /// The broker (its id: a message touches no shared reference count).
    pub broker: u64,
}

/// What a [`ReadGroup`] did.
#[derive(Debug)]
pub struct GroupAnswer {
    /// The entries, or the error.
    pub read: GroupRead,
    /// The stream's last id (a blocked reader watches for entries after it).
    pub last_id: StreamId,
    /// Completes when the delivery is flushed.
    pub durable: Option<Ticket>,
    /// A blocked reader's read is answered even with no entry (the
    /// stream's last id passed the group's: an entry added and removed at
    /// once); its consumer was made.
    pub served: bool,
}

impl Handler<ReadGroup> for StreamActor {
    async fn handle(&mut self, m: ReadGroup, cx: &mut Ctx<Self>) -> GroupAnswer {
        self.load(m.broker).await;
        // A group read makes nothing: a stream missing now stays so.
        self.end_if_nothing(cx);
        if let Some(answer) = self.group_read_early(&m) {
            return answer;
        }
        let wanted = self.plan_read_group(&m.group, &m.consumer, &m.from, m.count);
        self.fetch(wanted).await;
        self.group_read_fetched(&m)
    }
}

impl StreamActor {
    /// Whether group read `m` (no check, not blocked) would run at once
    /// now, reading nothing back ([`StreamActor::read_group_at_once`]
    /// answers it); the group's error when the stream lacks it.
    pub(crate) fn group_read_ready(&self, m: &ReadGroup) -> Result<bool, Reply> {
        if !self.runs_at_once() {
            // Not loaded yet (restarted after a panic, say): its stream and
            // groups are not known here.
            return Ok(false);
        }
        if !self
            .stream
            .as_ref()
            .is_some_and(|s| s.groups.contains_key(&m.group))
        {
            return Err(groups::no_group_in_readgroup(&self.name, &m.group));
        }
        Ok(self
            .plan_read_group(&m.group, &m.consumer, &m.from, m.count)
            .is_empty())
    }

    /// A group read's answer before any entry is read: a check of the
    /// group alone, or a blocked reader whose stream or group went.
    fn group_read_early(&self, m: &ReadGroup) -> Option<GroupAnswer> {
        let last_id = self.stream.as_ref().map_or(StreamId::MIN, Stream::last_id);
        if m.check_only {
            let exists = self
                .stream
                .as_ref()
                .is_some_and(|s| s.groups.contains_key(&m.group));
            return Some(GroupAnswer {
                read: if exists {
                    GroupRead::Entries(Vec::new())
                } else {
                    GroupRead::Error(groups::no_group_in_readgroup(&self.name, &m.group))
                },
                last_id,
                durable: None,
                served: false,
            });
        }
        if m.blocked {
            let gone = match &self.stream {
                None => Some("UNBLOCKED the stream key no longer exists"),
                Some(s) if !s.groups.contains_key(&m.group) => {
                    Some("NOGROUP the consumer group this client was blocked on no longer exists")
                }
                Some(_) => None,
            };
            if let Some(text) = gone {
                return Some(GroupAnswer {
                    read: GroupRead::Error(Reply::Error(text.to_owned())),
                    last_id,
                    // What it reports (a deletion) may still be flushing.
                    durable: self.read_ticket(),
                    served: false,
                });
            }
        }
        None
    }

    /// A group read once the entries it reads are in memory.
    fn group_read_fetched(&mut self, m: &ReadGroup) -> GroupAnswer {
        let last_id = self.stream.as_ref().map_or(StreamId::MIN, Stream::last_id);
        let (mut read, mut durable) =
            self.read_group(&m.group, &m.consumer, &m.from, m.count, m.noack);
        let mut served = false;
        if m.blocked && matches!(&read, GroupRead::Entries(e) if e.is_empty()) {
            match self.serve_blocked_empty(&m.group, &m.consumer) {
                None => {}
                Some(Ok(ticket)) => (served, durable) = (true, ticket),
                Some(Err(e)) => read = GroupRead::Error(e),
            }
        }
        self.publish_need();
        self.settle();
        GroupAnswer {
            read,
            last_id,
            durable: durable.or_else(|| self.read_ticket()),
            served,
        }
    }

    /// A group read run on the idle actor by a session on its shard (see
    /// [`StreamActor::one_at_once`]), as [`ReadGroup`]'s handler runs it,
    /// when it reads nothing evicted; `None` otherwise (nothing ran). With
    /// the answer, whether the activation holds nothing and should end.
    pub(crate) fn read_group_at_once(&mut self, m: &ReadGroup) -> Option<(GroupAnswer, bool)> {
        if !self.runs_at_once() {
            return None;
        }
        let answer = match self.group_read_early(m) {
            Some(answer) => answer,
            None => {
                if !self
                    .plan_read_group(&m.group, &m.consumer, &m.from, m.count)
                    .is_empty()
                {
                    return None;
                }
                self.group_read_fetched(m)
            }
        };
        // A group read makes no stream: what the handler decides before
        // the read holds after it.
        self.drop_abandoned_watchers();
        Some((answer, self.holds_nothing()))
    }
}

/// A `MULTI`/`EXEC` transaction on this stream: its commands run in
/// order with no other command between them, and their changes are logged
/// as one record (all or nothing after a crash).
#[derive(Debug, Message)]
#[message(reply = BatchAnswer)]
pub struct ExecBatch {
    /// The commands, each with its arguments.
    pub commands: Vec<Vec<Bytes>>,
    /// Per command, the connection's protocol when it runs (the shape of
    /// read replies; a `HELLO` in the transaction switches it).
    pub protos: Vec<Protocol>,
    /// The broker (its id: a message touches no shared reference count).
    pub broker: u64,
    /// Every stream the transaction names, sorted, when it names more
    /// than one (this one first: it coordinates, see
    /// the `transaction` module); empty when it names only this
    /// one.
    pub streams: Vec<Bytes>,
    /// Streams the transaction names that do not exist (nobody placed
    /// them, or the catalog lacks them) and none of its commands makes,
    /// sorted: answered as missing streams, placing and activating
    /// nothing.
    pub absent: Vec<Bytes>,
    /// One command run as a transaction of its own (a read or a `DEL`
    /// over several streams), not a client's `MULTI` block: a name found
    /// absent that was made meanwhile is answered as missing, the command
    /// taking effect before it was made, instead of refusing the command.
    pub bare: bool,
}

/// The replies of an [`ExecBatch`], and the flush they wait for.
#[derive(Debug)]
pub struct BatchAnswer {
    /// One reply per command; or, when the transaction was refused whole
    /// and changed nothing, the reply its `EXEC` gets instead.
    pub replies: Result<Vec<Reply>, Reply>,
    /// Completes when the transaction's record is flushed.
    pub durable: Option<Ticket>,
}

impl BatchAnswer {
    /// A transaction refused whole because its record could not be
    /// logged: Redis's reply to an `EXEC` refused before it ran.
    fn refused(e: &StorageError) -> Self {
        BatchAnswer {
            replies: Err(exec_refused(e)),
            durable: None,
        }
    }
}

/// `EXEC`'s reply when the transaction's record could not be logged.
fn exec_refused(e: &StorageError) -> Reply {
    let Reply::Error(why) = storage_error(e) else {
        unreachable!("a storage error is an error reply")
    };
    Reply::Error(format!("EXECABORT Transaction discarded because of: {why}"))
}

impl Handler<ExecBatch> for StreamActor {
    async fn handle(&mut self, m: ExecBatch, cx: &mut Ctx<Self>) -> BatchAnswer {
        self.load(m.broker).await;
        let Some(shared) = self.shared.take() else {
            return BatchAnswer {
                replies: Ok(m.commands.iter().map(|_| broker_gone()).collect()),
                durable: None,
            };
        };
        // Refused before it runs when its record could not be logged: the
        // log takes no appends and the transaction writes (one that only
        // reads runs, as reads do on a failed log), or the commands'
        // arguments alone are over its record limit (reading the stream
        // back after a refused record is the rare case, not one a client
        // can ask for at will).
        let writes = m.commands.iter().any(|c| command::writes(c));
        let refused = self.log.as_ref().and_then(|log| {
            log.refusal().filter(|_| writes).or_else(|| {
                let bytes: u64 = m
                    .commands
                    .iter()
                    .flat_map(|c| c.iter().skip(1))
                    .map(|a| a.len() as u64)
                    .sum();
                (bytes > log.max_record()).then_some(StorageError::TransactionTooLarge(bytes))
            })
        });
        if let Some(e) = refused {
            self.shared = Some(shared);
            self.end_if_nothing(cx);
            return BatchAnswer::refused(&e);
        }
        if m.streams.len() > 1 || !m.absent.is_empty() {
            // (Boxed: the rare transaction over several streams keeps a
            // large state across its awaits, which would otherwise size
            // every stream's task.)
            return Box::pin(self.exec_multi(m, shared, cx)).await;
        }
        let was_missing = self.stream.is_none();
        self.batch = Some(Vec::new());
        let replies: Vec<Reply> = m
            .commands
            .iter()
            .zip(m.protos.iter().chain(std::iter::repeat(&Protocol::Resp2)))
            .map(|(args, proto)| self.exec_in_batch(args, *proto, &shared))
            .collect();
        self.shared = Some(shared);
        let ops = self.batch.take().unwrap_or_default();
        let durable = if ops.is_empty() {
            // A transaction that only read: what it read may still be
            // flushing.
            self.read_ticket()
        } else {
            match self.append(Op::Batch(ops), was_missing) {
                Ok(t) => {
                    self.batch_logged(&t, self.appended_at, was_missing);
                    Some(t)
                }
                Err(e) => {
                    // Nothing was logged: every change is refused, and
                    // what the commands changed in memory is dropped.
                    self.signal = Signal::Quiet;
                    self.reload(m.broker).await;
                    self.end_if_nothing(cx);
                    return BatchAnswer::refused(&e);
                }
            }
        };
        self.wake_watchers();
        self.publish_need();
        self.settle();
        self.end_if_nothing(cx);
        BatchAnswer {
            replies: Ok(replies),
            durable,
        }
    }
}

impl StreamActor {
    /// One command of a transaction: stream commands, `DEL` / `EXISTS` /
    /// `TYPE` of this stream, `XREAD` / `XREADGROUP` without blocking, and
    /// `KEYS` / `SCAN` / `INFO` (the catalog as of their place).
    fn exec_in_batch(&mut self, args: &[Bytes], proto: Protocol, shared: &Shared) -> Reply {
        let name = command::lookup(&args[0]).map_or("", |s| s.name);
        match name {
            "exists" => Reply::Int(
                args[1..]
                    .iter()
                    .filter(|k| self.stream.is_some() && **k == self.name)
                    .count() as i64,
            ),
            "type" => Reply::Status(if self.stream.is_some() {
                "stream"
            } else {
                "none"
            }),
            // Answered here, at their place in the transaction: the
            // catalog has this stream's changes up to them.
            "keys" | "scan" | "info" | "dbsize" => crate::session::catalog_reply(
                shared,
                proto,
                args,
                &[(self.name.clone(), self.stream.is_some())],
            ),
            // The stream may be named more than once: served once per name,
            // as Redis does. Inside EXEC nothing blocks.
            "xread" => {
                let p = match command::parse_read(args, false) {
                    Ok(p) => p,
                    Err(e) => return e,
                };
                let mut found = Vec::new();
                for raw in &p.ids {
                    let after = match command::xread_id(raw) {
                        Ok(after) => after,
                        Err(e) => return e,
                    };
                    let entries = self.read_after(after, p.count);
                    if !entries.is_empty() {
                        found.push((self.name.clone(), entries));
                    }
                }
                if found.is_empty() {
                    Reply::NilArray
                } else {
                    crate::session::streams_reply(found, proto)
                }
            }
            "xreadgroup" => {
                let p = match command::parse_read(args, true) {
                    Ok(p) => p,
                    Err(e) => return e,
                };
                let (group, consumer) = p.group.clone().expect("parse_read checks GROUP");
                if !self
                    .stream
                    .as_ref()
                    .is_some_and(|s| s.groups.contains_key(&group))
                {
                    return groups::no_group_in_readgroup(&self.name, &group);
                }
                let mut froms = Vec::with_capacity(p.ids.len());
                for raw in &p.ids {
                    froms.push(match command::xreadgroup_id(raw) {
                        Ok(None) => GroupFrom::New,
                        Ok(Some(_)) => GroupFrom::History(raw.clone()),
                        Err(e) => return e,
                    });
                }
                let mut found = Vec::new();
                for from in &froms {
                    let history = matches!(from, GroupFrom::History(_));
                    match self.read_group(&group, &consumer, from, p.count, p.noack).0 {
                        GroupRead::Error(e) => return e,
                        GroupRead::Entries(e) if e.is_empty() && !history => {}
                        GroupRead::Entries(e) => found.push((self.name.clone(), e)),
                    }
                }
                if found.is_empty() {
                    Reply::NilArray
                } else {
                    crate::session::group_streams_reply(found, proto)
                }
            }
            _ => self.exec(name, args, shared).reply,
        }
    }
}

/// Registers a blocked reader: served at the first signal that serves it
/// (at once if something came since its read). With a notify already done
/// (its reader gave up, or another stream served it), a sweep: the actor
/// drops the watchers of readers that gave up, and ends if it holds
/// nothing else.
#[derive(Debug, Message)]
pub struct Watch {
    /// The id the reader has read up to: the id an `XREAD` named (or the
    /// stream's last id then, for `$`), the stream's last id at a group
    /// reader's read.
    pub after: StreamId,
    /// What to wake.
    pub notify: Arc<Notify>,
    /// Which of the reader's streams this is.
    pub index: usize,
    /// The read that serves it (`None`: a sweep).
    pub reader: Option<BlockedRead>,
    /// The broker (its id: a message touches no shared reference count).
    pub broker: u64,
}

/// The read a blocked reader is served with.
#[derive(Debug, Clone)]
pub enum BlockedRead {
    /// `XREAD`: the entries after its id.
    Plain {
        /// At most this many (`None`: all).
        count: Option<u64>,
    },
    /// `XREADGROUP ... >`: the group's new entries, delivered to the
    /// consumer.
    Group {
        /// The group.
        group: Bytes,
        /// The consumer.
        consumer: Bytes,
        /// At most this many (`None`: all).
        count: Option<u64>,
        /// `NOACK`: delivered without a pending entry.
        noack: bool,
    },
}

/// A blocked reader a stream holds.
#[derive(Debug)]
pub(crate) struct Watcher {
    notify: Arc<Notify>,
    index: usize,
    after: StreamId,
    read: BlockedRead,
}

impl Drop for Watcher {
    /// A watcher dropped before its reader was served (its actor's
    /// handler panicked, even while serving it) wakes the reader to read
    /// for itself, and to watch the stream's next activation, instead of
    /// leaving it blocked on a watcher nobody holds. Served, or given up,
    /// the wake changes nothing.
    fn drop(&mut self) {
        self.notify.fire(self.index);
    }
}

impl Shared {
    /// Has the plain blocked reader `notify` (its stream `index`, reading
    /// after `after`) wait in the broker's table for the making of stream
    /// `key`, if nobody ever named it; `false` (nothing done) when it was
    /// placed: its actor is to be told. Checked and registered under the
    /// table's lock, which the maker's actor takes after it made the
    /// stream (placing its name before): either this sees the name placed,
    /// or the maker finds the watcher.
    pub(crate) fn await_making(
        &self,
        key: &Bytes,
        after: StreamId,
        notify: &Arc<Notify>,
        index: usize,
        read: &BlockedRead,
    ) -> bool {
        // A name once placed stays placed: the lock is taken only for one
        // that was not, and the check made again under it.
        if self.system.placed_shard::<StreamActor>(key).is_some() {
            return false;
        }
        let mut awaiting = self.awaiting.lock().unwrap_or_else(|p| p.into_inner());
        if self.system.placed_shard::<StreamActor>(key).is_some() {
            return false;
        }
        awaiting.entry(key.clone()).or_default().push(Watcher {
            notify: notify.clone(),
            index,
            after,
            read: read.clone(),
        });
        true
    }

    /// Takes the watcher of reader `notify`'s stream `index` (a name
    /// given twice has two) for stream `key` out of the table; `false`
    /// when its stream's maker adopted it first.
    pub(crate) fn stop_awaiting(&self, key: &Bytes, notify: &Arc<Notify>, index: usize) -> bool {
        let gone: Vec<Watcher> = {
            let mut awaiting = self.awaiting.lock().unwrap_or_else(|p| p.into_inner());
            let Some(watchers) = awaiting.get_mut(key) else {
                return false;
            };
            let (gone, kept) = std::mem::take(watchers)
                .into_iter()
                .partition(|w| Arc::ptr_eq(&w.notify, notify) && w.index == index);
            *watchers = kept;
            if watchers.is_empty() {
                awaiting.remove(key);
            }
            gone
        };
        // Dropped out of the lock (a watcher's drop fires its wake-up).
        !gone.is_empty()
    }

    /// Readers waiting in the table for a stream's making.
    pub(crate) fn awaiting_makings(&self) -> usize {
        self.awaiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(Vec::len)
            .sum()
    }

    /// The watchers waiting for stream `key`'s making: its maker's to
    /// hold.
    fn made(&self, key: &[u8]) -> Vec<Watcher> {
        let mut awaiting = self.awaiting.lock().unwrap_or_else(|p| p.into_inner());
        if awaiting.is_empty() {
            return Vec::new();
        }
        awaiting.remove(key).unwrap_or_default()
    }
}

/// What a blocked reader was served with, inside the stream's actor at
/// the signal (see `Notify::serve`).
#[derive(Debug)]
pub enum Served {
    /// An `XREAD`'s entries (none: an entry added and removed at once),
    /// and the flush of what it shows, which its reply waits for.
    Entries(Vec<(StreamId, Fields)>, Option<Ticket>),
    /// An `XREADGROUP`'s read (entries, none, or the error a blocked
    /// reader gets), and the flush its delivery waits for.
    Group(GroupRead, Option<Ticket>),
}

/// What a signal does to one blocked reader.
enum Outcome {
    /// Nothing for it: it stays blocked.
    Keep,
    /// Served: its answer.
    Answer(Served),
    /// Woken to read for itself (what it reads is not in memory).
    Wake,
}

impl Handler<Watch> for StreamActor {
    async fn handle(&mut self, m: Watch, cx: &mut Ctx<Self>) {
        self.load(m.broker).await;
        let Some(read) = m.reader else {
            // Its reader gave up (or another stream served it) before this
            // came: nothing to watch; the reader's sweep ends an actor
            // that holds nothing else.
            self.end_if_nothing(cx);
            return;
        };
        if m.notify.is_done() {
            self.end_if_nothing(cx);
            return;
        }
        let w = Watcher {
            notify: m.notify,
            index: m.index,
            after: m.after,
            read,
        };
        // Between the reader's read and this watch, nobody was watching:
        // what happened meanwhile serves it now, as the signal would have
        // (an entry past its id, or its stream or group gone). For a plain
        // reader, not a last id past its own with no entry after it: its
        // id may be one it named, and that was so at its read already
        // (Redis's read checks the last entry's id, not the stream's last
        // id); an entry added and removed in between is missed.
        let missed = match (&self.stream, &w.read) {
            (None, BlockedRead::Group { .. }) => true,
            (Some(s), BlockedRead::Group { group, .. }) if !s.groups.contains_key(group) => true,
            // A group's reader read up to the stream's last id: past it
            // now, something came (an entry added, even one removed at
            // once).
            (Some(s), BlockedRead::Group { .. }) => s.last_id() > w.after,
            (Some(s), BlockedRead::Plain { .. }) => {
                s.last_entry_id().is_some_and(|id| id > w.after)
            }
            (None, BlockedRead::Plain { .. }) => false,
        };
        self.drop_abandoned_watchers();
        if missed {
            // Served or not, the log is told what the stream needs now
            // (nothing changed when it stays blocked: the call is cheap).
            self.serve(w);
            self.publish_need();
            self.settle();
            self.end_if_nothing(cx);
        } else {
            self.watchers.push(w);
        }
    }
}

/// A blocked reader's wake-up: the first stream to fire wins.
#[derive(Debug, Default)]
pub struct Notify {
    state: Mutex<NotifyState>,
    /// Set once it fired or its reader gave up: the streams watching for
    /// it drop it (a read over several streams leaves a copy in each, so
    /// their count of holders says nothing).
    done: AtomicBool,
}

/// What [`Notify::fire_with`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fired {
    /// It fired now.
    Now,
    /// Something fired first, or its reader gave up.
    Before,
    /// The read kept the waiter blocked.
    Kept,
}

#[derive(Debug, Default)]
struct NotifyState {
    /// The stream that fired.
    fired: Option<usize>,
    /// What the stream that fired served the reader with, if it did.
    served: Option<Served>,
    /// Its reader gave up first: no stream serves it.
    gave_up: bool,
    waker: Option<Waker>,
}

impl Notify {
    /// A notify nobody fired.
    pub fn new() -> Arc<Notify> {
        Arc::new(Notify::default())
    }

    /// Wakes the waiter with `index` unless something fired first or it
    /// gave up; whether this fire was the first.
    pub fn fire_first(&self, index: usize) -> bool {
        self.fire_with(index, || Outcome::Wake) == Fired::Now
    }

    /// Wakes the waiter with `index` (the first fire wins), to read for
    /// itself.
    pub fn fire(&self, index: usize) {
        // Done already (served, fired, or given up): nothing to wake, and
        // no lock taken (a served reader's watcher fires as it drops).
        if self.done.swap(true, Ordering::AcqRel) {
            return;
        }
        let waker = {
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if s.fired.is_some() {
                return;
            }
            s.fired = Some(index);
            s.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Serves the waiter from stream `index` unless another stream did
    /// (the first wins): `read` runs under the notify's lock, so exactly
    /// one stream's read happens (a group read delivers entries). Whether
    /// the waiter is done with this stream (served, woken or served
    /// elsewhere); `false`: it stays blocked here.
    fn serve(&self, index: usize, read: impl FnOnce() -> Outcome) -> bool {
        self.fire_with(index, read) != Fired::Kept
    }

    /// Fires with `index` unless something fired first or the reader gave
    /// up, if `read` (run under the lock) does not keep the waiter.
    fn fire_with(&self, index: usize, read: impl FnOnce() -> Outcome) -> Fired {
        let waker = {
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if s.fired.is_some() || s.gave_up {
                return Fired::Before;
            }
            match read() {
                Outcome::Keep => return Fired::Kept,
                Outcome::Answer(served) => s.served = Some(served),
                Outcome::Wake => {}
            }
            s.fired = Some(index);
            self.done.store(true, Ordering::Release);
            s.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
        Fired::Now
    }

    /// Its reader gives up (timed out, or went away): no stream serves
    /// it from now on, and none needs to keep it. What fired first, if
    /// something did (a reader served as its time ran out is answered with
    /// what it was served: a group's entries were delivered to it).
    pub fn give_up(&self) -> Option<(usize, Option<Served>)> {
        self.done.store(true, Ordering::Release);
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.gave_up = true;
        let served = s.served.take();
        s.fired.map(|i| (i, served))
    }

    /// Whether it fired or its reader gave up.
    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Completes with the index of the first stream that fired, and what
    /// it served the reader with if it did (else the reader reads for
    /// itself).
    pub async fn fired(&self) -> (usize, Option<Served>) {
        std::future::poll_fn(|cx| {
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            match s.fired {
                Some(i) => Poll::Ready((i, s.served.take())),
                None => {
                    s.waker = Some(cx.waker().clone());
                    Poll::Pending
                }
            }
        })
        .await
    }
}

impl StreamActor {
    /// Takes the recovered state and finds the shard's log, at the first
    /// message. An actor with no recovered state (restarted after a panic,
    /// or activated again after it ended) asks its log: a stream it knows
    /// as deleted starts empty, numbering on from its last record; one it
    /// knows otherwise is read back from the log's segments.
    async fn load(&mut self, broker: u64) {
        if self.loaded {
            return;
        }
        // (Boxed: its state, held across the read back, would otherwise
        // size every handler's, and so every stream's task.)
        Box::pin(self.load_first(broker)).await;
    }

    /// [`StreamActor::load`] at the first message.
    async fn load_first(&mut self, broker: u64) {
        self.loaded = true;
        let Some(shared) = Shared::find(broker) else {
            return;
        };
        let recovered = {
            let mut recovered = shared.recovered.lock().unwrap_or_else(|p| p.into_inner());
            if recovered.is_empty() {
                None
            } else {
                recovered.remove(&self.name)
            }
        };
        self.log = store::shard_log(shared.id);
        // An earlier activation's last records may still be flushing.
        self.last_lsn = self.log.as_ref().map_or(0, |l| l.last_lsn());
        let recovered = match (recovered, &self.log) {
            (Some(r), _) => Some(r),
            (None, Some(log)) if log.gone_op_no(&self.name).is_some() => {
                // Deleted, its records still on disk: nothing to read
                // back but where its operation numbers go on from. The log
                // knows all this already: nothing is told again (a
                // deletion still waiting for its flush stays waiting).
                self.op_no = log.gone_op_no(&self.name).unwrap_or(0);
                self.last_segment = log.current_segment();
                self.published = Some(None);
                None
            }
            // (Boxed, as every read of the disk here: awaited inline, its
            // state would size every stream's task, idle ones included.)
            (None, Some(log)) if log.knows(&self.name) => {
                match Box::pin(log.read_back(&self.name, shared.config.store.stream_cache_bytes))
                    .await
                {
                    Ok(r) => {
                        // Its last records may not be flushed: a need they
                        // move waits for the segment now written to.
                        self.last_segment = log.current_segment();
                        Some(r)
                    }
                    // Answering from an empty stream would be wrong: this
                    // panics again, and past its restart budget the actor
                    // stops, so its commands get an error.
                    Err(e) => panic!("reading stream back from its log failed: {e}"),
                }
            }
            (None, _) => None,
        };
        if let Some(r) = recovered {
            self.stream = r.stream;
            self.op_no = r.op_no;
            self.meta_segment = r.meta_segment;
            self.runs = r.runs;
        }
        if let (Some(s), Some(log)) = (self.stream.as_mut(), self.log.as_ref()) {
            // The log's own reader: it closes a segment's file when the
            // segment goes.
            s.set_source(log.source().clone());
        }
        self.cache_budget = shared.config.store.stream_cache_bytes;
        self.gauge = Some(shared.cached_bytes.clone());
        self.shared = Some(shared);
        self.settle();
        // Tells the log what the stream needs (a recovered need, counted
        // at start, only agrees; a stream read back after a panic moves it
        // from the segment now written to).
        self.publish_need();
    }

    /// Drops what this actor holds of its stream and reads the stream back
    /// from its log, as an actor restarted after a panic does: for a
    /// transaction whose record the log refused (larger than it takes,
    /// though its arguments were not), after its commands changed the
    /// stream in memory. A log that failed meanwhile may not be read back:
    /// the actor panics then, as a restarted one does, rather than answer
    /// from changes that were never logged.
    async fn reload(&mut self, broker: u64) {
        self.stream = None;
        self.loaded = false;
        self.op_no = 0;
        self.meta_segment = 0;
        self.runs.clear();
        self.last_segment = 0;
        self.published = None;
        self.made_untold = false;
        self.appended_at = Loc::NONE;
        // Its cached bytes leave the broker's total.
        self.settle();
        self.load(broker).await;
        if let Some(shared) = &self.shared {
            let change = self.read_ticket();
            match self.stream {
                Some(_) => shared.catalog.insert(&self.name, change),
                None => shared.catalog.remove(&self.name, change),
            }
        }
    }

    /// Tells the log the oldest segment this stream needs, if that moved.
    fn publish_need(&mut self) {
        let Some(log) = self.log.as_ref() else {
            return;
        };
        let small = store::small_stream_bytes(log.segment_bytes());
        let need = need_of(
            self.stream.as_ref(),
            self.meta_segment,
            &mut self.runs,
            small,
        );
        // Told too when a record made the stream since (the log holds
        // that record's segment until told), whatever the need: made and
        // deleted in between, the log learns the deletion's number and
        // holds the segment until the deletion is flushed.
        if self.published != Some(need) || self.made_untold {
            log.set_need(&self.name, need, self.last_segment, self.op_no);
            self.published = Some(need);
            self.made_untold = false;
        }
    }

    /// [`StreamActor::note`] for `Op::Add { id, .. }`.
    fn note_add(&mut self, id: StreamId, segment: u32, starts: bool) {
        if starts {
            self.meta_segment = segment;
            self.runs.clear();
        }
        self.last_segment = segment;
        if self.runs.back().is_none_or(|r| r.1 != segment) {
            crate::stream::push_back_sparingly(&mut self.runs, (id, segment));
        }
    }

    /// Notes where a record just logged in `segment` put this stream's
    /// history and entries (`starts`: the stream did not exist before
    /// it, so its history starts there).
    fn note(&mut self, op: &Op, segment: u32, starts: bool) {
        if let Op::Add { id, .. } = op {
            return self.note_add(*id, segment, starts);
        }
        if starts {
            self.meta_segment = segment;
            self.runs.clear();
        }
        self.last_segment = segment;
        match op {
            Op::Snapshot(_) => self.meta_segment = segment,
            Op::Drop => {
                self.meta_segment = segment;
                self.runs.clear();
            }
            Op::Batch(ops) => {
                for op in ops {
                    self.note(op, segment, false);
                }
            }
            _ => {}
        }
    }

    /// The evicted entries a stream command with these arguments reads.
    fn plan_reads(&self, name: &str, args: &[Bytes]) -> Vec<(StreamId, Loc)> {
        let Some(stream) = self.stream.as_ref() else {
            return Vec::new();
        };
        match name {
            "xrange" | "xrevrange" => {
                let rev = name == "xrevrange";
                match command::parse_range_args(args, rev) {
                    Ok((lo, hi, count)) if count != Some(0) => {
                        stream.missing_in_range(lo, hi, count, rev)
                    }
                    _ => Vec::new(),
                }
            }
            _ => self.plan_group_reads(name, args),
        }
    }

    /// Brings back, through the ring, the evicted entries a command is
    /// about to read; they stay until [`StreamActor::settle`].
    async fn fetch(&mut self, wanted: Vec<(StreamId, Loc)>) {
        if wanted.is_empty() {
            return;
        }
        let Some(log) = self.log.clone() else {
            return;
        };
        match Box::pin(log.fetch(&wanted)).await {
            Ok(found) => {
                FETCHED_READS.fetch_add(found.len() as u64, Ordering::Relaxed);
                if let Some(stream) = self.stream.as_mut() {
                    for (id, fields) in found {
                        stream.lend(id, fields);
                    }
                }
            }
            // As for a blocking read: nothing sound to answer with.
            Err(e) => panic!("reading entries back from the log failed: {e}"),
        }
    }

    /// After a command: keeps the stream's cached entries within budget
    /// and the broker's count of them current.
    fn settle(&mut self) {
        let written = self.log.as_ref().map_or(Loc::NONE, |l| l.written());
        let now = match self.stream.as_mut() {
            Some(s) => {
                if let Some(log) = self.log.as_ref().filter(|_| !s.has_source()) {
                    s.set_source(log.source().clone());
                }
                s.settle(self.cache_budget, written);
                s.cached_bytes()
            }
            None => 0,
        };
        if now != self.counted {
            if let Some(gauge) = &self.gauge {
                // One atomic step for the change, up or down (the sum of
                // every stream's steps never goes below zero).
                gauge.add(now.wrapping_sub(self.counted));
            }
            self.counted = now;
        }
    }

    /// Ends this activation after the message being handled when it holds
    /// nothing: no stream, no blocked reader, no transaction open, and a
    /// fresh activation would number its records on correctly (see
    /// [`StreamActor::numbering_resumable`]). A command naming a stream
    /// that does not exist then leaves no actor behind (a client reading
    /// many missing names would otherwise keep one each); the next message
    /// for the name activates a fresh one on the same shard.
    fn end_if_nothing(&mut self, cx: &mut Ctx<Self>) {
        self.drop_abandoned_watchers();
        if self.holds_nothing() {
            cx.stop();
        }
    }

    /// No stream, no blocked reader, no transaction open, and a fresh
    /// activation would number on correctly (see
    /// [`StreamActor::end_if_nothing`]).
    fn holds_nothing(&self) -> bool {
        self.stream.is_none()
            && self.watchers.is_empty()
            && self.batch.is_none()
            && self.numbering_resumable()
    }

    /// Whether a fresh activation would number this stream's next record
    /// so that recovery replays it after every record on disk: its log
    /// has no records of it (numbering from 1 again is safe), or knows it
    /// as deleted at this actor's last operation number.
    fn numbering_resumable(&self) -> bool {
        match &self.log {
            None => self.op_no == 0,
            Some(log) => match log.gone_op_no(&self.name) {
                Some(n) => n == self.op_no,
                None => !log.knows(&self.name),
            },
        }
    }

    /// Tells the catalog whether this stream exists, as the append
    /// `change` logged it. Inside a transaction, nothing: its end tells
    /// it once the transaction's record is appended (a reader on another
    /// shard must not see a name before the append it waits for).
    fn tell_catalog(&mut self, shared: &Shared, change: &Ticket) {
        if self.batch.is_some() {
            return;
        }
        let change = Some(change.for_read());
        match self.stream {
            Some(_) => {
                shared.catalog.insert(&self.name, change);
                // Readers blocked on the name before anyone placed it
                // are this stream's now (served after this command, as
                // those it held).
                let waiting = shared.made(&self.name);
                self.watchers
                    .extend(waiting.into_iter().filter(|w| !w.notify.is_done()));
            }
            None => shared.catalog.remove(&self.name, change),
        }
    }

    /// For a reply that shows this stream's state: the flush of its last
    /// append, if that is not done yet.
    fn read_ticket(&self) -> Option<Ticket> {
        self.log.as_ref()?.read_ticket(self.last_lsn)
    }

    /// Drops the watchers of readers that gave up (timed out,
    /// disconnected): they hold no handle.
    fn drop_abandoned_watchers(&mut self) {
        if !self.watchers.is_empty() {
            self.watchers
                .retain(|w| Arc::strong_count(&w.notify) > 1 && !w.notify.is_done());
        }
    }

    /// Serves the blocked readers if the command just run signalled them
    /// (Redis serves them after each command): each reader this stream
    /// serves gets its read now, in the order they blocked; the others
    /// stay blocked. A group's reader whose stream or group is gone fails,
    /// as Redis unblocks it.
    fn wake_watchers(&mut self) {
        if std::mem::replace(&mut self.signal, Signal::Quiet) == Signal::Quiet
            || self.watchers.is_empty()
        {
            return;
        }
        let watchers = std::mem::take(&mut self.watchers);
        for w in watchers {
            if Arc::strong_count(&w.notify) > 1 && !w.notify.is_done() {
                self.serve(w);
            }
        }
    }

    /// Serves blocked reader `w` if its read finds something for it (see
    /// [`Outcome`]), else keeps it.
    fn serve(&mut self, w: Watcher) {
        let notify = w.notify.clone();
        if !notify.serve(w.index, || self.blocked_read(&w)) {
            self.watchers.push(w);
        }
    }

    /// What a signal does to blocked reader `w`: Redis's service of a
    /// client blocked on a stream (a plain reader is served once the
    /// stream's last id passes its own, a group's reader with the group's
    /// new entries, or an error once its stream or group is gone).
    fn blocked_read(&mut self, w: &Watcher) -> Outcome {
        match &w.read {
            BlockedRead::Plain { count } => {
                let Some(stream) = &self.stream else {
                    // A deleted stream does not answer a plain reader: one
                    // made again past its id will.
                    return Outcome::Keep;
                };
                if stream.last_id() <= w.after {
                    return Outcome::Keep;
                }
                let Some(lo) = w.after.next() else {
                    return Outcome::Keep;
                };
                if !stream
                    .missing_in_range(lo, StreamId::MAX, *count, false)
                    .is_empty()
                {
                    return Outcome::Wake;
                }
                // None when an entry was added and removed at once: served
                // all the same, as Redis serves it.
                let entries = stream.range(lo, StreamId::MAX, *count, false);
                Outcome::Answer(Served::Entries(entries, self.read_ticket()))
            }
            BlockedRead::Group {
                group,
                consumer,
                count,
                noack,
            } => {
                let gone = match &self.stream {
                    None => Some("UNBLOCKED the stream key no longer exists"),
                    Some(s) if !s.groups.contains_key(group) => Some(
                        "NOGROUP the consumer group this client was blocked on no longer exists",
                    ),
                    Some(_) => None,
                };
                if let Some(text) = gone {
                    // The deletion it reports may still be flushing.
                    return Outcome::Answer(Served::Group(
                        GroupRead::Error(Reply::Error(text.to_owned())),
                        self.read_ticket(),
                    ));
                }
                if !self
                    .plan_read_group(group, consumer, &GroupFrom::New, *count)
                    .is_empty()
                {
                    return Outcome::Wake;
                }
                let (read, durable) =
                    self.read_group(group, consumer, &GroupFrom::New, *count, *noack);
                match read {
                    GroupRead::Entries(e) if e.is_empty() => {
                        match self.serve_blocked_empty(group, consumer) {
                            None => Outcome::Keep,
                            Some(Ok(ticket)) => Outcome::Answer(Served::Group(
                                GroupRead::Entries(e),
                                ticket.or(durable).or_else(|| self.read_ticket()),
                            )),
                            Some(Err(e)) => Outcome::Answer(Served::Group(
                                GroupRead::Error(e),
                                self.read_ticket(),
                            )),
                        }
                    }
                    read => {
                        Outcome::Answer(Served::Group(read, durable.or_else(|| self.read_ticket())))
                    }
                }
            }
        }
    }

    /// Notes a signal for the blocked readers (a deletion outranks the
    /// rest).
    pub(crate) fn signal(&mut self, signal: Signal) {
        self.signal = self.signal.max(signal);
    }
}

impl StreamActor {
    /// The reply to stream command `name` (the table's lower-case name) on
    /// stream `key`, which does not exist, when the command makes no
    /// stream (see [`StreamActor::makes_stream`]): what a fresh actor
    /// answers. Such a command logs nothing, so the session answers it
    /// without activating an actor or placing the name (a client probing
    /// missing names would otherwise leave a directory record for each).
    pub(crate) fn answer_missing(
        name: &'static str,
        key: &Bytes,
        args: &[Bytes],
        shared: &Shared,
    ) -> Reply {
        let mut actor = StreamActor::new(key);
        actor.loaded = true;
        let answer = actor.exec(name, args, shared);
        debug_assert!(
            actor.stream.is_none() && actor.op_no == 0,
            "{name} changed a missing stream"
        );
        answer.reply
    }

    /// Whether stream command `name` with `args` may make its stream:
    /// `XADD` without `NOMKSTREAM`, `XGROUP CREATE key group id MKSTREAM`
    /// whose id parses (one that does not parse makes nothing: it gets
    /// its error).
    pub(crate) fn makes_stream(name: &str, args: &[Bytes]) -> bool {
        match name {
            "xadd" => command::parse_add_or_trim(args, true).is_ok_and(|p| !p.no_mkstream),
            "xgroup" => {
                args.len() >= 6
                    && args[1].eq_ignore_ascii_case(b"create")
                    && args[5..]
                        .iter()
                        .any(|a| a.eq_ignore_ascii_case(b"mkstream"))
                    && (args[4].as_ref() == b"$" || parse_id(&args[4], 0, true).is_ok())
            }
            _ => false,
        }
    }
}

impl StreamActor {
    /// Logs `op` as this stream's next operation (in a transaction, adds
    /// it to the transaction's record; the ticket of that record is the
    /// one that counts).
    fn log(&mut self, op: Op) -> Result<Ticket, StorageError> {
        let log = self.log.as_ref().ok_or(StorageError::Closed)?;
        if let Some(batch) = self.batch.as_mut() {
            batch.push(op);
            self.appended_at = Loc::NONE;
            return Ok(log.no_wait());
        }
        let starts = self.stream.is_none();
        self.append(op, starts)
    }

    /// [`StreamActor::log`] of `Op::Add { id, fields }`, encoded from
    /// borrowed parts outside a transaction (no copy of the name or the
    /// fields' handle for a record that is dropped once encoded).
    fn log_add(&mut self, id: StreamId, fields: &Fields) -> Result<Ticket, StorageError> {
        if self.batch.is_some() {
            return self.log(Op::Add {
                id,
                fields: fields.clone(),
            });
        }
        let log = self.log.as_ref().ok_or(StorageError::Closed)?;
        let starts = self.stream.is_none();
        let op_no = self.op_no + 1;
        let (ticket, loc) =
            log.append_encoded(|dst| crate::log::encode_add(dst, &self.name, op_no, id, fields))?;
        self.last_lsn = ticket.lsn();
        if starts {
            log.note_making(&self.name, loc.segment, op_no);
            self.made_untold = true;
        }
        self.op_no = op_no;
        self.appended_at = loc;
        self.note_add(id, loc.segment, starts);
        Ok(ticket)
    }

    /// Appends `op` as this stream's next record (`starts`: the stream
    /// did not exist before it).
    fn append(&mut self, op: Op, starts: bool) -> Result<Ticket, StorageError> {
        let log = self.log.as_ref().ok_or(StorageError::Closed)?;
        let record = Record {
            stream: self.name.clone(),
            op_no: self.op_no + 1,
            op,
        };
        let (ticket, loc) = log.append(&record)?;
        self.appended(&record.op, &ticket, loc, starts);
        Ok(ticket)
    }

    /// Notes `op`, this stream's next operation, as logged at `loc` with
    /// `ticket` (`starts`: the stream did not exist before it).
    fn appended(&mut self, op: &Op, ticket: &Ticket, loc: Loc, starts: bool) {
        self.last_lsn = ticket.lsn();
        if starts {
            if let Some(log) = &self.log {
                log.note_making(&self.name, loc.segment, self.op_no + 1);
            }
            self.made_untold = true;
        }
        self.op_no += 1;
        self.appended_at = loc;
        self.note(op, loc.segment, starts);
    }

    /// Runs stream command `name` (the table's lower-case name).
    fn exec(&mut self, name: &str, args: &[Bytes], shared: &Shared) -> Answer {
        match name.as_bytes() {
            b"debug-panic" => panic!("DEBUG PANIC-STREAM: a stream actor panics on request"),
            b"xadd" => {
                let p = match command::parse_add_or_trim(args, true) {
                    Ok(p) => p,
                    Err(e) => return e.into(),
                };
                if self.stream.is_none() && p.no_mkstream {
                    return Reply::Nil.into();
                }
                let next = match &self.stream {
                    Some(stream) => stream.next_id(p.id, now_ms()),
                    None => Stream::new().next_id(p.id, now_ms()),
                };
                let id = match next {
                    Ok(id) => id,
                    Err(e) => return e.into(),
                };
                let fields = Fields::from_parts(&args[p.fields_at..]);
                let mut ticket = match self.log_add(id, &fields) {
                    Ok(t) => t,
                    Err(e) => return storage_error(&e).into(),
                };
                if self.stream.is_none() {
                    self.stream = Some(Stream::new());
                    self.tell_catalog(shared, &ticket);
                }
                let loc = self.appended_at;
                self.signal(Signal::Ready);
                let stream = self.stream.as_mut().expect("made above");
                stream.insert(id, fields, loc);
                if let Some(trim) = p.trim {
                    if let (_, Some(through)) = stream.trim_plan(&trim) {
                        match self.log(Op::TrimThrough { through }) {
                            Ok(t) => ticket = t,
                            Err(e) => return storage_error(&e).into(),
                        }
                        if let Some(s) = self.stream.as_mut() {
                            s.trim_through(through);
                        }
                    }
                }
                Answer {
                    reply: id.reply(),
                    durable: Some(ticket),
                }
            }
            b"xlen" => Reply::Int(self.stream.as_ref().map_or(0, |s| s.len() as i64)).into(),
            // Asked by a session for `EXISTS` / `TYPE` behind its requests
            // in flight (the catalog may not have their changes yet).
            b"exists" => Reply::Int(i64::from(self.stream.is_some())).into(),
            b"xrange" | b"xrevrange" => {
                let rev = name == "xrevrange";
                let (lo, hi, count) = match command::parse_range_args(args, rev) {
                    Ok(r) => r,
                    Err(e) => return e.into(),
                };
                let Some(stream) = &self.stream else {
                    return Reply::Array(Vec::new()).into();
                };
                if count == Some(0) {
                    // Redis answers a zero (or negative) count with a null
                    // (after the missing stream's empty array).
                    return Reply::NilArray.into();
                }
                Reply::Entries(
                    stream
                        .range(lo, hi, count, rev)
                        .into_iter()
                        .map(|(id, f)| (id, Some(f)))
                        .collect(),
                )
                .into()
            }
            b"xdel" => {
                let Some(stream) = &self.stream else {
                    return Reply::Int(0).into();
                };
                let mut ids = match command::parse_ids(&args[2..]) {
                    Ok(ids) => ids,
                    Err(e) => return e.into(),
                };
                ids.sort_unstable();
                ids.dedup();
                ids.retain(|id| stream.contains(*id));
                if ids.is_empty() {
                    return Reply::Int(0).into();
                }
                let ticket = match self.log(Op::Delete { ids: ids.clone() }) {
                    Ok(t) => t,
                    Err(e) => return storage_error(&e).into(),
                };
                let n = self.stream.as_mut().expect("checked").delete(&ids);
                Answer {
                    reply: Reply::Int(n as i64),
                    durable: Some(ticket),
                }
            }
            b"xtrim" => {
                let p = match command::parse_add_or_trim(args, false) {
                    Ok(p) => p,
                    Err(e) => return e.into(),
                };
                let (Some(stream), Some(trim)) = (self.stream.as_ref(), p.trim) else {
                    return Reply::Int(0).into();
                };
                let (n, Some(through)) = stream.trim_plan(&trim) else {
                    return Reply::Int(0).into();
                };
                let ticket = match self.log(Op::TrimThrough { through }) {
                    Ok(t) => t,
                    Err(e) => return storage_error(&e).into(),
                };
                if let Some(s) = self.stream.as_mut() {
                    s.trim_through(through);
                }
                Answer {
                    reply: Reply::Int(n as i64),
                    durable: Some(ticket),
                }
            }
            b"del" => {
                if self.stream.is_none() {
                    return Reply::Int(0).into();
                }
                let ticket = match self.log(Op::Drop) {
                    Ok(t) => t,
                    Err(e) => return storage_error(&e).into(),
                };
                self.stream = None;
                self.signal(Signal::Deleted);
                self.tell_catalog(shared, &ticket);
                Answer {
                    reply: Reply::Int(1),
                    durable: Some(ticket),
                }
            }
            b"xgroup" => self.xgroup(args, shared),
            b"xack" => self.xack(args),
            b"xpending" => self.xpending(args),
            b"xclaim" => self.xclaim(args),
            b"xautoclaim" => self.xautoclaim(args),
            b"xinfo" => self.xinfo(args),
            b"memory" => memory_usage(self.stream.as_ref(), args).into(),
            b"xsetid" => self.xsetid(args, shared),
            _ => command::unknown_command(args).into(),
        }
    }
}

/// `MEMORY USAGE key [SAMPLES count]` (`HELP` is answered by the
/// session): Redis's option errors, then the stream's estimate (see
/// [`Stream::memory_estimate`]), or nil for a missing stream.
fn memory_usage(stream: Option<&Stream>, args: &[Bytes]) -> Reply {
    let mut i = 3;
    while i < args.len() {
        if !args[i].eq_ignore_ascii_case(b"samples") || i + 1 >= args.len() {
            return command::syntax_error();
        }
        match crate::resp::parse_int(&args[i + 1]) {
            Some(n) if n >= 0 => {}
            Some(_) => return command::syntax_error(),
            None => return command::not_an_integer(),
        }
        i += 2;
    }
    stream.map_or(Reply::Nil, |s| Reply::Int(s.memory_estimate() as i64))
}
