//! What the Postgres test files share: the shared server's URL, fresh
//! names, and dropping a test's tables.

#![allow(dead_code)] // each test file uses its own part

use moltlock_core::Token;
use moltlock_fixtures::postgres;

/// The shared server's URL (or one the fixture starts).
pub fn shared() -> String {
    postgres::shared_url().unwrap_or_else(|e| panic!("{e}"))
}

/// A fresh suffix for a test's table name.
pub fn uuid_suffix() -> String {
    Token::random().as_str().replace('-', "")[..12].to_owned()
}

/// Drops a test's lock table and its fence sequence.
pub async fn drop_lock_table(pool: &sqlx::PgPool, table: &str) {
    for drop in [
        format!("TABLE \"{table}\", \"{table}_queue\""),
        format!("SEQUENCE \"{table}_fence\""),
    ] {
        if let Err(e) = sqlx::query(&format!("DROP {drop}")).execute(pool).await {
            panic!("dropping {drop}: {e}");
        }
    }
}
