//! Consumer groups: each group's last delivered id and read counter, its
//! pending entries list (PEL: delivered, not yet acknowledged, each with
//! its consumer, delivery time and count), and its consumers with their
//! own PELs, kept as Redis keeps them.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;

use crate::id::StreamId;

/// A delivered, unacknowledged entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nack {
    /// The consumer it was delivered to.
    pub consumer: Bytes,
    /// When it was last delivered (Unix ms).
    pub delivery_time: u64,
    /// How many times it was delivered.
    pub delivery_count: u64,
}

/// One consumer of a group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Consumer {
    /// When it last read or claimed (Unix ms).
    pub seen_time: u64,
    /// Its pending entries.
    pub pel: BTreeSet<StreamId>,
}

/// One consumer group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Group {
    /// The last id delivered to the group.
    pub last_id: StreamId,
    /// Entries the group has read, when known (Redis's `entries-read`).
    pub entries_read: Option<u64>,
    /// Pending entries of every consumer.
    pub pel: BTreeMap<StreamId, Nack>,
    /// Consumers by name (sorted, as Redis lists them).
    pub consumers: BTreeMap<Bytes, Consumer>,
}

impl Group {
    /// A group that has read up to `last_id`.
    pub fn new(last_id: StreamId, entries_read: Option<u64>) -> Self {
        Group {
            last_id,
            entries_read,
            ..Group::default()
        }
    }

    /// Makes `name` a consumer if it is not one; whether it was made.
    pub fn create_consumer(&mut self, name: &Bytes, now: u64) -> bool {
        if self.consumers.contains_key(name) {
            return false;
        }
        // Its own copy: the name may be a slice of the request's read
        // buffer, which it would keep for the consumer's life.
        self.consumers.insert(
            Bytes::copy_from_slice(name),
            Consumer {
                seen_time: now,
                pel: BTreeSet::new(),
            },
        );
        true
    }

    /// Removes consumer `name` and its pending entries; how many it had
    /// (`None`: no such consumer).
    pub fn delete_consumer(&mut self, name: &[u8]) -> Option<u64> {
        let consumer = self.consumers.remove(name)?;
        for id in &consumer.pel {
            self.pel.remove(id);
        }
        Some(consumer.pel.len() as u64)
    }

    /// Records `id` as delivered to `consumer` at `now`: a new pending
    /// entry, or one taken over (from whichever consumer had it) with its
    /// count reset, as Redis does when an id is delivered again after
    /// `XGROUP SETID` moved the group back.
    pub fn deliver(&mut self, id: StreamId, consumer: &Bytes, now: u64) {
        self.claim(id, consumer, now, 1);
    }

    /// Acknowledges `id`; whether it was pending.
    pub fn ack(&mut self, id: StreamId) -> bool {
        let Some(nack) = self.pel.remove(&id) else {
            return false;
        };
        if let Some(c) = self.consumers.get_mut(&nack.consumer) {
            c.pel.remove(&id);
        }
        true
    }

    /// Gives pending entry `id` (made if missing) to `consumer`, with its
    /// delivery time and count set.
    pub fn claim(&mut self, id: StreamId, consumer: &Bytes, time: u64, count: u64) {
        // The consumer's own name (see `create_consumer`), not the
        // request's: a pending entry lasts until it is acknowledged.
        let consumer = &match self.consumers.get_key_value(consumer) {
            Some((name, _)) => name.clone(),
            None => Bytes::copy_from_slice(consumer),
        };
        if let Some(old) = self.pel.get(&id) {
            if old.consumer != *consumer {
                if let Some(c) = self.consumers.get_mut(&old.consumer) {
                    c.pel.remove(&id);
                }
            }
        }
        self.pel.insert(
            id,
            Nack {
                consumer: consumer.clone(),
                delivery_time: time,
                delivery_count: count,
            },
        );
        self.consumers
            .entry(consumer.clone())
            .or_default()
            .pel
            .insert(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumers_and_pending_entries_keep_none_of_the_request_s_buffer() {
        // Names sliced from a request's read buffer, as the session hands
        // them over: kept as they are, each would keep the whole buffer
        // for as long as the consumer or its pending entry lives.
        let read = Bytes::from(vec![b'c'; 16 << 10]);
        let inside = |name: &Bytes| {
            let (p, r) = (name.as_ptr() as usize, read.as_ptr() as usize);
            p >= r && p < r + read.len()
        };
        let (a, b) = (read.slice(0..2), read.slice(2..5));
        let mut g = Group::new(StreamId::MIN, Some(0));
        g.create_consumer(&a, 1);
        g.deliver(StreamId::new(1, 0), &a, 10);
        // A consumer made by its claim alone.
        g.claim(StreamId::new(2, 0), &b, 20, 1);
        assert!(g.consumers.keys().all(|name| !inside(name)));
        assert!(g.pel.values().all(|nack| !inside(&nack.consumer)));
        assert_eq!(g.pel[&StreamId::new(2, 0)].consumer, b);
    }

    #[test]
    fn delivery_ack_claim_and_consumer_removal_keep_both_pels_in_step() {
        let a = Bytes::from_static(b"a");
        let b = Bytes::from_static(b"b");
        let mut g = Group::new(StreamId::MIN, Some(0));
        g.create_consumer(&a, 1);
        for ms in 1..=3 {
            g.deliver(StreamId::new(ms, 0), &a, 10);
        }
        assert_eq!(g.consumers[&a].pel.len(), 3);
        assert!(g.ack(StreamId::new(1, 0)));
        assert!(!g.ack(StreamId::new(1, 0)));
        g.claim(StreamId::new(2, 0), &b, 20, 2);
        assert_eq!(g.consumers[&a].pel.len(), 1);
        assert_eq!(g.consumers[&b].pel.len(), 1);
        assert_eq!(g.pel[&StreamId::new(2, 0)].delivery_count, 2);
        // Delivered again (after a SETID back): taken over, count reset.
        g.deliver(StreamId::new(2, 0), &a, 30);
        assert_eq!(g.pel[&StreamId::new(2, 0)].delivery_count, 1);
        assert!(g.consumers[&b].pel.is_empty());
        assert_eq!(g.delete_consumer(b"a"), Some(2));
        assert!(g.pel.is_empty());
        assert_eq!(g.delete_consumer(b"a"), None);
    }
}
