//! The per-shard actor registry: for each actor type, its key → cell table,
//! its unkeyed cells, its outbound batches to other shards and its counters.
//!
//! Everything here lives in a thread-local of the shard thread and is touched
//! by that thread only, so the same-shard path of a `tell` is a table lookup
//! and a `Vec` push with no atomic operation (bounded mailboxes add the
//! shared [`Capacity`] count).
//!
//! Cross-shard path: the sender pushes `(target, envelope)` into the type's
//! outbound batch for the destination; the first push of a tick queues one
//! tick-end callback which hands the whole batch to the runtime as one inbox
//! item, published with the tick's doorbell. The destination shard then
//! delivers the batch in order, so per-sender FIFO holds.

use std::any::Any;
use std::cell::{Cell, OnceCell, RefCell};
use std::collections::HashMap;

use foldhash::fast::RandomState;
use std::rc::Rc;
use std::sync::Arc;

use mailring::ShardId;

use crate::actor::{Actor, ActorPlacement, Continuation};
use crate::capacity::Capacity;
use crate::erased::ErasedRc;
use crate::error::{AskError, StopReason};
use crate::flow::{source_tag, ShardFlow};
use crate::mailbox::ActorCell;
use crate::reply;
use crate::route::Directory;
use crate::stats::ActorTypeStats;
use crate::system::SystemShared;

/// Which actor a delivery is for.
pub(crate) enum TargetId<A: Actor> {
    /// An unkeyed actor, by identity.
    Uid(u64),
    /// A keyed actor, by key (activated on demand).
    Key(A::Key),
}

/// A [`TargetId`] borrowed: what a same-shard send looks up (a keyed
/// `Addr`'s key is not cloned for it).
pub(crate) enum TargetRef<'a, A: Actor> {
    Uid(u64),
    Key(&'a A::Key),
}

impl<A: Actor> TargetId<A> {
    pub(crate) fn as_ref(&self) -> TargetRef<'_, A> {
        match self {
            TargetId::Uid(u) => TargetRef::Uid(*u),
            TargetId::Key(k) => TargetRef::Key(k),
        }
    }
}

impl<A: Actor> PartialEq for TargetId<A> {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (TargetId::Uid(a), TargetId::Uid(b)) => a == b,
            (TargetId::Key(a), TargetId::Key(b)) => a == b,
            _ => false,
        }
    }
}

impl<A: Actor> Clone for TargetId<A> {
    fn clone(&self) -> Self {
        match self {
            TargetId::Uid(u) => TargetId::Uid(*u),
            TargetId::Key(k) => TargetId::Key(k.clone()),
        }
    }
}

/// Per-type counters of one shard.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) handled: Cell<u64>,
    /// Of `handled`: closures run by `run_now`.
    pub(crate) ran_now: Cell<u64>,
    pub(crate) activations: Cell<u64>,
    pub(crate) passivations: Cell<u64>,
    pub(crate) restarts: Cell<u64>,
    pub(crate) panics: Cell<u64>,
    pub(crate) stops: Cell<u64>,
    pub(crate) dead_letters: Cell<u64>,
    pub(crate) high_water: Cell<usize>,
}

/// What travels to an actor: a message, or a control request that must keep
/// its place among the sender's messages.
pub(crate) enum Delivery<A: Actor> {
    Msg(A::Envelope),
    Stop(StopReason),
    Watch(crate::mailbox::Watcher),
    /// Stop once the messages queued now are handled.
    StopGracefully,
    /// Asks whether the actor is running (a keyed one: active), without
    /// activating it.
    Alive(Box<dyn FnOnce(bool) + Send>),
    /// Work run on the destination shard at this place in the sender's
    /// order ([`crate::Addr::run_in_order`]).
    Call(Box<dyn FnOnce() + Send>),
}

/// Messages for one destination shard, in send order: targets and envelopes
/// in two vectors, so that each push writes a pair of words rather than
/// copying a 40-byte tuple through the stack (see [`TypeState::push_outbound`]).
/// Control deliveries (stop, watch) do not join it: they flush it and follow
/// it as their own item, which keeps their place in the order.
pub(crate) struct Outbound<A: Actor> {
    /// The first message of a tick, kept inline: a lone message (an ask, a
    /// ping) travels without allocating the two vectors.
    first: Option<(TargetId<A>, A::Envelope)>,
    targets: Vec<TargetId<A>>,
    envs: Vec<A::Envelope>,
}

impl<A: Actor> Outbound<A> {
    fn new() -> Self {
        Outbound {
            first: None,
            targets: Vec::new(),
            envs: Vec::new(),
        }
    }

    fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.envs.len()
    }
}

/// Deliveries to one shard handed to the runtime at once, at the latest.
const OUTBOUND_BATCH: usize = 256;

/// Deliveries of a received batch looked up before any of them is pushed.
const LOOKAHEAD: usize = 16;

/// Emptied carriers kept per shard and actor type.
const SPARE_CARRIERS: usize = 8;

/// A batch on its way to another shard, in a box that goes back to the
/// shard that sent it.
///
/// A carrier (the box, with the batch's two vectors) is allocated on the
/// sending shard and emptied on the receiving one. Freed there, it would take
/// the sender's allocator lock while the sender allocates (perf showed futex
/// waits in glibc's arena lock from both shards), and every batch would pay
/// the allocator's slow paths on both sides: a block made on one thread and
/// freed on another never comes back through either thread's cache
/// (callgrind of a cross-shard actor ping-pong: ~330 instructions per hop in
/// `malloc` and `free`). Instead the receiver sends the emptied carrier back
/// as a job of its own, in its next batch to the sender (with the replies it
/// is about to publish, so no cache line moves for it alone), and the sender
/// keeps it on its shard-local spare list for its next batch: in steady state
/// no batch allocates, whatever its size, and no lock is taken.
pub(crate) struct Carrier<A: Actor> {
    system_id: u64,
    /// The system, for a shard whose registry is not installed yet (a
    /// system started from a shard sends the installs at its tick's end,
    /// one shard after another: a batch from a shard installed first may
    /// arrive before). Not touched on the way otherwise.
    system: Arc<SystemShared>,
    /// The sending shard, whose spare list the emptied carrier joins.
    from: usize,
    /// On its way back to `from`, empty.
    returning: bool,
    batch: Outbound<A>,
}

impl<A: Actor> mailring::ShardJob for Carrier<A>
where
    A::Envelope: Send,
{
    fn run(mut self: Box<Self>) {
        let found = type_state_by_id::<A>(self.system_id).or_else(|| type_state::<A>(&self.system));
        let Some(ts) = found else {
            let Outbound {
                first,
                targets,
                envs,
            } = std::mem::replace(&mut self.batch, Outbound::new());
            drop(targets);
            reply::drop_each_with_reason(AskError::ShuttingDown, first.map(|(_, env)| env));
            reply::drop_each_with_reason(AskError::ShuttingDown, envs);
            return;
        };
        if self.returning {
            ts.keep_spare(self);
            return;
        }
        deliver_batch(&ts, &mut self.batch, self.from);
        ts.return_carrier(self);
    }
}

/// A keyed cell in its type's LRU heap, with its `last_used` as it was when
/// listed: the heap's top is the entry with the oldest stamp.
struct LruEntry<A: Actor> {
    stamp: u64,
    cell: Rc<ActorCell<A>>,
}

