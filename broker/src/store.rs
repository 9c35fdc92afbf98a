//! Durable storage: recovery of every log at start, and each shard's log
//! writer, which group-commits: appends made while a flush is in flight
//! go out together in the next write and `fdatasync`, and each append's
//! [`Ticket`] completes when the flush that covers it does.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use mailring::buf::AlignedBuf;

use crate::id::StreamId;
use crate::log::{self, Loc, Record};
use crate::stream::{Fields, Stream};

pub mod reader;
mod recover;
pub mod retention;

use self::reader::SegmentSource;
pub(crate) use self::recover::mark_write_failed as mark_write_failed_now;
pub use self::recover::{home_log, recover, snapshot_of, Recovered, RecoveredStream};
use self::retention::{Need, Retention};

/// When a write is flushed to disk, with Redis's `appendfsync` meanings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fsync {
    /// Every write's reply waits for the `fdatasync` that covers it.
    #[default]
    Always,
    /// Writes are flushed once a second; replies wait only for the write.
    EverySec,
    /// The OS flushes when it likes; replies wait only for the write.
    No,
}

impl Fsync {
    /// Parses `always`, `everysec` or `no`.
    pub fn parse(s: &str) -> Option<Fsync> {
        match s.to_ascii_lowercase().as_str() {
            "always" => Some(Fsync::Always),
            "everysec" => Some(Fsync::EverySec),
            "no" => Some(Fsync::No),
            _ => None,
        }
    }

    /// The setting's name.
    pub fn name(self) -> &'static str {
        match self {
            Fsync::Always => "always",
            Fsync::EverySec => "everysec",
            Fsync::No => "no",
        }
    }
}

/// A stream whose live entries take fewer bytes than this (with segments
/// of `segment_bytes`) rewrites them at the head of its log rather than
/// hold old segments.
pub fn small_stream_bytes(segment_bytes: u64) -> u64 {
    segment_bytes.max(4096) / 8
}

/// The default of [`StoreConfig::stream_cache_bytes`].
pub const DEFAULT_STREAM_CACHE: u64 = 16 << 20;

/// The largest segment size (offsets in a segment fit 32 bits).
pub const MAX_SEGMENT_BYTES: u64 = 1 << 31;

/// Where and how the broker stores its logs.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// The data directory.
    pub dir: PathBuf,
    /// The flush policy.
    pub fsync: Fsync,
    /// A segment is rolled once it holds this many bytes.
    pub segment_bytes: u64,
    /// Under `always`: zero-fill each segment ahead of the writes, in
    /// flushed chunks, so a durable append overwrites initialized blocks
    /// instead of allocating (measured: `benches/examples/prealloc.rs`).
    /// Ignored under `everysec` and `no`, whose writes go to the page cache
    /// and are flushed at most once a second: there a zero-fill saves
    /// nothing and takes CPU time from the shard
    /// (`benches/results/broker-prealloc-everysec-2026-11-29.txt`).
    pub preallocate: bool,
    /// Under `always`, with `preallocate`: write segments with `O_DIRECT`,
    /// each batch rewriting the 4 KiB blocks it touches from an aligned
    /// buffer and made durable as [`StoreConfig::always_flush`] says. The
    /// kernel then issues the write from the shard's own thread instead of
    /// handing it to an io-wq worker (measured:
    /// `benches/examples/prealloc.rs`). Falls back to buffered `O_DSYNC`
    /// writes, with a message, where the filesystem refuses it.
    pub direct_io: bool,
    /// Under `always`, with direct writes: how each batch is made durable
    /// (default [`AlwaysFlush::Adaptive`]).
    pub always_flush: AlwaysFlush,
    /// The alignment of direct writes: their memory, offset and length
    /// are multiples of it. 4 KiB covers every common logical block size;
    /// tests set a smaller one to make the filesystem refuse direct writes.
    pub direct_block: u64,
    /// Bytes of its newest entries each stream keeps in memory; older
    /// entries are read back from the log when a command needs them.
    pub stream_cache_bytes: u64,
    /// The largest record the log writes, in bytes (a transaction's
    /// changes to one stream are one record): a larger change is refused
    /// with an error and nothing of it is kept. Between 4 KiB and
    /// [`log::MAX_RECORD`] (1 GiB, what recovery reads). The broker's own
    /// records count too: a stream whose snapshot (its groups' pending
    /// entries) is larger keeps its old segments.
    pub max_record_bytes: u64,
    /// At start, cut a segment that is not its log's last at a bad record
    /// (losing what follows it there) instead of refusing to start: for
    /// a disk that damaged flushed data (the `--repair-log` flag). A torn or
    /// corrupt tail of a log's last segment, what a crash leaves, is cut
    /// either way. Every cut tail that holds more than zeros is kept in
    /// the data directory's `salvage/` first.
    pub repair_log: bool,
    /// Crash tests only: a gate every flush waits on.
    pub sync_gate: Option<SyncGate>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            dir: PathBuf::from("mailring-data"),
            fsync: Fsync::Always,
            segment_bytes: 64 << 20,
            preallocate: true,
            direct_io: true,
            always_flush: AlwaysFlush::Adaptive,
            direct_block: DIRECT_BLOCK,
            stream_cache_bytes: DEFAULT_STREAM_CACHE,
            max_record_bytes: log::MAX_RECORD as u64,
            repair_log: false,
            sync_gate: None,
        }
    }
}

/// How a batch of direct writes under `appendfsync always` is made
/// durable before its replies.
///
/// Where the disk has a volatile cache and no FUA (most virtual disks and
/// many SSDs), both ways take a write and a cache flush; they differ in
/// where the flush runs. On the development VM (disk interrupts on CPU 1,
/// the shard pinned to CPU 0, `redis-benchmark` on CPU 1) a write-through
/// answered one client in 0.14 ms against 0.18 ms, and 50 clients at
/// queue depth 1 at 0.87× redis-server's rate against 1.19× (`benches/
/// results/broker-always-flush-2026-11-29.txt`, section 3; the adaptive
/// way, section 3b, took the quicker one's rate on both).
///
/// Only direct writes go one way or the other: under `everysec` and `no`,
/// and where segments are written through the page cache
/// ([`StoreConfig::direct_io`] off or refused, or no
/// [`StoreConfig::preallocate`]), the setting has no effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AlwaysFlush {
    /// Times both ways as the batches go and uses the one whose flushes
    /// finished sooner lately, trying the other for [`ADAPTIVE_TRY_LEN`]
    /// batches in a row: first after 16 batches; after each try the other
    /// way loses, the wait doubles from [`ADAPTIVE_TRY_EVERY`] up to
    /// [`ADAPTIVE_TRY_MAX`], and after a change of way it is
    /// `ADAPTIVE_TRY_EVERY` again (the default).
    #[default]
    Adaptive,
    /// One write with `RWF_DSYNC`: issued from the shard, and where a
    /// cache flush is needed, the kernel runs it from a worker on the CPU
    /// that took the write's completion interrupt. Quickest while that CPU
    /// has time to spare.
    WriteThrough,
    /// A write, then `fdatasync` of the blocks it wrote on an io-wq worker
    /// of the shard's own (which runs where the shard may run): each batch
    /// costs the shard's CPU a wake-up more, but no other CPU's time.
    WriteThenSync,
}

impl AlwaysFlush {
    /// The setting's name, as the flag takes it.
    pub fn name(self) -> &'static str {
        match self {
            AlwaysFlush::Adaptive => "adaptive",
            AlwaysFlush::WriteThrough => "write-through",
            AlwaysFlush::WriteThenSync => "write-then-sync",
        }
    }

    /// Parses `adaptive`, `write-through` or `write-then-sync`.
    pub fn parse(s: &str) -> Option<AlwaysFlush> {
        match s {
            "adaptive" => Some(AlwaysFlush::Adaptive),
            "write-through" => Some(AlwaysFlush::WriteThrough),
            "write-then-sync" => Some(AlwaysFlush::WriteThenSync),
            _ => None,
        }
    }
}

/// Under [`AlwaysFlush::Adaptive`]: after a change of way, the other way
/// is tried after this many batches; each try it loses doubles the wait,
/// up to [`ADAPTIVE_TRY_MAX`].
pub const ADAPTIVE_TRY_EVERY: u32 = 128;

/// The most batches between two tries of the way not in use.
pub const ADAPTIVE_TRY_MAX: u32 = 4096;

/// Under [`AlwaysFlush::Adaptive`]: a try of the other way is this many
/// batches in a row.
pub const ADAPTIVE_TRY_LEN: u32 = 4;

/// A fresh log tries the other way after this many batches.
const ADAPTIVE_FIRST_TRY: u32 = 16;

/// Which way a batch is made durable (the two of [`AlwaysFlush`] that are
/// not `Adaptive`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FlushWay {
    WriteThrough,
    WriteThenSync,
}

impl FlushWay {
    fn index(self) -> usize {
        match self {
            FlushWay::WriteThrough => 0,
            FlushWay::WriteThenSync => 1,
        }
    }

    fn other(self) -> FlushWay {
        match self {
            FlushWay::WriteThrough => FlushWay::WriteThenSync,
            FlushWay::WriteThenSync => FlushWay::WriteThrough,
        }
    }
}

/// What a log's durable writes under `always` did, for `INFO mailring`:
/// read from any thread while the log's shard updates it.
#[derive(Debug, Default)]
pub struct FlushStats {
    /// Batches made durable each way (by [`FlushWay::index`] order:
    /// write-through, then write-then-sync).
    batches: [AtomicU64; 2],
    /// The chooser's current time of each way, in nanoseconds (0: not
    /// timed yet).
    average_ns: [AtomicU64; 2],
    /// Tries of the way not in use, and changes of way.
    tries: AtomicU64,
    changes: AtomicU64,
    /// The way in use: 0 write-through, 1 write-then-sync.
    current: AtomicU64,
    /// Whether the log writes its segment directly now (a filesystem
    /// that refuses `O_DIRECT` turns this off: its writes are then
    /// buffered `O_DSYNC` ones and go neither way).
    direct: AtomicBool,
}

