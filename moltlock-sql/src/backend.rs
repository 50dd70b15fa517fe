//! The one SQL backend, generic over the dialect: connecting, the config
//! convention, error mapping at its edge, sweeps, and `impl Backend`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use moltlock_core::{
    hand_out, Backend, CasMulti, CasOutcome, Describe, Error, Fence, HolderInfo, Inspect, Limits,
    LockKey, MultiMode, MultiOutcome, RaiseFence, RenewItem, RenewMany, StoreClock, Token, Watch,
};

use crate::config::{Expiry, SqlConfig};
use crate::convert::SweepCounter;
use crate::dialect::{DbResult, Dialect, Multi, Shared, Write};
use crate::error::map;
use crate::kept::Kept;
use crate::multi;

/// Locks in a SQL table, over the dialect `D`; use the aliases
/// `PostgresBackend`, `SqliteBackend` and `MySqlBackend`. Clones share one pool (and, for
/// Postgres, one listener).
pub struct SqlBackend<D: Dialect> {
    pub(crate) inner: Arc<Shared<D>>,
}

impl<D: Dialect> Clone for SqlBackend<D> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<D: Dialect> std::fmt::Debug for SqlBackend<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlBackend")
            .field("dialect", &D::NAME)
            .finish_non_exhaustive()
    }
}

impl<D: Dialect> SqlBackend<D> {
    /// Connects with the settings and query parameters of `url`:
    /// `connect(SqlConfig::from_url(url)?)`.
    ///
    /// # Errors
    /// As [`SqlConfig::from_url`] and [`connect`](Self::connect).
    ///
    /// # Cancel safety
    /// As [`connect`](Self::connect).
    pub async fn from_url(url: &str) -> Result<Self, Error> {
        Self::connect(SqlConfig::from_url(url)?).await
    }

    /// Connects a pool with `cfg`, creates the schema unless
    /// [`SqlConfig::auto_migrate`] is off, and sweeps old rows.
    ///
    /// # Errors
    /// [`Error::Config`] for a bad URL or a table or schema name that is not
    /// a plain identifier (or `expiry=observed` on MySQL),
    /// [`Error::Unavailable`] when the server does not answer (or not within
    /// [`SqlConfig::connect_timeout`]), [`Error::Auth`] for refused
    /// credentials or a role that may not create the schema.
    ///
    /// # Cancel safety
    /// Dropping the future closes the connections opened so far. A schema
    /// migration cut off mid-way is rolled back where the database runs DDL
    /// in a transaction (Postgres, SQLite); on MySQL each table's
    /// `CREATE TABLE IF NOT EXISTS` either happened or not, and the next
    /// connect finishes the job. No hold is ever taken.
    pub async fn connect(cfg: SqlConfig) -> Result<Self, Error> {
        D::new(&cfg)?;
        let connecting = Self::open_retrying(&cfg);
        match cfg.connect_timeout {
            None => connecting.await,
            Some(limit) => tokio::time::timeout(limit, connecting).await.map_err(|_| {
                Error::unavailable(D::NAME, format!("not connected within {limit:?}"))
            })?,
        }
    }

