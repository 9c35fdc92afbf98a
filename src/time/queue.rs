//! The shard-local timer queue: a hierarchical timing wheel over a slab of
//! entries linked into per-slot lists.
//!
//! Deadlines are kept exactly (nanoseconds since the queue's origin); the wheel
//! only sorts them coarsely. Level 0 has 64 slots of one tick (2^10 ns, about a
//! microsecond); each level above has 64 slots as wide as the whole level
//! below, so seven levels span one turn of about 52 days. Deadlines in a later
//! turn wait in a separate list that is filed into the wheel when the turn
//! they fall in begins.
//!
//! - Creating a timer takes a free slab entry and links it at the head of its
//!   slot's list: no allocation once the slab has grown, no search.
//! - Moving a timer later only rewrites its deadline; it stays in its earlier
//!   slot and is re-filed when that slot is processed. Moving it earlier
//!   re-links it (unlink and link, O(1)).
//! - Cancelling unlinks it and frees the entry (O(1), nothing left behind).
//! - Firing walks the wheel from the last processed tick to now, slot by slot
//!   through per-level occupancy bitmaps, firing what is due and cascading the
//!   rest of a higher-level slot down to finer slots.
//!
//! None of this makes a syscall: the driver arms one kernel timeout for
//! [`TimerQueue::next_deadline`] when the shard parks.

use std::num::NonZeroU64;
use std::task::Waker;
use std::time::{Duration, Instant};

/// log2 of the tick in nanoseconds (1.024 µs).
const TICK_SHIFT: u32 = 10;
const SLOT_BITS: u32 = 6;
const SLOTS: usize = 1 << SLOT_BITS;
const LEVELS: usize = 7;
/// Ticks spanned by the whole wheel, as a mask of the low bits.
const WHEEL_MASK: u64 = (1 << (SLOT_BITS as usize * LEVELS)) - 1;
/// The list of deadlines beyond the current turn of the wheel (not a wheel slot).
const FAR: usize = SLOTS * LEVELS;
/// "No entry" in the links.
const NIL: u32 = u32::MAX;
/// A `prev` link with this bit set names the slot whose list the entry heads.
const HEAD: u32 = 1 << 31;

/// Identifies one timer: its slab index and the entry's generation when it was
/// created (entries are reused; a stale key never matches).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TimerKey(NonZeroU64);

impl TimerKey {
    fn new(index: u32, generation: u32) -> Self {
        // Generations start at 1 and skip 0 when they wrap, so the value is non-zero.
        let raw = (u64::from(generation) << 32) | u64::from(index);
        TimerKey(NonZeroU64::new(raw).expect("timer generations are never zero"))
    }

    fn index(self) -> usize {
        (self.0.get() & u64::from(u32::MAX)) as usize
    }

    fn generation(self) -> u32 {
        (self.0.get() >> 32) as u32
    }
}

#[derive(Debug)]
struct Entry {
    /// Nanoseconds since the queue's origin.
    deadline: u64,
    /// `Some` while the timer is live.
    waker: Option<Waker>,
    /// The previous entry in the slot list, or `HEAD | slot` for the list head.
    prev: u32,
    /// The next entry in the slot list, or the next free entry while free.
    next: u32,
    generation: u32,
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct TimerQueue {
    origin: Instant,
    entries: Vec<Entry>,
    free: u32,
    live: usize,
    /// Every tick before this one has been processed.
    elapsed: u64,
    /// No live timer is due before this (ns since origin); `u64::MAX` when empty.
    next_bound: u64,
    /// List heads: the wheel's slots, then `FAR`.
    heads: Box<[u32; SLOTS * LEVELS + 1]>,
    /// Per level, which slots are non-empty (the last word only tracks `FAR`).
    occupied: [u64; LEVELS + 1],
    /// The tick the next turn begins at, when `FAR` is refiled (while it is non-empty).
    far_check: u64,
    /// Entries due later within the tick being fired (scratch, kept for its capacity).
    held: Vec<u32>,
}

impl TimerQueue {
    /// A queue whose deadlines are measured from `origin` (earlier ones count as `origin`).
    pub(crate) fn new(origin: Instant) -> Self {
        TimerQueue {
            origin,
            entries: Vec::new(),
            free: NIL,
            live: 0,
            elapsed: 0,
            next_bound: u64::MAX,
            heads: Box::new([NIL; SLOTS * LEVELS + 1]),
            occupied: [0; LEVELS + 1],
            far_check: 0,
            held: Vec::new(),
        }
    }