impl FlushStats {
    /// Whether the log's writes go one of the two ways now.
    pub fn direct(&self) -> bool {
        self.direct.load(Ordering::Relaxed)
    }

    /// One `INFO` field list: `way=...,batches_write_through=N,...`.
    pub fn info_fields(&self) -> String {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "way={},batches_write_through={},batches_write_then_sync={},write_through_usec={:.1},write_then_sync_usec={:.1},tries={},changes={}",
            if get(&self.current) == 0 {
                "write-through"
            } else {
                "write-then-sync"
            },
            get(&self.batches[0]),
            get(&self.batches[1]),
            get(&self.average_ns[0]) as f64 / 1000.0,
            get(&self.average_ns[1]) as f64 / 1000.0,
            get(&self.tries),
            get(&self.changes),
        )
    }
}

/// Picks the way of each batch under [`AlwaysFlush::Adaptive`], by each
/// way's time from a write's submission to its batch being durable. With
/// one flush in flight at a time, that time is what both the replies'
/// latency and the batches' rate follow.
///
/// The way in use is timed on every batch (a moving average). Now and then
/// the other way takes [`ADAPTIVE_TRY_LEN`] batches in a row, and their
/// mean becomes its time: a run of batches, because the first one's size
/// was set by the other way's pace. The chooser changes ways when the
/// other one was quicker by more than an eighth, so noise alone does not
/// flip it. Tries cost more than their own batches' time (a slow batch
/// slows the ones after it: the in-process load generator lost about 6%
/// trying every 128 batches, and about 2% every 1,024), so while the other
/// way keeps losing they come half as often each time, down to one in
/// [`ADAPTIVE_TRY_MAX`] batches (under a second at a few thousand batches a
/// second), and after a change of way, every [`ADAPTIVE_TRY_EVERY`] again.
#[derive(Debug)]
struct FlushChooser {
    setting: AlwaysFlush,
    stats: Arc<FlushStats>,
    /// The way in use.
    current: FlushWay,
    /// Nanoseconds: the way in use, then the other; 0 until timed.
    current_ns: u64,
    other_ns: u64,
    /// Batches of the way in use since the last try of the other, and how
    /// many the next try waits for.
    since_try: u32,
    try_every: u32,
    /// While trying the other way: batches done, and their total time.
    trying: Option<(u32, u64)>,
}

impl FlushChooser {
    fn new(setting: AlwaysFlush, stats: Arc<FlushStats>) -> FlushChooser {
        let current = match setting {
            AlwaysFlush::WriteThenSync => FlushWay::WriteThenSync,
            AlwaysFlush::WriteThrough | AlwaysFlush::Adaptive => FlushWay::WriteThrough,
        };
        stats
            .current
            .store(current.index() as u64, Ordering::Relaxed);
        FlushChooser {
            setting,
            stats,
            current,
            current_ns: 0,
            other_ns: 0,
            // The first try comes early: a fresh broker settles quickly.
            since_try: ADAPTIVE_TRY_EVERY - ADAPTIVE_FIRST_TRY,
            try_every: ADAPTIVE_TRY_EVERY,
            trying: None,
        }
    }

    fn pick(&mut self) -> FlushWay {
        match self.setting {
            AlwaysFlush::WriteThrough => FlushWay::WriteThrough,
            AlwaysFlush::WriteThenSync => FlushWay::WriteThenSync,
            AlwaysFlush::Adaptive => {
                if self.trying.is_none() && self.since_try >= self.try_every {
                    self.trying = Some((0, 0));
                }
                if self.trying.is_some() {
                    self.current.other()
                } else {
                    self.current
                }
            }
        }
    }

    /// Takes the time of a batch that went `way` (what [`Self::pick`]
    /// gave). One slow flush (the disk's hiccup) moves the average by at
    /// most an eighth of it, and counts in a try as twice the average.
    /// A fixed setting is timed the same way (for `INFO`), and never
    /// tries the other.
    fn record(&mut self, way: FlushWay, took: Duration) {
        self.stats.batches[way.index()].fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX).max(1);
        let capped = if self.current_ns == 0 {
            ns
        } else {
            ns.min(self.current_ns.saturating_mul(2))
        };
        if way == self.current {
            // A fixed setting never resets it: it must not overflow.
            self.since_try = self.since_try.saturating_add(1);
            self.current_ns = if self.current_ns == 0 {
                ns
            } else {
                self.current_ns - self.current_ns / 8 + capped / 8
            };
            self.stats.average_ns[way.index()].store(self.current_ns, Ordering::Relaxed);
            return;
        }
        let Some((done, total)) = self.trying.as_mut() else {
            return;
        };
        *done += 1;
        *total = total.saturating_add(capped);
        if *done < ADAPTIVE_TRY_LEN {
            return;
        }
        self.other_ns = *total / u64::from(*done);
        self.trying = None;
        self.since_try = 0;
        self.stats.tries.fetch_add(1, Ordering::Relaxed);
        self.stats.average_ns[way.index()].store(self.other_ns, Ordering::Relaxed);
        // The way in use was timed on at least ADAPTIVE_FIRST_TRY batches
        // before the first try: `current_ns` is not 0 here.
        if self.other_ns < self.current_ns - self.current_ns / 8 {
            self.current = way;
            std::mem::swap(&mut self.current_ns, &mut self.other_ns);
            self.try_every = ADAPTIVE_TRY_EVERY;
            self.stats.changes.fetch_add(1, Ordering::Relaxed);
            self.stats
                .current
                .store(way.index() as u64, Ordering::Relaxed);
        } else {
            self.try_every = (self.try_every * 2).min(ADAPTIVE_TRY_MAX);
        }
    }
}

/// The least [`StoreConfig::max_record_bytes`] taken.
const MIN_MAX_RECORD: u64 = 4096;

/// A failure of the storage layer; writes are refused from then on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StorageError {
    /// A write or flush failed.
    #[error("writing the commit log failed: {0}")]
    Write(String),
    /// The log was closed (shutdown) before the flush.
    #[error("the commit log is closed")]
    Closed,
    /// A record larger than recovery accepts (it would read as corrupt);
    /// nothing was written.
    #[error("a {0}-byte record is larger than the log takes")]
    TooLarge(usize),
    /// A transaction whose arguments alone are over the log's record
    /// limit; refused before it ran.
    #[error("a transaction with {0} bytes of arguments is larger than the log takes")]
    TransactionTooLarge(u64),
}

/// The reply-side watermark of one log: appends up to `done` are flushed
/// (as far as the policy asks before a reply).
///
/// `done` and `failed` are read without the lock: a ticket whose append
/// is flushed, and an append to a log that has not failed, take no lock.
#[derive(Debug, Default)]
struct Marks {
    done: AtomicU64,
    failed: AtomicBool,
    /// Under `always`: a read of what the log failed to flush fails too
    /// (its reply would show a change that is not on disk, and never will
    /// be: Redis exits there). Under `everysec` and `no` reads go on, as
    /// Redis's do after a failed flush (their replies never waited for
    /// one).
    reads_fail: bool,
    state: Mutex<MarksState>,
}

#[derive(Debug, Default)]
struct MarksState {
    failed: Option<StorageError>,
    /// Tickets waiting, by lsn (ascending: appends are mostly polled in
    /// order, and those flushed leave from the front).
    waiters: VecDeque<(u64, Waker)>,
}

impl Marks {
    fn lock(&self) -> std::sync::MutexGuard<'_, MarksState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn advance(&self, to: u64) {
        // Published before the waiters are looked at: a ticket that checks
        // `done` under the lock after this sees it, and one that checked
        // before has its waker in the list by the time the lock is ours.
        self.done.fetch_max(to, Ordering::Release);
        let ready: Vec<Waker> = {
            let mut s = self.lock();
            let done = self.done.load(Ordering::Acquire);
            let mut ready = Vec::new();
            while s.waiters.front().is_some_and(|(lsn, _)| *lsn <= done) {
                ready.push(s.waiters.pop_front().expect("checked").1);
            }
            ready
        };
        ready.into_iter().for_each(Waker::wake);
    }

    fn fail(&self, e: StorageError) {
        let waiters = {
            let mut s = self.lock();
            s.failed.get_or_insert(e);
            self.failed.store(true, Ordering::Release);
            std::mem::take(&mut s.waiters)
        };
        waiters.into_iter().for_each(|(_, w)| w.wake());
    }

    /// The error the log failed with, if it did.
    fn failed(&self) -> Option<StorageError> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        self.lock().failed.clone()
    }
}

/// Completes when the append it was given for is flushed (per the
/// policy). `Send`: a session on another shard may await it.
#[must_use = "a ticket says when the write is durable"]
#[derive(Clone)]
pub struct Ticket {
    marks: Arc<Marks>,
    lsn: u64,
    /// A read's ticket: under `everysec` and `no` it completes with `Ok`
    /// when the log failed too (what the read shows is in memory; reads
    /// go on on a failed log); under `always` with the log's error.
    read: bool,
}

impl Ticket {
    /// The number of the append it waits for.
    pub fn lsn(&self) -> u64 {
        self.lsn
    }

    /// A read's ticket for the same append: it completes once the append
    /// is flushed, or the log failed.
    pub(crate) fn for_read(&self) -> Ticket {
        Ticket {
            marks: self.marks.clone(),
            lsn: self.lsn,
            read: true,
        }
    }

