//! Tiny messages and coalesced hot counters.
//!
//! A tiny message is a 16-bit tag and a 32-bit value carried by the
//! `IORING_OP_MSG_RING` completion itself: no payload queue, no allocation.
//! Messages sent during one shard tick are queued per destination and posted
//! when the tick ends.
//!
//! A tag registered with [`Builder::coalesced_hot_tag`](crate::Builder::coalesced_hot_tag)
//! is a *hot counter*: values arriving on a shard are summed into a shard-local
//! counter instead of becoming one event each, and senders sum their own
//! increments per destination within a tick, so a burst of a million
//! increments can cost a handful of completions. Consumers take the sum with
//! [`next_hot_count`] or [`try_take_hot_count`]. Other tags queue their messages
//! per tag for [`next_tiny`] / [`try_next_tiny`], at most
//! [`TINY_QUEUE_LIMIT`] a tag on each shard: like datagrams, arrivals past
//! that (a tag nobody consumes) are dropped and counted in
//! [`ShardStats::tiny_dropped`](crate::ShardStats::tiny_dropped), so a
//! producer without a consumer cannot grow a shard's memory without bound.
//!
//! Each (shard, tag) has one logical consumer; if several tasks wait on the same
//! tag, all are woken and the first to look takes the value.
//!
//! # Examples
//!
//! ```
//! use mailring::{hot, Placement, ShardId};
//! let rt = mailring::Runtime::builder().shards(2).coalesced_hot_tag(7).build()?;
//! let total = rt.block_on(async {
//!     let consumer = mailring::spawn_with(Placement::Pinned(ShardId::new(1)), async {
//!         let mut sum = 0;
//!         while sum < 6 {
//!             sum += hot::next_hot_count(7).await;
//!         }
//!         sum
//!     });
//!     for v in 1..=3 {
//!         hot::send_tiny(ShardId::new(1), 7, v);
//!     }
//!     consumer.await.unwrap()
//! });
//! assert_eq!(total, 6);
//! # Ok::<(), mailring::BuildError>(())
//! ```

use std::collections::{HashMap, VecDeque};
use std::future::poll_fn;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use crate::shard::{with_current, ShardId};
use crate::sync::{WaitKey, WaitList};

/// How many unconsumed tiny messages of one (non-hot) tag a shard keeps;
/// later arrivals are dropped and counted in
/// [`ShardStats::tiny_dropped`](crate::ShardStats::tiny_dropped).
pub const TINY_QUEUE_LIMIT: usize = 65_536;

/// A tiny message as received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TinyMessage {
    /// The sending shard; `None` when it came from a thread outside the runtime.
    pub from: Option<ShardId>,
    /// The tag it was sent with.
    pub tag: u16,
    /// The value.
    pub value: u32,
}

#[derive(Debug, Default)]
struct Counter {
    value: u64,
    waiters: WaitList,
}

#[derive(Debug, Default)]
struct Queue {
    items: VecDeque<TinyMessage>,
    waiters: WaitList,
}

/// The first tag [`Handle::register_hot_tags`](crate::Handle::register_hot_tags)
/// hands out; tags from here up are for registration after `build()` (a
/// tag the `Builder` registered there is skipped).
pub const DYNAMIC_HOT_TAGS: u16 = 0xC000;

/// Why [`Handle::register_hot_tags`](crate::Handle::register_hot_tags)
/// could not register tags.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HotTagError {
    /// Fewer than the tags asked for are left in the dynamic range
    /// (`DYNAMIC_HOT_TAGS..u16::MAX`), counting those given back with
    /// [`Handle::release_hot_tags`](crate::Handle::release_hot_tags) (an
    /// actor system gives its tags back when its shutdown ends all its
    /// actors, not when it leaves some running).
    #[error(
        "no {asked} consecutive hot tags are left from {DYNAMIC_HOT_TAGS:#x} up: register fewer, release the ones no longer used, or start fewer systems on one runtime at a time"
    )]
    Exhausted {
        /// How many were asked for.
        asked: u16,
    },
    /// A tag given to [`Handle::release_hot_tags`](crate::Handle::release_hot_tags)
    /// is not one `register_hot_tags` handed out, or was released already.
    #[error("hot tag {tag:#x} is not registered (not handed out by register_hot_tags, or released already)")]
    NotRegistered {
        /// The first such tag.
        tag: u16,
    },
}

