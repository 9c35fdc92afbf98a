//! What one broker shares (configuration, the catalog of stream names
//! every shard reads) and [`Broker`], which recovers the data directory
//! and starts the shard logs, the stream actors and the RESP server on a
//! mailring runtime.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use mailring_actors::{ActorSystem, PlaceError, SystemConfig, SystemHandle};
use mailring_transports::{Server, ServerConfig};

use crate::actor::StreamActor;
use crate::glob::glob_match;
use crate::resp::RespCodec;
use crate::session::RespSession;
use crate::store::{self, DurableFiles, LogStart, RecoveredStream, ShardLog, StoreConfig, Ticket};

/// The version `HELLO` and `INFO` report: the Redis release whose replies
/// the broker's are checked against.
pub const REDIS_VERSION: &str = "7.0.15";

/// Longest stream name accepted (Redis allows 512 MB; a name is stored in
/// every log record of its stream).
pub const MAX_KEY_LEN: usize = 64 * 1024;

/// Connections past `maxclients` a listener takes, to refuse them, before
/// it pauses.
const REFUSALS_IN_FLIGHT: usize = 1024;

/// Descriptors kept for the broker's own use besides each shard's
/// ([`DESCRIPTORS_PER_SHARD`]), as Redis keeps 32 besides its clients'.
const RESERVED_DESCRIPTORS: u64 = 32;

/// Descriptors each shard keeps: its ring and wake-up descriptors, its
/// listener, its log's segment and directory, and the segments its two
/// read caches hold open.
const DESCRIPTORS_PER_SHARD: u64 = 8 + 2 * crate::store::reader::OPEN_FILES as u64;

/// How many clients fit the descriptor limit.
#[derive(Debug, PartialEq, Eq)]
struct DescriptorFit {
    /// `maxclients` (lowered if it had to be).
    clients: usize,
    /// Connections each shard's listener takes (served ones and refusals
    /// in flight) before it pauses.
    per_listener: usize,
    /// Said on stderr when `clients` was lowered.
    warning: Option<String>,
}

/// The clients, and the refusals in flight past them, that fit this
/// process's descriptor limit with the broker's own descriptors, raised
/// first as far as it may be (as Redis lowers `maxclients` to fit `ulimit
/// -n`, so a client past the limit is told `max number of clients
/// reached` instead of waiting in the backlog of a listener that cannot
/// accept it). Each listener may take the clients and the refusals: the
/// clients are counted over all of them, and refusals last as long as it
/// takes to write one line, so only a flood spread over every listener
/// at once could hold more.
fn fit_descriptor_limit(max_clients: usize, shards: usize) -> DescriptorFit {
    let reserved = RESERVED_DESCRIPTORS + DESCRIPTORS_PER_SHARD * shards.max(1) as u64;
    let wanted = (max_clients as u64)
        .saturating_add(REFUSALS_IN_FLIGHT as u64)
        .saturating_add(reserved);
    let unfitted = DescriptorFit {
        clients: max_clients,
        per_listener: max_clients.saturating_add(REFUSALS_IN_FLIGHT),
        warning: None,
    };
    let (limit, why) = match mailring::process::raise_descriptor_limit(wanted) {
        Ok(limit) => (limit, String::new()),
        Err(e) => match mailring::process::descriptor_limit() {
            Ok(l) => (l.soft, format!(" (raising it failed: {e})")),
            Err(_) => return unfitted,
        },
    };
    if limit >= wanted {
        return unfitted;
    }
    let room = usize::try_from(limit.saturating_sub(reserved)).unwrap_or(usize::MAX);
    let refusals = (room / 8).clamp(1, REFUSALS_IN_FLIGHT);
    // At least one client (unless none was asked for).
    let clients = room
        .saturating_sub(refusals)
        .min(max_clients)
        .max(max_clients.min(1));
    let warning = (clients < max_clients).then(|| {
        format!(
            "maxclients {max_clients} needs {wanted} descriptors, and the limit is {limit}{why}: maxclients lowered to {clients} (raise `ulimit -n` to serve more)"
        )
    });
    DescriptorFit {
        clients,
        per_listener: clients + refusals,
        warning,
    }
}

/// How the broker is set up.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// Where it listens (loopback in tests).
    pub addr: SocketAddr,
    /// Shards (threads, rings) of its runtime.
    pub shards: usize,
    /// `requirepass`: clients must `AUTH` first.
    pub requirepass: Option<Bytes>,
    /// The data directory and flush policy.
    pub store: StoreConfig,
    /// How long an idle shard spins before it blocks. `None`, the
    /// default, picks by the flush policy and the pinning: under `always`
    /// with unpinned shards, block at once (on 2 cores a spinning shard
    /// took the CPU its flush's completion, its peer shard or its client
    /// needed: one client at queue depth 1 over 100 streams went from
    /// ~0.6x redis-server's rate with a 50 µs spin to ~1.1x blocking at
    /// once, and still reads 1.30x blocking against 1.06x spinning);
    /// otherwise spin the runtime's 50 µs. Under `everysec` and `no`
    /// nothing waits on the disk, and a shard that blocks pays a wakeup
    /// per request round (one client pipelining 16 went from ~1.0x
    /// redis-server's rate blocking to ~1.6x spinning). Shards pinned to
    /// CPUs of their own (`cpus`) spin under `always` too: there spinning
    /// read better on the one-client and page rows against redis-server
    /// (one client 1.70-1.73x against 1.19-1.51x blocking, 100-entry pages
    /// 0.95-1.02x against 0.85-0.90x) and the same, within the noise, on
    /// the others (`benches/results/broker-vs-redis-2026-11-29-full.txt`).
    pub idle_spin: Option<std::time::Duration>,
    /// Pins shard `i` to `cpus[i % cpus.len()]` (`None`: unpinned). Put a
    /// shard that flushes on the CPU that takes the disk's interrupts:
    /// docs/runtime.md, "CPU pinning".
    pub cpus: Option<Vec<usize>>,
    /// Serve TLS only, with the certificate chain and key of these PEM
    /// files (`--tls-cert`, `--tls-key`); `None`, the default, serves plain
    /// TCP.
    pub tls: Option<TlsFiles>,
    /// `maxclients`: connections served at once; past it a client gets
    /// `-ERR max number of clients reached` and is closed, as from Redis
    /// (default 10,000, Redis's).
    pub max_clients: usize,
    /// Tests only: `DEBUG PANIC-STREAM key` makes the stream's actor panic
    /// (its supervisor restarts it, and it rebuilds from its log).
    pub debug_commands: bool,
    /// Spread the connections of a hot stream over the shards
    /// (`--spread-connections`; off by default). A connection moves to the
    /// shard of the first stream it names, so its commands on that stream
    /// never cross shards; with this on, a connection stays where it was
    /// accepted instead when the stream's shard already serves clearly
    /// more connections (more than this shard's by a sixteenth of all, and
    /// one), and its commands go to the stream's actor through the
    /// mailboxes. Many clients on one stream then keep every shard's
    /// network work busy instead of one; connections over many streams
    /// spread evenly either way and still follow their streams.
    pub spread_connections: bool,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 6379)),
            shards: 2,
            requirepass: None,
            store: StoreConfig::default(),
            idle_spin: None,
            cpus: None,
            tls: None,
            max_clients: 10_000,
            debug_commands: false,
            spread_connections: false,
        }
    }
}