impl<A: Actor> LruEntry<A> {
    fn of(cell: Rc<ActorCell<A>>) -> Self {
        LruEntry {
            stamp: cell.last_used.get(),
            cell,
        }
    }
}

impl<A: Actor> PartialEq for LruEntry<A> {
    fn eq(&self, other: &Self) -> bool {
        self.stamp == other.stamp
    }
}

impl<A: Actor> Eq for LruEntry<A> {}

impl<A: Actor> PartialOrd for LruEntry<A> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl<A: Actor> Ord for LruEntry<A> {
    /// Reversed: the oldest stamp is the greatest, at the top of the heap.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.stamp.cmp(&self.stamp)
    }
}

/// One actor type's state on one shard.
pub(crate) struct TypeState<A: Actor> {
    pub(crate) shard: usize,
    pub(crate) system: Arc<SystemShared>,
    keyed: RefCell<HashMap<A::Key, Rc<ActorCell<A>>, RandomState>>,
    unkeyed: RefCell<HashMap<u64, Rc<ActorCell<A>>, RandomState>>,
    outbound: RefCell<Vec<Outbound<A>>>,
    /// Emptied carriers back from other shards, for this shard's next
    /// batches (see [`Carrier`]).
    spares: RefCell<Vec<Box<Carrier<A>>>>,
    /// Carriers made here so far (only when `spares` is empty).
    carriers_made: Cell<usize>,
    /// Advances on every delivery; cells remember it for LRU passivation.
    clock: Cell<u64>,
    /// A type with `max_active`: its keyed cells by their `last_used` as it
    /// was when each was listed (see [`LruEntry`]).
    lru: RefCell<std::collections::BinaryHeap<LruEntry<A>>>,
    /// Keyed actors asked to passivate by the active limit that have not
    /// ended (nor called their passivation off) yet.
    lru_victims: Cell<usize>,
    pub(crate) counters: Counters,
    /// This shard's credit windows (shared by every type here).
    pub(crate) flow: Rc<ShardFlow>,
    /// The type's directory (a stealable, balanced or first-sender type),
    /// once a send from here needed it.
    directory: OnceCell<Arc<Directory>>,
    /// Shards the directory gave keys routed from here, by route hash (as
    /// the directory keeps them: no copy of a key's bytes): a record never
    /// changes, so senders here look it up without the directory's lock.
    homes: RefCell<HashMap<u64, u32, RandomState>>,
}

impl<A: Actor> TypeState<A> {
    fn new(shard: usize, system: Arc<SystemShared>, flow: Rc<ShardFlow>) -> Self {
        let shards = system.handle.shards();
        TypeState {
            shard,
            system,
            keyed: RefCell::new(HashMap::default()),
            unkeyed: RefCell::new(HashMap::default()),
            outbound: RefCell::new((0..shards).map(|_| Outbound::new()).collect()),
            spares: RefCell::new(Vec::new()),
            carriers_made: Cell::new(0),
            clock: Cell::new(0),
            lru: RefCell::new(std::collections::BinaryHeap::new()),
            lru_victims: Cell::new(0),
            counters: Counters::default(),
            flow,
            directory: OnceCell::new(),
            homes: RefCell::new(HashMap::default()),
        }
    }

    /// Stamps `cell` as just used, for least-recently-used passivation (a
    /// type without `max_active` never reads the stamps: nothing is done).
    #[inline]
    pub(crate) fn touch(&self, cell: &ActorCell<A>) {
        if A::CONFIG.max_active_per_shard.is_none() {
            return;
        }
        let t = self.clock.get().wrapping_add(1);
        self.clock.set(t);
        cell.last_used.set(t);
    }

    /// The live cell for `target`, activating a keyed actor when needed.
    #[inline]
    pub(crate) fn resolve(
        self: &Rc<Self>,
        target: &TargetId<A>,
    ) -> Result<Rc<ActorCell<A>>, AskError> {
        match target {
            TargetId::Uid(uid) => self
                .unkeyed
                .borrow()
                .get(uid)
                .filter(|c| c.is_open())
                .cloned()
                .ok_or(AskError::Stopped),
            TargetId::Key(key) => {
                let found = self
                    .keyed
                    .borrow()
                    .get(key)
                    .filter(|c| c.is_open())
                    .cloned();
                match found {
                    Some(c) => Ok(c),
                    None => self.activate(key.clone()),
                }
            }
        }
    }

    /// Delivers on this shard; an envelope that cannot be delivered is dropped
    /// (its ask fails with the reason) and counted as a dead letter.
    pub(crate) fn deliver(
        self: &Rc<Self>,
        target: &TargetId<A>,
        env: A::Envelope,
    ) -> Result<(), (AskError, A::Envelope)> {
        self.push_with(target.as_ref(), env, |env| env)
    }

    /// Wraps `payload` and pushes it to `target`'s live cell, activating a
    /// keyed actor when needed. A live cell is used in place, through the
    /// table's reference (no count taken: a send to a cold actor touches
    /// only the cell's first line). The payload comes back, unwrapped, when
    /// there is no live cell and none can be activated.
    #[inline]
    pub(crate) fn push_with<P>(
        self: &Rc<Self>,
        target: TargetRef<'_, A>,
        payload: P,
        wrap: impl FnOnce(P) -> A::Envelope,
    ) -> Result<(), (AskError, P)> {
        // The table's borrow ends with this statement, before any activation
        // and before a refused envelope is dropped (its `Drop` is user code,
        // which may send to an actor of this type that must be activated).
        let missed = match target {
            TargetRef::Uid(uid) => push_live(self, self.unkeyed.borrow().get(&uid), payload, wrap),
            TargetRef::Key(key) => push_live(self, self.keyed.borrow().get(key), payload, wrap),
        };
        let (payload, wrap) = match missed {
            Ok(()) => return Ok(()),
            Err(Missed::Refused(why, env)) => {
                self.dead_letter(why, env);
                return Ok(());
            }
            Err(Missed::NoCell(payload, wrap)) => (payload, wrap),
        };
        match target {
            TargetRef::Uid(_) => Err((AskError::Stopped, payload)),
            TargetRef::Key(key) => match self.activate(key.clone()) {
                Ok(cell) => {
                    self.push_resolved(&cell, wrap(payload));
                    Ok(())
                }
                Err(e) => Err((e, payload)),
            },
        }
    }

    /// Pushes `env` on a resolved cell (marking it used for LRU); a cell that
    /// closed meanwhile makes it a dead letter.
    #[inline]
    fn push_resolved(&self, cell: &ActorCell<A>, env: A::Envelope) {
        if let Err((why, env)) = self.push_or_free(cell, env) {
            self.dead_letter(why, env);
        }
    }

    /// Marks `cell` used and pushes `env`; a cell that closed meanwhile, or
    /// an ask its blocked actor refuses (an ask cycle, see `cycle`), frees
    /// the message's place and gives it back with the reason.
    #[inline(always)]
    fn push_or_free(
        &self,
        cell: &ActorCell<A>,
        env: A::Envelope,
    ) -> Result<(), (AskError, A::Envelope)> {
        self.touch(cell);
        cell.push(env).inspect_err(|_| cell.free_place())
    }