    fn nanos(&self, at: Instant) -> u64 {
        let since = at.saturating_duration_since(self.origin);
        since
            .as_secs()
            .saturating_mul(1_000_000_000)
            .saturating_add(u64::from(since.subsec_nanos()))
    }

    pub(crate) fn insert(&mut self, deadline: Instant, waker: Waker) -> TimerKey {
        let deadline = self.nanos(deadline);
        let index = if self.free == NIL {
            let index = u32::try_from(self.entries.len())
                .ok()
                .filter(|i| i & HEAD == 0)
                .expect("more than 2^31 live timers on one shard");
            self.entries.push(Entry {
                deadline,
                waker: Some(waker),
                prev: NIL,
                next: NIL,
                generation: 1,
            });
            index
        } else {
            let index = self.free;
            let e = &mut self.entries[index as usize];
            self.free = e.next;
            e.deadline = deadline;
            e.waker = Some(waker);
            index
        };
        self.live += 1;
        self.link(index);
        self.next_bound = self.next_bound.min(deadline);
        TimerKey::new(index, self.entries[index as usize].generation)
    }

    fn entry_mut(&mut self, timer: TimerKey) -> Option<&mut Entry> {
        self.entries
            .get_mut(timer.index())
            .filter(|e| e.generation == timer.generation())
    }

    /// Updates the waker; `false` when the timer already fired or was removed.
    pub(crate) fn set_waker(&mut self, timer: TimerKey, waker: &Waker) -> bool {
        match self.entry_mut(timer).and_then(|e| e.waker.as_mut()) {
            Some(current) => {
                if !current.will_wake(waker) {
                    *current = waker.clone();
                }
                true
            }
            None => false,
        }
    }

    /// Moves a timer; `false` when it already fired or was removed.
    pub(crate) fn reset(&mut self, timer: TimerKey, deadline: Instant) -> bool {
        let deadline = self.nanos(deadline);
        let Some(e) = self.entry_mut(timer) else {
            return false;
        };
        let earlier = deadline < e.deadline;
        e.deadline = deadline;
        if earlier {
            // Its slot may be later than the new deadline: file it again.
            let index = timer.index() as u32;
            self.unlink(index);
            self.link(index);
            self.next_bound = self.next_bound.min(deadline);
        }
        // Later: it stays in its earlier slot and is re-filed from there.
        true
    }

    pub(crate) fn remove(&mut self, timer: TimerKey) {
        if self.entry_mut(timer).is_some() {
            let index = timer.index() as u32;
            self.unlink(index);
            self.release(index);
        }
    }

    /// Frees an unlinked entry; returns its waker.
    fn release(&mut self, index: u32) -> Option<Waker> {
        let e = &mut self.entries[index as usize];
        let waker = e.waker.take();
        e.prev = NIL;
        match e.generation.checked_add(1) {
            Some(next) => {
                e.generation = next;
                e.next = self.free;
                self.free = index;
            }
            // Its generations are spent: wrapping them would let a key
            // made 2^32 uses ago match a later timer here (a `Sleep` not
            // polled since would remove or take over that timer). Retired
            // instead, with a generation no key has, and never used again
            // (an entry's few dozen bytes per four billion timers).
            None => {
                e.generation = 0;
                e.next = NIL;
            }
        }
        self.live -= 1;
        if self.live == 0 {
            self.next_bound = u64::MAX;
        }
        waker
    }

    /// The list (level * SLOTS + slot, or `FAR`) for a deadline in ticks.
    fn slot_for(&mut self, tick: u64) -> usize {
        let tick = tick.max(self.elapsed);
        // The highest bit where the deadline differs from now picks the level.
        let differing = (tick ^ self.elapsed) | (SLOTS as u64 - 1);
        if differing > WHEEL_MASK {
            self.far_check = (self.elapsed | WHEEL_MASK) + 1;
            return FAR;
        }
        let level = ((63 - differing.leading_zeros()) / SLOT_BITS) as usize;
        let slot = ((tick >> (level as u32 * SLOT_BITS)) as usize) & (SLOTS - 1);
        level * SLOTS + slot
    }

    /// Links an entry at the head of the list for its deadline.
    fn link(&mut self, index: u32) {
        let bucket = self.slot_for(self.entries[index as usize].deadline >> TICK_SHIFT);
        let head = self.heads[bucket];
        if head != NIL {
            self.entries[head as usize].prev = index;
        }
        let e = &mut self.entries[index as usize];
        e.prev = HEAD | bucket as u32;
        e.next = head;
        self.heads[bucket] = index;
        self.occupied[bucket / SLOTS] |= 1 << (bucket % SLOTS);
    }

