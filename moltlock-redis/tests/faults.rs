//! Store faults on servers this test owns: a restart without persistence,
//! a flushed script cache, a store that is down, bad URLs.

use moltlock_core::BackendExt;
use std::time::Duration;

use moltlock_core::{
    Backend, CasOutcome, Error, LockKey, LockManager, LostReason, RenewItem, Token,
};
use moltlock_fixtures::redis as fx;
use moltlock_redis::{RedisBackend, RedisConfig};
use tokio::time::Instant;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn fast(url: &str) -> Result<RedisConfig, Error> {
    Ok(RedisConfig::from_url(url)?
        .connect_timeout(Duration::from_millis(500))
        .request_timeout(Duration::from_millis(500)))
}

/// Every holder learns of the loss within one renewal interval (plus slack)
/// after a restart wiped the keys, and fences after the restart are greater.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_loses_holds_and_keeps_fences_increasing() -> TestResult {
    let mut redis = fx::start_owned()?;
    let backend = RedisBackend::connect(fast(&redis.url())?).await?;
    let ttl = Duration::from_secs(3);
    let interval = ttl / 3;
    let manager = LockManager::builder(backend.clone()).ttl(ttl).build()?;
    let mut guards = Vec::new();
    for i in 0..4 {
        guards.push(manager.lock(format!("restart/{i}")).await?);
    }
    let before = guards.iter().map(|g| g.fence()).max().ok_or("no guards")?;
    redis.restart()?;
    let restarted = Instant::now();
    for g in &guards {
        let reason = tokio::time::timeout(interval * 2 + Duration::from_millis(500), g.lost())
            .await
            .map_err(|_| format!("{} not lost within {:?}", g.key(), restarted.elapsed()))?;
        println!("{}: {reason}", g.key());
        assert_eq!(reason, LostReason::Refused);
    }
    let lost_after = restarted.elapsed();
    println!("all holds lost {lost_after:?} after the restart");
    assert!(
        lost_after <= interval + Duration::from_millis(1500),
        "{lost_after:?}"
    );
    for i in 0..4 {
        let g = manager.lock(format!("restart/{i}")).await?;
        assert!(g.fence() > before, "fence {} after {}", g.fence(), before);
        g.release().await?;
    }
    Ok(())
}

/// A flushed script cache (`NOSCRIPT`) is repaired by sending the source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushed_script_cache_is_reloaded() -> TestResult {
    let redis = fx::start_owned()?;
    let backend = RedisBackend::from_url(&redis.url()).await?;
    let key = LockKey::new("noscript")?;
    let token = Token::random();
    let ttl = Duration::from_secs(5);
    backend.cas(&key, None, &token, ttl).await?;
    let client = redis::Client::open(redis.raw_url())?;
    let mut raw = client.get_multiplexed_async_connection().await?;
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .exec_async(&mut raw)
        .await?;
    let renewed = backend.cas(&key, Some(&token), &token, ttl).await?;
    assert!(matches!(
        renewed,
        moltlock_core::CasOutcome::Acquired { .. }
    ));
    let items = [moltlock_core::RenewItem {
        key: key.clone(),
        token: token.clone(),
        ttl,
    }];
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .exec_async(&mut raw)
        .await?;
    assert_eq!(backend.renew_many(&items).await?, vec![true]);
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .exec_async(&mut raw)
        .await?;
    assert!(backend.delete(&key, &token).await?);
    Ok(())
}

/// Nothing listening: a clean, retryable error, quickly.
#[tokio::test]
async fn closed_port_is_unavailable() -> TestResult {
    let port = moltlock_fixtures::free_port()?;
    let started = Instant::now();
    let err = RedisBackend::connect(fast(&format!("redis://127.0.0.1:{port}"))?)
        .await
        .err()
        .ok_or("connected to a closed port")?;
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    Ok(())
}

