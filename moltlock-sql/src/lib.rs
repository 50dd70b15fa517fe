//! MoltLock backends for SQL databases, through sqlx: Postgres (feature
//! `postgres`), SQLite (feature `sqlite`, on by default) and MySQL/MariaDB
//! (feature `mysql`).
//!
//! Every backend acquires with one conditional write whose expiry test runs
//! on the database's clock, so skew between client clocks can never give two
//! holders; renewal and release are owner-checked single statements. The
//! table name (and Postgres schema) is configurable and validated as an
//! identifier. See each module for its DDL and its guarantees.

mod config;
mod convert;
mod error;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
mod observe;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;

pub use config::{check_ident, redact, Expiry, SqlConfig, DEFAULT_TABLE};
pub use convert::RETENTION;
#[cfg(feature = "mysql")]
pub use mysql::MySqlBackend;
#[cfg(feature = "postgres")]
pub use postgres::PostgresBackend;
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteBackend;