/// Tags registered as hot after `build()`, shared by the shards: each shard
/// adopts one (gives it a counter) the first time it meets it. A tag
/// given back stays hot (its bit set: a straggler using it finds a
/// counter, not a panic) and is handed out again.
#[derive(Debug)]
pub(crate) struct DynamicHotTags {
    /// One bit per tag, set (Release) before the tag is handed out the
    /// first time, never cleared.
    bits: Box<[AtomicU64]>,
    handed: Mutex<Handed>,
}

/// Which dynamic tags are out.
#[derive(Debug)]
struct Handed {
    /// The next tag never handed out (`u32`: one past `u16::MAX` is "none
    /// left").
    next: u32,
    /// Runs given back, free to hand out again.
    free: Vec<Range<u32>>,
    /// Runs being given back (their stragglers waited out).
    releasing: Vec<Range<u32>>,
}

impl DynamicHotTags {
    pub(crate) fn new() -> Self {
        DynamicHotTags {
            bits: (0..1024).map(|_| AtomicU64::new(0)).collect(),
            handed: Mutex::new(Handed {
                next: u32::from(DYNAMIC_HOT_TAGS),
                free: Vec::new(),
                releasing: Vec::new(),
            }),
        }
    }

    fn handed(&self) -> std::sync::MutexGuard<'_, Handed> {
        self.handed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands out `count` consecutive tags none of which is in `taken`:
    /// from a run given back if one is long enough, else never used ones.
    pub(crate) fn register(&self, count: u16, taken: &[u16]) -> Result<Range<u16>, HotTagError> {
        let mut handed = self.handed();
        let count32 = u32::from(count);
        if let Some(i) = handed.free.iter().position(|r| r.len() >= count32 as usize) {
            let run = handed.free[i].clone();
            let end = run.start + count32;
            if end == run.end {
                handed.free.swap_remove(i);
            } else {
                handed.free[i].start = end;
            }
            // In range: freed runs lie within `DYNAMIC_HOT_TAGS..u16::MAX`.
            return Ok(run.start as u16..end as u16);
        }
        let next = &mut handed.next;
        let mut start = *next;
        loop {
            let end = start + u32::from(count);
            // A `Range<u16>` ends at `u16::MAX` at most: the last tag is
            // never handed out (a range ending past it would wrap to 0).
            if end > u32::from(u16::MAX) {
                return Err(HotTagError::Exhausted { asked: count });
            }
            match taken
                .iter()
                .map(|&t| u32::from(t))
                .filter(|t| (start..end).contains(t))
                .max()
            {
                Some(t) => start = t + 1,
                None => {
                    for tag in start..end {
                        self.bits[(tag / 64) as usize].fetch_or(1 << (tag % 64), Ordering::Release);
                    }
                    *next = end;
                    // In range: `end <= u16::MAX`.
                    return Ok(start as u16..end as u16);
                }
            }
        }
    }

    fn contains(&self, tag: u16) -> bool {
        tag >= DYNAMIC_HOT_TAGS
            && self.bits[usize::from(tag / 64)].load(Ordering::Acquire) & (1 << (tag % 64)) != 0
    }

    /// Starts giving `tags` back: refused unless every one is out (handed
    /// out, not free nor being given back).
    pub(crate) fn begin_release(&self, tags: Range<u16>) -> Result<(), HotTagError> {
        let mut handed = self.handed();
        let run = u32::from(tags.start)..u32::from(tags.end);
        let overlaps = |r: &Range<u32>| r.start < run.end && run.start < r.end;
        for tag in tags.clone() {
            let tag32 = u32::from(tag);
            let out = self.contains(tag)
                && tag32 < handed.next
                && !handed
                    .free
                    .iter()
                    .chain(&handed.releasing)
                    .any(|r| r.contains(&tag32));
            if !out {
                return Err(HotTagError::NotRegistered { tag });
            }
        }
        debug_assert!(!handed.releasing.iter().any(overlaps));
        if !run.is_empty() {
            handed.releasing.push(run);
        }
        Ok(())
    }

