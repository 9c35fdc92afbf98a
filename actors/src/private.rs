//! What `#[derive(Actor)]` generates code against: not part of the API
//! (`#[doc(hidden)] pub mod __private` at the crate root), and free to
//! change between releases.

use std::any::TypeId;
use std::cell::Cell;
use std::collections::HashMap;
use std::future::{Future, Ready};
use std::sync::{OnceLock, RwLock};

use crate::actor::Actor;
use crate::erased::ErasedStatic;

pub use crate::actor::{
    handle_asked, handle_message, Continuation, DynEnvelope, LocalCache, TypeSlot,
};
pub use crate::reply::AskProbe;

/// The registry slot of a generic actor type `A` (a static in a generic
/// function would be one for all of its instances): one per `TypeId`,
/// made on first use and kept for the process.
pub fn generic_slot<A: Actor>() -> &'static TypeSlot {
    static SLOTS: OnceLock<RwLock<HashMap<TypeId, &'static TypeSlot>>> = OnceLock::new();
    let slots = SLOTS.get_or_init(|| RwLock::new(HashMap::new()));
    let id = TypeId::of::<A>();
    if let Some(slot) = slots.read().unwrap_or_else(|p| p.into_inner()).get(&id) {
        return slot;
    }
    let mut all = slots.write().unwrap_or_else(|p| p.into_inner());
    all.entry(id)
        .or_insert_with(|| Box::leak(Box::new(TypeSlot::new())))
}

/// How many generic actor types a thread caches (past that, a type takes
/// the uncached path: a registry lookup per send).
const GENERIC_CACHE_SLOTS: usize = 32;

thread_local! {
    /// This thread's caches of generic actor types, filled in order and
    /// never emptied: each a `LocalCache<A>` leaked for the thread's life
    /// (a few words per type and thread; its contents are cleared when the
    /// system shuts down), held as a `Copy` pointer with its type, so the
    /// cells need no destructor and a lookup is a few loads and an inline
    /// compare of `TypeId`s.
    static GENERIC_CACHES: [Cell<Option<ErasedStatic>>; GENERIC_CACHE_SLOTS] =
        const { [const { Cell::new(None) }; GENERIC_CACHE_SLOTS] };
}

/// Runs `f` with this thread's cache of the generic actor type `A` (what a
/// `thread_local!` gives a non-generic type); `None` past
/// `GENERIC_CACHE_SLOTS` types (the caller then takes its uncached path).
#[inline(always)]
pub fn with_generic_cache<A: Actor, R>(f: impl FnOnce(&LocalCache<A>) -> R) -> Option<R> {
    GENERIC_CACHES
        .try_with(|slots| {
            for slot in slots {
                match slot.get() {
                    Some(entry) => {
                        if let Some(cache) = entry.get::<LocalCache<A>>() {
                            return Some(f(cache));
                        }
                    }
                    None => {
                        let cache: &'static LocalCache<A> =
                            Box::leak(Box::new(LocalCache::<A>::new()));
                        slot.set(Some(ErasedStatic::new(cache)));
                        return Some(f(cache));
                    }
                }
            }
            None
        })
        .ok()
        .flatten()
}

/// A message type no value of which exists: the second `Accepts` impl every
/// typed mailbox gets (see the derive), so that type inference never picks
/// the only listed message for an unlisted one.
#[derive(Debug)]
pub enum Unlisted {}

impl crate::actor::Message for Unlisted {
    type Reply = ();
}

/// The envelope of an ask of [`Unlisted`], which cannot be made: an
/// `Asked<Unlisted>` holds an `Unlisted`.
// Opening it is where the compiler sees there is nothing after.
#[allow(unreachable_code)]
pub fn unlisted_ask<E>(asked: crate::reply::Asked<Unlisted>) -> E {
    let (never, _reply) = asked.open();
    match never {}
}

/// The probe the derive calls hooks through:
/// `HooksOf::<A>::new().on_start(..)` resolves to [`ViaHooks`] (on the
/// probe itself, by value) when `A: Hooks`, and otherwise, through the
/// probe's `Deref`, to [`ViaDefault`] on [`NoHooks`]; each returns its own
/// unboxed future, which borrows nothing of the probe.
#[derive(Debug)]
pub struct HooksOf<A>(NoHooks<A>);

/// What [`HooksOf`] derefs to: the hooks of a type without any.
#[derive(Debug)]
pub struct NoHooks<A>(std::marker::PhantomData<fn() -> A>);

impl<A> HooksOf<A> {
    /// The probe.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        HooksOf(NoHooks(std::marker::PhantomData))
    }
}

impl<A> std::ops::Deref for HooksOf<A> {
    type Target = NoHooks<A>;

    fn deref(&self) -> &NoHooks<A> {
        &self.0
    }
}

/// Runs the type's own hooks.
pub trait ViaHooks<A: Actor> {
    /// `Hooks::on_start`.
    fn on_start<'a>(
        self,
        actor: &'a mut A,
        cx: &'a mut crate::Ctx<A>,
    ) -> impl Future<Output = ()> + 'a;
    /// `Hooks::on_passivate`.
    fn on_passivate<'a>(
        self,
        actor: &'a mut A,
        cx: &'a mut crate::Ctx<A>,
    ) -> impl Future<Output = ()> + 'a;
    /// `Hooks::on_stop`.
    fn on_stop<'a>(
        self,
        actor: &'a mut A,
        cx: &'a mut crate::Ctx<A>,
    ) -> impl Future<Output = ()> + 'a;
}

impl<A: Actor + crate::Hooks> ViaHooks<A> for HooksOf<A> {
    #[inline(always)]
    fn on_start<'a>(
        self,
        actor: &'a mut A,
        cx: &'a mut crate::Ctx<A>,
    ) -> impl Future<Output = ()> + 'a {
        crate::Hooks::on_start(actor, cx)
    }

    #[inline(always)]
    fn on_passivate<'a>(
        self,
        actor: &'a mut A,
        cx: &'a mut crate::Ctx<A>,
    ) -> impl Future<Output = ()> + 'a {
        crate::Hooks::on_passivate(actor, cx)
    }

    #[inline(always)]
    fn on_stop<'a>(
        self,
        actor: &'a mut A,
        cx: &'a mut crate::Ctx<A>,
    ) -> impl Future<Output = ()> + 'a {
        crate::Hooks::on_stop(actor, cx)
    }
}

/// Runs nothing: a type without hooks.
pub trait ViaDefault<A: Actor> {
    /// Nothing.
    #[inline(always)]
    fn on_start(&self, _actor: &mut A, _cx: &mut crate::Ctx<A>) -> Ready<()> {
        std::future::ready(())
    }

    /// Nothing.
    #[inline(always)]
    fn on_passivate(&self, _actor: &mut A, _cx: &mut crate::Ctx<A>) -> Ready<()> {
        std::future::ready(())
    }

    /// Nothing.
    #[inline(always)]
    fn on_stop(&self, _actor: &mut A, _cx: &mut crate::Ctx<A>) -> Ready<()> {
        std::future::ready(())
    }
}

impl<A: Actor> ViaDefault<A> for NoHooks<A> {}
