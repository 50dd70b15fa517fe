//! Postgres: one conditional `INSERT … ON CONFLICT` per acquisition, expiry
//! judged by the database clock, fences from a sequence, wake-ups by
//! `LISTEN/NOTIFY`.
//!
//! # Schema
//!
//! Created on connect (unless [`SqlConfig::auto_migrate`] is off) or by
//! [`SqlBackend::migrate`], under a transaction-scoped advisory lock so
//! concurrent first connections do not race. [`PostgresBackend::ddl`] prints
//! it for operators who would rather create it themselves and give the
//! application only `SELECT, INSERT, UPDATE, DELETE` on the table and `USAGE`
//! on the sequence:
//!
//! ```sql
//! CREATE SEQUENCE IF NOT EXISTS "moltlock_locks_fence";
//! CREATE TABLE IF NOT EXISTS "moltlock_locks" (
//!     key         text        PRIMARY KEY,
//!     owner       text        NOT NULL,   -- '' once released
//!     fence       bigint      NOT NULL,
//!     expires_at  timestamptz NOT NULL,   -- the epoch once released
//!     acquired_at timestamptz NOT NULL,   -- the release time once released
//!     info        text,                   -- the holder's description
//!     version     bigint      NOT NULL DEFAULT 0,  -- bumped by every write
//!     ttl_ms      bigint      NOT NULL DEFAULT 0   -- the holder's TTL
//! );
//! ```
//!
//! # Guarantees and limits
//!
//! - Expiry compares `expires_at` with the server's `now()`; client clocks
//!   never enter into it.
//! - Fences: a fresh acquisition's fence is `max(the key's last fence + 1,
//!   nextval of the sequence)`. A release expires the row instead of
//!   deleting it, so the key's last fence is always there to exceed, even
//!   for a statement that drew its `nextval` before waiting on another
//!   acquisition's row lock. Fences of a key strictly increase across
//!   releases, expiry, client restarts and server restarts (after a crash a
//!   sequence may skip values, never repeat them).
//! - Retention: a row released or expired for longer than [`RETENTION`]
//!   is deleted (on connect, and after every 1,024th release of a backend),
//!   unless its fence is above the sequence (a stale draw can win through
//!   `GREATEST`; such a row stays until the sequence passes it). So the
//!   next `nextval` exceeds every deleted fence ([`RaiseFence::raise_fence`](moltlock_core::RaiseFence::raise_fence)
//!   moves the sequence too). A release writes the epoch as the expiry, so
//!   a released key is free whatever the database clock does next. Storage is one row (about 120 bytes plus the
//!   key) per key locked within the retention window.
//! - Waiters `LISTEN` on one channel per table over one connection per
//!   backend, opened before their first attempt; a release sends `NOTIFY` in
//!   the same statement. When that connection drops, every waiter is woken to
//!   look again and it reconnects by itself.
//! - Behind PgBouncer in transaction mode, `LISTEN` does not work (it needs a
//!   session): point [`SqlConfig`] at a session-mode pool or the server, or
//!   rely on polling (waiters still get the lock, only later). Every other
//!   statement is a single autocommit statement and works in transaction mode.
//! - Batch renewal: one `UPDATE … FROM unnest(…)` renews every hold of a
//!   manager.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use moltlock_core::{
    CasOutcome, Error, Fence, Held, HolderInfo, KeyEvents, Limits, LockKey, ReleaseWatch,
    RenewItem, Token, Watch,
};
use sqlx::postgres::{PgListener, PgPool};
use sqlx::Row;
use tokio::sync::OnceCell;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::backend::SqlBackend;
use crate::config::SqlConfig;
use crate::convert::{fence, holder_info, left_ms, millis, pool_options, RETENTION};
use crate::dialect::{DbResult, Ops, Shared};
use crate::error::map;
use crate::observe::Observed;

mod statements;

use statements::Statements;

/// Locks in a Postgres table. Clones share one pool and one listener.
pub type PostgresBackend = SqlBackend<Pg>;

/// The Postgres dialect of [`SqlBackend`]: its statements and its
/// `LISTEN` connection.
pub struct Pg {
    sql: Statements,
    channel: String,
    events: Arc<KeyEvents>,
    listener: OnceCell<JoinHandle<()>>,
}

impl Drop for Pg {
    fn drop(&mut self) {
        if let Some(task) = self.listener.get() {
            task.abort();
        }
    }
}

impl SqlBackend<Pg> {
    /// The DDL this backend needs, for operators who create it themselves.
    ///
    /// # Errors
    /// [`Error::Config`] for names that are not plain identifiers.
    pub fn ddl(cfg: &SqlConfig) -> Result<String, Error> {
        Ok(Statements::new(cfg)?.ddl.join(";\n") + ";")
    }
}

#[async_trait]
impl Ops for Pg {
    type Db = sqlx::Postgres;
    const NAME: &'static str = "postgres";
    const REPORTS_CLOCK: bool = true;
    const SWEEPS: bool = true;

