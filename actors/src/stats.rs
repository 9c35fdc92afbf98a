//! Per-actor-type counters, kept in shard-local cells (no atomics on the
//! message path) and gathered on demand.

use std::collections::BTreeMap;

/// The counters of one actor type on one shard.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ActorTypeStats {
    /// `std::any::type_name` of the actor type.
    pub actor_type: &'static str,
    /// The shard.
    pub shard: usize,
    /// Actors of this type active on the shard now.
    pub active: usize,
    /// Messages handled, counting closures run by `run_now`.
    pub handled: u64,
    /// Of `handled`: closures run on an idle actor by
    /// [`Addr::run_now`](crate::Addr::run_now).
    pub ran_now: u64,
    /// Activations (keyed) and spawns (unkeyed).
    pub activations: u64,
    /// Keyed actors passivated.
    pub passivations: u64,
    /// Restarts after panics.
    pub restarts: u64,
    /// Handler or `on_start` panics.
    pub panics: u64,
    /// Actors stopped for good (unkeyed) or by `cx.stop()`.
    pub stops: u64,
    /// Messages that found no live actor.
    pub dead_letters: u64,
    /// The longest any mailbox of this type has been.
    pub mailbox_high_water: usize,
}

/// A snapshot of the whole system: per shard and per type, and totals per type.
#[derive(Debug, Clone, Default)]
pub struct ActorStats {
    /// One entry per (shard, actor type) that has been used.
    pub per_shard: Vec<ActorTypeStats>,
}

impl ActorStats {
    pub(crate) fn from_shards(mut per_shard: Vec<ActorTypeStats>) -> Self {
        per_shard.sort_by(|a, b| (a.actor_type, a.shard).cmp(&(b.actor_type, b.shard)));
        ActorStats { per_shard }
    }

    /// The counters of the type whose name ends with `name`, summed over shards
    /// (`mailbox_high_water` is the maximum; `shard` is meaningless).
    pub fn by_type(&self, name: &str) -> Option<ActorTypeStats> {
        let mut totals: BTreeMap<&'static str, ActorTypeStats> = BTreeMap::new();
        for s in self
            .per_shard
            .iter()
            .filter(|s| s.actor_type.ends_with(name))
        {
            let t = totals
                .entry(s.actor_type)
                .or_insert_with(|| ActorTypeStats {
                    actor_type: s.actor_type,
                    ..Default::default()
                });
            t.active += s.active;
            t.handled += s.handled;
            t.ran_now += s.ran_now;
            t.activations += s.activations;
            t.passivations += s.passivations;
            t.restarts += s.restarts;
            t.panics += s.panics;
            t.stops += s.stops;
            t.dead_letters += s.dead_letters;
            t.mailbox_high_water = t.mailbox_high_water.max(s.mailbox_high_water);
        }
        totals.into_values().next()
    }

    /// Where actors of the type whose name ends with `name` are active: `(shard, count)`.
    pub fn active_by_shard(&self, name: &str) -> Vec<(usize, usize)> {
        self.per_shard
            .iter()
            .filter(|s| s.actor_type.ends_with(name))
            .map(|s| (s.shard, s.active))
            .collect()
    }
}
