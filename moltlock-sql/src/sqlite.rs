//! SQLite: the same contract in one database file, so the processes of one
//! machine share locks with no server. The embedded default of the CLI.
//!
//! Every write is one statement, which SQLite runs as a transaction of its
//! own that takes the write lock before it reads anything (so no write works
//! on a stale snapshot); a batch of renewals shares one `BEGIN IMMEDIATE`
//! transaction, and so does a batch acquisition (`CasMulti`). WAL
//! journaling and a busy timeout. Expiry is judged by SQLite's own clock (`julianday('now')`, whole
//! ms, shared by every process on the machine); a hold ends once it reads past `expires_at`.
//! Fences come from a one-row counter table that a trigger advances in the
//! same statement as the acquisition, and are at least the clock in µs, so
//! they stay above fences whose commits an OS crash lost (`synchronous` is
//! `NORMAL`: a process crash loses nothing, a power cut may lose the last
//! commits); released rows are deleted and the counter keeps the history. Waiters poll by the retry policy (SQLite has no
//! cross-process notifications), sleeping no longer than the holder's time
//! left.
//!
//! The locks table is `WITHOUT ROWID` (a write changes one B-tree page, not
//! a row's and its key index's); a rowid table made before still serves.
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS "moltlock_locks" (
//!     key TEXT PRIMARY KEY, owner TEXT NOT NULL, fence INTEGER NOT NULL,
//!     expires_at INTEGER NOT NULL, acquired_at INTEGER NOT NULL,   -- ms since the epoch
//!     info TEXT, version INTEGER NOT NULL DEFAULT 0, ttl_ms INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;
//! CREATE TABLE IF NOT EXISTS "moltlock_locks_fence" (
//!     id INTEGER PRIMARY KEY CHECK (id = 1), value INTEGER NOT NULL);
//! ```
//!
//! # Everything the backend takes
//!
//! This module also re-exports the settings ([`SqlConfig`], [`Expiry`]),
//! the generic [`SqlBackend`], the sqlx pool types `SqliteBackend::from_client`
//! takes ([`SqlitePool`] and the types that build one) and [`sqlx`] itself, so an
//! application needs no sqlx dependency of its own, of a matching version,
//! to hand its pool over.

use std::collections::HashSet;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use moltlock_core::{
    CasOutcome, Error, Fence, Held, HolderInfo, Limits, LockKey, MultiOutcome, RenewItem, Token,
};
use sqlx::sqlite::{SqliteConnection, SqliteJournalMode, SqliteRow, SqliteSynchronous};
use sqlx::Row;
use tokio::time::Instant;

pub use crate::backend::SqlBackend;
pub use crate::config::{Expiry, SqlConfig};
use crate::convert::{self, execute, holds, left_ms, mark_live, millis, pool_options, ttl_chunks};
use crate::dialect::{DbResult, Multi, Ops, Queue, Shared, Write};
pub use sqlx;
pub use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};

mod batch;
mod queue;

/// Locks in an SQLite database file. Clones share one pool.
pub type SqliteBackend = SqlBackend<Sqlite>;

/// The SQLite dialect of [`SqlBackend`]: its statements.
pub struct Sqlite {
    sql: Statements,
    queue: queue::QueueSql,
}

/// Holds renewed per statement: 16,001 parameters (SQLite allows 32,766).
const RENEW_CHUNK: usize = 8_000;
/// How long a statement waits for another process's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

#[async_trait]
impl Ops for Sqlite {
    type Db = sqlx::Sqlite;
    const NAME: &'static str = "sqlite";
    const REPORTS_CLOCK: bool = true;
    const SWEEPS: bool = false;
    const KEEPS: bool = false;
    const OPEN_RETRY: Option<Duration> = Some(BUSY_TIMEOUT);

    fn new(cfg: &SqlConfig) -> Result<Self, Error> {
        Ok(Self {
            sql: Statements::new(cfg)?,
            queue: queue::QueueSql::new(cfg)?,
        })
    }