    /// Opens, retrying while the database is busy (SQLite: processes
    /// opening a new file at once can find it locked while one of them
    /// switches it to WAL or creates the tables).
    async fn open_retrying(cfg: &SqlConfig) -> Result<Self, Error> {
        let until = D::OPEN_RETRY.map(|t| tokio::time::Instant::now() + t);
        loop {
            match Self::open(cfg).await {
                Err(e)
                    if e.is_retryable()
                        && until.is_some_and(|u| tokio::time::Instant::now() < u) =>
                {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                other => return other,
            }
        }
    }

    async fn open(cfg: &SqlConfig) -> Result<Self, Error> {
        let pool = D::open(cfg).await.map_err(|e| map(D::NAME, e))?;
        Self::start(pool, cfg, D::KEEPS).await
    }

    /// A backend on an application's existing pool (`PgPool`, `SqlitePool`,
    /// `MySqlPool`): the table, schema, expiry and migration settings of
    /// `cfg` apply (start from [`SqlConfig::default`]); its URL and pool
    /// settings do not. The pool stays the application's: the backend uses
    /// one of its connections per statement (and, on Postgres, one more
    /// for `LISTEN` once someone waits). SQLite: the pool's own journal
    /// mode and busy timeout apply; WAL and a busy timeout are advised for
    /// files shared between processes. A pool left at sqlx's default pings
    /// every connection it hands out, one more round trip per lock
    /// operation; the backend's own pools ping only connections idle for
    /// a second or more (`test_before_acquire(false)` with a
    /// `before_acquire` that pings on `idle_for`). sqlx's pool also pings
    /// every connection handed back to it: the backend's own Postgres and
    /// MySQL pools keep their lock statements' connections out of the pool
    /// between statements (see [`SqlConfig::max_connections`]); on the
    /// application's pool it keeps none.
    ///
    /// # Errors
    /// As [`connect`](Self::connect), less the connection errors a pool
    /// already has.
    ///
    /// # Cancel safety
    /// As [`connect`](Self::connect); the pool is left as it was.
    pub async fn from_client(pool: sqlx::Pool<D::Db>, cfg: SqlConfig) -> Result<Self, Error> {
        Self::start(pool, &cfg, false).await
    }

    /// `keep`: whether the pool is the backend's own, so it may keep
    /// connections out of it (see `kept`).
    async fn start(pool: sqlx::Pool<D::Db>, cfg: &SqlConfig, keep: bool) -> Result<Self, Error> {
        let backend = Self {
            inner: Arc::new(Shared {
                kept: Kept::new(pool.clone(), keep),
                pool,
                dialect: D::new(cfg)?,
                observed: (cfg.expiry == Expiry::Observed).then(Default::default),
                clock: StoreClock::new(),
                releases: SweepCounter::default(),
            }),
        };
        if cfg.auto_migrate {
            backend.migrate().await?;
        }
        backend.sweep().await?;
        Ok(backend)
    }

    /// Creates the schema if missing (Postgres: sequence, table and
    /// columns, under an advisory lock; SQLite: tables and triggers in one
    /// `BEGIN IMMEDIATE` transaction; MySQL: the tables and the
    /// description column). Idempotent and safe to run from many processes
    /// at once.
    ///
    /// # Errors
    /// Store errors, e.g. [`Error::Auth`] without `CREATE` privilege.
    ///
    /// # Cancel safety
    /// Postgres and SQLite run the migration in one transaction, rolled back
    /// if the future is dropped; MySQL's statements each either ran or did
    /// not, and running `migrate` again finishes the job.
    pub async fn migrate(&self) -> Result<(), Error> {
        self.run(D::migrate(&self.inner)).await
    }

    /// Deletes rows released or expired for longer than
    /// `RETENTION` (1 h), and on Postgres fair-queue places dead for as
    /// long; returns how many rows. Fences stay
    /// monotonic (see the dialect's module docs). SQLite deletes released
    /// rows at once and has nothing to sweep: 0.
    ///
    /// # Errors
    /// Store errors.
    ///
    /// # Cancel safety
    /// One `DELETE` statement: dropped, it deleted either every row it
    /// chose or none.
    pub async fn sweep(&self) -> Result<u64, Error> {
        self.run(D::sweep(&self.inner)).await
    }

    /// The pool, for tests and tools.
    pub fn pool(&self) -> &sqlx::Pool<D::Db> {
        &self.inner.pool
    }

    /// Maps a dialect step's failure, once for every operation.
    pub(crate) async fn run<T>(
        &self,
        step: impl std::future::Future<Output = DbResult<T>>,
    ) -> Result<T, Error> {
        step.await.map_err(|e| e.into_error(D::NAME))
    }

    /// Sweeps in the background after every 1,024th release.
    fn count_release(&self) {
        if !D::SWEEPS || !self.inner.releases.release_is_due() {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            if let Err(e) = this.sweep().await {
                tracing::debug!(error = %e, "sweeping expired rows failed");
            }
        });
    }
}

