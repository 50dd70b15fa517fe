//! A fair wait dropped while its look is held up in the database (another
//! writer holds what the look must wait for) leaves no place behind once
//! the look lands late: the dropped wait leaves again until the backend's
//! late-write bound has passed.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap

use std::time::Duration;

use moltlock_core::{Backend, Error, LockManager, LockOptions, RetryPolicy};
use moltlock_sql::sqlx;
use moltlock_sql::{PostgresBackend, SqlConfig, SqliteBackend};
use sqlx::Connection;

/// A unique table name for this run.
fn table() -> String {
    format!(
        "fair_leave_{}",
        moltlock_core::Token::random().as_str().replace('-', "")
    )
}

/// Waits fairly for `key` behind a live place of someone else's, for less
/// time than the database holds the look up; the wait is dropped.
async fn dropped_wait(backend: impl Backend + 'static, key: &str) {
    let manager = LockManager::builder(backend)
        .ttl(Duration::from_secs(8))
        .retry(RetryPolicy::Fixed(Duration::from_millis(20)))
        .build()
        .unwrap();
    let opts = LockOptions::new()
        .fair()
        .timeout(Duration::from_millis(600));
    let got = manager.acquire(key, opts).await;
    assert!(matches!(got, Err(Error::Timeout { .. })), "{got:?}");
}

/// Drops a Postgres test's lock table, queue table and fence sequence.
async fn drop_tables(pool: &sqlx::PgPool, t: &str) {
    for stmt in [
        format!("DROP TABLE IF EXISTS \"{t}\", \"{t}_queue\""),
        format!("DROP SEQUENCE IF EXISTS \"{t}_fence\""),
    ] {
        sqlx::query(&stmt).execute(pool).await.unwrap();
    }
}

/// A Postgres backend on a fresh table of the shared server, its pool and
/// the table's name.
async fn postgres() -> (PostgresBackend, sqlx::PgPool, String) {
    let url = moltlock_fixtures::postgres::shared_url().unwrap_or_else(|e| panic!("{e}"));
    let t = table();
    let backend = PostgresBackend::connect(SqlConfig::from_url(&url).unwrap().table(&t))
        .await
        .unwrap();
    let pool = backend.pool().clone();
    (backend, pool, t)
}

/// The places of key `k` in `t`'s queue other than the ghost ahead.
fn others(t: &str) -> String {
    format!("SELECT owner FROM \"{t}_queue\" WHERE key = 'k' AND owner <> 'ghost'")
}

/// How long after the database let the held-up look land its place is
/// looked for: past the dropped wait's later leaves.
const SETTLED: Duration = Duration::from_millis(1500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_dropped_wait_held_up_by_a_writer_leaves_no_place() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let t = table();
    let backend = SqliteBackend::connect(SqlConfig::from_url(&url).unwrap().table(&t))
        .await
        .unwrap();
    let pool = backend.pool().clone();
    sqlx::query(&format!(
        "INSERT INTO \"{t}_queue\" (key, owner, alive_until) VALUES ('k', 'ghost', 9e15)"
    ))
    .execute(&pool)
    .await
    .unwrap();
    // The waiter queues behind the ghost and looks; then another writer of
    // the file (as any other locker's statement is) holds its next look up.
    let waiting = tokio::spawn(dropped_wait(backend, "k"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut other = sqlx::SqliteConnection::connect(&url).await.unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .unwrap();
    waiting.await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    sqlx::query("COMMIT").execute(&mut other).await.unwrap();
    tokio::time::sleep(SETTLED).await;
    let left: Vec<String> = sqlx::query_scalar(&others(&t))
        .fetch_all(&pool)
        .await
        .unwrap();
    assert!(left.is_empty(), "places left behind: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_dropped_wait_held_up_by_a_row_lock_leaves_no_place() {
    let (backend, pool, t) = postgres().await;
    // A live place ahead, and a dead one the look must delete, locked by
    // another transaction.
    sqlx::query(&format!(
        "INSERT INTO \"{t}_queue\" (key, owner, alive_until) VALUES \
         ('k', 'ghost', now() + interval '1 hour'), ('k', 'dead', now() - interval '1 hour')"
    ))
    .execute(&pool)
    .await
    .unwrap();
    let mut other = pool.begin().await.unwrap();
    sqlx::query(&format!(
        "SELECT 1 FROM \"{t}_queue\" WHERE owner = 'dead' FOR UPDATE"
    ))
    .execute(&mut *other)
    .await
    .unwrap();
    dropped_wait(backend, "k").await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    other.commit().await.unwrap();
    tokio::time::sleep(SETTLED).await;
    let left: Vec<String> = sqlx::query_scalar(&others(&t))
        .fetch_all(&pool)
        .await
        .unwrap();
    drop_tables(&pool, &t).await;
    // The late look deleted the dead place; its own must be gone too.
    assert!(left.is_empty(), "places left behind: {left:?}");
}

/// The sweep deletes places whose time ended more than an hour ago (a
/// waiter that vanished from a key nobody waited for since), and no other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_sweep_deletes_places_dead_for_an_hour() {
    let (backend, pool, t) = postgres().await;
    sqlx::query(&format!(
        "INSERT INTO \"{t}_queue\" (key, owner, alive_until) VALUES \
         ('k', 'old', now() - interval '2 hours'), ('k', 'recent', now() - interval '1 minute'), \
         ('k', 'live', now() + interval '1 minute')"
    ))
    .execute(&pool)
    .await
    .unwrap();
    backend.sweep().await.unwrap();
    let sql = format!("SELECT owner FROM \"{t}_queue\" ORDER BY owner");
    let left: Vec<String> = sqlx::query_scalar(&sql).fetch_all(&pool).await.unwrap();
    drop_tables(&pool, &t).await;
    assert_eq!(left, ["live", "recent"]);
}
