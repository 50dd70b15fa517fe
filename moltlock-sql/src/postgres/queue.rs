//! The fair queue's places (see the crate's `fair` module) in the table
//! `<table>_queue` beside the locks, numbered by a `bigserial`. One
//! statement per look (a read while the waiter's place has more than
//! three quarters of its time left), one for the head's acquisition (which takes its
//! place out when it takes the key), and one for a fair acquisition of a free key with
//! no places (the plain acquisition, writing only when no live place is
//! found).
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS "moltlock_locks_queue" (
//!     seq         bigserial   PRIMARY KEY,  -- arrival order
//!     key         text        NOT NULL,
//!     owner       text        NOT NULL,     -- the waiter's token
//!     alive_until timestamptz NOT NULL,     -- renewed by each look
//!     UNIQUE (key, owner)
//! );
//! ```

use std::time::Duration;

use async_trait::async_trait;
use moltlock_core::{CasOutcome, Error, LockKey, Token};

use super::{qualified, take, Pg};
use crate::config::SqlConfig;
use crate::convert::millis;
use crate::dialect::{DbResult, Queue, Shared, TurnWatch, Write};

/// The queue's statements, built once from validated names.
pub(super) struct QueueSql {
    /// Its `CREATE TABLE`.
    pub(super) ddl: String,
    occupied: String,
    /// The single acquisition, writing only when the key has no live
    /// place (store-clock mode).
    take: String,
    /// The single acquisition by the queue's head, which takes the head's
    /// place out in the same statement when it takes the key (store-clock
    /// mode).
    take_head: String,
    /// The single acquisition by a waiter a release named as the head:
    /// only while its place is live and no live place is ahead of it
    /// (store-clock mode), taking the place out as `take_head` does.
    take_named: String,
    look: String,
    leave: String,
}

impl QueueSql {
    pub(super) fn new(cfg: &SqlConfig) -> Result<Self, Error> {
        let table = cfg.checked_table()?;
        let schema = cfg.checked_schema()?;
        let named = |name: &str| qualified(schema, name);
        let (q, t, seq) = (
            named(&format!("{table}_queue")),
            named(table),
            named(&format!("{table}_fence")),
        );
        let logged = if cfg.unlogged { "UNLOGGED " } else { "" };
        let live = "p.key = $1 AND p.alive_until > now()";
        let ms = "$3::bigint * interval '1 millisecond'";
        let hold = format!(
            "SELECT $1::text, $2::text, nextval('{seq}'), now() + {ms}, now(), 1, $3::bigint"
        );
        let gone = format!(
            ", gone AS (DELETE FROM {q} WHERE key = $1 AND owner = $2 \
             AND EXISTS (SELECT 1 FROM ins))"
        );
        Ok(Self {
            ddl: format!(
                "CREATE {logged}TABLE IF NOT EXISTS {q} (seq bigserial PRIMARY KEY, \
                 key text NOT NULL, owner text NOT NULL, alive_until timestamptz NOT NULL, \
                 UNIQUE (key, owner))"
            ),
            occupied: format!("SELECT EXISTS (SELECT 1 FROM {q} p WHERE {live})"),
            take: take::single(
                &t,
                &format!("{hold} WHERE NOT EXISTS (SELECT 1 FROM {q} p WHERE {live})"),
                false,
                "",
            ),
            take_head: take::single(&t, &hold, false, &gone),
            take_named: take::single(
                &t,
                &format!(
                    "{hold} WHERE EXISTS (SELECT 1 FROM {q} me WHERE me.key = $1 \
                     AND me.owner = $2 AND me.alive_until > now() \
                     AND NOT EXISTS (SELECT 1 FROM {q} p WHERE {live} AND p.seq < me.seq))"
                ),
                false,
                &gone,
            ),
            // The snapshot does not show a row `put` writes, and the other
            // places it shows are judged alive by the clock, so `gone` needs
            // no ordering against the final read. A place with more than
            // three quarters of its time left is not written: the look is
            // then a read, with no commit to flush. A waiter looks again
            // within a third of its time (a head that skips looks, within a
            // quarter plus a third), so its place is written again before
            // it dies.
            look: format!(
                "WITH gone AS (DELETE FROM {q} WHERE key = $1 AND owner <> $2 AND alive_until <= now()), \
                 kept AS (SELECT seq FROM {q} WHERE key = $1 AND owner = $2 \
                 AND alive_until > now() + {ms} * 3 / 4), \
                 put AS (INSERT INTO {q} AS p (key, owner, alive_until) \
                 SELECT $1, $2, now() + {ms} WHERE NOT EXISTS (SELECT 1 FROM kept) \
                 ON CONFLICT (key, owner) DO UPDATE SET alive_until = EXCLUDED.alive_until \
                 RETURNING p.seq), \
                 me AS (SELECT seq FROM kept UNION ALL SELECT seq FROM put) \
                 SELECT count(*) FROM {q} p, me WHERE {live} AND p.owner <> $2 \
                 AND p.seq < me.seq"
            ),
            leave: format!("DELETE FROM {q} WHERE key = $1 AND owner = $2"),
        })
    }
}

/// # Cancel safety
/// Each call is one statement: dropped, it happened or not.
#[async_trait]
impl Queue for Shared<Pg> {
    async fn occupied(&self, key: &LockKey) -> DbResult<bool> {
        let mut conn = self.conn().await?;
        let occupied = sqlx::query_scalar(&self.dialect.queue.occupied)
            .bind(key.as_str())
            .fetch_one(&mut *conn)
            .await;
        Ok(conn.finish(occupied)?)
    }

    async fn look(&self, key: &LockKey, owner: &Token, live: Duration) -> DbResult<u64> {
        let mut conn = self.conn().await?;
        let ahead = sqlx::query_scalar(&self.dialect.queue.look)
            .bind(key.as_str())
            .bind(owner.as_str())
            .bind(millis(live))
            .fetch_one(&mut *conn)
            .await;
        let ahead: i64 = conn.finish(ahead)?;
        Ok(u64::try_from(ahead).unwrap_or(0))
    }

    async fn take_unqueued(&self, w: Write<'_>) -> DbResult<Option<CasOutcome>> {
        if self.observed.is_some() {
            return Ok(None);
        }
        Ok(Some(take::run(self, w, &self.dialect.queue.take).await?))
    }

    async fn watch_turn(&self, key: &LockKey, owner: &Token) -> Option<Result<TurnWatch, Error>> {
        Some(self.marking(key, Some(owner)).await.map(|m| TurnWatch {
            named: m.woke_named.clone(),
            watch: Box::new(m),
        }))
    }

    async fn take_head(&self, w: Write<'_>) -> DbResult<Option<CasOutcome>> {
        if self.observed.is_some() {
            return Ok(None);
        }
        Ok(Some(
            take::run(self, w, &self.dialect.queue.take_head).await?,
        ))
    }

    async fn take_named(&self, w: Write<'_>) -> DbResult<Option<CasOutcome>> {
        if self.observed.is_some() {
            return Ok(None);
        }
        Ok(Some(
            take::run(self, w, &self.dialect.queue.take_named).await?,
        ))
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
