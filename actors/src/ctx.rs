//! [`Ctx`]: what a handler can do besides changing its actor's state — who
//! am I, stop, timers, watches, children.

use crate::runner::Chain;
use std::cell::Cell;
use std::fmt;
use std::rc::Rc;
use std::time::Duration;

use mailring::{JoinHandle, Placement, ShardId};

use crate::actor::{Accepts, Actor, Continuation, Message};
use crate::addr::{ActorId, Addr};
use crate::error::StopReason;
use crate::local::TypeState;
use crate::mailbox::ActorCell;
use crate::runner::{Frame, ParentLink};
use crate::system::SystemHandle;
use crate::Terminated;

/// The context of a running actor, passed to every handler and hook.
pub struct Ctx<A: Actor> {
    myself: Addr<A>,
    cell: Rc<ActorCell<A>>,
    ts: Rc<TypeState<A>>,
    pub(crate) frame: Rc<Frame>,
    pub(crate) stop_requested: Option<StopReason>,
    /// Bumped when the actor stops or restarts: older timers fall silent.
    timer_epoch: Rc<Cell<u64>>,
    children: Vec<Box<dyn FnOnce()>>,
}

impl<A: Actor> fmt::Debug for Ctx<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ctx")
            .field("actor", &self.myself)
            .finish_non_exhaustive()
    }
}

/// A timer started by [`Ctx::run_later`] or [`Ctx::run_interval`]; timers
/// also end when their actor stops or restarts.
#[derive(Debug)]
pub struct TimerHandle {
    join: JoinHandle<()>,
}

impl TimerHandle {
    /// Cancels the timer (a message already sent stays sent).
    pub fn cancel(self) {
        self.join.abort();
    }
}

impl<A: Actor> Ctx<A> {
    pub(crate) fn new(myself: Addr<A>, cell: Rc<ActorCell<A>>, ts: Rc<TypeState<A>>) -> Self {
        let frame = Rc::new(Frame {
            uid: cell.uid,
            chain: Cell::new(None),
            outgoing: Cell::new(None),
            site: Some(cell.clone()),
        });
        Ctx {
            myself,
            cell,
            ts,
            frame,
            stop_requested: None,
            timer_epoch: Rc::new(Cell::new(0)),
            children: Vec::new(),
        }
    }

    /// This actor's key (`&()` for unkeyed actors).
    pub fn key(&self) -> &A::Key {
        &self.cell.key
    }

    /// This actor's identity.
    pub fn id(&self) -> ActorId {
        ActorId(self.cell.uid)
    }

    /// A reference to this actor.
    pub fn myself(&self) -> Addr<A> {
        self.myself.clone()
    }

    /// The shard this actor runs on.
    pub fn shard(&self) -> ShardId {
        ShardId::new(self.ts.shard)
    }

    /// The actor system.
    pub fn system(&self) -> SystemHandle {
        self.myself.system()
    }

    /// Messages waiting in this actor's mailbox.
    pub fn mailbox_len(&self) -> usize {
        self.cell.len()
    }

    /// Stops this actor once the current handler returns. A keyed actor
    /// passivates (`on_passivate`, `on_stop`) and comes back on its next message.
    pub fn stop(&mut self) {
        self.stop_requested = Some(StopReason::Stopped);
    }

    pub(crate) fn enter_message(&mut self, chain: Option<Chain>) {
        self.frame.chain.set(chain);
        self.frame.outgoing.set(None);
    }

    pub(crate) fn leave_message(&mut self) {
        self.frame.chain.set(None);
        self.frame.outgoing.set(None);
    }

    /// Sends `msg` to this actor after `delay` (the message need not be `Send`).
    pub fn run_later<M>(&mut self, delay: Duration, msg: M) -> TimerHandle
    where
        A: Accepts<M>,
        M: Message,
    {
        let cell = self.cell.clone();
        let epoch = self.timer_epoch.clone();
        let mine = epoch.get();
        let join = mailring::spawn_local(async move {
            mailring::time::sleep(delay).await;
            if epoch.get() == mine {
                let _ = cell.push(A::envelope(msg));
            }
        });
        TimerHandle { join }
    }

