//! Routing: which shard a keyed actor lives on, and actor identities.
//!
//! Sticky keys go through [`RouteHasher`], a fixed, documented hash (stable
//! across processes, platforms and Rust versions), then
//! [`mailring::sticky_shard`]. Stealable keys are recorded in a [`Directory`]
//! the first time any sender routes them; the first writer wins, so every
//! sender agrees on one shard and a key is activated at most once.

use std::any::TypeId;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

/// A stable 64-bit hasher (a SplitMix64 finaliser over 8-byte words) used to
/// route keys. Unlike `DefaultHasher`, its output never changes between
/// builds, so a key always lands on the same shard for a given shard count.
#[derive(Debug, Clone)]
pub struct RouteHasher {
    state: u64,
    tail: u64,
    tail_len: u32,
}

impl Default for RouteHasher {
    fn default() -> Self {
        RouteHasher {
            state: 0x6d61_696c_7269_6e67, // "mailring"
            tail: 0,
            tail_len: 0,
        }
    }
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl RouteHasher {
    fn word(&mut self, w: u64) {
        self.state = mix(self.state ^ w);
    }
}

impl Hasher for RouteHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.tail |= u64::from(b) << (8 * self.tail_len);
            self.tail_len += 1;
            if self.tail_len == 8 {
                let t = self.tail;
                self.word(t);
                self.tail = 0;
                self.tail_len = 0;
            }
        }
    }

    fn write_u64(&mut self, i: u64) {
        self.word(i);
    }

    fn write_u32(&mut self, i: u32) {
        self.word(u64::from(i));
    }

    fn write_usize(&mut self, i: usize) {
        self.word(i as u64);
    }

    fn finish(&self) -> u64 {
        if self.tail_len == 0 {
            self.state
        } else {
            mix(self.state ^ self.tail ^ (u64::from(self.tail_len) << 56))
        }
    }
}

/// The stable routing hash of a key.
pub fn route_hash<K: Hash + ?Sized>(key: &K) -> u64 {
    let mut h = RouteHasher::default();
    key.hash(&mut h);
    h.finish()
}

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
    fn route_hash_is_stable() {
        // Known answers: changing these moves every sticky key in deployed systems.
        assert_eq!(route_hash(&42u64), route_hash(&42u64));
        let known: Vec<u64> = (0u64..4).map(|k| route_hash(&k) % 16).collect();
        assert_eq!(known, KNOWN_U64_MOD16);
        assert_ne!(route_hash("tenant-a"), route_hash("tenant-b"));
    }

    const KNOWN_U64_MOD16: [u64; 4] = [10, 12, 15, 1];

    #[test]
    fn directory_first_writer_wins() {
        let d = Directory::new();
        assert_eq!(d.route(&7u64, 7, || 3), 3);
        assert_eq!(d.route(&7u64, 7, || 1), 3);
        assert_eq!(d.len(), 1);
    }
}