    /// [`TypeState::push_resolved`] for a message in a batch from shard
    /// `source`; whether it was queued. The caller counts it in the cell's
    /// [`RemoteCounts`](crate::flow::RemoteCounts) (its credit goes back
    /// when the actor takes it); a dead letter's goes back now.
    #[inline(always)]
    fn push_remote(&self, cell: &ActorCell<A>, env: A::Envelope, source: usize) -> bool {
        match self.push_or_free(cell, env) {
            Ok(()) => true,
            Err((why, env)) => {
                self.dead_letter_from(source, why, env);
                false
            }
        }
    }

    /// A dead letter from a batch of shard `source`: its credit goes back.
    #[cold]
    fn dead_letter_from(&self, source: usize, reason: AskError, env: A::Envelope) {
        self.flow.taken(source, 1);
        self.dead_letter(reason, env);
    }

    /// Delivers a message in a batch from shard `source`, activating a
    /// keyed actor when needed (see [`TypeState::push_remote`]).
    fn deliver_remote(self: &Rc<Self>, target: &TargetId<A>, env: A::Envelope, source: usize) {
        match self.resolve(target) {
            Ok(cell) => {
                if self.push_remote(&cell, env, source) {
                    cell.remote.add(source_tag(source), 1);
                }
            }
            Err(reason) => {
                self.free_place_of(target);
                self.dead_letter_from(source, reason, env);
            }
        }
    }

    pub(crate) fn deliver_or_drop(self: &Rc<Self>, target: &TargetId<A>, env: A::Envelope) {
        if let Err((reason, env)) = self.deliver(target, env) {
            self.free_place_of(target);
            self.dead_letter(reason, env);
        }
    }

    /// Frees the bounded-mailbox place a message to `target` held, when it
    /// found no actor. A keyed actor's count outlives its activations, so
    /// the place must go back; an unkeyed actor that is gone never takes a
    /// message again, and its count goes with its references.
    #[cold]
    fn free_place_of(&self, target: &TargetId<A>) {
        if let (Some(_), TargetId::Key(key)) = (A::CONFIG.mailbox, target) {
            if let Some(c) = self.system.existing_keyed_capacity::<A>(key) {
                c.release(1);
            }
        }
    }

    /// Counts an envelope no live actor took and drops it, failing its ask
    /// with `reason`.
    fn dead_letter(&self, reason: AskError, env: A::Envelope) {
        self.counters
            .dead_letters
            .set(self.counters.dead_letters.get() + 1);
        reply::drop_with_reason(reason, env);
    }

    fn activate(self: &Rc<Self>, key: A::Key) -> Result<Rc<ActorCell<A>>, AskError> {
        if self.system.is_shutting_down() {
            return Err(AskError::ShuttingDown);
        }
        // The table, the cell and the actor keep this copy for the
        // activation's life, not the sender's (a slice of a frame).
        let key = mailring::RouteKey::detached(&key);
        let factory = self.system.factory::<A>();
        let make: Box<dyn FnMut() -> Option<A>> = match factory {
            Some(f) => {
                let key = key.clone();
                Box::new(move || Some(f(&key)))
            }
            None if A::HAS_ACTIVATE => {
                let key = key.clone();
                Box::new(move || A::activate(&key))
            }
            None => return Err(AskError::NoFactory),
        };
        // The count its senders' references hold: places taken through any
        // reference are freed by this activation's takes.
        let capacity = A::CONFIG
            .mailbox
            .map(|cap| self.system.keyed_capacity::<A>(&key, cap));
        let uid = crate::route::keyed_uid::<A, _>(&key);
        let cell = ActorCell::new(uid, key.clone(), capacity);
        self.keyed.borrow_mut().insert(key, cell.clone());
        self.counters
            .activations
            .set(self.counters.activations.get() + 1);
        self.enforce_active_limit(&cell);
        crate::runner::start(self.clone(), cell.clone(), make, None);
        Ok(cell)
    }

    /// Passivates the least recently used keyed actor when over the limit.
    ///
    /// Active are the keyed actors of this shard but those the limit asked
    /// to passivate that have not ended yet (one that stops for another
    /// reason counts until it ends). The least recently used is found in
    /// the type's LRU heap, without a walk of every actor: its entries
    /// carry each cell's `last_used` as it was when listed, never more
    /// than it is now, so an entry found current at the top is the least
    /// recently used of all; one found stale goes back with the cell's
    /// stamp of now, one of a cell that ended is dropped, and one of a cell
    /// on its way out goes back after the search under the clock of now.
    fn enforce_active_limit(&self, newest: &Rc<ActorCell<A>>) {
        let Some(max) = A::CONFIG.max_active_per_shard else {
            return;
        };
        let keyed = self.keyed.borrow();
        let mut lru = self.lru.borrow_mut();
        // Entries of cells that ended are dropped when they come to the
        // top; rebuilt whole when they outnumber the live ones.
        if lru.len() > 2 * keyed.len() + 16 {
            *lru = keyed
                .values()
                .filter(|c| !Rc::ptr_eq(c, newest))
                .map(|c| LruEntry::of(c.clone()))
                .collect();
        }
        let active = keyed.len().saturating_sub(self.lru_victims.get());
        let mut victim = None;
        if active > max {
            // Cells on their way out (the victim too, from now on) go to
            // the heap's far end, under the clock of now: the next searches
            // find the least recently used staying cells first, not the
            // same leaving ones again. A cell that stays after all (its
            // passivation called off by new mail, a restart) was just
            // used: near the end is about where it belongs, and its entry,
            // stale at the top one day, goes back under its own stamp.
            let mut leaving = Vec::new();
            while let Some(entry) = lru.pop() {
                let cell = entry.cell;
                if !keyed.get(&cell.key).is_some_and(|c| Rc::ptr_eq(c, &cell)) {
                    continue; // Ended: forgotten.
                }
                // Not those asked to go, nor those going already (their
                // request was taken: they are in `on_passivate` or `on_stop`).
                let staying =
                    cell.is_open() && cell.stop_request.get().is_none() && !cell.leaving.get();
                if !staying || Rc::ptr_eq(&cell, newest) {
                    leaving.push(cell);
                    continue;
                }
                if entry.stamp != cell.last_used.get() {
                    lru.push(LruEntry::of(cell));
                    continue;
                }
                victim = Some(cell);
                break;
            }
            let now = self.clock.get();
            lru.extend(
                leaving
                    .into_iter()
                    .chain(victim.clone())
                    .map(|cell| LruEntry { stamp: now, cell }),
            );
        }
        lru.push(LruEntry::of(newest.clone()));
        drop(lru);
        drop(keyed);
        if let Some(v) = victim {
            v.lru_victim.set(true);
            self.lru_victims.set(self.lru_victims.get() + 1);
            v.stop_request.set(Some(StopReason::Passivated));
            v.nudge();
        }
    }

    /// Rebuilds the LRU heap from the live cells once entries of cells
    /// that ended outnumber them: they hold those cells (their keys, their
    /// mailbox counts) until then, also after the type's traffic stopped.
    fn prune_lru(&self) {
        if A::CONFIG.max_active_per_shard.is_none() {
            return;
        }
        let old = {
            let (Ok(keyed), Ok(mut lru)) = (self.keyed.try_borrow(), self.lru.try_borrow_mut())
            else {
                return;
            };
            if lru.len() <= 2 * keyed.len() + 16 {
                return;
            }
            let live = keyed.values().map(|c| LruEntry::of(c.clone())).collect();
            std::mem::replace(&mut *lru, live)
        };
        // Dropped with the tables released.
        drop(old);
    }

