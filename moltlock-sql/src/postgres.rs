//! Postgres: one conditional `INSERT … ON CONFLICT` per acquisition, expiry
//! judged by the database clock, fences from a sequence, wake-ups by
//! `LISTEN/NOTIFY`.
//!
//! # Schema
//!
//! Created on connect (unless [`SqlConfig::auto_migrate`] is off) or by
//! [`PostgresBackend::migrate`], under a transaction-scoped advisory lock so
//! concurrent first connections do not race. [`PostgresBackend::ddl`] prints
//! it for operators who would rather create it themselves and give the
//! application only `SELECT, INSERT, UPDATE, DELETE` on the table and `USAGE`
//! on the sequence:
//!
//! ```sql
//! CREATE SEQUENCE IF NOT EXISTS "moltlock_locks_fence";
//! CREATE TABLE IF NOT EXISTS "moltlock_locks" (
//!     key         text        PRIMARY KEY,
//!     owner       text        NOT NULL,   -- '' once released
//!     fence       bigint      NOT NULL,
//!     expires_at  timestamptz NOT NULL,   -- the epoch once released
//!     acquired_at timestamptz NOT NULL,   -- the release time once released
//!     info        text,                   -- the holder's description
//!     version     bigint      NOT NULL DEFAULT 0,  -- bumped by every write
//!     ttl_ms      bigint      NOT NULL DEFAULT 0   -- the holder's TTL
//! );
//! ```
//!
//! # Guarantees and limits
//!
//! - Expiry compares `expires_at` with the server's `now()`; client clocks
//!   never enter into it.
//! - Fences: a fresh acquisition's fence is `max(the key's last fence + 1,
//!   nextval of the sequence)`. A release expires the row instead of
//!   deleting it, so the key's last fence is always there to exceed, even
//!   for a statement that drew its `nextval` before waiting on another
//!   acquisition's row lock. Fences of a key strictly increase across
//!   releases, expiry, client restarts and server restarts (after a crash a
//!   sequence may skip values, never repeat them).
//! - Retention: a row released or expired for longer than [`RETENTION`]
//!   is deleted (on connect, and after every 1,024th release of a backend),
//!   unless its fence is above the sequence (a stale draw can win through
//!   `GREATEST`; such a row stays until the sequence passes it). So the
//!   next `nextval` exceeds every deleted fence ([`Backend::raise_fence`]
//!   moves the sequence too). A release writes the epoch as the expiry, so
//!   a released key is free whatever the database clock does next. Storage is one row (about 120 bytes plus the
//!   key) per key locked within the retention window.
//! - Waiters `LISTEN` on one channel per table over one connection per
//!   backend, opened before their first attempt; a release sends `NOTIFY` in
//!   the same statement. When that connection drops, every waiter is woken to
//!   look again and it reconnects by itself.
//! - Behind PgBouncer in transaction mode, `LISTEN` does not work (it needs a
//!   session): point [`SqlConfig`] at a session-mode pool or the server, or
//!   rely on polling (waiters still get the lock, only later). Every other
//!   statement is a single autocommit statement and works in transaction mode.
//! - Batch renewal: one `UPDATE … FROM unnest(…)` renews every hold of a
//!   manager.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use moltlock_core::{
    Backend, CasOutcome, Describe, Error, Fence, Held, HolderInfo, Inspect, KeyEvents, Limits,
    LockKey, RaiseFence, ReleaseWatch, RenewItem, RenewMany, StoreClock, Token, Watch,
};
use sqlx::postgres::{PgListener, PgPool};
use sqlx::Postgres;
use sqlx::Row;
use tokio::sync::OnceCell;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::convert::{fence, holder_info, left_ms, millis, pool_options, SweepCounter, RETENTION};
use crate::error::map;
use crate::observe::Observed;
use crate::{Expiry, SqlConfig};

const NAME: &str = "postgres";

/// The server clock in microseconds since the epoch, as replies report it.
const NOW_US: &str = "(extract(epoch FROM now()) * 1000000)::bigint";

/// The SQL of one table, built once from validated names.
struct Statements {
    acquire: String,
    renew: String,
    transfer: String,
    delete: String,
    renew_many: String,
    raise: String,
    sweep: String,
    describe: String,
    inspect: String,
    list: String,
    ddl: Vec<String>,
    /// The observed-expiry mode's statements.
    observed: bool,
}