    /// Whether its append is flushed.
    pub(crate) fn is_flushed(&self) -> bool {
        self.marks.done.load(Ordering::Acquire) >= self.lsn
    }

    /// Whether `other` waits on the same log.
    pub(crate) fn same_log(&self, other: &Ticket) -> bool {
        Arc::ptr_eq(&self.marks, &other.marks)
    }
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket").field("lsn", &self.lsn).finish()
    }
}

impl Future for Ticket {
    type Output = Result<(), StorageError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let marks = &self.marks;
        if marks.done.load(Ordering::Acquire) >= self.lsn {
            return Poll::Ready(Ok(()));
        }
        let mut s = marks.lock();
        if marks.done.load(Ordering::Acquire) >= self.lsn {
            return Poll::Ready(Ok(()));
        }
        if let Some(e) = &s.failed {
            return Poll::Ready(if self.read && !marks.reads_fail {
                Ok(())
            } else {
                Err(e.clone())
            });
        }
        let lsn = self.lsn;
        // Polled again by the same task: its waker is there already. Two
        // tickets may share an lsn (a read-back waits for the last append),
        // so another task's waker is added beside, not written over.
        let mut at = s.waiters.partition_point(|(l, _)| *l < lsn);
        while s.waiters.get(at).is_some_and(|(l, _)| *l == lsn) {
            if s.waiters[at].1.will_wake(cx.waker()) {
                return Poll::Pending;
            }
            at += 1;
        }
        s.waiters.insert(at, (lsn, cx.waker().clone()));
        Poll::Pending
    }
}

/// The durable length of each segment file, for crash tests: what a power
/// loss now would leave (bytes covered by a completed `fdatasync`, in files
/// whose directory entry was flushed).
#[derive(Debug, Default, Clone)]
pub struct DurableFiles {
    files: Arc<Mutex<HashMap<PathBuf, u64>>>,
    written: Arc<Mutex<HashMap<PathBuf, u64>>>,
}

impl DurableFiles {
    fn set(&self, path: &Path, len: u64) {
        self.files
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(path.to_path_buf(), len);
    }

    fn set_written(&self, path: &Path, len: u64) {
        self.written
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(path.to_path_buf(), len);
    }

    fn forget(&self, path: &Path) {
        self.files
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(path);
        self.written
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(path);
    }

    /// Every segment this process wrote, with the length of the records
    /// written to it (durable or not; a preallocated file is longer).
    pub fn written(&self) -> HashMap<PathBuf, u64> {
        self.written
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Every segment this process wrote, with its durable length.
    pub fn snapshot(&self) -> HashMap<PathBuf, u64> {
        self.files.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// [`written`](Self::written) and [`snapshot`](Self::snapshot) taken
    /// at one moment: a segment is recorded written before durable and
    /// forgotten as durable first, so no segment is in the second without
    /// being in the first (two separate calls can see a segment made or
    /// removed between them).
    pub fn written_and_durable(&self) -> (HashMap<PathBuf, u64>, HashMap<PathBuf, u64>) {
        let files = self.files.lock().unwrap_or_else(|p| p.into_inner());
        let written = self.written.lock().unwrap_or_else(|p| p.into_inner());
        (written.clone(), files.clone())
    }
}

/// What is waiting to be written. Each append is given its segment as it
/// is made (so its stream knows where its record is); the writer rolls
/// segments where the appends say.
#[derive(Debug, Default)]
struct Pending {
    /// Appends to `segment`, not yet taken by the writer.
    buf: BytesMut,
    /// The number of the last append in `buf` (0: none yet).
    last: u64,
    /// The segment appends go to now.
    segment: u32,
    /// Bytes given out in `segment` (its header included).
    fill: u64,
    /// Appends to earlier segments, not yet taken: (segment, bytes, the
    /// number of the last append).
    sealed: VecDeque<(u32, Bytes, u64)>,
    /// Appends ever made.
    next: u64,
    closed: bool,
}

/// One shard's log writer. Lives on its shard (`Rc`); stream actors there
/// append to it.
pub struct ShardLog {
    log_no: u16,
    dir: PathBuf,
    fsync: Fsync,
    segment_bytes: u64,
    /// The largest record body taken ([`StoreConfig::max_record_bytes`]).
    max_record: u64,
    pending: RefCell<Pending>,
    flusher: Cell<Option<Waker>>,
    marks: Arc<Marks>,
    durable: DurableFiles,
    gate: Option<SyncGate>,
    preallocate: bool,
    /// Whether new segments are opened `O_DIRECT` (see
    /// [`StoreConfig::direct_io`]); cleared when the filesystem refuses it.
    direct_io: Cell<bool>,
    /// [`StoreConfig::always_flush`].
    always_flush: AlwaysFlush,
    /// What its durable writes did (shared with `INFO`).
    flush_stats: Arc<FlushStats>,
    /// [`StoreConfig::direct_block`], a power of two.
    block: u64,
    /// The segments on disk and what each stream needs of them.
    retention: RefCell<Retention>,
    /// Asks streams whose old history holds segments for a snapshot.
    on_lagging: RefCell<Option<LaggingHook>>,
    /// Everything before this place is written (readable back).
    written: Cell<Loc>,
    /// Segment files open for reading entries back through the ring.
    readers: RefCell<HashMap<u32, Rc<mailring::fs::File>>>,
    /// The same files for blocking reads (shared with the streams).
    source: Arc<SegmentSource>,
}

/// What a log calls with the streams that should move up.
type LaggingHook = Box<dyn Fn(Vec<Bytes>)>;

/// Bytes zero-filled ahead of the writes at a time (a multiple of any
/// direct-write block).
const ZERO_CHUNK: u64 = 4 << 20;

/// Under `everysec`, a segment is flushed early once it is within this
/// fraction of its size from its end (see [`ShardLog::flush_behind`]).
const PRESYNC_FRACTION: u64 = 16;

/// The default unit of an `O_DIRECT` write ([`StoreConfig::direct_block`]).
pub const DIRECT_BLOCK: u64 = 4096;

/// A direct-write buffer grown past this by a large batch is replaced by
/// a small one after the write.
const MAX_KEPT_TAIL_BUF: usize = 1 << 20;

/// Under `everysec` and `no`, batches up to this size are written with a
/// plain `pwrite` on the shard (a copy into the page cache); larger ones go
/// through the ring so the shard keeps serving while they are copied.
const INLINE_WRITE_MAX: usize = 256 << 10;

impl fmt::Debug for ShardLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShardLog")
            .field("log_no", &self.log_no)
            .field("dir", &self.dir)
            .field("fsync", &self.fsync)
            .finish_non_exhaustive()
    }
}

/// A log as recovery left it.
#[derive(Debug, Default)]
pub struct LogStart {
    /// Its segments on disk.
    pub segments: Vec<u32>,
    /// Each stream's need of them.
    pub needs: Vec<(Bytes, Need)>,
    /// Deleted streams whose records are still in them, with the
    /// operation number of each one's last record.
    pub deleted: Vec<(Bytes, u64)>,
}

impl ShardLog {
    /// A writer for log `log_no` under `gen_dir` (the generation's
    /// directory), starting a new segment after those in `start`, telling
    /// what its durable writes do in `flush_stats`. Its flusher must be
    /// run ([`ShardLog::run`]).
    pub fn new(
        gen_dir: &Path,
        log_no: u16,
        config: &StoreConfig,
        durable: DurableFiles,
        start: LogStart,
        flush_stats: Arc<FlushStats>,
    ) -> Rc<ShardLog> {
        let first = start.segments.iter().max().map_or(1, |s| s + 1);
        let dir = gen_dir.join(log::log_dir_name(log_no));
        // The segments from before the start are whole and flushed
        // (recovery flushed what it read, a rewrite what it wrote): a
        // power-loss image keeps them.
        for segment in &start.segments {
            let path = dir.join(log::segment_file_name(*segment));
            if let Ok(meta) = std::fs::metadata(&path) {
                durable.set_written(&path, meta.len());
                durable.set(&path, meta.len());
            }
        }
        let pending = Pending {
            segment: first,
            fill: log::HEADER_LEN as u64,
            ..Pending::default()
        };
        Rc::new(ShardLog {
            log_no,
            source: SegmentSource::new(dir.clone()),
            dir,
            fsync: config.fsync,
            segment_bytes: config.segment_bytes.clamp(4096, MAX_SEGMENT_BYTES),
            max_record: config
                .max_record_bytes
                .clamp(MIN_MAX_RECORD, log::MAX_RECORD as u64),
            pending: RefCell::new(pending),
            flusher: Cell::new(None),
            marks: Arc::new(Marks {
                reads_fail: config.fsync == Fsync::Always,
                ..Marks::default()
            }),
            durable,
            gate: config.sync_gate.clone(),
            // Under `everysec` and `no` the writes go to the page cache and
            // a flush comes at most once a second: zero-filling ahead saves
            // nothing there, and its writes compete with the shard for its
            // core (a p99 about twice the p50 of pipelined `XADD`s).
            preallocate: config.preallocate && config.fsync == Fsync::Always,
            direct_io: Cell::new(
                config.direct_io && config.preallocate && config.fsync == Fsync::Always,
            ),
            always_flush: config.always_flush,
            flush_stats,
            block: config.direct_block.clamp(1, ZERO_CHUNK).next_power_of_two(),
            retention: RefCell::new(Retention::new(start.segments, start.needs, start.deleted)),
            on_lagging: RefCell::new(None),
            written: Cell::new(Loc::new(first, log::HEADER_LEN as u64)),
            readers: RefCell::new(HashMap::new()),
        })
    }

