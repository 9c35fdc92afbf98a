//! Routing: which shard a keyed actor lives on, and actor identities.
//!
//! Sticky keys go through the runtime's one routing function,
//! [`mailring::sticky_shard`] ([`RouteHasher`], a fixed, documented hash,
//! stable across processes, platforms and Rust versions, then a map onto the
//! shards), so a key picks the same shard for a task
//! (`Placement::Sticky(k)`), a keyed actor and (next) a session. Stealable keys are recorded in a [`Directory`]
//! the first time any sender routes them; the first writer wins, so every
//! sender agrees on one shard and a key is activated at most once.

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

/// Where each stealable key of one actor type lives.
#[derive(Debug)]
pub(crate) struct Directory<K> {
    stripes: Vec<Mutex<HashMap<K, u32, foldhash::fast::RandomState>>>,
}

impl<K: Hash + Eq + Clone> Directory<K> {
    pub(crate) fn new() -> Self {
        Directory {
            stripes: (0..DIRECTORY_STRIPES)
                .map(|_| Mutex::new(HashMap::default()))
                .collect(),
        }
    }

    /// The key's shard; the first caller records `choose()`.
    pub(crate) fn route(&self, key: &K, hash: u64, choose: impl FnOnce() -> usize) -> usize {
        let stripe = &self.stripes[(hash as usize) % DIRECTORY_STRIPES];
        let mut map = stripe.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&s) = map.get(key) {
            return s as usize;
        }
        let s = choose();
        map.insert(key.clone(), s as u32);
        s
    }

    /// Number of keys recorded.
    pub(crate) fn len(&self) -> usize {
        self.stripes
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directory_first_writer_wins() {
        let d = Directory::new();
        assert_eq!(d.route(&7u64, 7, || 3), 3);
        assert_eq!(d.route(&7u64, 7, || 1), 3);
        assert_eq!(d.len(), 1);
    }
}
