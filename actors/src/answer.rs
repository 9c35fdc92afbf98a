//! A one-shot answer from an actor's shard to whoever asked (a stop
//! notification, a liveness probe): an [`Answer`] dropped unanswered (the
//! request refused at shutdown) resolves the waiting side with `None`.

use std::future::{poll_fn, Future};
use std::sync::Arc;

use mailring::sync::Slot;

/// The answering half: [`send`](Answer::send) once, or drop.
pub(crate) struct Answer<T>(Arc<Slot<T>>);

impl<T: Send> Answer<T> {
    pub(crate) fn send(self, value: T) {
        let _ = self.0.send(value);
    }
}

impl<T> Drop for Answer<T> {
    fn drop(&mut self) {
        // After a `send`, closing changes nothing the taker sees.
        self.0.close();
    }
}

/// A new answer and the future of its value (`None`: dropped unanswered).
pub(crate) fn channel<T: Send + 'static>() -> (Answer<T>, impl Future<Output = Option<T>> + Send) {
    let slot = Arc::new(Slot::new());
    let taker = slot.clone();
    (Answer(slot), async move {
        poll_fn(|cx| taker.poll_take(cx)).await
    })
}
