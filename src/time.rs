//! Time: `sleep`, `sleep_until`, `timeout`, `interval` and the resettable [`Sleep`].
//!
//! Timers polled on a shard live in that shard's timer queue
//! (`queue::TimerQueue`); creating, resetting and dropping one never makes a
//! syscall. When the shard parks, the driver keeps one `IORING_OP_TIMEOUT`
//! armed for the nearest deadline.
//!
//! Timers polled anywhere else (a thread outside the runtime, a `futures`
//! executor, a Tokio task) register with the process's off-shard timer
//! thread (`offshard`), which wakes them at their deadlines on the real
//! clock. A `Sleep` registers wherever it is polled: moved to another shard,
//! or off the shards, it registers there and cancels its old entry.
//!
//! Cancelling (a drop, a move, an earlier deadline) is immediate on the
//! shard that owns the entry and with the timer thread. An entry in another
//! shard's wheel (a `Sleep` dropped or polled on another thread than the one
//! that registered it) is removed by that shard: the removal is sent to it
//! as a closure, found by the runtime id in the registration, so the entry
//! and the waker it holds go in that shard's next tick, not at the deadline.
//! That path takes a lock and allocates; the shard's own path does neither.

mod offshard;
pub(crate) mod queue;

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use self::queue::TimerKey;
use crate::runtime::Shared;
use crate::shard::{with_current, InboxItem, Shard};

/// The error of [`timeout`]: the deadline passed first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("deadline elapsed")]
pub struct Elapsed(());

/// Waits until `duration` has passed. A duration too long for an `Instant`
/// (`Duration::MAX`) waits about thirty years: in effect, forever.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, Instant};
/// let rt = mailring::Runtime::builder().shards(1).build()?;
/// let waited = rt.block_on(async {
///     let start = Instant::now();
///     mailring::time::sleep(Duration::from_millis(5)).await;
///     start.elapsed()
/// });
/// assert!(waited >= Duration::from_millis(5));
/// # Ok::<(), mailring::BuildError>(())
/// ```
pub fn sleep(duration: Duration) -> Sleep {
    sleep_until(deadline_in(duration))
}

/// About thirty years: where a deadline too far for an `Instant` saturates.
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

/// `at + duration`, or a far-future instant when that overflows an `Instant`
/// (`Duration::MAX` means "never", not a panic).
pub(crate) fn after(at: Instant, duration: Duration) -> Instant {
    at.checked_add(duration)
        .or_else(|| at.checked_add(FAR_FUTURE))
        .unwrap_or(at)
}

/// The deadline `duration` from now on the runtime clock ([`now`]),
/// saturating far in the future: `Duration::MAX` means "never", not an
/// overflow panic. What [`sleep`] waits for; use it for deadlines you keep
/// and [`Sleep::reset`].
pub fn deadline_in(duration: Duration) -> Instant {
    after(now(), duration)
}

/// The current shard's runtime clock: the real monotonic clock, plus whatever
/// a test added with [`crate::Handle::advance_clock`]. Off a shard, the real
/// clock. Deadlines given to this module are on this clock.
pub fn now() -> Instant {
    with_current(|shard| shard.shared.now()).unwrap_or_else(Instant::now)
}

/// Waits until `deadline`.
pub fn sleep_until(deadline: Instant) -> Sleep {
    Sleep {
        deadline,
        registration: None,
    }
}

/// Runs `future`, giving up when `duration` passes first (a duration too long
/// for an `Instant`, such as `Duration::MAX`, saturates as in [`sleep`]).
/// The duration counts from this call, as [`sleep`]'s does, not from the
/// first poll.
///
/// # Errors
///
/// [`Elapsed`] when the deadline passed before the future finished; the future is dropped.
pub fn timeout<F: Future>(
    duration: Duration,
    future: F,
) -> impl Future<Output = Result<F::Output, Elapsed>> {
    timeout_at(after(now(), duration), future)
}

/// Runs `future`, giving up at `deadline`.
///
/// # Errors
///
/// [`Elapsed`] when the deadline passed before the future finished.
pub async fn timeout_at<F: Future>(deadline: Instant, future: F) -> Result<F::Output, Elapsed> {
    let mut future = pin!(future);
    let mut sleep = sleep_until(deadline);
    poll_fn(|cx| {
        if let Poll::Ready(v) = future.as_mut().poll(cx) {
            return Poll::Ready(Ok(v));
        }
        match Pin::new(&mut sleep).poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(Elapsed(()))),
            Poll::Pending => Poll::Pending,
        }
    })
    .await
}

/// A ticker: the first tick completes at once, then one every `period`.
///
/// Missed ticks (a shard held up for several periods) fire back to back
/// until the schedule has caught up, unless
/// [`Interval::set_missed_tick_behavior`] says otherwise.
///
/// # Panics
///
/// When `period` is zero.
pub fn interval(period: Duration) -> Interval {
    interval_at(now(), period)
}

/// A ticker whose first tick is at `start`.
///
/// # Panics
///
/// When `period` is zero.
pub fn interval_at(start: Instant, period: Duration) -> Interval {
    assert!(!period.is_zero(), "interval period must be non-zero");
    Interval {
        sleep: sleep_until(start),
        period,
        missed: MissedTickBehavior::Burst,
    }
}

