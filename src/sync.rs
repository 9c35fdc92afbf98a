//! Synchronisation that works with any executor: a lock-free one-shot value
//! [`Slot`] to embed in shared state, the [`oneshot`] channel built on it,
//! and [`WaitList`], the wakers of a wait whose waiters may give up.
//!
//! A [`Slot`] holds at most one value over its life: the first
//! [`send`](Slot::send) (or [`close`](Slot::close)) wins, the first
//! [`try_take`](Slot::try_take) or [`poll_take`](Slot::poll_take) that finds the
//! value takes it, and a task polling for it is woken when it arrives. Every
//! method takes `&self` and may race with every other: one atomic state word
//! decides who touches the value, and the waker sits in a lock-free cell (the
//! register/wake protocol of an `AtomicWaker`). Both are model-checked with
//! loom (`RUSTFLAGS="--cfg loom" cargo test -p mailring --lib --release loom_tests`).
//!
//! The actor layer's asks keep their message and their reply in two slots of
//! one allocation.

pub mod oneshot;
mod wait_list;

pub use wait_list::{TakenWakers, WaitKey, WaitList};

use std::fmt;
use std::mem::MaybeUninit;
use std::task::{Context, Poll, Waker};

use crate::loom::{fence, AtomicU8, Ordering, UnsafeCell};

/// Nothing sent yet.
const EMPTY: u8 = 0;
/// A sender is writing the value.
const WRITING: u8 = 1;
/// The value is there.
const FULL: u8 = 2;
/// A taker is reading the value.
const READING: u8 = 3;
/// The value was taken.
const TAKEN: u8 = 4;
/// Closed before any value was sent.
const CLOSED: u8 = 5;

/// What [`Slot::try_take`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TakeError {
    /// Nothing was sent yet: a value may still come.
    Empty,
    /// Nothing will come: the slot was closed unsent, or its value was already taken.
    Closed,
}

/// A one-shot value cell shared by reference (put it in an `Arc` or a
/// `static`). See the [module docs](self).
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use mailring::sync::{Slot, TakeError};
///
/// let slot = Arc::new(Slot::new());
/// assert_eq!(slot.try_take(), Err(TakeError::Empty));
/// let sender = slot.clone();
/// std::thread::spawn(move || sender.send(42).unwrap()).join().unwrap();
/// assert_eq!(slot.try_take(), Ok(42));
/// assert_eq!(slot.try_take(), Err(TakeError::Closed));
/// ```
pub struct Slot<T> {
    state: AtomicU8,
    value: UnsafeCell<MaybeUninit<T>>,
    // The waker cell's two fields sit in the slot itself (not in a nested
    // struct), so both state bytes share one word of padding: a slot of a
    // 16-byte value is 40 bytes, and an ask's whole cell fits a cache line.
    waker_state: AtomicU8,
    waker: UnsafeCell<Option<Waker>>,
}

// SAFETY: the value moves between threads (sent on one, taken on another), so
// `T: Send` is required and sufficient: no `&T` is ever handed out, and the
// state word gives exactly one thread access to the value at a time.
unsafe impl<T: Send> Send for Slot<T> {}
// SAFETY: as above; shared references only reach the value through the state
// protocol (one writer, then one reader), never concurrently.
unsafe impl<T: Send> Sync for Slot<T> {}

impl<T> Default for Slot<T> {
    fn default() -> Self {
        Slot::new()
    }
}

impl<T> fmt::Debug for Slot<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state.load(Ordering::Acquire) {
            EMPTY => "empty",
            WRITING | FULL => "full",
            READING | TAKEN => "taken",
            _ => "closed",
        };
        f.debug_struct("Slot").field("state", &state).finish()
    }
}