/// The PEM files of a TLS broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, end-entity certificate first.
    pub cert: std::path::PathBuf,
    /// Its private key (PKCS#8, PKCS#1 or SEC1).
    pub key: std::path::PathBuf,
}

/// The names of the streams that exist, readable from every shard
/// (`KEYS`, `SCAN`, `INFO`, and `EXISTS` / `TYPE` with nothing of the
/// connection in flight, answer from it without waking a stream's actor).
///
/// A stream's actor changes it after logging the change, with the
/// change's [`Ticket`]; a reply that shows the names waits for the
/// tickets not flushed yet (`Catalog::unflushed`), as Redis writes no
/// reply before the flush of what it shows.
#[derive(Debug, Default)]
pub struct Catalog {
    names: Mutex<Names>,
}

/// The catalog's names twice: hashed (lookups, `KEYS`, counts) and in
/// `SCAN` order (each name's [`scan_position`], then its bytes), and the
/// last change's ticket per shard log.
///
/// (A name is looked up, and put in at each stream's making, far more
/// often than names are listed: the hash costs tens of instructions where
/// an ordered set's comparisons cost a cache miss each.)
#[derive(Debug, Default)]
struct Names {
    by_bytes: crate::NameSet,
    by_position: BTreeSet<(u64, Bytes)>,
    changes: Vec<Ticket>,
}

/// The streams of a transaction as it left them so far (whether each
/// exists), over the catalog (which takes the transaction's changes once
/// they are logged): a `KEYS`, `SCAN` or `INFO` inside the transaction
/// reads the names as of its place. Empty outside a transaction.
pub(crate) type Own<'a> = &'a [(Bytes, bool)];

/// Where `name` sits in `SCAN`'s order: from its stable routing hash, in
/// `1..=2^63`, so that a cursor (the position to go on from) is never 0,
/// which means "start" and "done". The same name has the same position in
/// every process, so a cursor outlives a restart.
pub(crate) fn scan_position(name: &[u8]) -> u64 {
    (mailring::route_hash(name) >> 1) + 1
}

impl Names {
    /// `SCAN`'s page from `cursor`: names in position order, at least
    /// `count` of them unless the end comes first, and then every other
    /// name at the last one's position, so that no position is split
    /// between two pages. The cursor returned is the position after the
    /// page's last (0 when no name lies beyond it).
    ///
    /// Because a cursor is a position, not an offset, a name that exists
    /// from the first page to the last is returned exactly once, whatever
    /// is made or deleted in between (Redis's guarantee, without its
    /// repeats).
    fn page(&self, cursor: u64, count: usize) -> (Vec<Bytes>, u64) {
        let mut page = Vec::new();
        let mut last = None;
        for (position, name) in self.by_position.range((cursor, Bytes::new())..) {
            if page.len() >= count.max(1) && last != Some(*position) {
                return (page, last.map_or(0, |p: u64| p + 1));
            }
            last = Some(*position);
            page.push(name.clone());
        }
        (page, 0)
    }
}

impl Names {
    fn add(&mut self, name: &Bytes) {
        if self.by_bytes.insert(name.clone()) {
            self.by_position.insert((scan_position(name), name.clone()));
        }
    }

    fn take(&mut self, name: &[u8]) {
        if let Some(name) = self.by_bytes.take(name) {
            self.by_position.remove(&(scan_position(&name), name));
        }
    }

    /// Keeps `change` as its log's last change of the names.
    fn note(&mut self, change: Option<Ticket>) {
        let Some(change) = change else {
            return;
        };
        match self.changes.iter_mut().find(|c| c.same_log(&change)) {
            Some(last) if last.lsn() < change.lsn() => *last = change,
            Some(_) => {}
            None => self.changes.push(change),
        }
    }
}

