//! Errors of the actor layer: one enum per failure domain.

use std::fmt;

/// Why a `tell` (or `try_tell`, `send`) did not enqueue the message; the
/// message comes back in the error.
#[non_exhaustive]
pub enum TellError<M> {
    /// The actor has stopped (unkeyed actors only: a keyed actor re-activates).
    Stopped(M),
    /// The bounded mailbox is full (`try_tell` only).
    Full(M),
    /// The actor system is shutting down.
    ShuttingDown(M),
    /// The keyed actor could not be activated (no factory, no `activate`).
    NoFactory(M),
    /// The actor type is pinned (`#[actor(pinned = N)]`) to a shard the
    /// system does not have.
    NoSuchShard(M),
}

impl<M> TellError<M> {
    /// The message that was not sent.
    pub fn into_inner(self) -> M {
        match self {
            TellError::Stopped(m)
            | TellError::Full(m)
            | TellError::ShuttingDown(m)
            | TellError::NoFactory(m)
            | TellError::NoSuchShard(m) => m,
        }
    }
}

impl<M> fmt::Debug for TellError<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TellError::Stopped(_) => f.write_str("Stopped(..)"),
            TellError::Full(_) => f.write_str("Full(..)"),
            TellError::ShuttingDown(_) => f.write_str("ShuttingDown(..)"),
            TellError::NoFactory(_) => f.write_str("NoFactory(..)"),
            TellError::NoSuchShard(_) => f.write_str("NoSuchShard(..)"),
        }
    }
}

impl<M> fmt::Display for TellError<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TellError::Stopped(_) => f.write_str("the actor has stopped"),
            TellError::Full(_) => f.write_str("the actor's mailbox is full"),
            TellError::ShuttingDown(_) => f.write_str("the actor system is shutting down"),
            TellError::NoFactory(_) => f.write_str("no factory to activate the keyed actor"),
            TellError::NoSuchShard(_) => f.write_str(NO_SUCH_SHARD),
        }
    }
}

impl<M> std::error::Error for TellError<M> {}

/// Why an `ask` got no reply.
///
/// `Debug` prints the variant's name and the `Display` text, so an unwrapped
/// error keeps its explanation and remedy.
#[derive(Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AskError {
    /// The actor stopped (or was stopped) before answering.
    #[error("the actor stopped before replying")]
    Stopped,
    /// The handler panicked while handling this message.
    #[error("the actor's handler panicked while handling the message")]
    Panicked,
    /// No reply before the deadline.
    #[error("no reply before the ask deadline")]
    Timeout,
    /// The ask would wait on an actor that is itself waiting on the asker:
    /// an actor asking itself; an ask to an actor on the asker's ask chain
    /// (the asker handles a message that actor is, transitively, waiting
    /// for); or an ask that reaches an actor whose handler is blocked on an
    /// ask to the asker (two handlers asking each other, from tells, on any
    /// shards: exactly one of the two asks fails). Longer cycles whose hops
    /// start from tell handlers are not detected (see
    /// [`SystemConfig::ask_timeout`](crate::SystemConfig::ask_timeout)).
    #[error("ask cycle: the target is waiting on the asker, this ask would deadlock")]
    WouldDeadlock,
    /// The bounded mailbox is full. Not produced today: an ask takes a
    /// place past the bound, as `tell` does (only `try_tell` and `send`
    /// refuse or wait at the bound, with `TellError`).
    #[error("the actor's mailbox is full")]
    Full,
    /// The keyed actor could not be activated: no factory registered and no
    /// `activate` given.
    #[error(
        "no factory to activate the keyed actor (register one or set #[actor(activate = ...)])"
    )]
    NoFactory,
    /// The actor system is shutting down.
    #[error("the actor system is shutting down")]
    ShuttingDown,
    /// A shard-local reference was requested off the actor's shard.
    #[error("not on the actor's shard")]
    WrongShard,
    /// The actor type is pinned (`#[actor(pinned = N)]`) to a shard the
    /// system does not have.
    #[error("{}", NO_SUCH_SHARD)]
    NoSuchShard,
}

/// The text of the `NoSuchShard` errors.
const NO_SUCH_SHARD: &str =
    "the actor type is pinned (#[actor(pinned = N)]) to a shard the system does not have";

impl fmt::Debug for AskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let variant = match self {
            AskError::Stopped => "Stopped",
            AskError::Panicked => "Panicked",
            AskError::Timeout => "Timeout",
            AskError::WouldDeadlock => "WouldDeadlock",
            AskError::Full => "Full",
            AskError::NoFactory => "NoFactory",
            AskError::ShuttingDown => "ShuttingDown",
            AskError::WrongShard => "WrongShard",
            AskError::NoSuchShard => "NoSuchShard",
        };
        write!(f, "{variant}: {self}")
    }
}