    /// Where entries are read back from with blocking reads.
    pub fn source(&self) -> &Arc<SegmentSource> {
        &self.source
    }

    /// Everything before this place is written: a record there can be
    /// read back.
    pub fn written(&self) -> Loc {
        self.written.get()
    }

    /// Reads entries back through the shard's ring: each `(id, loc)` is
    /// an entry and the record that holds it, written already (see
    /// [`ShardLog::written`]). Records near each other share a read; the
    /// reads run at once.
    ///
    /// # Errors
    ///
    /// A read failed, or a record is not there whole and valid.
    pub async fn fetch(&self, wanted: &[(StreamId, Loc)]) -> io::Result<Vec<(StreamId, Fields)>> {
        let clusters = reader::clusters(wanted.iter().map(|w| w.1));
        let mut reads = Vec::with_capacity(clusters.len());
        for cluster in clusters {
            let file = self.reader(cluster.segment).await?;
            let (start, len) = (cluster.start, cluster.len as usize);
            let read = mailring::spawn_local(async move { read_at(&file, start, len).await });
            reads.push((cluster, read));
        }
        let mut decoded = reader::Decoded::new();
        let mut short = Vec::new();
        for (cluster, read) in reads {
            let buf = read
                .await
                .map_err(|e| io::Error::other(format!("reading entries back: {e}")))??;
            short.extend(reader::decode_cluster(
                &self.dir,
                &cluster,
                &buf,
                &mut decoded,
            )?);
        }
        for (loc, mut need) in short {
            let file = self.reader(loc.segment).await?;
            loop {
                let buf = read_at(&file, loc.offset, need).await?;
                match reader::reread_step(&self.dir, loc, need, &buf, &mut decoded)? {
                    Some(more) => need = more,
                    None => break,
                }
            }
        }
        reader::pick(&self.dir, wanted, &decoded)
    }

    /// Segment `segment`'s file, opened for reading.
    async fn reader(&self, segment: u32) -> io::Result<Rc<mailring::fs::File>> {
        if let Some(f) = self.readers.borrow().get(&segment) {
            return Ok(f.clone());
        }
        let path = self.dir.join(log::segment_file_name(segment));
        let file = Rc::new(mailring::fs::File::open(&path).await?);
        let mut readers = self.readers.borrow_mut();
        if readers.len() >= reader::OPEN_FILES && !readers.contains_key(&segment) {
            if let Some(&any) = readers.keys().next() {
                readers.remove(&any);
            }
        }
        Ok(readers.entry(segment).or_insert(file).clone())
    }

    /// The size at which segments roll.
    pub fn segment_bytes(&self) -> u64 {
        self.segment_bytes
    }

    /// Appends `record`: the ticket completes once it is flushed; the
    /// place is where it goes.
    ///
    /// # Errors
    ///
    /// The log failed earlier, or is closed.
    pub fn append(&self, record: &Record) -> Result<(Ticket, Loc), StorageError> {
        self.append_encoded(|dst| record.encode(dst))
    }

    /// [`ShardLog::append`] for a record that `encode` writes (framed, as
    /// [`Record::encode`] does) from borrowed parts.
    ///
    /// # Errors
    ///
    /// As [`ShardLog::append`].
    pub fn append_encoded(
        &self,
        encode: impl FnOnce(&mut BytesMut),
    ) -> Result<(Ticket, Loc), StorageError> {
        if let Some(e) = self.marks.failed() {
            return Err(e);
        }
        let mut guard = self.pending.borrow_mut();
        let p = &mut *guard;
        if p.closed {
            return Err(StorageError::Closed);
        }
        let at = p.buf.len();
        encode_or_roll_back(&mut p.buf, encode);
        let len = (p.buf.len() - at) as u64;
        if !log::record_fits(len as usize, self.max_record as usize) {
            p.buf.truncate(at);
            return Err(StorageError::TooLarge(len as usize));
        }
        if p.fill > log::HEADER_LEN as u64 && p.fill + len > self.segment_bytes {
            // The segment is full: this record starts the next one.
            let rest = p.buf.split_off(at);
            let full = std::mem::replace(&mut p.buf, rest).freeze();
            if !full.is_empty() {
                p.sealed.push_back((p.segment, full, p.last));
            }
            p.segment += 1;
            p.fill = log::HEADER_LEN as u64;
        }
        let loc = Loc::new(p.segment, p.fill);
        p.fill += len;
        p.next += 1;
        p.last = p.next;
        let lsn = p.next;
        drop(guard);
        if let Some(w) = self.flusher.take() {
            w.wake();
        }
        Ok((
            Ticket {
                marks: self.marks.clone(),
                lsn,
                read: false,
            },
            loc,
        ))
    }

    /// Appends a transaction's records as one group (see
    /// [`log::encode_group`]): in one segment, one ticket for all, each
    /// record's place in order. After a crash recovery finds all of them
    /// or none.
    ///
    /// # Errors
    ///
    /// As [`ShardLog::append`]; [`StorageError::TooLarge`] when the group
    /// is over the record limit (it counts as one record).
    pub fn append_group(&self, records: &[Record]) -> Result<(Ticket, Vec<Loc>), StorageError> {
        let mut offsets = Vec::new();
        let (ticket, first) = self.append_encoded(|dst| {
            offsets = log::encode_group(records, dst);
        })?;
        let locs = offsets
            .into_iter()
            .map(|o| Loc::new(first.segment, u64::from(first.offset) + o))
            .collect();
        Ok((ticket, locs))
    }

    /// Stream `name` needs segments from `need` on (`None`: none), as a
    /// record in segment `by` says (see [`retention`]).
    pub fn set_need(&self, name: &Bytes, need: Option<Need>, by: u32, op_no: u64) {
        self.retention.borrow_mut().set(name, need, by, op_no);
    }

    /// Stream `name` was made by its record `op_no` in segment `by` (see
    /// [`retention::Retention::making`]).
    pub fn note_making(&self, name: &Bytes, by: u32, op_no: u64) {
        self.retention.borrow_mut().making(name, by, op_no);
    }

    /// Why the log takes no appends now (it failed, or was closed), if so.
    pub fn refusal(&self) -> Option<StorageError> {
        if let Some(e) = self.marks.failed() {
            return Some(e);
        }
        self.pending.borrow().closed.then_some(StorageError::Closed)
    }

    /// The largest record body it takes ([`StoreConfig::max_record_bytes`]).
    pub fn max_record(&self) -> u64 {
        self.max_record
    }

    /// For a stream this log knows as deleted: the operation number of its
    /// last record (see [`retention::Retention::gone_op_no`]).
    pub fn gone_op_no(&self, name: &[u8]) -> Option<u64> {
        self.retention.borrow().gone_op_no(name)
    }

    /// What to call with the streams whose old history holds segments,
    /// so they write a snapshot.
    pub fn on_lagging(&self, f: impl Fn(Vec<Bytes>) + 'static) {
        *self.on_lagging.borrow_mut() = Some(Box::new(f));
    }

    /// The segment appends go to now.
    pub fn current_segment(&self) -> u32 {
        self.pending.borrow().segment
    }

    /// Whether stream `name` has records in this log.
    pub fn knows(&self, name: &[u8]) -> bool {
        self.retention.borrow().knows(name)
    }

    /// Rebuilds stream `name` from this log's segments (for an actor
    /// restarted after a panic): waits until everything appended so far
    /// is written, then reads every segment on disk and replays the
    /// stream's records, keeping `cache_bytes` of its newest entries in
    /// memory.
    ///
    /// # Errors
    ///
    /// The log failed, or a segment could not be read.
    pub async fn read_back(&self, name: &[u8], cache_bytes: u64) -> io::Result<RecoveredStream> {
        let written = Ticket {
            marks: self.marks.clone(),
            lsn: self.pending.borrow().next,
            read: false,
        };
        written.await.map_err(io::Error::other)?;
        let source = &self.source;
        replay_segments(
            name,
            self.log_no,
            &self.dir,
            || self.retention.borrow().segment_list(),
            |path| async move { mailring::fs::read(&path).await },
            |s| {
                if !s.has_source() {
                    s.set_source(source.clone());
                }
                if s.cached_bytes() > cache_bytes {
                    s.settle(cache_bytes, Loc::MAX);
                }
            },
        )
        .await
    }

    /// A ticket that is complete already (for a change that another
    /// record's ticket covers).
    pub fn no_wait(&self) -> Ticket {
        Ticket {
            marks: self.marks.clone(),
            lsn: 0,
            read: false,
        }
    }

    /// For a read of what appends up to `lsn` changed: a ticket that
    /// completes once they are flushed (per the policy), or `None` when
    /// they are. Redis writes no reply before the flush that covers the
    /// writes it shows. On a failed log it completes with the log's error
    /// under `always` (what it shows will never be flushed), with `Ok`
    /// under the other policies (reads go on).
    pub fn read_ticket(&self, lsn: u64) -> Option<Ticket> {
        (self.marks.done.load(Ordering::Acquire) < lsn).then(|| Ticket {
            marks: self.marks.clone(),
            lsn,
            read: true,
        })
    }

    /// The number of the last append so far.
    pub fn last_lsn(&self) -> u64 {
        self.pending.borrow().next
    }

    /// Stops taking appends; [`ShardLog::run`] returns once what was
    /// appended is flushed.
    pub fn close(&self) {
        self.pending.borrow_mut().closed = true;
        if let Some(w) = self.flusher.take() {
            w.wake();
        }
    }