    /// Opens (creating if missing) the file at `sqlite://path` or a bare
    /// path, in WAL mode with a busy timeout.
    async fn open(cfg: &SqlConfig) -> Result<SqlitePool, sqlx::Error> {
        let url = match cfg.url().starts_with("sqlite:") {
            true => cfg.url().to_owned(),
            false => format!("sqlite://{}", cfg.url()),
        };
        let opts = SqliteConnectOptions::from_str(&url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(BUSY_TIMEOUT);
        pool_options(cfg).connect_with(opts).await
    }

    async fn migrate(db: &Shared<Self>) -> DbResult<()> {
        let sql = &db.dialect.sql;
        let mut tx = db.pool.begin_with("BEGIN IMMEDIATE").await?;
        for stmt in &sql.ddl {
            sqlx::query(stmt).execute(&mut *tx).await?;
        }
        // Tables made before some columns existed (inside the same write
        // transaction, so two processes cannot both add the column).
        for (has, add) in &sql.columns {
            let present: i64 = sqlx::query_scalar(has).fetch_one(&mut *tx).await?;
            if present == 0 {
                sqlx::query(add).execute(&mut *tx).await?;
            }
        }
        Ok(tx.commit().await?)
    }

    fn queue(db: &Shared<Self>) -> &dyn Queue {
        db
    }

    fn limits() -> Limits {
        Limits::new()
            // A statement queued behind another writer lands up to the busy
            // timeout after its future was dropped.
            .with_late_write(BUSY_TIMEOUT + Duration::from_secs(1))
    }

    /// One statement; only when the key is held, a second one reads who
    /// holds it (a report for the waiter, not part of the decision).
    async fn acquire(db: &Shared<Self>, w: Write<'_>) -> DbResult<CasOutcome> {
        let ready = db.observed.as_ref().and_then(|o| o.ready(w.key.as_str()));
        let sent_at = Instant::now();
        let mut conn = db.pool.acquire().await?;
        let found = attempt(&mut conn, &db.dialect.sql, w.key, w.new, w.ttl, ready).await?;
        Ok(judge(db, w, sent_at, found)?)
    }

    /// The single acquisition, key after key, in one `BEGIN IMMEDIATE`
    /// transaction (see `batch`).
    async fn acquire_many(db: &Shared<Self>, m: Multi<'_>) -> DbResult<MultiOutcome> {
        batch::acquire_many(db, m).await
    }

    async fn update(db: &Shared<Self>, w: Write<'_>, expected: &Token) -> DbResult<CasOutcome> {
        let Write { key, new, ttl } = w;
        let transfer = expected != new;
        let sql = &db.dialect.sql;
        let mut query = sqlx::query_scalar(if transfer { &sql.transfer } else { &sql.renew })
            .bind(key.as_str())
            .bind(expected.as_str())
            .bind(millis(ttl));
        if transfer {
            query = query.bind(new.as_str());
        }
        let sent_at = Instant::now();
        let fence: Vec<i64> = query.fetch_all(&db.pool).await?;
        Ok(match fence.first() {
            Some(f) => {
                saw_clock(db, sent_at);
                CasOutcome::Acquired {
                    fence: convert::fence(*f),
                }
            }
            None => CasOutcome::Held(Held::default()),
        })
    }

    async fn delete(db: &Shared<Self>, key: &LockKey, owner: &Token) -> DbResult<bool> {
        let args = [key.as_str(), owner.as_str()];
        Ok(execute(&db.pool, &db.dialect.sql.delete, &args).await? > 0)
    }

    async fn inspect(db: &Shared<Self>, key: &LockKey) -> DbResult<Option<HolderInfo>> {
        Ok(holds(&db.pool, &db.dialect.sql.inspect, key.as_str())
            .await?
            .pop())
    }

    async fn list(db: &Shared<Self>, prefix: &str) -> DbResult<Vec<HolderInfo>> {
        Ok(holds(&db.pool, &db.dialect.sql.list, prefix).await?)
    }

    /// Runs the transaction to its end on a task of its own, so a caller
    /// that gives up (a dropped future) never leaves a transaction half
    /// done on a pooled connection.
    async fn renew_many(db: &Shared<Self>, items: &[RenewItem]) -> DbResult<Vec<bool>> {
        let task = renew_tx(
            db.pool.clone(),
            db.dialect.sql.renew_many.clone(),
            items.to_vec(),
        );
        let sent_at = Instant::now();
        let renewed = tokio::spawn(task)
            .await
            .map_err(|e| Error::store(Self::NAME, e, false))??;
        if renewed.contains(&true) {
            saw_clock(db, sent_at);
        }
        Ok(renewed)
    }

    async fn describe(db: &Shared<Self>, k: &LockKey, t: &Token, text: &str) -> DbResult<bool> {
        let args = [k.as_str(), t.as_str(), text];
        Ok(execute(&db.pool, &db.dialect.sql.describe, &args).await? > 0)
    }

    /// Lifts the one counter all keys draw fences from.
    async fn raise_fence(db: &Shared<Self>, _key: &LockKey, minimum: Fence) -> DbResult<()> {
        let minimum = i64::try_from(minimum.get()).map_err(|_| {
            Error::Config(format!("fence minimum {minimum} exceeds SQLite's integers"))
        })?;
        sqlx::query(&db.dialect.sql.raise)
            .bind(minimum)
            .execute(&db.pool)
            .await?;
        Ok(())
    }
}

/// A reply to a request sent at `sent_at` confirmed a hold: the clock that
/// judged it is this process's, read now.
fn saw_clock(db: &Shared<Sqlite>, sent_at: Instant) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    db.saw_clock(sent_at, now);
}

