//! Release wake-ups: with 8 tasks contending on one key and a 1 s retry
//! delay, the next holder follows a release within milliseconds (a sanity
//! bound, not a benchmark: polling could not explain it).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use moltlock_core::{LockManager, RetryPolicy};
use moltlock_fixtures::redis as fx;
use moltlock_redis::{redis, RedisBackend, RedisConfig};
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_waiters_wake_on_release() -> Result<(), Box<dyn std::error::Error>> {
    let server = fx::redis()?;
    let cfg = RedisConfig::from_url(&server.url())?
        .key_prefix(fx::unique_prefix())
        .fence_retention(Duration::from_secs(600));
    let backend = RedisBackend::connect(cfg).await?;
    let manager = LockManager::builder(backend)
        .ttl(Duration::from_secs(10))
        .retry(RetryPolicy::Fixed(Duration::from_secs(1)))
        .build()?;
    // The instant the last holder sent its release.
    let last_release: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let gaps: Arc<Mutex<Vec<Duration>>> = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (m, last, gaps) = (manager.clone(), last_release.clone(), gaps.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..4 {
                let g = m.lock("wakeup/contended").await?;
                let acquired = Instant::now();
                if let Some(at) = last.lock().map_err(|e| e.to_string())?.take() {
                    gaps.lock().map_err(|e| e.to_string())?.push(acquired - at);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                *last.lock().map_err(|e| e.to_string())? = Some(Instant::now());
                g.release().await?;
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for t in tasks {
        t.await?.map_err(|e| e.to_string())?;
    }
    let mut gaps = gaps.lock().map_err(|e| e.to_string())?.clone();
    gaps.sort();
    let median = gaps[gaps.len() / 2];
    println!(
        "hand-over gaps: median {median:?}, max {:?}, n {}",
        gaps.last(),
        gaps.len()
    );
    assert!(gaps.len() >= 30, "only {} hand-overs", gaps.len());
    assert!(median < Duration::from_millis(50), "median {median:?}");
    Ok(())
}

/// A release publishes only when a waiter marked the key: nothing for a
/// release nobody waits for; an announcement for one a waiter waits for,
/// also when the hold was renewed for longer than the waiter's first mark
/// lasts (the waiter marks again as it looks again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_publish_only_when_someone_waits() -> Result<(), Box<dyn std::error::Error>> {
    use futures_util::StreamExt;

    let server = fx::redis()?;
    let prefix = fx::unique_prefix();
    let open = || async {
        let cfg = RedisConfig::from_url(&server.url())?
            .key_prefix(prefix.clone())
            .fence_retention(Duration::from_secs(600));
        let backend = RedisBackend::connect(cfg).await?;
        let manager = LockManager::builder(backend)
            .ttl(Duration::from_millis(500))
            .retry(RetryPolicy::Fixed(Duration::from_secs(60)))
            .build()?;
        Ok::<_, Box<dyn std::error::Error>>(manager)
    };
    let (holder, waiter) = (open().await?, open().await?);
    let mut pubsub = redis::Client::open(server.url())?
        .get_async_pubsub()
        .await?;
    pubsub.psubscribe(format!("{prefix}*")).await?;
    let mut messages = pubsub.into_on_message();

    holder.lock("publish/k").await?.release().await?;
    let quiet = tokio::time::timeout(Duration::from_millis(300), messages.next()).await;
    assert!(quiet.is_err(), "a release nobody waited for published");

    let g = holder.lock("publish/k").await?;
    let task = tokio::spawn(async move { waiter.lock("publish/k").await });
    // Past the first mark (the hold's 500 ms and 5 s): renewed all along.
    tokio::time::sleep(Duration::from_millis(6_500)).await;
    assert!(!task.is_finished(), "the waiter took a held key");
    g.release().await?;
    let told = tokio::time::timeout(Duration::from_secs(2), messages.next()).await;
    assert!(
        matches!(told, Ok(Some(_))),
        "a release a waiter waited for was not announced"
    );
    let next = tokio::time::timeout(Duration::from_secs(5), task).await???;
    next.release().await?;
    Ok(())
}

/// Whoever inspects a held key and then waits on its release watch (an
/// election's observer does) is told of the release, though it never tried
/// to take the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inspecting_watcher_hears_the_release() -> Result<(), Box<dyn std::error::Error>> {
    use moltlock_core::{Backend, Held, Inspect, LockKey, Token, Watch};

    let server = fx::redis()?;
    let cfg = RedisConfig::from_url(&server.url())?
        .key_prefix(fx::unique_prefix())
        .fence_retention(Duration::from_secs(60));
    let backend = RedisBackend::connect(cfg).await?;
    let key = LockKey::new("observed")?;
    let holder = Token::random();
    backend
        .cas(&key, None, &holder, Duration::from_secs(30))
        .await?;
    let mut watch = Watch::watch(&backend, &key).await?;
    let info = Inspect::inspect(&backend, &key).await?.ok_or("no holder")?;
    let held = Held {
        holder: Some(info.holder),
        expires_in: info.expires_in,
        revision: None,
    };
    let b = backend.clone();
    let k = key.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        b.delete(&k, &holder).await
    });
    tokio::time::timeout(Duration::from_secs(3), watch.released(&held))
        .await
        .map_err(|_| "the release was not announced to an inspecting watcher")??;
    Ok(())
}