    fn new(cfg: &SqlConfig) -> Result<Self, Error> {
        Ok(Self {
            sql: Statements::new(cfg)?,
            channel: format!("moltlock_{}", cfg.table),
            events: Arc::new(KeyEvents::new()),
            listener: OnceCell::new(),
        })
    }

    async fn open(cfg: &SqlConfig) -> Result<PgPool, sqlx::Error> {
        pool_options(cfg).connect(cfg.url()).await
    }

    async fn migrate(db: &Shared<Self>) -> DbResult<()> {
        let mut tx = db.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock(7243041107)")
            .execute(&mut *tx)
            .await?;
        for stmt in &db.dialect.sql.ddl {
            sqlx::query(stmt).execute(&mut *tx).await?;
        }
        Ok(tx.commit().await?)
    }

    async fn sweep(db: &Shared<Self>) -> DbResult<u64> {
        let done = sqlx::query(&db.dialect.sql.sweep)
            .bind(millis(RETENTION))
            .execute(&db.pool)
            .await?;
        Ok(done.rows_affected())
    }

    fn limits() -> Limits {
        Limits::new().with_min_ttl(Duration::from_millis(10))
    }

    fn watcher(db: &Shared<Self>) -> Option<&dyn Watch> {
        Some(db)
    }

    async fn acquire(
        db: &Shared<Self>,
        key: &LockKey,
        new: &Token,
        ttl: Duration,
    ) -> DbResult<CasOutcome> {
        if let Some(observed) = &db.observed {
            return acquire_observed(db, observed, key, new, ttl).await;
        }
        let sent_at = Instant::now();
        let row = sqlx::query(&db.dialect.sql.acquire)
            .bind(key.as_str())
            .bind(new.as_str())
            .bind(millis(ttl))
            .fetch_optional(&db.pool)
            .await?;
        let Some(row) = row else {
            return Ok(CasOutcome::Held(Held::default()));
        };
        saw_clock(db, sent_at, row.try_get(3)?);
        if let Some(f) = row.try_get::<Option<i64>, _>(0)? {
            return Ok(CasOutcome::Acquired { fence: fence(f) });
        }
        Ok(CasOutcome::Held(Held {
            holder: row.try_get::<Option<String>, _>(1)?.map(Token::from_stored),
            expires_in: left_ms(row.try_get(2)?),
            revision: None,
        }))
    }

    async fn update(
        db: &Shared<Self>,
        key: &LockKey,
        expected: &Token,
        new: &Token,
        ttl: Duration,
    ) -> DbResult<CasOutcome> {
        let transfer = expected != new;
        let sql = &db.dialect.sql;
        let mut query = sqlx::query(if transfer { &sql.transfer } else { &sql.renew })
            .bind(key.as_str())
            .bind(expected.as_str())
            .bind(millis(ttl));
        if transfer {
            query = query.bind(new.as_str());
        }
        let sent_at = Instant::now();
        let row = query.fetch_optional(&db.pool).await?;
        Ok(match row {
            Some(row) => {
                saw_clock(db, sent_at, row.try_get(1)?);
                CasOutcome::Acquired {
                    fence: fence(row.try_get(0)?),
                }
            }
            None => CasOutcome::Held(Held::default()),
        })
    }

    async fn delete(db: &Shared<Self>, key: &LockKey, owner: &Token) -> DbResult<bool> {
        let n: i64 = sqlx::query_scalar(&db.dialect.sql.delete)
            .bind(key.as_str())
            .bind(owner.as_str())
            .bind(&db.dialect.channel)
            .fetch_one(&db.pool)
            .await?;
        Ok(n > 0)
    }

    async fn inspect(db: &Shared<Self>, key: &LockKey) -> DbResult<Option<HolderInfo>> {
        let row = sqlx::query(&db.dialect.sql.inspect)
            .bind(key.as_str())
            .fetch_optional(&db.pool)
            .await?;
        Ok(row.map(|r| holder_info(&r)).transpose()?)
    }

    async fn list(db: &Shared<Self>, prefix: &str) -> DbResult<Vec<HolderInfo>> {
        let rows = sqlx::query(&db.dialect.sql.list)
            .bind(prefix)
            .fetch_all(&db.pool)
            .await?;
        Ok(rows.iter().map(holder_info).collect::<Result<_, _>>()?)
    }

    async fn renew_many(db: &Shared<Self>, items: &[RenewItem]) -> DbResult<Vec<bool>> {
        let keys: Vec<&str> = items.iter().map(|i| i.key.as_str()).collect();
        let owners: Vec<&str> = items.iter().map(|i| i.token.as_str()).collect();
        let ttls: Vec<i64> = items.iter().map(|i| millis(i.ttl)).collect();
        let sent_at = Instant::now();
        let rows = sqlx::query(&db.dialect.sql.renew_many)
            .bind(&keys)
            .bind(&owners)
            .bind(&ttls)
            .fetch_all(&db.pool)
            .await?;
        let mut renewed = HashSet::with_capacity(rows.len());
        for row in &rows {
            renewed.insert((row.try_get::<String, _>(0)?, row.try_get::<String, _>(1)?));
        }
        if let Some(row) = rows.first() {
            saw_clock(db, sent_at, row.try_get(2)?);
        }
        Ok(items
            .iter()
            .map(|i| renewed.contains(&(i.key.as_str().to_owned(), i.token.as_str().to_owned())))
            .collect())
    }

