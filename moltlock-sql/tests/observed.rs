//! The observed-expiry mode (`expiry=observed`) on Postgres and SQLite: no
//! hold is judged by a wall clock; a waiter takes a key over only after it
//! saw the same holder and version for the holder's whole TTL.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap

use std::sync::Arc;
use std::time::Duration;

use moltlock_core::{Backend, CasOutcome, Error, LockKey, LockManager, Token};
use moltlock_fixtures::postgres;
use moltlock_sql::{Expiry, PostgresBackend, SqlConfig, SqliteBackend};
use tokio::time::{sleep, Instant};

const TTL: Duration = Duration::from_millis(1500);

async fn pg() -> Arc<dyn Backend> {
    let url = postgres::shared_url().unwrap();
    let cfg = SqlConfig::from_url(&url).unwrap().expiry(Expiry::Observed);
    Arc::new(PostgresBackend::connect(cfg).await.unwrap())
}

async fn sqlite(path: &str) -> Arc<dyn Backend> {
    Arc::new(
        SqliteBackend::from_url(&format!("sqlite://{path}?expiry=observed"))
            .await
            .unwrap(),
    )
}

fn acquired(out: &CasOutcome) -> Option<u64> {
    match out {
        CasOutcome::Acquired { fence } => Some(fence.get()),
        CasOutcome::Held(_) => None,
    }
}

/// A holder that stopped renewing is taken over only once the waiter has
/// watched its unchanged record for its TTL, and then with a higher fence.
async fn dead_holder_is_taken_after_a_full_ttl(holder: Arc<dyn Backend>, waiter: Arc<dyn Backend>) {
    let key = LockKey::new(format!("observed/dead/{}", Token::random())).unwrap();
    let first = acquired(&holder.cas(&key, None, &Token::random(), TTL).await.unwrap()).unwrap();
    sleep(TTL * 2).await; // long dead: a wall-clock store would free it now
    let looked = Instant::now();
    let me = Token::random();
    match waiter.cas(&key, None, &me, TTL).await.unwrap() {
        CasOutcome::Held(h) => assert!(h.expires_in.unwrap() > TTL - Duration::from_millis(200)),
        other => panic!("taken on the first look: {other:?}"),
    }
    sleep(TTL / 2).await;
    assert_eq!(
        acquired(&waiter.cas(&key, None, &me, TTL).await.unwrap()),
        None
    );
    let fence = loop {
        if let Some(f) = acquired(&waiter.cas(&key, None, &me, TTL).await.unwrap()) {
            break f;
        }
        assert!(looked.elapsed() < TTL * 3, "never taken over");
        sleep(Duration::from_millis(20)).await;
    };
    assert!(
        looked.elapsed() >= TTL,
        "taken after {:?}",
        looked.elapsed()
    );
    assert!(fence > first, "fence {fence} after {first}");
    assert!(waiter.delete(&key, &me).await.unwrap());
}

/// A holder that keeps renewing is never taken over; its release frees the
/// key at once.
async fn live_holder_is_never_taken(holder: Arc<dyn Backend>, waiter: Arc<dyn Backend>) {
    let key = format!("observed/live/{}", Token::random());
    let held = LockManager::builder(holder).ttl(TTL).build().unwrap();
    let guard = held.lock(&key).await.unwrap();
    let other = LockManager::builder(waiter).ttl(TTL).build().unwrap();
    let res = other.lock_timeout(&key, TTL * 3).await;
    assert!(matches!(res, Err(Error::Timeout { .. })), "{res:?}");
    assert!(guard.is_held());
    let first = guard.fence();
    guard.release().await.unwrap();
    let started = Instant::now();
    let next = other
        .lock_timeout(&key, Duration::from_secs(2))
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
    assert!(next.fence() > first);
    next.release().await.unwrap();
}

/// Deletes the rows this file's tests made under `prefix` (each test has its
/// own, since they run at once).
async fn clean_pg(prefix: &str) {
    let url = postgres::shared_url().unwrap();
    let b = PostgresBackend::from_url(&url).await.unwrap();
    sqlx::query("DELETE FROM moltlock_locks WHERE left(key, length($1)) = $1")
        .bind(prefix)
        .execute(b.pool())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_observed_expiry() {
    dead_holder_is_taken_after_a_full_ttl(pg().await, pg().await).await;
    live_holder_is_never_taken(pg().await, pg().await).await;
    clean_pg("observed/dead/").await;
    clean_pg("observed/live/").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_observed_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("observed.db").display().to_string();
    dead_holder_is_taken_after_a_full_ttl(sqlite(&path).await, sqlite(&path).await).await;
    live_holder_is_never_taken(sqlite(&path).await, sqlite(&path).await).await;
}

/// Nodes in the two modes share one table, so a fleet switched node by node
/// never has two holders: each sees the other's holds.
async fn modes_see_each_others_holds(plain: Arc<dyn Backend>, observed: Arc<dyn Backend>) {
    for (holder, other) in [(&plain, &observed), (&observed, &plain)] {
        let key = format!("observed/mixed/{}", Token::random());
        let held = LockManager::builder(holder.clone())
            .ttl(TTL)
            .build()
            .unwrap();
        let guard = held.lock(&key).await.unwrap();
        let rival = LockManager::builder(other.clone())
            .ttl(TTL)
            .build()
            .unwrap();
        assert!(
            rival.try_lock(&key).await.unwrap().is_none(),
            "two holders of {key}"
        );
        let first = guard.fence();
        guard.release().await.unwrap();
        let next = rival
            .try_lock(&key)
            .await
            .unwrap()
            .expect("a released key is free");
        assert!(next.fence() > first);
        next.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_modes_share_holds() {
    let url = postgres::shared_url().unwrap();
    let plain: Arc<dyn Backend> = Arc::new(PostgresBackend::from_url(&url).await.unwrap());
    modes_see_each_others_holds(plain, pg().await).await;
    clean_pg("observed/mixed/").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_modes_share_holds() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mixed.db").display().to_string();
    let plain: Arc<dyn Backend> = Arc::new(SqliteBackend::from_url(&path).await.unwrap());
    modes_see_each_others_holds(plain, sqlite(&path).await).await;
}

#[tokio::test]
async fn mysql_refuses_observed_expiry() {
    let cfg = SqlConfig::from_url("mysql://root@127.0.0.1:1/x?expiry=observed").unwrap();
    let res = moltlock_sql::MySqlBackend::connect(cfg).await;
    assert!(matches!(res, Err(Error::Config(_))), "{res:?}");
}