impl Catalog {
    fn names(&self) -> std::sync::MutexGuard<'_, Names> {
        self.names.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stream `name` exists, as the append `change` logged (`None`: it is
    /// durable already).
    pub(crate) fn insert(&self, name: &Bytes, change: Option<Ticket>) {
        let mut names = self.names();
        names.add(name);
        names.note(change);
    }

    /// Stream `name` is gone, as the append `change` logged.
    pub(crate) fn remove(&self, name: &[u8], change: Option<Ticket>) {
        let mut names = self.names();
        names.take(name);
        names.note(change);
    }

    /// Streams made (`true`) or gone by one append `change` (a
    /// transaction's group), all under one lock: a reader of the names
    /// sees all of them or none.
    pub(crate) fn apply(&self, changes: &[(Bytes, bool)], change: Option<Ticket>) {
        let mut names = self.names();
        for (name, exists) in changes {
            if *exists {
                names.add(name);
            } else {
                names.take(name);
            }
        }
        names.note(change);
    }

    /// Tickets for the changes of the names not flushed yet: a reply that
    /// shows what was read of the names before this call waits for them
    /// (it may wait for a later change too: never for less).
    pub(crate) fn unflushed(&self) -> Vec<Ticket> {
        let mut names = self.names();
        // A change the log failed to write stays: a read waiting on it
        // gets the log's error (under `always`), not the change.
        names.changes.retain(|t| !t.is_flushed());
        names.changes.iter().map(Ticket::for_read).collect()
    }

    /// Whether stream `name` exists.
    pub fn contains(&self, name: &[u8]) -> bool {
        self.names().by_bytes.contains(name)
    }

    /// How many of `names` exist (one named twice counts twice), read at
    /// one point, with `own` as its transaction left it.
    pub(crate) fn count_with(&self, names: &[Bytes], own: Own<'_>) -> usize {
        let catalog = self.names();
        names
            .iter()
            .filter(|k| match own.iter().find(|(name, _)| name == *k) {
                Some((_, exists)) => *exists,
                None => catalog.by_bytes.contains(*k),
            })
            .count()
    }

    /// How many streams exist, with `own` as its transaction left it.
    pub(crate) fn len_with(&self, own: Own<'_>) -> usize {
        let names = self.names();
        let mut n = names.by_bytes.len();
        for (name, exists) in own {
            match (exists, names.by_bytes.contains(name)) {
                (true, false) => n += 1,
                (false, true) => n -= 1,
                _ => {}
            }
        }
        n
    }

    /// `SCAN`'s page: the names from `cursor` on in `SCAN` order, about
    /// `count` of them, and the cursor after them (0 at the end), with
    /// `own` as its transaction left it (in the page if its position lies
    /// in the page's span). Only the page is copied out under the lock.
    pub(crate) fn page_with(&self, cursor: u64, count: usize, own: Own<'_>) -> (Vec<Bytes>, u64) {
        let (mut page, next) = self.names().page(cursor, count);
        let in_span = |name: &Bytes| {
            let position = scan_position(name);
            position >= cursor && (next == 0 || position < next)
        };
        overridden(&mut page, own, in_span, |n| (scan_position(n), n.clone()));
        (page, next)
    }

    /// Names matching `pattern`, in byte order, with `own` as its
    /// transaction left it.
    pub(crate) fn matching_with(&self, pattern: &[u8], own: Own<'_>) -> Vec<Bytes> {
        // Copied out under the lock (a count on each name's buffer), and
        // matched outside it: a pattern's cost is its length times each
        // name's, and every shard's making, deleting and lookup of a name
        // waits on this lock.
        let names: Vec<Bytes> = self.names().by_bytes.iter().cloned().collect();
        let mut found: Vec<Bytes> = names
            .into_iter()
            .filter(|n| glob_match(pattern, n, false))
            .collect();
        // Sorted outside the lock; the hash's order is never shown.
        found.sort_unstable();
        overridden(
            &mut found,
            own,
            |name| glob_match(pattern, name, false),
            Bytes::clone,
        );
        found
    }
}

/// `names` (sorted by `order`) as transaction `own` left them: its deleted
/// names taken out, and its made ones that `shown` admits put in, each
/// once. (Gathered, then sorted once: a transaction may name thousands.)
fn overridden<K: Ord>(
    names: &mut Vec<Bytes>,
    own: Own<'_>,
    shown: impl Fn(&Bytes) -> bool,
    order: impl FnMut(&Bytes) -> K,
) {
    let mut gone: Vec<&Bytes> = own.iter().filter(|o| !o.1).map(|o| &o.0).collect();
    if !gone.is_empty() {
        gone.sort_unstable();
        names.retain(|n| gone.binary_search(&n).is_err());
    }
    let before = names.len();
    names.extend(
        own.iter()
            .filter(|(name, exists)| *exists && shown(name))
            .map(|(name, _)| name.clone()),
    );
    if names.len() > before {
        names.sort_by_cached_key(order);
        names.dedup();
    }
}

/// What every session and stream actor of one broker shares.
#[derive(Debug)]
pub struct Shared {
    /// This broker among those of the process (finds its shard logs).
    pub(crate) id: u64,
    /// What each shard's log did with its durable writes under `always`
    /// (`INFO mailring`), by log number.
    pub(crate) flush_stats: Vec<Arc<crate::store::FlushStats>>,
    pub(crate) config: BrokerConfig,
    pub(crate) catalog: Catalog,
    pub(crate) next_client_id: AtomicU64,
    /// Connections open now.
    pub(crate) connected: AtomicU64,
    /// Connections refused past `maxclients` (`INFO`'s
    /// `rejected_connections`).
    pub(crate) rejected: AtomicU64,
    /// Error replies written (`INFO errorstats`, `total_error_replies`).
    pub(crate) errors: Arc<crate::resp::ErrorCounts>,
    /// Commands run, refused and failed, by command (`INFO
    /// commandstats`).
    pub(crate) command_stats: crate::command_stats::CommandStats,
    /// Their cards (`CLIENT LIST`, `CLIENT KILL`).
    pub(crate) clients: crate::session::Clients,
    /// Plain blocked readers of streams nobody had named, by name: the
    /// maker's actor adopts them (see [`Shared::await_making`]).
    pub(crate) awaiting: Mutex<crate::NameMap<Vec<crate::actor::Watcher>>>,
    /// Fired by `SHUTDOWN`.
    pub(crate) shutdown: Arc<crate::actor::Notify>,
    /// Set when the broker stops: blocked reads end, new ones do not block.
    pub(crate) closing: std::sync::atomic::AtomicBool,
    /// The wake-ups of blocked reads, to end them when the broker stops.
    pub(crate) blocked: Mutex<Vec<std::sync::Weak<crate::actor::Notify>>>,
    /// When the broker started.
    pub(crate) started: std::time::Instant,
    /// The address it listens on, once bound (`config.addr` may name port
    /// 0).
    pub(crate) bound: std::sync::OnceLock<SocketAddr>,
    pub(crate) system: SystemHandle,
    /// Streams read back at start, each taken by its actor's first command.
    pub(crate) recovered: Mutex<crate::NameMap<RecoveredStream>>,
    /// Bytes of entries the streams keep in memory, counted per shard.
    pub(crate) cached_bytes: Arc<CacheGauge>,
    /// `INFO`'s `run_id`: 40 hex digits, new at each start.
    pub(crate) run_id: String,
    /// The server's counters (bytes in and out), once it is bound.
    pub(crate) server_stats: std::sync::OnceLock<mailring_transports::StatsSource>,
    /// `INFO`'s instantaneous rates, sampled on shard 0.
    pub(crate) rates: crate::rates::Rates,
    /// The byte totals at the last `CONFIG RESETSTAT`.
    pub(crate) net_base: Mutex<(u64, u64)>,
    /// Client connections on each shard now (where their sessions run).
    pub(crate) sessions_on: Box<[AtomicUsize]>,
}

impl Shared {
    /// What [`crate::rates::Rates`] samples: commands, bytes in, bytes out.
    pub(crate) fn rate_totals(&self) -> crate::rates::Totals {
        let (bytes_in, bytes_out) = self.net_bytes();
        [self.clients.commands(), bytes_in, bytes_out]
    }