    async fn describe(
        db: &Shared<Self>,
        key: &LockKey,
        owner: &Token,
        description: &str,
    ) -> DbResult<bool> {
        let done = sqlx::query(&db.dialect.sql.describe)
            .bind(key.as_str())
            .bind(owner.as_str())
            .bind(description)
            .execute(&db.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Raises the key's last fence (and the sequence) to at least `floor`.
    async fn raise_fence(db: &Shared<Self>, key: &LockKey, floor: Fence) -> DbResult<()> {
        let floor = i64::try_from(floor.get())
            .map_err(|_| Error::Config(format!("fence floor {floor} exceeds bigint")))?;
        sqlx::query(&db.dialect.sql.raise)
            .bind(key.as_str())
            .bind(floor)
            .execute(&db.pool)
            .await?;
        Ok(())
    }
}

/// An acquisition in the observed-expiry mode: takes a released key, or one
/// whose holder this process saw unchanged for that holder's TTL.
async fn acquire_observed(
    db: &Shared<Pg>,
    observed: &Observed,
    key: &LockKey,
    new: &Token,
    ttl: Duration,
) -> DbResult<CasOutcome> {
    let (holder, version) = observed.ready(key.as_str()).unzip();
    let row = sqlx::query(&db.dialect.sql.acquire)
        .bind(key.as_str())
        .bind(new.as_str())
        .bind(millis(ttl))
        .bind(holder)
        .bind(version)
        .fetch_optional(&db.pool)
        .await?;
    let Some(row) = row else {
        observed.forget(key.as_str());
        return Ok(CasOutcome::Held(Held::default()));
    };
    if let Some(f) = row.try_get::<Option<i64>, _>(0)? {
        observed.forget(key.as_str());
        return Ok(CasOutcome::Acquired { fence: fence(f) });
    }
    let owner: String = row.try_get::<Option<String>, _>(1)?.unwrap_or_default();
    let version: i64 = row.try_get::<Option<i64>, _>(2)?.unwrap_or_default();
    let held_ttl = left_ms(row.try_get(3)?).unwrap_or(ttl);
    let left = observed.saw(key.as_str(), owner.clone(), version, held_ttl);
    Ok(CasOutcome::Held(Held {
        holder: Some(Token::from_stored(owner)),
        expires_in: Some(left),
        revision: None,
    }))
}

/// Feeds a reply's server clock (µs since the epoch) to the store clock.
fn saw_clock(db: &Shared<Pg>, sent_at: Instant, now_us: i64) {
    let us = u64::try_from(now_us).unwrap_or(0);
    db.saw_clock(sent_at, Duration::from_micros(us));
}

/// Waits for releases through `LISTEN`, on one connection per backend
/// opened by the first waiter.
///
/// # Cancel safety
/// A dropped future at most leaves the listening connection open for the
/// next waiter; no row is written.
#[async_trait]
impl Watch for Shared<Pg> {
    async fn watch(&self, key: &LockKey) -> Result<Box<dyn ReleaseWatch>, Error> {
        let pg = &self.dialect;
        pg.listener
            .get_or_try_init(|| async {
                let listener = subscribe(&self.pool, &pg.channel)
                    .await
                    .map_err(|e| map(Pg::NAME, e))?;
                let task = listen(
                    listener,
                    self.pool.clone(),
                    pg.channel.clone(),
                    pg.events.clone(),
                );
                Ok::<_, Error>(tokio::spawn(task))
            })
            .await?;
        Ok(pg.events.subscribe(key.as_str()))
    }
}

/// A connection that listens on `channel`.
async fn subscribe(pool: &PgPool, channel: &str) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(channel).await?;
    Ok(listener)
}

/// Dispatches notifications to waiters. When the connection drops, it opens
/// a new one itself and wakes every waiter twice: at once, and again once
/// the new connection listens — a release sent while nobody listened was
/// missed, and the woken waiters look for themselves.
async fn listen(mut listener: PgListener, pool: PgPool, channel: String, events: Arc<KeyEvents>) {
    loop {
        match listener.try_recv().await {
            Ok(Some(n)) => events.fire(n.payload()),
            Ok(None) | Err(_) => {
                tracing::debug!("listen connection lost; reconnecting");
                events.fire_all();
                listener = loop {
                    match subscribe(&pool, &channel).await {
                        Ok(l) => break l,
                        Err(e) => {
                            tracing::debug!(error = %e, "listen connection failed; retrying");
                            events.fire_all();
                            tokio::time::sleep(Duration::from_millis(250)).await;
                        }
                    }
                };
                events.fire_all();
            }
        }
    }
}
