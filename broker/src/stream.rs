//! One stream's entries and ids, as Redis keeps them: ids only grow, even
//! past deleted and trimmed entries; `entries_added` counts every append;
//! trimming by length or by id, exact or approximate.

use std::collections::{BTreeMap, VecDeque};

use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use crate::group::{Consumer, Group, Nack};
use crate::id::{AddId, StreamId};
use crate::log::{Loc, Op};
use crate::resp::Reply;
use crate::store::reader::SegmentSource;

pub use crate::fields::Fields;

mod entries;

use entries::Entries;

/// Entries per node at most (Redis's `stream-node-max-entries`). Redis
/// keeps a stream as a radix tree of nodes and an approximate trim (`~`)
/// removes only whole nodes; this stream keeps the same node boundaries
/// (by count, and by an estimate of Redis's encoded size) so `~` removes
/// what Redis would.
pub const NODE_MAX_ENTRIES: u32 = 100;
/// Bytes per node at most (Redis's `stream-node-max-bytes`), against the
/// size Redis's listpack encoding would give it.
pub const NODE_MAX_BYTES: u64 = 4096;

/// Pushes `item` onto `queue`, making room for it alone in an empty one:
/// a `VecDeque`'s first growth makes room for four, and most streams hold
/// one element of each such queue (one node, one chunk of entries, one run
/// of entries in one log segment) for as long as they live.
pub(crate) fn push_back_sparingly<T>(queue: &mut VecDeque<T>, item: T) {
    if queue.capacity() == 0 {
        queue.reserve_exact(1);
    }
    queue.push_back(item);
}

/// One node's worth of entries, as Redis would group them.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Node {
    /// Entries ever put in it (deleted ones keep their slot).
    total: u32,
    /// Entries still there.
    live: u32,
    /// Its listpack's size, as Redis's encoding would make it.
    bytes: u64,
    /// Its last element's id (live or deleted).
    last: StreamId,
    /// Its first entry's id (Redis's master id).
    master_id: StreamId,
    /// Its first entry's field names (Redis's master fields).
    master_fields: Vec<Bytes>,
}

/// Nodes of a compressed trie holding `keys` (sorted, distinct, sharing
/// their first `depth` bytes) below `depth`.
fn radix_nodes(keys: &[[u8; 16]], depth: usize) -> usize {
    if depth == 16 {
        // The key's own (empty) node.
        return 1;
    }
    if keys.len() == 1 {
        // The rest of the key in one compressed node, then the key's node.
        return 2;
    }
    // Sorted: what the first and last share, all share.
    let (first, last) = (&keys[0], &keys[keys.len() - 1]);
    let mut split = depth;
    while first[split] == last[split] {
        split += 1;
    }
    // The shared bytes (if any) in one compressed node, then the branch.
    let mut n = usize::from(split > depth) + 1;
    let mut rest = keys;
    while let Some(k) = rest.first() {
        let byte = k[split];
        let same = rest.partition_point(|x| x[split] == byte);
        n += radix_nodes(&rest[..same], split + 1);
        rest = &rest[same..];
    }
    n
}

/// Sizes of Redis's listpack encoding, for the node boundaries.
mod listpack {
    use bytes::Bytes;

    use super::Fields;
    use crate::id::StreamId;

    fn int_len(v: i64) -> u64 {
        match v {
            0..=127 => 1,
            -4096..=4095 => 2,
            -32768..=32767 => 3,
            -8_388_608..=8_388_607 => 4,
            _ if i32::try_from(v).is_ok() => 5,
            _ => 9,
        }
    }

    fn back_len(l: u64) -> u64 {
        match l {
            0..=127 => 1,
            128..=16382 => 2,
            16383..=2_097_150 => 3,
            2_097_151..=268_435_454 => 4,
            _ => 5,
        }
    }

    fn int_element(v: i64) -> u64 {
        let e = int_len(v);
        e + back_len(e)
    }

    /// A string that listpack stores as an integer (canonical decimal,
    /// as Redis's `string2ll` reads it).
    fn canonical_int(b: &[u8]) -> Option<i64> {
        crate::resp::parse_int(b)
    }

    fn str_element(b: &[u8]) -> u64 {
        if let Some(v) = canonical_int(b) {
            return int_element(v);
        }
        let n = b.len() as u64;
        let e = match n {
            0..=63 => 1 + n,
            64..=4095 => 2 + n,
            _ => 5 + n,
        };
        e + back_len(e)
    }

    /// A new node's header and master entry.
    pub(super) fn node_bytes(field_names: &[Bytes]) -> u64 {
        7 + int_element(1)
            + int_element(0)
            + int_element(field_names.len() as i64)
            + field_names.iter().map(|f| str_element(f)).sum::<u64>()
            + int_element(0)
    }

    /// One entry appended to a node with this master.
    pub(super) fn entry_bytes(
        master_id: StreamId,
        master_fields: &[Bytes],
        id: StreamId,
        fields: &Fields,
    ) -> u64 {
        let n = fields.len() / 2;
        // One walk over the elements: whether the names are the master's,
        // and the values' sizes (the names' are needed only when not).
        let mut same = n == master_fields.len();
        let mut values = 0;
        for (i, e) in fields.iter().enumerate() {
            if i % 2 == 1 {
                values += str_element(e);
            } else if same && master_fields.get(i / 2).is_none_or(|m| e != m) {
                same = false;
            }
        }
        let mut bytes = int_element(if same { 2 } else { 0 })
            + int_element(id.ms.wrapping_sub(master_id.ms) as i64)
            + int_element(id.seq.wrapping_sub(master_id.seq) as i64);
        if !same {
            bytes += int_element(n as i64);
            bytes += fields.names().map(str_element).sum::<u64>();
        }
        bytes += values;
        let lp_count = n + 3 + if same { 0 } else { n + 1 };
        bytes + int_element(lp_count as i64)
    }
}

