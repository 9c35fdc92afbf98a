//! Durable storage: recovery of every log at start, and each shard's log
//! writer, which group-commits: appends made while a flush is in flight
//! go out together in the next write and `fdatasync`, and each append's
//! [`Ticket`] completes when the flush that covers it does.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use crate::log::{self, Op, Record, Tail};
use crate::stream::Stream;

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

/// Where and how the broker stores its logs.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// The data directory.
    pub dir: PathBuf,
    /// The flush policy.
    pub fsync: Fsync,
    /// A segment is rolled once it holds this many bytes.
    pub segment_bytes: u64,
    /// Zero-fill each segment ahead of the writes, in flushed chunks, so
    /// an `O_DSYNC` append overwrites initialized blocks instead of
    /// allocating (measured: `benches/examples/prealloc.rs`).
    pub preallocate: bool,
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
            sync_gate: None,
        }
    }
}

/// A failure of the storage layer; writes are refused from then on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StorageError {
    /// A write or flush failed.
    #[error("writing the commit log failed: {0}")]
    Write(String),
    /// The log was closed (shutdown) before the flush.
    #[error("the commit log is closed")]
    Closed,
}

/// A stream rebuilt from the logs, waiting for its actor.
#[derive(Debug)]
pub struct RecoveredStream {
    /// Its state (`None`: its last record deleted it).
    pub stream: Option<Stream>,
    /// Its last operation number.
    pub op_no: u64,
}

/// What recovery found.
#[derive(Debug, Default)]
pub struct Recovered {
    /// Streams by name.
    pub streams: HashMap<Bytes, RecoveredStream>,
    /// The highest segment number of each log found.
    pub last_segment: HashMap<u16, u32>,
    /// Records replayed.
    pub records: u64,
    /// Bytes of valid records read.
    pub bytes: u64,
    /// Segments whose tails were cut, with the bytes cut.
    pub cut: Vec<(PathBuf, u64)>,
    /// How long recovery took.
    pub elapsed: Duration,
}

fn sync_dir(path: &Path) -> io::Result<()> {
    std::fs::File::open(path)?.sync_all()
}

/// Reads every log under `dir` (made if missing), cuts torn or corrupt
/// tails, and replays each stream's records in operation order.
///
/// # Errors
///
/// I/O errors, or a file in a log directory that is not a segment.
pub fn recover(dir: &Path) -> io::Result<Recovered> {
    let started = Instant::now();
    if !dir.exists() {
        std::fs::create_dir_all(dir)?;
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent)?;
        }
    }
    let mut out = Recovered::default();
    let mut per_stream: HashMap<Bytes, Vec<(u64, Op)>> = HashMap::new();
    let mut logs: Vec<(u16, PathBuf)> = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if let Some(log) = name.to_str().and_then(log::parse_log_dir_name) {
            logs.push((log, entry.path()));
        }
    }
    logs.sort();
    for (log_no, log_dir) in logs {
        let mut segments: Vec<(u32, PathBuf)> = Vec::new();
        for entry in std::fs::read_dir(&log_dir)? {
            let entry = entry?;
            let name = entry.file_name();
            if let Some(seg) = name.to_str().and_then(log::parse_segment_file_name) {
                segments.push((seg, entry.path()));
            }
        }
        segments.sort();
        if let Some((last, _)) = segments.last() {
            out.last_segment.insert(log_no, *last);
        }
        for (_, path) in segments {
            let data = Bytes::from(std::fs::read(&path)?);
            let len = data.len() as u64;
            let scan = log::scan_segment(data).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: {e}", path.display()),
                )
            })?;
            // A clean end may be followed by zeros (a preallocated
            // segment): only a torn or corrupt tail is cut.
            if scan.tail != Tail::Clean {
                let f = std::fs::OpenOptions::new().write(true).open(&path)?;
                f.set_len(scan.valid_len)?;
                f.sync_all()?;
                out.cut.push((path.clone(), len - scan.valid_len));
            }
            out.bytes += scan.valid_len;
            for (_, r) in scan.records {
                out.records += 1;
                per_stream
                    .entry(r.stream)
                    .or_default()
                    .push((r.op_no, r.op));
            }
        }
    }
    for (name, mut ops) in per_stream {
        // Each log holds a stream's records in order; across logs (a
        // stream that moved) the operation numbers order them.
        ops.sort_by_key(|(n, _)| *n);
        let mut stream: Option<Stream> = None;
        let mut op_no = 0;
        for (n, op) in ops {
            op_no = n;
            apply(&mut stream, op);
        }
        out.streams.insert(name, RecoveredStream { stream, op_no });
    }
    out.elapsed = started.elapsed();
    Ok(out)
}

