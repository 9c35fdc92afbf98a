//! A stream's entries by id: a sorted map built for a log's access
//! pattern. Appends go at the end, trims take from the front, deletes
//! leave a tombstone, and lookups and ranges are binary searches.
//!
//! Entries sit in fixed-size chunks (one allocation per [`CHUNK`] entries,
//! no per-entry node and no reallocation of the whole map as it grows: a
//! million entries never move at once). A `BTreeMap` took about twice the
//! memory per entry for the same keys, its leaves left half full by
//! in-order inserts.

use std::collections::VecDeque;
use std::ops::Bound;

use crate::id::StreamId;

/// Entries per chunk.
const CHUNK: usize = 64;

/// Room a stream's first chunk starts with.
const FIRST_CHUNK: usize = 4;

/// What the map keeps per entry, besides its id: a value and whether it
/// is still there (a deleted entry keeps its place until its chunk is
/// compacted).
#[derive(Debug, Clone)]
struct Item<V> {
    id: StreamId,
    value: V,
    live: bool,
}

#[derive(Debug, Clone)]
struct Chunk<V> {
    /// Sorted by id; never empty while the chunk is in the map.
    items: Vec<Item<V>>,
    /// Items still live.
    live: usize,
}

impl<V> Chunk<V> {
    fn last(&self) -> StreamId {
        self.items[self.items.len() - 1].id
    }

    /// Drops the tombstones once they are half the chunk.
    fn compact_if_sparse(&mut self) {
        if self.live * 2 < self.items.len() {
            self.items.retain(|i| i.live);
            if self.items.capacity() > 4 * self.items.len().max(4) {
                self.items.shrink_to_fit();
            }
        }
    }
}

/// A sorted map from [`StreamId`] to `V`, for ids that mostly arrive in
/// order.
#[derive(Debug, Clone)]
pub(crate) struct Entries<V> {
    chunks: VecDeque<Chunk<V>>,
    live: usize,
}

impl<V> Default for Entries<V> {
    fn default() -> Self {
        Self {
            chunks: VecDeque::new(),
            live: 0,
        }
    }
}

impl<V> Entries<V> {
    /// Live entries.
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// The chunk that holds `id` if it is anywhere: the first whose last
    /// id is not below it.
    fn chunk_of(&self, id: StreamId) -> usize {
        self.chunks.partition_point(|c| c.last() < id)
    }

    fn find(&self, id: StreamId) -> Option<(usize, usize)> {
        let c = self.chunk_of(id);
        let chunk = self.chunks.get(c)?;
        let i = chunk.items.binary_search_by_key(&id, |i| i.id).ok()?;
        chunk.items[i].live.then_some((c, i))
    }

    pub(crate) fn contains(&self, id: StreamId) -> bool {
        self.find(id).is_some()
    }

    pub(crate) fn get(&self, id: StreamId) -> Option<&V> {
        let (c, i) = self.find(id)?;
        Some(&self.chunks[c].items[i].value)
    }

    pub(crate) fn get_mut(&mut self, id: StreamId) -> Option<&mut V> {
        let (c, i) = self.find(id)?;
        Some(&mut self.chunks[c].items[i].value)
    }

    /// The first live entry.
    pub(crate) fn first(&self) -> Option<(StreamId, &V)> {
        // A chunk with no live item leaves the map: the first chunk holds it.
        let item = self.chunks.front()?.items.iter().find(|i| i.live)?;
        Some((item.id, &item.value))
    }

    /// The last live entry.
    pub(crate) fn last(&self) -> Option<(StreamId, &V)> {
        let item = self.chunks.back()?.items.iter().rfind(|i| i.live)?;
        Some((item.id, &item.value))
    }