    /// `cell`, asked to passivate by the active limit, ended or called its
    /// passivation off: it is no longer on its way out for the limit.
    pub(crate) fn lru_victim_done(&self, cell: &ActorCell<A>) {
        if cell.lru_victim.replace(false) {
            self.lru_victims.set(self.lru_victims.get() - 1);
        }
    }

    /// Registers a new unkeyed actor and starts it.
    pub(crate) fn spawn_unkeyed(
        self: &Rc<Self>,
        uid: u64,
        make: Box<dyn FnMut() -> Option<A>>,
        capacity: Option<Arc<Capacity>>,
        parent: Option<crate::runner::ParentLink>,
    ) {
        let cell = ActorCell::new(uid, unkeyed_key::<A>(), capacity);
        self.unkeyed.borrow_mut().insert(uid, cell.clone());
        self.counters
            .activations
            .set(self.counters.activations.get() + 1);
        crate::runner::start(self.clone(), cell, make, parent);
    }

    /// Forgets `cell` (its task is finishing); a newer activation of the same
    /// key stays.
    pub(crate) fn remove(&self, cell: &Rc<ActorCell<A>>) {
        self.lru_victim_done(cell);
        if cell.uid >> 63 == 1 {
            self.unkeyed.borrow_mut().remove(&cell.uid);
        } else {
            let mut keyed = self.keyed.borrow_mut();
            if keyed.get(&cell.key).is_some_and(|c| Rc::ptr_eq(c, cell)) {
                keyed.remove(&cell.key);
            }
        }
        let hw = cell.high_water.get();
        if hw > self.counters.high_water.get() {
            self.counters.high_water.set(hw);
        }
        self.prune_lru();
    }

    /// Queues a control delivery (stop, watch) for `dest` after every message
    /// this shard queued there before.
    pub(crate) fn push_control(self: &Rc<Self>, dest: usize, target: TargetId<A>, item: Delivery<A>)
    where
        A::Envelope: Send,
    {
        self.flush_outbound(dest);
        let system = self.system.clone();
        self.system.handle.run_on(ShardId::new(dest), move || {
            // (A system started from a shard may reach a shard before its
            // registry's install does: it is made here then.)
            match type_state::<A>(&system) {
                Some(ts) => ts.apply(&target, item),
                None => reply::drop_with_reason(AskError::ShuttingDown, item),
            }
        });
    }

    /// Queues a message for `dest`, flushing the batch at the end of this tick.
    ///
    /// The envelope is built (`env`) only once its place is reserved: built
    /// earlier and moved in, it was spilled to the stack in narrow stores and
    /// copied back with wide loads, which stall on store forwarding (measured:
    /// most of a cross-shard tell's producer time).
    #[inline]
    pub(crate) fn push_outbound(
        self: &Rc<Self>,
        dest: usize,
        target: TargetId<A>,
        env: impl FnOnce() -> A::Envelope,
    ) where
        A::Envelope: Send,
    {
        self.flow.sent(dest);
        let len = {
            let mut out = self.outbound.borrow_mut();
            let batch = &mut out[dest];
            if batch.first.is_none() {
                batch.first = Some((target, env()));
                1
            } else {
                if batch.envs.len() == batch.envs.capacity() {
                    self.grow_batch(batch);
                }
                batch.targets.push(target);
                batch.envs.push(env());
                batch.envs.len() + 1
            }
        };
        if len == OUTBOUND_BATCH {
            // A long burst: hand this part to the runtime's batch for `dest`
            // (a callback is still queued for the rest) and publish it.
            self.flush_outbound(dest);
            mailring::publish_now();
        } else if len == 1 {
            // A sleeping destination starts waking while this tick goes on.
            mailring::prewake(ShardId::new(dest));
            let hook: Rc<dyn mailring::TickEndHook> = self.clone();
            let queued = mailring::defer_hook_to_tick_end(hook, dest);
            debug_assert!(queued.is_ok(), "push_outbound runs on a shard");
        }
    }

    /// Gives a batch's vectors room. In steady state this runs only for a
    /// batch that outgrew its vectors: a flush leaves the batch the emptied
    /// vectors of a returned carrier.
    #[cold]
    fn grow_batch(&self, batch: &mut Outbound<A>) {
        batch.envs.reserve(OUTBOUND_BATCH);
        batch.targets.reserve(OUTBOUND_BATCH);
    }

    /// Sends a delivered batch's emptied carrier back to the shard that
    /// sent it (in this shard's next batch there).
    fn return_carrier(&self, mut carrier: Box<Carrier<A>>)
    where
        A::Envelope: Send,
    {
        debug_assert!(carrier.batch.len() == 0);
        carrier.returning = true;
        let from = carrier.from;
        self.system.handle.send_job(ShardId::new(from), carrier);
    }

    /// Keeps a carrier that came back, for this shard's next batches.
    fn keep_spare(&self, mut carrier: Box<Carrier<A>>) {
        let mut spares = self.spares.borrow_mut();
        if spares.len() < SPARE_CARRIERS {
            carrier.returning = false;
            spares.push(carrier);
        }
    }

    /// Hands the batch for `dest` to the runtime in a carrier from this
    /// shard's spare list (or a new one); the batch keeps the carrier's
    /// emptied vectors for its next messages.
    fn flush_outbound(&self, dest: usize)
    where
        A::Envelope: Send,
    {
        if self.outbound.borrow()[dest].len() == 0 {
            return;
        }
        let spare = self.spares.borrow_mut().pop();
        let mut carrier = spare.unwrap_or_else(|| {
            self.carriers_made.set(self.carriers_made.get() + 1);
            // The receiver finds its own registry by the system's id: no
            // shared reference count bounces between shards per batch (the
            // carrier's reference to the system is taken once, when it is
            // made, and read only where no registry is installed yet).
            Box::new(Carrier {
                system_id: self.system.id,
                system: self.system.clone(),
                from: self.shard,
                returning: false,
                batch: Outbound::new(),
            })
        });
        std::mem::swap(&mut self.outbound.borrow_mut()[dest], &mut carrier.batch);
        self.system.handle.send_job(ShardId::new(dest), carrier);
    }

    /// Requests every actor of this type on this shard to stop.
    fn stop_all(&self, reason: StopReason) -> usize {
        let cells: Vec<Rc<ActorCell<A>>> = self
            .keyed
            .borrow()
            .values()
            .chain(self.unkeyed.borrow().values())
            .cloned()
            .collect();
        for c in &cells {
            c.request_stop(reason);
            c.nudge();
        }
        cells.len()
    }

    pub(crate) fn find_unkeyed(&self, uid: u64) -> Option<Rc<ActorCell<A>>> {
        self.unkeyed.borrow().get(&uid).cloned()
    }

    pub(crate) fn find_keyed(&self, key: &A::Key) -> Option<Rc<ActorCell<A>>> {
        self.keyed.borrow().get(key).cloned()
    }

    /// `f` on the keyed actor `key` of this table when it is idle (see
    /// `SystemHandle::run_now_keyed`; the caller took the deliveries
    /// published to this shard first). Activated only on delivery at its
    /// home shard, an actor in this shard's table lives here.
    pub(crate) fn run_now_keyed<R, F: FnOnce(&mut A) -> R>(
        &self,
        key: &A::Key,
        f: F,
    ) -> Result<R, crate::error::RunNowError<F>> {
        match self.find_keyed(key) {
            Some(cell) => cell.run_now(self, f),
            None => Err(crate::error::RunNowError::NotIdle(f)),
        }
    }
}

