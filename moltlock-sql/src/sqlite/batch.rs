//! `CasMulti` for SQLite: the single acquisition statement, key after key,
//! in one `BEGIN IMMEDIATE` transaction. The transaction holds the
//! database's write lock from its first statement, so no other writer
//! comes between the keys, and readers see the batch only once it commits:
//! an `All` batch that meets a busy key rolls back, so nobody ever sees a
//! part of it held. Every key is judged as a single `cas` judges it (by
//! SQLite's clock, or the observed expiry) and its fence comes from the
//! same counter, so fences rise per key past any raised minimum. One
//! fsync per batch.

use std::time::Duration;

use moltlock_core::{Error, LockKey, MultiMode, MultiOutcome, Token};
use sqlx::sqlite::SqlitePool;
use tokio::time::Instant;

use super::{attempt, judge, Found, Sqlite, Statements};
use crate::dialect::{DbResult, Multi, Ops, Shared};
use crate::multi::{write_order, Tally};

/// One batch, owned, so that it runs to its end on a task of its own: a
/// caller that gives up never leaves the transaction half done on a
/// pooled connection.
struct Job {
    pool: SqlitePool,
    sql: Statements,
    keys: Vec<LockKey>,
    new: Token,
    ttl: Duration,
    mode: MultiMode,
    /// Per key, the `(holder, version)` a takeover may name (observed
    /// expiry).
    ready: Vec<Option<(String, i64)>>,
}

/// Takes `m.keys` in one transaction; see the module docs.
pub(super) async fn acquire_many(db: &Shared<Sqlite>, m: Multi<'_>) -> DbResult<MultiOutcome> {
    let ready = m
        .keys
        .iter()
        .map(|k| db.observed.as_ref().and_then(|o| o.ready(k.as_str())))
        .collect();
    let job = Job {
        pool: db.pool.clone(),
        sql: db.dialect.sql.clone(),
        keys: m.keys.to_vec(),
        new: m.new.clone(),
        ttl: m.ttl,
        mode: m.mode,
        ready,
    };
    let sent_at = Instant::now();
    let found = tokio::spawn(job.run())
        .await
        .map_err(|e| Error::store(Sqlite::NAME, e, false))??;
    let mut tally = Tally::new(m.mode);
    for (i, f) in found {
        if let Some(key) = m.keys.get(i) {
            tally.add(i, judge(db, m.write(key), sent_at, f)?);
        }
    }
    Ok(tally.finish())
}

impl Job {
    /// What the batch found, per key index: every key taken (`All`, then
    /// committed), the one busy key that rolled an `All` back, or the busy
    /// keys an `Any` met before (if at all) the one it took.
    async fn run(self) -> Result<Vec<(usize, Found)>, sqlx::Error> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let mut found = Vec::with_capacity(self.keys.len());
        for i in write_order(&self.keys, self.mode) {
            let (key, ready) = (&self.keys[i], self.ready[i].clone());
            let f = attempt(&mut tx, &self.sql, key, &self.new, self.ttl, ready).await?;
            let taken = matches!(f, Found::Taken(_));
            match (self.mode, taken) {
                (MultiMode::All, false) => {
                    tx.rollback().await?;
                    return Ok(vec![(i, f)]);
                }
                (MultiMode::Any, true) => {
                    found.push((i, f));
                    break;
                }
                _ => found.push((i, f)),
            }
        }
        tx.commit().await?;
        Ok(found)
    }
}
