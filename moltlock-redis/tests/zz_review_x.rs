//! Review probes (temporary).

use std::time::Duration;

use moltlock_core::{Backend, CasOutcome, LockKey, LockManager, Token};
use moltlock_fixtures::redis as fx;
use moltlock_redis::{redis, RedisBackend, RedisConfig};
use tokio::time::Instant;

type Res = Result<(), Box<dyn std::error::Error>>;

/// A fair look that times out client-side but still runs on the server
/// (it took the key) is repeated with the same token: does the waiter then
/// see its own hold as someone else's and wait out the TTL?
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_look_timed_out_but_applied() -> Res {
    let server = fx::start_owned()?;
    let cfg = RedisConfig::from_url(&server.url())?
        .key_prefix(fx::unique_prefix())
        .request_timeout(Duration::from_millis(300));
    let backend = RedisBackend::connect(cfg).await?;
    let queue = backend.fair_queue().ok_or("no fair")?;
    // Warm the script cache (EVALSHA must not need the EVAL fallback).
    let warm = LockKey::new("warm")?;
    let t = Token::random();
    queue.acquire(&warm, &t, Duration::from_secs(1)).await?;
    backend.delete(&warm, &t).await?;

    let mut admin = redis::Client::open(server.raw_url())?
        .get_multiplexed_async_connection()
        .await?;
    let key = LockKey::new("fair/timeout")?;
    let token = Token::random();
    let ttl = Duration::from_secs(4);
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(700)
        .arg("ALL")
        .query_async(&mut admin)
        .await?;
    let started = Instant::now();
    let fence = queue.acquire(&key, &token, ttl).await?;
    let took = started.elapsed();
    println!("fair acquire after a timed-out look took {took:?} (fence {fence:?})");
    assert!(backend.delete(&key, &token).await?);
    assert!(
        took < Duration::from_millis(2500),
        "waited {took:?}: the waiter waited for its own hold to expire"
    );
    Ok(())
}

/// Fair waiters arriving during the restart quarantine: is arrival order kept?
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_order_during_quarantine() -> Res {
    let mut wrong = 0;
    for round in 0..3 {
        let server = fx::start_owned()?;
        let prefix = fx::unique_prefix();
        let cfg = RedisConfig::from_url(&server.url_with_quarantine(Duration::from_secs(4)))?
            .key_prefix(prefix.clone());
        let backend = RedisBackend::connect(cfg).await?;
        let key = LockKey::new("fair/q")?;
        let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (name, ttl) in [("first", 3000u64), ("second", 300)] {
            let (b, k, o) = (backend.clone(), key.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let token = Token::random();
                let q = b.fair_queue().ok_or("no fair")?;
                q.acquire(&k, &token, Duration::from_millis(ttl))
                    .await
                    .map_err(|e| e.to_string())?;
                o.lock().map_err(|e| e.to_string())?.push(name);
                tokio::time::sleep(Duration::from_millis(50)).await;
                b.delete(&k, &token).await.map_err(|e| e.to_string())?;
                Ok::<_, String>(())
            }));
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let mut admin = redis::Client::open(server.raw_url())?
            .get_multiplexed_async_connection()
            .await?;
        let places: i64 = redis::cmd("ZCARD")
            .arg(format!("{prefix}{{fair/q}}:queue"))
            .query_async(&mut admin)
            .await?;
        for t in tasks {
            t.await?.map_err(|e| e)?;
        }
        let got = order.lock().map_err(|e| e.to_string())?.clone();
        println!("round {round}: places during quarantine {places}, served {got:?}");
        if got != vec!["first", "second"] {
            wrong += 1;
        }
    }
    assert_eq!(wrong, 0, "fair waiters served out of arrival order");
    Ok(())
}

/// Fair waiters with the smallest TTL the backend accepts: do places get
/// dropped while their waiters still look, reordering the queue?
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_min_ttl_places_reorder() -> Res {
    let url = std::env::var("MOLTLOCK_REDIS_URL")?;
    let prefix = fx::unique_prefix();
    let cfg = RedisConfig::from_url(&url)?
        .key_prefix(prefix.clone())
        .restart_quarantine(Duration::ZERO)
        .fence_retention(Duration::from_secs(30));
    let backend = RedisBackend::connect(cfg).await?;
    let key = LockKey::new("fair/min")?;
    let holder = Token::random();
    backend.cas(&key, None, &holder, Duration::from_secs(30)).await?;
    let (a, b) = (Token::random(), Token::random());
    let mut tasks = Vec::new();
    for t in [a.clone(), b.clone()] {
        let (bk, k) = (backend.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            let q = bk.fair_queue().ok_or("no fair")?;
            q.acquire(&k, &t, Duration::from_millis(10))
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(t)
        }));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut admin = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let qkey = format!("{prefix}{{fair/min}}:queue");
    let (mut flips, mut samples, mut missing) = (0, 0, 0);
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        let q: Vec<String> = redis::cmd("ZRANGE")
            .arg(&qkey)
            .arg(0)
            .arg(-1)
            .query_async(&mut admin)
            .await?;
        samples += 1;
        if q.len() < 2 {
            missing += 1;
        }
        if q.first().map(String::as_str) == Some(b.as_str()) {
            flips += 1;
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    println!("samples {samples}: a place missing {missing}, second arrival at head {flips}");
    // Clean up.
    for t in tasks {
        t.abort();
    }
    backend.delete(&key, &holder).await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut admin)
        .await?;
    for k in &keys {
        let _: () = redis::cmd("DEL").arg(k).query_async(&mut admin).await?;
    }
    assert_eq!(flips, 0, "the later arrival was at the head");
    Ok(())
}

/// An election observer relies on the release watch; does it still learn a
/// resignation at once when no candidate waits (no mark)?
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observer_not_woken_by_unmarked_release() -> Res {
    let url = std::env::var("MOLTLOCK_REDIS_URL")?;
    let prefix = fx::unique_prefix();
    let cfg = RedisConfig::from_url(&url)?
        .key_prefix(prefix.clone())
        .restart_quarantine(Duration::ZERO)
        .fence_retention(Duration::from_secs(30));
    let backend = RedisBackend::connect(cfg).await?;
    let m = LockManager::builder(backend)
        .ttl(Duration::from_secs(30))
        .build()?;
    let e = m.election("elect/x")?;
    let mut gaps = Vec::new();
    for _ in 0..5 {
        let lead = e.campaign("me").await?;
        let mut obs = e.observe();
        // Skip until it reports the leader.
        loop {
            match obs.next().await {
                Some(Ok(Some(_))) => break,
                Some(Ok(None)) => continue,
                other => return Err(format!("{other:?}").into()),
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        let at = Instant::now();
        lead.resign().await?;
        match obs.next().await {
            Some(Ok(None)) => gaps.push(at.elapsed()),
            other => return Err(format!("{other:?}").into()),
        }
    }
    println!("observer saw the resignation after {gaps:?}");
    let mut admin = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut admin)
        .await?;
    for k in &keys {
        let _: () = redis::cmd("DEL").arg(k).query_async(&mut admin).await?;
    }
    let slow = gaps.iter().filter(|g| **g > Duration::from_millis(50)).count();
    assert_eq!(slow, 0, "{gaps:?}");
    Ok(())
}

#[allow(dead_code)]
fn _unused(_: CasOutcome) {}