/// Adds a column to a table made before it existed. Checked first:
/// `ALTER TABLE` takes the table's strongest lock even when it changes
/// nothing.
fn add_column(t: &str, column: &str, decl: &str) -> String {
    format!(
        "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_attribute \
         WHERE attrelid = '{t}'::regclass AND attname = '{column}' AND NOT attisdropped) \
         THEN ALTER TABLE {t} ADD COLUMN {column} {decl}; END IF; END $$"
    )
}

impl Statements {
    fn new(cfg: &SqlConfig) -> Result<Self, Error> {
        let table = cfg.checked_table()?;
        let schema = cfg.checked_schema()?;
        let q = |name: &str| match schema {
            Some(s) => format!("\"{s}\".\"{name}\""),
            None => format!("\"{name}\""),
        };
        let (t, seq) = (q(table), q(&format!("{table}_fence")));
        let mut ddl = Vec::new();
        if let Some(s) = schema {
            ddl.push(format!("CREATE SCHEMA IF NOT EXISTS \"{s}\""));
        }
        ddl.push(format!("CREATE SEQUENCE IF NOT EXISTS {seq}"));
        let logged = if cfg.unlogged { "UNLOGGED " } else { "" };
        ddl.push(format!(
            "CREATE {logged}TABLE IF NOT EXISTS {t} (\n    key text PRIMARY KEY,\n    owner text NOT NULL,\n    \
             fence bigint NOT NULL,\n    expires_at timestamptz NOT NULL,\n    acquired_at timestamptz NOT NULL,\n    \
             info text,\n    version bigint NOT NULL DEFAULT 0,\n    ttl_ms bigint NOT NULL DEFAULT 0\n)"
        ));
        // Tables made before these columns existed.
        ddl.push(add_column(&t, "info", "text"));
        ddl.push(add_column(&t, "version", "bigint NOT NULL DEFAULT 0"));
        ddl.push(add_column(&t, "ttl_ms", "bigint NOT NULL DEFAULT 0"));
        let observed = cfg.checked_expiry()? == Expiry::Observed;
        Ok(Self::build(&t, &seq, ddl, observed))
    }

