//! [`EtcdBackend`]: the `Backend` implementation over etcd v3, and the
//! extensions it hands out. Each method delegates to the session's
//! [`Core`]; the operations live in the files named for their jobs.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::Client;
use moltlock_core::{
    async_trait, hand_out, Backend, CasMulti, CasOutcome, Describe, Error, FairQueue, Fence,
    HolderInfo, Inspect, Limits, LockKey, MultiMode, MultiOutcome, RaiseFence, ReleaseWatch,
    RenewItem, RenewMany, Token, Watch,
};
use tokio::time::Instant;

use crate::config::EtcdConfig;
use crate::core::Core;
use crate::error::NAME;
use crate::watch::KeyWatch;

/// A MoltLock backend on etcd v3.
///
/// Each instance is one session: the holds it writes hang on its own leases
/// (one per distinct TTL, in whole seconds), kept alive by the manager's
/// renewal rounds through [`RenewMany::renew_many`]. Cheap to clone; clones
/// share the session. Give each [`LockManager`](moltlock_core::LockManager)
/// its own instance.
#[derive(Clone)]
pub struct EtcdBackend {
    core: Arc<Core>,
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("key_prefix", &self.core.keys.prefix())
            .finish_non_exhaustive()
    }
}

impl EtcdBackend {
    /// Checks `config`, connects, and checks that etcd answers (and, with
    /// auth, that the credentials work).
    ///
    /// # Errors
    /// [`Error::Config`] for bad settings, TLS files or endpoints,
    /// [`Error::Auth`] for wrong credentials, [`Error::Unavailable`] when
    /// etcd does not answer.
    ///
    /// # Cancel safety
    /// Dropping the future leaves nothing in the store: connecting and the
    /// first (read-only) request write nothing, and no lease is granted
    /// before the first acquisition.
    pub async fn connect(config: EtcdConfig) -> Result<Self, Error> {
        let core = Core::connect(config).await?;
        Ok(Self {
            core: Arc::new(core),
        })
    }

    /// Parses `url` (see [`EtcdConfig::from_url`]) and connects.
    ///
    /// # Errors
    /// As [`EtcdConfig::from_url`] and [`connect`](Self::connect).
    ///
    /// # Cancel safety
    /// As [`connect`](Self::connect): nothing is left in the store.
    pub async fn from_url(url: &str) -> Result<Self, Error> {
        Self::connect(EtcdConfig::from_url(url)?).await
    }

    /// A backend over an application's existing client (clones of an
    /// `etcd_client::Client` share its connection), so locks need no
    /// connection of their own. Of `config` it uses the key prefix, the
    /// session TTL and the request timeout; endpoints, credentials, TLS and
    /// the connect timeout are the client's own (`EtcdConfig::default()`
    /// will do). Sends nothing: the first lock request is the first to
    /// reach etcd.
    ///
    /// # Errors
    /// [`Error::Config`] for a key prefix with control characters, zero
    /// timeouts, or a session TTL out of range.
    pub fn from_client(client: Client, config: EtcdConfig) -> Result<Self, Error> {
        let core = Core::over(client, config)?;
        Ok(Self {
            core: Arc::new(core),
        })
    }

    /// The etcd client, for administration beside the locks.
    pub fn client(&self) -> &Client {
        &self.core.io.client
    }

    /// The key prefix of this backend's locks.
    pub fn key_prefix(&self) -> &str {
        self.core.keys.prefix()
    }

    /// The ids of the session's live leases (one per TTL in use).
    pub fn lease_ids(&self) -> Vec<i64> {
        self.core.session.ids()
    }

    /// How many times a waiter of this instance was woken by a watch event
    /// (release watches and fair-queue waits): a diagnostic that shows a
    /// release wakes one waiter, not a herd.
    pub fn watch_wakeups(&self) -> u64 {
        self.core.wakeups.load(Ordering::Relaxed)
    }

    /// How many watch streams this backend has opened (one, unless a stream
    /// failed): every waiter shares one.
    pub fn watch_streams_opened(&self) -> u64 {
        self.core.watches.streams_opened()
    }

