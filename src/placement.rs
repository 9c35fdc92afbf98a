//! Where a task runs: [`Placement`], and the one key → shard routing
//! function ([`sticky_shard`], over the stable [`RouteHasher`]) that tasks,
//! keyed actors and sessions share, so one key means one shard everywhere.

use std::hash::{Hash, Hasher};

use crate::shard::ShardId;

/// Where a spawned task runs.
///
/// | placement | shard chosen | may be stolen before it starts |
/// | --- | --- | --- |
/// | `Pinned(s)` | `s` | no |
/// | `Sticky(key)` | [`sticky_shard`]`(&key, n)`, the same for a key while the shard count stays the same, and the shard of the keyed actor with the `u64` key `key` | no |
/// | `RoundRobin` | the next shard in turn | no |
/// | `Stealable` | the least-loaded shard at submission (the current one on ties) | yes |
/// | `StealablePreferred(s)` | `s` | yes |
///
/// Whatever the placement, a task that has started never changes shard: its
/// in-flight operations belong to that shard's ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Placement {
    /// Always this shard.
    Pinned(ShardId),
    /// The shard [`sticky_shard`] picks for the key: the same shard as a
    /// keyed actor (or session) whose key is this `u64`.
    Sticky(u64),
    /// Each spawn on the next shard, in turn.
    RoundRobin,
    /// The least-loaded shard; idle shards may steal it before it starts.
    Stealable,
    /// This shard first; idle shards may steal it before it starts.
    StealablePreferred(ShardId),
}

/// The shard that owns `key` in a runtime of `shards` shards: the one
/// routing function of mailring. A task spawned with
/// [`Placement::Sticky`]`(k)`, a keyed actor whose key is `k` and a session
/// keyed by `k` all land on `sticky_shard(&k, shards)`.
///
/// The result depends only on the key's [`Hash`] input and `shards` (not on
/// the process, the platform or a hasher seed), so routers on different
/// nodes or restarts agree: the key is hashed with [`RouteHasher`], then
/// mapped onto the shards by [`shard_for_hash`].
///
/// # Panics
///
/// When `shards` is zero.
///
/// # Examples
///
/// ```
/// use mailring::{sticky_shard, Placement};
///
/// let rt = mailring::Runtime::builder().shards(2).build()?;
/// let shard = rt.block_on(async {
///     mailring::spawn_with(Placement::Sticky(42), async { mailring::current_shard() })
///         .await
///         .unwrap()
/// });
/// assert_eq!(shard, Some(sticky_shard(&42u64, 2)));
/// # Ok::<(), mailring::BuildError>(())
/// ```
#[inline]
pub fn sticky_shard<K: Hash + ?Sized>(key: &K, shards: usize) -> ShardId {
    shard_for_hash(route_hash(key), shards)
}

/// Maps a [`route_hash`] onto `shards` shards: the second half of
/// [`sticky_shard`], for callers that keep the hash (the actor layer hashes
/// a key once per address).
///
/// It mixes the hash with the SplitMix64 finaliser and maps it onto the
/// shards with a multiply-shift (Lemire's reduction).
///
/// # Panics
///
/// When `shards` is zero.
#[inline]
pub fn shard_for_hash(hash: u64, shards: usize) -> ShardId {
    assert!(shards > 0, "sticky_shard needs at least one shard");
    let z = mix(hash);
    ShardId::new(((u128::from(z) * shards as u128) >> 64) as usize)
}

/// The SplitMix64 finaliser.
#[inline]
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The stable routing hash of a key (see [`RouteHasher`]).
#[inline]
pub fn route_hash<K: Hash + ?Sized>(key: &K) -> u64 {
    let mut h = RouteHasher::default();
    key.hash(&mut h);
    h.finish()
}

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

impl RouteHasher {
    #[inline]
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sticky_is_stable_and_spread() {
        assert_eq!(sticky_shard(&0u64, 4), sticky_shard(&0u64, 4));
        let mut counts = [0usize; 4];
        for k in 0..40_000u64 {
            counts[sticky_shard(&k, 4).index()] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "uneven spread: {counts:?}");
        }
        assert_eq!(sticky_shard(&42u64, 1).index(), 0);
        assert_eq!(
            sticky_shard(&42u64, 2),
            shard_for_hash(route_hash(&42u64), 2)
        );
    }

    #[test]
    fn shard_for_hash_known_answers() {
        // Pinned values: changing the map would move every user's keys.
        let got: Vec<usize> = (0..8).map(|h| shard_for_hash(h, 16).index()).collect();
        assert_eq!(got, KNOWN_16);
    }

    const KNOWN_16: [usize; 8] = [14, 9, 9, 1, 6, 6, 11, 6];

    #[test]
    fn route_hash_is_stable() {
        // Known answers: changing these moves every sticky key in deployed systems.
        assert_eq!(route_hash(&42u64), route_hash(&42u64));
        let known: Vec<u64> = (0u64..4).map(|k| route_hash(&k) % 16).collect();
        assert_eq!(known, KNOWN_U64_MOD16);
        assert_ne!(route_hash("tenant-a"), route_hash("tenant-b"));
    }

    const KNOWN_U64_MOD16: [u64; 4] = [10, 12, 15, 1];
}