    /// Bytes read from and written to clients since the start or the
    /// last `CONFIG RESETSTAT`.
    pub(crate) fn net_bytes(&self) -> (u64, u64) {
        let (bytes_in, bytes_out) = self.net_bytes_ever();
        let base = *self.net_base.lock().unwrap_or_else(|p| p.into_inner());
        (
            bytes_in.saturating_sub(base.0),
            bytes_out.saturating_sub(base.1),
        )
    }

    /// Bytes read from and written to clients since the start.
    fn net_bytes_ever(&self) -> (u64, u64) {
        self.server_stats.get().map_or((0, 0), |source| {
            let stats = source.stats();
            (stats.total(|s| s.bytes_in), stats.total(|s| s.bytes_out))
        })
    }

    /// `CONFIG RESETSTAT`'s part: the byte totals start again at 0.
    pub(crate) fn reset_net_bytes(&self) {
        let now = self.net_bytes_ever();
        *self.net_base.lock().unwrap_or_else(|p| p.into_inner()) = now;
    }
}

/// A fresh `run_id`: 40 hex digits from the kernel's random source (the
/// clock and process id if it cannot be read).
fn new_run_id() -> String {
    use std::io::Read;
    let mut bytes = [0u8; 20];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    if read.is_err() {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        bytes[..16].copy_from_slice(&now.to_le_bytes());
        bytes[16..].copy_from_slice(&std::process::id().to_le_bytes());
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of entries the streams keep in memory: one counter per shard,
/// each on a line of its own, so the stream actors of one shard (which
/// update it after every command) never share a cache line with another
/// thread's writes. Readers sum them.
#[derive(Debug)]
pub(crate) struct CacheGauge {
    shards: Box<[PaddedCounter]>,
}

#[derive(Debug, Default)]
#[repr(align(128))]
struct PaddedCounter(AtomicU64);

impl CacheGauge {
    pub(crate) fn new(shards: usize) -> Self {
        CacheGauge {
            shards: (0..shards.max(1))
                .map(|_| PaddedCounter::default())
                .collect(),
        }
    }

    /// Adds `delta` (two's complement: a wrapped negative step takes bytes
    /// away) to the counter of the calling shard, or of the first one off
    /// every shard. A counter alone may wrap below zero (an actor counted on
    /// one shard and dropped on another); the sum never does.
    pub(crate) fn add(&self, delta: u64) {
        let at = mailring::current_shard().map_or(0, |s| s.index());
        let slot = &self.shards[at.min(self.shards.len() - 1)];
        slot.0.fetch_add(delta, Ordering::Relaxed);
    }

    /// The bytes kept now, all shards together.
    pub(crate) fn total(&self) -> u64 {
        self.shards
            .iter()
            .fold(0u64, |sum, c| sum.wrapping_add(c.0.load(Ordering::Relaxed)))
    }
}

/// Brokers started by this process (their ids).
static NEXT_BROKER: AtomicU64 = AtomicU64::new(1);

/// The running brokers, so a stream actor finds its broker from the id in
/// a message (once, at its first message).
static BROKERS: Mutex<Vec<(u64, std::sync::Weak<Shared>)>> = Mutex::new(Vec::new());

impl Shared {
    /// The running broker `id`.
    pub(crate) fn find(id: u64) -> Option<Arc<Shared>> {
        BROKERS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|(b, _)| *b == id)
            .and_then(|(_, w)| w.upgrade())
    }

    /// Blocked reads waiting now (`INFO`'s `blocked_clients`).
    pub(crate) fn blocked_reads(&self) -> usize {
        self.blocked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .filter(|n| !n.is_done())
            .count()
    }

    /// Index a blocked read's wake-up fires with when the broker stops.
    pub(crate) const CLOSING: usize = usize::MAX;
    /// Index a blocked read's wake-up fires with at `CLIENT UNBLOCK`
    /// (`TIMEOUT`: it answers as if its time ran out).
    pub(crate) const UNBLOCKED: usize = usize::MAX - 1;
    /// Index a blocked read's wake-up fires with at `CLIENT UNBLOCK ..
    /// ERROR`: it answers Redis's `UNBLOCKED` error.
    pub(crate) const UNBLOCKED_WITH_ERROR: usize = usize::MAX - 2;

    /// Ends every blocked read (they answer as if their time ran out) and
    /// keeps new ones from blocking.
    fn release_blocked(&self) {
        self.closing.store(true, Ordering::Release);
        let blocked = std::mem::take(&mut *self.blocked.lock().unwrap_or_else(|p| p.into_inner()));
        for n in blocked.iter().filter_map(std::sync::Weak::upgrade) {
            n.fire(Self::CLOSING);
        }
    }

    /// The address the broker listens on.
    pub(crate) fn listening_on(&self) -> SocketAddr {
        self.bound.get().copied().unwrap_or(self.config.addr)
    }

    fn register(shared: &Arc<Shared>) {
        let mut all = BROKERS.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|(_, w)| w.strong_count() > 0);
        all.push((shared.id, Arc::downgrade(shared)));
    }
}

/// A running broker: its runtime, actor system and listening server.
pub struct Broker {
    /// Samples `INFO`'s instantaneous rates; aborted as the broker stops.
    sampler: Option<mailring::JoinHandle<()>>,
    runtime: Option<mailring::Runtime>,
    system: Option<ActorSystem>,
    server: Option<Server<RespSession>>,
    addr: SocketAddr,
    id: u64,
    /// Each shard's log flusher.
    flushers: Vec<mailring::JoinHandle<io::Result<()>>>,
    /// Each shard's log directory (for the write-failed mark of a log
    /// found failed at the end).
    log_dirs: Vec<std::path::PathBuf>,
    durable: DurableFiles,
    recovery: RecoveryReport,
    /// Fired by a client's `SHUTDOWN`.
    shutdown: Arc<crate::actor::Notify>,
    /// What its sessions and actors share.
    shared: Arc<Shared>,
    /// The TLS side and its files, for a reload.
    tls: Option<(mailring_transports::tls::TlsAcceptor, TlsFiles)>,
}

/// What the broker found in its data directory at start.
#[derive(Debug, Clone, Default)]
pub struct RecoveryReport {
    /// Streams found (existing ones).
    pub streams: usize,
    /// Records replayed.
    pub records: u64,
    /// Bytes of valid records read.
    pub bytes: u64,
    /// Segments whose torn or corrupt tails were cut, with the bytes cut.
    pub cut: Vec<(std::path::PathBuf, u64)>,
    /// Copies of the cut tails that held more than zeros (a crash's
    /// unfinished or out-of-order write, or damaged data that may have
    /// held acknowledged writes), kept in the data directory's `salvage/`.
    pub saved: Vec<std::path::PathBuf>,
    /// How long recovery took.
    pub elapsed: std::time::Duration,
    /// Whether the logs were rewritten for this shard count.
    pub migrated: bool,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker").field("addr", &self.addr).finish()
    }
}