    /// Adds entry `id` (above every id so far, in the common case; else
    /// put in its place). Replaces the value of a live entry with that id.
    pub(crate) fn insert(&mut self, id: StreamId, value: V) {
        let item = Item {
            id,
            value,
            live: true,
        };
        match self.chunks.back_mut() {
            Some(tail) if tail.last() < id => {
                if tail.items.len() < CHUNK {
                    tail.items.push(item);
                    tail.live += 1;
                    self.live += 1;
                } else {
                    self.push_chunk(item);
                }
            }
            None => self.push_chunk(item),
            Some(_) => self.insert_within(item),
        }
    }

    fn push_chunk(&mut self, item: Item<V>) {
        // A stream's first chunk grows as it fills: most streams of a
        // broker with many hold a few entries, and a whole chunk is
        // CHUNK items (kilobytes) each. A stream past one chunk takes
        // whole ones.
        let room = if self.chunks.is_empty() {
            FIRST_CHUNK
        } else {
            CHUNK
        };
        let mut items = Vec::with_capacity(room);
        items.push(item);
        super::push_back_sparingly(&mut self.chunks, Chunk { items, live: 1 });
        self.live += 1;
    }

    /// The rare insert below the last id (a recovered log replayed out of
    /// order): into its chunk, splitting it when full.
    fn insert_within(&mut self, item: Item<V>) {
        let c = self.chunk_of(item.id).min(self.chunks.len() - 1);
        let chunk = &mut self.chunks[c];
        match chunk.items.binary_search_by_key(&item.id, |i| i.id) {
            Ok(i) => {
                let old = &mut chunk.items[i];
                if !old.live {
                    chunk.live += 1;
                    self.live += 1;
                }
                *old = item;
                return;
            }
            Err(i) => {
                chunk.items.insert(i, item);
                chunk.live += 1;
                self.live += 1;
            }
        }
        if chunk.items.len() > CHUNK {
            // Tombstones go first: a half of nothing but tombstones would
            // be a chunk with nothing live, which the map never keeps.
            chunk.items.retain(|i| i.live);
            if chunk.items.len() > CHUNK {
                let rest = chunk.items.split_off(CHUNK / 2);
                chunk.live -= rest.len();
                let live = rest.len();
                self.chunks.insert(c + 1, Chunk { items: rest, live });
            }
        }
    }

    /// Deletes entry `id`; its value, if it was there.
    pub(crate) fn remove(&mut self, id: StreamId) -> Option<V>
    where
        V: Default,
    {
        let (c, i) = self.find(id)?;
        let chunk = &mut self.chunks[c];
        let item = &mut chunk.items[i];
        item.live = false;
        let value = std::mem::take(&mut item.value);
        chunk.live -= 1;
        self.live -= 1;
        if chunk.live == 0 {
            self.chunks.remove(c);
        } else {
            chunk.compact_if_sparse();
        }
        Some(value)
    }

    /// Removes and returns the first live entry.
    pub(crate) fn pop_first(&mut self) -> Option<(StreamId, V)> {
        let chunk = self.chunks.front_mut()?;
        let at = chunk.items.iter().position(|i| i.live)?;
        let item = chunk.items.drain(..=at).next_back()?;
        chunk.live -= 1;
        self.live -= 1;
        if chunk.live == 0 {
            self.chunks.pop_front();
        }
        Some((item.id, item.value))
    }