/// Error for `XADD` when the stream's last id is the largest.
pub const EXHAUSTED: &str =
    "ERR The stream has exhausted the last possible ID, unable to add more items";
/// Error for `XADD` whose entry Redis cannot store; also what Redis 7.0
/// answers for `ms-*` past the millisecond's last sequence.
pub const TOO_LARGE: &str = "ERR Elements are too large to be stored";
/// Error for `XADD` with an id not above the last one.
pub const ID_TOO_SMALL: &str =
    "ERR The ID specified in XADD is equal or smaller than the target stream top item";

/// How to trim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrimTo {
    /// Keep at most this many entries (`MAXLEN`).
    MaxLen(u64),
    /// Remove entries below this id (`MINID`).
    MinId(StreamId),
}

/// A trim request (`XTRIM`, or `XADD`'s trim options).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trim {
    /// The target.
    pub to: TrimTo,
    /// `~`: only whole nodes (see [`NODE_MAX_ENTRIES`]).
    pub approx: bool,
    /// `LIMIT`: the most entries removed (approximate trims only); `None`
    /// means Redis's default of 100 nodes for `~`, no limit for `=`.
    pub limit: Option<u64>,
}

/// One entry: where its record is, its size, and its fields while they
/// are in memory.
#[derive(Debug, Clone, Default)]
struct Slot {
    /// The record that holds it ([`Loc::NONE`] until appended).
    loc: Loc,
    /// Bytes of its fields and values.
    raw: u32,
    /// Its fields, unless evicted (then read back through `loc`).
    fields: Option<Fields>,
}

/// A stream's cached tail may pass its budget by 1/this before entries
/// are evicted (see [`Stream::settle`]).
pub const EVICT_MARGIN: u64 = 16;

/// Bytes an entry's fields take in memory, as the cache counts them:
/// their buffer and the entry's place in the stream's map.
fn cost(fields: &Fields) -> u64 {
    fields.heap_bytes() + 64
}

/// Entries read back from segments because a command needed them and
/// they were not fetched ahead (blocking reads on the shard's thread).
pub static BLOCKING_READS: AtomicU64 = AtomicU64::new(0);

/// One stream.
///
/// Its newest entries keep their fields in memory, up to a budget
/// ([`Stream::settle`]); older ones keep only the place of their record
/// in the log and are read back when a command needs them: fetched ahead
/// by the stream's actor ([`Stream::missing_in_range`], [`Stream::lend`]),
/// or, for what was not fetched, read with a blocking read from the
/// stream's [`SegmentSource`].
#[derive(Debug, Clone, Default)]
pub struct Stream {
    entries: Entries<Slot>,
    /// Entries from this id on keep their fields (the cached tail).
    cache_from: StreamId,
    /// What the cached tail costs ([`cost`]).
    cached: u64,
    /// Entries below `cache_from` whose fields were fetched for the
    /// command running now (dropped again at [`Stream::settle`]).
    lent: Vec<StreamId>,
    /// Where evicted entries are read back from.
    source: Option<Arc<SegmentSource>>,
    /// Node boundaries, oldest first.
    nodes: VecDeque<Node>,
    last_id: StreamId,
    max_deleted_id: StreamId,
    entries_added: u64,
    /// Bytes of the live entries' fields and values.
    live_bytes: u64,
    /// Consumer groups by name.
    pub groups: BTreeMap<Bytes, Group>,
}

/// Bytes of an entry's fields and values.
fn raw_bytes(fields: &Fields) -> u64 {
    fields.data_bytes()
}

impl Stream {
    /// An empty stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Entries in the stream.
    pub fn len(&self) -> u64 {
        self.entries.len() as u64
    }

    /// Whether it has no entries (it still exists, with its ids).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The largest id ever added (or set by `XSETID`).
    pub fn last_id(&self) -> StreamId {
        self.last_id
    }

    /// The largest id deleted or trimmed away.
    pub fn max_deleted_id(&self) -> StreamId {
        self.max_deleted_id
    }

    /// Entries ever added.
    pub fn entries_added(&self) -> u64 {
        self.entries_added
    }

    /// Bytes of the live entries' fields and values.
    pub fn live_bytes(&self) -> u64 {
        self.live_bytes
    }

    /// The first entry's id, if any.
    pub fn first_entry_id(&self) -> Option<StreamId> {
        self.entries.first().map(|(k, _)| k)
    }

    /// The last entry's id, if any.
    pub fn last_entry_id(&self) -> Option<StreamId> {
        self.entries.last().map(|(k, _)| k)
    }

    /// The first entry, if any.
    pub fn first(&self) -> Option<(StreamId, Fields)> {
        let id = self.first_entry_id()?;
        self.get(id).map(|f| (id, f))
    }

    /// The last entry, if any.
    pub fn last(&self) -> Option<(StreamId, Fields)> {
        let id = self.last_entry_id()?;
        self.get(id).map(|f| (id, f))
    }

