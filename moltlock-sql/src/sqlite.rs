//! SQLite: the same contract in one database file, so the processes of one
//! machine share locks with no server. The embedded default of the CLI.
//!
//! Every write is one statement, which SQLite runs as a transaction of its
//! own that takes the write lock before it reads anything (so no write works
//! on a stale snapshot); a batch of renewals shares one `BEGIN IMMEDIATE`
//! transaction. WAL journaling and a busy timeout. Expiry is judged by SQLite's own
//! clock (`julianday('now')`), which every process on the machine shares.
//! Fences come from a one-row counter table that a trigger advances in the
//! same statement as the acquisition, and are at least the clock in µs, so
//! they stay above fences whose commits an OS crash lost (`synchronous` is
//! `NORMAL`: a process crash loses nothing, a power cut may lose the last
//! commits); released rows are deleted and the counter keeps the history. Waiters poll by the retry policy (SQLite has no
//! cross-process notifications), sleeping no longer than the holder's time
//! left.
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS "moltlock_locks" (
//!     key TEXT PRIMARY KEY, owner TEXT NOT NULL, fence INTEGER NOT NULL,
//!     expires_at INTEGER NOT NULL, acquired_at INTEGER NOT NULL);   -- ms since the epoch
//! CREATE TABLE IF NOT EXISTS "moltlock_locks_fence" (
//!     id INTEGER PRIMARY KEY CHECK (id = 1), value INTEGER NOT NULL);
//! ```

use std::collections::HashSet;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use moltlock_core::{
    Backend, CasOutcome, Describe, Error, Fence, Held, HolderInfo, Inspect, Limits, LockKey,
    RaiseFence, RenewItem, RenewMany, StoreClock, Token,
};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqliteSynchronous};
use sqlx::{Row, Sqlite};
use tokio::time::Instant;

use crate::convert::{
    self, holder_info, left_ms, mark_live, millis, pair_placeholders, pool_options, ttl_chunks,
};
use crate::error::map;
use crate::observe::Observed;
use crate::{Expiry, SqlConfig};

const NAME: &str = "sqlite";
/// Holds renewed per statement: 8,000 `(key, owner)` pairs, 16,001
/// parameters (SQLite allows 32,766).
const RENEW_CHUNK: usize = 8_000;
/// How long a statement waits for another process's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);
/// Milliseconds since the epoch by SQLite's clock.
const NOW: &str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";

struct Statements {
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
    /// The observed-expiry mode's statements.
    observed: bool,
}

/// The next fence: one above the counter, and at least the clock in µs (ms
/// × 1,000). The journal runs with `synchronous=NORMAL`, so an OS crash or
/// power cut can lose the last commits, counter included; fences drawn
/// after the restart still exceed the lost ones, unless the machine's clock
/// stepped back past them.
fn next_fence(seq: &str) -> String {
    format!("(SELECT max(value + 1, {NOW} * 1000) FROM {seq} WHERE id = 1)")
}

impl Statements {
    fn new(cfg: &SqlConfig) -> Result<Self, Error> {
        let name = cfg.checked_table()?;
        let seq = format!("\"{name}_fence\"");
        let observed = cfg.checked_expiry()? == Expiry::Observed;
        Ok(Self::build(name, &seq, observed))
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
                format!("{t}.expires_at <= {NOW}"),
                format!("expires_at > {NOW}"),
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
             info TEXT, version INTEGER NOT NULL DEFAULT 0, ttl_ms INTEGER NOT NULL DEFAULT 0)"
        )];
        ddl.extend(Self::counter_ddl(name, seq));
        Self {
            acquire: format!(
                "INSERT INTO {t} (key, owner, fence, expires_at, acquired_at, version, ttl_ms) \
                 VALUES (?1, ?2, {next}, {NOW} + ?3, {NOW}, 1, ?3) \
                 ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, fence = excluded.fence, \
                 expires_at = excluded.expires_at, acquired_at = excluded.acquired_at, info = NULL, \
                 version = {t}.version + 1, ttl_ms = excluded.ttl_ms \
                 WHERE {take_if} RETURNING fence"
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
            describe: format!(
                "UPDATE {t} SET info = ?3 WHERE key = ?1 AND owner = ?2 AND {live}"
            ),
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
                    format!("SELECT count(*) FROM pragma_table_info('{name}') WHERE name = '{column}'"),
                    format!("ALTER TABLE {t} ADD COLUMN {column} {decl}"),
                )
            })
            .collect(),
            ddl,
            observed,
        }
    }
}

/// Locks in an SQLite database file. Clones share one pool.
#[derive(Clone)]
pub struct SqliteBackend {
    pool: SqlitePool,
    sql: Arc<Statements>,
    /// What this client saw of held keys, in the observed-expiry mode.
    observed: Option<Arc<Observed>>,
    /// SQLite's clock is this process's wall clock: read it as each
    /// confirming reply arrives (store-clock mode).
    clock: Arc<StoreClock>,
}

impl std::fmt::Debug for SqliteBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteBackend").finish_non_exhaustive()
    }
}

