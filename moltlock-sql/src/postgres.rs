//! Postgres: one conditional `INSERT … ON CONFLICT` per acquisition (and
//! a read of the holder when it is refused), expiry judged by the
//! database clock, fences from a sequence, wake-ups by `LISTEN/NOTIFY`.
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
//!     ttl_ms      bigint      NOT NULL DEFAULT 0,  -- the holder's TTL
//!     wait_until  timestamptz NOT NULL DEFAULT 'epoch'  -- a waiter's mark
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
//!   backend, opened before their first attempt. A release sends `NOTIFY`
//!   in the same statement, and only when a waiter marked the key: the
//!   notification's commit-time queue lock serialises every notifying
//!   commit of the database, so a release nobody waits for sends none.
//!   A waiting waiter keeps the row marked (`wait_until`, 10 s ahead by the
//!   database clock): before a wait it marks the row if the holder its
//!   attempt saw still holds it, and when it no longer does, the waiter
//!   looks again at once. So a release either came before the mark (and
//!   the waiter does not wait) or sees it and notifies: no wake-up is lost.
//!   While its mark lasts (less a second) a waiter waits without marking
//!   again, and a mark that another waiter made and that has 5 s left is
//!   read, not written: waiting costs about one write per key per 5 s, and
//!   a mark needs no removal. A step of the database clock by more than that can cost a
//!   waiter a notification (it then wakes by its retry policy or the hold's
//!   expiry). A table made before marks needs `migrate()` (or the
//!   add-column statement of [`PostgresBackend::ddl`]) when `auto_migrate`
//!   is off: connecting to a table without the column fails. Waiters of
//!   versions without marks are not woken by the releases of this one:
//!   upgrade a fleet's waiters first, or accept they poll meanwhile.
//!   When the listening connection drops, every waiter is woken to look
//!   again and it reconnects by itself. A release of a key whose fair
//!   queue has a live place names the queue's head in its notification:
//!   that waiter is woken at once and takes the key with its next
//!   statement, without looking at the queue first (the release's own read
//!   found it at the head); the key's other waiters are woken 20 ms later
//!   (at most once per 20 ms), so a release sets one fair waiter going, not
//!   the whole queue. Waiters of versions before this naming hear such a
//!   release only by their mark's expiry or retry policy.
//! - Behind PgBouncer in transaction mode, `LISTEN` does not work (it needs a
//!   session): point [`SqlConfig`] at a session-mode pool or the server, or
//!   rely on polling (waiters still get the lock, only later). Every other
//!   statement is a single autocommit statement and works in transaction mode.
//! - Batch renewal: one `UPDATE … FROM unnest(…)` renews every hold of a
//!   manager.
//! - Batch acquisition (`CasMulti`, the manager's `lock_all`, semaphores and
//!   read-write locks): one statement over `unnest($1::text[])` locks the
//!   keys' rows and takes all of them (or the first free one) with the
//!   single acquisition's expiry test and fences; see `take`.
//!
//! # Everything the backend takes
//!
//! This module also re-exports the settings ([`SqlConfig`], [`Expiry`]),
//! the generic [`SqlBackend`], the sqlx pool types `PostgresBackend::from_client`
//! takes ([`PgPool`] and the types that build one) and [`sqlx`] itself, so an
//! application needs no sqlx dependency of its own, of a matching version,
//! to hand its pool over.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use moltlock_core::{
    CasOutcome, Error, Fence, Held, HolderInfo, Limits, LockKey, MultiOutcome, ReleaseWatch,
    RenewItem, Token, Watch,
};
use sqlx::Row;
use tokio::time::Instant;

pub use crate::backend::SqlBackend;
pub use crate::config::{Expiry, SqlConfig};
use crate::convert::{execute, fence, holds, millis, pool_options, RETENTION};
use crate::dialect::{DbResult, Multi, Ops, Queue, Shared, Write};
use crate::error::map;
pub use sqlx;
pub use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

mod listen;
mod queue;
mod take;

