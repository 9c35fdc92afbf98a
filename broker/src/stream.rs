//! One stream's entries and ids, as Redis keeps them: ids only grow, even
//! past deleted and trimmed entries; `entries_added` counts every append;
//! trimming by length or by id, exact or approximate.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::sync::Arc;

use bytes::Bytes;

use crate::id::{AddId, StreamId};
use crate::resp::Reply;

/// An entry's field-value pairs, flattened (`f1 v1 f2 v2 ...`); shared by
/// the stream and the replies that carry it.
pub type Fields = Arc<[Bytes]>;

/// Entries per node at most (Redis's `stream-node-max-entries`). Redis
/// keeps a stream as a radix tree of nodes and an approximate trim (`~`)
/// removes only whole nodes; this stream keeps the same node boundaries
/// (by count, and by an estimate of Redis's encoded size) so `~` removes
/// what Redis would.
pub const NODE_MAX_ENTRIES: u32 = 100;
/// Bytes per node at most (Redis's `stream-node-max-bytes`), against an
/// estimate of the listpack encoding.
pub const NODE_MAX_BYTES: u32 = 4096;

/// One node's worth of entries, as Redis would group them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Node {
    /// Entries ever put in it (deleted ones too: they keep their slot).
    total: u32,
    /// Entries still there.
    live: u32,
    /// Estimated encoded size.
    bytes: u32,
    /// Its last entry's id.
    last: StreamId,
}

/// An estimate of an entry's size in a Redis listpack node: each field
/// and value with its element overhead, plus the entry's id deltas, flags
/// and back-length.
fn encoded_estimate(fields: &[Bytes]) -> u32 {
    let elements: usize = fields.iter().map(|f| f.len() + 2).sum();
    (elements + 8).min(u32::MAX as usize) as u32
}

/// Error for `XADD` when the stream's last id is the largest.
pub const EXHAUSTED: &str =
    "ERR The stream has exhausted the last possible ID, unable to add more items";
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

/// One stream.
#[derive(Debug, Clone, Default)]
pub struct Stream {
    entries: BTreeMap<StreamId, Fields>,
    /// Node boundaries, oldest first.
    nodes: VecDeque<Node>,
    last_id: StreamId,
    max_deleted_id: StreamId,
    entries_added: u64,
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

    /// The first entry, if any.
    pub fn first(&self) -> Option<(StreamId, &Fields)> {
        self.entries.first_key_value().map(|(k, v)| (*k, v))
    }

    /// The last entry, if any.
    pub fn last(&self) -> Option<(StreamId, &Fields)> {
        self.entries.last_key_value().map(|(k, v)| (*k, v))
    }

