//! [`WaitList`]: the wakers of tasks waiting for one event, each in a slot
//! of its own, so that a waiter that gives up takes its waker back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Waker;

/// Hands each [`WaitList`] an id of its own, so that a key never names a
/// slot of another list.
static NEXT_LIST: AtomicU64 = AtomicU64::new(0);

/// The wakers of tasks waiting for one event, each listed in a slot of its
/// own under a [`WaitKey`] the waiter keeps.
///
/// A waiter polled again replaces its waker in place (no duplicate, no scan
/// of the list); one that gives up (a future dropped by a timeout or a
/// `select!`) takes its waker back with [`remove`](Self::remove), so the
/// list never holds the task of a wait nobody awaits any more; and the
/// event takes every waker at once ([`take_all`](Self::take_all),
/// [`drain_into`](Self::drain_into)). A wake ends every listing: a waiter
/// that still has to wait after it lists itself again, and removing under
/// a key from before the wake does nothing.
///
/// The list is not synchronised: keep it in the state its event is checked
/// under (a `RefCell` of one thread, or a `Mutex`).
///
/// # Examples
///
/// ```
/// use std::task::{Poll, Waker};
/// use mailring::sync::{WaitKey, WaitList};
///
/// let mut list = WaitList::new();
/// let mut first: Option<WaitKey> = None;
/// let mut second: Option<WaitKey> = None;
/// let _ = list.register(&mut first, Waker::noop());
/// let _ = list.register(&mut first, Waker::noop()); // polled again: still one
/// let _ = list.register(&mut second, Waker::noop());
/// assert_eq!(list.len(), 2);
/// list.remove(&mut first); // the first waiter gave up
/// assert_eq!(list.len(), 1);
/// assert_eq!(list.take_all().count(), 1);
/// assert!(list.is_empty());
/// list.remove(&mut second); // after the wake: nothing to take back
/// assert!(second.is_none());
/// ```
#[derive(Debug)]
pub struct WaitList {
    id: u64,
    /// How many times the list was emptied by a wake: a key from an
    /// earlier round names nothing.
    round: u64,
    slots: Vec<Option<Waker>>,
    /// Emptied slots of this round, to reuse.
    free: Vec<usize>,
    len: usize,
}

/// A waiter's place in one [`WaitList`], from the
/// [`register`](WaitList::register) that made it until the list's next
/// wake or its [`remove`](WaitList::remove). Neither `Clone` nor `Copy`:
/// one waiter, one key.
#[derive(Debug, PartialEq, Eq)]
pub struct WaitKey {
    list: u64,
    round: u64,
    slot: usize,
}

impl Default for WaitList {
    fn default() -> Self {
        Self::new()
    }
}

impl WaitList {
    /// An empty list.
    pub fn new() -> WaitList {
        WaitList {
            id: NEXT_LIST.fetch_add(1, Ordering::Relaxed),
            round: 0,
            slots: Vec::new(),
            free: Vec::new(),
            len: 0,
        }
    }

    /// How many wakers are listed.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no waker is listed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `key` names a waker listed here (one of this list's, given
    /// since its last wake and not removed).
    pub fn holds(&self, key: &Option<WaitKey>) -> bool {
        key.as_ref()
            .and_then(|k| self.slot_of(k))
            .is_some_and(|slot| self.slots[slot].is_some())
    }

    /// The slot `key` names in this list, in this round.
    fn slot_of(&self, key: &WaitKey) -> Option<usize> {
        (key.list == self.id && key.round == self.round).then_some(key.slot)
    }

