//! MoltLock backends for SQL databases, through sqlx: Postgres (feature
//! `postgres`), SQLite (feature `sqlite`, on by default) and MySQL/MariaDB
//! (feature `mysql`).
//!
//! One backend, [`SqlBackend`], generic over a sealed [`Dialect`] that holds
//! what differs between the databases: the statements, the clock a reply
//! reports and the dialect's own extras. Use it through the aliases
//! [`PostgresBackend`], [`SqliteBackend`] and [`MySqlBackend`].
//!
//! Every backend acquires with one conditional write whose expiry test runs
//! on the database's clock, so skew between client clocks can never give two
//! holders; renewal and release are owner-checked single statements. The
//! table name (and Postgres schema) is configurable and validated as an
//! identifier. See each module for its DDL and its guarantees.
//!
//! Every dialect has a fair queue (`LockOptions::fair()`): a table
//! `<table>_queue` of places numbered in arrival order, where only the head
//! tries the key; a free key with an empty queue is taken at once.
//!
//! Configuration follows the convention of every MoltLock store:
//!
//! ```no_run
//! # async fn demo() -> Result<(), moltlock_core::Error> {
//! use moltlock_sql::{SqlConfig, SqliteBackend};
//! // From a URL (its query parameters included) …
//! let a = SqliteBackend::from_url("sqlite://locks.db?acquire_timeout=2s").await?;
//! // … from a config with builder setters …
//! let cfg = SqlConfig::from_url("sqlite://locks.db")?.table("jobs_locks");
//! let b = SqliteBackend::connect(cfg).await?;
//! // … or on the application's own pool.
//! let c = SqliteBackend::from_client(b.pool().clone(), SqlConfig::default()).await?;
//! # let _ = (a, c); Ok(()) }
//! ```

mod backend;
mod config;
mod convert;
mod dialect;
mod error;
mod fair;
mod kept;
mod multi;
#[cfg(feature = "mysql")]
pub mod mysql;
mod observe;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;

pub use backend::SqlBackend;
pub use config::{check_ident, Expiry, SqlConfig, DEFAULT_MAX_CONNECTIONS, DEFAULT_TABLE};
pub use convert::RETENTION;
pub use dialect::Dialect;
#[cfg(feature = "mysql")]
pub use mysql::MySqlBackend;
#[cfg(feature = "postgres")]
pub use postgres::PostgresBackend;
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteBackend;
/// The sqlx crate these backends are built on, for the pools `from_client`
/// takes (each store module also re-exports its pool types).
pub use sqlx;
