//! What differs between the SQL databases, behind one sealed trait: the
//! statements, the clock a reply reports, and the dialect's own extras
//! (LISTEN/NOTIFY for Postgres, sweeps, migrations).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use moltlock_core::{
    CasOutcome, Error, Fence, HolderInfo, Limits, LockKey, MultiMode, MultiOutcome, ReleaseWatch,
    RenewItem, StoreClock, Token, Watch,
};
use tokio::time::Instant;

use crate::config::SqlConfig;
use crate::convert::SweepCounter;
use crate::error::Fail;
use crate::kept::{Conn, Kept};
use crate::observe::Observed;

/// A dialect step's result: the database's error stays a [`sqlx::Error`]
/// until the backend maps it, once.
pub type DbResult<T> = Result<T, Fail>;

/// A database the generic `SqlBackend` speaks to: Postgres,
/// SQLite or MySQL/MariaDB. Sealed: only this crate's dialects implement
/// it.
pub trait Dialect: Ops {}

impl<D: Ops> Dialect for D {}

/// The write a `cas` asks for: `new` to hold `key` for `ttl`.
#[derive(Clone, Copy)]
pub struct Write<'a> {
    pub(crate) key: &'a LockKey,
    pub(crate) new: &'a Token,
    pub(crate) ttl: Duration,
}

/// The writes a `cas_multi` asks for: `new` to hold `keys` (distinct, at
/// least one) for `ttl`, every one of them or the first free one.
#[derive(Clone, Copy)]
pub struct Multi<'a> {
    pub(crate) keys: &'a [LockKey],
    pub(crate) new: &'a Token,
    pub(crate) ttl: Duration,
    pub(crate) mode: MultiMode,
}

impl<'a> Multi<'a> {
    /// The single acquisition of `key` with this batch's token and TTL.
    pub(crate) fn write(&self, key: &'a LockKey) -> Write<'a> {
        Write {
            key,
            new: self.new,
            ttl: self.ttl,
        }
    }
}

/// What one backend holds, shared by its clones.
pub struct Shared<D: Ops> {
    pub(crate) pool: sqlx::Pool<D::Db>,
    /// Connections kept out of `pool` for the lock statements.
    pub(crate) kept: Kept<D::Db>,
    /// The dialect's statements and state.
    pub(crate) dialect: D,
    /// What this client saw of held keys, in the observed-expiry mode.
    pub(crate) observed: Option<Observed>,
    /// The store clock, as confirming replies report it (store-clock mode).
    pub(crate) clock: StoreClock,
    pub(crate) releases: SweepCounter,
}

impl<D: Ops> Shared<D> {
    /// A connection for one lock statement (see `kept`).
    pub(crate) async fn conn(&self) -> Result<Conn<D::Db>, sqlx::Error> {
        self.kept.conn().await
    }