    /// Whether entry `id` exists.
    pub fn contains(&self, id: StreamId) -> bool {
        self.entries.contains(id)
    }

    /// The entry `id` (read back from its segment if it was evicted).
    pub fn get(&self, id: StreamId) -> Option<Fields> {
        let slot = self.entries.get(id)?;
        match &slot.fields {
            Some(f) => Some(f.clone()),
            None => self.read_back(&[(id, slot.loc)]).pop().map(|(_, f)| f),
        }
    }

    /// Reads evicted entries back with blocking reads. A stream's own log
    /// failing to give back what it wrote leaves nothing sound to answer
    /// with: this panics (the actor's supervisor restarts it, and it
    /// rebuilds from the log, or stops).
    fn read_back(&self, wanted: &[(StreamId, Loc)]) -> Vec<(StreamId, Fields)> {
        BLOCKING_READS.fetch_add(wanted.len() as u64, Ordering::Relaxed);
        let Some(source) = &self.source else {
            panic!("an evicted entry and no segments to read it from");
        };
        match source.read(wanted) {
            Ok(found) => found,
            Err(e) => panic!("reading entries back from the log failed: {e}"),
        }
    }

    /// Where evicted entries are read back from.
    pub fn set_source(&mut self, source: Arc<SegmentSource>) {
        self.source = Some(source);
    }

    /// Whether it has a place to read evicted entries from.
    pub fn has_source(&self) -> bool {
        self.source.is_some()
    }

    /// What its cached entries cost in memory (see [`Stream::settle`]).
    pub fn cached_bytes(&self) -> u64 {
        self.cached
    }

    /// An estimate of the bytes it holds in memory now (`MEMORY USAGE`):
    /// its entries' index, the entries cached (those evicted are read
    /// back from the log and count only in the index), its nodes, and
    /// its groups' pending entries and consumers.
    pub fn memory_estimate(&self) -> u64 {
        use std::mem::size_of;
        let size = |n: usize, each: usize| (n * each) as u64;
        let groups: u64 = self
            .groups
            .iter()
            .map(|(name, g)| {
                let consumers: u64 = g
                    .consumers
                    .iter()
                    .map(|(name, c)| {
                        name.len() as u64
                            + size(1, size_of::<Consumer>())
                            + size(c.pel.len(), size_of::<StreamId>())
                    })
                    .sum();
                name.len() as u64
                    + size(1, size_of::<Group>())
                    + size(g.pel.len(), size_of::<(StreamId, Nack)>())
                    + consumers
            })
            .sum();
        size(1, size_of::<Self>())
            + size(self.len() as usize, size_of::<(StreamId, Slot)>())
            + self.cached
            + size(self.nodes.len(), size_of::<Node>())
            + groups
    }

    /// The id an `XADD` with `id` would get, without adding.
    ///
    /// # Errors
    ///
    /// Redis's errors: ids exhausted, or an id not above the last.
    pub fn next_id(&self, id: AddId, now_ms: u64) -> Result<StreamId, Reply> {
        if self.last_id == StreamId::MAX {
            return Err(Reply::Error(EXHAUSTED.to_owned()));
        }
        let too_small = || Reply::Error(ID_TOO_SMALL.to_owned());
        match id {
            AddId::Auto => Ok(if now_ms > self.last_id.ms {
                StreamId::new(now_ms, 0)
            } else {
                self.last_id.next().expect("not MAX: checked above")
            }),
            AddId::Partial(ms) => {
                if ms > self.last_id.ms {
                    Ok(StreamId::new(ms, 0))
                } else if ms == self.last_id.ms {
                    // Past the last sequence of that millisecond: Redis
                    // 7.0 fails the append without naming a cause, and
                    // its reply reads the leftover `errno` (not `EDOM`
                    // outside a transaction): the "too large" text.
                    self.last_id
                        .seq
                        .checked_add(1)
                        .map(|seq| StreamId::new(ms, seq))
                        .ok_or_else(|| Reply::Error(TOO_LARGE.to_owned()))
                } else {
                    Err(too_small())
                }
            }
            AddId::Explicit(id) if id > self.last_id => Ok(id),
            AddId::Explicit(_) => Err(too_small()),
        }
    }

    /// Appends an entry with an id from [`Stream::next_id`], whose record
    /// is at `loc` ([`Loc::NONE`]: not appended yet, see
    /// [`Stream::place`]).
    pub fn insert(&mut self, id: StreamId, fields: Fields, loc: Loc) {
        debug_assert!(id > self.last_id || (self.entries_added == 0 && id > StreamId::MIN));
        // Redis starts a node when the tail is full by count (deleted
        // entries included) or when the raw field and value bytes would
        // take its listpack to the byte limit.
        let raw = raw_bytes(&fields);
        self.live_bytes += raw;
        let fits = self
            .nodes
            .back()
            .is_some_and(|n| n.total < NODE_MAX_ENTRIES && n.bytes + raw < NODE_MAX_BYTES);
        if !fits {
            // Copied: a node outlives its first entry's request buffer.
            // (Sized first: `collect` makes room for four at least.)
            let mut names = Vec::with_capacity(fields.len() / 2);
            names.extend(fields.names().map(Bytes::copy_from_slice));
            push_back_sparingly(
                &mut self.nodes,
                Node {
                    total: 0,
                    live: 0,
                    bytes: listpack::node_bytes(&names),
                    last: id,
                    master_id: id,
                    master_fields: names,
                },
            );
        }
        let n = self.nodes.back_mut().expect("a tail node");
        n.bytes += listpack::entry_bytes(n.master_id, &n.master_fields, id, &fields);
        n.total += 1;
        n.live += 1;
        n.last = id;
        self.cached += cost(&fields);
        self.entries.insert(
            id,
            Slot {
                loc,
                raw: u32::try_from(raw).unwrap_or(u32::MAX),
                fields: Some(fields),
            },
        );
        self.last_id = id;
        self.entries_added += 1;
    }

