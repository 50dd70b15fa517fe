//! `CasMulti` for MySQL and MariaDB, built from the single acquisition
//! statement so that every key is judged by the server's clock and fenced
//! exactly as a single `cas` would (above the key's last fence, the clock
//! in µs and its raised minimum).
//!
//! `All`: one transaction of the single acquisitions, in key order (so two
//! batches over common keys lock rows in one order). Each statement locks
//! its row until the transaction ends; the first refused key rolls the
//! whole transaction back, and InnoDB shows other sessions none of its
//! rows before the commit, so nobody ever sees a part of the set held.
//! Round trips: `BEGIN`, one per key, `COMMIT` (n + 2); a refusal at the
//! j-th key in key order: `BEGIN`, j statements, `ROLLBACK` and the read of
//! its holder (j + 3).
//!
//! `Any`: one autocommit acquisition per key in the order given until one
//! lands (j round trips for the j-th key), else one read of every key's
//! holder (n + 1). Only one key ever changes, so no transaction is needed,
//! and none is taken: refused statements would keep their rows locked to
//! its end, and batches naming keys in different orders would deadlock.

use std::collections::HashMap;
use std::time::Duration;

use moltlock_core::{
    CasOutcome, Error, Fence, HolderInfo, LockKey, MultiMode, MultiOutcome, Token,
};
use sqlx::mysql::MySqlConnection;
use sqlx::Connection;

use super::{held, info, read, take, MySql};
use crate::dialect::{DbResult, Multi, Ops, Shared};
use crate::kept::Kept;
use crate::multi::{write_order, Tally};

/// Takes `m.keys`; see the module docs.
pub(super) async fn acquire_many(db: &Shared<MySql>, m: Multi<'_>) -> DbResult<MultiOutcome> {
    match m.mode {
        MultiMode::All => all(db, m).await,
        MultiMode::Any => any(db, m).await,
    }
}

async fn all(db: &Shared<MySql>, m: Multi<'_>) -> DbResult<MultiOutcome> {
    let job = AllJob {
        kept: db.kept.clone(),
        acquire: db.dialect.sql.acquire.clone(),
        keys: m.keys.to_vec(),
        new: m.new.clone(),
        ttl: m.ttl,
    };
    let done = tokio::spawn(job.run())
        .await
        .map_err(|e| Error::store(MySql::NAME, e, false))??;
    let mut tally = Tally::new(MultiMode::All);
    match done {
        Ok(taken) => {
            for (i, fence) in taken {
                tally.add(i, CasOutcome::Acquired { fence });
            }
        }
        Err(busy) => {
            if let Some(key) = m.keys.get(busy) {
                tally.add(busy, held(read(db, key).await?));
            }
        }
    }
    Ok(tally.finish())
}

/// An `All` batch, owned, so that its transaction runs to its end on a
/// task of its own: a caller that gives up never leaves row locks behind
/// on a pooled connection.
struct AllJob {
    kept: Kept<sqlx::MySql>,
    acquire: String,
    keys: Vec<LockKey>,
    new: Token,
    ttl: Duration,
}

impl AllJob {
    /// Every key's fence (committed), or the index of the first key found
    /// held (rolled back).
    async fn run(self) -> Result<Result<Vec<(usize, Fence)>, usize>, sqlx::Error> {
        let mut conn = self.kept.conn().await?;
        let done = self.take_all(&mut conn).await;
        conn.finish(done)
    }

    /// The batch's transaction on `conn`.
    async fn take_all(
        &self,
        conn: &mut MySqlConnection,
    ) -> Result<Result<Vec<(usize, Fence)>, usize>, sqlx::Error> {
        let mut tx = conn.begin().await?;
        let mut taken = Vec::with_capacity(self.keys.len());
        for i in write_order(&self.keys, MultiMode::All) {
            let key = &self.keys[i];
            match take(&mut *tx, &self.acquire, key, &self.new, self.ttl, false).await? {
                Some(fence) => taken.push((i, fence)),
                None => {
                    tx.rollback().await?;
                    return Ok(Err(i));
                }
            }
        }
        tx.commit().await?;
        Ok(Ok(taken))
    }
}

async fn any(db: &Shared<MySql>, m: Multi<'_>) -> DbResult<MultiOutcome> {
    let sql = &db.dialect.sql;
    for (i, key) in m.keys.iter().enumerate() {
        let mut conn = db.conn().await?;
        let taken = take(&mut *conn, &sql.acquire, key, m.new, m.ttl, false).await;
        if let Some(fence) = conn.finish(taken)? {
            return Ok(MultiOutcome::Acquired(vec![(i, fence)]));
        }
    }
    let mut holders = read_all(db, m.keys).await?;
    let mut tally = Tally::new(MultiMode::Any);
    for (i, key) in m.keys.iter().enumerate() {
        tally.add(i, held(holders.remove(key.as_str())));
    }
    Ok(tally.finish())
}

/// The live holds of `keys`, by key, in one read.
async fn read_all(
    db: &Shared<MySql>,
    keys: &[LockKey],
) -> Result<HashMap<String, HolderInfo>, sqlx::Error> {
    let list = vec!["?"; keys.len()].join(", ");
    let sql = format!("{}{list})", db.dialect.sql.read_in);
    let mut query = sqlx::query(&sql);
    for key in keys {
        query = query.bind(key.as_str());
    }
    let mut out = HashMap::with_capacity(keys.len());
    let mut conn = db.conn().await?;
    let rows = query.fetch_all(&mut *conn).await;
    for row in conn.finish(rows)? {
        let hold = info(&row)?;
        out.insert(hold.key.clone(), hold);
    }
    Ok(out)
}