/// What the acquisition statement of one key found: its new fence, or,
/// refused, the holder row that a second read found (if any).
enum Found {
    Taken(i64),
    Busy(Option<SqliteRow>),
}

/// Runs the acquisition statement of `key` on `conn` (naming the
/// `(holder, version)` pair `ready` in the observed-expiry mode) and, when
/// it is refused, reads who holds the key.
async fn attempt(
    conn: &mut SqliteConnection,
    sql: &Statements,
    key: &LockKey,
    new: &Token,
    ttl: Duration,
    ready: Option<(String, i64)>,
) -> Result<Found, sqlx::Error> {
    let mut query = sqlx::query_scalar(&sql.acquire)
        .bind(key.as_str())
        .bind(new.as_str())
        .bind(millis(ttl));
    if sql.observed {
        let (holder, version) = ready.unzip();
        query = query.bind(holder).bind(version);
    }
    let fence: Vec<i64> = query.fetch_all(&mut *conn).await?;
    if let Some(f) = fence.first() {
        return Ok(Found::Taken(*f));
    }
    let row = sqlx::query(&sql.holder)
        .bind(key.as_str())
        .fetch_optional(&mut *conn)
        .await?;
    Ok(Found::Busy(row))
}

/// The outcome of what [`attempt`] found for `w`, in a request sent at
/// `sent_at`: feeds the store clock on a grant, and in the observed-expiry
/// mode records the hold seen (or forgets the key).
fn judge(
    db: &Shared<Sqlite>,
    w: Write<'_>,
    sent_at: Instant,
    found: Found,
) -> Result<CasOutcome, sqlx::Error> {
    let key = w.key.as_str();
    let row = match found {
        Found::Taken(f) => {
            saw_clock(db, sent_at);
            if let Some(o) = &db.observed {
                o.forget(key);
            }
            let fence = convert::fence(f);
            return Ok(CasOutcome::Acquired { fence });
        }
        Found::Busy(None) => {
            if let Some(o) = &db.observed {
                o.forget(key);
            }
            return Ok(CasOutcome::Held(Held::default()));
        }
        Found::Busy(Some(row)) => row,
    };
    let owner: String = row.try_get(0)?;
    let expires_in = match &db.observed {
        None => left_ms(row.try_get(1)?),
        Some(o) => {
            let version: i64 = row.try_get(1)?;
            let ttl = left_ms(row.try_get(2)?).unwrap_or(w.ttl);
            Some(o.saw(key, owner.clone(), version, ttl))
        }
    };
    Ok(CasOutcome::Held(Held {
        holder: Some(Token::from_stored(owner)),
        expires_in,
        revision: None,
    }))
}

