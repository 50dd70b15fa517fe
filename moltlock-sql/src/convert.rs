//! Conversions and pool settings the SQL backends share.

use std::time::Duration;

use moltlock_core::{Fence, HolderInfo, Token};
use sqlx::{ColumnIndex, Database, Decode, Row, Type};

use crate::SqlConfig;

/// A TTL in whole milliseconds, saturating.
#[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
pub(crate) fn millis(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)
}

/// A TTL in whole microseconds, saturating.
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
pub(crate) fn micros(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX)
}

/// A fence stored as a signed integer (never negative in practice).
#[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
pub(crate) fn fence(v: i64) -> Fence {
    Fence(u64::try_from(v).unwrap_or(0))
}

/// Time left, from milliseconds the database computed.
#[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
pub(crate) fn left_ms(v: Option<i64>) -> Option<Duration> {
    v.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0)))
}

/// Pool settings from the config.
pub(crate) fn pool_options<DB: Database>(cfg: &SqlConfig) -> sqlx::pool::PoolOptions<DB> {
    sqlx::pool::PoolOptions::new()
        .max_connections(cfg.max_connections)
        .acquire_timeout(cfg.acquire_timeout)
}

/// A hold from a row of `(key, owner, fence, ms left)`.
#[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
pub(crate) fn holder_info<'r, R>(row: &'r R) -> Result<HolderInfo, sqlx::Error>
where
    R: Row,
    usize: ColumnIndex<R>,
    String: Decode<'r, R::Database> + Type<R::Database>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
{
    Ok(HolderInfo {
        key: row.try_get(0)?,
        holder: Token::from_stored(row.try_get::<String, _>(1)?),
        fence: Some(fence(row.try_get(2)?)),
        expires_in: left_ms(row.try_get(3)?),
    })
}