    /// The flusher: writes what was appended, in batches, and flushes per
    /// the policy; returns after [`ShardLog::close`] once drained.
    ///
    /// # Errors
    ///
    /// The first I/O error (the log is failed from then on).
    pub async fn run(self: Rc<Self>) -> io::Result<()> {
        let res = self.run_inner().await;
        if let Err(e) = &res {
            self.marks.fail(StorageError::Write(e.to_string()));
            mark_write_failed(&self.dir).await;
        }
        res
    }

    async fn run_inner(&self) -> io::Result<()> {
        if !self.dir.exists() {
            mailring::fs::create_dir_all(&self.dir).await?;
            sync_dir_async(self.dir.parent().expect("a log dir has a parent")).await?;
        }
        let first = self.pending.borrow().segment;
        let mut seg = self.create_segment(first).await?;
        let mut chooser = FlushChooser::new(self.always_flush, self.flush_stats.clone());
        loop {
            let batch = std::future::poll_fn(|cx| {
                let mut p = self.pending.borrow_mut();
                if let Some(sealed) = p.sealed.pop_front() {
                    return Poll::Ready(Some(sealed));
                }
                if !p.buf.is_empty() {
                    let last = p.last;
                    let segment = p.segment;
                    return Poll::Ready(Some((segment, p.buf.split().freeze(), last)));
                }
                if p.closed {
                    return Poll::Ready(None);
                }
                self.flusher.set(Some(cx.waker().clone()));
                Poll::Pending
            });
            let next = if self.fsync == Fsync::EverySec && seg.unsynced {
                let deadline = seg.last_sync + Duration::from_secs(1);
                mailring::time::timeout_at(deadline, batch).await.ok()
            } else {
                Some(batch.await)
            };
            let Some(next) = next else {
                // everysec: a second passed with unflushed writes (since
                // the last flush began; if that one is still running,
                // the disk is behind and the writer waits for it).
                self.flush_behind(&mut seg, true).await?;
                continue;
            };
            let Some((segment, bytes, lsn)) = next else {
                // Closing: flush whatever the policy, as Redis does at
                // shutdown.
                seg.unsynced = true;
                self.flush(&mut seg).await?;
                return Ok(());
            };
            if segment != seg.no {
                // The old segment is complete: flush it (whatever the
                // policy: what older segments held may go once it is)
                // before its successor takes appends.
                seg.unsynced = true;
                self.flush(&mut seg).await?;
                let completed = seg.no;
                seg = self.create_segment(segment).await?;
                self.written.set(Loc::new(segment, seg.pos));
                self.collect(completed, segment).await?;
            }
            let len = bytes.len() as u64;
            self.zero_ahead(&mut seg, len).await?;
            // Under `always` this write and what follows it are its flush: a
            // direct segment's write goes the chooser's way, a buffered
            // segment is `O_DSYNC`.
            let mut way = None;
            if self.fsync == Fsync::Always {
                if let Some(gate) = &self.gate {
                    gate.wait_open().await?;
                }
                if seg.tail.is_some() {
                    way = Some(chooser.pick());
                }
            }
            let started = way.map(|_| Instant::now());
            // The blocks this write covers (a direct write rewrites whole
            // blocks).
            let from = seg.pos / self.block * self.block;
            let to = (seg.pos + len).next_multiple_of(self.block);
            self.write_segment(&mut seg, bytes, way == Some(FlushWay::WriteThrough))
                .await?;
            if let (Some(way), Some(started)) = (way, started) {
                if way == FlushWay::WriteThenSync {
                    // Of this write's range only, as `RWF_DSYNC` does: a
                    // whole-file flush would also write back the blocks a
                    // zero-fill is dirtying ahead of the writes.
                    seg.file.sync_data_range(from, to - from).await?;
                }
                chooser.record(way, started.elapsed());
            }
            seg.pos += len;
            seg.unsynced = true;
            self.written.set(Loc::new(seg.no, seg.pos));
            self.durable.set_written(&seg.path, seg.pos);
            match self.fsync {
                Fsync::Always => {
                    self.durable.set(&seg.path, seg.pos);
                    seg.unsynced = false;
                }
                Fsync::EverySec => {
                    // Near its end, a segment is flushed early too: the
                    // flush when it is complete, which the writes wait
                    // for, then has little left to write.
                    let near_end =
                        seg.pos + self.segment_bytes / PRESYNC_FRACTION > self.segment_bytes;
                    if (seg.last_sync.elapsed() >= Duration::from_secs(1)
                        || (near_end && !seg.presynced))
                        && self.flush_behind(&mut seg, false).await?
                    {
                        seg.presynced |= near_end;
                    }
                }
                // The OS flushes; nothing is waited for.
                Fsync::No => seg.unsynced = false,
            }
            // A flush beside the writes failed meanwhile: nothing written
            // after it is answered as written.
            if let Some(e) = self.marks.failed() {
                return Err(io::Error::other(e.to_string()));
            }
            self.marks.advance(lsn);
        }
    }

    /// After segment `completed` was flushed and `current` made: removes
    /// the segments no stream needs, oldest first, flushing the directory
    /// after each (so a crash never leaves a gap with older ones back),
    /// and asks streams whose old history holds segments for a snapshot.
    async fn collect(&self, completed: u32, current: u32) -> io::Result<()> {
        let collected = self.retention.borrow_mut().collect(completed, current);
        for segment in collected.remove {
            let path = self.dir.join(log::segment_file_name(segment));
            match mailring::fs::remove_file(&path).await {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            sync_dir_async(&self.dir).await?;
            self.readers.borrow_mut().remove(&segment);
            self.source.forget(segment);
            self.retention.borrow_mut().removed(segment);
            self.durable.forget(&path);
        }
        if !collected.lagging.is_empty() {
            if let Some(f) = self.on_lagging.borrow().as_ref() {
                f(collected.lagging);
            }
        }
        Ok(())
    }

    /// Keeps zero-filled, flushed blocks ahead of the next write of `len`
    /// bytes: waits for the chunk being zeroed if the write reaches it,
    /// and starts the next chunk when the writes come near.
    async fn zero_ahead(&self, seg: &mut Segment, len: u64) -> io::Result<()> {
        if !self.preallocate {
            return Ok(());
        }
        // A direct write covers whole blocks.
        let end = if seg.tail.is_some() {
            (seg.pos + len).next_multiple_of(self.block)
        } else {
            seg.pos + len
        };
        if end > seg.zeroed {
            if let Some(task) = seg.zeroing.take() {
                seg.zeroed = task
                    .await
                    .map_err(|e| io::Error::other(format!("zero-filling a segment: {e}")))??;
            }
        }
        // What the write covers past the zero-filled part, it writes itself
        // (allocating); the next chunk starts after it, so a zero-fill never
        // touches a block a write is using (its own descriptor's page cache
        // would otherwise write stale bytes over a direct write's).
        seg.zeroed = seg.zeroed.max(end);
        if seg.zeroing.is_none()
            && seg.zeroed < self.segment_bytes
            && end + ZERO_CHUNK / 2 > seg.zeroed
        {
            let (from, to) = (
                seg.zeroed,
                (seg.zeroed + ZERO_CHUNK).min(self.segment_bytes),
            );
            let path = seg.path.clone();
            seg.zeroing = Some(mailring::spawn_local(async move {
                zero_fill(&path, from, to).await?;
                Ok(to)
            }));
        }
        Ok(())
    }

    /// Writes `bytes` at the end of `seg` (not moving `seg.pos`). A direct
    /// segment rewrites the block holding its tail: its earlier bytes
    /// (already written, and identical, so a torn write leaves each sector
    /// old or new with the same prefix) and then the new ones, padded with
    /// zeros to the block's end, as a data-synchronous write when `dsync`.
    async fn write_segment(&self, seg: &mut Segment, bytes: Bytes, dsync: bool) -> io::Result<()> {
        let Some(mut buf) = seg.tail.take() else {
            let flushing = seg.syncing.as_ref().is_some_and(|f| !f.is_finished());
            if self.fsync != Fsync::Always && bytes.len() <= INLINE_WRITE_MAX && !flushing {
                // Into the page cache, flushed later: a plain `pwrite` on
                // the shard costs less than the io-wq worker the ring would
                // hand this write to. Not while a flush of this file runs
                // beside the writes (`flush_behind`): where the device
                // wants stable pages, a write into the page being written
                // out waits for it, and the shard would wait with it. The
                // zero-fills of the blocks past it touch no page it writes.
                return seg.file.write_all_at_blocking(&bytes, seg.pos);
            }
            let (res, _) = seg.file.write_all_at(bytes, seg.pos).await;
            return res;
        };
        let block = self.block;
        let start = seg.pos / block * block;
        let keep = (seg.pos - start) as usize;
        debug_assert_eq!(buf.len(), keep, "the tail buffer holds the tail block");
        let need = (keep + bytes.len()).next_multiple_of(block as usize);
        if need > buf.capacity() {
            let mut bigger = AlignedBuf::new(need, block as usize);
            bigger.extend_from_slice(&buf);
            buf = bigger;
        }
        buf.extend_from_slice(&bytes);
        buf.resize_zeroed(need);
        let (res, mut buf) = if dsync {
            seg.file.write_all_at_dsync(buf, start).await
        } else {
            seg.file.write_all_at(buf, start).await
        };
        match res {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                // The filesystem took `O_DIRECT` at open but refuses this
                // write's alignment: go on buffered, with the same bytes.
                eprintln!(
                    "mailring-broker: {}: direct write refused ({e}); writing through the page cache from now on",
                    seg.path.display()
                );
                self.direct_io.set(false);
                self.flush_stats.direct.store(false, Ordering::Relaxed);
                seg.file =
                    Rc::new(open_segment(&seg.path, self.fsync, false, Made::Already).await?);
                let (res, _) = seg.file.write_all_at(bytes, seg.pos).await;
                return res;
            }
            Err(e) => return Err(e),
        }
        // Keep the block holding the new end, moved to the front.
        let end = seg.pos + bytes.len() as u64;
        let from = (end / block * block - start) as usize;
        let tail = (end % block) as usize;
        buf.copy_within(from..from + tail, 0);
        buf.truncate(tail);
        if buf.capacity() > MAX_KEPT_TAIL_BUF {
            buf = self.tail_buf(&buf);
        }
        seg.tail = Some(buf);
        Ok(())
    }

