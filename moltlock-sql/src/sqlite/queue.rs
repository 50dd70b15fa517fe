//! The fair queue's places (see the crate's `fair` module) in the table
//! `<table>_queue` beside the locks, numbered by `AUTOINCREMENT` (never
//! reused). A look is one upsert and one read; dead places of the key are
//! deleted only when the read found some.
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS "moltlock_locks_queue" (
//!     seq INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL,
//!     owner TEXT NOT NULL, alive_until INTEGER NOT NULL,  -- ms since the epoch
//!     UNIQUE (key, owner));
//! ```

use std::time::Duration;

use async_trait::async_trait;
use moltlock_core::{Error, LockKey, Token};

use super::{Sqlite, NOW};
use crate::config::SqlConfig;
use crate::convert::millis;
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
        let q = format!("\"{}_queue\"", cfg.checked_table()?);
        Ok(Self {
            ddl: format!(
                "CREATE TABLE IF NOT EXISTS {q} (seq INTEGER PRIMARY KEY AUTOINCREMENT, \
                 key TEXT NOT NULL, owner TEXT NOT NULL, alive_until INTEGER NOT NULL, \
                 UNIQUE (key, owner))"
            ),
            occupied: format!(
                "SELECT EXISTS (SELECT 1 FROM {q} WHERE key = ?1 AND alive_until > {NOW})"
            ),
            place: format!(
                "INSERT INTO {q} (key, owner, alive_until) VALUES (?1, ?2, {NOW} + ?3) \
                 ON CONFLICT (key, owner) DO UPDATE SET alive_until = excluded.alive_until \
                 RETURNING seq"
            ),
            // Live places ahead of `?3`, and dead places of others.
            ahead: format!(
                "SELECT coalesce(sum(alive_until > {NOW} AND seq < ?3), 0), \
                 coalesce(sum(alive_until <= {NOW}), 0) FROM {q} WHERE key = ?1 AND owner <> ?2"
            ),
            purge: format!(
                "DELETE FROM {q} WHERE key = ?1 AND owner <> ?2 AND alive_until <= {NOW}"
            ),
            leave: format!("DELETE FROM {q} WHERE key = ?1 AND owner = ?2"),
        })
    }
}

/// # Cancel safety
/// Each statement runs whole or not at all; a look dropped between its
/// statements has renewed its place and changed nothing else.
#[async_trait]
impl Queue for Shared<Sqlite> {
    async fn occupied(&self, key: &LockKey) -> DbResult<bool> {
        Ok(sqlx::query_scalar(&self.dialect.queue.occupied)
            .bind(key.as_str())
            .fetch_one(&self.pool)
            .await?)
    }

    async fn look(&self, key: &LockKey, owner: &Token, live: Duration) -> DbResult<u64> {
        let sql = &self.dialect.queue;
        let (key, owner) = (key.as_str(), owner.as_str());
        let seq: i64 = sqlx::query_scalar(&sql.place)
            .bind(key)
            .bind(owner)
            .bind(millis(live))
            .fetch_one(&self.pool)
            .await?;
        let (ahead, dead): (i64, i64) = sqlx::query_as(&sql.ahead)
            .bind(key)
            .bind(owner)
            .bind(seq)
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