/// Renews every hold in one `BEGIN IMMEDIATE` transaction, one
/// `UPDATE … RETURNING` per run of up to 8,000 holds sharing a TTL.
async fn renew_tx(
    pool: SqlitePool,
    renew_many: String,
    items: Vec<RenewItem>,
) -> Result<Vec<bool>, sqlx::Error> {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    let mut out = vec![false; items.len()];
    for (ttl, idx) in ttl_chunks(&items, RENEW_CHUNK) {
        let pairs = vec!["(?, ?)"; idx.len()].join(", ");
        let sql = format!("{renew_many} {pairs}) RETURNING key, owner");
        // The TTL twice: the new expiry, and the TTL a watcher waits.
        let mut query = sqlx::query(&sql).bind(millis(ttl)).bind(millis(ttl));
        for &i in &idx {
            query = query
                .bind(items[i].key.as_str())
                .bind(items[i].token.as_str());
        }
        let mut live = HashSet::new();
        for row in query.fetch_all(&mut *tx).await? {
            live.insert((row.try_get::<String, _>(0)?, row.try_get::<String, _>(1)?));
        }
        mark_live(&items, &idx, &live, &mut out);
    }
    tx.commit().await?;
    Ok(out)
}

/// Milliseconds since the epoch by SQLite's clock (rounded: the float is a hair low half the time).
const NOW: &str = "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)";

#[derive(Clone)]
struct Statements {
    /// Whether the statements are those of the observed-expiry mode.
    observed: bool,
    acquire: String,
    holder: String,
    renew: String,
    renew_many: String,
    transfer: String,
    delete: String,
    raise: String,
    describe: String,
    inspect: String,
    list: String,
    /// Per column added since the first schema: whether the table has it,
    /// and how to add it (tables made before it).
    columns: Vec<(String, String)>,
    ddl: Vec<String>,
}

/// The next fence: one above the counter, and at least the clock in µs (ms
/// × 1,000). The journal runs with `synchronous=NORMAL`, so an OS crash or
/// power cut can lose the last commits, counter included; fences drawn
/// after the restart still exceed the lost ones, unless the machine's clock
/// stepped back past them.
fn next_fence(seq: &str) -> String {
    format!("(SELECT max(value + 1, {NOW} * 1000) FROM {seq} WHERE id = 1)")
}

/// The single acquisition: writes the row `source` yields (`?1` for `?2`
/// for `?3` ms), over a row of the key only `WHERE take_if`; replies the
/// fence taken.
fn upsert(t: &str, source: &str, take_if: &str) -> String {
    format!(
        "INSERT INTO {t} (key, owner, fence, expires_at, acquired_at, version, ttl_ms) {source} \
         ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, fence = excluded.fence, \
         expires_at = excluded.expires_at, acquired_at = excluded.acquired_at, info = NULL, \
         version = {t}.version + 1, ttl_ms = excluded.ttl_ms WHERE {take_if} RETURNING fence"
    )
}

impl Statements {
    fn new(cfg: &SqlConfig) -> Result<Self, Error> {
        let name = cfg.checked_table()?;
        let seq = format!("\"{name}_fence\"");
        let observed = cfg.expiry == Expiry::Observed;
        let mut sql = Self::build(name, &seq, observed);
        sql.ddl.push(queue::QueueSql::new(cfg)?.ddl);
        Ok(sql)
    }

