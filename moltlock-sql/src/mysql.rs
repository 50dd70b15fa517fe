//! MySQL and MariaDB: `INSERT … ON DUPLICATE KEY UPDATE` conditioned on
//! expiry by the server's `UTC_TIMESTAMP(6)`.
//!
//! Each column's update is guarded by `expires_at <= UTC_TIMESTAMP(6)`, and
//! `expires_at` is assigned last, so the guard reads the old value for every
//! column. Times are stored in UTC whatever the session time zone.
//!
//! Every write reports its outcome in the server's reply, with no read
//! back: the statement passes the fence it wrote through `LAST_INSERT_ID(…)`,
//! whose argument the server returns as the statement's insert id. An insert
//! sets it to the new fence; an update that finds the key held sets it to
//! `0`, so an acquisition is one round trip, and only a refused one reads
//! who holds the key.
//!
//! Fences: MySQL has no sequences, so the fence of a hold is
//! `max(previous fence of the key + 1, server time in microseconds, floor + 1)`.
//! A release expires the key's row rather than deleting it, so the previous
//! fence is there for the next acquisition: fences of a key strictly
//! increase whatever the server's clock does while its row lives. A row
//! expired for longer than [`RETENTION`] (1 h) is swept (on connect and
//! after every 1,024th release); the next fence of that key rests on the
//! clock term, which exceeds the swept fence unless the server clock
//! stepped back by more than the retention. Storage: one row (about 200
//! bytes plus the key) per key locked within the retention.
//! [`Backend::raise_fence`] records a per-key floor in a second table (used
//! only while migrating between stores); later fences of that key exceed it.
//! Waiters poll by the retry policy, sleeping no longer than the holder's
//! time left. Renewal takes one `UPDATE` and one read per 500 holds.
//!
//! Exactness: owner tokens are compared byte for byte (`CAST(? AS BINARY)`),
//! whatever the table's collation. The key column's `utf8mb4_bin` collation
//! pads with spaces, so a key that ends with a space is refused with
//! [`Error::InvalidKey`] rather than taken as the same lock as the key
//! without it.
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS `moltlock_locks` (
//!     lock_key VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
//!     owner VARCHAR(128) NOT NULL, fence BIGINT UNSIGNED NOT NULL,
//!     expires_at DATETIME(6) NOT NULL, acquired_at DATETIME(6) NOT NULL) ENGINE=InnoDB;
//! CREATE TABLE IF NOT EXISTS `moltlock_locks_floor` (
//!     lock_key VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
//!     floor BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB;
//! ```

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use moltlock_core::{
    Backend, CasOutcome, Describe, Error, Fence, Held, HolderInfo, Inspect, LockKey, RaiseFence,
    RenewItem, RenewMany, Token,
};
use sqlx::mysql::{MySqlPool, MySqlRow};
use sqlx::MySql;
use sqlx::Row;

use crate::convert::{self, mark_live, micros, pool_options, ttl_chunks, SweepCounter, RETENTION};
use crate::error::map;
use crate::{Expiry, SqlConfig};

const NAME: &str = "mysql";
const NOW: &str = "UTC_TIMESTAMP(6)";
/// The expiry a release writes: long past, whatever the server clock says.
const RELEASED: &str = "'1970-01-02 00:00:00'";
/// The holder description column (256 bytes of UTF-8 at most).
const INFO_COL: &str = "info VARCHAR(256) CHARACTER SET utf8mb4 NULL";
const MICROS: &str = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))";
/// An owner parameter compared byte for byte: the `owner` column has the
/// table's default collation, which ignores case (and trailing spaces) on
/// MariaDB and MySQL alike, so a plain `owner = ?` would let a look-alike
/// token renew or release a hold.
const EXACT: &str = "CAST(? AS BINARY)";

/// Refuses keys the key column cannot tell apart from others: its
/// `utf8mb4_bin` collation pads with spaces, so `"a"` and `"a "` would be
/// one lock.
fn check_key(key: &LockKey) -> Result<(), Error> {
    if key.as_str().ends_with(' ') {
        return Err(Error::invalid_key(
            key.as_str(),
            "MySQL/MariaDB compare keys ignoring trailing spaces; a key may not end with a space",
        ));
    }
    Ok(())
}

