//! MySQL and MariaDB: `INSERT … ON DUPLICATE KEY UPDATE` conditioned on
//! expiry by the server's `UTC_TIMESTAMP(6)`.
//!
//! Each column's update is guarded by `expires_at <= UTC_TIMESTAMP(6)`, and
//! `expires_at` is assigned last, so the guard reads the old value for every
//! column. Times are stored in UTC whatever the session time zone.
//!
//! Every write reports its outcome in the server's reply, with no read
//! back: the statement passes the fence it wrote through `LAST_INSERT_ID(…)`,
//! whose argument the server returns as the statement's insert id. An insert
//! sets it to the new fence; an update that finds the key held sets it to
//! `0`, so an acquisition is one round trip, and only a refused one reads
//! who holds the key.
//!
//! Fences: MySQL has no sequences, so the fence of a hold is
//! `max(previous fence of the key + 1, server time in microseconds, floor + 1)`.
//! A release expires the key's row rather than deleting it, so the previous
//! fence is there for the next acquisition: fences of a key strictly
//! increase whatever the server's clock does while its row lives. A row
//! expired for longer than [`RETENTION`] (1 h) is swept (on connect and
//! after every 1,024th release); the next fence of that key rests on the
//! clock term, which exceeds the swept fence unless the server clock
//! stepped back by more than the retention. Storage: one row (about 200
//! bytes plus the key) per key locked within the retention.
//! [`RaiseFence::raise_fence`](moltlock_core::RaiseFence::raise_fence) records a per-key floor in a second table (used
//! only while migrating between stores); later fences of that key exceed it.
//! Waiters poll by the retry policy, sleeping no longer than the holder's
//! time left. Renewal takes one `UPDATE` and one read per 500 holds. A
//! batch acquisition (`CasMulti`) runs the single acquisition per key, for
//! `All` in one transaction (see `batch`).
//!
//! Exactness: owner tokens are compared byte for byte (`CAST(? AS BINARY)`),
//! whatever the table's collation. The key column's `utf8mb4_bin` collation
//! pads with spaces, so a key that ends with a space is refused with
//! [`Error::InvalidKey`] rather than taken as the same lock as the key
//! without it.
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS `moltlock_locks` (
//!     lock_key VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
//!     owner VARCHAR(128) NOT NULL, fence BIGINT UNSIGNED NOT NULL,
//!     expires_at DATETIME(6) NOT NULL, acquired_at DATETIME(6) NOT NULL) ENGINE=InnoDB;
//! CREATE TABLE IF NOT EXISTS `moltlock_locks_floor` (
//!     lock_key VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
//!     floor BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB;
//! ```
//!
//! # Everything the backend takes
//!
//! This module also re-exports the settings ([`SqlConfig`], [`Expiry`]),
//! the generic [`SqlBackend`], the sqlx pool types `MySqlBackend::from_client`
//! takes ([`MySqlPool`] and the types that build one) and [`sqlx`] itself, so an
//! application needs no sqlx dependency of its own, of a matching version,
//! to hand its pool over.

use std::collections::HashSet;
use std::time::Duration;

use async_trait::async_trait;
use moltlock_core::{
    CasOutcome, Error, Fence, Held, HolderInfo, LockKey, MultiOutcome, RenewItem, Token,
};
use sqlx::mysql::MySqlRow;
use sqlx::Row;

pub use crate::backend::SqlBackend;
pub use crate::config::{Expiry, SqlConfig};
use crate::convert::{execute, mark_live, micros, pool_options, ttl_chunks, RETENTION};
use crate::dialect::{DbResult, Multi, Ops, Queue, Shared, Write};
pub use sqlx;
pub use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};

mod batch;
mod queue;
mod sql;

use sql::{upsert, Statements, NOW};

/// Locks in a MySQL or MariaDB table. Clones share one pool.
pub type MySqlBackend = SqlBackend<MySql>;

/// The MySQL/MariaDB dialect of [`SqlBackend`]: its statements.
pub struct MySql {
    sql: Statements,
    queue: queue::QueueSql,
}

/// Refuses keys the key column cannot tell apart from others: its
/// `utf8mb4_bin` collation pads with spaces, so `"a"` and `"a "` would be
/// one lock.
fn check_key(key: &LockKey) -> Result<(), Error> {
    if key.as_str().ends_with(' ') {
        return Err(Error::invalid_key(
            key.as_str(),
            "MySQL/MariaDB compare keys ignoring trailing spaces; a key may not end with a space",
        ));
    }
    Ok(())
}

/// Holds renewed per statement: 500 `(key, owner)` pairs, 1,000 parameters.
const RENEW_CHUNK: usize = 500;

#[async_trait]
impl Ops for MySql {
    type Db = sqlx::MySql;
    const NAME: &'static str = "mysql";
    const REPORTS_CLOCK: bool = false;
    const SWEEPS: bool = true;
    /// The read of a refused `Any` batch's holders names every key once,
    /// well within MySQL's 65,535 parameters.
    const MAX_BATCH: usize = 10_000;