/// A server that dies under a connected backend gives retryable errors,
/// and the backend works again once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_server_is_unavailable_then_recovers() -> TestResult {
    let mut redis = fx::start_owned()?;
    let backend = RedisBackend::connect(fast(&redis.url())?).await?;
    let key = LockKey::new("down")?;
    redis.server.kill();
    let err = backend
        .cas(&key, None, &Token::random(), Duration::from_secs(1))
        .await
        .err()
        .ok_or("a dead server granted a lock")?;
    assert!(err.is_retryable(), "{err:?}");
    redis.restart()?;
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        match backend
            .cas(&key, None, &Token::random(), Duration::from_secs(1))
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) if e.is_retryable() && Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// A paused server (SIGSTOP) answers nothing: an acquisition and a renewal
/// batch each end within the request timeout with a retryable error. Once
/// it resumes, the requests sent meanwhile may still land, and each later
/// request gets its own reply, not a late one of a request that timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_server_times_requests_out_and_recovers() -> TestResult {
    let redis = fx::start_owned()?;
    let backend = RedisBackend::connect(fast(&redis.url())?).await?;
    let (held, token, ttl) = (
        LockKey::new("paused/held")?,
        Token::random(),
        Duration::from_secs(30),
    );
    let taken = backend.cas(&held, None, &token, ttl).await?;
    assert!(matches!(taken, CasOutcome::Acquired { .. }), "{taken:?}");
    redis.server.pause()?;
    let bound = Duration::from_millis(500) + Duration::from_millis(1500);
    let other = LockKey::new("paused/other")?;
    let stranger = Token::random();
    let acquire = backend.cas(&other, None, &stranger, ttl);
    let err = tokio::time::timeout(bound, acquire)
        .await
        .map_err(|_| format!("the acquisition was still waiting after {bound:?}"))?
        .err()
        .ok_or("a paused server granted a lock")?;
    assert!(err.is_retryable(), "{err:?}");
    let item = RenewItem {
        key: held.clone(),
        token: token.clone(),
        ttl,
    };
    let renewal = backend.renew_many(std::slice::from_ref(&item));
    let err = tokio::time::timeout(bound, renewal)
        .await
        .map_err(|_| format!("the renewal was still waiting after {bound:?}"))?
        .err()
        .ok_or("a paused server renewed a hold")?;
    assert!(err.is_retryable(), "{err:?}");
    redis.server.resume()?;
    let someone = backend.cas(&held, None, &Token::random(), ttl).await?;
    match someone {
        CasOutcome::Held(h) => assert_eq!(h.holder, Some(token.clone())),
        CasOutcome::Acquired { .. } => return Err("a held key was granted again".into()),
    }
    assert_eq!(backend.renew_many(&[item]).await?, vec![true]);
    assert!(backend.delete(&held, &token).await?);
    Ok(())
}

#[tokio::test]
async fn bad_urls_are_config_errors() {
    for url in [
        "http://127.0.0.1:6379",
        "redis://",
        "redis://127.0.0.1/nodb",
        "::",
    ] {
        let err = RedisBackend::from_url(url).await.err();
        assert!(matches!(err, Some(Error::Config(_))), "{url}: {err:?}");
    }
}

/// With a fence retention the fence key expires; a lost fence key (as after
/// a restart without persistence) still gives a greater fence, from the
/// server clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_retention_and_lost_fence_keys() -> TestResult {
    let redis = fx::start_owned()?;
    let cfg = RedisConfig::from_url(&redis.url())?.fence_retention(Duration::from_secs(60));
    let backend = RedisBackend::connect(cfg).await?;
    let key = LockKey::new("retained")?;
    let token = Token::random();
    let first = match backend
        .cas(&key, None, &token, Duration::from_secs(5))
        .await?
    {
        moltlock_core::CasOutcome::Acquired { fence } => fence,
        other => return Err(format!("{other:?}").into()),
    };
    let client = redis::Client::open(redis.raw_url())?;
    let mut raw = client.get_multiplexed_async_connection().await?;
    let pttl: i64 = redis::cmd("PTTL")
        .arg("moltlock:{retained}:fence")
        .query_async(&mut raw)
        .await?;
    assert!(pttl > 50_000 && pttl <= 60_000, "fence key PTTL {pttl}");
    assert!(backend.delete(&key, &token).await?);
    redis::cmd("DEL")
        .arg("moltlock:{retained}:fence")
        .exec_async(&mut raw)
        .await?;
    let second = match backend
        .cas(&key, None, &token, Duration::from_secs(5))
        .await?
    {
        moltlock_core::CasOutcome::Acquired { fence } => fence,
        other => return Err(format!("{other:?}").into()),
    };
    assert!(second > first, "{second} after {first}");
    Ok(())
}