    /// `XADD`'s append: the new id (its record not placed yet).
    ///
    /// # Errors
    ///
    /// As [`Stream::next_id`].
    pub fn add(&mut self, id: AddId, fields: Fields, now_ms: u64) -> Result<StreamId, Reply> {
        let id = self.next_id(id, now_ms)?;
        self.insert(id, fields, Loc::NONE);
        Ok(id)
    }

    /// Gives the newest entries inserted without a place (in a
    /// transaction) the place of the record that now holds them.
    pub fn place(&mut self, loc: Loc) {
        for (_, slot) in self.entries.iter_mut().rev() {
            if slot.loc.is_some() {
                break;
            }
            slot.loc = loc;
        }
    }

    /// Keeps the cached tail within `budget` bytes (and a margin of
    /// 1/[`EVICT_MARGIN`] of it): once past both, evicts its oldest entries
    /// whose records are before `written` (only a record on disk, or in the
    /// page cache, can be read back) until it is within `budget`; and drops
    /// what was lent for the last command. The newest entries stay as long
    /// as they fit.
    pub fn settle(&mut self, budget: u64, written: Loc) {
        let entries = &mut self.entries;
        let cache_from = self.cache_from;
        // Mostly empty: no walk set up for nothing.
        if !self.lent.is_empty() {
            self.lent.retain(|id| {
                let Some(slot) = entries.get_mut(*id).filter(|_| *id < cache_from) else {
                    return false;
                };
                // A relocated entry keeps its fields until its new record
                // is written.
                if slot.loc >= written {
                    return true;
                }
                slot.fields = None;
                false
            });
        }
        // Past the budget by a margin before any goes, then down to the
        // budget: finding the oldest cached entry is a search through the
        // whole map (a cache miss per step on a big stream), made once per
        // margin's worth of appends instead of once per append.
        if self.cached <= budget.saturating_add(budget / EVICT_MARGIN) {
            return;
        }
        let mut next = None;
        for (id, slot) in self
            .entries
            .range_mut(Bound::Included(self.cache_from), Bound::Unbounded)
        {
            if self.cached <= budget || !slot.loc.is_some() || slot.loc >= written {
                next = Some(id);
                break;
            }
            if let Some(f) = slot.fields.take() {
                self.cached -= cost(&f);
            }
        }
        self.cache_from = match next {
            Some(id) => id,
            None => self.last_id.next().unwrap_or(StreamId::MAX),
        };
    }

    /// Every entry now sits in the record at `loc` (the stream was
    /// written again as one record); every entry must have its fields
    /// (fetched), and those below the cached tail keep them until that
    /// record is written.
    pub fn relocate(&mut self, loc: Loc) {
        for (id, slot) in self.entries.iter_mut() {
            debug_assert!(slot.fields.is_some(), "relocating an evicted entry");
            slot.loc = loc;
            if id < self.cache_from {
                self.lent.push(id);
            }
        }
        self.lent.sort_unstable();
        self.lent.dedup();
    }

    /// The evicted entries that [`Stream::range`] with these arguments
    /// would read (to fetch them ahead).
    pub fn missing_in_range(
        &self,
        lo: StreamId,
        hi: StreamId,
        count: Option<u64>,
        rev: bool,
    ) -> Vec<(StreamId, Loc)> {
        if lo > hi || hi < self.entries.first().map_or(StreamId::MAX, |(k, _)| k) {
            return Vec::new();
        }
        let take = count.map_or(usize::MAX, |c| usize::try_from(c).unwrap_or(usize::MAX));
        // The cached tail needs nothing.
        let hi = if rev { hi } else { hi.min(self.cache_from) };
        if lo > hi {
            return Vec::new();
        }
        let range = self.entries.range(Bound::Included(lo), Bound::Included(hi));
        let pick = |(id, slot): (StreamId, &Slot)| slot.fields.is_none().then_some((id, slot.loc));
        if rev {
            range.rev().take(take).filter_map(pick).collect()
        } else {
            range.take(take).filter_map(pick).collect()
        }
    }