/// The tick-end flush of this type's batch for one destination shard,
/// queued by the batch's first message of a tick.
impl<A: Actor> mailring::TickEndHook for TypeState<A>
where
    A::Envelope: Send,
{
    fn at_tick_end(&self, dest: usize) {
        self.flush_outbound(dest);
    }
}

/// The key of unkeyed actors (`()`); any other key type never reaches here
/// since unkeyed actors have `Key = ()`.
fn unkeyed_key<A: Actor>() -> A::Key {
    let unit: Box<dyn Any> = Box::new(());
    match unit.downcast::<A::Key>() {
        Ok(k) => *k,
        Err(_) => panic!(
            "{} is keyed: use ActorSystem::keyed, not spawn_actor",
            std::any::type_name::<A>()
        ),
    }
}

/// Delivers a batch of messages from another shard, in order, leaving it
/// empty (its vectors keep their capacity).
fn deliver_batch<A: Actor>(ts: &Rc<TypeState<A>>, batch: &mut Outbound<A>, source: usize)
where
    A::Envelope: Send,
{
    let Outbound {
        first,
        targets,
        envs,
    } = batch;
    // A key's `Hash` or `Eq` is user code and may panic: the unwind drops
    // the envelopes not delivered yet, and the guard gives their credits
    // back to the sender and their mailbox places to their actors, and
    // counts them as dead letters (what was delivered was counted as it
    // went).
    let mut undelivered = Undelivered {
        ts,
        targets,
        source,
        left: usize::from(first.is_some()) + targets.len(),
    };
    if let Some((target, env)) = first.take() {
        ts.deliver_remote(&target, env, source);
        undelivered.left -= 1;
    }
    // The rest goes in windows of `LOOKAHEAD`: first every target of the
    // window is looked up (and its cell's first line loaded), then the
    // envelopes are pushed. The lookups of a window are independent, so the
    // processor overlaps their cache misses, where a lookup-then-push loop
    // waits for each cell in turn (the keyed Zipf case: most deliveries go
    // to a cold actor). A delivery to one actor after another reuses the
    // previous lookup. A target with no live cell ends its window's pushes
    // and is delivered alone (it may activate an actor, which changes the
    // table).
    let tag = source_tag(source);
    let mut envs_left = envs.drain(..);
    // Envelopes live cells refused (an ask that would close a cycle), to
    // drop outside the tables' borrows: rare, so empty and unallocated.
    let mut refused: Vec<(AskError, A::Envelope)> = Vec::new();
    let mut i = 0;
    while i < targets.len() {
        let window = &targets[i..targets.len().min(i + LOOKAHEAD)];
        let pushed = {
            let keyed = ts.keyed.borrow();
            let unkeyed = ts.unkeyed.borrow();
            let mut cells: [Option<&Rc<ActorCell<A>>>; LOOKAHEAD] = [None; LOOKAHEAD];
            for (j, target) in window.iter().enumerate() {
                cells[j] = if j > 0 && window[j - 1] == *target {
                    cells[j - 1]
                } else {
                    match target {
                        TargetId::Uid(uid) => unkeyed.get(uid),
                        TargetId::Key(key) => keyed.get(key),
                    }
                    .filter(|c| c.is_open())
                };
            }
            let mut pushed = 0;
            // Counted per run of messages to one actor: a burst to one
            // actor costs one count per window, not one per message.
            let mut run: Option<(&ActorCell<A>, u64)> = None;
            for cell in cells.iter().take(window.len()) {
                let Some(cell) = cell else { break };
                let env = envs_left.next().expect("one envelope per target");
                let queued = match ts.push_or_free(cell, env) {
                    Ok(()) => true,
                    // Dropped once the tables are let go (its `Drop` is
                    // user code, which may send to this type).
                    Err(refused_env) => {
                        refused.push(refused_env);
                        false
                    }
                };
                if queued {
                    match &mut run {
                        Some((c, n)) if std::ptr::eq(*c, &***cell) => *n += 1,
                        _ => {
                            if let Some((c, n)) = run {
                                c.remote.add(tag, n);
                            }
                            run = Some((cell, 1));
                        }
                    }
                }
                pushed += 1;
            }
            if let Some((c, n)) = run {
                c.remote.add(tag, n);
            }
            pushed
        };
        for (why, env) in refused.drain(..) {
            ts.dead_letter_from(source, why, env);
        }
        i += pushed;
        undelivered.left -= pushed;
        if pushed < window.len() {
            let env = envs_left.next().expect("one envelope per target");
            ts.deliver_remote(&targets[i], env, source);
            undelivered.left -= 1;
            i += 1;
        }
    }
    drop(envs_left);
    drop(undelivered);
    targets.clear();
}

/// A batch's messages that a panic kept from delivery (see
/// [`deliver_batch`]): the last `left` of `targets` (and the first, if
/// counted, which went with the panic). When dropped, their credits go
/// back to shard `source`, their mailbox places to their actors, and they
/// count as dead letters.
struct Undelivered<'a, A: Actor> {
    ts: &'a Rc<TypeState<A>>,
    targets: &'a [TargetId<A>],
    source: usize,
    left: usize,
}

impl<A: Actor> Drop for Undelivered<'_, A> {
    #[inline]
    fn drop(&mut self) {
        if self.left == 0 {
            return;
        }
        self.ts.flow.taken(self.source, self.left as u64);
        let dead = &self.ts.counters.dead_letters;
        dead.set(dead.get() + self.left as u64);
        if A::CONFIG.mailbox.is_some() {
            let from = self.targets.len().saturating_sub(self.left);
            for target in &self.targets[from..] {
                // The key that panicked panics again here: its place is
                // lost with it, the others' come back.
                let free = std::panic::AssertUnwindSafe(|| self.ts.free_place_of(target));
                if let Err(payload) = std::panic::catch_unwind(free) {
                    mailring::panic::drop_payload(payload);
                }
            }
        }
    }
}

