//! The SQL floors: each store's cheapest correct lock recipe, written here
//! against a table of the harness's own. A free or expired row is taken by
//! one conditional insert; the release is one owner-checked delete.

use std::sync::LazyLock;

use sqlx::{MySqlConnection, MySqlPool, PgConnection, PgPool, SqlitePool};

use super::{err, Lent, Split, TTL};

/// Drops the floor's table.
pub(super) static DROP: LazyLock<String> =
    LazyLock::new(|| named("DROP TABLE IF EXISTS moltlock_bench_floor"));

/// Postgres: expiry by the server's clock.
pub(super) static PG_TABLE: LazyLock<String> = LazyLock::new(|| {
    named(
        "CREATE TABLE IF NOT EXISTS moltlock_bench_floor \
     (k TEXT PRIMARY KEY, token TEXT NOT NULL, expires_at TIMESTAMPTZ NOT NULL)",
    )
});

/// SQLite: expiry in milliseconds of the process clock (SQLite's clock is
/// its client's), rows in the key's B-tree (`WITHOUT ROWID`), as the
/// backend's own table.
pub(super) static SQLITE_TABLE: LazyLock<String> = LazyLock::new(|| {
    named(
        "CREATE TABLE IF NOT EXISTS moltlock_bench_floor \
     (k TEXT PRIMARY KEY, token TEXT NOT NULL, expires_at INTEGER NOT NULL) WITHOUT ROWID",
    )
});

/// MySQL/MariaDB: expiry in milliseconds of the server's clock.
pub(super) static MYSQL_TABLE: LazyLock<String> = LazyLock::new(|| {
    named(
        "CREATE TABLE IF NOT EXISTS moltlock_bench_floor \
     (k VARCHAR(191) PRIMARY KEY, token VARCHAR(64) NOT NULL, expires_at BIGINT NOT NULL)",
    )
});

static PG_TAKE: LazyLock<String> = LazyLock::new(|| {
    named(
        "INSERT INTO moltlock_bench_floor (k, token, expires_at) \
     VALUES ($1, $2, now() + $3 * interval '1 millisecond') \
     ON CONFLICT (k) DO UPDATE SET token = EXCLUDED.token, expires_at = EXCLUDED.expires_at \
     WHERE moltlock_bench_floor.expires_at < now()",
    )
});
static PG_RELEASE: LazyLock<String> =
    LazyLock::new(|| named("DELETE FROM moltlock_bench_floor WHERE k = $1 AND token = $2"));

static SQLITE_TAKE: LazyLock<String> = LazyLock::new(|| {
    named(
        "INSERT INTO moltlock_bench_floor (k, token, expires_at) \
     VALUES (?1, ?2, ?3 + ?4) \
     ON CONFLICT (k) DO UPDATE SET token = excluded.token, expires_at = excluded.expires_at \
     WHERE moltlock_bench_floor.expires_at < ?3",
    )
});
static SQLITE_RELEASE: LazyLock<String> =
    LazyLock::new(|| named("DELETE FROM moltlock_bench_floor WHERE k = ?1 AND token = ?2"));

/// The assignments run in order: the token is compared with the old expiry
/// before the expiry is replaced.
static MYSQL_TAKE: LazyLock<String> = LazyLock::new(|| {
    named(
        "INSERT INTO moltlock_bench_floor (k, token, expires_at) \
     VALUES (?, ?, ROUND(UNIX_TIMESTAMP(NOW(3)) * 1000) + ?) \
     ON DUPLICATE KEY UPDATE \
     token = IF(expires_at < ROUND(UNIX_TIMESTAMP(NOW(3)) * 1000), VALUES(token), token), \
     expires_at = IF(token = VALUES(token), VALUES(expires_at), expires_at)",
    )
});
static MYSQL_RELEASE: LazyLock<String> =
    LazyLock::new(|| named("DELETE FROM moltlock_bench_floor WHERE k = ? AND token = ?"));

/// The statements name a table of this process's own, so runs side by side
/// (the smoke tests) never create, use or drop one another's table.
fn named(statement: &str) -> String {
    let table = format!("moltlock_bench_floor_{}", std::process::id());
    statement.replace("moltlock_bench_floor", &table)
}

fn ttl_ms() -> i64 {
    i64::try_from(TTL.as_millis()).unwrap_or(i64::MAX)
}

/// One `SELECT 1` on a lent connection: the bare round trip.
pub(super) async fn select_one<DB>(lent: &Lent<DB>) -> Result<(), String>
where
    DB: sqlx::Database,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    let mut c = lent.take().await?;
    let done = sqlx::query("SELECT 1").execute(&mut *c).await;
    lent.give(c);
    done.map(drop).map_err(err)
}

