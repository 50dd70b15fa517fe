//! Optional backend features, each an extension a backend hands out
//! (`Backend::watcher`, `Backend::inspector`, …), so that "declared" and
//! "implemented" are one fact.

use std::time::Duration;

use async_trait::async_trait;

use crate::records::{Held, HolderInfo, RenewItem};
use crate::{Error, Fence, LockKey, Token};

/// A subscription to release events of one key, made *before* the acquire
/// attempt it follows, so a release between the attempt and the wait is
/// never missed.
#[async_trait]
pub trait ReleaseWatch: Send {
    /// Resolves once the key may have been released since the attempt that
    /// saw `held`. Spurious wake-ups are allowed; missed ones are not.
    ///
    /// # Cancel safety
    /// Dropping the future loses nothing; the next call still sees a
    /// release that happened meanwhile.
    async fn released(&mut self, held: &Held) -> Result<(), Error>;
}

/// Release notifications: a waiter subscribes before its attempt and sleeps
/// until the key may have been released.
#[async_trait]
pub trait Watch: Send + Sync {
    /// Subscribes to releases of `key`; called before the first attempt of
    /// a waiting acquire.
    ///
    /// # Cancel safety
    /// Dropping the future leaves nothing behind in the store: the
    /// subscription, if made, ends with the dropped watch.
    async fn watch(&self, key: &LockKey) -> Result<Box<dyn ReleaseWatch>, Error>;
}

/// A store whose release, when others wait, picks by itself which waiting
/// client takes the key next and keeps the key for it a short while (the
/// Redis backend's *turns*), so a releaser cannot win its key back again
/// and again. A composite that holds a key only while several stores grant
/// it (a [`QuorumBackend`](crate::QuorumBackend)) turns this off on its
/// members: each member would pick its own client, and the votes would
/// split so that nobody won.
pub trait Turns: Send + Sync {
    /// Turns the choosing on or off. Off, a release leaves the key free for
    /// whichever waiter asks first.
    fn set_turns(&self, on: bool);
}

/// Reading the holds of a store.
#[async_trait]
pub trait Inspect: Send + Sync {
    /// The current holder of `key`, if any.
    ///
    /// # Cancel safety
    /// Read only: dropping the future changes nothing.
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error>;

    /// Every live hold whose key starts with `prefix`, sorted by key.
    ///
    /// # Cancel safety
    /// Read only: dropping the future changes nothing.
    async fn list(&self, prefix: &str) -> Result<Vec<HolderInfo>, Error>;
}

/// Renewing a batch of holds in one round trip.
#[async_trait]
pub trait RenewMany: Send + Sync {
    /// Renews every item; returns, per item, whether it is still held.
    ///
    /// # Cancel safety
    /// Dropping the future may leave some items renewed and others not;
    /// a renewal only extends a hold its owner already has.
    async fn renew_many(&self, items: &[RenewItem]) -> Result<Vec<bool>, Error>;
}

/// Storing a holder description with a hold.
#[async_trait]
pub trait Describe: Send + Sync {
    /// Stores `description` with the hold of `owner` on `key`, only if
    /// `owner` holds it (owner-checked, as a renewal): a short text that
    /// [`Inspect`] returns until the hold ends. A new hold of the key
    /// starts with none. Returns whether `owner` holds the key. The manager
    /// checks the text first (at most
    /// [`MAX_DESCRIPTION_LEN`](crate::MAX_DESCRIPTION_LEN) bytes, no
    /// control characters).
    ///
    /// # Cancel safety
    /// Dropping the future may or may not store the description; it never
    /// touches another owner's hold.
    async fn describe(&self, key: &LockKey, owner: &Token, text: &str) -> Result<bool, Error>;
}

/// Raising the fence minimum of a key.
#[async_trait]
pub trait RaiseFence: Send + Sync {
    /// Makes every later fence of `key` greater than `minimum`. Called while
    /// holding the key, so no acquisition races it; migrating between two
    /// stores needs it to keep fences monotonic across the switch.
    ///
    /// # Cancel safety
    /// Dropping the future may or may not raise the minimum; a raise is a
    /// max, so trying again is harmless.
    async fn raise_fence(&self, key: &LockKey, minimum: Fence) -> Result<(), Error>;
}

/// A first-come, first-served queue per key.
///
/// "First" is the order in which the store recorded the waiters' places:
/// a fair acquisition that asks after another waiter's place is recorded
/// is served after that waiter, even when it finds the key free.
/// Acquisitions whose requests are in flight together may be served in
/// either order (on the SQL stores a place's number is drawn before its
/// write commits, so numbers and commits may cross, and a take that read
/// the queue before a place was recorded may land after it).
#[async_trait]
pub trait FairQueue: Send + Sync {
    /// Waits in the queue for `key`, then holds it as `token`.
    ///
    /// # Cancel safety
    /// A dropped future must leave its queue place removed; a hold granted
    /// as it was dropped is deleted by the manager's cleanup (owner-checked
    /// by `token`).
    async fn acquire(&self, key: &LockKey, token: &Token, ttl: Duration) -> Result<Fence, Error>;
}

/// Taking several keys in one request: all of them, or the first free one.
/// Without it, [`BackendExt::cas_multi`](crate::BackendExt::cas_multi)
/// takes them one `cas` at a time (and gives back what it took when a key
/// is held).
#[async_trait]
pub trait CasMulti: Send + Sync {
    /// Atomically, for distinct `keys`: with [`MultiMode::All`](crate::MultiMode::All), if every
    /// key is free (absent or expired), make `token` hold each of them for
    /// `ttl` with a fresh fence, and otherwise change nothing; with
    /// [`MultiMode::Any`](crate::MultiMode::Any), make `token` hold the first free key in the
    /// order given. No other client may ever see a part of an `All` set
    /// held. A key already held by `token` counts as held.
    ///
    /// # Cancel safety
    /// As [`Backend::cas`](crate::Backend::cas): a dropped call may still
    /// take effect (all keys, or the one key) for up to
    /// [`Limits::late_write`](crate::Limits::late_write); the manager then
    /// deletes every key by `token` until that bound has passed.
    async fn cas_multi(
        &self,
        keys: &[LockKey],
        token: &Token,
        ttl: Duration,
        mode: crate::MultiMode,
    ) -> Result<crate::MultiOutcome, Error>;

    /// The most keys one call may name (etcd: its operations per
    /// transaction); the manager falls back to one `cas` at a time for
    /// longer lists.
    fn max_keys(&self) -> usize {
        usize::MAX
    }

    /// Whether one call takes `keys` atomically (Redis Cluster: only keys
    /// of one hash slot, as the keys derived from one name are). The
    /// manager takes other sets one `cas` at a time. A backend must take
    /// the keys derived from one name together.
    fn takes_together(&self, keys: &[LockKey]) -> bool {
        let _ = keys;
        true
    }
}
