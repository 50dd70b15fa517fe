//! Release wake-ups: with 8 tasks contending on one key and a 1 s retry
//! delay, the next holder follows a release within milliseconds (a sanity
//! bound, not a benchmark: polling could not explain it).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use moltlock_core::{LockManager, RetryPolicy};
use moltlock_fixtures::redis as fx;
use moltlock_redis::{RedisBackend, RedisConfig};
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
