//! A backend built from the application's own Redis client locks, and the
//! application's connection keeps working beside it.

use std::time::Duration;

use moltlock_core::LockManager;
use moltlock_fixtures::redis as fx;
use moltlock_redis::redis::{self, AsyncCommands};
use moltlock_redis::{RedisBackend, RedisConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_from_the_applications_client() -> Result<(), Box<dyn std::error::Error>> {
    let server = fx::redis()?;
    let client = redis::Client::open(server.url())?;
    let mut app = client.get_multiplexed_async_connection().await?;
    let prefix = fx::unique_prefix();
    let cfg = RedisConfig::new()
        .key_prefix(prefix.clone())
        .fence_retention(Duration::from_secs(60))
        .restart_quarantine(Duration::ZERO);
    let backend = RedisBackend::from_client(client.clone(), cfg).await?;
    let manager = LockManager::new(backend);
    let guard = manager.lock("from-client").await?;
    assert!(manager.try_lock("from-client").await?.is_none());
    let app_key = format!("{prefix}app-key");
    let () = app.set(&app_key, "still mine").await?;
    let got: String = app.get(&app_key).await?;
    assert_eq!(got, "still mine");
    guard.release().await?;
    assert!(manager.try_lock("from-client").await?.is_some());
    let _: i64 = app.del(&app_key).await?;
    Ok(())
}

#[tokio::test]
async fn from_client_refuses_a_cluster_config() -> Result<(), Box<dyn std::error::Error>> {
    let client = redis::Client::open("redis://127.0.0.1:1/")?;
    let cfg = RedisConfig::from_url("redis+cluster://127.0.0.1:1/")?;
    let res = RedisBackend::from_client(client, cfg).await;
    assert!(
        matches!(res, Err(moltlock_core::Error::Config(_))),
        "{res:?}"
    );
    Ok(())
}
