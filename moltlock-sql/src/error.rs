//! Maps sqlx errors into MoltLock's error kinds.

use moltlock_core::Error;

/// Maps a database error. Connection trouble is retryable; credentials and
/// privileges are permanent `Auth` errors; serialization failures, deadlocks
/// and busy databases are retryable `Store` errors.
///
/// Every message goes through [`moltlock_core::redact`]: a server may echo
/// part of a mistyped URL (`postgres:/user:pw@host/db` makes `user:pw@host/db`
/// a database name), and no password may reach a log.
pub(crate) fn map(backend: &'static str, e: sqlx::Error) -> Error {
    moltlock_core::redact_error(map_unredacted(backend, e))
}

fn map_unredacted(backend: &'static str, e: sqlx::Error) -> Error {
    match e {
        sqlx::Error::Configuration(msg) => Error::Config(format!("{backend}: {msg}")),
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => Error::unavailable(backend, e),
        sqlx::Error::Database(db) => map_db(backend, db.as_ref()),
        other => Error::store(backend, other, false),
    }
}

fn map_db(backend: &'static str, db: &dyn sqlx::error::DatabaseError) -> Error {
    let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
    let msg = db.message().to_owned();
    match classify(&code) {
        Kind::Auth => Error::auth(backend, format!("{msg} (code {code})")),
        Kind::Unavailable => Error::unavailable(backend, format!("{msg} (code {code})")),
        Kind::Retry => Error::store(backend, format!("{msg} (code {code})"), true),
        Kind::Permanent => Error::store(backend, format!("{msg} (code {code})"), false),
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