    fn unlink(&mut self, index: u32) {
        let Entry { prev, next, .. } = self.entries[index as usize];
        if prev & HEAD != 0 {
            let bucket = (prev & !HEAD) as usize;
            self.heads[bucket] = next;
            if next == NIL {
                self.occupied[bucket / SLOTS] &= !(1 << (bucket % SLOTS));
            }
        } else {
            self.entries[prev as usize].next = next;
        }
        if next != NIL {
            self.entries[next as usize].prev = prev;
        }
    }

    /// The earliest occupied slot and the tick it starts at.
    fn next_slot(&self) -> Option<(usize, u64)> {
        for (level, &occupied) in self.occupied[..LEVELS].iter().enumerate() {
            if occupied == 0 {
                continue;
            }
            let shift = level as u32 * SLOT_BITS;
            let position = ((self.elapsed >> shift) as usize) & (SLOTS - 1);
            let slot = (position
                + occupied.rotate_right(position as u32).trailing_zeros() as usize)
                % SLOTS;
            let turn = 1u64 << (shift + SLOT_BITS);
            let mut start = (self.elapsed & !(turn - 1)) + ((slot as u64) << shift);
            if slot < position {
                // Not reached in practice (a slot behind the position would have
                // been processed), but a later turn is the safe reading.
                start += turn;
            }
            // Slots at a lower level all start before any slot at a higher one.
            return Some((level * SLOTS + slot, start.max(self.elapsed)));
        }
        None
    }

    /// Fires every timer due at `now`, passing its waker to `wake`; returns how many fired.
    pub(crate) fn fire_expired(&mut self, now: Instant, wake: &mut Vec<Waker>) -> usize {
        let now = self.nanos(now);
        let now_tick = now >> TICK_SHIFT;
        let mut fired = 0;
        loop {
            let bucket = match self.next_slot() {
                Some((bucket, start)) if start <= now_tick => {
                    self.elapsed = start;
                    bucket
                }
                // Every slot of this turn up to now is done; the next turn has begun.
                _ if self.heads[FAR] != NIL && self.far_check <= now_tick => {
                    self.elapsed = self.far_check;
                    FAR
                }
                _ => break,
            };
            let mut cursor = std::mem::replace(&mut self.heads[bucket], NIL);
            self.occupied[bucket / SLOTS] &= !(1 << (bucket % SLOTS));
            while cursor != NIL {
                let index = cursor;
                let deadline = self.entries[index as usize].deadline;
                cursor = self.entries[index as usize].next;
                if deadline <= now {
                    if let Some(waker) = self.release(index) {
                        wake.push(waker);
                    }
                    fired += 1;
                } else if deadline >> TICK_SHIFT <= now_tick {
                    // Due later in the tick being fired: file it after the walk.
                    self.held.push(index);
                } else {
                    self.link(index);
                }
            }
        }
        self.elapsed = self.elapsed.max(now_tick);
        let mut held = std::mem::take(&mut self.held);
        for index in held.drain(..) {
            self.link(index);
        }
        self.held = held;
        self.next_bound = self.lower_bound();
        fired
    }

    /// A lower bound on the live deadlines: exact when the earliest slot is a
    /// level-0 one holding it, the slot's start otherwise (the wheel then wakes
    /// there to cascade or re-file).
    fn lower_bound(&self) -> u64 {
        let far = if self.heads[FAR] == NIL {
            u64::MAX
        } else {
            self.far_check.saturating_mul(1 << TICK_SHIFT)
        };
        let Some((bucket, start)) = self.next_slot() else {
            return far;
        };
        if bucket >= SLOTS {
            return start.saturating_mul(1 << TICK_SHIFT);
        }
        // Entries moved later still sit here: past the slot's end, other slots
        // may be earlier.
        let mut earliest = (start + 1).saturating_mul(1 << TICK_SHIFT);
        let mut cursor = self.heads[bucket];
        while cursor != NIL {
            let e = &self.entries[cursor as usize];
            earliest = earliest.min(e.deadline);
            cursor = e.next;
        }
        earliest
    }