/// Why [`Addr::run_now`](crate::Addr::run_now) (or
/// [`LocalAddr::run_now`](crate::LocalAddr::run_now)) did not run its
/// closure to the end.
pub enum RunNowError<F> {
    /// Not run, and the closure comes back: the actor is not active on the
    /// calling shard, or not idle (a message of it is being handled or
    /// queued, it is starting or stopping, or the call comes from its own
    /// handler). Send it a message instead.
    NotIdle(F),
    /// The closure panicked. The panic is reported as a handler's, and the
    /// actor goes through its supervision policy (restart, stop or
    /// escalate) as if a handler had panicked.
    Panicked,
}

impl<F> RunNowError<F> {
    /// The closure, when it was not run.
    pub fn into_closure(self) -> Option<F> {
        match self {
            RunNowError::NotIdle(f) => Some(f),
            RunNowError::Panicked => None,
        }
    }
}

impl<F> fmt::Debug for RunNowError<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunNowError::NotIdle(_) => f.write_str("NotIdle: ")?,
            RunNowError::Panicked => f.write_str("Panicked: ")?,
        }
        fmt::Display::fmt(self, f)
    }
}

impl<F> fmt::Display for RunNowError<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RunNowError::NotIdle(_) => {
                "the actor is not idle on the calling shard (busy, queued messages, or elsewhere)"
            }
            RunNowError::Panicked => "the closure run on the actor panicked",
        })
    }
}

impl<F> std::error::Error for RunNowError<F> {}

/// Why [`SystemHandle::place`](crate::SystemHandle::place) recorded no
/// shard for a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlaceError {
    /// The type's keys are not recorded in a directory (sticky, pinned or
    /// custom placement): where a key lives follows from the key alone.
    #[error("{actor} is not placed through a directory (its placement is not stealable, balanced or first_sender)")]
    NotDirectoryPlaced {
        /// The actor type's name.
        actor: &'static str,
    },
    /// The shard is past the system's last.
    #[error("shard {shard} does not exist: the system has {shards} shards")]
    NoSuchShard {
        /// The shard asked for.
        shard: usize,
        /// The system's shard count.
        shards: usize,
    },
    /// The actor system is shutting down.
    #[error("the actor system is shutting down")]
    ShuttingDown,
}

/// Why [`Topic::try_subscribe`](crate::Topic::try_subscribe) did not add
/// a subscriber.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SubscribeError {
    /// The actor is subscribed already (it still gets each message once).
    #[error("{id} is subscribed to this topic already")]
    AlreadySubscribed {
        /// The actor.
        id: crate::ActorId,
    },
    /// The actor belongs to another actor system than the topic: actor ids
    /// are only unique within a system (a keyed actor's id is its type and
    /// key), so the topic could not tell it from one of its own.
    #[error("{id} belongs to another actor system than this topic")]
    OtherSystem {
        /// The actor.
        id: crate::ActorId,
    },
    /// The actor would live on a shard the system does not have (a keyed
    /// type pinned past the last shard): it never runs.
    #[error("{id} would live on shard {shard}, which the system does not have")]
    NoSuchShard {
        /// The actor.
        id: crate::ActorId,
        /// Its shard.
        shard: usize,
    },
}

/// Why an actor stopped, as carried by [`crate::Terminated`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StopReason {
    /// `cx.stop()` or a stop request.
    Stopped,
    /// A keyed actor passivated (its idle timeout, or the `max_active`
    /// limit), or was not active when watched; it re-activates on demand.
    /// A keyed actor stopped by `stop()` or `cx.stop()` ends with `Stopped`.
    Passivated,
    /// A panic the supervision policy did not restart from.
    Panicked,
    /// Its parent stopped.
    ParentStopped,
    /// The system shut down.
    Shutdown,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An unwrapped `AskError` prints with `Debug`: it must keep the remedy
    /// the Display text gives.
    #[test]
    fn ask_error_debug_carries_the_display_text() {
        let errors = [
            AskError::Stopped,
            AskError::Panicked,
            AskError::Timeout,
            AskError::WouldDeadlock,
            AskError::Full,
            AskError::NoFactory,
            AskError::ShuttingDown,
            AskError::WrongShard,
            AskError::NoSuchShard,
        ];
        for err in errors {
            let debug = format!("{err:?}");
            assert!(debug.contains(&err.to_string()), "{debug}");
        }
        let debug = format!("{:?}", AskError::NoFactory);
        assert!(debug.contains("NoFactory"), "{debug}");
        assert!(debug.contains("#[actor(activate = ...)]"), "{debug}");
    }
}