    /// Refuses `expiry=observed`: MySQL judges expiry by the server clock.
    fn new(cfg: &SqlConfig) -> Result<Self, Error> {
        Ok(Self {
            sql: Statements::new(cfg)?,
            queue: queue::QueueSql::new(cfg)?,
        })
    }

    async fn open(cfg: &SqlConfig) -> Result<MySqlPool, sqlx::Error> {
        pool_options(cfg).connect(cfg.url()).await
    }

    async fn migrate(db: &Shared<Self>) -> DbResult<()> {
        let queue = &db.dialect.queue.ddl;
        for stmt in db.dialect.sql.ddl.iter().chain([queue]) {
            sqlx::query(stmt).execute(&db.pool).await?;
        }
        Ok(add_info_column(db).await?)
    }

    /// A fence is at least the server clock in µs, so the next one exceeds
    /// a swept row's unless the server clock stepped back by more than the
    /// retention.
    async fn sweep(db: &Shared<Self>) -> DbResult<u64> {
        let done = sqlx::query(&db.dialect.sql.sweep)
            .bind(micros(RETENTION))
            .bind(micros(RETENTION))
            .execute(&db.pool)
            .await?;
        Ok(done.rows_affected())
    }

    fn check_key(key: &LockKey) -> Result<(), Error> {
        check_key(key)
    }

    fn queue(db: &Shared<Self>) -> &dyn Queue {
        db
    }

    /// One statement; only when the key is held, a read of who holds it.
    async fn acquire(db: &Shared<Self>, w: Write<'_>) -> DbResult<CasOutcome> {
        let mut conn = db.conn().await?;
        let sql = &db.dialect.sql.acquire;
        let taken = take(&mut *conn, sql, w.key, w.new, w.ttl, false).await;
        match conn.finish(taken)? {
            Some(fence) => Ok(CasOutcome::Acquired { fence }),
            None => Ok(held(read(db, w.key).await?)),
        }
    }

    /// `All`: the single acquisitions in one transaction; `Any`: one
    /// autocommit acquisition per key until one lands (see `batch`).
    async fn acquire_many(db: &Shared<Self>, m: Multi<'_>) -> DbResult<MultiOutcome> {
        batch::acquire_many(db, m).await
    }

    async fn update(db: &Shared<Self>, w: Write<'_>, expected: &Token) -> DbResult<CasOutcome> {
        let Write { key, new, ttl } = w;
        let sql = &db.dialect.sql;
        let query = if expected == new {
            sqlx::query(&sql.renew).bind(micros(ttl))
        } else {
            sqlx::query(&sql.transfer)
                .bind(key.as_str())
                .bind(new.as_str())
                .bind(micros(ttl))
        };
        let mut conn = db.conn().await?;
        let done = query
            .bind(key.as_str())
            .bind(expected.as_str())
            .execute(&mut *conn)
            .await;
        let done = conn.finish(done)?;
        Ok(match (done.rows_affected(), done.last_insert_id()) {
            (0, _) | (_, 0) => CasOutcome::Held(Held::default()),
            (_, fence) => CasOutcome::Acquired {
                fence: Fence(fence),
            },
        })
    }

    async fn delete(db: &Shared<Self>, key: &LockKey, owner: &Token) -> DbResult<bool> {
        let args = [key.as_str(), owner.as_str()];
        let mut conn = db.conn().await?;
        let deleted = execute(&mut *conn, &db.dialect.sql.delete, &args).await;
        Ok(conn.finish(deleted)? > 0)
    }

    async fn inspect(db: &Shared<Self>, key: &LockKey) -> DbResult<Option<HolderInfo>> {
        Ok(read(db, key).await?)
    }

    async fn list(db: &Shared<Self>, prefix: &str) -> DbResult<Vec<HolderInfo>> {
        let rows = sqlx::query(&db.dialect.sql.list)
            .bind(prefix)
            .bind(prefix)
            .fetch_all(&db.pool)
            .await?;
        let all: Vec<HolderInfo> = rows.iter().map(info).collect::<Result<_, _>>()?;
        // The padding collation also matches `"a"` for the prefix `"a "`.
        Ok(all
            .into_iter()
            .filter(|i| i.key.starts_with(prefix))
            .collect())
    }

    /// One `UPDATE` and one read per 500 holds of a TTL.
    async fn renew_many(db: &Shared<Self>, items: &[RenewItem]) -> DbResult<Vec<bool>> {
        let mut out = vec![false; items.len()];
        for (ttl, idx) in ttl_chunks(items, RENEW_CHUNK) {
            renew_chunk(db, ttl, items, &idx, &mut out).await?;
        }
        Ok(out)
    }

