//! Routing: which shard a keyed actor lives on, and actor identities.
//!
//! Sticky keys go through the runtime's one routing function,
//! [`mailring::sticky_shard`] ([`RouteHasher`], a fixed, documented hash,
//! stable across processes, platforms and Rust versions, then a map onto the
//! shards), so a key picks the same shard for a task
//! (`Placement::Sticky(k)`), a keyed actor and a session. Stealable and
//! balanced keys are recorded in a [`Directory`] (by route hash, not by
//! their bytes) the first time any sender routes them; the first writer
//! wins, so every sender agrees on one shard and a key is activated at most
//! once.

use std::any::TypeId;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

pub use mailring::{route_hash, RouteHasher, RouteKey};

/// The identity of the keyed actor `(A, key)` within this process (used by
/// watches and ask-cycle detection); unkeyed identities have the top bit set.
pub(crate) fn keyed_uid<A: 'static, K: Hash>(key: &K) -> u64 {
    let mut h = RouteHasher::default();
    TypeId::of::<A>().hash(&mut h);
    key.hash(&mut h);
    h.finish() & !(1 << 63)
}

const DIRECTORY_STRIPES: usize = 16;

/// Where each key of one directory-placed actor type (stealable, balanced
/// or first-sender) lives, and how many keys each shard was given.
///
/// A record is the key's route hash ([`route_hash`], 64 bits) and its
/// shard, not the key: records stay as long as the system (a record never
/// changes, so every sender's cached copy stays right), and keys may come
/// from clients (a broker's stream names), so a key ever routed costs a
/// few dozen bytes whatever its length. Keys whose hashes collide share a
/// record, so they live on one shard: harmless, as placement only picks a
/// shard and each key still has its own actor there.
#[derive(Debug)]
pub(crate) struct Directory {
    stripes: Vec<Mutex<HashMap<u64, u32, foldhash::fast::RandomState>>>,
    /// Balanced keys placed per shard. Taken only while a new balanced key
    /// is placed, under its stripe's lock.
    placed: Mutex<Vec<u32>>,
}

impl Directory {
    pub(crate) fn new() -> Self {
        Directory {
            stripes: (0..DIRECTORY_STRIPES)
                .map(|_| Mutex::new(HashMap::default()))
                .collect(),
            placed: Mutex::new(Vec::new()),
        }
    }

    fn stripe(&self, hash: u64) -> &Mutex<HashMap<u64, u32, foldhash::fast::RandomState>> {
        &self.stripes[(hash as usize) % DIRECTORY_STRIPES]
    }

    /// The shard of the key whose route hash is `hash`; the first caller
    /// records `choose()` (a stealable key: the least-loaded shard then).
    pub(crate) fn route(&self, hash: u64, choose: impl FnOnce() -> usize) -> usize {
        let mut map = self.stripe(hash).lock().unwrap_or_else(|p| p.into_inner());
        *map.entry(hash).or_insert_with(|| choose() as u32) as usize
    }

    /// The record of the key whose route hash is `hash`, if there is one
    /// (nothing is placed).
    pub(crate) fn get(&self, hash: u64) -> Option<usize> {
        let map = self.stripe(hash).lock().unwrap_or_else(|p| p.into_inner());
        map.get(&hash).map(|&s| s as usize)
    }

    /// The key's shard; the first caller records the shard of `shards`
    /// given the fewest keys so far by this call (the lowest on a tie), and
    /// counts it there (a balanced key).
    pub(crate) fn route_balanced(&self, hash: u64, shards: usize) -> usize {
        self.route_counted(hash, None, shards)
    }

    /// The key's shard; the first caller records `wanted` if given (a
    /// first-sender key routed from a shard; a key placed ahead), else the
    /// shard of `shards` given the fewest keys so far (the lowest on a tie),
    /// and counts it there.
    pub(crate) fn route_counted(&self, hash: u64, wanted: Option<usize>, shards: usize) -> usize {
        // Chosen under the key's stripe lock, then the counts' (never the
        // other way): concurrent placements of new keys, each under its
        // own stripe, see each other's counts, so the split stays exact.
        self.route(hash, || {
            let mut placed = self.placed.lock().unwrap_or_else(|p| p.into_inner());
            if placed.len() < shards {
                placed.resize(shards, 0);
            }
            let s = wanted.unwrap_or_else(|| (0..shards).min_by_key(|&s| placed[s]).unwrap_or(0));
            if let Some(n) = placed.get_mut(s) {
                *n = n.saturating_add(1);
            }
            s
        })
    }

    /// Number of records.
    pub(crate) fn len(&self) -> usize {
        self.stripes
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).len())
            .sum()
    }

    /// Balanced keys placed on each shard so far.
    #[cfg(test)]
    pub(crate) fn placed(&self) -> Vec<u32> {
        self.placed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directory_first_writer_wins() {
        let d = Directory::new();
        assert_eq!(d.route(7, || 3), 3);
        assert_eq!(d.route(7, || 1), 3);
        assert_eq!(d.len(), 1);
        // A stealable key is not counted as balanced.
        assert!(d.placed().is_empty());
    }

    #[test]
    fn directory_counts_what_it_placed_where() {
        let d = Directory::new();
        for k in 0..6u64 {
            d.route_balanced(k, 3);
        }
        assert_eq!(d.placed(), [2, 2, 2]);
        // A key seen before is not counted again, and keeps its shard.
        let before = d.route_balanced(0, 3);
        assert_eq!(d.route_balanced(0, 3), before);
        assert_eq!(d.placed(), [2, 2, 2]);
        assert_eq!(d.len(), 6);
    }
}