impl<T> Slot<T> {
    /// An empty slot.
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        Slot {
            state: AtomicU8::new(EMPTY),
            value: UnsafeCell::new(MaybeUninit::uninit()),
            waker_state: AtomicU8::new(IDLE),
            waker: UnsafeCell::new(None),
        }
    }

    /// An empty slot.
    #[cfg(loom)]
    pub fn new() -> Self {
        Slot {
            state: AtomicU8::new(EMPTY),
            value: UnsafeCell::new(MaybeUninit::uninit()),
            waker_state: AtomicU8::new(IDLE),
            waker: UnsafeCell::new(None),
        }
    }

    /// A slot that already holds `value`.
    pub fn with_value(value: T) -> Self {
        Slot {
            state: AtomicU8::new(FULL),
            value: UnsafeCell::new(MaybeUninit::new(value)),
            waker_state: AtomicU8::new(IDLE),
            waker: UnsafeCell::new(None),
        }
    }

    /// Puts `value` in the slot and wakes the task waiting for it.
    ///
    /// # Errors
    ///
    /// The value comes back when something was sent before or the slot was closed.
    pub fn send(&self, value: T) -> Result<(), T> {
        if self
            .state
            .compare_exchange(EMPTY, WRITING, Ordering::Acquire, Ordering::Acquire)
            .is_err()
        {
            return Err(value);
        }
        // SAFETY: winning EMPTY -> WRITING gives this thread sole access to the
        // value until it publishes FULL; no value was written before (EMPTY).
        self.value.with_mut(|v| unsafe { (*v).write(value) });
        self.state.store(FULL, Ordering::Release);
        // With the fence a registering receiver puts between registering
        // and looking again: either `wake` sees the registration, or the
        // receiver sees FULL.
        fence(Ordering::SeqCst);
        self.waker_cell().wake();
        Ok(())
    }

    /// Closes an empty slot (the sender went away): takers see [`TakeError::Closed`]
    /// and the waiting task is woken. Returns `false` when a value was sent first.
    pub fn close(&self) -> bool {
        let closed = self
            .state
            .compare_exchange(EMPTY, CLOSED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if closed {
            // As in `send`.
            fence(Ordering::SeqCst);
            self.waker_cell().wake();
        }
        closed
    }

    /// Takes the value if it is there.
    ///
    /// # Errors
    ///
    /// [`TakeError::Empty`] while nothing was sent; [`TakeError::Closed`] once
    /// the slot was closed or the value already taken.
    pub fn try_take(&self) -> Result<T, TakeError> {
        match self
            .state
            .compare_exchange(FULL, READING, Ordering::Acquire, Ordering::Acquire)
        {
            Ok(_) => {
                // SAFETY: winning FULL -> READING gives this thread sole access
                // to the value, which the sender initialised before its Release
                // store of FULL (synchronised by the Acquire above). It is read
                // once: the state never returns to FULL.
                let value = self.value.with(|v| unsafe { (*v).assume_init_read() });
                self.state.store(TAKEN, Ordering::Release);
                Ok(value)
            }
            // A sender is mid-write: the value is as good as there, but not yet
            // readable; the sender wakes whoever registered.
            Err(EMPTY | WRITING) => Err(TakeError::Empty),
            Err(_) => Err(TakeError::Closed),
        }
    }

    /// Takes the value, or registers `cx` to be woken when it arrives. `None`
    /// once the slot was closed or its value taken.
    pub fn poll_take(&self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        match self.try_take() {
            Ok(v) => return Poll::Ready(Some(v)),
            Err(TakeError::Closed) => return Poll::Ready(None),
            Err(TakeError::Empty) => {}
        }
        self.waker_cell().register(cx.waker());
        // A send that finished before the registration found no waker: look
        // again (the fence pairs with the sender's, see `send`).
        fence(Ordering::SeqCst);
        match self.try_take() {
            Ok(v) => Poll::Ready(Some(v)),
            Err(TakeError::Closed) => Poll::Ready(None),
            Err(TakeError::Empty) => Poll::Pending,
        }
    }

    /// [`Slot::try_take`] for a slot with one taker: a load and a store
    /// instead of a compare-exchange.
    ///
    /// # Safety
    ///
    /// No other thread calls a taking method (`try_take*`, `poll_take*`) on
    /// this slot at the same time.
    pub unsafe fn try_take_single(&self) -> Result<T, TakeError> {
        match self.state.load(Ordering::Acquire) {
            FULL => {
                // SAFETY: FULL was published by the sender's store after its
                // write (the load synchronises with it); only a taker moves
                // the state on from FULL, and the caller is the only one.
                let value = self.value.with(|v| unsafe { (*v).assume_init_read() });
                self.state.store(TAKEN, Ordering::Release);
                Ok(value)
            }
            EMPTY | WRITING => Err(TakeError::Empty),
            _ => Err(TakeError::Closed),
        }
    }

    /// [`Slot::poll_take`] for a slot with one taker.
    ///
    /// # Safety
    ///
    /// As [`Slot::try_take_single`].
    pub unsafe fn poll_take_single(&self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        // SAFETY: (caller) the only taker.
        match unsafe { self.try_take_single() } {
            Ok(v) => return Poll::Ready(Some(v)),
            Err(TakeError::Closed) => return Poll::Ready(None),
            Err(TakeError::Empty) => {}
        }
        self.waker_cell().register(cx.waker());
        // A send that finished before the registration found no waker: look
        // again (the fence pairs with the sender's, see `send`).
        fence(Ordering::SeqCst);
        // SAFETY: as above.
        match unsafe { self.try_take_single() } {
            Ok(v) => Poll::Ready(Some(v)),
            Err(TakeError::Closed) => Poll::Ready(None),
            Err(TakeError::Empty) => Poll::Pending,
        }
    }

    /// Whether a value was sent (it may have been taken since).
    pub fn is_sent(&self) -> bool {
        matches!(self.state.load(Ordering::Acquire), FULL | READING | TAKEN)
    }

    /// Whether nothing can be taken any more (closed, or the value was taken).
    pub fn is_closed(&self) -> bool {
        matches!(self.state.load(Ordering::Acquire), READING | TAKEN | CLOSED)
    }
}

