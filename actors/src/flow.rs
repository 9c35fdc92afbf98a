//! Credit windows between shards: flow control for messages that cross
//! shards, with the credits carried back by the runtime's coalesced hot
//! counters.
//!
//! A shard may have at most [`SystemConfig::cross_shard_window`] messages
//! sent to another shard's actors that those actors have not taken from
//! their mailboxes yet. The sender counts what it sends per destination
//! ([`ShardFlow::sent`]); the receiving shard counts, per source, what its
//! actors take (or drop: a dead letter, a mailbox closed with messages in
//! it) and hands the credits back with `mailring::hot::send_tiny` on the
//! system's credit tag of its own index (`ShardFlow::credit_tag`) once
//! half a window has gathered. The
//! runtime sums the credits of a tick into one tiny message per
//! destination, and sums what arrives into one counter per tag, so a burst
//! of a million messages costs a handful of credit messages; the sender
//! takes the sum when it next needs credit. The credit returns are also
//! the notification a sender waiting in `Addr::send` wakes on.
//!
//! Who waits: [`Addr::send`](crate::Addr::send) waits for credit, and
//! [`Addr::try_tell`](crate::Addr::try_tell) gives the message back as
//! `Full` when the window is spent. `tell` and `ask` are counted but never
//! held back (`tell` promises not to wait; an ask's reply is its own flow
//! control). Sends from threads outside the runtime and sends to the
//! sender's own shard are not counted.
//!
//! Why returns wait for half a window: while a sender is held back at a
//! full window, its untaken messages, the receiver's unreturned credits and
//! the credits on their way add up to the window. If none are on their way,
//! the receiver's actors take what is left, and the unreturned credits
//! reach half a window and go back: a held sender is always released while
//! the receiving actors make progress. Whoever takes arriving credits (a
//! waiting `send`, or a `try_tell` that finds the window spent) wakes every
//! task of its shard waiting on that window, so credits a `try_tell` took
//! and did not use are never lost to the waiters (the hot counter wakes its
//! own waiters only past its threshold, or when the shard idles).
//!
//! The window is per pair of shards, not per actor: an actor that takes
//! nothing holds its share, and handlers that `send().await` to each
//! other's shards can wait on each other's windows (the guide says to use
//! `tell`/`try_tell` inside handlers). A shutting-down system returns no
//! credits, so `send` stops waiting for them then; once its actors have
//! ended, its credit tags go back to the runtime (`Handle::release_hot_tags`,
//! which waits out the credits still on their way), for the next system
//! started on it.
//!
//! Credits cannot name an actor: a hot counter is one sum per shard and tag.
//! So the window is per pair of shards, which is what the shard-per-core
//! design needs to bound (a saturated shard slows its senders), and a
//! bounded mailbox (`#[actor(mailbox = N)]`) bounds one actor.
//!
//! [`SystemConfig::cross_shard_window`]: crate::SystemConfig::cross_shard_window

use std::cell::{Cell, RefCell};
use std::task::{Context, Poll};

use mailring::hot::{self, HotWait};
use mailring::sync::{WaitKey, WaitList};
use mailring::ShardId;

/// One shard's side of every window it is part of.
pub(crate) struct ShardFlow {
    /// The system's first credit tag: tag `credit_base + s` carries the
    /// credits shard `s` returns (registered on the runtime at start, one
    /// per shard, so two systems on one runtime never share one).
    credit_base: u16,
    /// Set once the system is shutting down: its credit tags are then on
    /// their way back to the runtime (for another system to reuse), so no
    /// credit is returned or taken through them any more.
    shutting_down: std::sync::Arc<std::sync::atomic::AtomicBool>,
    shard: usize,
    window: u64,
    /// Unreturned credits that make the receiver hand them back.
    return_at: u64,
    /// Per destination: messages sent there, not yet credited back.
    in_flight: Box<[Cell<u64>]>,
    /// Per source: messages from there that actors here took, whose credits
    /// have not been handed back.
    owed: Box<[Cell<u64>]>,
    /// Per destination: tasks of this shard waiting for credit. Whoever
    /// takes arriving credits wakes them (a task that takes them with
    /// `try_tell` may leave room it does not use: the hot counter's own
    /// waiters would not hear of it).
    waiting: Box<[RefCell<WaitList>]>,
}

