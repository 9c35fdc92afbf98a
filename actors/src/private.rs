//! What `#[derive(Actor)]` generates code against: not part of the API
//! (`#[doc(hidden)] pub mod __private` at the crate root), and free to
//! change between releases.

use std::any::TypeId;
use std::cell::Cell;
use std::collections::HashMap;
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
/// [`GENERIC_CACHE_SLOTS`] types (the caller then takes its uncached path).
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