    /// MySQL counts rows changed, not matched: a description equal to the
    /// stored one changes nothing, so a read tells whether `owner` holds.
    async fn describe(db: &Shared<Self>, k: &LockKey, t: &Token, text: &str) -> DbResult<bool> {
        let args = [text, k.as_str(), t.as_str()];
        if execute(&db.pool, &db.dialect.sql.describe, &args).await? > 0 {
            return Ok(true);
        }
        let held = read(db, k).await?;
        Ok(held.is_some_and(|h| &h.holder == t))
    }

    /// Records `floor` for the key; every later acquisition or transfer of
    /// it takes a fence above the highest floor recorded.
    async fn raise_fence(db: &Shared<Self>, key: &LockKey, floor: Fence) -> DbResult<()> {
        sqlx::query(&db.dialect.sql.raise)
            .bind(key.as_str())
            .bind(floor.get())
            .execute(&db.pool)
            .await?;
        Ok(())
    }
}

/// Runs the acquisition statement `sql` of `key` on `conn`: the fence
/// taken, or `None` when nothing was written. With `minds_queue`, the
/// statement's look at the queue takes the key once more, last.
pub(super) async fn take<'c, E>(
    conn: E,
    sql: &str,
    key: &LockKey,
    new: &Token,
    ttl: Duration,
    minds_queue: bool,
) -> Result<Option<Fence>, sqlx::Error>
where
    E: sqlx::Executor<'c, Database = sqlx::MySql>,
{
    let mut query = sqlx::query(sql)
        .bind(key.as_str())
        .bind(new.as_str())
        .bind(key.as_str())
        .bind(micros(ttl));
    if minds_queue {
        query = query.bind(key.as_str());
    }
    let done = query.execute(conn).await?;
    Ok(match done.last_insert_id() {
        0 => None,
        fence => Some(Fence(fence)),
    })
}

fn info(row: &MySqlRow) -> Result<HolderInfo, sqlx::Error> {
    let left: Option<i64> = row.try_get(3)?;
    // A binary collation makes the key column read back as bytes.
    let key: Vec<u8> = row.try_get(0)?;
    let key = String::from_utf8(key).map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
    Ok(HolderInfo {
        key,
        holder: Token::from_stored(row.try_get::<String, _>(1)?),
        fence: Some(Fence(row.try_get::<u64, _>(2)?)),
        expires_in: left.map(|us| Duration::from_micros(u64::try_from(us).unwrap_or(0))),
        description: row.try_get(4)?,
    })
}

/// Adds the description column to a table made before it existed (MySQL
/// has no `ADD COLUMN IF NOT EXISTS`); a migration racing ours that added it
/// first is no error.
async fn add_info_column(db: &Shared<MySql>) -> Result<(), sqlx::Error> {
    let present: i64 = sqlx::query_scalar(&db.dialect.sql.has_info)
        .fetch_one(&db.pool)
        .await?;
    if present > 0 {
        return Ok(());
    }
    match sqlx::query(&db.dialect.sql.add_info)
        .execute(&db.pool)
        .await
    {
        Err(sqlx::Error::Database(e)) if e.message().contains("Duplicate column") => Ok(()),
        other => other.map(drop),
    }
}

async fn read(db: &Shared<MySql>, key: &LockKey) -> Result<Option<HolderInfo>, sqlx::Error> {
    let mut conn = db.conn().await?;
    let row = sqlx::query(&db.dialect.sql.read)
        .bind(key.as_str())
        .fetch_optional(&mut *conn)
        .await;
    conn.finish(row)?.map(|r| info(&r)).transpose()
}

/// Renews one run of holds sharing a TTL: one `UPDATE`, then one read of
/// which `(key, owner)` pairs are now live; marks those in `out`.
async fn renew_chunk(
    db: &Shared<MySql>,
    ttl: Duration,
    items: &[RenewItem],
    idx: &[usize],
    out: &mut [bool],
) -> Result<(), sqlx::Error> {
    let (update, select) = db.dialect.sql.renew_chunk(idx.len());
    let mut query = sqlx::query(&update).bind(micros(ttl));
    for &i in idx {
        query = query
            .bind(items[i].key.as_str())
            .bind(items[i].token.as_str());
    }
    query.execute(&db.pool).await?;
    let mut query = sqlx::query(&select);
    for &i in idx {
        query = query
            .bind(items[i].key.as_str())
            .bind(items[i].token.as_str());
    }
    let mut live = HashSet::new();
    for row in query.fetch_all(&db.pool).await? {
        // A binary collation makes the key column read back as bytes.
        let key = String::from_utf8_lossy(&row.try_get::<Vec<u8>, _>(0)?).into_owned();
        live.insert((key, row.try_get::<String, _>(1)?));
    }
    mark_live(items, idx, &live, out);
    Ok(())
}

/// A refused acquisition: held by whoever the read found (nobody, if the
/// hold ended in between).
fn held(row: Option<HolderInfo>) -> CasOutcome {
    CasOutcome::Held(match row {
        Some(info) => Held {
            holder: Some(info.holder),
            expires_in: info.expires_in,
            revision: None,
        },
        None => Held::default(),
    })
}