    /// One table serves both expiry modes, so nodes in different modes
    /// contend on the same rows: every write keeps `expires_at` (by the
    /// database clock, for store-clock nodes) and bumps `version` with the
    /// holder's `ttl_ms` (for observed-expiry nodes). The modes differ only
    /// in when a held row may be taken over and in which holds count as
    /// live: store-clock nodes judge by `expires_at`, observed-expiry nodes
    /// only by a released row or the `(owner, version)` pair `($4, $5)` they
    /// watched unchanged for its TTL (see `crate::observe`). A release
    /// clears the owner and sets `expires_at` to the epoch, so a released
    /// key is free whatever the clock does; `acquired_at` then records the
    /// release, for the sweep.
    fn build(t: &str, seq: &str, ddl: Vec<String>, observed: bool) -> Self {
        let ms = "$3::bigint * interval '1 millisecond'";
        let left = "(extract(epoch FROM expires_at - now()) * 1000)::bigint";
        let (take_if, live) = match observed {
            false => ("l.expires_at <= now()", "expires_at > now()"),
            true => (
                "l.owner = '' OR (l.owner = $4 AND l.version = $5)",
                "owner <> ''",
            ),
        };
        let held = match observed {
            false => format!("GREATEST({left}, 0), {NOW_US}"),
            true => "version, ttl_ms".to_owned(),
        };
        let granted_clock = match observed {
            false => NOW_US,
            true => "NULL::bigint",
        };
        let shown_left = match observed {
            false => left.to_owned(),
            true => "NULL::bigint".to_owned(),
        };
        Self {
            // The new fence is drawn in the VALUES row before the conflict is
            // resolved, so a statement that waited on a row lock may carry an
            // older draw than the hold it replaces: `GREATEST` with the row's
            // own last fence keeps fences of the key rising.
            acquire: format!(
                "WITH ins AS (INSERT INTO {t} AS l \
                 (key, owner, fence, expires_at, acquired_at, version, ttl_ms) \
                 VALUES ($1, $2, nextval('{seq}'), now() + {ms}, now(), 1, $3) \
                 ON CONFLICT (key) DO UPDATE SET owner = EXCLUDED.owner, \
                 fence = GREATEST(l.fence + 1, EXCLUDED.fence), info = NULL, \
                 expires_at = EXCLUDED.expires_at, acquired_at = EXCLUDED.acquired_at, \
                 version = l.version + 1, ttl_ms = EXCLUDED.ttl_ms \
                 WHERE {take_if} RETURNING fence) \
                 SELECT fence, NULL::text AS owner, NULL::bigint AS a, {granted_clock} AS b FROM ins \
                 UNION ALL SELECT NULL, owner, {held} FROM {t} \
                 WHERE key = $1 AND owner <> '' AND NOT EXISTS (SELECT 1 FROM ins)"
            ),
            renew: format!(
                "UPDATE {t} SET expires_at = now() + {ms}, version = version + 1, ttl_ms = $3 \
                 WHERE key = $1 AND owner = $2 AND {live} RETURNING fence, {NOW_US}"
            ),
            transfer: format!(
                "UPDATE {t} SET owner = $4, fence = GREATEST(fence + 1, nextval('{seq}')), \
                 info = NULL, acquired_at = now(), expires_at = now() + {ms}, \
                 version = version + 1, ttl_ms = $3 \
                 WHERE key = $1 AND owner = $2 AND {live} RETURNING fence, {NOW_US}"
            ),
            delete: format!(
                "WITH d AS (UPDATE {t} SET owner = '', expires_at = 'epoch', acquired_at = now(), \
                 version = version + 1 \
                 WHERE key = $1 AND owner = $2 AND owner <> '' AND {live} RETURNING key) \
                 SELECT count(pg_notify($3, key)) FROM d"
            ),
            renew_many: format!(
                "UPDATE {t} AS l SET expires_at = now() + x.ms * interval '1 millisecond', \
                 version = l.version + 1, ttl_ms = x.ms \
                 FROM unnest($1::text[], $2::text[], $3::bigint[]) AS x(key, owner, ms) \
                 WHERE l.key = x.key AND l.owner = x.owner AND l.{live} \
                 RETURNING l.key, l.owner, {NOW_US}"
            ),
            // A max on the key's row (a released placeholder when the key has
            // none), and the sequence moved past the floor.
            raise: format!(
                "WITH s AS (SELECT setval('{seq}', GREATEST(last_value, $2)) FROM {seq}) \
                 INSERT INTO {t} AS l (key, owner, fence, expires_at, acquired_at) \
                 SELECT $1, '', $2, 'epoch', now() FROM s \
                 ON CONFLICT (key) DO UPDATE SET fence = GREATEST(l.fence, EXCLUDED.fence)"
            ),
            // Released or expired for the retention, and at or below the
            // sequence: the next `nextval` exceeds the deleted fence. (A
            // fence above the sequence — a stale draw that won through
            // `GREATEST` — keeps its row until the sequence passes it.)
            sweep: format!(
                "DELETE FROM {t} WHERE expires_at < now() - $1::bigint * interval '1 millisecond' \
                 AND acquired_at < now() - $1::bigint * interval '1 millisecond' \
                 AND fence <= (SELECT last_value FROM {seq})"
            ),
            describe: format!(
                "UPDATE {t} SET info = $3 WHERE key = $1 AND owner = $2 AND owner <> '' AND {live}"
            ),
            inspect: format!(
                "SELECT key, owner, fence, {shown_left}, info FROM {t} \
                 WHERE key = $1 AND owner <> '' AND {live}"
            ),
            list: format!(
                "SELECT key, owner, fence, {shown_left}, info FROM {t} \
                 WHERE left(key, length($1)) = $1 AND owner <> '' AND {live} ORDER BY key"
            ),
            ddl,
            observed,
        }
    }
}

struct Inner {
    pool: PgPool,
    sql: Statements,
    channel: String,
    events: Arc<KeyEvents>,
    listener: OnceCell<JoinHandle<()>>,
    releases: SweepCounter,
    /// What this client saw of held keys, in the observed-expiry mode.
    observed: Option<Observed>,
    /// The server clock, as replies report it (store-clock mode).
    clock: StoreClock,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(task) = self.listener.get() {
            task.abort();
        }
    }
}