/// The shared pub/sub connection comes back by itself after the server
/// drops it, and wake-ups work again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pubsub_reconnects_after_being_dropped() -> TestResult {
    let redis = fx::start_owned()?;
    let backend = RedisBackend::from_url(&redis.url()).await?;
    let holder = LockManager::new(backend.clone());
    let waiter = LockManager::builder(backend)
        .ttl(Duration::from_secs(10))
        .retry(moltlock_core::RetryPolicy::Fixed(Duration::from_secs(5)))
        .build()?;
    // A first wait opens the subscription.
    let g = holder.lock("pubsub/k").await?;
    let w = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.lock("pubsub/k").await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    g.release().await?;
    w.await??.release().await?;
    // The server drops every pub/sub client.
    assert_eq!(
        kill_pubsub(&redis).await?,
        1,
        "one pub/sub connection per backend"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let g = holder.lock("pubsub/k").await?;
    let w = tokio::spawn(async move {
        let g = waiter.lock("pubsub/k").await?;
        Ok::<_, Error>((Instant::now(), g))
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    g.release().await?;
    let (acquired, g) = w.await??;
    assert!(
        acquired - released < Duration::from_secs(1),
        "{:?}",
        acquired - released
    );
    g.release().await?;
    Ok(())
}

/// Every drop of a working pub/sub connection is followed by a prompt
/// resubscription, however many drops came before: the pause before
/// reconnecting grows only while attempts fail. (While it is down, the
/// backend's waiters hear no release and are offered no turn.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pubsub_resubscribes_promptly_after_every_drop() -> TestResult {
    let redis = fx::start_owned()?;
    let backend = RedisBackend::from_url(&redis.url()).await?;
    let manager = LockManager::new(backend.clone());
    let g = manager.lock("drops/k").await?;
    // A wait opens the subscription.
    let waited = manager
        .lock_timeout("drops/k", Duration::from_millis(200))
        .await;
    assert!(
        matches!(waited, Err(Error::Timeout { .. })),
        "a wait on a held key: {waited:?}"
    );
    g.release().await?;
    let mut raw = redis::Client::open(redis.raw_url())?
        .get_multiplexed_async_connection()
        .await?;
    let bound = Duration::from_secs(1);
    for drop in 1..=8 {
        wait_subscribed(&mut raw, bound * 5).await?;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(kill_pubsub(&redis).await?, 1, "drop {drop}");
        let dropped = Instant::now();
        wait_subscribed(&mut raw, bound * 5).await?;
        let took = dropped.elapsed();
        println!("drop {drop}: subscribed again after {took:?}");
        assert!(
            took < bound,
            "drop {drop}: subscribed again only after {took:?}"
        );
    }
    Ok(())
}

/// Waits until the server has a pattern subscription.
async fn wait_subscribed(
    raw: &mut redis::aio::MultiplexedConnection,
    within: Duration,
) -> TestResult {
    let start = Instant::now();
    loop {
        let patterns: i64 = redis::cmd("PUBSUB").arg("NUMPAT").query_async(raw).await?;
        if patterns > 0 {
            return Ok(());
        }
        if start.elapsed() > within {
            return Err(format!("not subscribed within {within:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A waiter that waits across a drop of the pub/sub connection hears the
/// release that comes after the reconnection, though its retry policy
/// would not look for 30 s and the hold is renewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_across_a_pubsub_drop_hears_the_release() -> TestResult {
    let redis = fx::start_owned()?;
    let backend = RedisBackend::from_url(&redis.url()).await?;
    let holder = LockManager::builder(backend.clone())
        .ttl(Duration::from_secs(30))
        .build()?;
    let waiter = LockManager::builder(backend)
        .retry(moltlock_core::RetryPolicy::Fixed(Duration::from_secs(30)))
        .build()?;
    let g = holder.lock("drop/k").await?;
    let w = tokio::spawn(async move {
        let g = waiter.lock("drop/k").await?;
        Ok::<_, Error>((Instant::now(), g))
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        kill_pubsub(&redis).await?,
        1,
        "one pub/sub connection per backend"
    );
    tokio::time::sleep(Duration::from_millis(1_500)).await; // reconnected
    let released = Instant::now();
    g.release().await?;
    let (acquired, g) = tokio::time::timeout(Duration::from_secs(10), w).await???;
    assert!(
        acquired - released < Duration::from_secs(1),
        "the waiter took {:?} after the release",
        acquired - released
    );
    g.release().await?;
    Ok(())
}

/// Has the server drop every pub/sub client; returns how many it dropped.
async fn kill_pubsub(redis: &fx::OwnedRedis) -> Result<i64, redis::RedisError> {
    let client = redis::Client::open(redis.raw_url())?;
    let mut raw = client.get_multiplexed_async_connection().await?;
    redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut raw)
        .await
}

/// A config with the restart quarantine `quarantine` and short requests.
/// Connecting may take a loaded machine a few seconds: a restarted server
/// refuses connections at once while it is down, so a long connect
/// timeout slows no test, and a short one failed a first connect to a
/// fresh server (500 ms, in a run of the whole suite).
fn quarantined(url: &str, quarantine: Duration) -> Result<RedisConfig, Error> {
    Ok(RedisConfig::from_url(url)?
        .connect_timeout(Duration::from_secs(5))
        .request_timeout(Duration::from_millis(500))
        .restart_quarantine(quarantine))
}

/// The restart quarantine is on by default: a fresh server grants no free
/// key (reported held, no holder, the quarantine's time left) until it has
/// been up for the quarantine; after that every key is granted at once, a
/// key never used before included (one wait per server start, not per key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_server_grants_no_key_during_the_quarantine() -> TestResult {
    let redis = fx::start_owned()?;
    let default = RedisBackend::connect(RedisConfig::from_url(&redis.raw_url())?).await?;
    let key = LockKey::new("fresh/q")?;
    let ttl = Duration::from_secs(2);
    match default.cas(&key, None, &Token::random(), ttl).await? {
        moltlock_core::CasOutcome::Held(held) => {
            assert_eq!(held.holder, None);
            let left = held.expires_in.ok_or("no time left reported")?;
            assert!(
                left > Duration::from_secs(25) && left <= Duration::from_secs(31),
                "{left:?}"
            );
        }
        other => return Err(format!("a fresh server granted a key: {other:?}").into()),
    }
    assert!(default.inspect(&key).await?.is_none());
    assert!(default.list("fresh/").await?.is_empty());

    let quarantine = Duration::from_secs(2);
    let backend = RedisBackend::connect(quarantined(&redis.url(), quarantine)?).await?;
    let manager = LockManager::builder(backend.clone()).ttl(ttl).build()?;
    let g = manager.lock("fresh/q").await?;
    let first = g.fence();
    g.release().await?;
    // The server has served its quarantine: a key it never saw is granted at once.
    let again = Instant::now();
    let other = manager.lock("fresh/other").await?;
    assert!(
        again.elapsed() < Duration::from_millis(500),
        "{:?}",
        again.elapsed()
    );
    other.release().await?;
    let g = manager.lock("fresh/q").await?;
    assert!(g.fence() > first);
    g.release().await?;
    Ok(())
}

/// With the quarantine set to the TTL, a Redis restart without persistence
/// leaves no window: the old holder's `lost()` fires before any client —
/// one connecting after the restart included — is granted the key, and
/// the next fence is greater.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quarantine_closes_the_restart_window() -> TestResult {
    let mut redis = fx::start_owned()?;
    let ttl = Duration::from_secs(2);
    let cfg = quarantined(&redis.url(), ttl)?;
    let holder = LockManager::builder(RedisBackend::connect(cfg.clone()).await?)
        .ttl(ttl)
        .build()?;
    let g = holder.lock("restart/q").await?;
    let before = g.fence();
    assert!(g.is_held());

    redis.restart()?;
    let restarted = Instant::now();
    // A client that connects after the restart tries to take the key at once.
    let newcomer = tokio::spawn(async move {
        let backend = loop {
            match RedisBackend::connect(cfg.clone()).await {
                Ok(b) => break b,
                Err(e) if e.is_retryable() => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => return Err(e),
            }
        };
        let manager = LockManager::builder(backend)
            .ttl(ttl)
            .retry(moltlock_core::RetryPolicy::Fixed(Duration::from_millis(25)))
            .build()?;
        let g = manager.lock("restart/q").await?;
        Ok::<_, Error>((Instant::now(), g))
    });

    let reason = tokio::time::timeout(ttl * 2, g.lost())
        .await
        .map_err(|_| "the old holder never learned of the loss")?;
    let lost_at = Instant::now();
    assert!(!g.is_held());
    let (granted_at, g2) = tokio::time::timeout(Duration::from_secs(20), newcomer).await???;
    println!(
        "old holder lost ({reason}) {:?} after the restart; newcomer granted {:?} after it",
        lost_at - restarted,
        granted_at - restarted
    );
    assert!(
        lost_at < granted_at,
        "the newcomer was granted the key before the old holder learned of the loss"
    );
    assert!(
        granted_at - restarted >= ttl - Duration::from_millis(100),
        "granted {:?} after the restart, within the quarantine",
        granted_at - restarted
    );
    assert!(g2.fence() > before, "{} after {}", g2.fence(), before);
    g2.release().await?;
    Ok(())
}

/// Once the server's last save (its start, without persistence) lies a
/// quarantine and a second back, an acquisition asks no `INFO` (the
/// dearest command of the script): `LASTSAVE` answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_up_long_enough_is_asked_no_info() -> TestResult {
    let redis = fx::start_owned()?;
    let quarantine = Duration::from_secs(1);
    let backend = RedisBackend::connect(quarantined(&redis.url(), quarantine)?).await?;
    let manager = LockManager::builder(backend).ttl(quarantine).build()?;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let client = redis::Client::open(redis.raw_url())?;
    let mut raw = client.get_multiplexed_async_connection().await?;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut raw)
        .await?;
    for i in 0..5 {
        manager.lock(format!("uptime/{i}")).await?.release().await?;
    }
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut raw)
        .await?;
    assert!(stats.contains("cmdstat_lastsave:calls=5,"), "{stats}");
    assert!(!stats.contains("cmdstat_info:"), "{stats}");
    Ok(())
}

