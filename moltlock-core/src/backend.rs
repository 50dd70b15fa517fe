//! The backend trait: two atomic operations on one key, plus optional extras.

use std::time::Duration;

use async_trait::async_trait;

use crate::{Error, Fence, LockKey, Token};

/// What a [`Backend::cas`] call did.
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

/// What a failed [`Backend::cas`] saw. Every field is optional help for the
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

/// One hold to renew in a [`Backend::renew_many`] batch.
#[derive(Clone, Debug)]
pub struct RenewItem {
    /// The key held.
    pub key: LockKey,
    /// Its owner.
    pub token: Token,
    /// The TTL to extend it by, from now.
    pub ttl: Duration,
}

/// A hold as reported by [`Backend::inspect`] and [`Backend::list`].
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
    /// when), where the backend stores descriptions ([`Backend::describe`]).
    pub description: Option<String>,
}

/// How long a dropped request may still land, unless a backend says otherwise.
pub const DEFAULT_LATE_WRITE: Duration = Duration::from_secs(5);

/// The optional features a backend offers. The manager and the conformance
/// suite read these; a two-method backend returns the default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// [`Backend::watch`] returns a watch that wakes waiters on release.
    pub notifies_release: bool,
    /// [`Backend::inspect`] and [`Backend::list`] work.
    pub inspect: bool,
    /// [`Backend::renew_many`] renews a batch in one round trip.
    pub batch_renew: bool,
    /// [`Backend::fair_acquire`] hands the key out in arrival order.
    pub fair_queue: bool,
    /// The shortest TTL the store can honour.
    pub min_ttl: Duration,
    /// The longest key, in bytes, the store can hold.
    pub max_key_len: usize,
    /// [`Backend::raise_fence`] works: the store's next fence for a key can
    /// be pushed above a given floor (needed to migrate between stores).
    pub raise_fence: bool,
    /// How long after its future was dropped a request may still take
    /// effect in the store (a statement queued behind a lock, a request
    /// re-sent by the client). A cancelled acquisition keeps deleting its
    /// token's hold for at least this long, so a late write leaves no
    /// orphan.
    pub late_write: Duration,
    /// [`Backend::describe`] stores a holder description that `inspect`
    /// and `list` return.
    pub describe: bool,
}

impl Default for Capabilities {
    fn default() -> Self {
        Self::new()
    }
}

impl Capabilities {
    /// No optional features; core's key and TTL limits.
    pub const fn new() -> Self {
        Self {
            notifies_release: false,
            inspect: false,
            batch_renew: false,
            fair_queue: false,
            min_ttl: crate::MIN_TTL,
            max_key_len: crate::MAX_KEY_LEN,
            raise_fence: false,
            late_write: DEFAULT_LATE_WRITE,
            describe: false,
        }
    }

    /// Declares [`Backend::describe`].
    pub const fn with_describe(mut self) -> Self {
        self.describe = true;
        self
    }

    /// Declares how long a dropped request may still take effect.
    pub const fn with_late_write(mut self, bound: Duration) -> Self {
        self.late_write = bound;
        self
    }

    /// Declares [`Backend::raise_fence`].
    pub const fn with_raise_fence(mut self) -> Self {
        self.raise_fence = true;
        self
    }

    /// Declares release notifications.
    pub const fn with_notifications(mut self) -> Self {
        self.notifies_release = true;
        self
    }

    /// Declares `inspect` and `list`.
    pub const fn with_inspect(mut self) -> Self {
        self.inspect = true;
        self
    }

    /// Declares one-round-trip batch renewal.
    pub const fn with_batch_renew(mut self) -> Self {
        self.batch_renew = true;
        self
    }

    /// Declares a fair FIFO queue.
    pub const fn with_fair_queue(mut self) -> Self {
        self.fair_queue = true;
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
}

/// A subscription to release events of one key, made *before* the acquire
/// attempt it follows, so a release between the attempt and the wait is
/// never missed.
#[async_trait]
pub trait ReleaseWatch: Send {
    /// Resolves once the key may have been released since the attempt that
    /// saw `held`. Spurious wake-ups are allowed; missed ones are not.
    ///
    /// Cancel safe: dropping the future loses nothing; the next call still
    /// sees a release that happened meanwhile.
    async fn released(&mut self, held: &Held) -> Result<(), Error>;
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
    async fn cas(
        &self,
        key: &LockKey,
        expected: Option<&Token>,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error>;

    /// Atomically remove the key only if `owner` holds it. Returns whether it
    /// did. Must never remove another owner's hold.
    async fn delete(&self, key: &LockKey, owner: &Token) -> Result<bool, Error>;

    /// A short name for errors, logs and metric labels.
    fn name(&self) -> &'static str {
        "custom"
    }

    /// The optional features this backend offers.
    fn capabilities(&self) -> Capabilities {
        Capabilities::new()
    }

    /// Subscribes to releases of `key`; called before the first attempt of a
    /// waiting acquire. `None` (the default) means waiters poll by the retry
    /// policy.
    async fn watch(&self, _key: &LockKey) -> Result<Option<Box<dyn ReleaseWatch>>, Error> {
        Ok(None)
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

    /// The current holder of `key`, if any.
    async fn inspect(&self, _key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        Err(Error::Unsupported {
            backend: self.name(),
            what: "inspect",
        })
    }

    /// Every live hold whose key starts with `prefix`.
    async fn list(&self, _prefix: &str) -> Result<Vec<HolderInfo>, Error> {
        Err(Error::Unsupported {
            backend: self.name(),
            what: "list",
        })
    }

    /// Renews every item; returns, per item, whether it is still held. The
    /// default issues one `cas` per item.
    async fn renew_many(&self, items: &[RenewItem]) -> Result<Vec<bool>, Error> {
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            let outcome = self
                .cas(&item.key, Some(&item.token), &item.token, item.ttl)
                .await?;
            out.push(matches!(outcome, CasOutcome::Acquired { .. }));
        }
        Ok(out)
    }

    /// Stores `description` with the hold of `owner` on `key`, only if
    /// `owner` holds it (owner-checked, as a renewal): a short text that
    /// [`inspect`](Self::inspect) and [`list`](Self::list) return until the
    /// hold ends. A new hold of the key starts with none. Returns whether
    /// `owner` holds the key. Backends with [`Capabilities::describe`]
    /// implement it; the manager checks the text first (at most
    /// [`MAX_DESCRIPTION_LEN`](crate::MAX_DESCRIPTION_LEN) bytes, no control
    /// characters).
    async fn describe(
        &self,
        _key: &LockKey,
        _owner: &Token,
        _description: &str,
    ) -> Result<bool, Error> {
        Err(Error::Unsupported {
            backend: self.name(),
            what: "holder descriptions",
        })
    }

    /// Makes every later fence of `key` greater than `floor`. Called while
    /// holding the key, so no acquisition races it. Backends with
    /// [`Capabilities::raise_fence`] implement it; migrating between two
    /// stores needs it to keep fences monotonic across the switch.
    async fn raise_fence(&self, _key: &LockKey, _floor: Fence) -> Result<(), Error> {
        Err(Error::Unsupported {
            backend: self.name(),
            what: "raising fences",
        })
    }

    /// Waits in a first-come, first-served queue for `key`, then holds it as
    /// `token`. Backends with [`Capabilities::fair_queue`] implement it; a
    /// dropped future must leave its queue place removed.
    async fn fair_acquire(
        &self,
        _key: &LockKey,
        _token: &Token,
        _ttl: Duration,
    ) -> Result<Fence, Error> {
        Err(Error::Unsupported {
            backend: self.name(),
            what: "fair queue",
        })
    }
}
