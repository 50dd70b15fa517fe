//! The fair queue's places (see the crate's `fair` module) in the table
//! `<table>_queue` beside the locks, numbered by `AUTO_INCREMENT`. A look
//! is one upsert and one read; dead places of the key are deleted only
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
use moltlock_core::{Error, LockKey, Token};

use super::{MySql, NOW};
use crate::config::SqlConfig;
use crate::convert::micros;
use crate::dialect::{DbResult, Queue, Shared};

/// The queue's statements, built once from a validated name.
pub(super) struct QueueSql {
    /// Its `CREATE TABLE`.
    pub(super) ddl: String,
    occupied: String,
    place: String,
    ahead: String,
    purge: String,
    leave: String,
}

impl QueueSql {
    pub(super) fn new(cfg: &SqlConfig) -> Result<Self, Error> {
        let q = format!("`{}_queue`", cfg.checked_table()?);
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
        let found: i64 = sqlx::query_scalar(&self.dialect.queue.occupied)
            .bind(key.as_str())
            .fetch_one(&self.pool)
            .await?;
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

    async fn leave(&self, key: &LockKey, owner: &Token) -> DbResult<()> {
        sqlx::query(&self.dialect.queue.leave)
            .bind(key.as_str())
            .bind(owner.as_str())
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}