impl<A: Actor> TypeState<A> {
    /// Applies one delivery on this shard.
    pub(crate) fn apply(self: &Rc<Self>, target: &TargetId<A>, item: Delivery<A>) {
        match item {
            Delivery::Msg(env) => self.deliver_or_drop(target, env),
            Delivery::Stop(reason) => {
                if let Some(cell) = self.find(target).filter(|c| c.is_open()) {
                    cell.request_stop(reason);
                    cell.nudge();
                }
            }
            Delivery::StopGracefully => {
                if let Some(cell) = self.find(target).filter(|c| c.is_open()) {
                    // Queued behind what the mailbox holds now: the actor
                    // handles that first, then stops as `cx.stop()` does.
                    let stop = Continuation::new(|_: &mut A, cx: &mut crate::Ctx<A>| cx.stop());
                    if let Err((why, env)) = cell.push_own(A::__continuation(stop)) {
                        reply::drop_with_reason(why, env);
                    }
                }
            }
            Delivery::Alive(answer) => answer(self.find(target).is_some_and(|c| c.is_open())),
            Delivery::Call(f) => {
                // Reported as a closure run on the shard, wherever it came
                // from; the deliveries after it go on.
                if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
                    mailring::panic::report_caught(mailring::panic::CallbackKind::RunOn, &*payload);
                    mailring::panic::drop_payload(payload);
                }
            }
            Delivery::Watch(notify) => match self.find(target).filter(|c| c.is_open()) {
                Some(cell) => cell.add_watcher(notify),
                None => {
                    let id = crate::ActorId(match target {
                        TargetId::Uid(u) => *u,
                        TargetId::Key(k) => crate::route::keyed_uid::<A, _>(k),
                    });
                    let reason = match target {
                        TargetId::Uid(_) => StopReason::Stopped,
                        TargetId::Key(_) => StopReason::Passivated,
                    };
                    if notify.wanted() {
                        notify.notify(crate::Terminated { id, reason });
                    }
                }
            },
        }
    }

    /// The keys whose actors are active (open) on this shard.
    pub(crate) fn live_keys(&self) -> Vec<A::Key> {
        self.keyed
            .borrow()
            .iter()
            .filter(|(_, cell)| cell.is_open())
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// The current cell of `target`, without activating anything.
    pub(crate) fn find(&self, target: &TargetId<A>) -> Option<Rc<ActorCell<A>>> {
        match target {
            TargetId::Uid(uid) => self.find_unkeyed(*uid),
            TargetId::Key(key) => self.find_keyed(key),
        }
    }
}

/// Pushes on `cell` if it is live; else gives the payload and its wrapper
/// back. The cell is pushed through the caller's borrow of its table:
/// pushing wakes at most a task into a run queue, and the cell is open, so
/// nothing here reaches the tables.
/// Why [`push_live`] did not queue a payload.
enum Missed<A: Actor, P, W> {
    /// No live cell: the payload, unwrapped.
    NoCell(P, W),
    /// The live cell refused it: a dead letter, for the caller to drop
    /// once the table is let go.
    Refused(AskError, A::Envelope),
}

#[inline(always)]
fn push_live<A: Actor, P, W: FnOnce(P) -> A::Envelope>(
    ts: &TypeState<A>,
    cell: Option<&Rc<ActorCell<A>>>,
    payload: P,
    wrap: W,
) -> Result<(), Missed<A, P, W>> {
    match cell {
        Some(cell) if cell.is_open() => ts
            .push_or_free(cell, wrap(payload))
            .map_err(|(why, env)| Missed::Refused(why, env)),
        _ => Err(Missed::NoCell(payload, wrap)),
    }
}

/// Sends `item` to `target` on shard `dest` from wherever the caller runs,
/// keeping its order among this sender's deliveries.
pub(crate) fn send_delivery<A: Actor>(
    system: &Arc<SystemShared>,
    dest: usize,
    target: TargetId<A>,
    item: Delivery<A>,
) where
    A::Envelope: Send,
{
    if pinned_past_last_shard::<A>(system, dest) {
        // A keyed type pinned to a shard the system does not have: its
        // actor never runs (a watch is told at once, as for a stopped one).
        return no_such_shard(target, item);
    }
    match type_state::<A>(system) {
        Some(ts) if ts.shard == dest => {
            // As a same-shard send does: what other shards delivered here
            // first (a spawn, a message) is applied before.
            mailring::receive_pending();
            ts.apply(&target, item)
        }
        Some(ts) => match item {
            Delivery::Msg(env) => ts.push_outbound(dest, target, || env),
            control => ts.push_control(dest, target, control),
        },
        None => {
            if system.is_closed() {
                reply::drop_with_reason(AskError::ShuttingDown, item);
                return;
            }
            let s = system.clone();
            system
                .handle
                .run_on(ShardId::new(dest), move || match type_state::<A>(&s) {
                    Some(ts) => ts.apply(&target, item),
                    None => reply::drop_with_reason(AskError::ShuttingDown, item),
                });
        }
    }
}

/// Whether `dest` is a shard the system does not have, which only a keyed
/// type pinned past the last shard can name: for every other type the
/// placement is a constant that is not `Pinned` and the check folds away,
/// keeping the send paths as they were.
#[inline(always)]
pub(crate) fn pinned_past_last_shard<A: Actor>(system: &SystemShared, dest: usize) -> bool {
    matches!(
        A::CONFIG.placement,
        ActorPlacement::Pinned(_) | ActorPlacement::Custom
    ) && dest >= system.handle.shards()
}

/// [`send_delivery`] to a shard the system does not have.
#[cold]
fn no_such_shard<A: Actor>(target: TargetId<A>, item: Delivery<A>) {
    match item {
        Delivery::Watch(notify) => {
            let uid = match &target {
                TargetId::Uid(uid) => *uid,
                TargetId::Key(key) => crate::route::keyed_uid::<A, _>(key),
            };
            notify.notify(crate::Terminated {
                id: crate::ActorId(uid),
                reason: StopReason::Stopped,
            });
        }
        item => reply::drop_with_reason(AskError::NoSuchShard, item),
    }
}

/// The type-erased face of a [`TypeState`] (stats and shutdown).
pub(crate) trait AnyTypeState {
    fn stats(&self) -> ActorTypeStats;
    fn stop_all(&self, reason: StopReason) -> usize;
    /// Empties this thread's per-type cache (the registry is going away).
    fn forget_cached(&self);
}

impl<A: Actor> AnyTypeState for TypeState<A> {
    fn forget_cached(&self) {
        let _ = A::__with_local_cache(|c| c.0.borrow_mut().take());
    }

    fn stats(&self) -> ActorTypeStats {
        let c = &self.counters;
        let live_high = self
            .keyed
            .borrow()
            .values()
            .chain(self.unkeyed.borrow().values())
            .map(|c| c.high_water.get())
            .max()
            .unwrap_or(0);
        ActorTypeStats {
            actor_type: std::any::type_name::<A>(),
            shard: self.shard,
            active: self.keyed.borrow().len() + self.unkeyed.borrow().len(),
            handled: c.handled.get(),
            ran_now: c.ran_now.get(),
            activations: c.activations.get(),
            passivations: c.passivations.get(),
            restarts: c.restarts.get(),
            panics: c.panics.get(),
            stops: c.stops.get(),
            dead_letters: c.dead_letters.get(),
            mailbox_high_water: c.high_water.get().max(live_high),
        }
    }

    fn stop_all(&self, reason: StopReason) -> usize {
        TypeState::stop_all(self, reason)
    }
}

/// This shard's registry.
pub(crate) struct ShardActors {
    system_id: u64,
    system: Arc<SystemShared>,
    /// This shard's replica, on which the shard's `SystemRef`s count
    /// (dropped with the registry, on this thread).
    _replica: crate::replica::ReplicaHome,
    shard: usize,
    /// Indexed by each actor type's [`crate::actor::TypeSlot`]: that type's
    /// `TypeState<A>`.
    typed: RefCell<Vec<Option<ErasedRc>>>,
    /// Every type state, for stats and shutdown.
    all: RefCell<Vec<Rc<dyn AnyTypeState>>>,
    /// This shard's credit windows.
    flow: Rc<ShardFlow>,
    /// Each topic's subscribers on this shard, resolved to local sends
    /// (see `topic`), by topic id.
    topics: RefCell<HashMap<u64, Rc<dyn std::any::Any>>>,
}

thread_local! {
    /// The registry of each system this shard runs (usually one; several
    /// systems may share a runtime, see `ActorSystem::start_on`).
    static REGISTRY: RefCell<Vec<Rc<ShardActors>>> = const { RefCell::new(Vec::new()) };
}