impl Broker {
    /// Starts a broker: a runtime of `config.shards` shards, its actor
    /// system, and the server listening on `config.addr`. The process's
    /// soft descriptor limit is raised as far as `config.max_clients`
    /// needs and the hard limit allows, and `max_clients` lowered to fit
    /// if it cannot be (as Redis does; a warning on stderr says so).
    ///
    /// # Errors
    ///
    /// The runtime's start-up error (no io_uring), the bind's, or (as
    /// `InvalidInput`) TLS files that do not load.
    pub fn start(mut config: BrokerConfig) -> io::Result<Broker> {
        // Before anything touches the data directory: a bad certificate
        // stops the start at once.
        let tls = match &config.tls {
            Some(files) => Some(
                mailring_transports::tls::TlsAcceptor::from_pem_files(&files.cert, &files.key)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?,
            ),
            None => None,
        };
        let shards = config.shards.clamp(1, usize::from(u16::MAX));
        let fit = fit_descriptor_limit(config.max_clients, shards);
        if let Some(warning) = &fit.warning {
            eprintln!("mailring-broker: {warning}");
        }
        config.max_clients = fit.clients;
        let mut recovered = store::recover(
            &config.store.dir,
            shards,
            config.store.segment_bytes,
            config.store.stream_cache_bytes,
            config.store.repair_log,
        )?;
        let recovery = RecoveryReport {
            streams: recovered
                .streams
                .values()
                .filter(|s| s.stream.is_some())
                .count(),
            records: recovered.records,
            bytes: recovered.bytes,
            cut: recovered.cut.clone(),
            saved: recovered.saved.clone(),
            elapsed: recovered.elapsed,
            migrated: recovered.migrated,
        };
        let mut builder = mailring::Runtime::builder().shards(shards);
        let spin = config
            .idle_spin
            .or_else(|| default_idle_spin(config.store.fsync, config.cpus.is_some()));
        if let Some(spin) = spin {
            builder = builder.idle_policy(if spin.is_zero() {
                mailring::IdlePolicy::Block
            } else {
                mailring::IdlePolicy::Spin(spin)
            });
        }
        if let Some(cpus) = &config.cpus {
            builder = builder.pin_to_cpus(cpus.iter().copied());
        }
        let runtime = builder
            .build()
            .map_err(|e| io::Error::other(format!("starting the runtime: {e}")))?;
        let system = ActorSystem::start_on(runtime.handle(), SystemConfig::default())
            .map_err(|e| io::Error::other(format!("starting the actor system: {e}")))?;
        // Each recovered stream back on the shard whose log holds it
        // (deleted ones too: their last records are there), before any
        // connection can route one elsewhere.
        for (name, s) in &recovered.streams {
            let log = usize::from(s.log);
            let placed = system
                .handle()
                .place::<StreamActor>(name.clone(), mailring::ShardId::new(log))
                .map_err(|e| io::Error::other(format!("placing recovered stream: {e}")))?;
            if placed.index() != log {
                // Its records would go to two logs: refuse to serve.
                return Err(io::Error::other(format!(
                    "stream {:?} was routed to shard {} before recovery placed it on {log}",
                    String::from_utf8_lossy(name),
                    placed.index()
                )));
            }
        }
        let id = NEXT_BROKER.fetch_add(1, Ordering::Relaxed);
        let catalog = Catalog::default();
        for (name, s) in &recovered.streams {
            if s.stream.is_some() {
                catalog.insert(name, None);
            }
        }
        let durable = DurableFiles::default();
        let mut starts: Vec<LogStart> = (0..shards).map(|_| LogStart::default()).collect();
        for (log_no, segments) in &recovered.segments {
            if let Some(start) = starts.get_mut(usize::from(*log_no)) {
                start.segments.clone_from(segments);
            }
        }
        let small = store::small_stream_bytes(config.store.segment_bytes);
        for (name, s) in recovered.streams.iter_mut() {
            let Some(start) = starts.get_mut(usize::from(s.log)) else {
                continue;
            };
            match s.need(small) {
                Some(need) => start.needs.push((name.clone(), need)),
                // Deleted, its records still on disk: the log keeps
                // knowing it (its operation numbers go on).
                None => start.deleted.push((name.clone(), s.op_no)),
            }
        }
        let mut flushers = Vec::with_capacity(shards);
        let log_dirs: Vec<std::path::PathBuf> = (0..shards)
            .map(|shard| recovered.dir.join(crate::log::log_dir_name(shard as u16)))
            .collect();
        let flush_stats: Vec<Arc<store::FlushStats>> =
            (0..shards).map(|_| Arc::default()).collect();
        for (shard, start) in starts.into_iter().enumerate() {
            let log_no = shard as u16;
            let store_config = config.store.clone();
            let gen_dir = recovered.dir.clone();
            let durable = durable.clone();
            let stats = flush_stats[shard].clone();
            let actors = system.handle();
            flushers.push(runtime.handle().spawn_local_on(
                mailring::ShardId::new(shard),
                move || async move {
                    let log = ShardLog::new(&gen_dir, log_no, &store_config, durable, start, stats);
                    log.on_lagging(move |names| {
                        for name in names {
                            let _ = actors
                                .keyed::<StreamActor>(name)
                                .tell(crate::actor::Checkpoint { broker: id });
                        }
                    });
                    store::register(id, log.clone());
                    let res = log.clone().run().await;
                    store::unregister(id);
                    res
                },
            ));
        }
        let shutdown = crate::actor::Notify::new();
        let shared = Arc::new(Shared {
            flush_stats,
            cached_bytes: Arc::new(CacheGauge::new(shards)),
            id,
            config: config.clone(),
            catalog,
            next_client_id: AtomicU64::new(0),
            connected: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            errors: Arc::default(),
            command_stats: crate::command_stats::CommandStats::new(shards),
            clients: crate::session::Clients::default(),
            awaiting: Mutex::new(crate::NameMap::default()),
            shutdown: shutdown.clone(),
            closing: std::sync::atomic::AtomicBool::new(false),
            blocked: Mutex::new(Vec::new()),
            started: std::time::Instant::now(),
            bound: std::sync::OnceLock::new(),
            system: system.handle(),
            recovered: Mutex::new(recovered.streams),
            run_id: new_run_id(),
            server_stats: std::sync::OnceLock::new(),
            rates: crate::rates::Rates::default(),
            net_base: Mutex::new((0, 0)),
            sessions_on: (0..shards).map(|_| AtomicUsize::new(0)).collect(),
        });
        Shared::register(&shared);
        let broker_shared = shared.clone();
        let mut server_config = ServerConfig::default();
        // As Redis frees a blocked client whose socket reads 0: a reader
        // blocked that goes away is dropped, once the replies before its
        // read are written.
        server_config.on_peer_close = mailring_transports::PeerClose::CloseWhileBlocked;
        // Redis puts no time limit on a request arriving (`timeout 0`): a
        // large value over a slow link may take minutes.
        server_config.frame_timeout = None;
        server_config.max_clients = Some(config.max_clients);
        // Each listener pauses past what the broker serves plus room for
        // the refusals in flight (a flood is told, and still bounded), or
        // at its share of the descriptors there are.
        server_config.max_connections = fit.per_listener;
        let mut server = Server::builder(
            RespCodec::new().counting_errors(shared.errors.clone()),
            move |_| RespSession::new(shared.clone()),
        )
        .config(server_config)
        .follow::<StreamActor>(system.handle());
        if let Some(acceptor) = &tls {
            server = server.tls(acceptor.clone());
        }
        let server = server.bind(runtime.handle(), config.addr)?;
        let addr = server.local_addr();
        let _ = broker_shared.bound.set(addr);
        let _ = broker_shared.server_stats.set(server.stats_source());
        // The instantaneous rates, sampled on shard 0 until the broker stops.
        let sampled = broker_shared.clone();
        let sampler = runtime
            .handle()
            .spawn_on(mailring::ShardId::new(0), async move {
                loop {
                    mailring::time::sleep(crate::rates::SAMPLE_EVERY).await;
                    sampled
                        .rates
                        .sample(std::time::Instant::now(), sampled.rate_totals());
                }
            });
        Ok(Broker {
            runtime: Some(runtime),
            system: Some(system),
            server: Some(server),
            addr,
            id,
            flushers,
            log_dirs,
            durable,
            recovery,
            shutdown,
            shared: broker_shared,
            tls: tls.zip(config.tls.clone()),
            sampler: Some(sampler),
        })
    }

