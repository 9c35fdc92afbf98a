//! The shard-local timer queue: a slab of entries and a min-heap of deadlines.
//!
//! Creating a timer is a slab insert and a heap push; moving it later only
//! rewrites its entry (the heap item is fixed up lazily when it surfaces);
//! moving it earlier pushes one more item; cancelling is a slab remove. Stale
//! heap items are skipped when they surface, and the heap is rebuilt when they
//! outnumber live entries four to one. None of this makes a syscall: the driver
//! arms one kernel timeout for [`TimerQueue::next_deadline`] when the shard parks.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::task::Waker;
use std::time::Instant;

use slab::Slab;

/// Identifies one timer: its slab key and a queue-unique id (keys are reused).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TimerKey {
    key: usize,
    id: u64,
}

#[derive(Debug)]
struct Entry {
    deadline: Instant,
    id: u64,
    waker: Waker,
}

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct TimerQueue {
    entries: Slab<Entry>,
    heap: BinaryHeap<Reverse<(Instant, usize, u64)>>,
    next_id: u64,
}

impl TimerQueue {
    pub(crate) fn insert(&mut self, deadline: Instant, waker: Waker) -> TimerKey {
        self.next_id += 1;
        let id = self.next_id;
        let key = self.entries.insert(Entry {
            deadline,
            id,
            waker,
        });
        self.heap.push(Reverse((deadline, key, id)));
        TimerKey { key, id }
    }

    fn entry_mut(&mut self, timer: TimerKey) -> Option<&mut Entry> {
        self.entries.get_mut(timer.key).filter(|e| e.id == timer.id)
    }

    /// Updates the waker; `false` when the timer already fired or was removed.
    pub(crate) fn set_waker(&mut self, timer: TimerKey, waker: &Waker) -> bool {
        match self.entry_mut(timer) {
            Some(e) => {
                if !e.waker.will_wake(waker) {
                    e.waker = waker.clone();
                }
                true
            }
            None => false,
        }
    }

    /// Moves a timer; `false` when it already fired or was removed.
    pub(crate) fn reset(&mut self, timer: TimerKey, deadline: Instant) -> bool {
        let Some(e) = self.entry_mut(timer) else {
            return false;
        };
        let earlier = deadline < e.deadline;
        e.deadline = deadline;
        if earlier {
            self.heap.push(Reverse((deadline, timer.key, timer.id)));
        }
        true
    }

    pub(crate) fn remove(&mut self, timer: TimerKey) {
        if self.entry_mut(timer).is_some() {
            self.entries.remove(timer.key);
            if self.heap.len() > 64 && self.heap.len() > 4 * self.entries.len() + 64 {
                self.rebuild();
            }
        }
    }

    /// Drops stale heap items in place (no allocation). An item stays while its
    /// timer is live and not due before it (a timer moved later is still
    /// represented by its older, earlier item, which re-files it when it surfaces).
    fn rebuild(&mut self) {
        let entries = &self.entries;
        self.heap.retain(|Reverse((deadline, key, id))| {
            entries
                .get(*key)
                .is_some_and(|e| e.id == *id && *deadline <= e.deadline)
        });
    }

    /// Fires every timer due at `now`, passing its waker to `wake`; returns how many fired.
    pub(crate) fn fire_expired(&mut self, now: Instant, wake: &mut Vec<Waker>) -> usize {
        let mut fired = 0;
        while let Some(Reverse((deadline, key, id))) = self.heap.peek().copied() {
            if deadline > now {
                break;
            }
            self.heap.pop();
            let Some(e) = self.entries.get(key).filter(|e| e.id == id) else {
                continue;
            };
            if e.deadline == deadline {
                let e = self.entries.remove(key);
                wake.push(e.waker);
                fired += 1;
            } else if e.deadline > deadline {
                // Moved later since this item was pushed: re-file it.
                self.heap.push(Reverse((e.deadline, key, id)));
            }
            // Moved earlier: a newer item already stands for it.
        }
        fired
    }

    /// The earliest deadline that may be live (possibly a stale, earlier one).
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((d, _, _))| *d)
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Drops every timer (shutdown).
    pub(crate) fn clear(&mut self) -> Vec<Waker> {
        self.heap.clear();
        self.entries.drain().map(|e| e.waker).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;
    use std::time::Duration;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn fires_in_deadline_order_and_honours_resets() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let t0 = Instant::now();
        let mut q = TimerQueue::default();
        let a = q.insert(t0 + Duration::from_millis(10), waker.clone());
        let b = q.insert(t0 + Duration::from_millis(20), waker.clone());
        let c = q.insert(t0 + Duration::from_millis(30), waker.clone());
        assert!(q.reset(a, t0 + Duration::from_millis(40))); // later: lazy
        assert!(q.reset(c, t0 + Duration::from_millis(5))); // earlier: pushed
        q.remove(b);
        let mut wakers = Vec::new();
        assert_eq!(
            q.fire_expired(t0 + Duration::from_millis(25), &mut wakers),
            1
        );
        assert!(!q.set_waker(c, &waker), "c fired");
        assert!(q.set_waker(a, &waker), "a was moved later");
        assert_eq!(
            q.fire_expired(t0 + Duration::from_millis(45), &mut wakers),
            1
        );
        assert_eq!(q.len(), 0);
        wakers.into_iter().for_each(Waker::wake);
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn compaction_keeps_timers_that_were_moved_later() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let t0 = Instant::now();
        let mut q = TimerQueue::default();
        let kept = q.insert(t0 + Duration::from_millis(1), waker.clone());
        assert!(q.reset(kept, t0 + Duration::from_millis(5)));
        let others: Vec<_> = (0..1_000)
            .map(|i| q.insert(t0 + Duration::from_secs(1 + i), waker.clone()))
            .collect();
        for k in others {
            q.remove(k);
        }
        let mut wakers = Vec::new();
        assert_eq!(
            q.fire_expired(t0 + Duration::from_millis(2), &mut wakers),
            0
        );
        assert_eq!(
            q.fire_expired(t0 + Duration::from_millis(6), &mut wakers),
            1
        );
    }

    #[test]
    fn heap_is_compacted_after_mass_cancellation() {
        let waker = Waker::from(Arc::new(Count(AtomicUsize::new(0))));
        let t0 = Instant::now() + Duration::from_secs(60);
        let mut q = TimerQueue::default();
        let keys: Vec<_> = (0..10_000)
            .map(|i| q.insert(t0 + Duration::from_micros(i), waker.clone()))
            .collect();
        for k in keys {
            q.remove(k);
        }
        assert_eq!(q.len(), 0);
        assert!(q.heap.len() <= 128, "stale items linger: {}", q.heap.len());
    }
}