/// Holds renewed per statement: 500 `(key, owner)` pairs, 1,000 parameters.
const RENEW_CHUNK: usize = 500;

struct Statements {
    table: String,
    acquire: String,
    read: String,
    renew: String,
    transfer: String,
    delete: String,
    list: String,
    raise: String,
    sweep: String,
    describe: String,
    /// Whether the table has the `info` column (tables made before it).
    has_info: String,
    add_info: String,
    ddl: Vec<String>,
}

impl Statements {
    fn new(cfg: &SqlConfig) -> Result<Self, Error> {
        let name = cfg.checked_table()?;
        if cfg.checked_expiry()? != Expiry::StoreClock {
            return Err(Error::Config(
                "the MySQL backend judges expiry by the server clock only (expiry=store)".into(),
            ));
        }
        let t = format!("`{name}`");
        let floors = format!("`{name}_floor`");
        // The least fence `raise_fence` allows next for the key (0 if none).
        let floor =
            format!("COALESCE((SELECT floor + 1 FROM {floors} WHERE {floors}.lock_key = ?), 0)");
        let key_col =
            "lock_key VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY";
        let free = format!("expires_at <= {NOW}");
        let left = format!("TIMESTAMPDIFF(MICROSECOND, {NOW}, expires_at)");
        Ok(Self {
            table: t.clone(),
            acquire: format!(
                "INSERT INTO {t} (lock_key, owner, fence, expires_at, acquired_at) \
                 VALUES (?, ?, LAST_INSERT_ID(GREATEST({MICROS}, {floor})), \
                 {NOW} + INTERVAL ? MICROSECOND, {NOW}) \
                 ON DUPLICATE KEY UPDATE \
                 owner = IF({free}, VALUES(owner), owner), \
                 fence = IF({free}, LAST_INSERT_ID(GREATEST(fence + 1, VALUES(fence))), \
                 fence + LAST_INSERT_ID(0)), \
                 acquired_at = IF({free}, VALUES(acquired_at), acquired_at), \
                 info = IF({free}, NULL, info), \
                 expires_at = IF({free}, VALUES(expires_at), expires_at)"
            ),
            read: format!(
                "SELECT lock_key, owner, fence, {left}, info FROM {t} \
                 WHERE lock_key = ? AND expires_at > {NOW}"
            ),
            renew: format!(
                "UPDATE {t} SET fence = LAST_INSERT_ID(fence), \
                 expires_at = {NOW} + INTERVAL ? MICROSECOND \
                 WHERE lock_key = ? AND owner = {EXACT} AND expires_at > {NOW}"
            ),
            transfer: format!(
                "UPDATE {t} SET fence = LAST_INSERT_ID(GREATEST(fence + 1, {MICROS}, {floor})), owner = ?, \
                 acquired_at = {NOW}, info = NULL, \
                 expires_at = {NOW} + INTERVAL ? MICROSECOND \
                 WHERE lock_key = ? AND owner = {EXACT} AND expires_at > {NOW}"
            ),
            // A release expires the row instead of deleting it, so the key's
            // next fence still counts up from its last one.
            // The epoch frees a released key whatever the clock does later;
            // `acquired_at` records the release, for the sweep.
            delete: format!(
                "UPDATE {t} SET acquired_at = {NOW}, expires_at = {RELEASED} \
                 WHERE lock_key = ? AND owner = {EXACT} AND expires_at > {NOW}"
            ),
            describe: format!(
                "UPDATE {t} SET info = ? WHERE lock_key = ? AND owner = {EXACT} AND expires_at > {NOW}"
            ),
            has_info: format!(
                "SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() \
                 AND TABLE_NAME = '{name}' AND COLUMN_NAME = 'info'"
            ),
            add_info: format!("ALTER TABLE {t} ADD COLUMN {INFO_COL}"),
            sweep: format!(
                "DELETE FROM {t} WHERE expires_at < {NOW} - INTERVAL ? MICROSECOND \
                 AND acquired_at < {NOW} - INTERVAL ? MICROSECOND"
            ),
            list: format!(
                "SELECT lock_key, owner, fence, {left}, info FROM {t} \
                 WHERE LEFT(lock_key, CHAR_LENGTH(?)) = ? AND expires_at > {NOW} ORDER BY lock_key"
            ),
            raise: format!(
                "INSERT INTO {floors} (lock_key, floor) VALUES (?, ?) \
                 ON DUPLICATE KEY UPDATE floor = GREATEST(floor, VALUES(floor))"
            ),
            ddl: vec![
                format!(
                    "CREATE TABLE IF NOT EXISTS {t} ({key_col}, \
                     owner VARCHAR(128) NOT NULL, fence BIGINT UNSIGNED NOT NULL, \
                     expires_at DATETIME(6) NOT NULL, acquired_at DATETIME(6) NOT NULL, \
                     {INFO_COL}) ENGINE=InnoDB"
                ),
                format!(
                    "CREATE TABLE IF NOT EXISTS {floors} ({key_col}, \
                     floor BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB"
                ),
            ],
        })
    }
}

