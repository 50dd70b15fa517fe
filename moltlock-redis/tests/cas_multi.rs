//! `cas_multi` on one Redis: `MOLTLOCK_REDIS_URL` if set (a shared server,
//! under a unique key prefix, cleaned up afterwards), else a server of its
//! own; the restart quarantine and the count of requests on servers of
//! their own.

mod common;

use std::time::Duration;

use common::{acquired, batch, held, keys, reset_stats, script_calls, Res};
use moltlock_core::{Inspect, MultiMode, Token};
use moltlock_fixtures::redis as fx;
use moltlock_redis::{redis, RedisBackend, RedisConfig};

/// A backend under a unique prefix, on the server `fx::redis` resolves.
struct Store {
    backend: RedisBackend,
    raw_url: String,
    prefix: String,
    _server: fx::RedisServer,
}

impl Store {
    async fn new() -> Res<Self> {
        let server = fx::redis()?;
        let prefix = fx::unique_prefix();
        let url = server.url();
        let cfg = RedisConfig::from_url(&url)?
            .key_prefix(prefix.clone())
            .fence_retention(Duration::from_secs(600));
        let backend = RedisBackend::connect(cfg).await?;
        let raw_url = url.split("/?").next().unwrap_or(&url).to_owned();
        Ok(Self {
            backend,
            raw_url,
            prefix,
            _server: server,
        })
    }

    /// Deletes every key under the prefix.
    async fn clean(&self) -> Res {
        let mut conn = redis::Client::open(self.raw_url.as_str())?
            .get_multiplexed_async_connection()
            .await?;
        let mut cursor = 0u64;
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("{}*", self.prefix))
                .arg("COUNT")
                .arg(500)
                .query_async(&mut conn)
                .await?;
            if !batch.is_empty() {
                let _: i64 = redis::cmd("DEL").arg(&batch).query_async(&mut conn).await?;
            }
            if next == 0 {
                return Ok(());
            }
            cursor = next;
        }
    }
}

#[tokio::test]
async fn cas_multi_on_one_server() -> Res {
    let store = Store::new().await?;
    let k = keys(["multi/a", "multi/b", "multi/c"])?;
    let result = common::all_checks(&store.backend, &k).await;
    store.clean().await?;
    result
}

/// Derived keys are stored under their name's hash tag and listed by their
/// whole caller key.
#[tokio::test]
async fn derived_keys_are_listed_by_their_caller_key() -> Res {
    let store = Store::new().await?;
    let result = list_derived(&store.backend).await;
    store.clean().await?;
    result
}

async fn list_derived(b: &RedisBackend) -> Res {
    let k = keys(["jobs#~s0", "jobs#~s3", "jobs#~w"])?;
    let me = Token::random();
    acquired(
        batch(b)?
            .cas_multi(&k, &me, Duration::from_secs(20), MultiMode::All)
            .await?,
    )?;
    let listed = |prefix: &'static str| async move {
        let found = Inspect::list(b, prefix).await?;
        Ok::<_, moltlock_core::Error>(found.into_iter().map(|h| h.key).collect::<Vec<_>>())
    };
    assert_eq!(listed("jobs").await?, ["jobs#~s0", "jobs#~s3", "jobs#~w"]);
    assert_eq!(listed("jobs#").await?, ["jobs#~s0", "jobs#~s3", "jobs#~w"]);
    assert_eq!(listed("jobs#~s").await?, ["jobs#~s0", "jobs#~s3"]);
    assert_eq!(listed("jobs#~w").await?, ["jobs#~w"]);
    assert!(listed("jobs/").await?.is_empty());
    for key in &k {
        let info = Inspect::inspect(b, key).await?.ok_or("not held")?;
        assert_eq!(info.holder, me);
        assert!(moltlock_core::Backend::delete(b, key, &me).await?);
    }
    Ok(())
}

/// A fresh server is in its restart quarantine: no key is granted, every
/// key is reported held with no holder until the quarantine has passed.
#[tokio::test]
async fn restart_quarantine_holds_back_every_key() -> Res {
    let server = fx::start_owned()?;
    let quarantine = Duration::from_secs(2);
    let b = RedisBackend::from_url(&server.url_with_quarantine(quarantine)).await?;
    let k = keys(["q/a", "q/b"])?;
    let me = Token::random();
    let ttl = Duration::from_secs(1);
    for mode in [MultiMode::All, MultiMode::Any] {
        let busy = held(batch(&b)?.cas_multi(&k, &me, ttl, mode).await?)?;
        assert_eq!(busy.iter().map(|b| b.0).collect::<Vec<_>>(), [0, 1]);
        for (_, h) in busy {
            assert_eq!(h.holder, None);
            // Uptime counts whole seconds, so the wait errs one second long.
            let most = quarantine + Duration::from_secs(1);
            assert!(h.expires_in.is_some_and(|e| e <= most), "{h:?}");
        }
    }
    let long = batch(&b)?
        .cas_multi(&k, &me, quarantine * 2, MultiMode::All)
        .await;
    assert!(
        matches!(long, Err(moltlock_core::Error::InvalidTtl { .. })),
        "{long:?}"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match batch(&b)?.cas_multi(&k, &me, ttl, MultiMode::All).await? {
            moltlock_core::MultiOutcome::Acquired(taken) => {
                assert_eq!(taken.len(), 2);
                return Ok(());
            }
            moltlock_core::MultiOutcome::Held(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => return Err(format!("still held back: {other:?}").into()),
        }
    }
}

/// One `cas_multi` is one request: a single `EVALSHA` (an `EVALSHA` and an
/// `EVAL` once after the script cache was flushed).
#[tokio::test]
async fn one_request_per_call() -> Res {
    let server = fx::start_owned()?;
    let b = RedisBackend::from_url(&server.url()).await?;
    let urls = [server.raw_url()];
    let k = keys(["rt/a", "rt/b", "rt/c", "rt/d", "rt/e"])?;
    let (me, other) = (Token::random(), Token::random());
    let ttl = Duration::from_secs(20);
    acquired(
        batch(&b)?
            .cas_multi(&k[..1], &other, ttl, MultiMode::All)
            .await?,
    )?;
    for (mode, want_taken) in [(MultiMode::All, false), (MultiMode::Any, true)] {
        reset_stats(&urls).await?;
        let out = batch(&b)?.cas_multi(&k, &me, ttl, mode).await?;
        assert_eq!(
            matches!(out, moltlock_core::MultiOutcome::Acquired(_)),
            want_taken
        );
        assert_eq!(script_calls(&urls).await?, (1, 0), "{mode:?}");
    }
    let mut conn = redis::Client::open(server.raw_url())?
        .get_multiplexed_async_connection()
        .await?;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await?;
    reset_stats(&urls).await?;
    held(
        batch(&b)?
            .cas_multi(&k[..2], &me, ttl, MultiMode::All)
            .await?,
    )?;
    assert_eq!(script_calls(&urls).await?, (1, 1));
    println!("round trips per cas_multi: 1 (2 right after a script cache flush)");
    Ok(())
}