/// Locks in a Postgres table. Clones share one pool and one listener.
#[derive(Clone)]
pub struct PostgresBackend {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("channel", &self.inner.channel)
            .finish_non_exhaustive()
    }
}

impl PostgresBackend {
    /// Connects with default settings (`postgres://user:pass@host:port/db`).
    ///
    /// # Errors
    /// [`Error::Config`] for a bad URL, [`Error::Unavailable`] when the
    /// server does not answer, [`Error::Auth`] for refused credentials.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Self::with_config(SqlConfig::new(url)).await
    }

    /// Connects with explicit settings, creating the schema unless told not to.
    ///
    /// # Errors
    /// As [`connect`](Self::connect), plus [`Error::Config`] for a table or
    /// schema name that is not a plain identifier.
    pub async fn with_config(cfg: SqlConfig) -> Result<Self, Error> {
        let sql = Statements::new(&cfg)?;
        let pool = pool_options::<Postgres>(&cfg)
            .connect(&cfg.url)
            .await
            .map_err(|e| map(NAME, e))?;
        let backend = Self {
            inner: Arc::new(Inner {
                pool,
                channel: format!("moltlock_{}", cfg.table),
                events: Arc::new(KeyEvents::new()),
                listener: OnceCell::new(),
                releases: SweepCounter::default(),
                observed: sql.observed.then(Observed::default),
                clock: StoreClock::new(),
                sql,
            }),
        };
        if cfg.auto_migrate {
            backend.migrate().await?;
        }
        backend.sweep().await?;
        Ok(backend)
    }

    /// The DDL this backend needs, for operators who create it themselves.
    ///
    /// # Errors
    /// [`Error::Config`] for names that are not plain identifiers.
    pub fn ddl(cfg: &SqlConfig) -> Result<String, Error> {
        Ok(Statements::new(cfg)?.ddl.join(";\n") + ";")
    }

    /// Creates the sequence and table if missing. Idempotent and safe to run
    /// from many processes at once.
    ///
    /// # Errors
    /// Store errors, e.g. [`Error::Auth`] without `CREATE` privilege.
    pub async fn migrate(&self) -> Result<(), Error> {
        let mut tx = self.inner.pool.begin().await.map_err(|e| map(NAME, e))?;
        sqlx::query("SELECT pg_advisory_xact_lock(7243041107)")
            .execute(&mut *tx)
            .await
            .map_err(|e| map(NAME, e))?;
        for stmt in &self.inner.sql.ddl {
            sqlx::query(stmt)
                .execute(&mut *tx)
                .await
                .map_err(|e| map(NAME, e))?;
        }
        tx.commit().await.map_err(|e| map(NAME, e))
    }

    /// Deletes rows expired for longer than [`RETENTION`]; returns how many.
    ///
    /// # Errors
    /// Store errors.
    pub async fn sweep(&self) -> Result<u64, Error> {
        let done = sqlx::query(&self.inner.sql.sweep)
            .bind(millis(RETENTION))
            .execute(&self.inner.pool)
            .await
            .map_err(|e| map(NAME, e))?;
        Ok(done.rows_affected())
    }

    /// Sweeps in the background after every 1,024th release.
    fn count_release(&self) {
        if !self.inner.releases.release_is_due() {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            if let Err(e) = this.sweep().await {
                tracing::debug!(error = %e, "sweeping expired rows failed");
            }
        });
    }

    /// The pool, for tests and tools.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    async fn start_listener(&self) -> Result<JoinHandle<()>, Error> {
        let (pool, channel) = (&self.inner.pool, &self.inner.channel);
        let listener = subscribe(pool, channel).await.map_err(|e| map(NAME, e))?;
        let task = listen(
            listener,
            pool.clone(),
            channel.clone(),
            self.inner.events.clone(),
        );
        Ok(tokio::spawn(task))
    }
}

/// A connection that listens on `channel`.
async fn subscribe(pool: &PgPool, channel: &str) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(channel).await?;
    Ok(listener)
}