    /// Ends giving `tags` back ([`begin_release`](Self::begin_release)):
    /// they are free to hand out again, or, when `freed` is false (the
    /// runtime shut down meanwhile), kept out.
    pub(crate) fn end_release(&self, tags: Range<u16>, freed: bool) {
        let mut handed = self.handed();
        let run = u32::from(tags.start)..u32::from(tags.end);
        if let Some(i) = handed.releasing.iter().position(|r| *r == run) {
            handed.releasing.swap_remove(i);
            if freed {
                handed.free.push(run);
            }
        }
    }
}

/// The receiving side of one shard.
#[derive(Debug)]
pub(crate) struct HotState {
    threshold: u64,
    counters: HashMap<u16, Counter>,
    queues: HashMap<u16, Queue>,
    dynamic: Arc<DynamicHotTags>,
}

impl HotState {
    pub(crate) fn new(hot_tags: &[u16], threshold: u64, dynamic: Arc<DynamicHotTags>) -> Self {
        HotState {
            threshold,
            counters: hot_tags.iter().map(|&t| (t, Counter::default())).collect(),
            queues: HashMap::new(),
            dynamic,
        }
    }

    /// Whether `tag` is hot here, adopting a tag registered after `build()`
    /// the first time this shard meets it.
    pub(crate) fn is_hot(&mut self, tag: u16) -> bool {
        self.counters.contains_key(&tag) || self.adopt(tag)
    }

    /// Forgets what this shard holds for `tags` (being given back): their
    /// counts and queued tiny messages; their waiters are woken into `wake`
    /// (none should be left; one that is sees nothing and waits again).
    pub(crate) fn reset(&mut self, tags: Range<u16>, wake: &mut Vec<Waker>) {
        for tag in tags {
            if let Some(c) = self.counters.get_mut(&tag) {
                c.value = 0;
                c.waiters.drain_into(wake);
            }
            if let Some(mut q) = self.queues.remove(&tag) {
                q.waiters.drain_into(wake);
            }
        }
    }

    #[cold]
    fn adopt(&mut self, tag: u16) -> bool {
        if !self.dynamic.contains(tag) {
            return false;
        }
        self.counters.insert(tag, Counter::default());
        true
    }

    /// Files one arrival; wakers to call are appended to `wake`. Returns
    /// `false` when the arrival was dropped: its tag's queue holds
    /// [`TINY_QUEUE_LIMIT`] messages already.
    pub(crate) fn ingest(&mut self, msg: TinyMessage, wake: &mut Vec<Waker>) -> bool {
        if !self.counters.contains_key(&msg.tag) {
            self.adopt(msg.tag);
        }
        if let Some(c) = self.counters.get_mut(&msg.tag) {
            c.value += u64::from(msg.value);
            if c.value >= self.threshold {
                c.waiters.drain_into(wake);
            }
        } else {
            let q = self.queues.entry(msg.tag).or_default();
            if q.items.len() >= TINY_QUEUE_LIMIT {
                return false;
            }
            q.items.push_back(msg);
            q.waiters.drain_into(wake);
        }
        true
    }

    /// The shard is about to go idle: wake consumers of every non-zero counter
    /// still under the threshold. Returns whether anyone was woken.
    pub(crate) fn flush_idle(&mut self, wake: &mut Vec<Waker>) -> bool {
        let before = wake.len();
        for c in self.counters.values_mut() {
            if c.value > 0 && !c.waiters.is_empty() {
                c.waiters.drain_into(wake);
            }
        }
        wake.len() > before
    }

    fn take_count(&mut self, tag: u16) -> Option<u64> {
        let c = self.counters.get_mut(&tag)?;
        (c.value > 0).then(|| std::mem::take(&mut c.value))
    }