    /// The earliest deadline that may be live (possibly earlier than any).
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        (self.live > 0).then(|| super::after(self.origin, Duration::from_nanos(self.next_bound)))
    }

    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// Drops every timer (shutdown).
    pub(crate) fn clear(&mut self) -> Vec<Waker> {
        let wakers = self.entries.drain(..).filter_map(|e| e.waker).collect();
        self.free = NIL;
        self.live = 0;
        self.next_bound = u64::MAX;
        self.heads.fill(NIL);
        self.occupied = [0; LEVELS + 1];
        wakers
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Wakes by recording which timer it stands for.
    struct Tagged(u64, Arc<std::sync::Mutex<Vec<u64>>>);
    impl Wake for Tagged {
        fn wake(self: Arc<Self>) {
            self.1.lock().unwrap().push(self.0);
        }
    }

    /// An entry whose generations are spent is retired: a key made before
    /// the last of them matches nothing later, and the entry is not handed
    /// out again.
    #[test]
    fn an_entry_whose_generations_are_spent_is_retired() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let t0 = Instant::now();
        let mut q = TimerQueue::new(t0);
        let a = q.insert(t0 + Duration::from_secs(3600), waker.clone());
        q.remove(a);
        q.entries[a.index()].generation = u32::MAX;
        let last = q.insert(t0 + Duration::from_secs(3600), waker.clone());
        assert_eq!((last.index(), last.generation()), (a.index(), u32::MAX));
        q.remove(last);
        // Taken again, the entry would carry generation 1 (wrapped) and
        // the next key would be another's: it is retired instead.
        let next = q.insert(t0 + Duration::from_secs(3600), waker.clone());
        assert_ne!(next.index(), a.index());
        assert!(!q.set_waker(last, &waker), "a spent key matched");
        assert!(!q.reset(last, t0 + Duration::from_secs(1)));
        assert!(q.set_waker(next, &waker));
    }

    #[test]
    fn fires_in_deadline_order_and_honours_resets() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let t0 = Instant::now();
        let mut q = TimerQueue::new(t0);
        let a = q.insert(t0 + Duration::from_millis(10), waker.clone());
        let b = q.insert(t0 + Duration::from_millis(20), waker.clone());
        let c = q.insert(t0 + Duration::from_millis(30), waker.clone());
        assert!(q.reset(a, t0 + Duration::from_millis(40))); // later: lazy
        assert!(q.reset(c, t0 + Duration::from_millis(5))); // earlier: re-linked
        q.remove(b);
        assert_eq!(q.next_deadline(), Some(t0 + Duration::from_millis(5)));
        let mut wakers = Vec::new();
        assert_eq!(
            q.fire_expired(t0 + Duration::from_millis(25), &mut wakers),
            1
        );
        assert!(!q.set_waker(c, &waker), "c fired");
        assert!(q.set_waker(a, &waker), "a was moved later");
        assert!(q.next_deadline().unwrap() <= t0 + Duration::from_millis(40));
        assert_eq!(
            q.fire_expired(t0 + Duration::from_millis(45), &mut wakers),
            1
        );
        assert_eq!(q.len(), 0);
        assert_eq!(q.next_deadline(), None);
        wakers.into_iter().for_each(Waker::wake);
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_deadline_within_the_current_tick_fires_exactly_when_due() {
        let waker = Waker::from(Arc::new(Count(AtomicUsize::new(0))));
        let t0 = Instant::now();
        let mut q = TimerQueue::new(t0);
        // Both in tick 1 (1024..2048 ns).
        q.insert(t0 + Duration::from_nanos(1100), waker.clone());
        q.insert(t0 + Duration::from_nanos(1900), waker.clone());
        let mut wakers = Vec::new();
        assert_eq!(
            q.fire_expired(t0 + Duration::from_nanos(1500), &mut wakers),
            1
        );
        assert_eq!(q.next_deadline(), Some(t0 + Duration::from_nanos(1900)));
        assert_eq!(
            q.fire_expired(t0 + Duration::from_nanos(1899), &mut wakers),
            0
        );
        assert_eq!(
            q.fire_expired(t0 + Duration::from_nanos(1900), &mut wakers),
            1
        );
    }

    #[test]
    fn cancelled_timers_leave_nothing_behind_and_entries_are_reused() {
        let waker = Waker::from(Arc::new(Count(AtomicUsize::new(0))));
        let t0 = Instant::now();
        let mut q = TimerQueue::new(t0);
        for round in 0..10u64 {
            let keys: Vec<_> = (0..10_000u64)
                .map(|i| {
                    q.insert(
                        t0 + Duration::from_secs(30 + round) + Duration::from_micros(i),
                        waker.clone(),
                    )
                })
                .collect();
            for k in keys {
                q.remove(k);
            }
        }
        assert_eq!(q.len(), 0);
        assert_eq!(q.entries.len(), 10_000, "entries are reused, not grown");
        assert!(q.occupied.iter().all(|&bits| bits == 0));
        assert!(q.heads.iter().all(|&h| h == NIL));
    }

