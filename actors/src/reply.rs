//! The reply slot of an `ask`: a one-shot cell shared by the asker's future
//! and the envelope in the actor's mailbox.
//!
//! States: `Waiting(waker)` → `Ready(value)` (the handler answered) or
//! `Failed(error)` (the envelope was dropped unanswered: the actor stopped, or
//! the handler panicked, which `std::thread::panicking()` tells apart) →
//! `Taken` (the asker has the outcome). A `tell` carries no slot at all.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::error::AskError;

enum SlotState<R> {
    Waiting(Option<Waker>),
    Ready(R),
    Failed(AskError),
    Taken,
}

struct Slot<R> {
    state: Mutex<SlotState<R>>,
    /// The actors waiting on this ask, outermost first (deadlock detection).
    chain: Option<Arc<[u64]>>,
}

impl<R> Slot<R> {
    fn complete(&self, outcome: Result<R, AskError>) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let SlotState::Waiting(waker) = &mut *state {
            let waker = waker.take();
            *state = match outcome {
                Ok(r) => SlotState::Ready(r),
                Err(e) => SlotState::Failed(e),
            };
            drop(state);
            if let Some(w) = waker {
                w.wake();
            }
        }
    }
}

/// Where the reply to a message goes: nowhere for a `tell`, the asker's
/// slot for an `ask`. Dropping it unanswered fails the ask.
pub struct ReplyTo<R> {
    slot: Option<Arc<Slot<R>>>,
}

impl<R> fmt::Debug for ReplyTo<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplyTo")
            .field("ask", &self.slot.is_some())
            .finish()
    }
}

impl<R> ReplyTo<R> {
    /// No one waits for the reply (a `tell`).
    #[inline]
    pub const fn none() -> Self {
        ReplyTo { slot: None }
    }

    /// Whether someone waits for the reply.
    #[inline]
    pub fn is_ask(&self) -> bool {
        self.slot.is_some()
    }

    /// Answers the asker, if any.
    pub fn send(mut self, value: R) {
        if let Some(slot) = self.slot.take() {
            slot.complete(Ok(value));
        }
    }

    /// The actors waiting (transitively) on this message's reply.
    pub(crate) fn chain(&self) -> Option<Arc<[u64]>> {
        self.slot.as_ref().and_then(|s| s.chain.clone())
    }
}

thread_local! {
    /// Why envelopes dropped right now go unanswered (see [`drop_with_reason`]).
    static DROP_REASON: std::cell::Cell<Option<AskError>> = const { std::cell::Cell::new(None) };
}

/// Drops `value` (envelopes) so that the asks inside fail with `reason`
/// rather than the generic [`AskError::Stopped`].
pub(crate) fn drop_with_reason<T>(reason: AskError, value: T) {
    let prev = DROP_REASON.replace(Some(reason));
    drop(value);
    DROP_REASON.set(prev);
}

impl<R> Drop for ReplyTo<R> {
    #[inline]
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            let err = if std::thread::panicking() {
                AskError::Panicked
            } else {
                DROP_REASON
                    .try_with(std::cell::Cell::get)
                    .ok()
                    .flatten()
                    .unwrap_or(AskError::Stopped)
            };
            slot.complete(Err(err));
        }
    }
}

/// A new ask: the reply slot for the envelope, and the receiving half.
pub(crate) fn ask_pair<R>(chain: Option<Arc<[u64]>>) -> (ReplyTo<R>, Reply<R>) {
    let slot = Arc::new(Slot {
        state: Mutex::new(SlotState::Waiting(None)),
        chain,
    });
    (
        ReplyTo {
            slot: Some(slot.clone()),
        },
        Reply {
            inner: ReplyInner::Pending(slot),
            deadline: None,
            sleep: None,
        },
    )
}

enum ReplyInner<R> {
    Pending(Arc<Slot<R>>),
    Failed(AskError),
    Done,
}

/// The reply to an `ask`: a future resolving to the handler's return value or
/// an [`AskError`]. It never hangs on a dead actor; a deadline (the system's
/// default ask timeout, or [`Reply::timeout`]) bounds waiting on a live one.
#[must_use = "an ask does nothing useful unless its reply is awaited"]
pub struct Reply<R> {
    inner: ReplyInner<R>,
    deadline: Option<Instant>,
    sleep: Option<mailring::time::Sleep>,
}

impl<R> fmt::Debug for Reply<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reply")
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl<R> Reply<R> {
    pub(crate) fn failed(err: AskError) -> Self {
        Reply {
            inner: ReplyInner::Failed(err),
            deadline: None,
            sleep: None,
        }
    }

    /// Gives up with [`AskError::Timeout`] after `duration`.
    pub fn timeout(self, duration: Duration) -> Self {
        self.deadline(mailring::time::now() + duration)
    }

    /// Gives up with [`AskError::Timeout`] at `deadline`.
    pub fn deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self.sleep = None;
        self
    }

    /// Waits for as long as it takes (no deadline; a dead actor still fails
    /// the ask at once).
    pub fn no_timeout(mut self) -> Self {
        self.deadline = None;
        self.sleep = None;
        self
    }

    pub(crate) fn with_default_deadline(self, timeout: Option<Duration>) -> Self {
        match timeout {
            Some(t) => self.timeout(t),
            None => self,
        }
    }
}

impl<R> Unpin for Reply<R> {}

impl<R> Future for Reply<R> {
    type Output = Result<R, AskError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let slot = match &this.inner {
            ReplyInner::Pending(slot) => slot.clone(),
            ReplyInner::Failed(e) => {
                let e = *e;
                this.inner = ReplyInner::Done;
                return Poll::Ready(Err(e));
            }
            ReplyInner::Done => panic!("Reply polled after completion"),
        };
        {
            let mut state = slot.state.lock().unwrap_or_else(|p| p.into_inner());
            match std::mem::replace(&mut *state, SlotState::Taken) {
                SlotState::Ready(r) => {
                    drop(state);
                    this.inner = ReplyInner::Done;
                    return Poll::Ready(Ok(r));
                }
                SlotState::Failed(e) => {
                    drop(state);
                    this.inner = ReplyInner::Done;
                    return Poll::Ready(Err(e));
                }
                SlotState::Waiting(w) => {
                    let w = match w {
                        Some(w) if w.will_wake(cx.waker()) => w,
                        _ => cx.waker().clone(),
                    };
                    *state = SlotState::Waiting(Some(w));
                }
                SlotState::Taken => unreachable!("a pending reply is never taken"),
            }
        }
        if let Some(deadline) = this.deadline {
            if mailring::current_shard().is_some() {
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| mailring::time::sleep_until(deadline));
                if Pin::new(sleep).poll(cx).is_ready() {
                    this.inner = ReplyInner::Done;
                    return Poll::Ready(Err(AskError::Timeout));
                }
            } else if mailring::time::now() >= deadline {
                this.inner = ReplyInner::Done;
                return Poll::Ready(Err(AskError::Timeout));
            }
        }
        Poll::Pending
    }
}