    /// What recovery found at start.
    pub fn recovery(&self) -> &RecoveryReport {
        &self.recovery
    }

    /// Each segment file written by this broker with the length a power
    /// loss now would leave of it (covered by a completed flush): crash
    /// tests cut the files to these lengths before restarting.
    pub fn durable_files(&self) -> HashMap<std::path::PathBuf, u64> {
        self.durable.snapshot()
    }

    /// Each segment file written by this broker with the length of the
    /// records written to it, flushed or not.
    pub fn written_files(&self) -> HashMap<std::path::PathBuf, u64> {
        self.durable.written()
    }

    /// [`written_files`](Self::written_files) and
    /// [`durable_files`](Self::durable_files) at one moment (a segment
    /// another shard makes or removes meanwhile is in both or neither's
    /// durable side alone).
    #[allow(clippy::type_complexity)]
    pub fn written_and_durable_files(
        &self,
    ) -> (
        HashMap<std::path::PathBuf, u64>,
        HashMap<std::path::PathBuf, u64>,
    ) {
        self.durable.written_and_durable()
    }

    /// Puts stream `name` on shard `shard` ahead of its first use, unless
    /// it lives somewhere already; returns the shard it lives on. A stream
    /// otherwise lives on the shard of the connection that first names it.
    ///
    /// # Errors
    ///
    /// A shard past the last.
    pub fn place_stream(&self, name: &[u8], shard: usize) -> Result<usize, PlaceError> {
        self.shared
            .system
            .place::<StreamActor>(Bytes::copy_from_slice(name), mailring::ShardId::new(shard))
            .map(|s| s.index())
    }