    /// Live entries in order (the tests' view of the whole map).
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = (StreamId, &V)> + '_ {
        self.chunks
            .iter()
            .flat_map(|c| c.items.iter())
            .filter(|i| i.live)
            .map(|i| (i.id, &i.value))
    }

    /// Live entries in order, their values mutable.
    pub(crate) fn iter_mut(&mut self) -> impl DoubleEndedIterator<Item = (StreamId, &mut V)> + '_ {
        self.chunks
            .iter_mut()
            .flat_map(|c| c.items.iter_mut())
            .filter(|i| i.live)
            .map(|i| (i.id, &mut i.value))
    }

    /// The chunks a range can touch: from the one holding `lo` through the
    /// one holding `hi`.
    fn chunk_span(&self, lo: Bound<StreamId>, hi: Bound<StreamId>) -> std::ops::Range<usize> {
        let from = match lo {
            Bound::Included(id) | Bound::Excluded(id) => self.chunk_of(id),
            Bound::Unbounded => 0,
        };
        let to = match hi {
            Bound::Included(id) | Bound::Excluded(id) => {
                (self.chunk_of(id) + 1).min(self.chunks.len())
            }
            Bound::Unbounded => self.chunks.len(),
        };
        from..to.max(from)
    }

    /// Live entries with ids within the bounds, in order.
    pub(crate) fn range(
        &self,
        lo: Bound<StreamId>,
        hi: Bound<StreamId>,
    ) -> impl DoubleEndedIterator<Item = (StreamId, &V)> + '_ {
        self.range_bounded(lo, hi).1
    }

    /// [`Entries::range`] with at least as many as it yields: what the
    /// chunks it touches can hold (found by the same search).
    pub(crate) fn range_bounded(
        &self,
        lo: Bound<StreamId>,
        hi: Bound<StreamId>,
    ) -> (usize, impl DoubleEndedIterator<Item = (StreamId, &V)> + '_) {
        let span = self.chunk_span(lo, hi);
        let most = span.len() * CHUNK;
        let entries = self
            .chunks
            .range(span)
            .flat_map(|c| c.items.iter())
            .filter(move |i| i.live && within(i.id, lo, hi))
            .map(|i| (i.id, &i.value));
        (most, entries)
    }

    /// Live entries with ids within the bounds, in order, values mutable.
    pub(crate) fn range_mut(
        &mut self,
        lo: Bound<StreamId>,
        hi: Bound<StreamId>,
    ) -> impl DoubleEndedIterator<Item = (StreamId, &mut V)> + '_ {
        let span = self.chunk_span(lo, hi);
        self.chunks
            .range_mut(span)
            .flat_map(|c| c.items.iter_mut())
            .filter(move |i| i.live && within(i.id, lo, hi))
            .map(|i| (i.id, &mut i.value))
    }
}