/// # Cancel safety
/// `cas` and `delete` are each one autocommit statement (SQLite: one
/// statement, plus a read of the holder after a refused acquisition;
/// MySQL: the same). A future dropped before the reply leaves the write
/// done or not done, never half: an acquisition that landed holds the key
/// until its TTL, as the manager's contract allows, and an SQLite statement
/// queued behind another writer may still land up to
/// [`Limits::late_write`](moltlock_core::Limits) after the drop.
#[async_trait]
impl<D: Dialect> Backend for SqlBackend<D> {
    async fn cas(
        &self,
        key: &LockKey,
        expected: Option<&Token>,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error> {
        D::check_key(key)?;
        check_longest(ttl)?;
        let (db, w) = (&self.inner, Write { key, new, ttl });
        match expected {
            None => self.run(D::acquire(db, w)).await,
            Some(expected) => self.run(D::update(db, w, expected)).await,
        }
    }

    async fn delete(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        D::check_key(key)?;
        let released = self.run(D::delete(&self.inner, key, owner)).await?;
        if released {
            self.count_release();
        }
        Ok(released)
    }

    fn name(&self) -> &'static str {
        D::NAME
    }

    fn limits(&self) -> Limits {
        D::limits()
    }

    fn store_clock(&self) -> Option<&StoreClock> {
        (D::REPORTS_CLOCK && self.inner.observed.is_none()).then_some(&self.inner.clock)
    }

    fn watcher(&self) -> Option<&dyn Watch> {
        D::watcher(&self.inner)
    }

    hand_out!(Inspect, RenewMany, Describe, RaiseFence, CasMulti, FairQueue);
}

/// A batch of one key is that key's single acquisition. Otherwise
/// Postgres: one statement for the whole batch (run again when another
/// session took a key under it). SQLite: one `BEGIN
/// IMMEDIATE` transaction of single acquisitions. MySQL: `All` in one
/// transaction of single acquisitions in key order, `Any` one autocommit
/// acquisition per key until one lands. Each key is judged exactly as
/// [`Backend::cas`] judges it (the database's clock, or the observed
/// expiry), and a busy key is reported as `cas` reports it.
///
/// # Cancel safety
/// Postgres: one statement, done or not. SQLite: the transaction runs to
/// its end on a task of its own. MySQL: an `All` transaction, too, runs to
/// its end on a task of its own; a dropped `Any` may have taken one key. As
/// the contract allows, whatever landed is owned by `token`.
#[async_trait]
impl<D: Dialect> CasMulti for SqlBackend<D> {
    async fn cas_multi(
        &self,
        keys: &[LockKey],
        token: &Token,
        ttl: Duration,
        mode: MultiMode,
    ) -> Result<MultiOutcome, Error> {
        for key in keys {
            D::check_key(key)?;
        }
        multi::check_distinct(keys)?;
        check_longest(ttl)?;
        if keys.is_empty() {
            return Ok(MultiOutcome::of_no_keys(mode));
        }
        let m = Multi {
            keys,
            new: token,
            ttl,
            mode,
        };
        match keys {
            // All or any of one key is that key: the single acquisition.
            [key] => {
                let one = self.run(D::acquire(&self.inner, m.write(key))).await?;
                Ok(multi::of_one(one))
            }
            _ => self.run(D::acquire_many(&self.inner, m)).await,
        }
    }

    fn max_keys(&self) -> usize {
        D::MAX_BATCH
    }
}

/// # Cancel safety
/// Reads only: a dropped future changes nothing.
#[async_trait]
impl<D: Dialect> Inspect for SqlBackend<D> {
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        D::check_key(key)?;
        self.run(D::inspect(&self.inner, key)).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<HolderInfo>, Error> {
        self.run(D::list(&self.inner, prefix)).await
    }
}