    /// Sends `make()` to this actor every `period`, starting one period from now.
    pub fn run_interval<M, F>(&mut self, period: Duration, mut make: F) -> TimerHandle
    where
        A: Accepts<M>,
        M: Message,
        F: FnMut() -> M + 'static,
    {
        let cell = self.cell.clone();
        let epoch = self.timer_epoch.clone();
        let mine = epoch.get();
        let join = mailring::spawn_local(async move {
            // A period too long for an `Instant` (`Duration::MAX`) never ticks.
            let Some(first) = mailring::time::now().checked_add(period) else {
                return;
            };
            let mut ticks = mailring::time::interval_at(first, period);
            loop {
                ticks.tick().await;
                if epoch.get() != mine || cell.push(A::envelope(make())).is_err() {
                    return;
                }
            }
        });
        TimerHandle { join }
    }

    pub(crate) fn cancel_timers(&mut self) {
        self.timer_epoch.set(self.timer_epoch.get() + 1);
    }

    /// Waits for `future` without holding up the actor: other messages are
    /// handled meanwhile, and once `future` is ready, `then` runs on the actor
    /// (with `&mut self`) in its turn, like a message. This is the opt-in way
    /// for a handler to await something slow (I/O, an ask to an actor that may
    /// ask back) and let messages interleave. `future` runs on this shard and
    /// need not be `Send`; its output must be. Dropped if the actor stops or
    /// restarts first.
    ///
    /// ```ignore
    /// impl Handler<Refresh> for Cache {
    ///     async fn handle(&mut self, m: Refresh, cx: &mut Ctx<Self>) {
    ///         let source = self.source.clone();
    ///         cx.wait_for(async move { source.ask(Load(m.key)).await }, |this, loaded, _cx| {
    ///             if let Ok(v) = loaded { this.entries.insert(m.key, v); }
    ///         });
    ///     }
    /// }
    /// ```
    pub fn wait_for<F, T>(
        &mut self,
        future: F,
        then: impl FnOnce(&mut A, T, &mut Ctx<A>) + Send + 'static,
    ) where
        F: std::future::Future<Output = T> + 'static,
        T: Send + 'static,
    {
        let cell = self.cell.clone();
        let epoch = self.timer_epoch.clone();
        let mine = epoch.get();
        mailring::spawn_local(async move {
            let out = future.await;
            if epoch.get() == mine {
                let resume =
                    Continuation::new(move |actor: &mut A, cx: &mut Ctx<A>| then(actor, out, cx));
                let _ = cell.push(A::__continuation(resume));
            }
        })
        .detach();
    }

    /// Delivers a [`Terminated`] message to this actor when `target` stops
    /// (at once if it is not running; for a keyed target, when its current
    /// activation ends).
    pub fn watch<B: Actor>(&mut self, target: &Addr<B>)
    where
        A: Accepts<Terminated>,
        A::Envelope: Send,
        B::Envelope: Send,
    {
        let me = self.myself.clone();
        target.watch_with(Box::new(move |t| {
            let _ = me.tell(t);
        }));
    }

    /// Spawns an unkeyed child actor: it stops when this actor stops or
    /// restarts, and with `supervision = "escalate"` its panics fail this actor.
    pub fn spawn_child<B, F>(&mut self, placement: Placement, factory: F) -> Addr<B>
    where
        B: Actor<Key = ()>,
        B::Envelope: Send,
        A::Envelope: Send,
        F: FnMut() -> B + Send + 'static,
    {
        let link = ParentLink::new(&self.myself);
        let child =
            crate::runner::spawn_unkeyed(self.myself.system.arc(), placement, factory, Some(link));
        let stop = child.clone();
        self.children.push(Box::new(move || {
            crate::local::send_delivery(
                stop.system.arc(),
                stop.home(),
                stop.target_id(),
                crate::local::Delivery::Stop(StopReason::ParentStopped),
            )
        }));
        child
    }

    pub(crate) fn stop_children(&mut self) {
        for stop in self.children.drain(..) {
            stop();
        }
    }
}