    /// Feeds the store clock `now` (since the epoch) of a reply to a
    /// request sent at `sent_at` that confirmed a hold.
    pub(crate) fn saw_clock(&self, sent_at: Instant, now: Duration) {
        if self.observed.is_none() {
            self.clock.observe(sent_at, now);
        }
    }
}

/// A fair waiter's release watch, and whether its last wait ended by a
/// release that named that waiter as the queue's head (the release's own
/// read found it there, so it may take the key without looking first).
pub struct TurnWatch {
    /// The release watch.
    pub watch: Box<dyn ReleaseWatch>,
    /// Set by a wake from a release naming the waiter; the waiter clears it.
    pub named: Arc<AtomicBool>,
}

/// The places of the fair queue: one row per waiter and key, in a table
/// beside the locks, ordered by a number the database draws on insert.
/// Places live by the database clock until `alive_until`, which each look
/// renews.
#[async_trait]
pub trait Queue: Send + Sync {
    /// Whether `key` has a live place.
    async fn occupied(&self, key: &LockKey) -> DbResult<bool>;
    /// Drops the key's dead places of others, puts `owner` at the tail if
    /// it has no place, keeps its place alive for `live`, and answers how
    /// many live places are ahead of it.
    async fn look(&self, key: &LockKey, owner: &Token, live: Duration) -> DbResult<u64>;
    /// Takes `owner`'s place out.
    async fn leave(&self, key: &LockKey, owner: &Token) -> DbResult<()>;
    /// The single acquisition of `w` by the queue's head, which also takes
    /// `w.new`'s place out when it takes the key, in one statement; `None`
    /// where the dialect has no such statement (the caller acquires, then
    /// leaves).
    async fn take_head(&self, w: Write<'_>) -> DbResult<Option<CasOutcome>> {
        let _ = w;
        Ok(None)
    }
    /// The single acquisition of `w` by a fair waiter a release named as
    /// the queue's head, made only while its place is live and no live
    /// place is ahead of it (a naming may have gone stale before the waiter
    /// acted on it), taking its place out when it takes the key; `None`
    /// where the dialect has no such statement (the waiter looks first).
    async fn take_named(&self, w: Write<'_>) -> DbResult<Option<CasOutcome>> {
        let _ = w;
        Ok(None)
    }
    /// A release watch of `key` for the fair waiter `owner` that also
    /// hears the releases naming it as the queue's head; `None` where the
    /// dialect's releases name nobody (the backend's plain watch serves).
    async fn watch_turn(&self, key: &LockKey, owner: &Token) -> Option<Result<TurnWatch, Error>> {
        let _ = (key, owner);
        None
    }
    /// The single acquisition of `w`, made only when the key has no live
    /// place, in one statement; `None` where the dialect has no such
    /// statement (the caller asks [`occupied`](Self::occupied) first). A
    /// key with places answers as held (by nobody when it is free).
    async fn take_unqueued(&self, w: Write<'_>) -> DbResult<Option<CasOutcome>> {
        let _ = w;
        Ok(None)
    }
}

/// The dialect's operations (unnameable outside the crate, which seals
/// [`Dialect`]). Each runs one statement (or one transaction) unless it
/// says otherwise.
#[async_trait]
pub trait Ops: Sized + Send + Sync + 'static {
    /// The sqlx database.
    type Db: sqlx::Database;
    /// The backend's name, in errors and logs.
    const NAME: &'static str;
    /// Whether confirming replies report the store clock.
    const REPORTS_CLOCK: bool;
    /// Whether released rows stay until a sweep deletes them.
    const SWEEPS: bool;
    /// Whether the backend's own pool keeps connections out between lock
    /// statements (see `kept`). Not SQLite: a kept connection there holds
    /// its last statement's read snapshot, and the WAL cannot be reset
    /// past it.
    const KEEPS: bool = true;
    /// The most keys one batch acquisition takes (`CasMulti::max_keys`).
    const MAX_BATCH: usize = usize::MAX;
    /// How long opening may be retried while the database is busy.
    const OPEN_RETRY: Option<Duration> = None;

    /// The statements for `cfg`, its names validated.
    fn new(cfg: &SqlConfig) -> Result<Self, Error>;
    /// A pool connected by `cfg`.
    async fn open(cfg: &SqlConfig) -> Result<sqlx::Pool<Self::Db>, sqlx::Error>;
    /// Creates the schema if missing; idempotent.
    async fn migrate(db: &Shared<Self>) -> DbResult<()>;
    /// Deletes rows released or expired for longer than the retention.
    async fn sweep(_db: &Shared<Self>) -> DbResult<u64> {
        Ok(0)
    }
    /// Refuses keys the store cannot tell apart.
    fn check_key(_key: &LockKey) -> Result<(), Error> {
        Ok(())
    }
    /// The limits the backend declares.
    fn limits() -> Limits {
        Limits::new()
    }
    /// The release watcher, where the store notifies.
    fn watcher(_db: &Shared<Self>) -> Option<&dyn Watch> {
        None
    }
    /// The fair queue's places (see the `fair` module).
    fn queue(db: &Shared<Self>) -> &dyn Queue;
    /// Takes a free key.
    async fn acquire(db: &Shared<Self>, w: Write<'_>) -> DbResult<CasOutcome>;
    /// Takes several free keys at once, as `CasMulti::cas_multi` does,
    /// judging each key as [`acquire`](Self::acquire) does.
    async fn acquire_many(db: &Shared<Self>, m: Multi<'_>) -> DbResult<MultiOutcome>;
    /// Renews (`expected == w.new`) or transfers a hold of `expected`.
    async fn update(db: &Shared<Self>, w: Write<'_>, expected: &Token) -> DbResult<CasOutcome>;
    /// Releases `owner`'s hold.
    async fn delete(db: &Shared<Self>, key: &LockKey, owner: &Token) -> DbResult<bool>;
    /// The live hold of `key`.
    async fn inspect(db: &Shared<Self>, key: &LockKey) -> DbResult<Option<HolderInfo>>;
    /// The live holds under `prefix`, by key.
    async fn list(db: &Shared<Self>, prefix: &str) -> DbResult<Vec<HolderInfo>>;
    /// Renews every live hold of `items`.
    async fn renew_many(db: &Shared<Self>, items: &[RenewItem]) -> DbResult<Vec<bool>>;
    /// Sets the description of `owner`'s hold.
    async fn describe(db: &Shared<Self>, k: &LockKey, t: &Token, text: &str) -> DbResult<bool>;
    /// Makes every later fence of `key` exceed `minimum`.
    async fn raise_fence(db: &Shared<Self>, key: &LockKey, minimum: Fence) -> DbResult<()>;
}
