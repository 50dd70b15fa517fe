//! The fair queue's places (see the crate's `fair` module) in the table
//! `<table>_queue` beside the locks, numbered by `AUTO_INCREMENT`. A free
//! key with no live place is taken in one statement, the plain
//! acquisition fed by a `SELECT` that yields no row while a place lives. A
//! look is one upsert and one read; dead places of the key are deleted only
//! when the read found some (a range delete takes gap locks, so it stays
//! off the common path).
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS `moltlock_locks_queue` (
//!     seq BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
//!     lock_key VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
//!     owner VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
//!     alive_until DATETIME(6) NOT NULL,
//!     UNIQUE KEY (lock_key, owner)) ENGINE=InnoDB;
//! ```

use std::time::Duration;

use async_trait::async_trait;
use moltlock_core::{CasOutcome, Error, Held, LockKey, Token};

use super::{take, upsert, MySql, NOW};
use crate::config::SqlConfig;
use crate::convert::micros;
use crate::dialect::{DbResult, Queue, Shared, Write};

/// The queue's statements, built once from a validated name.
pub(super) struct QueueSql {
    /// Its `CREATE TABLE`.
    pub(super) ddl: String,
    occupied: String,
    /// The acquisition of a key with no live place (see `take_unqueued`).
    take: String,
    place: String,
    ahead: String,
    purge: String,
    leave: String,
}

impl QueueSql {
    pub(super) fn new(cfg: &SqlConfig) -> Result<Self, Error> {
        let name = cfg.checked_table()?;
        let q = format!("`{name}_queue`");
        let bin = "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL";
        Ok(Self {
            ddl: format!(
                "CREATE TABLE IF NOT EXISTS {q} (seq BIGINT UNSIGNED NOT NULL AUTO_INCREMENT \
                 PRIMARY KEY, lock_key VARCHAR(256) {bin}, owner VARCHAR(128) {bin}, \
                 alive_until DATETIME(6) NOT NULL, UNIQUE KEY (lock_key, owner)) ENGINE=InnoDB"
            ),
            occupied: format!(
                "SELECT EXISTS (SELECT 1 FROM {q} WHERE lock_key = ? AND alive_until > {NOW})"
            ),
            // A live place makes the `SELECT` yield no row: nothing is
            // written, and the insert id is 0.
            take: upsert(
                name,
                "SELECT ",
                &format!(
                    " FROM DUAL WHERE NOT EXISTS (SELECT 1 FROM {q} \
                     WHERE lock_key = ? AND alive_until > {NOW})"
                ),
            ),
            // `LAST_INSERT_ID(seq)` reports the place's number when it
            // already existed, too.
            place: format!(
                "INSERT INTO {q} (lock_key, owner, alive_until) \
                 VALUES (?, ?, {NOW} + INTERVAL ? MICROSECOND) \
                 ON DUPLICATE KEY UPDATE alive_until = VALUES(alive_until), \
                 seq = LAST_INSERT_ID(seq)"
            ),
            // Live places ahead of the waiter's, and dead places of others.
            ahead: format!(
                "SELECT CAST(COALESCE(SUM(alive_until > {NOW} AND seq < ?), 0) AS SIGNED), \
                 CAST(COALESCE(SUM(alive_until <= {NOW}), 0) AS SIGNED) \
                 FROM {q} WHERE lock_key = ? AND owner <> ?"
            ),
            purge: format!(
                "DELETE FROM {q} WHERE lock_key = ? AND owner <> ? AND alive_until <= {NOW}"
            ),
            leave: format!("DELETE FROM {q} WHERE lock_key = ? AND owner = ?"),
        })
    }
}

/// # Cancel safety
/// Each statement runs whole or not at all; a look dropped between its
/// statements has renewed its place and changed nothing else.
#[async_trait]
impl Queue for Shared<MySql> {
    async fn occupied(&self, key: &LockKey) -> DbResult<bool> {
        let mut conn = self.conn().await?;
        let found = sqlx::query_scalar(&self.dialect.queue.occupied)
            .bind(key.as_str())
            .fetch_one(&mut *conn)
            .await;
        let found: i64 = conn.finish(found)?;
        Ok(found != 0)
    }

    async fn look(&self, key: &LockKey, owner: &Token, live: Duration) -> DbResult<u64> {
        let sql = &self.dialect.queue;
        let (key, owner) = (key.as_str(), owner.as_str());
        let placed = sqlx::query(&sql.place)
            .bind(key)
            .bind(owner)
            .bind(micros(live))
            .execute(&self.pool)
            .await?;
        let seq = placed.last_insert_id();
        let (ahead, dead): (i64, i64) = sqlx::query_as(&sql.ahead)
            .bind(seq)
            .bind(key)
            .bind(owner)
            .fetch_one(&self.pool)
            .await?;
        if dead > 0 {
            sqlx::query(&sql.purge)
                .bind(key)
                .bind(owner)
                .execute(&self.pool)
                .await?;
        }
        Ok(u64::try_from(ahead).unwrap_or(0))
    }

    /// One statement: the plain acquisition, whose new row comes from a
    /// `SELECT` that yields none while the key has a live place. At the
    /// default isolation level (`REPEATABLE READ`) the statement reads the
    /// queue with a shared lock on the key's range of places, so no place
    /// can be taken between its look and its write; under `READ COMMITTED`
    /// it reads a snapshot, and a place taken in that instant is passed
    /// once, as a plain `lock()` may pass it. Binary logging in the
    /// `STATEMENT` format flags the statement as unsafe (an `INSERT …
    /// SELECT … ON DUPLICATE KEY UPDATE`) and warns on each one; the
    /// `MIXED` (MariaDB's default) and `ROW` formats log its rows.
    async fn take_unqueued(&self, w: Write<'_>) -> DbResult<Option<CasOutcome>> {
        let sql = &self.dialect.queue.take;
        let mut conn = self.conn().await?;
        let taken = take(&mut *conn, sql, w.key, w.new, w.ttl, true).await;
        let taken = conn.finish(taken)?;
        Ok(Some(match taken {
            Some(fence) => CasOutcome::Acquired { fence },
            None => CasOutcome::Held(Held::default()),
        }))
    }

    async fn leave(&self, key: &LockKey, owner: &Token) -> DbResult<()> {
        let mut conn = self.conn().await?;
        let left = sqlx::query(&self.dialect.queue.leave)
            .bind(key.as_str())
            .bind(owner.as_str())
            .execute(&mut *conn)
            .await;
        conn.finish(left)?;
        Ok(())
    }
}