/// How late a tick may be polled and not count as late for
/// [`MissedTickBehavior::Delay`] (at most half a period).
const DELAY_SLACK: Duration = Duration::from_millis(5);

/// What an [`Interval`] does after ticks it missed (its shard held up for
/// longer than a period: a long handler, a paused process). The late tick
/// itself completes at once in every case; they differ in when the next
/// one is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MissedTickBehavior {
    /// The missed ticks fire back to back until the schedule has caught
    /// up (the default): as many ticks as periods passed, some late.
    #[default]
    Burst,
    /// The schedule starts again a period after a late tick (one polled
    /// more than the lesser of 5 ms and half a period after its time):
    /// ticks are never closer than a period less that slack, and the
    /// missed ones are lost.
    Delay,
    /// The next tick is the first of the original schedule still to
    /// come: the schedule keeps its phase, and the missed ones are lost.
    Skip,
}

/// Where a `Sleep` is registered.
#[derive(Debug, Clone, Copy)]
enum Registration {
    /// In the wheel of the shard named `owner` (as [`Shard::timer_owner`]).
    Shard { owner: u64, timer: TimerKey },
    /// With the off-shard timer thread.
    Thread(offshard::Key),
}

/// A future that completes at a deadline; see [`sleep`].
///
/// It can be polled on any thread: on a shard it registers in the shard's
/// timer wheel, elsewhere with the off-shard timer thread (see the module
/// docs). It can be moved to a new deadline with [`Sleep::reset`] without
/// allocating or making a syscall.
///
/// # Panics
///
/// Polling it off the shards for the first time in the process starts the
/// timer thread, and panics if that thread cannot be spawned.
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct Sleep {
    deadline: Instant,
    registration: Option<Registration>,
}

impl Sleep {
    /// The instant this sleep completes at.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Whether the deadline has passed.
    pub fn is_elapsed(&self) -> bool {
        now() >= self.deadline
    }

    /// Moves the deadline (earlier or later), even after the sleep completed.
    ///
    /// Moving it later touches nothing but this value: the shard's timer stays
    /// at the old deadline, where it wakes the task once and the sleep, polled,
    /// registers again for the new one. So a timeout pushed back on every
    /// message costs one wake per period, not timer work per message. Moving it
    /// earlier moves the shard's timer (or the off-shard timer thread's entry)
    /// at once.
    pub fn reset(&mut self, deadline: Instant) {
        let previous = std::mem::replace(&mut self.deadline, deadline);
        if deadline >= previous {
            return;
        }
        match self.registration {
            Some(Registration::Shard { owner, timer }) => {
                let moved = with_current(|shard| {
                    (shard.timer_owner() == owner)
                        .then(|| shard.timers_mut().reset(timer, deadline))
                });
                match moved {
                    // Fired already: the next poll registers again.
                    Some(Some(false)) => self.registration = None,
                    Some(Some(true)) => {}
                    // Registered on a shard this thread is not: the move
                    // travels there (the entry keeps its waker, which then
                    // fires at the new deadline).
                    _ => send_reset_home(owner, timer, deadline),
                }
            }
            Some(Registration::Thread(key)) => {
                self.registration = offshard::reset(key, deadline).map(Registration::Thread);
            }
            None => {}
        }
    }

    fn deregister(&mut self) {
        let Some(reg) = self.registration.take() else {
            return;
        };
        if let Registration::Shard { owner, timer } = reg {
            let removed = with_current(|shard| {
                let here = shard.timer_owner() == owner;
                if here {
                    shard.timers_mut().remove(timer);
                }
                here
            });
            if removed == Some(true) {
                return;
            }
        }
        reg.cancel_elsewhere();
    }

    /// Polls on `shard`'s wheel.
    fn poll_on(&mut self, shard: &Shard, cx: &mut Context<'_>) -> Poll<()> {
        // The loop's cached clock: a deadline it has not seen pass yet is
        // registered and fires at the next tick, without a clock read here.
        if shard.cached_now() >= self.deadline {
            match self.registration.take() {
                Some(Registration::Shard { owner, timer }) if owner == shard.timer_owner() => {
                    shard.timers_mut().remove(timer);
                }
                Some(other) => other.cancel_elsewhere(),
                None => {}
            }
            return Poll::Ready(());
        }
        let mut timers = shard.timers_mut();
        let old = match self.registration {
            Some(Registration::Shard { owner, timer })
                if owner == shard.timer_owner() && timers.set_waker(timer, cx.waker()) =>
            {
                return Poll::Pending;
            }
            // Here but fired: nothing to cancel.
            Some(Registration::Shard { owner, .. }) if owner == shard.timer_owner() => None,
            old => old,
        };
        let timer = timers.insert(self.deadline, cx.waker().clone());
        drop(timers);
        self.registration = Some(Registration::Shard {
            owner: shard.timer_owner(),
            timer,
        });
        if let Some(old) = old {
            old.cancel_elsewhere();
        }
        Poll::Pending
    }