use listen::Listener;

/// Locks in a Postgres table. Clones share one pool and one listener.
pub type PostgresBackend = SqlBackend<Pg>;

/// The Postgres dialect of [`SqlBackend`]: its statements and its
/// `LISTEN` connection.
pub struct Pg {
    sql: Statements,
    listener: Listener,
    queue: queue::QueueSql,
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
            listener: Listener::new(format!("moltlock_{}", cfg.table)),
            queue: queue::QueueSql::new(cfg)?,
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

    fn queue(db: &Shared<Self>) -> &dyn Queue {
        db
    }

    async fn acquire(db: &Shared<Self>, w: Write<'_>) -> DbResult<CasOutcome> {
        take::acquire(db, w).await
    }

    /// One statement over `unnest($1::text[])` (see `take`).
    async fn acquire_many(db: &Shared<Self>, m: Multi<'_>) -> DbResult<MultiOutcome> {
        take::acquire_many(db, m).await
    }

    async fn update(db: &Shared<Self>, w: Write<'_>, expected: &Token) -> DbResult<CasOutcome> {
        let Write { key, new, ttl } = w;
        let transfer = expected != new;
        let sql = &db.dialect.sql;
        let mut query = sqlx::query(if transfer { &sql.transfer } else { &sql.renew })
            .bind(key.as_str())
            .bind(expected.as_str())
            .bind(millis(ttl));
        if transfer {
            query = query.bind(new.as_str());
        }
        let mut conn = db.conn().await?;
        let sent_at = Instant::now();
        let row = query.fetch_optional(&mut *conn).await;
        Ok(match conn.finish(row)? {
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
        let mut conn = db.conn().await?;
        let released = sqlx::query(&db.dialect.sql.delete)
            .bind(key.as_str())
            .bind(owner.as_str())
            .bind(db.dialect.listener.channel())
            .fetch_optional(&mut *conn)
            .await;
        Ok(conn.finish(released)?.is_some())
    }

    async fn inspect(db: &Shared<Self>, key: &LockKey) -> DbResult<Option<HolderInfo>> {
        Ok(holds(&db.pool, &db.dialect.sql.inspect, key.as_str())
            .await?
            .pop())
    }

    async fn list(db: &Shared<Self>, prefix: &str) -> DbResult<Vec<HolderInfo>> {
        Ok(holds(&db.pool, &db.dialect.sql.list, prefix).await?)
    }

    async fn renew_many(db: &Shared<Self>, items: &[RenewItem]) -> DbResult<Vec<bool>> {
        let keys: Vec<&str> = items.iter().map(|i| i.key.as_str()).collect();
        let owners: Vec<&str> = items.iter().map(|i| i.token.as_str()).collect();
        let ttls: Vec<i64> = items.iter().map(|i| millis(i.ttl)).collect();
        let mut conn = db.conn().await?;
        let sent_at = Instant::now();
        let rows = sqlx::query(&db.dialect.sql.renew_many)
            .bind(&keys)
            .bind(&owners)
            .bind(&ttls)
            .fetch_all(&mut *conn)
            .await;
        let rows = conn.finish(rows)?;
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

    async fn describe(db: &Shared<Self>, k: &LockKey, t: &Token, text: &str) -> DbResult<bool> {
        let args = [k.as_str(), t.as_str(), text];
        Ok(execute(&db.pool, &db.dialect.sql.describe, &args).await? > 0)
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
        Ok(Box::new(self.marking(key, None).await?))
    }
}

impl Shared<Pg> {
    /// A watch of `key` that keeps its row marked while it waits; with
    /// `named`, it also hears the releases that name that fair waiter.
    async fn marking(
        &self,
        key: &LockKey,
        named: Option<&Token>,
    ) -> Result<listen::Marking, Error> {
        let listener = &self.dialect.listener;
        let (events, named) = listener
            .watch(&self.pool, key.as_str(), named.map(Token::as_str))
            .await
            .map_err(|e| map(Pg::NAME, e))?;
        Ok(listen::Marking {
            events,
            named,
            woke_named: Arc::default(),
            pool: self.pool.clone(),
            mark: self.dialect.sql.mark.clone(),
            key: key.as_str().to_owned(),
            marked_until: None,
        })
    }
}

/// The server clock in microseconds since the epoch, as replies report it.
const NOW_US: &str = "(extract(epoch FROM now()) * 1000000)::bigint";

/// The SQL of one table, built once from validated names.
struct Statements {
    acquire: take::Single,
    /// The batch acquisitions (see `take`).
    take_all: String,
    take_any: String,
    renew: String,
    transfer: String,
    delete: String,
    /// A waiter's mark (see the module docs).
    mark: Arc<str>,
    renew_many: String,
    raise: String,
    sweep: String,
    describe: String,
    inspect: String,
    list: String,
    ddl: Vec<String>,
}

/// `name` quoted, in `schema` when there is one.
fn qualified(schema: Option<&str>, name: &str) -> String {
    match schema {
        Some(s) => format!("\"{s}\".\"{name}\""),
        None => format!("\"{name}\""),
    }
}

/// Adds a column to a table made before it existed. Checked first:
/// `ALTER TABLE` takes the table's strongest lock even when it changes
/// nothing.
fn add_column(t: &str, column: &str, decl: &str) -> String {
    format!(
        "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_attribute \
         WHERE attrelid = '{t}'::regclass AND attname = '{column}' AND NOT attisdropped) \
         THEN ALTER TABLE {t} ADD COLUMN {column} {decl}; END IF; END $$"
    )
}

impl Statements {
    fn new(cfg: &SqlConfig) -> Result<Self, Error> {
        let table = cfg.checked_table()?;
        let schema = cfg.checked_schema()?;
        let q = |name: &str| qualified(schema, name);
        let (t, seq) = (q(table), q(&format!("{table}_fence")));
        let mut ddl = Vec::new();
        if let Some(s) = schema {
            ddl.push(format!("CREATE SCHEMA IF NOT EXISTS \"{s}\""));
        }
        ddl.push(format!("CREATE SEQUENCE IF NOT EXISTS {seq}"));
        let logged = if cfg.unlogged { "UNLOGGED " } else { "" };
        ddl.push(format!(
            "CREATE {logged}TABLE IF NOT EXISTS {t} (\n    key text PRIMARY KEY,\n    owner text NOT NULL,\n    \
             fence bigint NOT NULL,\n    expires_at timestamptz NOT NULL,\n    acquired_at timestamptz NOT NULL,\n    \
             info text,\n    version bigint NOT NULL DEFAULT 0,\n    ttl_ms bigint NOT NULL DEFAULT 0,\n    \
             wait_until timestamptz NOT NULL DEFAULT 'epoch'\n)"
        ));
        // Tables made before these columns existed.
        ddl.push(add_column(&t, "info", "text"));
        ddl.push(add_column(&t, "version", "bigint NOT NULL DEFAULT 0"));
        ddl.push(add_column(&t, "ttl_ms", "bigint NOT NULL DEFAULT 0"));
        ddl.push(add_column(
            &t,
            "wait_until",
            "timestamptz NOT NULL DEFAULT 'epoch'",
        ));
        ddl.push(queue::QueueSql::new(cfg)?.ddl);
        let observed = cfg.expiry == Expiry::Observed;
        let places = q(&format!("{table}_queue"));
        let mut sql = Self::build(&t, &seq, &places, ddl, observed);
        // Places of waiters gone for an hour, on keys nobody waited for since.
        sql.sweep = format!(
            "WITH places AS (DELETE FROM {places} WHERE alive_until < now() - $1::bigint * interval \
             '1 millisecond') {}",
            sql.sweep
        );
        Ok(sql)
    }

    /// One table serves both expiry modes, so nodes in different modes
    /// contend on the same rows: every write keeps `expires_at` (by the
    /// database clock, for store-clock nodes) and bumps `version` with the
    /// holder's `ttl_ms` (for observed-expiry nodes). The modes differ only
    /// in when a held row may be taken over and in which holds count as
    /// live: store-clock nodes judge by `expires_at`, observed-expiry nodes
    /// only by a released row or the `(owner, version)` pair `($4, $5)` they
    /// watched unchanged for its TTL (see `crate::observe`). A release
    /// clears the owner and sets `expires_at` to the epoch, so a released
    /// key is free whatever the clock does; `acquired_at` then records the
    /// release, for the sweep.
    fn build(t: &str, seq: &str, places: &str, ddl: Vec<String>, observed: bool) -> Self {
        let ms = "$3::bigint * interval '1 millisecond'";
        let live = match observed {
            false => "expires_at > now()",
            true => "owner <> ''",
        };
        let shown_left = match observed {
            false => take::LEFT,
            true => "NULL::bigint",
        };
        let values = format!("VALUES ($1, $2, nextval('{seq}'), now() + {ms}, now(), 1, $3)");
        let (take_all, take_any) = take::batch(t, seq, observed);
        Self {
            acquire: take::Single::new(t, &values, observed),
            take_all,
            take_any,
            renew: format!(
                "UPDATE {t} SET expires_at = now() + {ms}, version = version + 1, ttl_ms = $3 \
                 WHERE key = $1 AND owner = $2 AND {live} RETURNING fence, {NOW_US}"
            ),
            transfer: format!(
                "UPDATE {t} SET owner = $4, fence = GREATEST(fence + 1, nextval('{seq}')), \
                 info = NULL, acquired_at = now(), expires_at = now() + {ms}, \
                 version = version + 1, ttl_ms = $3 \
                 WHERE key = $1 AND owner = $2 AND {live} RETURNING fence, {NOW_US}"
            ),
            delete: listen::release(t, places, live),
            mark: listen::mark(t, live).into(),
            renew_many: format!(
                "UPDATE {t} AS l SET expires_at = now() + x.ms * interval '1 millisecond', \
                 version = l.version + 1, ttl_ms = x.ms \
                 FROM unnest($1::text[], $2::text[], $3::bigint[]) AS x(key, owner, ms) \
                 WHERE l.key = x.key AND l.owner = x.owner AND l.{live} \
                 RETURNING l.key, l.owner, {NOW_US}"
            ),
            // A max on the key's row (a released placeholder when the key has
            // none), and the sequence moved past the floor.
            raise: format!(
                "WITH s AS (SELECT setval('{seq}', GREATEST(last_value, $2)) FROM {seq}) \
                 INSERT INTO {t} AS l (key, owner, fence, expires_at, acquired_at) \
                 SELECT $1, '', $2, 'epoch', now() FROM s \
                 ON CONFLICT (key) DO UPDATE SET fence = GREATEST(l.fence, EXCLUDED.fence)"
            ),
            // Released or expired for the retention, and at or below the
            // sequence: the next `nextval` exceeds the deleted fence. (A
            // fence above the sequence — a stale draw that won through
            // `GREATEST` — keeps its row until the sequence passes it.)
            sweep: format!(
                "DELETE FROM {t} WHERE expires_at < now() - $1::bigint * interval '1 millisecond' \
                 AND wait_until < now() \
                 AND acquired_at < now() - $1::bigint * interval '1 millisecond' \
                 AND fence <= (SELECT last_value FROM {seq})"
            ),
            describe: format!(
                "UPDATE {t} SET info = $3 WHERE key = $1 AND owner = $2 AND owner <> '' AND {live}"
            ),
            inspect: format!(
                "SELECT key, owner, fence, {shown_left}, info FROM {t} \
                 WHERE key = $1 AND owner <> '' AND {live}"
            ),
            list: format!(
                "SELECT key, owner, fence, {shown_left}, info FROM {t} \
                 WHERE left(key, length($1)) = $1 AND owner <> '' AND {live} ORDER BY key"
            ),
            ddl,
        }
    }
}