impl<T> Slot<T> {
    #[inline]
    fn waker_cell(&self) -> WakerCell<'_> {
        WakerCell {
            state: &self.waker_state,
            waker: &self.waker,
        }
    }
}

impl<T> Drop for Slot<T> {
    fn drop(&mut self) {
        if self.state.load(Ordering::Acquire) == FULL {
            // SAFETY: FULL means a value was written and never read, and `&mut
            // self` excludes every other access.
            self.value.with_mut(|v| unsafe { (*v).assume_init_drop() });
        }
    }
}

/// No registration or wake in progress, and no waker stored.
const IDLE: u8 = 0;
/// A task is storing its waker.
const REGISTERING: u8 = 1;
/// A wake is taking the waker.
const WAKING: u8 = 2;
/// A waker is stored (and nothing is in progress).
const WAITING: u8 = 4;

/// A waker cell that `register` and `wake` may race on (the `AtomicWaker`
/// protocol): a wake that lands during a registration is handed to the
/// registering task, which wakes itself. A view of a [`Slot`]'s two fields.
struct WakerCell<'a> {
    state: &'a AtomicU8,
    waker: &'a UnsafeCell<Option<Waker>>,
}

impl WakerCell<'_> {
    fn register(&self, waker: &Waker) {
        // Take the cell from IDLE (nothing stored) or WAITING (a waker
        // stored, which is replaced or kept below).
        let mut current = self.state.load(Ordering::Acquire);
        let acquired = loop {
            if current != IDLE && current != WAITING {
                break false;
            }
            match self.state.compare_exchange(
                current,
                REGISTERING,
                Ordering::SeqCst,
                Ordering::Acquire,
            ) {
                Ok(_) => break true,
                Err(actual) => current = actual,
            }
        };
        if acquired {
            // SAFETY: holding REGISTERING excludes other registrations and
            // keeps `wake` from touching the waker (it only sets WAKING).
            self.waker.with_mut(|w| unsafe {
                match &mut *w {
                    Some(old) if old.will_wake(waker) => {}
                    slot => *slot = Some(waker.clone()),
                }
            });
            if self
                .state
                .compare_exchange(REGISTERING, WAITING, Ordering::SeqCst, Ordering::Acquire)
                .is_err()
            {
                // A wake came in meanwhile (state is REGISTERING | WAKING):
                // it left the waker to us. Take it and wake it.
                // SAFETY: the state still has REGISTERING set, so the
                // waker is ours alone until the swap below.
                let woken = self.waker.with_mut(|w| unsafe { (*w).take() });
                self.state.swap(IDLE, Ordering::AcqRel);
                if let Some(w) = woken {
                    w.wake();
                }
            }
        } else {
            // A wake is running: the value (or the close) is there or
            // coming; have the task poll again. Or another task is
            // registering at the same time: one slot has one taker in
            // practice; both are polled again to be safe.
            waker.wake_by_ref();
        }
    }

    /// Wakes the stored waker. The caller published what the task waits
    /// for and then fenced (SeqCst); a registration this first load misses
    /// is fenced after it and finds the publication when its task looks
    /// again. So nothing stored and nothing under way costs one load.
    fn wake(&self) {
        if self.state.load(Ordering::Acquire) == IDLE {
            return;
        }
        let prev = self.state.fetch_or(WAKING, Ordering::SeqCst);
        if prev & (REGISTERING | WAKING) == 0 {
            // SAFETY: moving to WAKING with no registration under way gives
            // this thread the waker until it resets the state; a
            // registration arriving meanwhile fails its CAS and only wakes
            // its own task.
            let woken = self.waker.with_mut(|w| unsafe { (*w).take() });
            self.state.store(IDLE, Ordering::Release);
            if let Some(w) = woken {
                w.wake();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[test]
    fn the_first_send_wins_and_the_value_is_taken_once() {
        let slot = Slot::new();
        assert_eq!(slot.send(1), Ok(()));
        assert_eq!(slot.send(2), Err(2));
        assert!(!slot.close());
        assert_eq!(slot.try_take(), Ok(1));
        assert_eq!(slot.try_take(), Err(TakeError::Closed));
        assert!(slot.is_closed());
    }

    #[test]
    fn a_registered_task_is_woken_by_send_and_by_close() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let slot = Slot::<u8>::new();
        assert!(slot.poll_take(&mut cx).is_pending());
        slot.send(7).unwrap();
        assert_eq!(count.0.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(slot.poll_take(&mut cx), Poll::Ready(Some(7)));

        let closed = Slot::<u8>::new();
        assert!(closed.poll_take(&mut cx).is_pending());
        assert!(closed.close());
        assert_eq!(count.0.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert_eq!(closed.poll_take(&mut cx), Poll::Ready(None));
    }

    #[test]
    fn an_untaken_value_is_dropped_with_the_slot() {
        let value = Arc::new(());
        let slot = Slot::with_value(value.clone());
        assert_eq!(Arc::strong_count(&value), 2);
        drop(slot);
        assert_eq!(Arc::strong_count(&value), 1);
    }

    #[test]
    fn racing_threads_deliver_exactly_once() {
        for _ in 0..2_000 {
            let slot = Arc::new(Slot::new());
            let senders: Vec<_> = (0..2)
                .map(|i| {
                    let slot = slot.clone();
                    std::thread::spawn(move || slot.send(i).is_ok())
                })
                .collect();
            let takers: Vec<_> = (0..2)
                .map(|_| {
                    let slot = slot.clone();
                    std::thread::spawn(move || loop {
                        match slot.try_take() {
                            Ok(v) => return Some(v),
                            Err(TakeError::Closed) => return None,
                            Err(TakeError::Empty) => std::hint::spin_loop(),
                        }
                    })
                })
                .collect();
            let sent = senders
                .into_iter()
                .map(|h| h.join().unwrap())
                .filter(|ok| *ok)
                .count();
            let taken: Vec<_> = takers
                .into_iter()
                .filter_map(|h| h.join().unwrap())
                .collect();
            assert_eq!(sent, 1);
            assert_eq!(taken.len(), 1);
        }
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::atomic::AtomicUsize;
    use loom::sync::Arc;
    use loom::thread;
    use std::task::Wake;

    /// Counts wakes; `Wake` needs std's `Arc`, which is fine for a counter.
    struct Count(std::sync::atomic::AtomicUsize);
    impl Wake for Count {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// A waker that counts its wakes, with its counter.
    fn counting_waker() -> (std::sync::Arc<Count>, Waker) {
        let count = std::sync::Arc::new(Count(std::sync::atomic::AtomicUsize::new(0)));
        (count.clone(), Waker::from(count))
    }

    /// After the sender finished: a poll that returned `Pending` must have
    /// been woken, and the value must be there.
    fn got_it_or_was_woken(polled: Poll<Option<u32>>, count: &Count, slot: &Slot<u32>, sent: u32) {
        match polled {
            Poll::Ready(v) => assert_eq!(v, Some(sent)),
            Poll::Pending => {
                assert!(
                    count.0.load(std::sync::atomic::Ordering::SeqCst) >= 1,
                    "lost wake"
                );
                assert_eq!(slot.try_take(), Ok(sent));
            }
        }
    }

    /// A send racing `poll` (a taking poll of the slot): the poller gets
    /// the value at once, or was registered in time to be woken.
    fn send_racing_a_poll(poll: fn(&Slot<u32>, &mut Context<'_>) -> Poll<Option<u32>>) {
        loom::model(move || {
            let slot = Arc::new(Slot::new());
            let sender = {
                let slot = slot.clone();
                thread::spawn(move || slot.send(5u32).unwrap())
            };
            let (count, waker) = counting_waker();
            let mut cx = Context::from_waker(&waker);
            let first = poll(&slot, &mut cx);
            sender.join().unwrap();
            got_it_or_was_woken(first, &count, &slot, 5);
        });
    }

    #[test]
    fn a_send_racing_a_poll_is_never_lost() {
        send_racing_a_poll(Slot::poll_take);
    }

    /// Through the single-taker poll (a load instead of a compare-exchange
    /// on the taking side).
    #[test]
    fn a_send_racing_a_single_taker_poll_is_never_lost() {
        // SAFETY: the model's main thread is the only taker.
        send_racing_a_poll(|slot, cx| unsafe { slot.poll_take_single(cx) });
    }

    /// A send racing a second registration (the task polled, was not woken
    /// yet, and polls again with the same waker): the wake is never lost.
    #[test]
    fn a_send_racing_a_re_registration_is_never_lost() {
        loom::model(|| {
            let slot = Arc::new(Slot::<u32>::new());
            let (count, waker) = counting_waker();
            let mut cx = Context::from_waker(&waker);
            assert!(slot.poll_take(&mut cx).is_pending());
            let sender = {
                let slot = slot.clone();
                thread::spawn(move || slot.send(9).unwrap())
            };
            let second = slot.poll_take(&mut cx);
            sender.join().unwrap();
            got_it_or_was_woken(second, &count, &slot, 9);
        });
    }

    /// A send racing a registration that replaces a stored waker with a new
    /// one: the new one is woken, or the value is taken at once.
    #[test]
    fn a_send_racing_a_new_wakers_registration_is_never_lost() {
        loom::model(|| {
            let slot = Arc::new(Slot::<u32>::new());
            let (_old, old_waker) = counting_waker();
            // SAFETY: this thread is the only taker.
            let first = unsafe { slot.poll_take_single(&mut Context::from_waker(&old_waker)) };
            assert!(first.is_pending());
            let sender = {
                let slot = slot.clone();
                thread::spawn(move || slot.send(9).unwrap())
            };
            let (new, new_waker) = counting_waker();
            // SAFETY: as above.
            let second = unsafe { slot.poll_take_single(&mut Context::from_waker(&new_waker)) };
            sender.join().unwrap();
            got_it_or_was_woken(second, &new, &slot, 9);
        });
    }

    /// Two senders and a closer race: exactly one of them wins, and a value
    /// is taken only if a send won.
    #[test]
    fn one_of_racing_sends_and_close_wins() {
        loom::model(|| {
            let slot = Arc::new(Slot::new());
            let wins = Arc::new(AtomicUsize::new(0));
            let threads: Vec<_> = (0..2u32)
                .map(|i| {
                    let (slot, wins) = (slot.clone(), wins.clone());
                    thread::spawn(move || {
                        if slot.send(i).is_ok() {
                            wins.fetch_add(1, Ordering::SeqCst);
                        }
                    })
                })
                .collect();
            let closed = slot.close();
            for t in threads {
                t.join().unwrap();
            }
            let sent = wins.load(Ordering::SeqCst);
            assert_eq!(sent + usize::from(closed), 1);
            assert_eq!(slot.try_take().is_ok(), sent == 1);
        });
    }
}