    /// A small aligned buffer for a direct segment's tail, holding `tail`.
    fn tail_buf(&self, tail: &[u8]) -> AlignedBuf {
        let mut buf = AlignedBuf::new((4 * self.block) as usize, self.block as usize);
        buf.extend_from_slice(tail);
        buf
    }

    /// Under `everysec`: starts a flush of what was written to `seg` that
    /// runs beside later writes (whose replies wait only for their write),
    /// first reaping the previous one. If that one is still running, it is
    /// awaited when `wait`, and otherwise left (and nothing new started).
    async fn flush_behind(&self, seg: &mut Segment, wait: bool) -> io::Result<bool> {
        if !wait && seg.syncing.as_ref().is_some_and(|r| !r.is_finished()) {
            return Ok(false);
        }
        reap_flush(seg).await?;
        if !seg.unsynced {
            return Ok(false);
        }
        let (file, path, pos) = (seg.file.clone(), seg.path.clone(), seg.pos);
        let (gate, durable, marks) = (self.gate.clone(), self.durable.clone(), self.marks.clone());
        seg.unsynced = false;
        seg.last_sync = Instant::now();
        seg.syncing = Some(mailring::spawn_local(async move {
            let res = match &gate {
                Some(gate) => gate.wait_open().await,
                None => Ok(()),
            };
            let res = match res {
                Ok(()) => file.sync_data().await,
                failed => failed,
            };
            match &res {
                Ok(()) => durable.set(&path, pos),
                // Nothing waits on this flush: fail the log now, so the
                // next append is refused instead of answered.
                Err(e) => {
                    marks.fail(StorageError::Write(e.to_string()));
                    if let Some(log_dir) = path.parent() {
                        mark_write_failed(log_dir).await;
                    }
                }
            }
            res
        }));
        Ok(true)
    }

    /// Flushes what was written to `seg` (once the crash-test gate, if
    /// any, lets it), after any flush still running beside the writes.
    async fn flush(&self, seg: &mut Segment) -> io::Result<()> {
        reap_flush(seg).await?;
        if !seg.unsynced {
            return Ok(());
        }
        if let Some(gate) = &self.gate {
            gate.wait_open().await?;
        }
        seg.file.sync_data().await?;
        self.durable.set(&seg.path, seg.pos);
        seg.unsynced = false;
        seg.last_sync = Instant::now();
        Ok(())
    }

    /// Makes segment `no`: the file with its header, flushed, and the
    /// directory entry flushed.
    async fn create_segment(&self, no: u32) -> io::Result<Segment> {
        let path = self.dir.join(log::segment_file_name(no));
        let mut direct = self.direct_io.get();
        let opened = if direct
            && self
                .gate
                .as_ref()
                .is_some_and(SyncGate::refuses_direct_open)
        {
            // As a filesystem without direct I/O does: the file is made,
            // then the open fails.
            open_segment(&path, self.fsync, false, Made::Now)
                .await?
                .close()
                .await?;
            Err(io::Error::from_raw_os_error(libc::EINVAL))
        } else {
            open_segment(&path, self.fsync, direct, Made::Now).await
        };
        let file = match opened {
            Err(e) if direct && e.raw_os_error() == Some(libc::EINVAL) => {
                eprintln!(
                    "mailring-broker: {}: the filesystem refuses O_DIRECT ({e}); writing through the page cache",
                    self.dir.display()
                );
                self.direct_io.set(false);
                self.flush_stats.direct.store(false, Ordering::Relaxed);
                direct = false;
                // The refused open may have made the file (the kernel
                // checks for direct I/O after creating it): it is new and
                // empty either way, so it is opened whether it is there or
                // not.
                open_segment(&path, self.fsync, false, Made::NowOrAlready).await?
            }
            other => other?,
        };
        let mut seg = Segment {
            no,
            file: Rc::new(file),
            path,
            pos: 0,
            unsynced: false,
            last_sync: Instant::now(),
            zeroed: 0,
            zeroing: None,
            syncing: None,
            presynced: false,
            tail: direct.then(|| self.tail_buf(&[])),
        };
        self.flush_stats
            .direct
            .store(direct && self.fsync == Fsync::Always, Ordering::Relaxed);
        // The header goes the way the records will (a direct segment's is
        // its first block, padded, which the first batch rewrites).
        let header = log::segment_header(self.log_no, no);
        // Flushed below, with the directory.
        self.write_segment(&mut seg, Bytes::copy_from_slice(&header), false)
            .await?;
        seg.pos = header.len() as u64;
        seg.zeroed = if seg.tail.is_some() {
            self.block
        } else {
            seg.pos
        };
        if let Some(gate) = &self.gate {
            gate.wait_open().await?;
        }
        seg.file.sync_data().await?;
        sync_dir_async(&self.dir).await?;
        // Written before durable, always: a reader of both (durable first)
        // never finds a durable file it has not seen written.
        self.durable.set_written(&seg.path, seg.pos);
        self.durable.set(&seg.path, seg.pos);
        self.retention.borrow_mut().created(no);
        self.zero_ahead(&mut seg, 0).await?;
        Ok(seg)
    }
}

/// Reads up to `len` bytes of `file` from `start` (fewer at its end).
async fn read_at(file: &mailring::fs::File, start: u32, len: usize) -> io::Result<Bytes> {
    let (res, mut buf) = file
        .read_at(Vec::with_capacity(len), u64::from(start))
        .await;
    res?;
    // A short read before the end: read on.
    while buf.len() < len {
        let at = u64::from(start) + buf.len() as u64;
        let (res, more) = file.read_at(Vec::with_capacity(len - buf.len()), at).await;
        if res? == 0 {
            break;
        }
        buf.extend_from_slice(&more);
    }
    Ok(Bytes::from(buf))
}

/// Writes zeros over `[from, to)` of the file at `path` and flushes them
/// (through its own descriptor, without `O_DSYNC`).
async fn zero_fill(path: &Path, from: u64, to: u64) -> io::Result<()> {
    let file = mailring::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .await?;
    let mut buf = vec![0u8; 1 << 20];
    let mut at = from;
    while at < to {
        let n = (to - at).min(buf.len() as u64) as usize;
        buf.truncate(n);
        let (res, back) = file.write_all_at(buf, at).await;
        res?;
        buf = back;
        at += n as u64;
    }
    file.sync_data().await?;
    file.close().await
}

/// Waits for the flush running beside `seg`'s writes, if any, and
/// returns its error.
async fn reap_flush(seg: &mut Segment) -> io::Result<()> {
    match seg.syncing.take() {
        Some(running) => running
            .await
            .map_err(|e| io::Error::other(format!("flushing a segment: {e}")))?,
        None => Ok(()),
    }
}

/// The segment being written.
struct Segment {
    /// Its number.
    no: u32,
    /// Shared with a flush running beside the writes.
    file: Rc<mailring::fs::File>,
    path: PathBuf,
    /// Where the next write goes.
    pos: u64,
    /// Whether bytes were written since the last flush.
    unsynced: bool,
    last_sync: Instant,
    /// Bytes from the start known zero-filled and flushed (or written).
    zeroed: u64,
    /// The chunk being zero-filled, finishing at the offset it returns.
    zeroing: Option<mailring::JoinHandle<io::Result<u64>>>,
    /// Under `everysec`: the flush running beside the writes.
    syncing: Option<mailring::JoinHandle<io::Result<()>>>,
    /// Under `everysec`: whether the early flush near its end was started.
    presynced: bool,
    /// A segment written `O_DIRECT`: the bytes of its last, partly written
    /// block (`pos % block` of them), which the next write writes again.
    tail: Option<AlignedBuf>,
}

/// The flags a segment is opened with. Under `always` every write must be
/// flushed before its replies: a buffered segment is `O_DSYNC`, which
/// makes the write itself the flush (one io_uring operation per batch
/// instead of a write and an `fdatasync`); a direct one is flushed the
/// way [`FlushChooser`] picks for each batch.
fn segment_flags(fsync: Fsync, direct: bool) -> i32 {
    let mut flags = 0;
    if fsync == Fsync::Always && !direct {
        flags |= libc::O_DSYNC;
    }
    if direct {
        flags |= libc::O_DIRECT;
    }
    flags
}

/// Whether the segment file an open names is made by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Made {
    /// A new segment: the open makes it, and fails if it is there.
    Now,
    /// An existing segment opened again (after direct writes were refused).
    Already,
    /// A new segment that a refused open may have made already.
    NowOrAlready,
}

/// Opens segment `path` for writing.
async fn open_segment(
    path: &Path,
    fsync: Fsync,
    direct: bool,
    made: Made,
) -> io::Result<mailring::fs::File> {
    mailring::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(made == Made::Now)
        .create(made == Made::NowOrAlready)
        .custom_flags(segment_flags(fsync, direct))
        .open(path)
        .await
}

/// A crash-test seam: while closed, every flush (`fdatasync`) of the logs
/// waits, so a test can take [`DurableFiles::snapshot`] with writes
/// acknowledged-or-not in flight and cut the files back to it, as a power
/// loss would.
#[derive(Debug, Clone, Default)]
pub struct SyncGate {
    state: Arc<Mutex<GateState>>,
}

