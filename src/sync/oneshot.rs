//! A one-shot channel: one value from a [`Sender`] to a [`Receiver`], which is
//! a future. It works on any executor and across threads; one allocation per
//! channel, no lock.
//!
//! # Examples
//!
//! ```
//! let rt = mailring::Runtime::builder().shards(2).build()?;
//! let answer = rt.block_on(async {
//!     let (tx, rx) = mailring::sync::oneshot::channel();
//!     mailring::spawn(async move {
//!         tx.send(6 * 7).unwrap();
//!     });
//!     rx.await
//! });
//! assert_eq!(answer, Ok(42));
//! # Ok::<(), mailring::BuildError>(())
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::{Slot, TakeError};

/// The error of a [`Receiver`]: the [`Sender`] was dropped without sending.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the sender was dropped without sending")]
pub struct RecvError(());

/// What [`Receiver::try_recv`] found instead of a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TryRecvError {
    /// Nothing was sent yet.
    #[error("no value yet")]
    Empty,
    /// The sender was dropped without sending, or the value was already received.
    #[error("the sender was dropped without sending")]
    Closed,
}

/// Creates a channel for one value.
pub fn channel<T>() -> (Sender<T>, Receiver<T>) {
    let slot = Arc::new(Slot::new());
    (
        Sender {
            slot: Some(slot.clone()),
        },
        Receiver { slot },
    )
}

/// Sends the value; see [`channel`]. Dropping it unsent closes the channel.
pub struct Sender<T> {
    slot: Option<Arc<Slot<T>>>,
}

impl<T> fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sender").finish_non_exhaustive()
    }
}

impl<T> Sender<T> {
    /// Sends `value` and wakes the receiver.
    ///
    /// # Errors
    ///
    /// The value comes back when the receiver was dropped.
    pub fn send(mut self, value: T) -> Result<(), T> {
        let slot = self.slot.take().expect("a sender sends once");
        // Only the receiver closes a slot it holds (by dropping), so a full
        // slot here means the receiver is gone.
        if Arc::strong_count(&slot) == 1 {
            return Err(value);
        }
        slot.send(value)
    }

    /// Whether the receiver was dropped (a value sent now would be lost).
    pub fn is_closed(&self) -> bool {
        self.slot.as_ref().is_none_or(|s| Arc::strong_count(s) == 1)
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            slot.close();
        }
    }
}

/// Receives the value; a future resolving to it, or to [`RecvError`] when the
/// sender is dropped unsent.
pub struct Receiver<T> {
    slot: Arc<Slot<T>>,
}

impl<T> fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receiver")
            .field("slot", &self.slot)
            .finish()
    }
}

impl<T> Receiver<T> {
    /// Takes the value if it has arrived.
    ///
    /// # Errors
    ///
    /// [`TryRecvError::Empty`] while nothing was sent; [`TryRecvError::Closed`]
    /// when the sender was dropped unsent or the value was already received.
    pub fn try_recv(&mut self) -> Result<T, TryRecvError> {
        self.slot.try_take().map_err(|e| match e {
            TakeError::Empty => TryRecvError::Empty,
            TakeError::Closed => TryRecvError::Closed,
        })
    }
}

impl<T> Future for Receiver<T> {
    type Output = Result<T, RecvError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.slot.poll_take(cx).map(|v| v.ok_or(RecvError(())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_crosses_threads() {
        let (tx, rx) = channel();
        std::thread::spawn(move || tx.send(String::from("hi")).unwrap());
        assert_eq!(futures_lite_block_on(rx), Ok(String::from("hi")));
    }

    #[test]
    fn a_dropped_sender_fails_the_receiver() {
        let (tx, mut rx) = channel::<u8>();
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
        drop(tx);
        assert_eq!(rx.try_recv(), Err(TryRecvError::Closed));
        assert_eq!(futures_lite_block_on(rx), Err(RecvError(())));
    }

    #[test]
    fn a_dropped_receiver_returns_the_value() {
        let (tx, rx) = channel::<u8>();
        assert!(!tx.is_closed());
        drop(rx);
        assert!(tx.is_closed());
        assert_eq!(tx.send(3), Err(3));
    }

    /// A minimal executor for one future on this thread (parks until woken).
    fn futures_lite_block_on<F: Future>(fut: F) -> F::Output {
        struct Unpark(std::thread::Thread);
        impl std::task::Wake for Unpark {
            fn wake(self: Arc<Self>) {
                self.0.unpark();
            }
        }
        let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        let mut fut = std::pin::pin!(fut);
        loop {
            if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
                return v;
            }
            std::thread::park();
        }
    }
}