/// Takes the free `key` and releases it; whether both happened.
pub(super) async fn pg_cycle(
    conn: &mut PgConnection,
    key: &str,
    token: &str,
    split: &mut Split,
) -> Result<bool, String> {
    let take = sqlx::query(&PG_TAKE)
        .bind(key)
        .bind(token)
        .bind(ttl_ms())
        .execute(&mut *conn)
        .await
        .map_err(err)?;
    split.mark();
    let release = sqlx::query(&PG_RELEASE)
        .bind(key)
        .bind(token)
        .execute(&mut *conn)
        .await
        .map_err(err)?;
    Ok(take.rows_affected() == 1 && release.rows_affected() == 1)
}

/// As [`pg_cycle`], on SQLite.
pub(super) async fn sqlite_cycle(
    pool: &SqlitePool,
    key: &str,
    token: &str,
    split: &mut Split,
) -> Result<bool, String> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(err)?;
    let now_ms = i64::try_from(now.as_millis()).unwrap_or(i64::MAX);
    let take = sqlx::query(&SQLITE_TAKE)
        .bind(key)
        .bind(token)
        .bind(now_ms)
        .bind(ttl_ms())
        .execute(pool)
        .await
        .map_err(err)?;
    split.mark();
    let release = sqlx::query(&SQLITE_RELEASE)
        .bind(key)
        .bind(token)
        .execute(pool)
        .await
        .map_err(err)?;
    Ok(take.rows_affected() == 1 && release.rows_affected() == 1)
}

/// As [`pg_cycle`], on MySQL/MariaDB (an insert reports 1 row, a takeover 2).
pub(super) async fn mysql_cycle(
    conn: &mut MySqlConnection,
    key: &str,
    token: &str,
    split: &mut Split,
) -> Result<bool, String> {
    let take = sqlx::query(&MYSQL_TAKE)
        .bind(key)
        .bind(token)
        .bind(ttl_ms())
        .execute(&mut *conn)
        .await
        .map_err(err)?;
    split.mark();
    let release = sqlx::query(&MYSQL_RELEASE)
        .bind(key)
        .bind(token)
        .execute(&mut *conn)
        .await
        .map_err(err)?;
    Ok(matches!(take.rows_affected(), 1 | 2) && release.rows_affected() == 1)
}

/// Deletes the rows a run's lock keys (`prefix`…) left in the backend's
/// Postgres `table` and its fair queue: released keys keep their row (for
/// their fences), so every run would otherwise grow the shared table.
pub(super) async fn pg_forget(pool: &PgPool, table: &str, prefix: &str) -> Result<(), String> {
    let tables = [table.to_owned(), queue_table(table)];
    let stmts = tables.map(|t| format!("DELETE FROM {t} WHERE key LIKE $1"));
    delete_like(pool, &stmts, prefix).await
}

/// As [`pg_forget`], on MySQL/MariaDB (the fence floor table too).
pub(super) async fn mysql_forget(
    pool: &MySqlPool,
    table: &str,
    prefix: &str,
) -> Result<(), String> {
    let inner = table.trim_matches('`');
    let tables = [
        table.to_owned(),
        format!("`{inner}_queue`"),
        format!("`{inner}_floor`"),
    ];
    let stmts = tables.map(|t| format!("DELETE FROM {t} WHERE lock_key LIKE ?"));
    delete_like(pool, &stmts, prefix).await
}

/// Runs each of `stmts` with the pattern of the keys starting `prefix`.
async fn delete_like<DB: sqlx::Database>(
    pool: &sqlx::Pool<DB>,
    stmts: &[String],
    prefix: &str,
) -> Result<(), String>
where
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    let pattern = format!("{}%", like_escaped(prefix));
    for stmt in stmts {
        sqlx::query::<DB>(stmt)
            .bind(pattern.clone())
            .execute(pool)
            .await
            .map_err(err)?;
    }
    Ok(())
}

/// `text` matched literally by `LIKE` (whose escape character is `\\` on
/// Postgres and MySQL): `%` and `_` are not wildcards in it.
fn like_escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '\\' | '%' | '_') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The fair queue's table beside a quoted Postgres table name.
fn queue_table(table: &str) -> String {
    match table.strip_suffix('"') {
        Some(open) => format!("{open}_queue\""),
        None => format!("{table}_queue"),
    }
}

#[cfg(test)]
mod tests {
    use super::{like_escaped, queue_table};

    #[test]
    fn a_prefix_is_matched_literally() {
        assert_eq!(like_escaped("bench/a_b%c\\d/"), "bench/a\\_b\\%c\\\\d/");
        assert_eq!(like_escaped("bench/0af3/"), "bench/0af3/");
    }

    #[test]
    fn the_queue_sits_beside_its_table() {
        assert_eq!(queue_table("\"s\".\"t\""), "\"s\".\"t_queue\"");
        assert_eq!(queue_table("plain"), "plain_queue");
    }
}