    /// The evicted entries among `ids`.
    pub fn missing_of<'a>(
        &self,
        ids: impl IntoIterator<Item = &'a StreamId>,
    ) -> Vec<(StreamId, Loc)> {
        ids.into_iter()
            .filter_map(|id| {
                let slot = self.entries.get(*id)?;
                slot.fields.is_none().then_some((*id, slot.loc))
            })
            .collect()
    }

    /// Gives evicted entry `id` its fields (fetched ahead) until the next
    /// [`Stream::settle`].
    pub fn lend(&mut self, id: StreamId, fields: Fields) {
        if let Some(slot) = self.entries.get_mut(id) {
            if slot.fields.is_none() {
                slot.fields = Some(fields);
                self.lent.push(id);
            }
        }
    }

    /// What a trim would remove, as Redis trims: whole nodes from the head
    /// while the target allows (and, with `~`, within `LIMIT`: by default
    /// 100 nodes' worth); then, for an exact trim, single entries of the
    /// next node. The count, and the id [`Stream::trim_through`] replays
    /// it with.
    pub fn trim_plan(&self, trim: &Trim) -> (u64, Option<StreamId>) {
        let limit = match (trim.approx, trim.limit) {
            (true, None) => u64::from(NODE_MAX_ENTRIES) * 100,
            (true, Some(l)) => l,
            (false, _) => 0,
        };
        let mut length = self.len();
        let mut removed = 0u64;
        let mut through = None;
        let mut prev_last = None;
        for node in &self.nodes {
            if let TrimTo::MaxLen(max) = trim.to {
                if length <= max {
                    break;
                }
            }
            let live = u64::from(node.live);
            if limit != 0 && removed + live > limit {
                break;
            }
            let whole = match trim.to {
                TrimTo::MaxLen(max) => length - live >= max,
                TrimTo::MinId(min) => node.last < min,
            };
            if whole {
                length -= live;
                removed += live;
                through = Some(node.last);
                prev_last = Some(node.last);
                continue;
            }
            if trim.approx {
                break;
            }
            let lo = prev_last.map_or(Bound::Unbounded, Bound::Excluded);
            for (id, _) in self.entries.range(lo, Bound::Included(node.last)) {
                let done = match trim.to {
                    TrimTo::MaxLen(max) => length <= max,
                    TrimTo::MinId(min) => id >= min,
                };
                if done {
                    break;
                }
                length -= 1;
                removed += 1;
                through = Some(id);
            }
            break;
        }
        (removed, through)
    }

    /// Trims; the number of entries removed and the id that replays it.
    pub fn trim(&mut self, trim: &Trim) -> (u64, Option<StreamId>) {
        let (n, through) = self.trim_plan(trim);
        if let Some(t) = through {
            self.trim_through(t);
        }
        (n, through)
    }

    /// Removes head nodes whose last element is at most `through`, then
    /// the entries up to `through` of the next node (which stays, as in
    /// Redis). Trimming does not move `max_deleted_id`.
    pub fn trim_through(&mut self, through: StreamId) {
        while let Some(node) = self.nodes.front() {
            if node.last > through {
                break;
            }
            let last = node.last;
            self.nodes.pop_front();
            while self.entries.first().is_some_and(|(id, _)| id <= last) {
                self.pop_first();
            }
        }
        while let Some((id, _)) = self.entries.first() {
            if id > through {
                break;
            }
            self.pop_first();
            if let Some(node) = self.nodes.front_mut() {
                node.live -= 1;
            }
        }
    }

    fn pop_first(&mut self) {
        if let Some((id, slot)) = self.entries.pop_first() {
            self.dropped(id, slot);
        }
    }

    /// Accounts for entry `id` leaving the stream.
    fn dropped(&mut self, id: StreamId, slot: Slot) {
        self.live_bytes -= u64::from(slot.raw);
        if id >= self.cache_from {
            if let Some(f) = &slot.fields {
                self.cached -= cost(f);
            }
        }
    }

    /// Deletes the listed ids; how many existed.
    pub fn delete(&mut self, ids: &[StreamId]) -> u64 {
        let mut n = 0;
        for id in ids {
            if let Some(slot) = self.entries.remove(*id) {
                self.dropped(*id, slot);
                self.forget(*id);
                n += 1;
            }
        }
        n
    }

    /// Accounts for deleted entry `id` (`XDEL`): its node loses it (and
    /// goes when it has no live entry left), and the largest deleted id
    /// moves up.
    fn forget(&mut self, id: StreamId) {
        self.max_deleted_id = self.max_deleted_id.max(id);
        let at = self.nodes.partition_point(|n| n.last < id);
        if let Some(node) = self.nodes.get_mut(at) {
            node.live -= 1;
            if node.live == 0 {
                self.nodes.remove(at);
            }
        }
    }

    /// Entries in `[lo, hi]`, at most `count`, newest first with `rev`.
    pub fn range(
        &self,
        lo: StreamId,
        hi: StreamId,
        count: Option<u64>,
        rev: bool,
    ) -> Vec<(StreamId, Fields)> {
        if lo > hi {
            return Vec::new();
        }
        let take = count.map_or(usize::MAX, |c| usize::try_from(c).unwrap_or(usize::MAX));
        let (most, range) = self
            .entries
            .range_bounded(Bound::Included(lo), Bound::Included(hi));
        let mut missing = Vec::new();
        // Sized once for a page: its `COUNT`, within what the chunks the
        // range spans can hold, up to 1,024 entries (a point read or a
        // read of the newest entries spans one chunk).
        let mut out: Vec<(StreamId, Option<Fields>)> = Vec::with_capacity(take.min(most).min(1024));
        let mut push = |(id, slot): (StreamId, &Slot)| {
            if slot.fields.is_none() {
                missing.push((id, slot.loc));
            }
            out.push((id, slot.fields.clone()));
        };
        if rev {
            range.rev().take(take).for_each(&mut push);
        } else {
            range.take(take).for_each(&mut push);
        }
        let mut found = if missing.is_empty() {
            Vec::new()
        } else {
            self.read_back(&missing)
        }
        .into_iter();
        out.into_iter()
            .map(|(id, f)| match f {
                Some(f) => (id, f),
                None => found.next().expect("one read back per evicted entry"),
            })
            .collect()
    }

    /// Sets the last id (`XSETID`); the caller checked it is not below the
    /// last entry.
    pub fn set_last_id(&mut self, id: StreamId) {
        self.last_id = id;
    }

    /// Sets the counters `XSETID` can set.
    pub fn set_counters(&mut self, entries_added: u64, max_deleted_id: StreamId) {
        self.entries_added = entries_added;
        self.max_deleted_id = max_deleted_id;
    }
}

