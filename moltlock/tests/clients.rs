//! A backend over the application's own client, with every type named
//! through the facade's store modules: an application needs no sqlx, redis
//! or etcd-client dependency of its own to hand its client over.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap

use moltlock::{LockManager, Token};

/// Locks and releases a key through `manager`, and checks it is held
/// meanwhile. Returns the key.
async fn lock_once(manager: &LockManager) -> String {
    let key = format!("facade-client/{}", Token::random());
    let guard = manager.lock(&key).await.unwrap();
    assert!(manager.try_lock(&key).await.unwrap().is_none());
    guard.release().await.unwrap();
    key
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_pool() {
    use moltlock::sqlite::{SqlConfig, SqliteBackend, SqliteConnectOptions, SqlitePoolOptions};

    let dir = tempfile::tempdir().unwrap();
    let options = SqliteConnectOptions::new()
        .filename(dir.path().join("app.db"))
        .create_if_missing(true);
    let pool = SqlitePoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .unwrap();
    let cfg = SqlConfig::default().table("app_locks");
    let backend = SqliteBackend::from_client(pool.clone(), cfg).await.unwrap();
    lock_once(&LockManager::new(backend)).await;
    // The pool stays the application's.
    let n: (i64,) = moltlock::sqlite::sqlx::query_as("SELECT count(*) FROM app_locks")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(n.0, 0);
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres_pool() {
    use moltlock::postgres::{PgPool, PostgresBackend, SqlConfig};

    let url = moltlock_fixtures::postgres::shared_url().unwrap_or_else(|e| panic!("{e}"));
    let pool = PgPool::connect(&url).await.unwrap();
    let backend = PostgresBackend::from_client(pool.clone(), SqlConfig::default())
        .await
        .unwrap();
    let key = lock_once(&LockManager::new(backend)).await;
    moltlock_fixtures::rows::forget_or_say(&url, &[key]).await;
    let one: (i32,) = moltlock::postgres::sqlx::query_as("SELECT 1")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(one.0, 1);
}

#[cfg(feature = "mysql")]
#[tokio::test]
async fn mysql_pool() {
    use moltlock::mysql::{MySqlBackend, MySqlPool, SqlConfig};

    let url = moltlock_fixtures::mysql::shared_url().unwrap_or_else(|e| panic!("{e}"));
    let pool = MySqlPool::connect(&url).await.unwrap();
    let backend = MySqlBackend::from_client(pool.clone(), SqlConfig::default())
        .await
        .unwrap();
    let key = lock_once(&LockManager::new(backend)).await;
    moltlock_fixtures::rows::forget_or_say(&url, &[key]).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_client() {
    use moltlock::redis::{Client, RedisBackend, RedisConfig};

    let server = moltlock_fixtures::redis::redis().unwrap_or_else(|e| panic!("{e}"));
    let client = Client::open(server.url()).unwrap();
    let cfg = RedisConfig::new()
        .key_prefix(moltlock_fixtures::redis::unique_prefix())
        .restart_quarantine(std::time::Duration::ZERO)
        // Leave no fence key behind on a shared server for long.
        .fence_retention(std::time::Duration::from_secs(600));
    let backend = RedisBackend::from_client(client, cfg).await.unwrap();
    lock_once(&LockManager::new(backend)).await;
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_client() {
    use moltlock::etcd::{Client, EtcdBackend, EtcdConfig};

    let etcd = moltlock_fixtures::etcd::start_single().unwrap_or_else(|e| panic!("{e}"));
    let client = Client::connect([etcd.endpoint()], None).await.unwrap();
    let backend = EtcdBackend::from_client(client, EtcdConfig::default()).unwrap();
    lock_once(&LockManager::new(backend)).await;
}