/// A send's wait for credit on one window: its listing among the window's
/// waiters and its wait on the credit counter, both taken back when it is
/// dropped (see `crate::local::forget_credit_wait`), so a send given up
/// while the window is spent holds no task.
#[derive(Default)]
pub(crate) struct CreditWait {
    /// The shard and destination whose waiters list it, and its key there.
    listed: Option<(usize, usize, WaitKey)>,
    /// Its wait on the credit counter of the destination it waits on.
    counter: Option<HotWait>,
}

impl CreditWait {
    /// Its listing, taken out: `(shard, dest, key)`.
    pub(crate) fn take_listing(&mut self) -> Option<(usize, usize, WaitKey)> {
        self.listed.take()
    }
}

impl ShardFlow {
    pub(crate) fn new(
        shard: usize,
        shards: usize,
        window: u32,
        credit_base: u16,
        shutting_down: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) -> Self {
        let window = u64::from(window.max(1));
        ShardFlow {
            credit_base,
            shutting_down,
            shard,
            window,
            return_at: window.div_ceil(2),
            in_flight: (0..shards).map(|_| Cell::new(0)).collect(),
            owed: (0..shards).map(|_| Cell::new(0)).collect(),
            waiting: (0..shards).map(|_| RefCell::new(WaitList::new())).collect(),
        }
    }

    /// The tag on which shard `returning` hands credits back.
    #[inline]
    fn credit_tag(&self, returning: usize) -> u16 {
        self.credit_base + returning as u16
    }

    /// Counts a message sent to an actor on `dest`.
    #[inline(always)]
    pub(crate) fn sent(&self, dest: usize) {
        let c = &self.in_flight[dest];
        c.set(c.get() + 1);
    }

    /// Whether one more message may go to `dest` within the window.
    #[inline]
    pub(crate) fn has_credit(&self, dest: usize) -> bool {
        self.in_flight[dest].get() < self.window || self.absorb(dest)
    }

    /// Takes the credits `dest` returned; whether the window has room now
    /// (always, once the system is shutting down: its sends no longer
    /// wait, and its credit tags may belong to another system soon).
    #[cold]
    fn absorb(&self, dest: usize) -> bool {
        if self
            .shutting_down
            .load(std::sync::atomic::Ordering::Acquire)
        {
            return true;
        }
        if let Some(n) = hot::try_take_hot_count(self.credit_tag(dest)) {
            self.credit(dest, n);
        }
        self.in_flight[dest].get() < self.window
    }

    fn credit(&self, dest: usize, n: u64) {
        let c = &self.in_flight[dest];
        debug_assert!(n <= c.get(), "{n} credits back for {} sent", c.get());
        let left = c.get().saturating_sub(n);
        c.set(left);
        if left < self.window {
            let waiting = self.waiting[dest].borrow_mut().take_all();
            waiting.wake();
        }
    }

    /// Ready when one more message may go to `dest`; else `cx` is woken by
    /// the next credits `dest` returns, listed under `wait`.
    pub(crate) fn poll_credit(
        &self,
        dest: usize,
        cx: &mut Context<'_>,
        wait: &mut CreditWait,
    ) -> Poll<()> {
        if self.has_credit(dest) {
            self.forget(wait);
            return Poll::Ready(());
        }
        let tag = self.credit_tag(dest);
        let counter = wait.counter.get_or_insert_with(|| HotWait::new(tag));
        if counter.tag() != tag {
            *counter = HotWait::new(tag);
        }
        while let Poll::Ready(n) = counter.poll_count(cx) {
            self.credit(dest, n);
            if self.in_flight[dest].get() < self.window {
                self.forget(wait);
                return Poll::Ready(());
            }
        }
        let mut key = match wait.listed.take() {
            Some((shard, listed_dest, key)) if shard == self.shard && listed_dest == dest => {
                Some(key)
            }
            other => {
                // Listed for another window (or shard): taken back first.
                if let Some(listing) = other {
                    drop(self.forget_listing(listing));
                }
                None
            }
        };
        let replaced = self.waiting[dest]
            .borrow_mut()
            .register(&mut key, cx.waker());
        // Dropped with the list released.
        drop(replaced);
        wait.listed = key.map(|k| (self.shard, dest, k));
        Poll::Pending
    }

    /// Takes `wait`'s listing back (it is done waiting).
    fn forget(&self, wait: &mut CreditWait) {
        if let Some(listing) = wait.listed.take() {
            drop(self.forget_listing(listing));
        }
    }