    /// Drops every count and queued message; the waiters' wakers come
    /// back, to be dropped once the state is released (a waker's drop may
    /// drop a task whose [`HotWait`] looks here).
    pub(crate) fn clear(&mut self) -> Vec<Waker> {
        let mut wakers = Vec::new();
        for c in self.counters.values_mut() {
            c.value = 0;
            c.waiters.drain_into(&mut wakers);
        }
        for q in self.queues.values_mut() {
            q.waiters.drain_into(&mut wakers);
        }
        self.queues.clear();
        wakers
    }
}

fn on_shard<R>(what: &str, f: impl FnOnce(&crate::shard::Shard) -> R) -> R {
    with_current(f)
        .unwrap_or_else(|| panic!("mailring::hot::{what} must be called on a mailring shard"))
}

/// Sends a tiny message from the current shard to shard `to`.
///
/// It is posted at the end of the current tick with the other messages of the
/// tick (hot tags summed per destination). To the current shard itself it is
/// delivered at once. From outside the runtime use [`crate::Handle::send_tiny`].
///
/// # Panics
///
/// Outside a mailring shard, or when `to` is not a shard of this runtime.
pub fn send_tiny(to: ShardId, tag: u16, value: u32) {
    on_shard("send_tiny", |shard| shard.send_tiny(to.index(), tag, value));
}

/// Takes the current shard's hot counter for `tag` if it is non-zero.
///
/// # Panics
///
/// Outside a mailring shard, or when `tag` was not registered as a hot tag.
pub fn try_take_hot_count(tag: u16) -> Option<u64> {
    on_shard("try_take_hot_count", |shard| {
        let mut hot = shard.hot_mut();
        assert!(
            hot.is_hot(tag),
            "tag {tag} is not a coalesced hot tag: register it with Builder::coalesced_hot_tag \
             or Handle::register_hot_tags"
        );
        hot.take_count(tag)
    })
}

/// Waits until the current shard's hot counter for `tag` is non-zero (and has
/// reached the wake threshold, or the shard has nothing else to do), then takes it.
/// Dropped while it waits, it takes its waker back (see [`HotWait`]).
///
/// # Panics
///
/// Outside a mailring shard, or when `tag` was not registered as a hot tag.
pub async fn next_hot_count(tag: u16) -> u64 {
    let mut wait = HotWait::new(tag);
    poll_fn(|cx| wait.poll_count(cx)).await
}

/// A task's wait on one tag of its shard: a hot counter
/// ([`poll_count`](Self::poll_count)) or a plain tag's queue of tiny
/// messages ([`poll_tiny`](Self::poll_tiny)). The poll forms of
/// [`next_hot_count`] and [`next_tiny`], for futures that wait on a tag
/// among other conditions.
///
/// Polled again, it replaces its waker in place; dropped while waiting
/// (a future given up by a timeout or a `select!`), it takes its waker
/// back from the tag's waiters, so a wait nobody awaits holds no task.
/// Dropped on another thread than its shard's, it leaves its waker to the
/// tag's next wake.
#[derive(Debug)]
pub struct HotWait {
    tag: u16,
    /// Where the waker is listed: the runtime and shard, and the key.
    listed: Option<(u64, usize, WaitKey)>,
}

impl HotWait {
    /// A wait on `tag`, listed nowhere until its first pending poll.
    pub fn new(tag: u16) -> HotWait {
        HotWait { tag, listed: None }
    }

    /// The tag waited on.
    pub fn tag(&self) -> u16 {
        self.tag
    }

    /// The key of this wait's listing on `shard`, taken out (put back by
    /// [`Self::listed_on`]); a listing on another shard is forgotten.
    fn key_on(&mut self, shard: &crate::shard::Shard) -> Option<WaitKey> {
        match self.listed.take() {
            Some((runtime, index, key))
                if runtime == shard.runtime_id() && index == shard.index() =>
            {
                Some(key)
            }
            _ => None,
        }
    }

    fn listed_on(&mut self, shard: &crate::shard::Shard, key: Option<WaitKey>) {
        self.listed = key.map(|k| (shard.runtime_id(), shard.index(), k));
    }