#[derive(Debug, Default)]
struct GateState {
    closed: bool,
    failing: bool,
    refusing_direct: bool,
    waiters: Vec<Waker>,
}

impl SyncGate {
    /// A gate, open.
    pub fn new() -> Self {
        Self::default()
    }

    /// Holds every flush from now on.
    pub fn close(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).closed = true;
    }

    /// Makes every segment made from now on refuse `O_DIRECT` at its open,
    /// after the file is made, as a filesystem without direct I/O does.
    pub fn refuse_direct_open(&self) {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .refusing_direct = true;
    }

    fn refuses_direct_open(&self) -> bool {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .refusing_direct
    }

    /// Makes every flush from now on fail, as a disk that refuses
    /// `fdatasync` (once the gate is open).
    pub fn fail_flushes(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).failing = true;
    }

    /// Lets flushes go on.
    pub fn open(&self) {
        let waiters = {
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            s.closed = false;
            std::mem::take(&mut s.waiters)
        };
        waiters.into_iter().for_each(Waker::wake);
    }

    /// Whether a flush is waiting at the gate now.
    pub fn holding(&self) -> bool {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.closed && !s.waiters.is_empty()
    }

    /// Waits until the gate is open; then the flush may go on, or fails
    /// if [`SyncGate::fail_flushes`] was called.
    async fn wait_open(&self) -> io::Result<()> {
        std::future::poll_fn(|cx| {
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if s.closed {
                s.waiters.push(cx.waker().clone());
                Poll::Pending
            } else if s.failing {
                Poll::Ready(Err(io::Error::other("flush failed (injected by a test)")))
            } else {
                Poll::Ready(Ok(()))
            }
        })
        .await
    }
}

async fn sync_dir_async(dir: &Path) -> io::Result<()> {
    let d = mailring::fs::File::open(dir).await?;
    d.sync_all().await
}

thread_local! {
    /// The shard logs of the brokers running on this thread, by broker id.
    static SHARD_LOGS: RefCell<Vec<(u64, Rc<ShardLog>)>> = const { RefCell::new(Vec::new()) };
}

/// Registers this shard's log of broker `broker`.
pub fn register(broker: u64, log: Rc<ShardLog>) {
    SHARD_LOGS.with(|l| l.borrow_mut().push((broker, log)));
}

/// Removes this shard's log of broker `broker`.
pub fn unregister(broker: u64) -> Option<Rc<ShardLog>> {
    SHARD_LOGS.with(|l| {
        let mut l = l.borrow_mut();
        let at = l.iter().position(|(b, _)| *b == broker)?;
        Some(l.swap_remove(at).1)
    })
}

/// This shard's log of broker `broker`.
pub fn shard_log(broker: u64) -> Option<Rc<ShardLog>> {
    SHARD_LOGS.with(|l| {
        l.borrow()
            .iter()
            .find(|(b, _)| *b == broker)
            .map(|(_, log)| log.clone())
    })
}

/// Replays stream `name`'s records from the log's segments in `dir`,
/// oldest first (`list` gives the segments on disk, `read` a file's
/// bytes, `keep` is called on the stream after each of its records).
///
/// Segments may be removed while they are read (the log's collector runs
/// between reads; it removes the oldest first). A segment missing before
/// any was read is older than anything the stream needs and is skipped;
/// one missing after others were replayed means those were removed too,
/// and the stream's records in them may be undone by records in the
/// missing one (a trim, a deletion), so the replay starts over from the
/// segments on disk now.
async fn replay_segments<R, F>(
    name: &[u8],
    log_no: u16,
    dir: &Path,
    list: impl Fn() -> Vec<u32>,
    read: R,
    mut keep: impl FnMut(&mut Stream),
) -> io::Result<RecoveredStream>
where
    R: Fn(PathBuf) -> F,
    F: Future<Output = io::Result<Vec<u8>>>,
{
    'pass: loop {
        let mut out = RecoveredStream::empty(log_no);
        let mut read_any = false;
        for segment in list() {
            let path = dir.join(log::segment_file_name(segment));
            let data = match read(path.clone()).await {
                Ok(data) => data,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    if read_any {
                        continue 'pass;
                    }
                    continue;
                }
                Err(e) => return Err(e),
            };
            read_any = true;
            // The tail may be a write in flight for another stream: the
            // scan stops there, after every record of this one.
            log::scan_segment_each(Bytes::from(data), |offset, record| {
                if record.stream == name {
                    out.op_no = record.op_no;
                    recover::replay(&mut out, record.op, Loc::new(segment, offset));
                    if let Some(s) = out.stream.as_mut() {
                        keep(s);
                    }
                }
            })
            .map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: {e}", path.display()),
                )
            })?;
        }
        return Ok(out);
    }
}

/// Marks `log_dir` as having had a failed write or flush (see
/// [`recover::mark_write_failed`]) on a blocking thread: the disk that
/// just failed may take its error timeout to answer, and the shard goes
/// on meanwhile.
async fn mark_write_failed(log_dir: &Path) {
    let log_dir = log_dir.to_path_buf();
    let _ = mailring::spawn_blocking(move || recover::mark_write_failed(&log_dir)).await;
}