/// A restart that loads a snapshot brings back keys written before it
/// (the fence key among them) but loses a hold taken after it. The
/// quarantine still keeps the key from a newcomer, though the server's
/// last save before the restart was longer ago than the quarantine: the
/// restarted server counts its start as its last save.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_from_a_snapshot_grants_no_key_during_the_quarantine() -> TestResult {
    let mut redis = fx::start_owned()?;
    // Long enough that a loaded machine reconnects well within it.
    let ttl = Duration::from_secs(4);
    let backend = RedisBackend::connect(quarantined(&redis.url(), ttl)?).await?;
    let manager = LockManager::builder(backend).ttl(ttl).build()?;
    let g = manager.lock("snapshot/q").await?;
    g.release().await?;
    let client = redis::Client::open(redis.raw_url())?;
    let mut raw = client.get_multiplexed_async_connection().await?;
    let _: () = redis::cmd("SAVE").query_async(&mut raw).await?;
    // The last save ends up longer ago than the quarantine; then a hold
    // the snapshot does not have.
    tokio::time::sleep(ttl + Duration::from_millis(1500)).await;
    let lost = manager.lock("snapshot/q").await?;
    let before = lost.fence();
    redis.restart()?;
    let restarted = Instant::now();

    let backend = loop {
        match RedisBackend::connect(quarantined(&redis.url(), ttl)?).await {
            Ok(b) => break b,
            Err(e) if e.is_retryable() => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => return Err(e.into()),
        }
    };
    let key = LockKey::new("snapshot/q")?;
    let mut raw = client.get_multiplexed_async_connection().await?;
    let kept: Option<String> = redis::cmd("GET")
        .arg("moltlock:{snapshot/q}:fence")
        .query_async(&mut raw)
        .await?;
    assert!(
        kept.is_some(),
        "the snapshot did not bring the fence key back"
    );
    let tried = backend.cas(&key, None, &Token::random(), ttl).await?;
    let after = restarted.elapsed();
    assert!(
        after < ttl,
        "the check came too late ({after:?} after the restart)"
    );
    match tried {
        moltlock_core::CasOutcome::Held(held) => assert_eq!(held.holder, None),
        other => return Err(format!("granted {after:?} after the restart: {other:?}").into()),
    }
    let manager = LockManager::builder(backend).ttl(ttl).build()?;
    let g = manager.lock("snapshot/q").await?;
    assert!(g.fence() > before, "{} after {}", g.fence(), before);
    g.release().await?;
    drop(lost);
    Ok(())
}

/// A hold longer than the restart quarantine would outlive it after a
/// restart: it is refused with a clear error, and allowed once the
/// quarantine covers it (or is off).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_longer_than_the_quarantine_is_refused() -> TestResult {
    let redis = fx::start_owned()?;
    let short = RedisBackend::connect(quarantined(&redis.url(), Duration::from_secs(2))?).await?;
    let key = LockKey::new("quarantine/ttl")?;
    match short
        .cas(&key, None, &Token::random(), Duration::from_secs(5))
        .await
    {
        Err(Error::InvalidTtl { reason, .. }) => {
            assert!(reason.contains("restart_quarantine"), "{reason}");
        }
        other => return Err(format!("a 5 s hold under a 2 s quarantine: {other:?}").into()),
    }
    let off = RedisBackend::connect(RedisConfig::from_url(&redis.url())?).await?;
    let t = Token::random();
    let out = off.cas(&key, None, &t, Duration::from_secs(5)).await?;
    assert!(
        matches!(out, moltlock_core::CasOutcome::Acquired { .. }),
        "{out:?}"
    );
    assert!(off.delete(&key, &t).await?);
    Ok(())
}