    /// The entry `id`.
    pub fn get(&self, id: StreamId) -> Option<&Fields> {
        self.entries.get(&id)
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
                    self.last_id
                        .seq
                        .checked_add(1)
                        .map(|seq| StreamId::new(ms, seq))
                        .ok_or_else(too_small)
                } else {
                    Err(too_small())
                }
            }
            AddId::Explicit(id) if id > self.last_id => Ok(id),
            AddId::Explicit(_) => Err(too_small()),
        }
    }

    /// Appends an entry with an id from [`Stream::next_id`].
    pub fn insert(&mut self, id: StreamId, fields: Fields) {
        debug_assert!(id > self.last_id || (self.entries_added == 0 && id > StreamId::MIN));
        let bytes = encoded_estimate(&fields);
        match self.nodes.back_mut() {
            Some(n)
                if n.total < NODE_MAX_ENTRIES && n.bytes.saturating_add(bytes) < NODE_MAX_BYTES =>
            {
                n.total += 1;
                n.live += 1;
                n.bytes += bytes;
                n.last = id;
            }
            _ => self.nodes.push_back(Node {
                total: 1,
                live: 1,
                bytes,
                last: id,
            }),
        }
        self.entries.insert(id, fields);
        self.last_id = id;
        self.entries_added += 1;
    }

    /// `XADD`'s append: the new id.
    ///
    /// # Errors
    ///
    /// As [`Stream::next_id`].
    pub fn add(&mut self, id: AddId, fields: Fields, now_ms: u64) -> Result<StreamId, Reply> {
        let id = self.next_id(id, now_ms)?;
        self.insert(id, fields);
        Ok(id)
    }

    /// How many of the oldest entries a trim removes: whole nodes while
    /// the target allows (and, with `~`, within `LIMIT`: by default 100
    /// nodes' worth); then, for an exact trim, single entries.
    pub fn trim_plan(&self, trim: &Trim) -> u64 {
        let len = self.len();
        let limit = match (trim.approx, trim.limit) {
            (true, None) => u64::from(NODE_MAX_ENTRIES) * 100,
            (true, Some(l)) => l,
            (false, _) => 0,
        };
        let mut removed = 0u64;
        for node in &self.nodes {
            let live = u64::from(node.live);
            let whole = match trim.to {
                TrimTo::MaxLen(max) => len - removed - live >= max,
                TrimTo::MinId(min) => node.last < min,
            };
            if !whole || (limit > 0 && removed + live > limit) {
                break;
            }
            removed += live;
        }
        if trim.approx {
            return removed;
        }
        match trim.to {
            TrimTo::MaxLen(max) => len.saturating_sub(max),
            TrimTo::MinId(min) => self.entries.range(..min).count() as u64,
        }
    }

    /// Trims; the number of entries removed and the last id removed.
    pub fn trim(&mut self, trim: &Trim) -> (u64, Option<StreamId>) {
        let n = self.trim_plan(trim);
        (n, self.remove_oldest(n))
    }

    /// Removes the `n` oldest entries; the last id removed.
    pub fn remove_oldest(&mut self, n: u64) -> Option<StreamId> {
        let mut last = None;
        for _ in 0..n {
            let Some((id, _)) = self.entries.pop_first() else {
                break;
            };
            self.forget(id);
            last = Some(id);
        }
        last
    }

    /// Removes every entry up to `through` (a logged trim, replayed).
    pub fn trim_through(&mut self, through: StreamId) {
        while let Some((&id, _)) = self.entries.first_key_value() {
            if id > through {
                break;
            }
            self.entries.pop_first();
            self.forget(id);
        }
    }

    /// Deletes the listed ids; how many existed.
    pub fn delete(&mut self, ids: &[StreamId]) -> u64 {
        let mut n = 0;
        for id in ids {
            if self.entries.remove(id).is_some() {
                self.forget(*id);
                n += 1;
            }
        }
        n
    }

    /// Accounts for removed entry `id`: its node loses it (and goes when
    /// empty), and the largest deleted id moves up.
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
        let range = self
            .entries
            .range((Bound::Included(lo), Bound::Included(hi)));
        if rev {
            range
                .rev()
                .take(take)
                .map(|(k, v)| (*k, v.clone()))
                .collect()
        } else {
            range.take(take).map(|(k, v)| (*k, v.clone())).collect()
        }
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

/// An entry as Redis replies with it: `[id, [f1, v1, ...]]`.
pub fn entry_reply(id: StreamId, fields: &Fields) -> Reply {
    Reply::Array(vec![
        id.reply(),
        Reply::Array(fields.iter().cloned().map(Reply::Bulk).collect()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields() -> Fields {
        Arc::from(vec![Bytes::from_static(b"f"), Bytes::from_static(b"v")])
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
        assert_eq!(s.trim_plan(&approx(50)), 100);
        assert_eq!(s.len(), 150);
        let exact = Trim {
            to: TrimTo::MinId(StreamId::new(300, 0)),
            approx: false,
            limit: None,
        };
        assert_eq!(s.trim(&exact).0, 99);
        assert_eq!(s.first().unwrap().0, StreamId::new(300, 0));
        assert_eq!(s.max_deleted_id(), StreamId::new(299, 0));
        assert_eq!(s.delete(&[StreamId::new(350, 0), StreamId::new(1, 0)]), 1);
        assert_eq!(s.last_id(), StreamId::new(350, 0));
    }
}