    /// Polls with the off-shard timer thread.
    fn poll_off_shard(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.deadline {
            self.deregister();
            return Poll::Ready(());
        }
        if let Some(Registration::Thread(key)) = self.registration {
            if offshard::set_waker(key, cx.waker()) {
                return Poll::Pending;
            }
        }
        let key = offshard::insert(self.deadline, cx.waker().clone());
        if let Some(old) = self.registration.replace(Registration::Thread(key)) {
            old.cancel_elsewhere();
        }
        Poll::Pending
    }
}

impl Registration {
    /// Cancels a registration that is not in the calling shard's wheel.
    fn cancel_elsewhere(self) {
        match self {
            Registration::Thread(key) => offshard::remove(key),
            Registration::Shard { owner, timer } => send_removal_home(owner, timer),
        }
    }
}

/// Removes `timer` from the wheel of the shard named `owner`, from a thread
/// that is not that shard: only the shard's own thread touches its wheel, so
/// the removal travels to it as a closure (in its next tick), and the entry
/// and its waker are released there, long before the deadline. A runtime
/// that is gone or shutting down is left alone: its wheel, entry and waker
/// included, is dropped with its shard. The key's generation makes a
/// removal that arrives after the entry fired (and was reused) a no-op.
#[cold]
fn send_removal_home(owner: u64, timer: TimerKey) {
    on_owner_wheel(owner, move |timers| timers.remove(timer));
}

/// Moves `timer` to `deadline` on the wheel of the shard named `owner`,
/// from a thread that is not that shard (as [`send_removal_home`] removes
/// one): a sleep made earlier elsewhere still wakes its task at the new
/// deadline. One that fired meanwhile is left alone (the key's generation).
#[cold]
fn send_reset_home(owner: u64, timer: TimerKey, deadline: Instant) {
    on_owner_wheel(owner, move |timers| {
        let _ = timers.reset(timer, deadline);
    });
}

/// Runs `change` on the wheel of the shard named `owner`, in its next tick
/// (nothing when its runtime is gone or shutting down).
fn on_owner_wheel(owner: u64, change: impl FnOnce(&mut queue::TimerQueue) + Send + 'static) {
    let Some(shared) = Shared::find(Shard::runtime_of(owner)) else {
        return;
    };
    if shared.is_shutting_down() {
        return;
    }
    let apply = move || {
        with_current(|shard| {
            if shard.timer_owner() == owner {
                change(&mut shard.timers_mut());
            }
        });
    };
    shared.deliver(Shard::index_of(owner), InboxItem::Call(Box::new(apply)));
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        match with_current(|shard| this.poll_on(shard, cx)) {
            Some(polled) => polled,
            None => this.poll_off_shard(cx),
        }
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        self.deregister();
    }
}

/// A periodic ticker; see [`interval`].
#[derive(Debug)]
pub struct Interval {
    sleep: Sleep,
    period: Duration,
    missed: MissedTickBehavior,
}

impl Interval {
    /// Waits for the next tick and returns its scheduled instant.
    pub async fn tick(&mut self) -> Instant {
        poll_fn(|cx| self.poll_tick(cx)).await
    }

    /// Polls for the next tick.
    pub fn poll_tick(&mut self, cx: &mut Context<'_>) -> Poll<Instant> {
        match Pin::new(&mut self.sleep).poll(cx) {
            Poll::Ready(()) => {
                let at = self.sleep.deadline();
                let on_time = after(at, self.period);
                let next = match self.missed {
                    MissedTickBehavior::Burst => on_time,
                    MissedTickBehavior::Delay => {
                        // Late (past a slack for the shard's own latency:
                        // the lesser of 5 ms and half a period), the next
                        // is a period from now: ticks are not closer than
                        // a period, less that slack.
                        let now = now();
                        let slack = DELAY_SLACK.min(self.period / 2);
                        if now > after(at, slack) {
                            after(now, self.period)
                        } else {
                            on_time
                        }
                    }
                    MissedTickBehavior::Skip => {
                        let now = now();
                        if on_time > now {
                            on_time
                        } else {
                            // The first tick of the schedule after now.
                            let behind = now.duration_since(at).as_nanos();
                            let periods = behind / self.period.as_nanos() + 1;
                            let ahead = self
                                .period
                                .as_nanos()
                                .saturating_mul(periods)
                                .min(u128::from(u64::MAX));
                            after(at, Duration::from_nanos(ahead as u64))
                        }
                    }
                };
                self.sleep.reset(next);
                Poll::Ready(at)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    /// The period between ticks.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// What it does after missed ticks ([`MissedTickBehavior::Burst`]
    /// unless set).
    pub fn missed_tick_behavior(&self) -> MissedTickBehavior {
        self.missed
    }

    /// Sets what it does after missed ticks, from its next tick on.
    pub fn set_missed_tick_behavior(&mut self, behavior: MissedTickBehavior) {
        self.missed = behavior;
    }

    /// Restarts the schedule: the next tick is one period from now.
    pub fn reset(&mut self) {
        self.sleep.reset(after(now(), self.period));
    }
}
