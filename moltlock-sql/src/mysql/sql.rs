//! The statements of one MySQL/MariaDB table, built once from validated
//! names.

use moltlock_core::Error;

use crate::config::{Expiry, SqlConfig};

/// The server clock in UTC, to the microsecond: expiry is judged by it.
pub(super) const NOW: &str = "UTC_TIMESTAMP(6)";
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

/// The statements of one table.
pub(super) struct Statements {
    pub(super) table: String,
    pub(super) acquire: String,
    pub(super) read: String,
    /// `read` of several keys, less the list of keys and its `)`.
    pub(super) read_in: String,
    pub(super) renew: String,
    pub(super) transfer: String,
    pub(super) delete: String,
    pub(super) list: String,
    pub(super) raise: String,
    pub(super) sweep: String,
    pub(super) describe: String,
    /// Whether the table has the `info` column (tables made before it).
    pub(super) has_info: String,
    pub(super) add_info: String,
    pub(super) ddl: Vec<String>,
}

impl Statements {
    pub(super) fn new(cfg: &SqlConfig) -> Result<Self, Error> {
        let name = cfg.checked_table()?;
        if cfg.expiry != Expiry::StoreClock {
            return Err(Error::Config(
                "the MySQL backend judges expiry by the server clock only (expiry=store)".into(),
            ));
        }
        let t = format!("`{name}`");
        let floors = format!("`{name}_floor`");
        let floor = fence_floor(&floors);
        let key_col =
            "lock_key VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY";
        let left = format!("TIMESTAMPDIFF(MICROSECOND, {NOW}, expires_at)");
        Ok(Self {
            table: t.clone(),
            acquire: upsert(name, "VALUES (", ")"),
            read: format!(
                "SELECT lock_key, owner, fence, {left}, info FROM {t} \
                 WHERE lock_key = ? AND expires_at > {NOW}"
            ),
            read_in: format!(
                "SELECT lock_key, owner, fence, {left}, info FROM {t} \
                 WHERE expires_at > {NOW} AND lock_key IN ("
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

/// The acquisition of a free key in table `name`, the new row made by
/// `open … close` around its values (`VALUES (…)`, or a `SELECT` whose
/// `WHERE` may yield no row, when nothing is written). Parameters: key,
/// owner, key (of the fence floor), TTL in µs, then any of the `close`.
///
/// Each column's update is guarded by `expires_at`, assigned last; a held
/// key sets `LAST_INSERT_ID(0)`, so the reply's insert id is the fence
/// taken, or 0.
pub(super) fn upsert(name: &str, open: &str, close: &str) -> String {
    let t = format!("`{name}`");
    let floor = fence_floor(&format!("`{name}_floor`"));
    let free = format!("expires_at <= {NOW}");
    format!(
        "INSERT INTO {t} (lock_key, owner, fence, expires_at, acquired_at) \
         {open}?, ?, LAST_INSERT_ID(GREATEST({MICROS}, {floor})), \
         {NOW} + INTERVAL ? MICROSECOND, {NOW}{close} \
         ON DUPLICATE KEY UPDATE \
         owner = IF({free}, VALUES(owner), owner), \
         fence = IF({free}, LAST_INSERT_ID(GREATEST(fence + 1, VALUES(fence))), \
         fence + LAST_INSERT_ID(0)), \
         acquired_at = IF({free}, VALUES(acquired_at), acquired_at), \
         info = IF({free}, NULL, info), \
         expires_at = IF({free}, VALUES(expires_at), expires_at)"
    )
}

/// The least fence `raise_fence` allows next for the key `?` (0 if none),
/// from the floors table `floors`.
fn fence_floor(floors: &str) -> String {
    format!("COALESCE((SELECT floor + 1 FROM {floors} WHERE {floors}.lock_key = ?), 0)")
}

impl Statements {
    /// The renewal of `n` `(key, owner)` pairs sharing a TTL, and the read
    /// of which of them are live afterwards.
    pub(super) fn renew_chunk(&self, n: usize) -> (String, String) {
        let pairs = vec![format!("(?, {EXACT})"); n].join(", ");
        let t = &self.table;
        let update = format!(
            "UPDATE {t} SET expires_at = {NOW} + INTERVAL ? MICROSECOND \
             WHERE expires_at > {NOW} AND (lock_key, owner) IN ({pairs})"
        );
        let select = format!(
            "SELECT lock_key, owner FROM {t} WHERE expires_at > {NOW} AND (lock_key, owner) IN ({pairs})"
        );
        (update, select)
    }
}