/// Runs `encode`, which appends to `buf`; if it panics, `buf` is cut back
/// to what it held before, then the panic goes on. The buffer is the
/// shard's, shared by every stream: a half-encoded frame left in it would
/// be written ahead of every later record, and recovery stops at it.
fn encode_or_roll_back(buf: &mut BytesMut, encode: impl FnOnce(&mut BytesMut)) {
    let at = buf.len();
    if let Err(payload) =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| encode(&mut *buf)))
    {
        buf.truncate(at);
        std::panic::resume_unwind(payload);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    #[test]
    fn an_encoding_that_panics_leaves_the_shards_buffer_as_it_was() {
        let mut buf = BytesMut::from(&b"whole frames"[..]);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            encode_or_roll_back(&mut buf, |dst| {
                dst.extend_from_slice(&[0u8; 12]);
                dst.extend_from_slice(b"half a body");
                panic!("a record that cannot be encoded");
            })
        }));
        assert!(caught.is_err(), "the panic goes on to the caller");
        assert_eq!(&buf[..], b"whole frames");
        encode_or_roll_back(&mut buf, |dst| dst.extend_from_slice(b"+next"));
        assert_eq!(&buf[..], b"whole frames+next");
    }

    /// Runs `batches` batches through `chooser`, each way taking the time
    /// `time` gives it; returns how many went each way.
    fn run_batches(
        chooser: &mut FlushChooser,
        batches: u32,
        time: impl Fn(FlushWay) -> Duration,
    ) -> [u32; 2] {
        let mut went = [0; 2];
        for _ in 0..batches {
            let way = chooser.pick();
            went[way.index()] += 1;
            chooser.record(way, time(way));
        }
        went
    }

    fn micros(through: u64, then_sync: u64) -> impl Fn(FlushWay) -> Duration {
        move |way| {
            Duration::from_micros(match way {
                FlushWay::WriteThrough => through,
                FlushWay::WriteThenSync => then_sync,
            })
        }
    }

    /// Most batches a run of `batches` gives to tries of the way not in use.
    fn tries_in(batches: u32) -> u32 {
        (batches / ADAPTIVE_TRY_EVERY + 1) * ADAPTIVE_TRY_LEN
    }

    /// Runs batches timed by `time` until the next pick starts a try.
    fn run_to_a_try(chooser: &mut FlushChooser, time: impl Fn(FlushWay) -> Duration) {
        while chooser.since_try + 1 < chooser.try_every || chooser.trying.is_some() {
            let way = chooser.pick();
            chooser.record(way, time(way));
        }
    }

    #[test]
    fn the_adaptive_flush_goes_the_quicker_way_and_turns_when_the_other_gets_quicker() {
        let mut chooser = FlushChooser::new(AlwaysFlush::Adaptive, Arc::default());
        // Write-then-sync quicker (the interrupts' CPU busy): the chooser
        // turns to it at its first try.
        let went = run_batches(&mut chooser, 1000, micros(330, 190));
        assert!(went[0] <= ADAPTIVE_FIRST_TRY + tries_in(1000), "{went:?}");
        assert_eq!(chooser.current, FlushWay::WriteThenSync);
        // That CPU gets time to spare: write-through quickens, and the
        // chooser turns back at its next try, however far tries have
        // backed off by then.
        let went = run_batches(
            &mut chooser,
            ADAPTIVE_TRY_MAX + ADAPTIVE_TRY_LEN,
            micros(140, 190),
        );
        assert_eq!(chooser.current, FlushWay::WriteThrough, "{went:?}");
        let went = run_batches(&mut chooser, 1000, micros(140, 190));
        assert!(went[1] <= tries_in(1000), "{went:?}");
    }

    #[test]
    fn tries_back_off_while_the_other_way_loses_and_never_stop() {
        let mut chooser = FlushChooser::new(AlwaysFlush::Adaptive, Arc::default());
        let time = micros(140, 190);
        // The batches between the starts of successive tries.
        let mut gaps = Vec::new();
        let mut since = 0u32;
        let mut was_trying = false;
        for _ in 0..4 * ADAPTIVE_TRY_MAX {
            let way = chooser.pick();
            let trying = way != chooser.current;
            if trying && !was_trying {
                gaps.push(since);
                since = 0;
            }
            was_trying = trying;
            since += 1;
            chooser.record(way, time(way));
        }
        // The first try after ADAPTIVE_FIRST_TRY batches; each lost try
        // doubles the wait, from ADAPTIVE_TRY_EVERY up to ADAPTIVE_TRY_MAX.
        let mut want = vec![ADAPTIVE_FIRST_TRY];
        let mut every = ADAPTIVE_TRY_EVERY;
        while want.len() < gaps.len() {
            every = (every * 2).min(ADAPTIVE_TRY_MAX);
            want.push(every + ADAPTIVE_TRY_LEN);
        }
        assert_eq!(gaps, want);
        assert!(
            gaps.iter()
                .filter(|&&g| g == ADAPTIVE_TRY_MAX + ADAPTIVE_TRY_LEN)
                .count()
                >= 2,
            "tries go on at the longest spacing: {gaps:?}"
        );
    }

    #[test]
    fn after_a_change_of_way_tries_come_often_again() {
        let mut chooser = FlushChooser::new(AlwaysFlush::Adaptive, Arc::default());
        run_batches(&mut chooser, 3 * ADAPTIVE_TRY_MAX, micros(140, 190));
        assert_eq!(chooser.try_every, ADAPTIVE_TRY_MAX);
        run_to_a_try(&mut chooser, micros(330, 190));
        run_batches(&mut chooser, ADAPTIVE_TRY_LEN + 1, micros(330, 190));
        assert_eq!(chooser.current, FlushWay::WriteThenSync);
        assert_eq!(chooser.try_every, ADAPTIVE_TRY_EVERY);
    }

    #[test]
    fn one_slow_flush_just_before_a_try_does_not_turn_the_adaptive_flush_over() {
        let mut chooser = FlushChooser::new(AlwaysFlush::Adaptive, Arc::default());
        run_batches(&mut chooser, 200, micros(140, 190));
        run_to_a_try(&mut chooser, micros(140, 190));
        // A 20 ms hiccup of the disk on the last write-through batch
        // before the try: counted as twice the average, it leaves
        // write-through quicker than write-then-sync's 190 µs.
        assert!(chooser.trying.is_none());
        chooser.record(FlushWay::WriteThrough, Duration::from_millis(20));
        let went = run_batches(&mut chooser, ADAPTIVE_TRY_LEN, micros(140, 190));
        assert_eq!(went[1], ADAPTIVE_TRY_LEN, "the try came right after it");
        assert_eq!(chooser.current, FlushWay::WriteThrough);
    }

    #[test]
    fn a_near_tie_does_not_turn_the_adaptive_flush_over() {
        let mut chooser = FlushChooser::new(AlwaysFlush::Adaptive, Arc::default());
        // Write-then-sync quicker by less than an eighth: it stays.
        let went = run_batches(&mut chooser, 3 * ADAPTIVE_TRY_MAX, micros(140, 130));
        assert!(went[1] <= tries_in(3 * ADAPTIVE_TRY_MAX), "{went:?}");
        assert_eq!(chooser.current, FlushWay::WriteThrough);
    }

    #[test]
    fn a_fixed_setting_counts_batches_past_u32_without_overflow() {
        let mut chooser = FlushChooser::new(AlwaysFlush::WriteThrough, Arc::default());
        chooser.since_try = u32::MAX - 1;
        run_batches(&mut chooser, 3, micros(140, 190));
        assert_eq!(chooser.since_try, u32::MAX);
        assert_eq!(chooser.pick(), FlushWay::WriteThrough);
    }

    #[test]
    fn a_fixed_flush_setting_never_tries_the_other_way() {
        for (setting, way) in [
            (AlwaysFlush::WriteThrough, FlushWay::WriteThrough),
            (AlwaysFlush::WriteThenSync, FlushWay::WriteThenSync),
        ] {
            let mut chooser = FlushChooser::new(setting, Arc::default());
            // Even where the other way is far quicker.
            let slow = |w: FlushWay| Duration::from_micros(if w == way { 1000 } else { 10 });
            let went = run_batches(&mut chooser, 200, slow);
            assert_eq!(went[way.index()], 200, "{setting:?}");
        }
    }

    #[test]
    fn always_flush_settings_parse_by_their_flag_names() {
        assert_eq!(AlwaysFlush::parse("adaptive"), Some(AlwaysFlush::Adaptive));
        assert_eq!(
            AlwaysFlush::parse("write-through"),
            Some(AlwaysFlush::WriteThrough)
        );
        assert_eq!(
            AlwaysFlush::parse("write-then-sync"),
            Some(AlwaysFlush::WriteThenSync)
        );
        assert_eq!(AlwaysFlush::parse("dsync"), None);
        for setting in [
            AlwaysFlush::Adaptive,
            AlwaysFlush::WriteThrough,
            AlwaysFlush::WriteThenSync,
        ] {
            assert_eq!(AlwaysFlush::parse(setting.name()), Some(setting));
        }
    }

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn ticket(marks: &Arc<Marks>, lsn: u64) -> Ticket {
        Ticket {
            marks: marks.clone(),
            lsn,
            read: false,
        }
    }

    #[test]
    fn tickets_wake_once_flushed_each_with_its_own_waker() {
        let marks = Arc::new(Marks::default());
        let counts: Vec<Arc<Count>> = (0..4)
            .map(|_| Arc::new(Count(AtomicUsize::new(0))))
            .collect();
        let wakers: Vec<Waker> = counts.iter().map(|c| Waker::from(c.clone())).collect();
        // Two tickets share lsn 2 (a read-back waits for the last append),
        // polled out of order and more than once.
        let mut tickets = [
            ticket(&marks, 3),
            ticket(&marks, 2),
            ticket(&marks, 2),
            ticket(&marks, 1),
        ];
        for _ in 0..2 {
            for (t, w) in tickets.iter_mut().zip(&wakers) {
                let mut cx = Context::from_waker(w);
                assert!(Pin::new(t).poll(&mut cx).is_pending());
            }
        }
        assert_eq!(marks.lock().waiters.len(), 4, "one place per waiting task");
        marks.advance(2);
        let woken: Vec<usize> = counts.iter().map(|c| c.0.load(Ordering::SeqCst)).collect();
        assert_eq!(woken, [0, 1, 1, 1]);
        for (t, w) in tickets.iter_mut().zip(&wakers).skip(1) {
            let mut cx = Context::from_waker(w);
            assert!(matches!(Pin::new(t).poll(&mut cx), Poll::Ready(Ok(()))));
        }
        marks.fail(StorageError::Closed);
        assert_eq!(counts[0].0.load(Ordering::SeqCst), 1);
        let mut cx = Context::from_waker(&wakers[0]);
        assert!(matches!(
            Pin::new(&mut tickets[0]).poll(&mut cx),
            Poll::Ready(Err(StorageError::Closed))
        ));
        assert!(matches!(marks.failed(), Some(StorageError::Closed)));
    }

    /// A segment image: its header and `records`, framed.
    fn segment_image(segment: u32, records: Vec<Record>) -> Vec<u8> {
        let mut buf = BytesMut::from(&log::segment_header(0, segment)[..]);
        for r in records {
            r.encode(&mut buf);
        }
        buf.to_vec()
    }

    fn record(op_no: u64, op: log::Op) -> Record {
        Record {
            stream: Bytes::from_static(b"s"),
            op_no,
            op,
        }
    }

    #[test]
    fn a_read_back_that_finds_a_segment_removed_after_others_starts_over() {
        // Segment 3 adds two entries, 4 trims them, 5 adds a third; 3 and
        // 4 go (no stream needs them once 5 is flushed) between the read
        // of 3 and that of 4. Skipping 4 would bring the trimmed entries
        // back.
        let add = |n: u64| log::Op::Add {
            id: StreamId::new(n, 0),
            fields: Fields::from_parts(&[&b"f"[..], &b"v"[..]]),
        };
        let files: HashMap<u32, Vec<u8>> = HashMap::from([
            (
                3,
                segment_image(3, vec![record(1, add(1)), record(2, add(2))]),
            ),
            (
                4,
                segment_image(
                    4,
                    vec![record(
                        3,
                        log::Op::TrimThrough {
                            through: StreamId::new(2, 0),
                        },
                    )],
                ),
            ),
            (5, segment_image(5, vec![record(4, add(3))])),
        ]);
        let removed = Cell::new(false);
        let reads = RefCell::new(Vec::new());
        let dir = Path::new("/nonexistent-log");
        let replay = replay_segments(
            b"s",
            0,
            dir,
            || {
                if removed.get() {
                    vec![5]
                } else {
                    vec![3, 4, 5]
                }
            },
            |path: PathBuf| {
                let segment = (3..=5)
                    .find(|&n| path == dir.join(log::segment_file_name(n)))
                    .expect("a segment of the list");
                reads.borrow_mut().push(segment);
                // Removed right after the first read of segment 3.
                let found = !(removed.get() && segment < 5);
                if segment == 3 {
                    removed.set(true);
                }
                let data = files[&segment].clone();
                async move {
                    if found {
                        Ok(data)
                    } else {
                        Err(io::Error::from(io::ErrorKind::NotFound))
                    }
                }
            },
            |_| {},
        );
        let mut replay = std::pin::pin!(replay);
        let mut cx = Context::from_waker(Waker::noop());
        let Poll::Ready(out) = replay.as_mut().poll(&mut cx) else {
            panic!("no read waits");
        };
        let out = out.expect("replayed");
        let stream = out.stream.expect("the stream exists");
        let ids: Vec<StreamId> = stream
            .range(StreamId::MIN, StreamId::MAX, None, false)
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        assert_eq!(
            ids,
            vec![StreamId::new(3, 0)],
            "only the entry after the trim"
        );
        assert_eq!(out.op_no, 4);
        assert_eq!(*reads.borrow(), vec![3, 4, 5], "started over at 5");
    }
}