    #[test]
    fn stale_keys_do_not_touch_a_reused_entry() {
        let waker = Waker::from(Arc::new(Count(AtomicUsize::new(0))));
        let t0 = Instant::now();
        let mut q = TimerQueue::new(t0);
        let old = q.insert(t0 + Duration::from_secs(1), waker.clone());
        q.remove(old);
        let new = q.insert(t0 + Duration::from_secs(2), waker.clone());
        assert_eq!(old.index(), new.index());
        assert!(!q.reset(old, t0));
        q.remove(old);
        assert_eq!(q.len(), 1);
        assert!(q.set_waker(new, &waker));
    }

    #[test]
    fn deadlines_beyond_the_wheel_are_refiled_until_due() {
        let waker = Waker::from(Arc::new(Count(AtomicUsize::new(0))));
        let t0 = Instant::now();
        let mut q = TimerQueue::new(t0);
        let far = Duration::from_secs(200 * 24 * 3600); // ~4 wheel spans
        q.insert(t0 + far, waker.clone());
        let mut wakers = Vec::new();
        let mut at = Duration::ZERO;
        while at < far - Duration::from_secs(1) {
            at += Duration::from_secs(7 * 24 * 3600);
            at = at.min(far - Duration::from_secs(1));
            assert_eq!(q.fire_expired(t0 + at, &mut wakers), 0);
            assert!(q.next_deadline().unwrap() <= t0 + far);
        }
        assert_eq!(q.fire_expired(t0 + far, &mut wakers), 1);
    }

    /// A random walk of inserts, moves, removals and clock jumps, checked
    /// against a sorted map of what should be live.
    #[test]
    fn matches_a_reference_model() {
        let fired = Arc::new(std::sync::Mutex::new(Vec::new()));
        let t0 = Instant::now();
        let mut q = TimerQueue::new(t0);
        let mut live: BTreeMap<u64, (TimerKey, u64)> = BTreeMap::new(); // id -> (key, deadline ns)
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut now = 0u64;
        let mut id = 0u64;
        let (mut total_fired, mut saw_far) = (0, false);
        for step in 0..200_000 {
            // Spans from nanoseconds to days, so every level and the refile path run.
            let span = |r: u64| match r % 6 {
                0 => r % 2_000,
                1 => r % 100_000,
                2 => r % 50_000_000,
                3 => r % 10_000_000_000,
                4 => r % 5_000_000_000_000,
                _ => r % 9_000_000_000_000_000 / 1000,
            };
            match next() % 10 {
                0..=3 => {
                    id += 1;
                    let deadline = now + span(next());
                    let waker = Waker::from(Arc::new(Tagged(id, fired.clone())));
                    let key = q.insert(t0 + Duration::from_nanos(deadline), waker);
                    live.insert(id, (key, deadline));
                }
                4 | 5 if !live.is_empty() => {
                    let pick = *live
                        .keys()
                        .nth((next() % live.len() as u64) as usize)
                        .unwrap();
                    let deadline = now + span(next());
                    let (key, d) = live.get_mut(&pick).unwrap();
                    assert!(q.reset(*key, t0 + Duration::from_nanos(deadline)));
                    *d = deadline;
                }
                6 if !live.is_empty() => {
                    let pick = *live
                        .keys()
                        .nth((next() % live.len() as u64) as usize)
                        .unwrap();
                    q.remove(live.remove(&pick).unwrap().0);
                }
                _ => {
                    now += span(next()).min(5_000_000_000_000) / 3;
                    if step % 1000 == 0 {
                        now += 3_000_000_000_000_000; // a long test-clock jump
                    }
                    if let Some(bound) = q.next_deadline() {
                        let earliest = live.values().map(|&(_, d)| d).min().unwrap();
                        assert!(
                            bound <= t0 + Duration::from_nanos(earliest),
                            "bound past a live deadline"
                        );
                    } else {
                        assert!(live.is_empty());
                    }
                    saw_far |= q.heads[FAR] != NIL;
                    let mut wakers = Vec::new();
                    let n = q.fire_expired(t0 + Duration::from_nanos(now), &mut wakers);
                    total_fired += n;
                    wakers.into_iter().for_each(Waker::wake);
                    let mut got = std::mem::take(&mut *fired.lock().unwrap());
                    got.sort_unstable();
                    let mut want: Vec<u64> = live
                        .iter()
                        .filter(|(_, &(_, d))| d <= now)
                        .map(|(&i, _)| i)
                        .collect();
                    want.sort_unstable();
                    assert_eq!(got, want, "step {step}: fired set differs at {now} ns");
                    assert_eq!(n, want.len());
                    for i in want {
                        live.remove(&i);
                    }
                    assert_eq!(q.len(), live.len());
                }
            }
        }
        assert!(total_fired > 20_000, "only {total_fired} fired");
        assert!(saw_far, "no deadline went past the wheel");
    }
}
