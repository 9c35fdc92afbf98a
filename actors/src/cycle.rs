//! Ask cycles between blocked handlers, on any shard.
//!
//! The ask chain (see `runner`) catches a cycle along one chain of asks: an
//! actor handling an ask that (transitively) came from A asks A. It cannot
//! see two chains that meet: A's tell handler asks B while B's tell handler
//! asks A. Each ask starts a chain of its own, and both handlers wait
//! forever. This module catches that case where it closes, in a mailbox:
//!
//! - while an actor's handler (its own future: not a `Ctx::wait_for`
//!   future, not a spawned task) awaits an ask to X, the actor's cell keeps
//!   a [`Waited`] entry for X (made at the reply's first poll from the
//!   handler, gone when the reply resolves or is dropped) and its state
//!   says "blocked";
//! - every ask carries its sender, the actor whose handler made it (the last
//!   link of its chain; none for an ask made outside any actor's handler);
//! - an ask from S delivered to a blocked actor that awaits S fails at once
//!   with `AskError::WouldDeadlock` (a dead letter of that reason), unless
//!   S refused the other ask of the pair first (see [`Waited::claim_as_asker`]):
//!   exactly one ask of the pair fails, the newer one when they did not
//!   cross in flight.
//!
//! Cost: a delivery to an actor whose handler is not blocked on an ask
//! reads the same one-byte state as before (open or not); the rest runs on
//! a cold path, for deliveries to a blocked actor only. A handler's awaited
//! ask costs two atomic additions on its own cell (the entry's handle).
//!
//! Not caught: a cycle of three or more actors whose hops each start from a
//! tell handler (A's handler asks B, B's asks C, C's asks A: C's ask reaches
//! A, which awaits B, not C). Those need a deadline.

use std::cell::RefCell;
use std::ptr::NonNull;
use std::sync::atomic::AtomicUsize;

use crate::reply::{AskProbe, Waited};

/// What a blocked handler's actor keeps for the handler's waits.
pub(crate) trait BlockSite {
    /// The handler awaits `waited` (its reply's first poll that found none).
    fn register(&self, waited: Waited);
    /// The reply of `cell` resolved or was dropped.
    fn unregister(&self, cell: NonNull<AtomicUsize>);
}

/// The asks an actor's handler awaits (usually none or one; a join of
/// several keeps one each).
#[derive(Debug, Default)]
pub(crate) struct Waits(RefCell<Vec<Waited>>);

/// What a delivery to a blocked actor should do.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Refuse it: it closes a cycle.
    Refuse,
    /// Queue it; the actor still waits on something.
    Queue,
    /// Queue it; the actor waits on nothing any more (clear its blocked state).
    Unblocked,
}

impl Waits {
    /// Adds `waited`, dropping entries whose replies no handler awaits.
    pub(crate) fn register(&self, waited: Waited) {
        let stale = {
            let mut v = self.0.borrow_mut();
            let stale = take_stale(&mut v);
            v.push(waited);
            stale
        };
        drop(stale);
    }

    /// Removes the entry of `cell`; whether none is left.
    pub(crate) fn unregister(&self, cell: NonNull<AtomicUsize>) -> bool {
        let (gone, empty) = {
            let mut v = self.0.borrow_mut();
            let gone: Vec<Waited> = match v.iter().position(|w| w.is_of(cell)) {
                Some(i) => vec![v.swap_remove(i)],
                None => Vec::new(),
            };
            let mut stale = take_stale(&mut v);
            stale.extend(gone);
            (stale, v.is_empty())
        };
        drop(gone);
        empty
    }

    /// Forgets every entry (the actor stops).
    pub(crate) fn clear(&self) {
        let all = std::mem::take(&mut *self.0.borrow_mut());
        drop(all);
    }

    /// The verdict on an ask `probe` delivered to actor `me`, whose handler
    /// was blocked at its last poll.
    pub(crate) fn check(&self, me: u64, probe: &AskProbe<'_>) -> Verdict {
        let (verdict, stale) = {
            let mut v = self.0.borrow_mut();
            let stale = take_stale(&mut v);
            let verdict = match probe.sender() {
                _ if v.is_empty() => Verdict::Unblocked,
                None => Verdict::Queue,
                Some(sender) => match v.iter().find(|w| w.target() == sender) {
                    // The arbiter of the pair: the ask of the lower id's actor.
                    Some(mine) if me < sender && mine.claim_as_asker() => Verdict::Refuse,
                    Some(_) if me > sender && probe.claim_as_target() => Verdict::Refuse,
                    _ => Verdict::Queue,
                },
            };
            (verdict, stale)
        };
        // Handles let go outside the borrow (a cell freed here drops its chain).
        drop(stale);
        verdict
    }
}