    /// The counter table and the triggers that advance it from `name`'s fences.
    fn counter_ddl(name: &str, seq: &str) -> Vec<String> {
        let t = format!("\"{name}\"");
        let bump =
            format!("UPDATE {seq} SET value = NEW.fence WHERE id = 1 AND value < NEW.fence;");
        vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {seq} (id INTEGER PRIMARY KEY CHECK (id = 1), \
                 value INTEGER NOT NULL)"
            ),
            format!("INSERT OR IGNORE INTO {seq} (id, value) VALUES (1, 0)"),
            format!(
                "CREATE TRIGGER IF NOT EXISTS \"{name}_fence_ins\" AFTER INSERT ON {t} BEGIN {bump} END"
            ),
            format!(
                "CREATE TRIGGER IF NOT EXISTS \"{name}_fence_upd\" AFTER UPDATE OF fence ON {t} \
                 BEGIN {bump} END"
            ),
        ]
    }

    /// One table serves both expiry modes (see the Postgres backend's
    /// statements for the reasoning): every write keeps `expires_at` and
    /// bumps `version` with the holder's `ttl_ms`; store-clock nodes take a
    /// key over by `expires_at`, observed-expiry nodes only by the
    /// `(owner, version)` pair `(?4, ?5)` they watched for its TTL. A
    /// release deletes the row (the counter keeps the fence history).
    fn build(name: &str, seq: &str, observed: bool) -> Self {
        let t = format!("\"{name}\"");
        let next = next_fence(seq);
        let (take_if, live) = match observed {
            false => (
                format!("{t}.expires_at < {NOW}"),
                format!("expires_at >= {NOW}"),
            ),
            true => (
                format!("{t}.owner = ?4 AND {t}.version = ?5"),
                "owner <> ''".to_owned(),
            ),
        };
        let (holder, left) = match observed {
            false => (
                format!("owner, expires_at - {NOW}"),
                format!("expires_at - {NOW}"),
            ),
            true => ("owner, version, ttl_ms".to_owned(), "NULL".to_owned()),
        };
        let mut ddl = vec![format!(
            "CREATE TABLE IF NOT EXISTS {t} (key TEXT PRIMARY KEY, owner TEXT NOT NULL, \
             fence INTEGER NOT NULL, expires_at INTEGER NOT NULL, acquired_at INTEGER NOT NULL, \
             info TEXT, version INTEGER NOT NULL DEFAULT 0, ttl_ms INTEGER NOT NULL DEFAULT 0) \
             WITHOUT ROWID"
        )];
        ddl.extend(Self::counter_ddl(name, seq));
        Self {
            observed,
            acquire: upsert(
                &t,
                &format!("VALUES (?1, ?2, {next}, {NOW} + ?3, {NOW}, 1, ?3)"),
                &take_if,
            ),
            holder: format!("SELECT {holder} FROM {t} WHERE key = ?1"),
            renew: format!(
                "UPDATE {t} SET expires_at = {NOW} + ?3, version = version + 1, ttl_ms = ?3 \
                 WHERE key = ?1 AND owner = ?2 AND {live} RETURNING fence"
            ),
            renew_many: format!(
                "UPDATE {t} SET expires_at = {NOW} + ?, version = version + 1, ttl_ms = ? \
                 WHERE {live} AND (key, owner) IN (VALUES"
            ),
            transfer: format!(
                "UPDATE {t} SET owner = ?4, fence = {next}, acquired_at = {NOW}, \
                 expires_at = {NOW} + ?3, info = NULL, version = version + 1, ttl_ms = ?3 \
                 WHERE key = ?1 AND owner = ?2 AND {live} RETURNING fence"
            ),
            delete: format!("DELETE FROM {t} WHERE key = ?1 AND owner = ?2 AND {live}"),
            raise: format!("UPDATE {seq} SET value = max(value, ?1) WHERE id = 1"),
            describe: format!("UPDATE {t} SET info = ?3 WHERE key = ?1 AND owner = ?2 AND {live}"),
            inspect: format!(
                "SELECT key, owner, fence, {left}, info FROM {t} WHERE key = ?1 AND {live}"
            ),
            list: format!(
                "SELECT key, owner, fence, {left}, info FROM {t} \
                 WHERE substr(key, 1, length(?1)) = ?1 AND {live} ORDER BY key"
            ),
            columns: [
                ("info", "TEXT"),
                ("version", "INTEGER NOT NULL DEFAULT 0"),
                ("ttl_ms", "INTEGER NOT NULL DEFAULT 0"),
            ]
            .iter()
            .map(|(column, decl)| {
                (
                    format!(
                        "SELECT count(*) FROM pragma_table_info('{name}') WHERE name = '{column}'"
                    ),
                    format!("ALTER TABLE {t} ADD COLUMN {column} {decl}"),
                )
            })
            .collect(),
            ddl,
        }
    }
}
