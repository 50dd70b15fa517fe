//! Conversions and pool settings the SQL backends share.

#[cfg(any(feature = "mysql", feature = "sqlite"))]
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

#[cfg(any(feature = "mysql", feature = "sqlite"))]
use moltlock_core::RenewItem;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
use moltlock_core::{Fence, HolderInfo, Token};
use sqlx::Database;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
use sqlx::{ColumnIndex, Decode, Row, Type};

use crate::config::SqlConfig;

/// How long an expired or released row is kept before it is swept (the
/// Postgres and MySQL backends; SQLite deletes released rows at once).
pub const RETENTION: Duration = Duration::from_secs(3600);

/// Counts releases: one in 1,024 is due to sweep expired rows.
#[derive(Default)]
pub struct SweepCounter(std::sync::atomic::AtomicU64);

impl SweepCounter {
    /// Counts one release; true when a sweep is due.
    pub(crate) fn release_is_due(&self) -> bool {
        let n = self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        n.is_multiple_of(1024)
    }
}

/// A TTL in whole units of `unit_ns` nanoseconds, rounded up (a store
/// never holds a key for less than asked), saturating.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
fn whole(ttl: Duration, unit_ns: u128) -> i64 {
    i64::try_from(ttl.as_nanos().div_ceil(unit_ns)).unwrap_or(i64::MAX)
}

/// A TTL in whole milliseconds, rounded up, saturating.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn millis(ttl: Duration) -> i64 {
    whole(ttl, 1_000_000)
}

/// A TTL in whole microseconds, rounded up, saturating.
#[cfg(feature = "mysql")]
pub(crate) fn micros(ttl: Duration) -> i64 {
    whole(ttl, 1_000)
}

/// A fence stored as a signed integer (never negative in practice).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn fence(v: i64) -> Fence {
    Fence(u64::try_from(v).unwrap_or(0))
}

/// Time left, from milliseconds the database computed.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn left_ms(v: Option<i64>) -> Option<Duration> {
    v.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0)))
}

/// A pooled connection idle for at least this long is pinged before a
/// statement uses it.
pub const PING_AFTER_IDLE: Duration = Duration::from_secs(1);

/// Pool settings from the config.
///
/// The pool does not ping every connection it hands out (sqlx's default
/// would: one more round trip before each statement, half the cost of a
/// lock + release on a fast network). It pings only a connection idle for
/// [`PING_AFTER_IDLE`] or more, the ones a server restart or a dropped
/// idle link most likely broke. A connection that breaks in use fails its
/// statement with a retryable error, and the pool's own test when the
/// connection comes back discards it.
pub(crate) fn pool_options<DB: Database>(cfg: &SqlConfig) -> sqlx::pool::PoolOptions<DB> {
    sqlx::pool::PoolOptions::new()
        .max_connections(cfg.max_connections)
        .acquire_timeout(cfg.acquire_timeout)
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= PING_AFTER_IDLE {
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
}

/// A hold from a row of `(key, owner, fence, ms left, description)`.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn holder_info<'r, R>(row: &'r R) -> Result<HolderInfo, sqlx::Error>
where
    R: Row,
    usize: ColumnIndex<R>,
    String: Decode<'r, R::Database> + Type<R::Database>,
    Option<String>: Decode<'r, R::Database>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
{
    Ok(HolderInfo {
        key: row.try_get(0)?,
        holder: Token::from_stored(row.try_get::<String, _>(1)?),
        fence: Some(fence(row.try_get(2)?)),
        expires_in: left_ms(row.try_get(3)?),
        description: row.try_get(4)?,
    })
}

/// The indexes of `items`, grouped by TTL and cut into runs of at most
/// `chunk`, so each run can be renewed by one statement.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) fn ttl_chunks(items: &[RenewItem], chunk: usize) -> Vec<(Duration, Vec<usize>)> {
    let mut by_ttl: BTreeMap<Duration, Vec<usize>> = BTreeMap::new();
    for (i, item) in items.iter().enumerate() {
        by_ttl.entry(item.ttl).or_default().push(i);
    }
    by_ttl
        .into_iter()
        .flat_map(|(ttl, idx)| {
            idx.chunks(chunk.max(1))
                .map(|c| (ttl, c.to_vec()))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Marks in `out` which holds of `idx` are among the `(key, owner)` pairs a
/// renewal statement reported live.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) fn mark_live(
    items: &[RenewItem],
    idx: &[usize],
    live: &HashSet<(String, String)>,
    out: &mut [bool],
) {
    for &i in idx {
        let item = &items[i];
        out[i] = live.contains(&(item.key.as_str().to_owned(), item.token.as_str().to_owned()));
    }
}

/// The number of rows a statement changed (sqlx's result types have no
/// common trait for it).
pub(crate) trait RowsChanged {
    /// Rows the statement changed.
    fn changed(&self) -> u64;
}

macro_rules! rows_changed {
    ($($feature:literal => $result:ty),*) => {$(
        #[cfg(feature = $feature)]
        impl RowsChanged for $result {
            fn changed(&self) -> u64 {
                self.rows_affected()
            }
        }
    )*};
}

rows_changed!(
    "postgres" => sqlx::postgres::PgQueryResult,
    "sqlite" => sqlx::sqlite::SqliteQueryResult,
    "mysql" => sqlx::mysql::MySqlQueryResult
);

/// Runs `sql` with the text parameters `args` bound in order; returns how
/// many rows it changed.
pub(crate) async fn execute<'c, DB, E>(
    conn: E,
    sql: &str,
    args: &[&str],
) -> Result<u64, sqlx::Error>
where
    DB: Database,
    E: sqlx::Executor<'c, Database = DB>,
    DB::QueryResult: RowsChanged,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> <DB as Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    let mut query = sqlx::query(sql);
    for arg in args {
        query = query.bind(*arg);
    }
    Ok(query.execute(conn).await?.changed())
}

/// The holds `sql` reads (rows of `(key, owner, fence, ms left,
/// description)`), with `arg` (a key or a prefix) as its one parameter.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) async fn holds<DB>(
    pool: &sqlx::Pool<DB>,
    sql: &str,
    arg: &str,
) -> Result<Vec<HolderInfo>, sqlx::Error>
where
    DB: Database,
    usize: ColumnIndex<DB::Row>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'r> Option<String>: Decode<'r, DB>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'r> Option<i64>: Decode<'r, DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + Type<DB>,
    for<'q> <DB as Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    let rows = sqlx::query(sql).bind(arg).fetch_all(pool).await?;
    rows.iter().map(holder_info).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    #[test]
    fn a_ttl_in_millis_is_rounded_up() {
        assert_eq!(millis(Duration::from_millis(2000)), 2000);
        assert_eq!(millis(Duration::from_micros(1_999_600)), 2000);
        assert_eq!(millis(Duration::from_nanos(1_000_000_001)), 1001);
        assert_eq!(millis(Duration::MAX), i64::MAX);
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn a_ttl_in_micros_is_rounded_up() {
        assert_eq!(micros(Duration::from_micros(1500)), 1500);
        assert_eq!(micros(Duration::from_nanos(1_500_001)), 1501);
        assert_eq!(micros(Duration::MAX), i64::MAX);
    }
}