    /// Lists `waker` for the waiter holding `key`: in place of its earlier
    /// waker when `key` names a slot of this list that no wake emptied
    /// since, else in a new slot, which `key` then names. The waker it
    /// replaced comes back, to be dropped once the state the list lives in
    /// is released (a waker's drop may run code that looks there).
    #[must_use = "the replaced waker is to be dropped once the list's lock or borrow is released"]
    pub fn register(&mut self, key: &mut Option<WaitKey>, waker: &Waker) -> Option<Waker> {
        if let Some(slot) = key.as_ref().and_then(|k| self.slot_of(k)) {
            return match &mut self.slots[slot] {
                Some(listed) if listed.will_wake(waker) => None,
                listed => {
                    debug_assert!(listed.is_some(), "a live key names a listed waker");
                    listed.replace(waker.clone())
                }
            };
        }
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot] = Some(waker.clone());
                slot
            }
            None => {
                self.slots.push(Some(waker.clone()));
                self.slots.len() - 1
            }
        };
        self.len += 1;
        *key = Some(WaitKey {
            list: self.id,
            round: self.round,
            slot,
        });
        None
    }

    /// Takes back the waker `key` names, if a wake has not taken it yet;
    /// `key` is `None` afterwards either way. Drop what comes back once the
    /// state the list lives in is released.
    pub fn remove(&mut self, key: &mut Option<WaitKey>) -> Option<Waker> {
        let slot = key.take().and_then(|k| self.slot_of(&k))?;
        let waker = self.slots[slot].take();
        if waker.is_some() {
            self.len -= 1;
            self.free.push(slot);
        }
        waker
    }

    /// Ends this round: every key given out before names nothing now.
    fn next_round(&mut self) {
        self.free.clear();
        self.len = 0;
        self.round += 1;
    }

    /// Takes every listed waker, to wake once the state the list lives in
    /// is released (the list keeps no allocation).
    pub fn take_all(&mut self) -> TakenWakers {
        let slots = std::mem::take(&mut self.slots);
        self.next_round();
        TakenWakers(slots.into_iter())
    }

    /// Moves every listed waker to the end of `out` (the list keeps its
    /// allocation for the next round).
    pub fn drain_into(&mut self, out: &mut Vec<Waker>) {
        if self.len > 0 {
            out.extend(self.slots.drain(..).flatten());
        } else {
            self.slots.clear();
        }
        self.next_round();
    }
}

/// The wakers [`WaitList::take_all`] took.
#[derive(Debug)]
pub struct TakenWakers(std::vec::IntoIter<Option<Waker>>);

impl TakenWakers {
    /// Wakes each of them.
    pub fn wake(self) {
        self.for_each(Waker::wake);
    }
}

impl Iterator for TakenWakers {
    type Item = Waker;

    fn next(&mut self) -> Option<Waker> {
        self.0.by_ref().flatten().next()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::task::Wake;

    struct Count(std::sync::atomic::AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn counting() -> (Arc<Count>, Waker) {
        let count = Arc::new(Count(Default::default()));
        (count.clone(), Waker::from(count))
    }

    #[test]
    fn a_waiter_that_gives_up_holds_no_waker_and_a_wake_reaches_the_rest() {
        let mut list = WaitList::new();
        let (gave_up, gave_up_waker) = counting();
        let (stays, stays_waker) = counting();
        let mut a = None;
        let mut b = None;
        let _ = list.register(&mut a, &gave_up_waker);
        let _ = list.register(&mut b, &stays_waker);
        drop(gave_up_waker);
        assert!(list.remove(&mut a).is_some());
        // The list holds no reference to the waiter that gave up.
        assert_eq!(Arc::strong_count(&gave_up), 1);
        list.take_all().wake();
        assert_eq!(stays.0.load(Ordering::Relaxed), 1);
        assert_eq!(gave_up.0.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_key_from_before_a_wake_or_from_another_list_removes_nothing() {
        let mut list = WaitList::new();
        let mut other = WaitList::new();
        let (_, w) = counting();
        let mut old = None;
        let _ = list.register(&mut old, &w);
        let mut out = Vec::new();
        list.drain_into(&mut out);
        assert_eq!(out.len(), 1);
        // A new waiter takes slot 0 again in the new round.
        let mut new = None;
        let _ = list.register(&mut new, &w);
        assert!(list.remove(&mut old).is_none());
        assert_eq!(list.len(), 1);
        let mut foreign = None;
        let _ = other.register(&mut foreign, &w);
        assert!(list.remove(&mut foreign).is_none());
        assert_eq!((list.len(), other.len()), (1, 1));
        // Re-registering under a stale key lists a new slot.
        let mut stale = None;
        let _ = other.register(&mut stale, &w);
        other.take_all();
        let _ = other.register(&mut stale, &w);
        assert_eq!(other.len(), 1);
    }

    #[test]
    fn polling_again_replaces_the_waker_in_place() {
        let mut list = WaitList::new();
        let (first, w1) = counting();
        let (second, w2) = counting();
        let mut key = None;
        for _ in 0..100 {
            let _ = list.register(&mut key, &w1);
        }
        let _ = list.register(&mut key, &w2);
        assert_eq!(list.len(), 1);
        list.take_all().wake();
        assert_eq!(first.0.load(Ordering::Relaxed), 0);
        assert_eq!(second.0.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn freed_slots_are_reused() {
        let mut list = WaitList::new();
        let (_, w) = counting();
        let mut keys: Vec<Option<WaitKey>> = (0..8).map(|_| None).collect();
        for round in 0..1000 {
            for k in keys.iter_mut() {
                let _ = list.register(k, &w);
            }
            for k in keys.iter_mut() {
                list.remove(k);
            }
            assert!(list.is_empty(), "round {round}");
        }
        assert!(list.slots.len() <= 8);
    }
}
