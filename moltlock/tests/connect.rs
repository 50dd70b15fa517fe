//! `connect` reaches every store this build has, through its URL; a store
#![allow(clippy::unwrap_used, clippy::expect_used)] // helpers shared by the tests below unwrap like the tests do
//! whose feature is off gives an error naming that feature.

#[cfg(feature = "mysql")]
use moltlock::BackendExt;
use moltlock::{connect, Error, Store};

async fn lock_once(url: &str, expect: &str) {
    let backend = connect(url).await.unwrap_or_else(|e| panic!("{url}: {e}"));
    assert_eq!(backend.name(), expect);
    let manager = moltlock::LockManager::new(backend);
    let key = format!("facade/{}", moltlock::Token::random());
    let guard = manager.lock(&key).await.unwrap();
    assert!(manager.try_lock(&key).await.unwrap().is_none());
    guard.release().await.unwrap();
    moltlock_fixtures::rows::forget_or_say(url, &[key]).await;
}

#[tokio::test]
async fn sqlite_url() {
    let dir = tempfile::tempdir().unwrap();
    lock_once(
        &format!("sqlite://{}", dir.path().join("f.db").display()),
        "sqlite",
    )
    .await;
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres_url() {
    let url = moltlock_fixtures::postgres::shared_url().unwrap_or_else(|e| panic!("{e}"));
    lock_once(&url, "postgres").await;
    lock_once(&url.replacen("postgres://", "postgresql://", 1), "postgres").await;
}

#[cfg(feature = "mysql")]
#[tokio::test]
async fn mysql_url() {
    let url = moltlock_fixtures::mysql::shared_url().unwrap_or_else(|e| panic!("{e}"));
    lock_once(&url, "mysql").await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_url() {
    let redis = moltlock_fixtures::redis::redis().unwrap_or_else(|e| panic!("{e}"));
    lock_once(&redis.url(), "redis").await;
}

#[cfg(feature = "etcd")]
#[tokio::test]
async fn etcd_url() {
    let etcd = moltlock_fixtures::etcd::start_single().unwrap_or_else(|e| panic!("{e}"));
    lock_once(&format!("etcd://{}", etcd.endpoint()), "etcd").await;
}

/// In a build without some backends (e.g. the default, SQLite only), their
/// URLs fail with an error naming the feature. `scripts/test.sh` runs this
/// file once more with default features so there are stores to check.
#[tokio::test]
async fn stores_not_compiled_in_name_their_feature() {
    let urls = [
        "etcd://127.0.0.1:1",
        "redis://127.0.0.1:1/",
        "postgres://x@127.0.0.1:1/db",
        "mysql://x@127.0.0.1:1/db",
        "sqlite://x.db",
    ];
    let mut checked = 0;
    for url in urls {
        let store = Store::of(url).unwrap();
        if store.compiled_in() {
            continue;
        }
        let err = connect(url)
            .await
            .err()
            .expect("a missing backend connected");
        assert!(matches!(err, Error::Config(_)), "{err:?}");
        assert!(err.to_string().contains(store.feature()), "{err}");
        checked += 1;
    }
    let all = cfg!(all(
        feature = "etcd",
        feature = "redis",
        feature = "postgres",
        feature = "mysql"
    ));
    assert!(all || checked > 0, "no missing store was checked");
}

/// A migration from SQLite to MySQL walks old → both → new on one key, and
/// each phase's fence exceeds every earlier one: MySQL raises its fence
/// minimum like every other built-in store.
#[cfg(feature = "mysql")]
#[tokio::test]
async fn migration_into_mysql_keeps_fences_rising() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = format!("sqlite://{}", dir.path().join("m.db").display());
    let mysql = moltlock_fixtures::mysql::shared_url().unwrap_or_else(|e| panic!("{e}"));
    let key = format!("facade-migrate/{}", moltlock::Token::random());
    let mut last = moltlock::Fence(0);
    // Lift SQLite's fences far above MySQL's (microseconds of server time),
    // so MySQL can only follow by honouring the minimum `both` raises on it.
    for (i, phase) in ["old", "both", "both", "new", "both", "old"]
        .iter()
        .enumerate()
    {
        let url = format!("migrate+{phase}:{sqlite}|{mysql}");
        let manager = moltlock::LockManager::new(connect(&url).await.unwrap());
        let guard = manager.lock(&key).await.unwrap();
        if i == 0 {
            let backend = connect(&sqlite).await.unwrap();
            let minimum = moltlock::Fence(u64::MAX / 4);
            backend.raise_fence(guard.key(), minimum).await.unwrap();
        }
        assert!(
            guard.fence() > last,
            "phase {phase}: fence {} after {last}",
            guard.fence()
        );
        last = guard.fence();
        guard.release().await.unwrap();
    }
    moltlock_fixtures::rows::forget_or_say(&mysql, &[key]).await;
}