/// Locks in a MySQL or MariaDB table. Clones share one pool.
#[derive(Clone)]
pub struct MySqlBackend {
    pool: MySqlPool,
    sql: Arc<Statements>,
    releases: Arc<SweepCounter>,
}

impl std::fmt::Debug for MySqlBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MySqlBackend").finish_non_exhaustive()
    }
}

fn info(row: &MySqlRow) -> Result<HolderInfo, sqlx::Error> {
    let left: Option<i64> = row.try_get(3)?;
    // A binary collation makes the key column read back as bytes.
    let key: Vec<u8> = row.try_get(0)?;
    let key = String::from_utf8(key).map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
    Ok(HolderInfo {
        key,
        holder: Token::from_stored(row.try_get::<String, _>(1)?),
        fence: Some(Fence(row.try_get::<u64, _>(2)?)),
        expires_in: left.map(|us| Duration::from_micros(u64::try_from(us).unwrap_or(0))),
        description: row.try_get(4)?,
    })
}

impl MySqlBackend {
    /// Connects with default settings (`mysql://user:pass@host:port/db`).
    ///
    /// # Errors
    /// [`Error::Config`] for a bad URL, [`Error::Unavailable`] when the
    /// server does not answer, [`Error::Auth`] for refused credentials.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Self::with_config(SqlConfig::new(url)).await
    }

    /// Connects with explicit settings, creating the table unless told not to.
    ///
    /// # Errors
    /// As [`connect`](Self::connect), plus [`Error::Config`] for a table
    /// name that is not a plain identifier.
    pub async fn with_config(cfg: SqlConfig) -> Result<Self, Error> {
        let sql = Statements::new(&cfg)?;
        let pool = pool_options::<MySql>(&cfg)
            .connect(&cfg.url)
            .await
            .map_err(|e| map(NAME, e))?;
        let backend = Self {
            pool,
            sql: Arc::new(sql),
            releases: Arc::default(),
        };
        if cfg.auto_migrate {
            backend.migrate().await?;
        }
        backend.sweep().await?;
        Ok(backend)
    }

    /// Deletes rows expired for longer than [`RETENTION`]; returns how
    /// many. Fences stay monotonic: a fence is at least the server clock in
    /// µs, so the next one exceeds a swept row's unless the server clock
    /// stepped back by more than the retention.
    ///
    /// # Errors
    /// Store errors.
    pub async fn sweep(&self) -> Result<u64, Error> {
        let done = sqlx::query(&self.sql.sweep)
            .bind(micros(RETENTION))
            .bind(micros(RETENTION))
            .execute(&self.pool)
            .await
            .map_err(|e| map(NAME, e))?;
        Ok(done.rows_affected())
    }

    /// Creates the tables if missing. Idempotent.
    ///
    /// # Errors
    /// Store errors, e.g. [`Error::Auth`] without `CREATE` privilege.
    pub async fn migrate(&self) -> Result<(), Error> {
        for stmt in &self.sql.ddl {
            sqlx::query(stmt)
                .execute(&self.pool)
                .await
                .map_err(|e| map(NAME, e))?;
        }
        self.add_info_column().await.map_err(|e| map(NAME, e))
    }

    /// Adds the description column to a table made before it existed
    /// (MySQL has no `ADD COLUMN IF NOT EXISTS`); a migration racing ours
    /// that added it first is no error.
    async fn add_info_column(&self) -> Result<(), sqlx::Error> {
        let present: i64 = sqlx::query_scalar(&self.sql.has_info)
            .fetch_one(&self.pool)
            .await?;
        if present > 0 {
            return Ok(());
        }
        match sqlx::query(&self.sql.add_info).execute(&self.pool).await {
            Err(sqlx::Error::Database(e)) if e.message().contains("Duplicate column") => Ok(()),
            other => other.map(drop),
        }
    }

    async fn read(&self, key: &LockKey) -> Result<Option<HolderInfo>, sqlx::Error> {
        let row = sqlx::query(&self.sql.read)
            .bind(key.as_str())
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| info(&r)).transpose()
    }

    async fn acquire(
        &self,
        key: &LockKey,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, sqlx::Error> {
        let done = sqlx::query(&self.sql.acquire)
            .bind(key.as_str())
            .bind(new.as_str())
            .bind(key.as_str())
            .bind(micros(ttl))
            .execute(&self.pool)
            .await?;
        match done.last_insert_id() {
            0 => Ok(held(self.read(key).await?)),
            fence => Ok(CasOutcome::Acquired {
                fence: Fence(fence),
            }),
        }
    }

    async fn update(
        &self,
        key: &LockKey,
        expected: &Token,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, sqlx::Error> {
        let query = if expected == new {
            sqlx::query(&self.sql.renew).bind(micros(ttl))
        } else {
            sqlx::query(&self.sql.transfer)
                .bind(key.as_str())
                .bind(new.as_str())
                .bind(micros(ttl))
        };
        let done = query
            .bind(key.as_str())
            .bind(expected.as_str())
            .execute(&self.pool)
            .await?;
        Ok(match (done.rows_affected(), done.last_insert_id()) {
            (0, _) | (_, 0) => CasOutcome::Held(Held::default()),
            (_, fence) => CasOutcome::Acquired {
                fence: Fence(fence),
            },
        })
    }
}

impl MySqlBackend {
    /// Renews one run of holds sharing a TTL: one `UPDATE`, then one read
    /// of which `(key, owner)` pairs are now live; marks those in `out`.
    async fn renew_chunk(
        &self,
        ttl: Duration,
        items: &[RenewItem],
        idx: &[usize],
        out: &mut [bool],
    ) -> Result<(), sqlx::Error> {
        let pairs = vec![format!("(?, {EXACT})"); idx.len()].join(", ");
        let t = &self.sql.table;
        let update = format!(
            "UPDATE {t} SET expires_at = {NOW} + INTERVAL ? MICROSECOND \
             WHERE expires_at > {NOW} AND (lock_key, owner) IN ({pairs})"
        );
        let select = format!(
            "SELECT lock_key, owner FROM {t} WHERE expires_at > {NOW} AND (lock_key, owner) IN ({pairs})"
        );
        let mut query = sqlx::query(&update).bind(micros(ttl));
        for &i in idx {
            query = query
                .bind(items[i].key.as_str())
                .bind(items[i].token.as_str());
        }
        query.execute(&self.pool).await?;
        let mut query = sqlx::query(&select);
        for &i in idx {
            query = query
                .bind(items[i].key.as_str())
                .bind(items[i].token.as_str());
        }
        let mut live = HashSet::new();
        for row in query.fetch_all(&self.pool).await? {
            // A binary collation makes the key column read back as bytes.
            let key = String::from_utf8_lossy(&row.try_get::<Vec<u8>, _>(0)?).into_owned();
            live.insert((key, row.try_get::<String, _>(1)?));
        }
        mark_live(items, idx, &live, out);
        Ok(())
    }
}

/// A refused acquisition: held by whoever the read found (nobody, if the
/// hold ended in between).
fn held(row: Option<HolderInfo>) -> CasOutcome {
    CasOutcome::Held(match row {
        Some(info) => Held {
            holder: Some(info.holder),
            expires_in: info.expires_in,
            revision: None,
        },
        None => Held::default(),
    })
}

#[async_trait]
impl Backend for MySqlBackend {
    async fn cas(
        &self,
        key: &LockKey,
        expected: Option<&Token>,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error> {
        check_key(key)?;
        let out = match expected {
            None => self.acquire(key, new, ttl).await,
            Some(expected) => self.update(key, expected, new, ttl).await,
        };
        out.map_err(|e| map(NAME, e))
    }

    async fn delete(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        check_key(key)?;
        let done = convert::delete_owned(&self.pool, &self.sql.delete, key, owner)
            .await
            .map_err(|e| map(NAME, e))?;
        if done && self.releases.release_is_due() {
            let this = self.clone();
            tokio::spawn(async move {
                if let Err(e) = this.sweep().await {
                    tracing::debug!(error = %e, "sweeping expired rows failed");
                }
            });
        }
        Ok(done)
    }

    fn name(&self) -> &'static str {
        NAME
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
impl Inspect for MySqlBackend {
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        check_key(key)?;
        self.read(key).await.map_err(|e| map(NAME, e))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<HolderInfo>, Error> {
        let rows = sqlx::query(&self.sql.list)
            .bind(prefix)
            .bind(prefix)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map(NAME, e))?;
        let all: Vec<HolderInfo> = rows
            .iter()
            .map(info)
            .collect::<Result<_, _>>()
            .map_err(|e| map(NAME, e))?;
        // The padding collation also matches `"a"` for the prefix `"a "`.
        Ok(all
            .into_iter()
            .filter(|i| i.key.starts_with(prefix))
            .collect())
    }
}

#[async_trait]
impl RenewMany for MySqlBackend {
    /// One `UPDATE` and one read per 500 holds of a TTL.
    async fn renew_many(&self, items: &[RenewItem]) -> Result<Vec<bool>, Error> {
        let mut out = vec![false; items.len()];
        for (ttl, idx) in ttl_chunks(items, RENEW_CHUNK) {
            self.renew_chunk(ttl, items, &idx, &mut out)
                .await
                .map_err(|e| map(NAME, e))?;
        }
        Ok(out)
    }
}

#[async_trait]
impl Describe for MySqlBackend {
    /// MySQL counts rows changed, not matched: a description equal to the
    /// stored one changes nothing, so a read tells whether `owner` holds.
    async fn describe(
        &self,
        key: &LockKey,
        owner: &Token,
        description: &str,
    ) -> Result<bool, Error> {
        let done = sqlx::query(&self.sql.describe)
            .bind(description)
            .bind(key.as_str())
            .bind(owner.as_str())
            .execute(&self.pool)
            .await
            .map_err(|e| map(NAME, e))?;
        if done.rows_affected() > 0 {
            return Ok(true);
        }
        let held = self.read(key).await.map_err(|e| map(NAME, e))?;
        Ok(held.is_some_and(|h| &h.holder == owner))
    }
}

#[async_trait]
impl RaiseFence for MySqlBackend {
    /// Records `floor` for the key; every later acquisition or transfer of
    /// it takes a fence above the highest floor recorded.
    async fn raise_fence(&self, key: &LockKey, floor: Fence) -> Result<(), Error> {
        check_key(key)?;
        sqlx::query(&self.sql.raise)
            .bind(key.as_str())
            .bind(floor.get())
            .execute(&self.pool)
            .await
            .map_err(|e| map(NAME, e))?;
        Ok(())
    }
}