/// Dispatches notifications to waiters. When the connection drops, it opens
/// a new one itself and wakes every waiter twice: at once, and again once
/// the new connection listens — a release sent while nobody listened was
/// missed, and the woken waiters look for themselves.
async fn listen(mut listener: PgListener, pool: PgPool, channel: String, events: Arc<KeyEvents>) {
    loop {
        match listener.try_recv().await {
            Ok(Some(n)) => events.fire(n.payload()),
            Ok(None) | Err(_) => {
                tracing::debug!("listen connection lost; reconnecting");
                events.fire_all();
                listener = loop {
                    match subscribe(&pool, &channel).await {
                        Ok(l) => break l,
                        Err(e) => {
                            tracing::debug!(error = %e, "listen connection failed; retrying");
                            events.fire_all();
                            tokio::time::sleep(Duration::from_millis(250)).await;
                        }
                    }
                };
                events.fire_all();
            }
        }
    }
}

impl PostgresBackend {
    async fn acquire(
        &self,
        key: &LockKey,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, sqlx::Error> {
        if let Some(observed) = &self.inner.observed {
            return self.acquire_observed(observed, key, new, ttl).await;
        }
        let sent_at = Instant::now();
        let row = sqlx::query(&self.inner.sql.acquire)
            .bind(key.as_str())
            .bind(new.as_str())
            .bind(millis(ttl))
            .fetch_optional(&self.inner.pool)
            .await?;
        let Some(row) = row else {
            return Ok(CasOutcome::Held(Held::default()));
        };
        self.saw_clock(sent_at, row.try_get(3)?);
        if let Some(f) = row.try_get::<Option<i64>, _>(0)? {
            return Ok(CasOutcome::Acquired { fence: fence(f) });
        }
        Ok(CasOutcome::Held(Held {
            holder: row.try_get::<Option<String>, _>(1)?.map(Token::from_stored),
            expires_in: left_ms(row.try_get(2)?),
            revision: None,
        }))
    }

    /// An acquisition in the observed-expiry mode: takes a released key, or
    /// one whose holder this process saw unchanged for that holder's TTL.
    async fn acquire_observed(
        &self,
        observed: &Observed,
        key: &LockKey,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, sqlx::Error> {
        let (holder, version) = observed.ready(key.as_str()).unzip();
        let row = sqlx::query(&self.inner.sql.acquire)
            .bind(key.as_str())
            .bind(new.as_str())
            .bind(millis(ttl))
            .bind(holder)
            .bind(version)
            .fetch_optional(&self.inner.pool)
            .await?;
        let Some(row) = row else {
            observed.forget(key.as_str());
            return Ok(CasOutcome::Held(Held::default()));
        };
        if let Some(f) = row.try_get::<Option<i64>, _>(0)? {
            observed.forget(key.as_str());
            return Ok(CasOutcome::Acquired { fence: fence(f) });
        }
        let owner: String = row.try_get::<Option<String>, _>(1)?.unwrap_or_default();
        let version: i64 = row.try_get::<Option<i64>, _>(2)?.unwrap_or_default();
        let held_ttl = left_ms(row.try_get(3)?).unwrap_or(ttl);
        let left = observed.saw(key.as_str(), owner.clone(), version, held_ttl);
        Ok(CasOutcome::Held(Held {
            holder: Some(Token::from_stored(owner)),
            expires_in: Some(left),
            revision: None,
        }))
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
            &self.inner.sql.transfer
        } else {
            &self.inner.sql.renew
        };
        let mut query = sqlx::query(sql)
            .bind(key.as_str())
            .bind(expected.as_str())
            .bind(millis(ttl));
        if transfer {
            query = query.bind(new.as_str());
        }
        let sent_at = Instant::now();
        let row = query.fetch_optional(&self.inner.pool).await?;
        Ok(match row {
            Some(row) => {
                self.saw_clock(sent_at, row.try_get(1)?);
                CasOutcome::Acquired {
                    fence: fence(row.try_get(0)?),
                }
            }
            None => CasOutcome::Held(Held::default()),
        })
    }

    /// Feeds a reply's server clock (µs since the epoch) to the store clock.
    fn saw_clock(&self, sent_at: Instant, now_us: i64) {
        if self.inner.observed.is_none() {
            let us = u64::try_from(now_us).unwrap_or(0);
            self.inner.clock.observe(sent_at, Duration::from_micros(us));
        }
    }
}

#[async_trait]
impl Backend for PostgresBackend {
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
        let n: i64 = sqlx::query_scalar(&self.inner.sql.delete)
            .bind(key.as_str())
            .bind(owner.as_str())
            .bind(&self.inner.channel)
            .fetch_one(&self.inner.pool)
            .await
            .map_err(|e| map(NAME, e))?;
        if n > 0 {
            self.count_release();
        }
        Ok(n > 0)
    }