/// Applies one logged operation to a stream being rebuilt.
fn apply(stream: &mut Option<Stream>, op: Op) {
    match op {
        Op::Add { id, fields } => {
            let s = stream.get_or_insert_with(Stream::new);
            if id > s.last_id() {
                s.insert(id, fields);
            }
        }
        Op::Delete { ids } => {
            if let Some(s) = stream {
                s.delete(&ids);
            }
        }
        Op::TrimThrough { through } => {
            if let Some(s) = stream {
                s.trim_through(through);
            }
        }
        Op::SetId {
            last_id,
            entries_added,
            max_deleted_id,
        } => {
            let s = stream.get_or_insert_with(Stream::new);
            s.set_last_id(last_id);
            s.set_counters(entries_added, max_deleted_id);
        }
        Op::Drop => *stream = None,
        Op::Batch(ops) => {
            for op in ops {
                apply(stream, op);
            }
        }
        group_op => {
            if let Some(s) = stream {
                s.apply_group(group_op);
            }
        }
    }
}

/// The reply-side watermark of one log: appends up to `done` are flushed
/// (as far as the policy asks before a reply).
#[derive(Debug, Default)]
struct Marks {
    state: Mutex<MarksState>,
}

#[derive(Debug, Default)]
struct MarksState {
    done: u64,
    failed: Option<StorageError>,
    waiters: Vec<(u64, Waker)>,
}

impl Marks {
    fn lock(&self) -> std::sync::MutexGuard<'_, MarksState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn advance(&self, to: u64) {
        let ready: Vec<Waker> = {
            let mut s = self.lock();
            s.done = s.done.max(to);
            let done = s.done;
            let (ready, waiting) = std::mem::take(&mut s.waiters)
                .into_iter()
                .partition(|(lsn, _)| *lsn <= done);
            s.waiters = waiting;
            ready.into_iter().map(|(_, w)| w).collect()
        };
        ready.into_iter().for_each(Waker::wake);
    }

    fn fail(&self, e: StorageError) {
        let waiters = {
            let mut s = self.lock();
            s.failed.get_or_insert(e);
            std::mem::take(&mut s.waiters)
        };
        waiters.into_iter().for_each(|(_, w)| w.wake());
    }
}

/// Completes when the append it was given for is flushed (per the
/// policy). `Send`: a session on another shard may await it.
#[must_use = "a ticket says when the write is durable"]
pub struct Ticket {
    marks: Arc<Marks>,
    lsn: u64,
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket").field("lsn", &self.lsn).finish()
    }
}

impl Future for Ticket {
    type Output = Result<(), StorageError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut s = self.marks.lock();
        if s.done >= self.lsn {
            return Poll::Ready(Ok(()));
        }
        if let Some(e) = &s.failed {
            return Poll::Ready(Err(e.clone()));
        }
        match s.waiters.iter_mut().find(|(lsn, _)| *lsn == self.lsn) {
            Some((_, w)) => w.clone_from(cx.waker()),
            None => s.waiters.push((self.lsn, cx.waker().clone())),
        }
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
}

/// What is waiting to be written.
#[derive(Debug, Default)]
struct Pending {
    buf: BytesMut,
    /// The number of the last append in `buf` (0: none yet).
    last: u64,
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
    pending: RefCell<Pending>,
    flusher: Cell<Option<Waker>>,
    marks: Arc<Marks>,
    durable: DurableFiles,
    gate: Option<SyncGate>,
    preallocate: bool,
}

/// Bytes zero-filled ahead of the writes at a time.
const ZERO_CHUNK: u64 = 4 << 20;

impl fmt::Debug for ShardLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShardLog")
            .field("log_no", &self.log_no)
            .field("dir", &self.dir)
            .field("fsync", &self.fsync)
            .finish_non_exhaustive()
    }
}

impl ShardLog {
    /// A writer for log `log_no` under `data_dir`, starting a new segment
    /// after `last_segment`. Its flusher must be run ([`ShardLog::run`]).
    pub fn new(
        data_dir: &Path,
        log_no: u16,
        config: &StoreConfig,
        durable: DurableFiles,
    ) -> Rc<ShardLog> {
        Rc::new(ShardLog {
            log_no,
            dir: data_dir.join(log::log_dir_name(log_no)),
            fsync: config.fsync,
            segment_bytes: config.segment_bytes.max(4096),
            pending: RefCell::new(Pending::default()),
            flusher: Cell::new(None),
            marks: Arc::new(Marks::default()),
            durable,
            gate: config.sync_gate.clone(),
            preallocate: config.preallocate,
        })
    }

    /// Appends `record`; the ticket completes once it is flushed.
    ///
    /// # Errors
    ///
    /// The log failed earlier, or is closed.
    pub fn append(&self, record: &Record) -> Result<Ticket, StorageError> {
        if let Some(e) = &self.marks.lock().failed {
            return Err(e.clone());
        }
        let mut p = self.pending.borrow_mut();
        if p.closed {
            return Err(StorageError::Closed);
        }
        record.encode(&mut p.buf);
        p.next += 1;
        p.last = p.next;
        let lsn = p.next;
        drop(p);
        if let Some(w) = self.flusher.take() {
            w.wake();
        }
        Ok(Ticket {
            marks: self.marks.clone(),
            lsn,
        })
    }