fn within(id: StreamId, lo: Bound<StreamId>, hi: Bound<StreamId>) -> bool {
    let above = match lo {
        Bound::Included(l) => id >= l,
        Bound::Excluded(l) => id > l,
        Bound::Unbounded => true,
    };
    let below = match hi {
        Bound::Included(h) => id <= h,
        Bound::Excluded(h) => id < h,
        Bound::Unbounded => true,
    };
    above && below
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn id(n: u64) -> StreamId {
        StreamId::new(n, 0)
    }

    /// Drives the map and a `BTreeMap` with the same operations and
    /// compares every answer.
    #[test]
    fn it_answers_as_a_btree_map_does_through_appends_deletes_trims_and_late_inserts() {
        let mut ours: Entries<u64> = Entries::default();
        let mut model: BTreeMap<StreamId, u64> = BTreeMap::new();
        // A small deterministic generator.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut top = 0u64;
        for step in 0..20_000u64 {
            match next() % 10 {
                0..=5 => {
                    top += 1 + next() % 3;
                    ours.insert(id(top), step);
                    model.insert(id(top), step);
                }
                6 => {
                    // A late insert below the top (recovery order).
                    let k = next() % (top + 1);
                    ours.insert(id(k), step);
                    model.insert(id(k), step);
                }
                7 | 8 => {
                    let k = next() % (top + 1);
                    assert_eq!(ours.remove(id(k)), model.remove(&id(k)), "remove {k}");
                }
                _ => {
                    assert_eq!(ours.pop_first(), model.pop_first());
                }
            }
            assert_eq!(ours.len(), model.len());
            let (a, b) = (next() % (top + 2), next() % (top + 2));
            let (lo, hi) = (Bound::Included(id(a.min(b))), Bound::Included(id(a.max(b))));
            let (most, found) = ours.range_bounded(lo, hi);
            assert!(found.count() <= most);
            let pair = |(k, v): (StreamId, &u64)| (k, *v);
            assert_eq!(
                ours.first().map(pair),
                model.first_key_value().map(|(k, v)| pair((*k, v)))
            );
            assert_eq!(
                ours.last().map(pair),
                model.last_key_value().map(|(k, v)| pair((*k, v)))
            );
            if step % 97 == 0 {
                let a = next() % (top + 2);
                let b = next() % (top + 2);
                let (lo, hi) = (id(a.min(b)), id(a.max(b)));
                for (l, h) in [
                    (Bound::Included(lo), Bound::Included(hi)),
                    (Bound::Excluded(lo), Bound::Excluded(hi)),
                    (Bound::Unbounded, Bound::Included(hi)),
                    (Bound::Included(lo), Bound::Unbounded),
                ] {
                    let got: Vec<_> = ours.range(l, h).map(|(k, v)| (k, *v)).collect();
                    let want: Vec<_> = model.range((l, h)).map(|(k, v)| (*k, *v)).collect();
                    assert_eq!(got, want);
                    let got: Vec<_> = ours.range(l, h).rev().take(5).map(|(k, _)| k).collect();
                    let want: Vec<_> = model.range((l, h)).rev().take(5).map(|(k, _)| *k).collect();
                    assert_eq!(got, want);
                }
                assert_eq!(
                    ours.first().map(|(k, v)| (k, *v)),
                    model.first_key_value().map(|(k, v)| (*k, *v))
                );
                assert_eq!(
                    ours.last().map(|(k, v)| (k, *v)),
                    model.last_key_value().map(|(k, v)| (*k, *v))
                );
                let k = next() % (top + 1);
                assert_eq!(ours.get(id(k)), model.get(&id(k)));
                assert_eq!(ours.contains(id(k)), model.contains_key(&id(k)));
            }
        }
        let all: Vec<_> = ours.iter().map(|(k, v)| (k, *v)).collect();
        assert_eq!(all, model.into_iter().collect::<Vec<_>>());
    }

    #[test]
    fn a_late_insert_that_splits_a_chunk_of_tombstones_leaves_no_empty_chunk() {
        // One full chunk, its first half deleted (tombstones kept: not yet
        // sparse), then an insert below the top into its second half: the
        // split must not leave a chunk with nothing live at the front.
        let mut m: Entries<u8> = Entries::default();
        for n in 0..CHUNK as u64 {
            m.insert(id(2 * n), 1);
        }
        for n in 0..(CHUNK as u64 / 2) {
            assert_eq!(m.remove(id(2 * n)), Some(1));
        }
        m.insert(id(CHUNK as u64 + 37), 2);
        assert_eq!(m.len(), CHUNK / 2 + 1);
        assert!(
            m.chunks.iter().all(|c| c.live > 0),
            "a chunk with nothing live"
        );
        assert_eq!(m.first().map(|(k, _)| k), Some(id(CHUNK as u64)));
        assert_eq!(m.pop_first(), Some((id(CHUNK as u64), 1)));
    }

    #[test]
    fn a_chunk_whose_entries_are_all_deleted_goes() {
        let mut m: Entries<u8> = Entries::default();
        for n in 0..(3 * CHUNK as u64) {
            m.insert(id(n), 1);
        }
        for n in CHUNK as u64..(2 * CHUNK as u64) {
            assert_eq!(m.remove(id(n)), Some(1));
        }
        assert_eq!(m.chunks.len(), 2);
        assert_eq!(m.len(), 2 * CHUNK);
        assert_eq!(
            m.range(Bound::Excluded(id(CHUNK as u64 - 1)), Bound::Unbounded)
                .next()
                .map(|(k, _)| k),
            Some(id(2 * CHUNK as u64))
        );
    }
}
