//! Join handles: how a task's output (or its panic, or its cancellation) reaches
//! whoever awaits it.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::sync::Slot;

/// Why a task produced no output.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum JoinError {
    /// The task was aborted, or the runtime shut down before it finished.
    #[error("task was cancelled before it finished")]
    Cancelled,
    /// The task panicked; the payload is what `panic!` was given.
    #[error("task panicked: {}", panic_message(&**.0))]
    Panicked(Box<dyn Any + Send + 'static>),
}

impl JoinError {
    /// Whether the task was cancelled.
    pub fn is_cancelled(&self) -> bool {
        matches!(self, JoinError::Cancelled)
    }

    /// Whether the task panicked.
    pub fn is_panic(&self) -> bool {
        matches!(self, JoinError::Panicked(_))
    }

    /// The panic payload, to re-raise with [`std::panic::resume_unwind`].
    ///
    /// # Errors
    ///
    /// Gives the error back when it is not a panic.
    pub fn try_into_panic(self) -> Result<Box<dyn Any + Send + 'static>, JoinError> {
        match self {
            JoinError::Panicked(p) => Ok(p),
            other => Err(other),
        }
    }
}

impl fmt::Debug for JoinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JoinError::Cancelled => f.write_str("Cancelled"),
            JoinError::Panicked(p) => f
                .debug_tuple("Panicked")
                .field(&panic_message(&**p))
                .finish(),
        }
    }
}

pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "<non-string panic payload>"
    }
}

/// The output slot shared by a task (or blocking job) and its [`JoinHandle`]:
/// a lock-free [`Slot`], so a joiner on another shard never parks the
/// completing shard (or the other way round) in a futex.
///
/// The first completion stores the output and wakes the joiner; the handle
/// takes it once. A detached handle closes the slot first when it can, so a
/// later completion finds it closed and drops the output itself, on its own
/// thread; an output already stored is taken and dropped by the detach.
#[derive(Debug)]
pub(crate) struct JoinCell<T> {
    slot: Slot<Result<T, JoinError>>,
}

impl<T> JoinCell<T> {
    pub(crate) fn new() -> Self {
        JoinCell { slot: Slot::new() }
    }

    /// Stores the result and wakes the joiner. Only the first completion counts.
    pub(crate) fn complete(&self, result: Result<T, JoinError>) {
        // Refused: completed before, or detached. Either way the result is
        // dropped here.
        let _ = self.slot.send(result);
    }

    pub(crate) fn poll(&self, cx: &mut Context<'_>) -> Poll<Result<T, JoinError>> {
        match self.slot.poll_take(cx) {
            Poll::Ready(Some(out)) => Poll::Ready(out),
            // Only a detach closes the slot, and it consumes the handle.
            Poll::Ready(None) => panic!("JoinHandle polled after it returned its output"),
            Poll::Pending => Poll::Pending,
        }
    }

    pub(crate) fn detach(&self) {
        if self.slot.close() {
            return;
        }
        // Completed, or completing: the output is dropped now, here. A
        // completion caught writing it (a move, never blocked) is waited
        // out, or the output would stay in the cell until its last
        // reference went, wherever that is.
        let mut spins = 0u32;
        loop {
            match self.slot.try_take() {
                Ok(output) => return drop(output),
                Err(crate::sync::TakeError::Closed) => return,
                Err(crate::sync::TakeError::Empty) => {
                    spins += 1;
                    if spins < 64 {
                        std::hint::spin_loop();
                    } else {
                        std::thread::yield_now();
                    }
                }
            }
        }
    }

    pub(crate) fn is_finished(&self) -> bool {
        self.slot.is_sent()
    }
}

/// What a [`JoinHandle`] needs from the thing it joins.
pub(crate) trait Joinable<T>: Send + Sync {
    fn poll_join(&self, cx: &mut Context<'_>) -> Poll<Result<T, JoinError>>;
    fn detach(&self);
    fn abort(self: Arc<Self>);
    fn is_finished(&self) -> bool;
}

/// An owned permission to await a task's output, or to abort it.
///
/// Dropping the handle detaches the task: it keeps running and its output is
/// dropped. A task that panics resolves its handle to [`JoinError::Panicked`];
/// the shard it ran on carries on.
///
/// # Examples
///
/// ```
/// let rt = mailring::Runtime::builder().shards(2).build()?;
/// let answer = rt.block_on(async {
///     let h = mailring::spawn(async { 6 * 7 });
///     h.await.unwrap()
/// });
/// assert_eq!(answer, 42);
/// # Ok::<(), mailring::BuildError>(())
/// ```
pub struct JoinHandle<T> {
    raw: Option<Arc<dyn Joinable<T>>>,
    _output: PhantomData<T>,
}

impl<T> JoinHandle<T> {
    pub(crate) fn new(raw: Arc<dyn Joinable<T>>) -> Self {
        JoinHandle {
            raw: Some(raw),
            _output: PhantomData,
        }
    }

    fn raw(&self) -> &Arc<dyn Joinable<T>> {
        self.raw.as_ref().expect("JoinHandle used after detach")
    }

    /// Asks the task to stop. A task that has not finished is dropped at its
    /// next scheduling point on its own shard and resolves to
    /// [`JoinError::Cancelled`]. A running blocking job cannot be stopped.
    pub fn abort(&self) {
        self.raw().clone().abort();
    }

    /// Lets the task run on with nobody waiting for its output.
    pub fn detach(mut self) {
        if let Some(raw) = self.raw.take() {
            raw.detach();
        }
    }

    /// Whether the task has finished (with output, panic or cancellation).
    pub fn is_finished(&self) -> bool {
        self.raw().is_finished()
    }
}

impl<T> Future for JoinHandle<T> {
    type Output = Result<T, JoinError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.raw().poll_join(cx)
    }
}

impl<T> Drop for JoinHandle<T> {
    fn drop(&mut self) {
        if let Some(raw) = self.raw.take() {
            raw.detach();
        }
    }
}

impl<T> fmt::Debug for JoinHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinHandle")
            .field("finished", &self.raw.as_ref().map(|r| r.is_finished()))
            .finish()
    }
}