    /// Takes the current shard's hot counter for the tag if it is non-zero;
    /// else lists `cx`'s waker to be woken when it reaches the wake
    /// threshold (or the shard has nothing else to do).
    ///
    /// # Panics
    ///
    /// Outside a mailring shard, or when the tag was not registered as a
    /// hot tag.
    pub fn poll_count(&mut self, cx: &mut Context<'_>) -> Poll<u64> {
        let tag = self.tag;
        on_shard("HotWait::poll_count", |shard| {
            let mut key = self.key_on(shard);
            let mut hot = shard.hot_mut();
            assert!(
                hot.is_hot(tag),
                "tag {tag} is not a coalesced hot tag: register it with Builder::coalesced_hot_tag \
                 or Handle::register_hot_tags"
            );
            let c = hot.counters.get_mut(&tag).expect("checked above");
            let (polled, unlisted) = if c.value > 0 {
                let unlisted = c.waiters.remove(&mut key);
                (Poll::Ready(std::mem::take(&mut c.value)), unlisted)
            } else {
                (Poll::Pending, c.waiters.register(&mut key, cx.waker()))
            };
            drop(hot);
            // A waker's drop may look at the hot state: not borrowed now.
            drop(unlisted);
            self.listed_on(shard, key);
            polled
        })
    }

    /// Takes the oldest queued tiny message with the tag on the current
    /// shard; else lists `cx`'s waker to be woken when one comes.
    ///
    /// # Panics
    ///
    /// Outside a mailring shard.
    pub fn poll_tiny(&mut self, cx: &mut Context<'_>) -> Poll<TinyMessage> {
        let tag = self.tag;
        on_shard("HotWait::poll_tiny", |shard| {
            let mut key = self.key_on(shard);
            let mut hot = shard.hot_mut();
            let q = hot.queues.entry(tag).or_default();
            let (polled, unlisted) = match q.items.pop_front() {
                Some(m) => (Poll::Ready(m), q.waiters.remove(&mut key)),
                None => (Poll::Pending, q.waiters.register(&mut key, cx.waker())),
            };
            drop(hot);
            drop(unlisted);
            self.listed_on(shard, key);
            polled
        })
    }
}

impl Drop for HotWait {
    fn drop(&mut self) {
        let Some((runtime, index, key)) = self.listed.take() else {
            return;
        };
        let tag = self.tag;
        let taken = with_current(|shard| {
            if shard.runtime_id() != runtime || shard.index() != index {
                return None;
            }
            // Borrowed already: the shard is taking every waker (a wake, or
            // its shutdown), and this one with them.
            let mut hot = shard.try_hot_mut()?;
            // Listed as a counter's waiter, or a queue's (a tag waited on
            // as a queue may have been adopted as hot since): the key names
            // a slot of one list only.
            let hot = &mut *hot;
            let counter = hot.counters.get_mut(&tag).map(|c| &mut c.waiters);
            let queue = hot.queues.get_mut(&tag).map(|q| &mut q.waiters);
            let mut key = Some(key);
            let list = counter.into_iter().chain(queue).find(|l| l.holds(&key))?;
            list.remove(&mut key)
        });
        // Dropped after the state is released: it may hold the last
        // reference to a task.
        drop(taken);
    }
}

/// Takes the oldest queued tiny message with `tag` on the current shard.
///
/// # Panics
///
/// Outside a mailring shard.
pub fn try_next_tiny(tag: u16) -> Option<TinyMessage> {
    on_shard("try_next_tiny", |shard| {
        shard
            .hot_mut()
            .queues
            .get_mut(&tag)
            .and_then(|q| q.items.pop_front())
    })
}

/// Waits for the next tiny message with `tag` on the current shard.
/// Dropped while it waits, it takes its waker back (see [`HotWait`]).
///
/// # Panics
///
/// Outside a mailring shard.
pub async fn next_tiny(tag: u16) -> TinyMessage {
    let mut wait = HotWait::new(tag);
    poll_fn(|cx| wait.poll_tiny(cx)).await
}