    fn name(&self) -> &'static str {
        NAME
    }

    fn limits(&self) -> Limits {
        Limits::new().with_min_ttl(Duration::from_millis(10))
    }

    fn store_clock(&self) -> Option<&StoreClock> {
        self.inner.observed.is_none().then_some(&self.inner.clock)
    }

    fn watcher(&self) -> Option<&dyn Watch> {
        Some(self)
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
impl Watch for PostgresBackend {
    async fn watch(&self, key: &LockKey) -> Result<Box<dyn ReleaseWatch>, Error> {
        self.inner
            .listener
            .get_or_try_init(|| self.start_listener())
            .await?;
        Ok(self.inner.events.subscribe(key.as_str()))
    }
}

#[async_trait]
impl Inspect for PostgresBackend {
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        let row = sqlx::query(&self.inner.sql.inspect)
            .bind(key.as_str())
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(|e| map(NAME, e))?;
        row.map(|r| holder_info(&r))
            .transpose()
            .map_err(|e| map(NAME, e))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<HolderInfo>, Error> {
        let rows = sqlx::query(&self.inner.sql.list)
            .bind(prefix)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(|e| map(NAME, e))?;
        rows.iter()
            .map(holder_info)
            .collect::<Result<_, _>>()
            .map_err(|e| map(NAME, e))
    }
}

#[async_trait]
impl RenewMany for PostgresBackend {
    async fn renew_many(&self, items: &[RenewItem]) -> Result<Vec<bool>, Error> {
        let keys: Vec<&str> = items.iter().map(|i| i.key.as_str()).collect();
        let owners: Vec<&str> = items.iter().map(|i| i.token.as_str()).collect();
        let ttls: Vec<i64> = items.iter().map(|i| millis(i.ttl)).collect();
        let sent_at = Instant::now();
        let rows = sqlx::query(&self.inner.sql.renew_many)
            .bind(&keys)
            .bind(&owners)
            .bind(&ttls)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(|e| map(NAME, e))?;
        let mut renewed = HashSet::with_capacity(rows.len());
        for row in &rows {
            let key: String = row.try_get(0).map_err(|e| map(NAME, e))?;
            let owner: String = row.try_get(1).map_err(|e| map(NAME, e))?;
            renewed.insert((key, owner));
        }
        if let Some(row) = rows.first() {
            self.saw_clock(sent_at, row.try_get(2).map_err(|e| map(NAME, e))?);
        }
        Ok(items
            .iter()
            .map(|i| renewed.contains(&(i.key.as_str().to_owned(), i.token.as_str().to_owned())))
            .collect())
    }
}

#[async_trait]
impl Describe for PostgresBackend {
    async fn describe(
        &self,
        key: &LockKey,
        owner: &Token,
        description: &str,
    ) -> Result<bool, Error> {
        let done = sqlx::query(&self.inner.sql.describe)
            .bind(key.as_str())
            .bind(owner.as_str())
            .bind(description)
            .execute(&self.inner.pool)
            .await
            .map_err(|e| map(NAME, e))?;
        Ok(done.rows_affected() > 0)
    }
}

#[async_trait]
impl RaiseFence for PostgresBackend {
    /// Raises the key's last fence (and the sequence) to at least `floor`;
    /// never lowers either, so every later fence of the key exceeds both.
    async fn raise_fence(&self, key: &LockKey, floor: Fence) -> Result<(), Error> {
        let floor = i64::try_from(floor.get())
            .map_err(|_| Error::Config(format!("fence floor {floor} exceeds bigint")))?;
        sqlx::query(&self.inner.sql.raise)
            .bind(key.as_str())
            .bind(floor)
            .execute(&self.inner.pool)
            .await
            .map_err(|e| map(NAME, e))?;
        Ok(())
    }
}