    /// Takes back the waker a listing names, when it is one of this
    /// shard's; dropped by the caller once no list is borrowed.
    pub(crate) fn forget_listing(
        &self,
        (shard, dest, key): (usize, usize, WaitKey),
    ) -> Option<std::task::Waker> {
        if shard != self.shard {
            return None;
        }
        let mut waiting = self.waiting.get(dest)?.try_borrow_mut().ok()?;
        waiting.remove(&mut Some(key))
    }

    /// Wakes every task waiting for credit (the system is shutting down:
    /// they stop waiting).
    pub(crate) fn release_waiters(&self) {
        for waiting in self.waiting.iter() {
            let waiting = waiting.borrow_mut().take_all();
            waiting.wake();
        }
    }

    /// Counts `n` messages from `source` taken (or dropped) here, handing
    /// the credits back once half a window has gathered.
    #[inline]
    pub(crate) fn taken(&self, source: usize, n: u64) {
        let c = &self.owed[source];
        let owed = c.get() + n;
        if owed < self.return_at {
            c.set(owed);
        } else {
            c.set(0);
            self.give_back(source, owed);
        }
    }

    #[cold]
    fn give_back(&self, source: usize, mut owed: u64) {
        // A shutting-down system's senders no longer wait for credits, and
        // its tags go back to the runtime.
        if self
            .shutting_down
            .load(std::sync::atomic::Ordering::Acquire)
        {
            return;
        }
        while owed > 0 {
            let part = owed.min(u64::from(u32::MAX));
            hot::send_tiny(
                ShardId::new(source),
                self.credit_tag(self.shard),
                part as u32,
            );
            owed -= part;
        }
    }
}

/// Messages from other shards in one mailbox, by source, for the credits
/// its next take hands back. The first source is inline, in one word (with
/// two shards there is only one); others, when a mailbox holds messages
/// from several at once, go in a list.
#[derive(Default)]
#[repr(C)]
pub(crate) struct RemoteCounts {
    /// The first source's [`source_tag`] in the high half, its count in the
    /// low half; 0 when no message from another shard is counted.
    first: Cell<u64>,
    others: RefCell<Vec<(usize, u64)>>,
}

const COUNT_MASK: u64 = u32::MAX as u64;

/// Shard `source`, as [`RemoteCounts::add`] takes it (computed once per
/// batch: every message of a batch has the same source).
pub(crate) fn source_tag(source: usize) -> u64 {
    (source as u64 + 1) << 32
}

impl RemoteCounts {
    /// Counts `n` messages from the shard whose [`source_tag`] is `tag`.
    #[inline(always)]
    pub(crate) fn add(&self, tag: u64, n: u64) {
        let first = self.first.get();
        let count = first & COUNT_MASK;
        if (first == 0 || first & !COUNT_MASK == tag) && count + n <= COUNT_MASK {
            self.first.set(tag | (count + n));
        } else {
            self.add_other(tag, n);
        }
    }

    #[cold]
    fn add_other(&self, tag: u64, n: u64) {
        let source = (tag >> 32) as usize - 1;
        let mut others = self.others.borrow_mut();
        match others.iter_mut().find(|(s, _)| *s == source) {
            Some((_, m)) => *m += n,
            None => others.push((source, n)),
        }
    }

    /// Hands every counted message's credit to `flow` and starts over.
    #[inline(always)]
    pub(crate) fn settle(&self, flow: &ShardFlow) {
        let first = self.first.get();
        if first != 0 {
            self.settle_all(flow, first);
        }
    }

    #[cold]
    fn settle_all(&self, flow: &ShardFlow, first: u64) {
        self.first.set(0);
        flow.taken((first >> 32) as usize - 1, first & COUNT_MASK);
        for (source, n) in self.others.borrow_mut().drain(..) {
            flow.taken(source, n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_counts_keep_each_source_apart() {
        let counts = RemoteCounts::default();
        for (s, n) in [(1, 1), (1, 2), (2, 1), (1, 1), (3, 4), (2, 1)] {
            counts.add(source_tag(s), n);
        }
        assert_eq!(counts.first.get(), source_tag(1) | 4);
        assert_eq!(*counts.others.borrow(), vec![(2, 2), (3, 4)]);
    }
}
