//! Where a task runs: [`Placement`] and the stable key → shard hash.

use crate::shard::ShardId;

/// Where a spawned task runs.
///
/// | placement | shard chosen | may be stolen before it starts |
/// | --- | --- | --- |
/// | `Pinned(s)` | `s` | no |
/// | `Sticky(key)` | [`sticky_shard`]`(key, n)`, the same for a key while the shard count stays the same | no |
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
    /// The shard a stable hash of the key picks.
    Sticky(u64),
    /// Each spawn on the next shard, in turn.
    RoundRobin,
    /// The least-loaded shard; idle shards may steal it before it starts.
    Stealable,
    /// This shard first; idle shards may steal it before it starts.
    StealablePreferred(ShardId),
}

/// The shard that owns `key` in a runtime of `shards` shards.
///
/// The result depends only on `key` and `shards` (not on the process, the
/// platform or the mailring version's hasher seed), so routers on different
/// nodes or restarts agree. It mixes the key with the SplitMix64 finaliser and
/// maps it onto the shards with a multiply-shift (Lemire's reduction).
///
/// # Panics
///
/// When `shards` is zero.
#[inline]
pub fn sticky_shard(key: u64, shards: usize) -> ShardId {
    assert!(shards > 0, "sticky_shard needs at least one shard");
    let mut z = key.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    ShardId::new(((u128::from(z) * shards as u128) >> 64) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sticky_is_stable_and_spread() {
        // Pinned values: changing the hash would move every user's keys.
        assert_eq!(sticky_shard(0, 4).index(), sticky_shard(0, 4).index());
        let mut counts = [0usize; 4];
        for k in 0..40_000u64 {
            counts[sticky_shard(k, 4).index()] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "uneven spread: {counts:?}");
        }
        assert_eq!(sticky_shard(42, 1).index(), 0);
    }

    #[test]
    fn sticky_known_answers() {
        let got: Vec<usize> = (0..8).map(|k| sticky_shard(k, 16).index()).collect();
        assert_eq!(got, KNOWN_16);
    }

    const KNOWN_16: [usize; 8] = [14, 9, 9, 1, 6, 6, 11, 6];
}