/// The calling shard's registry of system `system_id`, if installed.
#[inline]
fn find_registry(system_id: u64) -> Option<Rc<ShardActors>> {
    REGISTRY
        .try_with(|r| {
            r.borrow()
                .iter()
                .find(|reg| reg.system_id == system_id)
                .cloned()
        })
        .ok()
        .flatten()
}

/// The registry of the calling shard if it runs `system`, installing it on
/// first use.
fn registry(system: &Arc<SystemShared>) -> Option<Rc<ShardActors>> {
    if let Some(reg) = find_registry(system.id) {
        return Some(reg);
    }
    let shard = system.handle.local_shard()?;
    if system.is_closed() {
        return None;
    }
    let reg = Rc::new(ShardActors {
        system_id: system.id,
        system: system.clone(),
        _replica: crate::replica::ReplicaHome::new(system.clone()),
        shard: shard.index(),
        typed: RefCell::new(Vec::new()),
        all: RefCell::new(Vec::new()),
        flow: Rc::new(ShardFlow::new(
            shard.index(),
            system.handle.shards(),
            system.cross_shard_window,
            system.credit_base,
            system.shutting_down.clone(),
        )),
        topics: RefCell::new(HashMap::new()),
    });
    REGISTRY
        .try_with(|r| r.borrow_mut().push(reg.clone()))
        .ok()?;
    Some(reg)
}

/// The calling shard's cache of topic `id` (created empty on first use),
/// when it is a shard of `system`.
pub(crate) fn topic_cache<T: Default + 'static>(
    system: &Arc<SystemShared>,
    id: u64,
) -> Option<Rc<RefCell<T>>> {
    let reg = registry(system)?;
    let mut topics = reg.topics.borrow_mut();
    let entry = topics
        .entry(id)
        .or_insert_with(|| Rc::new(RefCell::new(T::default())));
    entry.clone().downcast::<RefCell<T>>().ok()
}

/// Forgets the calling shard's cache of topic `id` (the topic is gone).
pub(crate) fn forget_topic_cache(system: &Arc<SystemShared>, id: u64) {
    if let Some(reg) = find_registry(system.id) {
        let gone = reg.topics.borrow_mut().remove(&id);
        drop(gone);
    }
}

/// The calling shard's state for actor type `A`, when it is a shard of `system`.
#[inline]
pub(crate) fn type_state<A: Actor>(system: &Arc<SystemShared>) -> Option<Rc<TypeState<A>>> {
    if let Some(ts) = cached_type_state::<A>(system.id) {
        return Some(ts);
    }
    let ts = registry_type_state::<A>(system)?;
    A::__with_local_cache(|c| *c.0.borrow_mut() = Some((system.id, ts.clone())));
    Some(ts)
}

/// This thread's cached state of type `A` for `system_id`, if cached.
#[inline]
fn cached_type_state<A: Actor>(system_id: u64) -> Option<Rc<TypeState<A>>> {
    A::__with_local_cache(|c| match &*c.0.borrow() {
        Some((id, ts)) if *id == system_id => Some(ts.clone()),
        _ => None,
    })
    .flatten()
}

/// [`type_state`] without the per-type cache: the registry's entry.
fn registry_type_state<A: Actor>(system: &Arc<SystemShared>) -> Option<Rc<TypeState<A>>> {
    let slot = A::__slot().index();
    let hit = find_registry(system.id).and_then(|reg| {
        let typed = reg.typed.borrow();
        typed.get(slot)?.as_ref()?.get_rc::<TypeState<A>>()
    });
    match hit {
        Some(ts) => Some(ts),
        None => new_type_state::<A>(system, slot),
    }
}

/// As [`type_state`], for a shard whose registry is installed (every shard
/// of a system installs it at start).
fn type_state_by_id<A: Actor>(system_id: u64) -> Option<Rc<TypeState<A>>> {
    if let Some(ts) = cached_type_state::<A>(system_id) {
        return Some(ts);
    }
    let system = with_registry(system_id, |reg| reg.system.clone())?;
    type_state::<A>(&system)
}

/// Runs `f` on the calling shard's registry, if it is installed for `system_id`.
fn with_registry<R>(system_id: u64, f: impl FnOnce(&ShardActors) -> R) -> Option<R> {
    find_registry(system_id).map(|reg| f(&reg))
}

/// Takes back the listing of a send's wait for credit (the send is
/// dropped, or done) from the calling shard's windows of system
/// `system_id`; a listing of another shard, or one a wake took, is left.
pub(crate) fn forget_credit_wait(system_id: u64, wait: &mut crate::flow::CreditWait) {
    let Some(listing) = wait.take_listing() else {
        return;
    };
    let waker = with_registry(system_id, |reg| reg.flow.forget_listing(listing)).flatten();
    // Dropped with no registry borrowed: it may hold the last reference to
    // a task.
    drop(waker);
}

/// Installs the calling shard's registry for `system` (at system start).
pub(crate) fn install(system: &Arc<SystemShared>) {
    let _ = registry(system);
}

#[cold]
fn new_type_state<A: Actor>(system: &Arc<SystemShared>, slot: usize) -> Option<Rc<TypeState<A>>> {
    let reg = registry(system)?;
    let ts = Rc::new(TypeState::<A>::new(
        reg.shard,
        reg.system.clone(),
        reg.flow.clone(),
    ));
    {
        let mut typed = reg.typed.borrow_mut();
        if typed.len() <= slot {
            typed.resize_with(slot + 1, || None);
        }
        typed[slot] = Some(ErasedRc::new(ts.clone()));
    }
    reg.all.borrow_mut().push(ts.clone());
    Some(ts)
}

/// Stats of every actor type on the calling shard.
pub(crate) fn shard_stats(system: &Arc<SystemShared>) -> Vec<ActorTypeStats> {
    let Some(reg) = registry(system) else {
        return Vec::new();
    };
    let types: Vec<_> = reg.all.borrow().clone();
    types.iter().map(|t| t.stats()).collect()
}

/// Asks every actor on the calling shard to stop; returns how many are live.
pub(crate) fn stop_shard(system: &Arc<SystemShared>, reason: StopReason) -> usize {
    let Some(reg) = registry(system) else {
        return 0;
    };
    // Senders waiting for credit stop waiting: a shutting-down system
    // returns no more (see `Addr::send`).
    reg.flow.release_waiters();
    let types: Vec<_> = reg.all.borrow().clone();
    types.iter().map(|t| t.stop_all(reason)).sum()
}

/// Drops the calling shard's registry (system shutdown, after every actor stopped).
pub(crate) fn clear_shard(system: &Arc<SystemShared>) {
    let reg = REGISTRY
        .try_with(|r| {
            let mut all = r.borrow_mut();
            let i = all.iter().position(|reg| reg.system_id == system.id)?;
            Some(all.swap_remove(i))
        })
        .ok()
        .flatten();
    if let Some(reg) = reg {
        let typed = std::mem::take(&mut *reg.typed.borrow_mut());
        let all = std::mem::take(&mut *reg.all.borrow_mut());
        let topics = std::mem::take(&mut *reg.topics.borrow_mut());
        all.iter().for_each(|t| t.forget_cached());
        drop((typed, all, topics));
    }
}

