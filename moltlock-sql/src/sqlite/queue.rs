//! The fair queue's places (see the crate's `fair` module) in the table
//! `<table>_queue` beside the locks, numbered by `AUTOINCREMENT` (never
//! reused). A look is one upsert and one read; dead places of the key are
//! deleted only when the read found some. A fair acquisition of a free key
//! with no places is one statement: the plain acquisition, writing only
//! when no live place is found.
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS "moltlock_locks_queue" (
//!     seq INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL,
//!     owner TEXT NOT NULL, alive_until INTEGER NOT NULL,  -- ms since the epoch
//!     UNIQUE (key, owner));
//! ```

use std::time::Duration;

use async_trait::async_trait;
use moltlock_core::{CasOutcome, Error, LockKey, Token};
use tokio::time::Instant;

use super::{judge, next_fence, upsert, Found, Sqlite, NOW};
use crate::config::SqlConfig;
use crate::convert::millis;
use crate::dialect::{DbResult, Queue, Shared, Write};

/// The queue's statements, built once from a validated name.
pub(super) struct QueueSql {
    /// Its `CREATE TABLE`.
    pub(super) ddl: String,
    occupied: String,
    /// The single acquisition, writing only when the key has no live
    /// place (store-clock mode).
    take: String,
    place: String,
    ahead: String,
    purge: String,
    leave: String,
}

impl QueueSql {
    pub(super) fn new(cfg: &SqlConfig) -> Result<Self, Error> {
        let name = cfg.checked_table()?;
        let (t, q) = (format!("\"{name}\""), format!("\"{name}_queue\""));
        let next = next_fence(&format!("\"{name}_fence\""));
        Ok(Self {
            ddl: format!(
                "CREATE TABLE IF NOT EXISTS {q} (seq INTEGER PRIMARY KEY AUTOINCREMENT, \
                 key TEXT NOT NULL, owner TEXT NOT NULL, alive_until INTEGER NOT NULL, \
                 UNIQUE (key, owner))"
            ),
            occupied: format!(
                "SELECT EXISTS (SELECT 1 FROM {q} WHERE key = ?1 AND alive_until > {NOW})"
            ),
            take: upsert(
                &t,
                &format!(
                    "SELECT ?1, ?2, {next}, {NOW} + ?3, {NOW}, 1, ?3 WHERE NOT EXISTS \
                     (SELECT 1 FROM {q} WHERE key = ?1 AND alive_until > {NOW})"
                ),
                &format!("{t}.expires_at < {NOW}"),
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

    async fn take_unqueued(&self, w: Write<'_>) -> DbResult<Option<CasOutcome>> {
        if self.observed.is_some() {
            return Ok(None);
        }
        let sent_at = Instant::now();
        let fence: Option<i64> = sqlx::query_scalar(&self.dialect.queue.take)
            .bind(w.key.as_str())
            .bind(w.new.as_str())
            .bind(millis(w.ttl))
            .fetch_optional(&self.pool)
            .await?;
        let found = match fence {
            Some(f) => Found::Taken(f),
            None => Found::Busy(None),
        };
        Ok(Some(judge(self, w, sent_at, found)?))
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