impl Stream {
    /// Nodes the entries sit in (Redis's `radix-tree-keys`).
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Nodes of the radix tree Redis would keep the entry nodes in (its
    /// `radix-tree-nodes`): a compressed trie over the nodes' 16-byte
    /// big-endian master ids, a chain of bytes one node, a branch one
    /// node, each key ending in a node of its own; an empty tree is its
    /// root alone.
    pub fn radix_tree_nodes(&self) -> usize {
        let keys: Vec<[u8; 16]> = self
            .nodes
            .iter()
            .map(|n| n.master_id.to_be_bytes())
            .collect();
        if keys.is_empty() {
            return 1;
        }
        radix_nodes(&keys, 0)
    }

    /// The first entry's id, `0-0` when empty (Redis's
    /// `recorded-first-entry-id`).
    pub fn first_id(&self) -> StreamId {
        self.first_entry_id().unwrap_or(StreamId::MIN)
    }

    /// Whether deleted entries may lie in `[start, end]` (Redis checks the
    /// largest deleted id only).
    pub fn has_tombstones(&self, start: Option<StreamId>, end: Option<StreamId>) -> bool {
        if self.is_empty()
            || self.max_deleted_id == StreamId::MIN
            || self.first_id() > self.max_deleted_id
        {
            return false;
        }
        let start = start.unwrap_or(StreamId::MIN);
        let end = end.unwrap_or(StreamId::MAX);
        start <= self.max_deleted_id && self.max_deleted_id <= end
    }

    /// How many entries were added up to `id`, when that can be known
    /// without counting (Redis's estimate of a group's `entries-read`).
    pub fn estimate_distance(&self, id: StreamId) -> Option<u64> {
        if self.entries_added == 0 {
            return Some(0);
        }
        if self.is_empty() && id <= self.last_id {
            return Some(self.entries_added);
        }
        if id == self.last_id {
            return Some(self.entries_added);
        }
        if id > self.last_id {
            return None;
        }
        let first = self.first_id();
        if self.max_deleted_id == StreamId::MIN || self.max_deleted_id < first {
            // No deletions among the entries left.
            if id < first {
                return Some(self.entries_added - self.len());
            }
            if id == first {
                return Some(self.entries_added - self.len() + 1);
            }
        }
        None
    }

    /// A group's lag: entries added that it has not read, when known.
    /// Negative when the group's counter is ahead of the stream's (set so
    /// by `ENTRIESREAD`), as Redis answers it.
    pub fn lag(&self, group: &Group) -> Option<i64> {
        if self.entries_added == 0 {
            return Some(0);
        }
        let added = self.entries_added as i64;
        if let Some(read) = group.entries_read {
            if !self.has_tombstones(Some(group.last_id), None) {
                return Some(added.wrapping_sub(read as i64));
            }
        }
        self.estimate_distance(group.last_id)
            .map(|read| added.wrapping_sub(read as i64))
    }

    /// The read counter after delivering `id` to a group whose counter was
    /// `entries_read` (Redis counts on while no deletion lies ahead, and
    /// estimates again otherwise).
    pub fn entries_read_after(&self, entries_read: Option<u64>, id: StreamId) -> Option<u64> {
        match entries_read {
            Some(n) if !self.has_tombstones(Some(id), None) => Some(n + 1),
            _ if self.entries_added > 0 => self.estimate_distance(id),
            other => other,
        }
    }

    /// Applies a logged group operation (live, after logging it, and at
    /// recovery, the same way).
    pub fn apply_group(&mut self, op: Op) {
        match op {
            Op::GroupCreate {
                group,
                last_id,
                entries_read,
            } => {
                if !self.groups.contains_key(&group) {
                    // Its own copy: the name may be a slice of the request's
                    // read buffer, which it would keep for the group's life.
                    self.groups.insert(
                        Bytes::copy_from_slice(&group),
                        Group::new(last_id, entries_read),
                    );
                }
            }
            Op::GroupSetId {
                group,
                last_id,
                entries_read,
            } => {
                if let Some(g) = self.groups.get_mut(&group) {
                    g.last_id = last_id;
                    g.entries_read = entries_read;
                }
            }
            Op::GroupDestroy { group } => {
                self.groups.remove(&group);
            }
            Op::ConsumerCreate {
                group,
                consumer,
                time,
            } => {
                if let Some(g) = self.groups.get_mut(&group) {
                    g.create_consumer(&consumer, time);
                }
            }
            Op::ConsumerDelete { group, consumer } => {
                if let Some(g) = self.groups.get_mut(&group) {
                    g.delete_consumer(&consumer);
                }
            }
            Op::Deliver {
                group,
                consumer,
                time,
                last_id,
                entries_read,
                ids,
            } => {
                if let Some(g) = self.groups.get_mut(&group) {
                    g.create_consumer(&consumer, time);
                    for id in ids {
                        g.deliver(id, &consumer, time);
                    }
                    if last_id > g.last_id {
                        g.last_id = last_id;
                    }
                    g.entries_read = entries_read;
                    if let Some(c) = g.consumers.get_mut(&consumer) {
                        c.seen_time = time;
                    }
                }
            }
            Op::Ack { group, ids } => {
                if let Some(g) = self.groups.get_mut(&group) {
                    for id in ids {
                        g.ack(id);
                    }
                }
            }
            Op::Claim {
                group,
                consumer,
                time,
                entries,
                last_id,
            } => {
                if let Some(g) = self.groups.get_mut(&group) {
                    // The consumer is made (and seen) only by a claim that
                    // takes something.
                    if !entries.is_empty() {
                        g.create_consumer(&consumer, time);
                        if let Some(c) = g.consumers.get_mut(&consumer) {
                            c.seen_time = time;
                        }
                    }
                    for (id, t, n) in entries {
                        g.claim(id, &consumer, t, n);
                    }
                    if let Some(id) = last_id {
                        if id > g.last_id {
                            g.last_id = id;
                        }
                    }
                }
            }
            Op::Add { .. }
            | Op::Delete { .. }
            | Op::TrimThrough { .. }
            | Op::SetId { .. }
            | Op::Drop
            | Op::Batch(_)
            | Op::Snapshot(_) => {
                debug_assert!(false, "not a group operation");
            }
        }
    }
}

/// An entry as Redis replies with it: `[id, [f1, v1, ...]]`.
pub fn entry_reply(id: StreamId, fields: &Fields) -> Reply {
    Reply::Array(vec![
        id.reply(),
        Reply::Array(
            fields
                .iter()
                .map(|f| Reply::Bulk(Bytes::copy_from_slice(f)))
                .collect(),
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_s_name_keeps_none_of_the_request_s_buffer() {
        let read = Bytes::from(vec![b'g'; 16 << 10]);
        let mut s = Stream::new();
        s.apply_group(Op::GroupCreate {
            group: read.slice(0..3),
            last_id: StreamId::MIN,
            entries_read: Some(0),
        });
        let name = s.groups.keys().next().expect("the group");
        let (p, r) = (name.as_ptr() as usize, read.as_ptr() as usize);
        assert!(p < r || p >= r + read.len());
        assert_eq!(&name[..], b"ggg");
    }

    fn fields() -> Fields {
        Fields::from_parts(&[&b"f"[..], b"v"])
    }

    #[test]
    fn auto_ids_follow_the_clock_and_never_go_back() {
        let mut s = Stream::new();
        assert_eq!(
            s.add(AddId::Auto, fields(), 1000),
            Ok(StreamId::new(1000, 0))
        );
        assert_eq!(
            s.add(AddId::Auto, fields(), 1000),
            Ok(StreamId::new(1000, 1))
        );
        // The clock went back: the sequence goes on.
        assert_eq!(s.add(AddId::Auto, fields(), 10), Ok(StreamId::new(1000, 2)));
        assert_eq!(
            s.add(AddId::Auto, fields(), 2000),
            Ok(StreamId::new(2000, 0))
        );
        assert_eq!(s.entries_added(), 4);
    }

    #[test]
    fn explicit_and_partial_ids_must_grow() {
        let mut s = Stream::new();
        assert_eq!(
            s.add(AddId::Partial(0), fields(), 0),
            Ok(StreamId::new(0, 1))
        );
        assert_eq!(
            s.add(AddId::Explicit(StreamId::new(0, 1)), fields(), 0),
            Err(Reply::Error(ID_TOO_SMALL.to_owned()))
        );
        assert_eq!(
            s.add(AddId::Explicit(StreamId::new(5, 5)), fields(), 0),
            Ok(StreamId::new(5, 5))
        );
        assert_eq!(
            s.add(AddId::Partial(5), fields(), 0),
            Ok(StreamId::new(5, 6))
        );
        assert_eq!(
            s.add(AddId::Partial(7), fields(), 0),
            Ok(StreamId::new(7, 0))
        );
        assert_eq!(
            s.add(AddId::Partial(6), fields(), 0),
            Err(Reply::Error(ID_TOO_SMALL.to_owned()))
        );
        s.add(AddId::Explicit(StreamId::MAX), fields(), 0).unwrap();
        assert_eq!(
            s.add(AddId::Auto, fields(), 0),
            Err(Reply::Error(EXHAUSTED.to_owned()))
        );
    }

    #[test]
    fn ranges_count_and_reverse() {
        let mut s = Stream::new();
        for ms in 1..=5 {
            s.add(AddId::Explicit(StreamId::new(ms, 0)), fields(), 0)
                .unwrap();
        }
        let ids = |v: Vec<(StreamId, Fields)>| v.into_iter().map(|(i, _)| i.ms).collect::<Vec<_>>();
        assert_eq!(
            ids(s.range(StreamId::new(2, 0), StreamId::MAX, None, false)),
            [2, 3, 4, 5]
        );
        assert_eq!(
            ids(s.range(StreamId::MIN, StreamId::MAX, Some(2), true)),
            [5, 4]
        );
        assert_eq!(
            ids(s.range(StreamId::new(4, 0), StreamId::new(2, 0), None, false)),
            Vec::<u64>::new()
        );
    }

    /// A stream of `n` entries `1-0..`, entry `i` in the record at
    /// segment 1, offset `16 + i`.
    fn placed(n: u64) -> Stream {
        let mut s = Stream::new();
        for ms in 1..=n {
            s.insert(StreamId::new(ms, 0), fields(), Loc::new(1, 16 + ms));
        }
        s
    }

    #[test]
    fn the_cached_tail_keeps_to_its_budget_and_only_written_records_go() {
        let mut s = placed(100);
        let each = cost(&fields());
        assert_eq!(s.cached_bytes(), 100 * each);
        // Nothing written yet: nothing can go.
        s.settle(10 * each, Loc::new(1, 0));
        assert_eq!(s.cached_bytes(), 100 * each);
        // Written up to entry 50's record: entries 1..=49 can go.
        s.settle(10 * each, Loc::new(1, 16 + 50));
        assert_eq!(s.cached_bytes(), 51 * each);
        s.settle(10 * each, Loc::MAX);
        assert_eq!(s.cached_bytes(), 10 * each);
        let missing = s.missing_in_range(StreamId::MIN, StreamId::MAX, None, false);
        assert_eq!(missing.len(), 90);
        assert_eq!(missing[0], (StreamId::new(1, 0), Loc::new(1, 17)));
        // Reads that stay in the cached tail, or past the end, need none.
        assert!(s
            .missing_in_range(StreamId::new(95, 0), StreamId::MAX, None, false)
            .is_empty());
        assert!(s
            .missing_in_range(StreamId::new(500, 0), StreamId::MAX, None, false)
            .is_empty());
        assert!(s
            .missing_in_range(StreamId::MIN, StreamId::MAX, Some(5), true)
            .is_empty());
        assert_eq!(
            s.missing_in_range(StreamId::MIN, StreamId::MAX, Some(3), false)
                .len(),
            3
        );
        // Lent fields serve a read without a source, until settled.
        for (id, _) in s.missing_in_range(StreamId::MIN, StreamId::new(3, 0), None, false) {
            s.lend(id, fields());
        }
        assert_eq!(
            s.range(StreamId::MIN, StreamId::new(3, 0), None, false)
                .len(),
            3
        );
        assert_eq!(s.cached_bytes(), 10 * each);
        s.settle(10 * each, Loc::MAX);
        assert_eq!(
            s.missing_in_range(StreamId::MIN, StreamId::new(3, 0), None, false)
                .len(),
            3
        );
        // Trims and deletes of evicted and cached entries keep the count.
        s.trim_through(StreamId::new(50, 0));
        assert_eq!(s.delete(&[StreamId::new(99, 0), StreamId::new(60, 0)]), 2);
        assert_eq!(s.cached_bytes(), 9 * each);
        assert_eq!(s.live_bytes(), 48 * raw_bytes(&fields()));
    }

    #[test]
    fn eviction_waits_for_the_margin_then_goes_down_to_the_budget() {
        let each = cost(&fields());
        let budget = 64 * each;
        // Within the budget and its margin (4 entries' worth): all stay.
        let mut s = placed(64 + 4);
        s.settle(budget, Loc::MAX);
        assert_eq!(s.cached_bytes(), 68 * each);
        // One more is past the margin: down to the budget at once.
        s.insert(StreamId::new(69, 0), fields(), Loc::new(1, 16 + 69));
        s.settle(budget, Loc::MAX);
        assert_eq!(s.cached_bytes(), 64 * each);
        assert_eq!(
            s.missing_in_range(StreamId::MIN, StreamId::MAX, None, false)
                .len(),
            5
        );
    }

    #[test]
    fn unplaced_entries_stay_until_placed() {
        let mut s = Stream::new();
        for ms in 1..=5 {
            s.insert(StreamId::new(ms, 0), fields(), Loc::NONE);
        }
        s.settle(0, Loc::MAX);
        assert_eq!(s.cached_bytes(), 5 * cost(&fields()));
        s.place(Loc::new(2, 16));
        s.settle(0, Loc::MAX);
        assert_eq!(s.cached_bytes(), 0);
        assert_eq!(
            s.missing_in_range(StreamId::MIN, StreamId::MAX, None, false),
            (1..=5)
                .map(|ms| (StreamId::new(ms, 0), Loc::new(2, 16)))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn trims_exact_and_approximate() {
        let mut s = Stream::new();
        for ms in 1..=350 {
            s.add(AddId::Explicit(StreamId::new(ms, 0)), fields(), 0)
                .unwrap();
        }
        let approx = |max| Trim {
            to: TrimTo::MaxLen(max),
            approx: true,
            limit: None,
        };
        // 40 over: less than a node, nothing goes.
        assert_eq!(s.trim(&approx(310)), (0, None));
        // 250 over: two whole nodes of 100.
        assert_eq!(s.trim(&approx(100)), (200, Some(StreamId::new(200, 0))));
        // 150 left in nodes of 100 and 50: `~ 50` leaves the last node.
        assert_eq!(s.trim_plan(&approx(50)).0, 100);
        assert_eq!(s.len(), 150);
        let exact = Trim {
            to: TrimTo::MinId(StreamId::new(300, 0)),
            approx: false,
            limit: None,
        };
        assert_eq!(s.trim(&exact).0, 99);
        assert_eq!(s.first().unwrap().0, StreamId::new(300, 0));
        // Trims do not count as deletions.
        assert_eq!(s.max_deleted_id(), StreamId::MIN);
        assert_eq!(s.delete(&[StreamId::new(350, 0), StreamId::new(1, 0)]), 1);
        assert_eq!(s.max_deleted_id(), StreamId::new(350, 0));
        assert_eq!(s.last_id(), StreamId::new(350, 0));
    }
}