/// Removes the entries whose replies no handler awaits any more (resolved
/// or dropped away from the actor's shard).
fn take_stale(v: &mut Vec<Waited>) -> Vec<Waited> {
    if v.iter().all(Waited::is_waited) {
        return Vec::new();
    }
    let (live, stale): (Vec<_>, Vec<_>) =
        std::mem::take(v).into_iter().partition(Waited::is_waited);
    *v = live;
    stale
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::reply::{Asked, Reply};
    use crate::Message;

    struct Ping;

    impl Message for Ping {
        type Reply = u64;
    }

    const A: u64 = 10;
    const B: u64 = 20;

    /// An ask made by `from`'s handler, that handler's waits on it (one
    /// entry, target `to`), and the envelope half on its way to `to`.
    fn blocked_ask(from: u64, to: u64) -> (Waits, Asked<Ping>, Reply<u64>) {
        let (asked, mut reply) = Asked::new(Ping, Some(Arc::new(vec![from])));
        let waits = Waits::default();
        waits.register(reply.waited_for_test(to));
        (waits, asked, reply)
    }

    #[test]
    fn two_blocked_handlers_refuse_exactly_one_ask_whichever_checks_first() {
        for a_first in [true, false] {
            // a awaits its ask to b, b its ask to a; each ask reaches the
            // other's mailbox (two shards: both checks may run at once).
            let (a_waits, to_b, _a_reply) = blocked_ask(A, B);
            let (b_waits, to_a, _b_reply) = blocked_ask(B, A);
            let at_a = || a_waits.check(A, &to_a.__probe());
            let at_b = || b_waits.check(B, &to_b.__probe());
            let (va, vb) = if a_first {
                let va = at_a();
                (va, at_b())
            } else {
                let vb = at_b();
                (at_a(), vb)
            };
            let refused = [&va, &vb]
                .iter()
                .filter(|v| ***v == Verdict::Refuse)
                .count();
            assert_eq!(refused, 1, "a first: {a_first}: {va:?} {vb:?}");
        }
    }

    #[test]
    fn a_second_ask_from_the_refused_side_is_refused_again() {
        // a (the lower id, so its own ask is the arbiter) refuses b's first
        // ask; b's handler gets the error and asks a again while a still
        // awaits b: that one closes the cycle again and must be refused too
        // (a's own earlier claim on the arbiter does not stop it).
        let (a_waits, _to_b, _a_reply) = blocked_ask(A, B);
        let (_b_waits, first, _r1) = blocked_ask(B, A);
        assert_eq!(a_waits.check(A, &first.__probe()), Verdict::Refuse);
        let (_b_waits, second, _r2) = blocked_ask(B, A);
        assert_eq!(a_waits.check(A, &second.__probe()), Verdict::Refuse);
    }

    #[test]
    fn a_late_ask_let_through_leaves_the_next_cycle_detectable() {
        // a (the lower id) refuses b's first ask by claiming its own ask
        // to b; b's handler gets the error and asks a again; only then does
        // a's ask reach b, whose handler is blocked on the second ask: b
        // lets it through (a claimed it). When b's second ask reaches a, a
        // must refuse it: b's losing claim left no mark on the arbiter.
        let (a_waits, to_b, _a_reply) = blocked_ask(A, B);
        let (_b_waits, first, _r1) = blocked_ask(B, A);
        assert_eq!(a_waits.check(A, &first.__probe()), Verdict::Refuse);
        let (b_waits, second, _r2) = blocked_ask(B, A);
        assert_eq!(b_waits.check(B, &to_b.__probe()), Verdict::Queue);
        assert_eq!(a_waits.check(A, &second.__probe()), Verdict::Refuse);
    }

    #[test]
    fn asks_from_others_and_from_outside_actors_are_queued() {
        let (a_waits, _to_b, _a_reply) = blocked_ask(A, B);
        let (_c_waits, from_c, _c_reply) = blocked_ask(30, A);
        assert_eq!(a_waits.check(A, &from_c.__probe()), Verdict::Queue);
        let (outside, _reply) = Asked::new(Ping, None);
        assert_eq!(a_waits.check(A, &outside.__probe()), Verdict::Queue);
    }

    #[test]
    fn a_resolved_or_dropped_reply_unblocks_its_actor() {
        let (a_waits, to_b, a_reply) = blocked_ask(A, B);
        let (_b_waits, to_a, _b_reply) = blocked_ask(B, A);
        // The reply goes away off the actor's shard: its entry is stale and
        // the next check drops it (and lets the ask in).
        drop(a_reply);
        assert_eq!(a_waits.check(A, &to_a.__probe()), Verdict::Unblocked);
        assert!(a_waits.0.borrow().is_empty());
        drop(to_b);
    }
}