    /// A ticket that is complete already (for a change that another
    /// record's ticket covers).
    pub fn no_wait(&self) -> Ticket {
        Ticket {
            marks: self.marks.clone(),
            lsn: 0,
        }
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
    pub async fn run(self: Rc<Self>, last_segment: Option<u32>) -> io::Result<()> {
        let res = self.run_inner(last_segment).await;
        if let Err(e) = &res {
            self.marks.fail(StorageError::Write(e.to_string()));
        }
        res
    }

    async fn run_inner(&self, last_segment: Option<u32>) -> io::Result<()> {
        if !self.dir.exists() {
            mailring::fs::create_dir_all(&self.dir).await?;
            sync_dir_async(self.dir.parent().expect("a log dir has a parent")).await?;
        }
        let mut segment_no = last_segment.map_or(1, |s| s + 1);
        let mut seg = self.create_segment(segment_no).await?;
        loop {
            let batch = std::future::poll_fn(|cx| {
                let mut p = self.pending.borrow_mut();
                if !p.buf.is_empty() {
                    let last = p.last;
                    return Poll::Ready(Some((p.buf.split().freeze(), last)));
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
                // everysec: a second passed with unflushed writes.
                self.flush(&mut seg).await?;
                continue;
            };
            let Some((bytes, lsn)) = next else {
                // Closing: flush whatever the policy, as Redis does at
                // shutdown.
                seg.unsynced = true;
                self.flush(&mut seg).await?;
                return Ok(());
            };
            if seg.pos > log::HEADER_LEN as u64 && seg.pos + bytes.len() as u64 > self.segment_bytes
            {
                // The old segment is complete: flush it before its
                // successor takes appends.
                self.flush(&mut seg).await?;
                segment_no += 1;
                seg = self.create_segment(segment_no).await?;
            }
            let len = bytes.len() as u64;
            self.zero_ahead(&mut seg, len).await?;
            if self.fsync == Fsync::Always {
                // The segment is O_DSYNC: this write is its flush.
                if let Some(gate) = &self.gate {
                    gate.wait_open().await;
                }
            }
            let (res, _) = seg.file.write_all_at(bytes, seg.pos).await;
            res?;
            seg.pos += len;
            seg.unsynced = true;
            self.durable.set_written(&seg.path, seg.pos);
            match self.fsync {
                Fsync::Always => {
                    self.durable.set(&seg.path, seg.pos);
                    seg.unsynced = false;
                }
                Fsync::EverySec if seg.last_sync.elapsed() >= Duration::from_secs(1) => {
                    self.flush(&mut seg).await?;
                }
                Fsync::EverySec => {}
                // The OS flushes; nothing is waited for.
                Fsync::No => seg.unsynced = false,
            }
            self.marks.advance(lsn);
        }
    }

    /// Keeps zero-filled, flushed blocks ahead of the next write of `len`
    /// bytes: waits for the chunk being zeroed if the write reaches it,
    /// and starts the next chunk when the writes come near.
    async fn zero_ahead(&self, seg: &mut Segment, len: u64) -> io::Result<()> {
        if !self.preallocate {
            return Ok(());
        }
        if seg.pos + len > seg.zeroed {
            if let Some(task) = seg.zeroing.take() {
                seg.zeroed = task
                    .await
                    .map_err(|e| io::Error::other(format!("zero-filling a segment: {e}")))??;
            }
        }
        if seg.zeroing.is_none()
            && seg.zeroed < self.segment_bytes
            && seg.pos + len + ZERO_CHUNK / 2 > seg.zeroed
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

    /// Flushes what was written to `seg` (once the crash-test gate, if
    /// any, lets it).
    async fn flush(&self, seg: &mut Segment) -> io::Result<()> {
        if !seg.unsynced {
            return Ok(());
        }
        if let Some(gate) = &self.gate {
            gate.wait_open().await;
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
        // Under `always` every write must be flushed before its replies:
        // O_DSYNC makes the write itself the flush (one io_uring operation
        // per batch instead of a write and an fdatasync).
        let flags = if self.fsync == Fsync::Always {
            libc::O_DSYNC
        } else {
            0
        };
        let file = mailring::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .custom_flags(flags)
            .open(&path)
            .await?;
        let (res, _) = file
            .write_all_at(log::segment_header(self.log_no, no).to_vec(), 0)
            .await;
        res?;
        if let Some(gate) = &self.gate {
            gate.wait_open().await;
        }
        file.sync_data().await?;
        sync_dir_async(&self.dir).await?;
        self.durable.set(&path, log::HEADER_LEN as u64);
        self.durable.set_written(&path, log::HEADER_LEN as u64);
        let mut seg = Segment {
            file,
            path,
            pos: log::HEADER_LEN as u64,
            unsynced: false,
            last_sync: Instant::now(),
            zeroed: log::HEADER_LEN as u64,
            zeroing: None,
        };
        self.zero_ahead(&mut seg, 0).await?;
        Ok(seg)
    }
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

/// The segment being written.
struct Segment {
    file: mailring::fs::File,
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

    /// Lets flushes go on.
    pub fn open(&self) {
        let waiters = {
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            s.closed = false;
            std::mem::take(&mut s.waiters)
        };
        waiters.into_iter().for_each(Waker::wake);
    }

    async fn wait_open(&self) {
        std::future::poll_fn(|cx| {
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if s.closed {
                s.waiters.push(cx.waker().clone());
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        })
        .await;
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
