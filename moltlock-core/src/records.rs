//! What backends answer: the outcome of a `cas`, what a failed attempt
//! saw, a batch renewal's items, and a hold as inspection reports it.

use std::time::Duration;

use crate::{Fence, LockKey, Token};

/// What a [`Backend::cas`](crate::Backend::cas) call did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CasOutcome {
    /// `new` now holds the key. For a fresh acquisition `fence` is strictly
    /// greater than every earlier fence of the key; for a renewal it is the
    /// hold's existing fence (or any value: the manager keeps the first one).
    Acquired {
        /// The fencing token of this hold.
        fence: Fence,
    },
    /// The key's holder was not `expected`; nothing changed.
    Held(Held),
}

/// What a failed [`Backend::cas`](crate::Backend::cas) saw. Every field is optional help for the
/// manager's waiting; a backend may leave them all empty.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// The current holder, if the store told us (`None` also when the key is free
    /// and `expected` was `Some`).
    pub holder: Option<Token>,
    /// How long until the current hold expires, if known: a waiter sleeps no
    /// longer than this before trying again.
    pub expires_in: Option<Duration>,
    /// A store version observed by the failed attempt (etcd: the header
    /// revision), for watches that must start exactly after it.
    pub revision: Option<u64>,
}

/// One hold to renew in a [`RenewMany::renew_many`](crate::RenewMany::renew_many) batch.
#[derive(Clone, Debug)]
pub struct RenewItem {
    /// The key held.
    pub key: LockKey,
    /// Its owner.
    pub token: Token,
    /// The TTL to extend it by, from now.
    pub ttl: Duration,
}

/// A hold as reported by [`Inspect::inspect`](crate::Inspect::inspect) and [`Inspect::list`](crate::Inspect::list).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HolderInfo {
    /// The key, as the caller named it (without any backend prefix).
    pub key: String,
    /// The owner token.
    pub holder: Token,
    /// The hold's fence, where the store keeps it.
    pub fence: Option<Fence>,
    /// Time left before the hold expires, where the store tells it.
    pub expires_in: Option<Duration>,
    /// Who holds it, in the holder's own words (host, pid, command, since
    /// when), where the backend stores descriptions ([`Describe`](crate::Describe)).
    pub description: Option<String>,
}

/// Which keys a [`CasMulti::cas_multi`](crate::CasMulti::cas_multi) takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MultiMode {
    /// Every key, or none.
    All,
    /// The first free key, in the order given.
    Any,
}

/// What a [`CasMulti::cas_multi`](crate::CasMulti::cas_multi) did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MultiOutcome {
    /// The keys now held, as (index into the keys given, fresh fence): every
    /// key for [`MultiMode::All`], the one taken for [`MultiMode::Any`].
    Acquired(Vec<(usize, Fence)>),
    /// Nothing was taken. What the busy keys' attempts saw, as (index,
    /// what it saw): at least one key for [`MultiMode::All`], every key for
    /// [`MultiMode::Any`].
    Held(Vec<(usize, Held)>),
}

impl MultiOutcome {
    /// The answer to an empty list of keys: an `All` takes every one of
    /// them (none), an `Any` finds none free.
    pub fn of_no_keys(mode: MultiMode) -> Self {
        match mode {
            MultiMode::All => Self::Acquired(Vec::new()),
            MultiMode::Any => Self::Held(Vec::new()),
        }
    }
}