    /// Wake-ups of blocked reads still held, by a reader waiting or by a
    /// stream actor watching for it (one per blocked read, however many
    /// streams it names).
    pub fn held_read_wakeups(&self) -> usize {
        self.shared
            .blocked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|w| w.strong_count() > 0)
            .count()
    }

    /// Blocked readers waiting for the making of a stream nobody had
    /// named (none once they are served or gave up).
    pub fn awaiting_makings(&self) -> usize {
        self.shared.awaiting_makings()
    }

    /// Stream names recorded in the placement directory (every name routed
    /// to a stream actor, existing or not).
    pub fn placed_streams(&self) -> usize {
        self.shared.system.directory_len::<StreamActor>()
    }

    /// The streams whose actors are active now, on every shard.
    pub fn active_streams(&self) -> usize {
        let rt = self.runtime.as_ref().expect("running until shutdown");
        let system = self.shared.system.clone();
        let shards = rt.handle().shards();
        rt.block_on(async move {
            let mut n = 0;
            for s in 0..shards {
                n += system
                    .live_keys::<StreamActor>(mailring::ShardId::new(s))
                    .await
                    .len();
            }
            n
        })
    }

    /// How many closures sessions ran on idle stream actors of their
    /// shards (`Addr::run_now`: no ask), on every shard: each runs one
    /// command, or a stream's part of a pipelined run, up to the first
    /// that must read evicted entries back (a closure that meets one
    /// first runs nothing and leaves it to a message, and still counts).
    pub fn streams_run_at_once(&self) -> u64 {
        let rt = self.runtime.as_ref().expect("running until shutdown");
        let system = self.shared.system.clone();
        rt.block_on(async move {
            system
                .stats()
                .await
                .by_type("StreamActor")
                .map_or(0, |s| s.ran_now)
        })
    }

    /// Client connections on each shard now, by shard index.
    pub fn sessions_by_shard(&self) -> Vec<usize> {
        self.shared
            .sessions_on
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .collect()
    }

    /// The index of the shard whose log and actor own stream `name` (where
    /// its connections attach).
    pub fn shard_of_stream(&self, name: &[u8]) -> usize {
        self.shared
            .system
            .shard_of::<StreamActor>(&Bytes::copy_from_slice(name))
            .index()
    }

    /// Reads the TLS certificate and key files again: connections from now
    /// on get the new certificate, those open keep theirs. On an error the
    /// certificate in use stays. The binary does this on SIGHUP.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for a broker without TLS; the files' error.
    pub fn reload_tls(&self) -> io::Result<()> {
        let (acceptor, files) = self.tls.as_ref().ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "this broker serves no TLS")
        })?;
        acceptor
            .reload_pem_files(&files.cert, &files.key)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
    }

    /// The address it listens on (the port chosen for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Blocks until Ctrl-C (SIGINT), SIGTERM, or a client's `SHUTDOWN`.
    /// A TLS broker reloads its certificate on SIGHUP meanwhile
    /// ([`reload_tls`](Self::reload_tls)) and says how it went on stderr.
    ///
    /// # Errors
    ///
    /// The error of installing the signal handlers.
    pub fn wait_for_signal(&self) -> io::Result<()> {
        use mailring::signal::{signal, SignalKind};
        let rt = self.runtime.as_ref().expect("running until shutdown");
        let mut int = signal(SignalKind::interrupt())?;
        let mut term = signal(SignalKind::terminate())?;
        // Only a TLS broker asks for SIGHUP (elsewhere it keeps its default).
        let mut hup = match self.tls {
            Some(_) => Some(signal(SignalKind::hangup())?),
            None => None,
        };
        let shutdown = self.shutdown.clone();
        let tls = self.tls.clone();
        rt.block_on(async move {
            loop {
                let reload = {
                    let mut a = std::pin::pin!(int.recv());
                    let mut b = std::pin::pin!(term.recv());
                    let mut c = std::pin::pin!(shutdown.fired());
                    let mut h = std::pin::pin!(async {
                        match hup.as_mut() {
                            Some(h) => h.recv().await,
                            None => std::future::pending().await,
                        }
                    });
                    std::future::poll_fn(|cx| {
                        if a.as_mut().poll(cx).is_ready()
                            || b.as_mut().poll(cx).is_ready()
                            || c.as_mut().poll(cx).is_ready()
                        {
                            std::task::Poll::Ready(false)
                        } else if h.as_mut().poll(cx).is_ready() {
                            std::task::Poll::Ready(true)
                        } else {
                            std::task::Poll::Pending
                        }
                    })
                    .await
                };
                if !reload {
                    return;
                }
                if let Some((acceptor, files)) = &tls {
                    match acceptor.reload_pem_files(&files.cert, &files.key) {
                        Ok(()) => eprintln!("broker: TLS certificate reloaded"),
                        Err(e) => eprintln!(
                            "broker: TLS reload failed, the certificate in use stays: {e}"
                        ),
                    }
                }
            }
        });
        Ok(())
    }

    /// Stops accepting, lets connections finish within the grace period,
    /// and stops the actors and the runtime. A log whose last flush fails
    /// is said on stderr; [`shutdown_checked`](Self::shutdown_checked)
    /// gives it back.
    pub fn shutdown(mut self) {
        let _ = self.stop();
    }

    /// As [`shutdown`](Self::shutdown), giving back the error of a log
    /// whose flush of what was appended failed at the end (what it held
    /// may not be on disk; the process should say so in its exit status,
    /// as redis-server refuses to stop on a failed save).
    ///
    /// # Errors
    ///
    /// The first log's flush error, with its shard.
    pub fn shutdown_checked(mut self) -> std::io::Result<()> {
        self.stop()
    }

    fn stop(&mut self) -> std::io::Result<()> {
        let mut failed = Ok(());
        // Blocked reads are idle, not work in flight: they end now, so the
        // grace period waits only for real work.
        self.shared.release_blocked();
        if let Some(sampler) = self.sampler.take() {
            sampler.abort();
        }
        if let (Some(server), Some(rt)) = (self.server.take(), self.runtime.as_ref()) {
            rt.block_on(server.shutdown());
        }
        if let Some(system) = self.system.take() {
            let _ = system.shutdown();
        }
        // The logs flush what the actors appended, then their flushers end.
        if let Some(rt) = self.runtime.as_ref() {
            let id = self.id;
            for shard in 0..rt.handle().shards() {
                let closer =
                    rt.handle()
                        .spawn_local_on(mailring::ShardId::new(shard), move || async move {
                            if let Some(log) = store::shard_log(id) {
                                log.close();
                            }
                        });
                let _ = rt.block_on(closer);
            }
            for (shard, f) in self.flushers.drain(..).enumerate() {
                let e = match rt.block_on(f) {
                    Ok(Ok(())) => continue,
                    Ok(Err(e)) => e,
                    // Its flusher panicked, or was dropped: what it held
                    // is not known to be on disk.
                    Err(e) => std::io::Error::other(e.to_string()),
                };
                eprintln!("broker: the log of shard {shard} failed: {e}");
                // Marked as its flusher would have (it may have been stopped
                // before, or panicked): the next start writes its last
                // segment again before it builds on it.
                if let Some(dir) = self.log_dirs.get(shard) {
                    crate::store::mark_write_failed_now(dir);
                }
                if failed.is_ok() {
                    failed = Err(std::io::Error::new(
                        e.kind(),
                        format!("the log of shard {shard} failed (what it held may not be on disk): {e}"),
                    ));
                }
            }
        }
        if let Some(rt) = self.runtime.take() {
            let _ = rt.shutdown();
        }
        failed
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// The idle spin when none is set (see [`BrokerConfig::idle_spin`]):
/// `Some(ZERO)`, block at once, under `always` with unpinned shards;
/// `None`, the runtime's spin, otherwise.
fn default_idle_spin(fsync: crate::store::Fsync, pinned: bool) -> Option<std::time::Duration> {
    (fsync == crate::store::Fsync::Always && !pinned).then_some(std::time::Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use super::{default_idle_spin, Broker, BrokerConfig, CacheGauge, Names, Shared};
    use bytes::Bytes;
    use std::sync::Arc;

    #[test]
    fn a_transaction_s_own_names_override_the_catalog_in_keys_and_scan_pages() {
        // Thousands of names of a transaction over a catalog: what KEYS
        // and every SCAN page show is the catalog with the transaction's
        // names made or deleted, each once, in order.
        let catalog = super::Catalog::default();
        let name = |i: usize| Bytes::from(format!("n{i:05}"));
        for i in (0..3000).step_by(2) {
            catalog.insert(&name(i), None);
        }
        // Every third name made (even ones exist already), every fifth
        // even one deleted.
        let own: Vec<(Bytes, bool)> = (0..3000)
            .filter(|i| i % 3 == 0 || i % 10 == 0)
            .map(|i| (name(i), i % 10 != 0))
            .collect();
        let exists = |i: usize| (i % 2 == 0 || i % 3 == 0) && i % 10 != 0;
        let want: Vec<Bytes> = (0..3000).filter(|i| exists(*i)).map(name).collect();
        assert_eq!(catalog.matching_with(b"*", &own), want);
        assert_eq!(catalog.len_with(&own), want.len());
        let some: Vec<Bytes> = want.iter().filter(|n| n.ends_with(b"7")).cloned().collect();
        assert_eq!(catalog.matching_with(b"*7", &own), some);
        let mut seen = Vec::new();
        let mut cursor = 0;
        loop {
            let (page, next) = catalog.page_with(cursor, 100, &own);
            let positions: Vec<u64> = page.iter().map(|n| super::scan_position(n)).collect();
            assert!(positions.windows(2).all(|w| w[0] <= w[1]), "in order");
            assert!(positions
                .iter()
                .all(|p| *p >= cursor && (next == 0 || *p < next)));
            seen.extend(page);
            if next == 0 {
                break;
            }
            cursor = next;
        }
        seen.sort();
        assert_eq!(seen, want, "every name once");
    }

    #[test]
    fn a_stopped_broker_leaves_nothing_of_itself_behind() {
        let dir = std::env::temp_dir().join(format!(
            "mailring-broker-unit-{}-{}",
            std::process::id(),
            line!()
        ));
        let mut config = BrokerConfig {
            addr: "127.0.0.1:0".parse().unwrap(),
            ..BrokerConfig::default()
        };
        config.store.dir = dir.clone();
        let broker = Broker::start(config).expect("start the broker (needs io_uring)");
        let id = broker.id;
        let shared = Arc::downgrade(&Shared::find(id).expect("registered"));
        // INFO's byte totals read the server (its stats source).
        assert_eq!(broker.shared.net_bytes(), (0, 0));
        broker.shutdown();
        // Nothing holds its state in a cycle (the server's counters are
        // read through a weak handle).
        assert!(Shared::find(id).is_none());
        assert_eq!(shared.strong_count(), 0);
        let _ = std::fs::remove_dir_all(dir);
    }

    fn names_at(positions: &[(u64, &str)]) -> Names {
        let mut names = Names::default();
        for &(p, n) in positions {
            names.by_bytes.insert(Bytes::copy_from_slice(n.as_bytes()));
            names
                .by_position
                .insert((p, Bytes::copy_from_slice(n.as_bytes())));
        }
        names
    }

    fn texts(page: &[Bytes]) -> Vec<&str> {
        page.iter()
            .map(|b| std::str::from_utf8(b).unwrap())
            .collect()
    }

    #[test]
    fn a_scan_page_never_splits_a_position_and_its_cursor_is_the_next_position() {
        let names = names_at(&[
            (1, "a"),
            (5, "b"),
            (5, "c"),
            (5, "d"),
            (9, "e"),
            (u64::MAX, "z"),
        ]);
        let (page, next) = names.page(0, 2);
        assert_eq!((texts(&page), next), (vec!["a", "b", "c", "d"], 6));
        let (page, next) = names.page(next, 1);
        assert_eq!((texts(&page), next), (vec!["e"], 10));
        let (page, next) = names.page(next, 1);
        assert_eq!((texts(&page), next), (vec!["z"], 0));
        // A cursor between positions goes on from the next one; past
        // every name it is the end; COUNT 0 still moves on.
        let (page, next) = names.page(3, 10);
        assert_eq!((texts(&page), next), (vec!["b", "c", "d", "e", "z"], 0));
        assert_eq!(names.page(u64::MAX, 10).0.len(), 1);
        assert_eq!(names_at(&[(1, "a")]).page(2, 10), (Vec::new(), 0));
        let (page, next) = names.page(0, 0);
        assert_eq!((texts(&page), next), (vec!["a"], 2));
    }

    #[test]
    fn scan_positions_are_never_zero_and_never_wrap_the_cursor() {
        for name in [&b""[..], b"a", b"\x00", &[0xff; 70]] {
            let p = super::scan_position(name);
            assert!((1..=1u64 << 63).contains(&p), "{p}");
        }
    }

    #[test]
    fn the_cache_gauge_sums_every_shard_s_and_every_other_thread_s_steps() {
        const STEPS: u64 = 20_000;
        const OFF_STEPS: u64 = 1_000_000;
        let gauge = Arc::new(CacheGauge::new(2));
        let start = Arc::new(std::sync::Barrier::new(2));
        let rt = mailring::Runtime::builder()
            .shards(2)
            .build()
            .expect("io_uring available");
        let off: Vec<_> = (0..2)
            .map(|_| {
                let (gauge, start) = (gauge.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    for _ in 0..OFF_STEPS {
                        gauge.add(3);
                        gauge.add(1u64.wrapping_neg());
                    }
                })
            })
            .collect();
        let handle = rt.handle().clone();
        let g = gauge.clone();
        rt.block_on(async move {
            let tasks: Vec<_> = (0..2)
                .map(|s| {
                    let g = g.clone();
                    handle.spawn_on(mailring::ShardId::new(s), async move {
                        for i in 0..STEPS {
                            g.add(2);
                            if i % 64 == 0 {
                                mailring::yield_now().await;
                            }
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
        });
        for t in off {
            t.join().unwrap();
        }
        assert_eq!(gauge.total(), 2 * STEPS * 2 + 2 * OFF_STEPS * 2);
    }

    #[test]
    fn unpinned_shards_block_under_always_and_every_other_setup_spins() {
        use crate::store::Fsync;
        let block = Some(std::time::Duration::ZERO);
        assert_eq!(default_idle_spin(Fsync::Always, false), block);
        assert_eq!(default_idle_spin(Fsync::Always, true), None);
        for fsync in [Fsync::EverySec, Fsync::No] {
            assert_eq!(default_idle_spin(fsync, false), None);
            assert_eq!(default_idle_spin(fsync, true), None);
        }
    }
}
