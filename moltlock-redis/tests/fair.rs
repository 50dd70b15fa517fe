//! The fair queue's places on Redis: a waiter that stops looking (a crash)
//! is passed once its place's deadline is over.

use std::time::Duration;

use moltlock_core::{Backend, LockKey, Token};
use moltlock_fixtures::redis as fx;
use moltlock_redis::{RedisBackend, RedisConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_fair_waiter_is_passed_after_its_ttl() -> Result<(), Box<dyn std::error::Error>> {
    let server = fx::redis()?;
    let cfg = RedisConfig::from_url(&server.url())?
        .key_prefix(fx::unique_prefix())
        .fence_retention(Duration::from_secs(60));
    let backend = RedisBackend::connect(cfg).await?;
    let key = LockKey::new("fair/crashed")?;
    let holder = Token::random();
    backend
        .cas(&key, None, &holder, Duration::from_secs(10))
        .await?;
    let queue = backend.fair_queue().ok_or("no fair queue")?;

    // A waiter takes a place with a 1 s TTL, then never looks again and
    // never leaves: its future is leaked, as a crashed process's would be.
    let crashed = Token::random();
    let mut first = Box::pin(queue.acquire(&key, &crashed, Duration::from_secs(1)));
    let early = tokio::time::timeout(Duration::from_millis(200), &mut first).await;
    assert!(early.is_err(), "a fair waiter took a held key");
    std::mem::forget(first);

    let (b, k) = (backend.clone(), key.clone());
    let second = tokio::spawn(async move {
        let token = Token::random();
        let fence = b
            .fair_queue()
            .ok_or("no fair queue")?
            .acquire(&k, &token, Duration::from_secs(10))
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>((token, fence))
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(backend.delete(&key, &holder).await?);
    // The crashed place is at the head for at most its 1 s TTL.
    let (token, _) = tokio::time::timeout(Duration::from_secs(3), second)
        .await
        .map_err(|_| "the waiter behind a crashed one never got the key")???;
    assert!(backend.delete(&key, &token).await?);
    Ok(())
}
