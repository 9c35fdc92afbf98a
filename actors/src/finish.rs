//! Awaiting a message's handling without the drop of its finished future.
//!
//! The envelope's `handle` is an `async fn` (the derive generates it). Once
//! such a future has returned, its state owns nothing: every argument and
//! local was dropped or moved out before it returned. Dropping it still
//! costs a call that matches on the state (15 instructions a message, about
//! 6% of a cross-shard tell). [`Finish`] skips that call for a future that
//! returned, and drops in place one that did not (an actor stopped, or a
//! panic unwinding, while its handler waits).

use std::future::Future;
use std::mem::ManuallyDrop;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Polls `F` to completion, then lets its finished state go without a drop.
///
/// For futures whose finished state owns nothing (`async fn`s and `async`
/// blocks): for another future, skipping the drop would leak what its
/// finished state still holds.
pub(crate) struct Finish<F: Future> {
    fut: ManuallyDrop<F>,
    returned: bool,
}

impl<F: Future> Finish<F> {
    #[inline(always)]
    pub(crate) fn new(fut: F) -> Self {
        Finish {
            fut: ManuallyDrop::new(fut),
            returned: false,
        }
    }
}

impl<F: Future> Future for Finish<F> {
    type Output = F::Output;

    #[inline(always)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // SAFETY: `fut` is pinned with `self`: it is never moved out, and it
        // is dropped in place (our `Drop`) unless it returned, so the pin's
        // drop guarantee holds. `returned` is a plain flag, not pinned.
        let this = unsafe { self.get_unchecked_mut() };
        debug_assert!(!this.returned, "Finish polled after completion");
        // SAFETY: as above; `fut` is structurally pinned.
        let out = unsafe { Pin::new_unchecked(&mut *this.fut) }.poll(cx);
        if out.is_ready() {
            this.returned = true;
        }
        out
    }
}

impl<F: Future> Drop for Finish<F> {
    #[inline(always)]
    fn drop(&mut self) {
        if !self.returned {
            // SAFETY: dropped once, here, in place; it was never moved (it
            // may be pinned) and is not used again.
            unsafe { ManuallyDrop::drop(&mut self.fut) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    struct Counted(Rc<Cell<u32>>);

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.set(self.0.get() + 1);
        }
    }

    /// A counter of drops and a value that bumps it once dropped.
    fn held() -> (Rc<Cell<u32>>, Counted) {
        let drops = Rc::new(Cell::new(0));
        let held = Counted(drops.clone());
        (drops, held)
    }

    #[test]
    fn a_future_dropped_before_it_returns_drops_what_it_holds() {
        let (drops, held) = held();
        let mut fut = Box::pin(Finish::new(async move {
            let _held = held;
            std::future::pending::<()>().await;
        }));
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(fut.as_mut().poll(&mut cx).is_pending());
        drop(fut);
        assert_eq!(drops.get(), 1);
    }

    #[test]
    fn a_returned_future_has_dropped_its_state_itself() {
        let (drops, held) = held();
        let mut fut = Box::pin(Finish::new(async move {
            let _held = held;
            7
        }));
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert_eq!(fut.as_mut().poll(&mut cx), Poll::Ready(7));
        assert_eq!(drops.get(), 1);
        drop(fut);
        assert_eq!(drops.get(), 1);
    }

    #[test]
    fn a_never_polled_future_is_dropped() {
        let (drops, held) = held();
        drop(Finish::new(async move {
            let _held = held;
        }));
        assert_eq!(drops.get(), 1);
    }
}
