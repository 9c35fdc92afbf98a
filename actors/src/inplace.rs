//! Awaiting a handler's future in place without an out-of-line drop once it
//! has completed.
//!
//! A completed `async` block holds nothing, but dropping it still calls its
//! drop glue, which the compiler keeps out of line for envelopes (they can
//! hold an ask, which has a `Drop`): a call per message on the actor loop's
//! hottest path (15 of ~130 instructions per same-shard tell, callgrind).
//! [`InPlace`] remembers whether its future completed and drops it only if
//! not (the actor stopped or was cancelled mid-handler). This module owns the
//! pin projection that needs.

use std::future::Future;
use std::mem::ManuallyDrop;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A future, dropped by [`InPlace`]'s own `Drop` only if it did not complete.
pub(crate) struct InPlace<F> {
    future: ManuallyDrop<F>,
    done: bool,
}

impl<F: Future> InPlace<F> {
    pub(crate) fn new(future: F) -> Self {
        InPlace {
            future: ManuallyDrop::new(future),
            done: false,
        }
    }
}

impl<F: Future> Future for InPlace<F> {
    type Output = F::Output;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // SAFETY: structural pinning of `future`: it is never moved out of
        // `self` (it is only dropped in place, by `Drop`), and `InPlace` is
        // `Unpin` only when `F` is.
        let this = unsafe { self.get_unchecked_mut() };
        debug_assert!(!this.done, "InPlace polled after completion");
        // SAFETY: see above; `this` stays where the pin put it.
        let future = unsafe { Pin::new_unchecked(&mut *this.future) };
        let polled = future.poll(cx);
        if polled.is_ready() {
            this.done = true;
        }
        polled
    }
}

impl<F> Drop for InPlace<F> {
    #[inline]
    fn drop(&mut self) {
        if !self.done {
            // SAFETY: the future was not dropped before (only here, once), and
            // `self` is going away, so it is never used again.
            unsafe { ManuallyDrop::drop(&mut self.future) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Waker;

    struct Tracked(Arc<AtomicUsize>);

    impl Drop for Tracked {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn an_unfinished_future_is_dropped_and_a_finished_one_released_its_state() {
        let drops = Arc::new(AtomicUsize::new(0));
        let mut cx = Context::from_waker(Waker::noop());
        // Completed: its captured value was dropped when it finished.
        let t = Tracked(drops.clone());
        let mut done = std::pin::pin!(InPlace::new(async move {
            drop(t);
            1
        }));
        assert_eq!(done.as_mut().poll(&mut cx), Poll::Ready(1));
        assert_eq!(drops.load(Ordering::Relaxed), 1);
        // Never finished: dropping the wrapper drops what it holds.
        let t = Tracked(drops.clone());
        let pending = InPlace::new(async move {
            std::future::pending::<()>().await;
            drop(t);
        });
        let mut pending = Box::pin(pending);
        assert!(pending.as_mut().poll(&mut cx).is_pending());
        drop(pending);
        assert_eq!(drops.load(Ordering::Relaxed), 2);
    }
}