impl SqliteBackend {
    /// Opens (creating if missing) the database at `url`
    /// (`sqlite://path/to/file.db`, or a bare path).
    ///
    /// # Errors
    /// [`Error::Config`] for a bad URL; store errors when the file cannot be
    /// opened or the schema created.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Self::with_config(SqlConfig::new(url)).await
    }

    /// Opens with explicit settings.
    ///
    /// # Errors
    /// As [`connect`](Self::connect), plus [`Error::Config`] for a table
    /// name that is not a plain identifier.
    pub async fn with_config(cfg: SqlConfig) -> Result<Self, Error> {
        // Processes opening a new file at once can find it locked while one
        // of them switches it to WAL or creates the tables: try again for as
        // long as the busy timeout would have waited.
        let until = tokio::time::Instant::now() + BUSY_TIMEOUT;
        loop {
            match Self::open(&cfg).await {
                Err(e) if e.is_retryable() && tokio::time::Instant::now() < until => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                other => return other,
            }
        }
    }

    async fn open(cfg: &SqlConfig) -> Result<Self, Error> {
        let sql = Statements::new(cfg)?;
        let url = if cfg.url.starts_with("sqlite:") {
            cfg.url.clone()
        } else {
            format!("sqlite://{}", cfg.url)
        };
        let opts = SqliteConnectOptions::from_str(&url)
            .map_err(|e| map(NAME, e))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(BUSY_TIMEOUT);
        let pool = pool_options::<Sqlite>(cfg)
            .connect_with(opts)
            .await
            .map_err(|e| map(NAME, e))?;
        let backend = Self {
            pool,
            observed: sql.observed.then(Arc::default),
            clock: Arc::default(),
            sql: Arc::new(sql),
        };
        if cfg.auto_migrate {
            backend.migrate().await?;
        }
        Ok(backend)
    }

    /// Creates the tables and triggers if missing. Idempotent.
    ///
    /// # Errors
    /// Store errors.
    pub async fn migrate(&self) -> Result<(), Error> {
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(|e| map(NAME, e))?;
        for stmt in &self.sql.ddl {
            sqlx::query(stmt)
                .execute(&mut *tx)
                .await
                .map_err(|e| map(NAME, e))?;
        }
        // Tables made before some columns existed (inside the same write
        // transaction, so two processes cannot both add the column).
        for (has, add) in &self.sql.columns {
            let present: i64 = sqlx::query_scalar(has)
                .fetch_one(&mut *tx)
                .await
                .map_err(|e| map(NAME, e))?;
            if present == 0 {
                sqlx::query(add)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| map(NAME, e))?;
            }
        }
        tx.commit().await.map_err(|e| map(NAME, e))
    }

    /// One statement; only when the key is held, a second one reads who
    /// holds it (a report for the waiter, not part of the decision).
    async fn acquire(
        &self,
        key: &LockKey,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, sqlx::Error> {
        let ready = self.observed.as_ref().and_then(|o| o.ready(key.as_str()));
        let (holder, version) = ready.unzip();
        let mut query = sqlx::query_scalar(&self.sql.acquire)
            .bind(key.as_str())
            .bind(new.as_str())
            .bind(millis(ttl));
        if self.observed.is_some() {
            query = query.bind(holder).bind(version);
        }
        let sent_at = Instant::now();
        let fence: Vec<i64> = query.fetch_all(&self.pool).await?;
        if let Some(f) = fence.first() {
            self.saw_clock(sent_at);
            if let Some(o) = &self.observed {
                o.forget(key.as_str());
            }
            return Ok(CasOutcome::Acquired {
                fence: convert::fence(*f),
            });
        }
        let row = sqlx::query(&self.sql.holder)
            .bind(key.as_str())
            .fetch_optional(&self.pool)
            .await?;
        let mut held = Held::default();
        let Some(row) = row else {
            if let Some(o) = &self.observed {
                o.forget(key.as_str());
            }
            return Ok(CasOutcome::Held(held));
        };
        let owner: String = row.try_get(0)?;
        held.expires_in = match &self.observed {
            None => left_ms(row.try_get(1)?),
            Some(o) => {
                let version: i64 = row.try_get(1)?;
                let ttl = left_ms(row.try_get(2)?).unwrap_or(ttl);
                Some(o.saw(key.as_str(), owner.clone(), version, ttl))
            }
        };
        held.holder = Some(Token::from_stored(owner));
        Ok(CasOutcome::Held(held))
    }

    async fn update(
        &self,
        key: &LockKey,
        expected: &Token,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, sqlx::Error> {
        let transfer = expected != new;
        let sql = if transfer {
            &self.sql.transfer
        } else {
            &self.sql.renew
        };
        let mut query = sqlx::query_scalar(sql)
            .bind(key.as_str())
            .bind(expected.as_str())
            .bind(millis(ttl));
        if transfer {
            query = query.bind(new.as_str());
        }
        let sent_at = Instant::now();
        let fence: Vec<i64> = query.fetch_all(&self.pool).await?;
        Ok(match fence.first() {
            Some(f) => {
                self.saw_clock(sent_at);
                CasOutcome::Acquired {
                    fence: convert::fence(*f),
                }
            }
            None => CasOutcome::Held(Held::default()),
        })
    }

    /// A reply to a request sent at `sent_at` confirmed a hold: the clock
    /// that judged it is this process's, read now.
    fn saw_clock(&self, sent_at: Instant) {
        if self.observed.is_none() {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            self.clock.observe(sent_at, now);
        }
    }
}

impl SqliteBackend {
    /// Runs a write transaction to its end on a task of its own, so a caller
    /// that gives up (a dropped future) never leaves a transaction half done
    /// on a pooled connection.
    async fn detached<T, F, Fut>(&self, f: F) -> Result<T, Error>
    where
        F: FnOnce(Self) -> Fut,
        Fut: std::future::Future<Output = Result<T, sqlx::Error>> + Send + 'static,
        T: Send + 'static,
    {
        tokio::spawn(f(self.clone()))
            .await
            .map_err(|e| Error::store(NAME, e, false))?
            .map_err(|e| map(NAME, e))
    }

    /// Renews every hold in one `BEGIN IMMEDIATE` transaction, one
    /// `UPDATE … RETURNING` per run of up to 8,000 holds sharing a TTL.
    async fn renew_tx(self, items: Vec<RenewItem>) -> Result<Vec<bool>, sqlx::Error> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let mut out = vec![false; items.len()];
        for (ttl, idx) in ttl_chunks(&items, RENEW_CHUNK) {
            let sql = format!(
                "{} {}) RETURNING key, owner",
                self.sql.renew_many,
                pair_placeholders(idx.len())
            );
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
}

#[async_trait]
impl Backend for SqliteBackend {
    async fn cas(
        &self,
        key: &LockKey,
        expected: Option<&Token>,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error> {
        let out = match expected {
            None => self.acquire(key, new, ttl).await,
            Some(expected) => self.update(key, expected, new, ttl).await,
        };
        out.map_err(|e| map(NAME, e))
    }

    async fn delete(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        convert::delete_owned(&self.pool, &self.sql.delete, key, owner)
            .await
            .map_err(|e| map(NAME, e))
    }

    fn name(&self) -> &'static str {
        NAME
    }

    fn limits(&self) -> Limits {
        Limits::new()
            // A statement queued behind another writer lands up to the busy
            // timeout after its future was dropped.
            .with_late_write(BUSY_TIMEOUT + Duration::from_secs(1))
    }

    fn store_clock(&self) -> Option<&StoreClock> {
        self.observed.is_none().then_some(self.clock.as_ref())
    }

    fn inspector(&self) -> Option<&dyn Inspect> {
        Some(self)
    }

    fn renewer(&self) -> Option<&dyn RenewMany> {
        Some(self)
    }

    fn describer(&self) -> Option<&dyn Describe> {
        Some(self)
    }

    fn fence_raiser(&self) -> Option<&dyn RaiseFence> {
        Some(self)
    }
}

#[async_trait]
impl Inspect for SqliteBackend {
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        let row = sqlx::query(&self.sql.inspect)
            .bind(key.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| map(NAME, e))?;
        row.map(|r| holder_info(&r))
            .transpose()
            .map_err(|e| map(NAME, e))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<HolderInfo>, Error> {
        let rows = sqlx::query(&self.sql.list)
            .bind(prefix)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map(NAME, e))?;
        rows.iter()
            .map(holder_info)
            .collect::<Result<_, _>>()
            .map_err(|e| map(NAME, e))
    }
}

#[async_trait]
impl RenewMany for SqliteBackend {
    /// All renewals in one `BEGIN IMMEDIATE` transaction (one fsync), one
    /// statement per 8,000 holds of a TTL.
    async fn renew_many(&self, items: &[RenewItem]) -> Result<Vec<bool>, Error> {
        let items = items.to_vec();
        let sent_at = Instant::now();
        let renewed = self.detached(move |b| b.renew_tx(items)).await?;
        if renewed.contains(&true) {
            self.saw_clock(sent_at);
        }
        Ok(renewed)
    }
}

#[async_trait]
impl Describe for SqliteBackend {
    async fn describe(
        &self,
        key: &LockKey,
        owner: &Token,
        description: &str,
    ) -> Result<bool, Error> {
        let done = sqlx::query(&self.sql.describe)
            .bind(key.as_str())
            .bind(owner.as_str())
            .bind(description)
            .execute(&self.pool)
            .await
            .map_err(|e| map(NAME, e))?;
        Ok(done.rows_affected() > 0)
    }
}

#[async_trait]
impl RaiseFence for SqliteBackend {
    /// Lifts the one counter all keys draw fences from.
    async fn raise_fence(&self, _key: &LockKey, floor: Fence) -> Result<(), Error> {
        let floor = i64::try_from(floor.get())
            .map_err(|_| Error::Config(format!("fence floor {floor} exceeds SQLite's integers")))?;
        sqlx::query(&self.sql.raise)
            .bind(floor)
            .execute(&self.pool)
            .await
            .map_err(|e| map(NAME, e))?;
        Ok(())
    }
}
