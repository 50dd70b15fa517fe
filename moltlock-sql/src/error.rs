//! Maps sqlx errors into MoltLock's error kinds, in one place.

use moltlock_core::Error;

/// A dialect's failure: the database's (mapped by [`map`] at the backend's
/// edge) or one MoltLock found itself.
pub enum Fail {
    /// The driver's or the database's error.
    Sql(sqlx::Error),
    /// An error already in MoltLock's terms.
    Lock(Error),
}

impl From<sqlx::Error> for Fail {
    fn from(e: sqlx::Error) -> Self {
        Self::Sql(e)
    }
}

impl From<Error> for Fail {
    fn from(e: Error) -> Self {
        Self::Lock(e)
    }
}

impl Fail {
    /// The failure in MoltLock's terms.
    pub(crate) fn into_error(self, backend: &'static str) -> Error {
        match self {
            Self::Sql(e) => map(backend, e),
            Self::Lock(e) => e,
        }
    }
}

/// Maps a database error, keeping it as the [`source`](std::error::Error::source).
/// Connection trouble is retryable; credentials and privileges are permanent
/// `Auth` errors; serialization failures, deadlocks and busy databases are
/// retryable `Store` errors.
///
/// Every message is redacted (by the constructors of [`Error`]): a server
/// may echo part of a mistyped URL (`postgres:/user:pw@host/db` makes
/// `user:pw@host/db` a database name), and no password may reach a log.
pub(crate) fn map(backend: &'static str, e: sqlx::Error) -> Error {
    let mapped = match &e {
        sqlx::Error::Configuration(msg) => return Error::config(format!("{backend}: {msg}")),
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => Error::unavailable(backend, &e),
        sqlx::Error::Database(db) => map_db(backend, db.as_ref()),
        other => Error::store(backend, other, false),
    };
    mapped.with_source(e)
}

fn map_db(backend: &'static str, db: &dyn sqlx::error::DatabaseError) -> Error {
    let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
    let msg = format!("{} (code {code})", db.message());
    match classify(&code) {
        Kind::Auth => Error::auth(backend, msg),
        Kind::Unavailable => Error::unavailable(backend, msg),
        Kind::Retry => Error::store(backend, msg, true),
        Kind::Permanent => Error::store(backend, msg, false),
    }
}

enum Kind {
    Auth,
    Unavailable,
    Retry,
    Permanent,
}

/// Postgres SQLSTATEs, MySQL error numbers and SQLite result codes.
fn classify(code: &str) -> Kind {
    match code {
        // Postgres: invalid authorization, invalid password, insufficient privilege.
        "28000" | "28P01" | "42501" => Kind::Auth,
        // MySQL: access denied for user / to database, command or table denied.
        "1044" | "1045" | "1142" | "1143" | "1227" => Kind::Auth,
        // SQLite: permission denied, authorization denied.
        "3" | "23" => Kind::Auth,
        // Postgres: serialization failure, deadlock, lock not available.
        "40001" | "40P01" | "55P03" => Kind::Retry,
        // MySQL: deadlock, lock wait timeout.
        "1213" | "1205" => Kind::Retry,
        // SQLite: busy, locked, busy snapshot, busy recovery.
        "5" | "6" | "261" | "517" => Kind::Retry,
        // Postgres: admin shutdown, crash shutdown, cannot connect now, too many connections.
        "57P01" | "57P02" | "57P03" | "53300" => Kind::Unavailable,
        c if c.starts_with("08") => Kind::Unavailable,
        _ => Kind::Permanent,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_error_is_the_source() {
        let e = map("postgres", sqlx::Error::PoolTimedOut);
        assert!(e.is_retryable());
        let source = std::error::Error::source(&e).expect("no source");
        assert!(matches!(
            source.downcast_ref::<sqlx::Error>(),
            Some(sqlx::Error::PoolTimedOut)
        ));
        let e = map("sqlite", sqlx::Error::RowNotFound);
        assert!(!e.is_retryable());
        assert!(std::error::Error::source(&e).is_some());
    }
}
