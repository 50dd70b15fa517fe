//! The backend trait: two atomic operations on one key; optional features
//! are extensions it hands out ([`Watch`], [`Inspect`], …).

use std::time::Duration;

use async_trait::async_trait;

use crate::features::{
    CasMulti, Describe, FairQueue, Inspect, RaiseFence, RenewMany, Turns, Watch,
};
use crate::records::CasOutcome;
use crate::{Error, LockKey, Token};

/// How long a dropped request may still land, unless a backend says otherwise.
pub const DEFAULT_LATE_WRITE: Duration = Duration::from_secs(5);

/// The limits of a store: the shortest TTL it honours, the longest key it
/// holds, and how long a dropped request may still take effect. What a
/// backend can do beyond [`Backend::cas`] and [`Backend::delete`] is not
/// declared here but handed out as extensions ([`Backend::watcher`],
/// [`Backend::inspector`], …), so a declared feature is always implemented.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// The shortest TTL the store can honour.
    pub min_ttl: Duration,
    /// The longest key, in bytes, the store can hold.
    pub max_key_len: usize,
    /// How long after its future was dropped a request may still take
    /// effect in the store (a statement queued behind a lock, a request
    /// re-sent by the client). A cancelled acquisition keeps deleting its
    /// token's hold for at least this long, so a late write leaves no
    /// orphan.
    pub late_write: Duration,
    /// Whether a [`Backend::delete`] takes effect before any request the
    /// same backend handle sends after the delete's future was first
    /// polled (one connection that carries requests in the order they were
    /// queued, as a Redis client's). The manager then wakes a waiter of its
    /// own as soon as it has sent a release, so the waiter's attempt
    /// follows the release on the wire instead of a round trip later. A
    /// wrong claim, or a delete that was not yet sent at its first poll
    /// (a client reconnecting, a full send queue), costs that waiter an
    /// attempt, never safety: the end of the release wakes it again. A
    /// [`Forward`](crate::Forward) wrapper passes the inner claim on.
    pub in_order: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Self::new()
    }
}

impl Limits {
    /// Core's key and TTL limits, and [`DEFAULT_LATE_WRITE`].
    pub const fn new() -> Self {
        Self {
            min_ttl: crate::MIN_TTL,
            max_key_len: crate::MAX_KEY_LEN,
            late_write: DEFAULT_LATE_WRITE,
            in_order: false,
        }
    }

    /// Declares how long a dropped request may still take effect.
    pub const fn with_late_write(mut self, bound: Duration) -> Self {
        self.late_write = bound;
        self
    }

    /// Declares the shortest TTL the store can honour.
    pub const fn with_min_ttl(mut self, ttl: Duration) -> Self {
        self.min_ttl = ttl;
        self
    }

    /// Declares the longest key the store can hold.
    pub const fn with_max_key_len(mut self, len: usize) -> Self {
        self.max_key_len = len;
        self
    }

    /// Declares whether a delete takes effect before the requests sent
    /// after it (see [`Limits::in_order`]).
    pub const fn with_in_order(mut self, in_order: bool) -> Self {
        self.in_order = in_order;
        self
    }

    /// The limits both `self` and `other` meet: the larger minimum TTL and
    /// late-write bound, the shorter key; not in order (requests to two
    /// stores are not one ordered stream).
    pub fn both(self, other: Self) -> Self {
        Self {
            min_ttl: self.min_ttl.max(other.min_ttl),
            max_key_len: self.max_key_len.min(other.max_key_len),
            late_write: self.late_write.max(other.late_write),
            in_order: false,
        }
    }
}

/// A store that can hold locks. Implement [`cas`](Backend::cas) and
/// [`delete`](Backend::delete); everything else has a default, and the
/// [`LockManager`](crate::LockManager) builds waiting, renewal, deadlines and
/// lost-lock signals on top.
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// Atomically: if the key's holder is `expected` (`None`: the key is absent
    /// or expired), make `new` its holder for `ttl` and return
    /// [`CasOutcome::Acquired`]; otherwise change nothing and return
    /// [`CasOutcome::Held`]. Renewal is `cas(key, Some(t), t, ttl)`.
    ///
    /// Expiry must be judged by one clock (the store's), and a fresh
    /// acquisition's fence must exceed every earlier fence of the key.
    ///
    /// # Cancel safety
    /// A dropped call may still take effect in the store, for up to
    /// [`Limits::late_write`] after it was dropped; the manager then deletes
    /// the hold by its token until that bound has passed. A backend must
    /// never let a dropped call take effect under another token.
    async fn cas(
        &self,
        key: &LockKey,
        expected: Option<&Token>,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error>;

    /// Atomically remove the key only if `owner` holds it. Returns whether it
    /// did. Must never remove another owner's hold.
    ///
    /// # Cancel safety
    /// A dropped call may or may not have deleted the hold; deleting again
    /// is harmless (it answers `false`), and another owner's hold is never
    /// touched.
    async fn delete(&self, key: &LockKey, owner: &Token) -> Result<bool, Error>;

    /// A short name for errors, logs and metric labels.
    fn name(&self) -> &'static str {
        "custom"
    }

    /// The store's limits.
    fn limits(&self) -> Limits {
        Limits::new()
    }

    /// The earliest instant at which the store may expire a hold written or
    /// renewed by a request sent at `sent_at` with `ttl`. The manager ends its
    /// local view of the hold before this (less the drift allowance). The
    /// default, `sent_at + ttl`, fits stores that start the TTL when the
    /// request arrives; a store whose holds hang on a shared lease returns
    /// the lease's own bound.
    fn earliest_expiry(
        &self,
        ttl: Duration,
        sent_at: tokio::time::Instant,
    ) -> tokio::time::Instant {
        sent_at + ttl
    }

    /// The readings of the store's wall clock that this backend takes from
    /// its replies, where holds expire by that clock. The manager shortens
    /// the deadlines of every hold on the store by any forward step it
    /// shows. `None` (the default): no readings, for stores whose expiry
    /// uses no wall clock (etcd leases) or that do not report one.
    fn store_clock(&self) -> Option<&crate::StoreClock> {
        None
    }

    /// Release notifications for waiters. `None` (the default): waiters
    /// poll by the retry policy.
    fn watcher(&self) -> Option<&dyn Watch> {
        None
    }

    /// Reading holds: `moltlock status`, busy answers, migrations.
    fn inspector(&self) -> Option<&dyn Inspect> {
        None
    }

    /// Renewing many holds in one round trip. `None` (the default): the
    /// manager renews each hold with its own [`cas`](Self::cas).
    fn renewer(&self) -> Option<&dyn RenewMany> {
        None
    }

    /// Storing a holder description with a hold.
    fn describer(&self) -> Option<&dyn Describe> {
        None
    }

    /// Raising a key's fence minimum (migrating between stores needs it).
    fn fence_raiser(&self) -> Option<&dyn RaiseFence> {
        None
    }

    /// A first-come, first-served queue per key.
    fn fair_queue(&self) -> Option<&dyn FairQueue> {
        None
    }

    /// Taking several keys in one round trip (semaphores, multi-locks).
    /// `None` (the default): one [`cas`](Self::cas) per key.
    fn batch_cas(&self) -> Option<&dyn CasMulti> {
        None
    }

    /// The store's own choice of the next holder on a release ([`Turns`]),
    /// for composites to turn off. `None` (the default): it makes none.
    fn turns(&self) -> Option<&dyn Turns> {
        None
    }
}