/// A batch with a TTL out of range is refused whole, before any
/// statement; a key this database cannot store (MySQL: a trailing space)
/// was never held here, and is answered `false` without being sent.
/// Postgres: one `UPDATE … FROM unnest(…)`. SQLite: one `BEGIN IMMEDIATE`
/// transaction (one fsync), one statement per 8,000 holds of a TTL. MySQL:
/// one `UPDATE` and one read per 500 holds of a TTL.
///
/// # Cancel safety
/// Postgres: one statement, done or not. SQLite: the transaction runs to
/// its end on a task of its own, so a dropped future never leaves it half
/// done on a pooled connection. MySQL: each run of 500 is its own
/// statement, so a dropped future may leave some runs renewed and others
/// not; renewal only extends holds their owners have, and the next renewal
/// covers the rest.
#[async_trait]
impl<D: Dialect> RenewMany for SqlBackend<D> {
    async fn renew_many(&self, items: &[RenewItem]) -> Result<Vec<bool>, Error> {
        for item in items {
            check_longest(item.ttl)?;
        }
        let storable: Vec<bool> = items.iter().map(|i| D::check_key(&i.key).is_ok()).collect();
        if storable.iter().all(|ok| *ok) {
            return self.run(D::renew_many(&self.inner, items)).await;
        }
        let sent: Vec<RenewItem> = items
            .iter()
            .zip(&storable)
            .filter(|(_, ok)| **ok)
            .map(|(item, _)| item.clone())
            .collect();
        let answers = match sent.is_empty() {
            true => Vec::new(),
            false => self.run(D::renew_many(&self.inner, &sent)).await?,
        };
        merge_unsent(answers, &storable).ok_or_else(|| {
            Error::store(
                D::NAME,
                "a renewal answered a different number of holds",
                false,
            )
        })
    }
}

/// MySQL counts rows changed, not matched: a description equal to the
/// stored one changes nothing, so a read tells whether `owner` holds.
///
/// # Cancel safety
/// One owner-checked `UPDATE`: dropped, the description is either written
/// or not.
#[async_trait]
impl<D: Dialect> Describe for SqlBackend<D> {
    async fn describe(&self, key: &LockKey, owner: &Token, text: &str) -> Result<bool, Error> {
        D::check_key(key)?;
        self.run(D::describe(&self.inner, key, owner, text)).await
    }
}

/// Postgres raises the key's last fence and the sequence; SQLite lifts the
/// one counter all keys draw fences from; MySQL records a per-key floor.
/// None ever lowers a fence.
///
/// # Cancel safety
/// One statement, which only raises: dropped, the floor is raised or not,
/// and raising it again is harmless.
#[async_trait]
impl<D: Dialect> RaiseFence for SqlBackend<D> {
    async fn raise_fence(&self, key: &LockKey, floor: Fence) -> Result<(), Error> {
        D::check_key(key)?;
        self.run(D::raise_fence(&self.inner, key, floor)).await
    }
}

/// The answer for each item: the next of `answers` where `sent`, else
/// `false`; `None` when `answers` is not one per item sent.
fn merge_unsent(answers: Vec<bool>, sent: &[bool]) -> Option<Vec<bool>> {
    if answers.len() != sent.iter().filter(|was| **was).count() {
        return None;
    }
    let mut answers = answers.into_iter();
    Some(
        sent.iter()
            .map(|was| *was && answers.next().unwrap_or(false))
            .collect(),
    )
}

/// Refuses a TTL above core's longest, as the manager does: past it the
/// expiry arithmetic in the statements overflows.
pub(crate) fn check_longest(ttl: Duration) -> Result<(), Error> {
    if ttl > moltlock_core::MAX_TTL {
        return moltlock_core::check_ttl(ttl, Duration::ZERO);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::merge_unsent;

    #[test]
    fn unsent_items_are_answered_false_in_place() {
        let sent = [false, true, false, true];
        assert_eq!(
            merge_unsent(vec![true, false], &sent),
            Some(vec![false, true, false, false])
        );
        assert_eq!(
            merge_unsent(vec![], &[false, false]),
            Some(vec![false, false])
        );
    }

    #[test]
    fn answers_that_do_not_match_the_items_sent_are_refused() {
        assert_eq!(merge_unsent(vec![true], &[true, false, true]), None);
        assert_eq!(merge_unsent(vec![true, true], &[false, true]), None);
    }
}
