//! The SQLite statements of one table, built once from validated names.

use moltlock_core::Error;

use crate::config::{Expiry, SqlConfig};

/// Milliseconds since the epoch by SQLite's clock.
const NOW: &str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";

pub(super) struct Statements {
    pub(super) acquire: String,
    pub(super) holder: String,
    pub(super) renew: String,
    pub(super) renew_many: String,
    pub(super) transfer: String,
    pub(super) delete: String,
    pub(super) raise: String,
    pub(super) describe: String,
    pub(super) inspect: String,
    pub(super) list: String,
    /// Per column added since the first schema: whether the table has it,
    /// and how to add it (tables made before it).
    pub(super) columns: Vec<(String, String)>,
    pub(super) ddl: Vec<String>,
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
    pub(super) fn new(cfg: &SqlConfig) -> Result<Self, Error> {
        let name = cfg.checked_table()?;
        let seq = format!("\"{name}_fence\"");
        let observed = cfg.expiry == Expiry::Observed;
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
        }
    }
}