/// Where a keyed actor of type `A` with this key lives.
pub(crate) fn keyed_home<A: Actor>(system: &Arc<SystemShared>, key: &A::Key, hash: u64) -> usize {
    let n = system.handle.shards();
    match A::CONFIG.placement {
        ActorPlacement::Sticky => mailring::shard_for_hash(hash, n).index(),
        // Past the last shard (`s >= n`) when the type is pinned to a shard
        // the system does not have: its sends fail with `NoSuchShard`.
        ActorPlacement::Pinned(s) => s.index(),
        // Past the last shard, too, if the function says so.
        ActorPlacement::Custom => A::place(key, n).index(),
        ActorPlacement::Stealable | ActorPlacement::Balanced | ActorPlacement::FirstSender => {
            directory_home::<A>(system, hash, n)
        }
    }
}

/// [`keyed_home`] for a key already placed, without placing one: `None`
/// for a directory-placed type's key no sender has routed.
pub(crate) fn placed_home<A: Actor>(
    system: &Arc<SystemShared>,
    key: &A::Key,
    hash: u64,
) -> Option<usize> {
    if !matches!(
        A::CONFIG.placement,
        ActorPlacement::Stealable | ActorPlacement::Balanced | ActorPlacement::FirstSender
    ) {
        return Some(keyed_home::<A>(system, key, hash));
    }
    let Some(ts) = type_state::<A>(system) else {
        return system.directory::<A>().get(hash);
    };
    if let Some(&s) = ts.homes.borrow().get(&hash) {
        return Some(s as usize);
    }
    let dir = ts.directory.get_or_init(|| system.directory::<A>());
    let s = dir.get(hash)?;
    let mut homes = ts.homes.borrow_mut();
    if homes.len() >= HOMES_CACHED {
        homes.clear();
    }
    homes.insert(hash, s as u32);
    Some(s)
}

/// Directory records each shard caches per type, at most.
pub(crate) const HOMES_CACHED: usize = 1 << 16;

/// [`keyed_home`] for a type placed through its directory. On a shard of
/// the system, the shard's cache of the directory's records answers first
/// (records never change), and a miss takes the directory from the shard's
/// type state rather than from the system's table of directories.
fn directory_home<A: Actor>(system: &Arc<SystemShared>, hash: u64, n: usize) -> usize {
    let Some(ts) = type_state::<A>(system) else {
        return route_new::<A>(&system.directory::<A>(), system, hash, None, n);
    };
    if let Some(&s) = ts.homes.borrow().get(&hash) {
        return s as usize;
    }
    let dir = ts.directory.get_or_init(|| system.directory::<A>());
    let s = route_new::<A>(dir, system, hash, Some(ts.shard), n);
    let mut homes = ts.homes.borrow_mut();
    if homes.len() >= HOMES_CACHED {
        // A cache of records that never change: emptied when full, it
        // fills again from the directory.
        homes.clear();
    }
    homes.insert(hash, s as u32);
    s
}

/// The directory's record of the key whose route hash is `hash`, made now
/// by the type's placement if there is none; `here`: the calling shard, if
/// it is one of the system's.
fn route_new<A: Actor>(
    dir: &Directory,
    system: &SystemShared,
    hash: u64,
    here: Option<usize>,
    n: usize,
) -> usize {
    match A::CONFIG.placement {
        ActorPlacement::Stealable => dir.route(hash, || system.handle.least_loaded_shard().index()),
        ActorPlacement::FirstSender => dir.route_counted(hash, here, n),
        _ => dir.route_balanced(hash, n),
    }
}

#[cfg(test)]
mod tests {
    use crate::{Actor, ActorSystem, Ctx, Handler, Message, Placement, Runtime, ShardId};

    #[derive(Actor, Default)]
    #[actor(handles(Tick, Count))]
    struct Sink {
        n: u64,
    }

    #[derive(Message)]
    struct Tick;

    #[derive(Message)]
    #[message(reply = u64)]
    struct Count;

    impl Handler<Tick> for Sink {
        async fn handle(&mut self, _m: Tick, _cx: &mut Ctx<Self>) {
            self.n += 1;
        }
    }

    impl Handler<Count> for Sink {
        async fn handle(&mut self, _m: Count, _cx: &mut Ctx<Self>) -> u64 {
            self.n
        }
    }

    #[test]
    fn a_one_way_stream_reuses_its_batch_carriers() {
        let sys = ActorSystem::start(Runtime::builder().shards(2)).expect("io_uring available");
        let sink = sys.spawn_actor(Placement::Pinned(ShardId::new(1)), Sink::default);
        let rt = sys.runtime().clone();
        let (count, returned, made) = sys.block_on(async move {
            rt.spawn_on(ShardId::new(0), async move {
                // 200 batches of 100 tells and an ask. The ask's reply comes
                // after its batch was delivered, whose carrier then went back
                // to this (the sending) shard's list for the next batch.
                let mut n = 0;
                for _ in 0..200 {
                    for _ in 0..100 {
                        sink.tell(Tick).unwrap();
                    }
                    n = sink.ask(Count).await.unwrap();
                }
                let ts = super::type_state::<Sink>(sink.system.arc()).expect("on a shard");
                let returned = ts.spares.borrow().len();
                let made = ts.carriers_made.get();
                (n, returned, made)
            })
            .await
            .unwrap()
        });
        assert_eq!(count, 20_000);
        assert!(returned > 0, "no carrier came back to the sender");
        // Without the return trip every batch would need a new carrier.
        assert!(made <= 2, "{made} carriers made for 200 batches");
        sys.shutdown();
    }

    #[derive(Actor)]
    #[actor(key = u64, activate = Placed::new, placement = "first_sender", handles(Tick))]
    struct Placed;

    impl Placed {
        fn new(_k: &u64) -> Self {
            Placed
        }
    }

    impl Handler<Tick> for Placed {
        async fn handle(&mut self, _m: Tick, _cx: &mut Ctx<Self>) {}
    }

    #[test]
    fn a_shard_s_cache_of_directory_records_stays_bounded_and_agrees_with_them() {
        let sys = ActorSystem::start(Runtime::builder().shards(2)).expect("io_uring available");
        let h = sys.handle();
        let keys = super::HOMES_CACHED as u64 + 100;
        // Keys 0..100 placed ahead on shard 0; every key then routed from
        // shard 1, past the cache's bound.
        for k in 0..100 {
            assert_eq!(h.place::<Placed>(k, ShardId::new(0)), Ok(ShardId::new(0)));
        }
        let rt = sys.runtime().clone();
        let (cached, wrong) = sys.block_on(async move {
            rt.spawn_on(ShardId::new(1), async move {
                let want = |k: u64| ShardId::new(if k < 100 { 0 } else { 1 });
                let mut wrong = Vec::new();
                for round in 0..2 {
                    for k in 0..keys {
                        if h.shard_of::<Placed>(&k) != want(k) {
                            wrong.push((round, k));
                        }
                    }
                }
                let ts = super::type_state::<Placed>(&h.shared).expect("on a shard");
                let cached = ts.homes.borrow().len();
                (cached, wrong)
            })
            .await
            .unwrap()
        });
        assert!(
            wrong.is_empty(),
            "routed elsewhere than recorded: {:?}",
            &wrong[..wrong.len().min(5)]
        );
        assert!(cached <= super::HOMES_CACHED, "{cached} records cached");
        sys.shutdown();
    }
}
