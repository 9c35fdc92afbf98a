//! The reply slot of an `ask`: a one-shot cell shared by the asker's future
//! and the envelope in the actor's mailbox.
//!
//! The reply slot takes one outcome: the handler's answer, or the error of an
//! envelope dropped unanswered (the actor stopped, or the handler panicked,
//! which `std::thread::panicking()` tells apart); the first one wins and the
//! asker takes it once. A `tell` carries no slot at all.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use mailring::sync::Slot;
use std::time::{Duration, Instant};

use crate::actor::Message;
use crate::error::AskError;

/// One ask: the message until the actor takes it, and the reply slot. One
/// allocation, shared by the envelope and the asker's [`Reply`]; both halves
/// are lock-free one-shot slots (`mailring::sync::Slot`).
struct AskCell<M: Message> {
    msg: Slot<M>,
    /// The first outcome wins: the handler's answer, or the reason it never came.
    reply: Slot<Result<M::Reply, AskError>>,
    /// The actors waiting on this ask, outermost first (deadlock detection).
    chain: Option<Arc<[u64]>>,
}

/// What the handler side sees of an ask: where the reply goes (on the
/// actor's shard only, so no `Send` needed).
trait Completer<R> {
    fn complete(&self, outcome: Result<R, AskError>);
    fn chain(&self) -> Option<Arc<[u64]>>;
}

/// What the asker sees of an ask: the outcome to wait for.
trait Outcome<R>: Send + Sync {
    fn poll_outcome(&self, cx: &mut Context<'_>) -> Poll<Result<R, AskError>>;
}

impl<M: Message> Completer<M::Reply> for AskCell<M> {
    fn complete(&self, outcome: Result<M::Reply, AskError>) {
        // A second outcome (a drop after an answer) finds the slot taken.
        let _ = self.reply.send(outcome);
    }

    fn chain(&self) -> Option<Arc<[u64]>> {
        self.chain.clone()
    }
}

impl<M> Outcome<M::Reply> for AskCell<M>
where
    M: Message + Send,
    M::Reply: Send,
{
    fn poll_outcome(&self, cx: &mut Context<'_>) -> Poll<Result<M::Reply, AskError>> {
        // `None`: the outcome was already taken.
        self.reply
            .poll_take(cx)
            .map(|outcome| outcome.unwrap_or(Err(AskError::Stopped)))
    }
}

/// Why an ask dropped right now goes unanswered.
fn drop_reason() -> AskError {
    if std::thread::panicking() {
        AskError::Panicked
    } else {
        DROP_REASON
            .try_with(std::cell::Cell::get)
            .ok()
            .flatten()
            .unwrap_or(AskError::Stopped)
    }
}

/// An asked message on its way to (or in) an actor's mailbox. Dropping it
/// unopened fails the ask with the reason (stopped, panicked, shutting down).
pub struct Asked<M: Message> {
    cell: Option<Arc<AskCell<M>>>,
}

impl<M: Message> fmt::Debug for Asked<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Asked")
    }
}

impl<M> Asked<M>
where
    M: Message + Send,
    M::Reply: Send,
{
    /// A new ask of `msg`: the envelope half and the asker's reply.
    pub(crate) fn new(msg: M, chain: Option<Arc<[u64]>>) -> (Asked<M>, Reply<M::Reply>) {
        let cell = Arc::new(AskCell {
            msg: Slot::with_value(msg),
            reply: Slot::new(),
            chain,
        });
        let outcome: Arc<dyn Outcome<M::Reply>> = cell.clone();
        (
            Asked { cell: Some(cell) },
            Reply {
                inner: ReplyInner::Pending(outcome),
                deadline: None,
                sleep: None,
            },
        )
    }
}

impl<M: Message> Asked<M> {
    /// Takes the message out, with the slot its reply goes to.
    pub fn open(mut self) -> (M, ReplyTo<M::Reply>) {
        let cell = self.cell.take().expect("an ask is opened once");
        let msg = cell.msg.try_take().expect("an ask's message is taken once");
        let slot: Arc<dyn Completer<M::Reply>> = cell;
        (msg, ReplyTo { slot: Some(slot) })
    }
}

impl<M: Message> Drop for Asked<M> {
    fn drop(&mut self) {
        if let Some(cell) = self.cell.take() {
            cell.complete(Err(drop_reason()));
        }
    }
}

/// Where the reply to a message goes: nowhere for a `tell`, the asker's
/// slot for an `ask`. Dropping it unanswered fails the ask.
pub struct ReplyTo<R> {
    slot: Option<Arc<dyn Completer<R>>>,
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
        self.slot.as_ref().and_then(|s| s.chain())
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
            slot.complete(Err(drop_reason()));
        }
    }
}

enum ReplyInner<R> {
    Pending(Arc<dyn Outcome<R>>),
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
        let polled = match &this.inner {
            ReplyInner::Pending(slot) => slot.poll_outcome(cx),
            ReplyInner::Failed(e) => Poll::Ready(Err(*e)),
            ReplyInner::Done => panic!("Reply polled after completion"),
        };
        if let Poll::Ready(outcome) = polled {
            this.inner = ReplyInner::Done;
            return Poll::Ready(outcome);
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