    /// Ends the session: revokes its leases, so every hold it wrote vanishes
    /// at once (their guards report `lost()` at the next renewal).
    ///
    /// # Errors
    /// The failure of a revoke request.
    ///
    /// # Cancel safety
    /// The session forgets its leases before revoking them, so a dropped
    /// call may leave some revoked and others live on the server: their
    /// holds then end with their TTL, as nothing renews them.
    pub async fn close(&self) -> Result<(), Error> {
        self.core.session.revoke_all().await
    }
}

#[async_trait]
impl Backend for EtcdBackend {
    /// One Txn. `expected == None`: create the key on the session lease
    /// (fence = its create revision). `Some(t)` with `new == t`: renewal
    /// (compare value, keep the lease alive). `Some(a)`, `new == b`: compare
    /// value == a, then put b (fence = that put's revision).
    ///
    /// # Cancel safety
    /// A dropped call may still land: the key is then held on the session
    /// lease until the manager's owner-checked delete removes it (or, with
    /// no manager, until the session stops renewing that lease). A dropped
    /// renewal only extends a hold its owner already has.
    async fn cas(
        &self,
        key: &LockKey,
        expected: Option<&Token>,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error> {
        match expected {
            None => self.core.create(key, new, ttl).await,
            Some(t) if t == new => self.core.renew_one(key, t).await,
            Some(old) => self.core.replace(key, old, new, ttl).await,
        }
    }

    /// `Txn(if value(key) == owner then delete(key))`; also removes the
    /// owner's fair-queue entry.
    ///
    /// # Cancel safety
    /// A delete dropped (or failed) before etcd answered stays in the
    /// session's pending ledger (up to 4,096 of them) and is sent again,
    /// owner-checked, before the session's next acquisition or renewal
    /// round.
    async fn delete(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        self.core.release(key, owner).await
    }

    fn name(&self) -> &'static str {
        NAME
    }

    fn limits(&self) -> Limits {
        Limits::new()
            .with_min_ttl(self.core.min_ttl)
            // A request the client gave up on may still be applied: a lock
            // key, or a fair-queue entry, that lands after the first
            // cleanup delete is removed by a later one (a release deletes
            // the caller's queue entry too).
            .with_late_write(self.core.io.timeout + Duration::from_secs(1))
    }

    /// The lease's own bound: the instant before its last confirmed grant or
    /// keep-alive, plus its TTL.
    fn earliest_expiry(&self, ttl: Duration, sent_at: Instant) -> Instant {
        self.core.session.bound(ttl, sent_at)
    }

    hand_out!(Watch, Inspect, RenewMany, Describe, RaiseFence, FairQueue, CasMulti);
}

#[async_trait]
impl Watch for EtcdBackend {
    /// A watch on the backend's one shared stream; it is added to the
    /// stream at the first wait, not here.
    async fn watch(&self, key: &LockKey) -> Result<Box<dyn ReleaseWatch>, Error> {
        Ok(Box::new(KeyWatch {
            hub: self.core.watches.clone(),
            key: self.core.keys.lock(key),
            wakeups: self.core.wakeups.clone(),
        }))
    }
}

#[async_trait]
impl Inspect for EtcdBackend {
    /// Fences include the key's raised minimum (see [`RaiseFence`]).
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        self.core.inspect(key).await
    }

    /// One range read, plus one lease query per lease in use; fences
    /// include each key's raised minimum, as `inspect`'s do.
    async fn list(&self, prefix: &str) -> Result<Vec<HolderInfo>, Error> {
        self.core.list(prefix).await
    }
}

#[async_trait]
impl RenewMany for EtcdBackend {
    /// One keep-alive per lease in use, then one lease query per lease (and
    /// reads only for keys whose last write is uncertain) to check each hold
    /// still has its token. A lease that is gone makes every hold on it
    /// report not held.
    ///
    /// # Cancel safety
    /// A dropped round may have kept some leases alive and not others; the
    /// retries of unconfirmed deletes it starts run on as their own task.
    async fn renew_many(&self, items: &[RenewItem]) -> Result<Vec<bool>, Error> {
        self.core.renew_many(items).await
    }
}

#[async_trait]
impl Describe for EtcdBackend {
    /// Puts the description on the hold's own lease, in a Txn that checks
    /// the token and the lease, so it ends with the hold.
    ///
    /// # Cancel safety
    /// A description that lands after the future is dropped is still on the
    /// hold's lease and ends with the hold.
    async fn describe(&self, key: &LockKey, owner: &Token, text: &str) -> Result<bool, Error> {
        self.core.describe(key, owner, text).await
    }
}

#[async_trait]
impl RaiseFence for EtcdBackend {
    /// Lifts the key's fence offset (a key with no lease, beside the lock
    /// key) so that `revision + offset` exceeds `minimum` for every later
    /// hold: revisions only grow and the offset never shrinks.
    ///
    /// # Cancel safety
    /// A dropped raise may or may not land. The write is a plain put of an
    /// offset computed from a read, so a dropped raise whose put lands
    /// after a later raise of the same key sets the earlier, lower offset;
    /// retry a dropped raise before relying on its minimum.
    async fn raise_fence(&self, key: &LockKey, minimum: Fence) -> Result<(), Error> {
        self.core.raise_fence(key, minimum).await
    }
}

#[async_trait]
impl FairQueue for EtcdBackend {
    /// Waits in the key's queue of revision-ordered entries, watching only
    /// its predecessor (see the [crate docs](crate#fair-queue)).
    ///
    /// # Cancel safety
    /// A dropped wait spawns the delete of its queue entry on the current
    /// runtime; should that fail (or no runtime be left), the entry lives
    /// until the session's lease ends. A hold taken as the future was
    /// dropped stays, on the session lease, until the manager's
    /// owner-checked delete removes it.
    async fn acquire(&self, key: &LockKey, token: &Token, ttl: Duration) -> Result<Fence, Error> {
        crate::fair::acquire(&self.core, key, token, ttl).await
    }
}

#[async_trait]
impl CasMulti for EtcdBackend {
    /// One Txn. `All`: `Txn(if create_revision(k) == 0 for every k then
    /// [put(k, token, lease), get(offset of k), delete(description of k)]
    /// for every k else get(k) for every k)`; every key's fence is the
    /// Txn's revision plus its own fence offset, as `cas` gives, and `Held`
    /// lists every key found held, with its holder and the revision seen.
    /// `Any`: a chain of nested Txns, one level per key, each taking its
    /// key if free and otherwise reading it and going on to the next
    /// level, so the first free key is taken; `Held` lists every key.
    /// Either way one request (plus, as for `cas`, a lease grant or
    /// keep-alive when the session's lease needs one, and the retries of
    /// unconfirmed releases). Should etcd refuse the Txn as too large (its
    /// `--max-txn-ops` below [`EtcdConfig::max_txn_ops`]), the call takes
    /// the keys one `cas` at a time instead, as the manager does past
    /// [`max_keys`](CasMulti::max_keys).
    ///
    /// # Cancel safety
    /// As `cas`: a dropped call may still land (every key, or the one
    /// key), on the session lease, until the manager's owner-checked
    /// deletes remove them.
    async fn cas_multi(
        &self,
        keys: &[LockKey],
        token: &Token,
        ttl: Duration,
        mode: MultiMode,
    ) -> Result<MultiOutcome, Error> {
        match self.core.cas_multi(keys, token, ttl, mode).await? {
            Some(outcome) => Ok(outcome),
            None => moltlock_core::extension::cas_each(self, keys, token, ttl, mode).await,
        }
    }

    /// The most keys whose operations fit one Txn: a third of
    /// [`EtcdConfig::max_txn_ops`] (42 of etcd's default 128), and at most
    /// 42 (the deepest nested answer the client decodes).
    fn max_keys(&self) -> usize {
        self.core.max_keys()
    }
}
