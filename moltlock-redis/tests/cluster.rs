//! The whole conformance suite against a local three-primary Redis Cluster
//! (started per case by the fixture), plus cluster-specific checks.

mod common;

use moltlock_core::BackendExt;
use std::time::Duration;

use moltlock_core::{Backend, LockKey, LockManager, RenewItem, Token};
use moltlock_fixtures::redis as fx;
use moltlock_redis::{Mode, RedisBackend};

fn cluster_store() -> moltlock_conformance::Factory {
    moltlock_fixtures::conformance_factory(fx::start_cluster(), |c| async move {
        RedisBackend::from_url(&c.url()).await
    })
}

mod conformance_on_cluster {
    use super::cluster_store;
    moltlock_conformance::conformance_tests!(cluster_store(), without: [in_order]);
}

/// Keys spread over all three primaries; batch renewal, list and wake-ups
/// work across slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_across_slots() -> Result<(), Box<dyn std::error::Error>> {
    let cluster = fx::start_cluster()?;
    let backend = RedisBackend::from_url(&cluster.url()).await?;
    assert_eq!(backend.config().mode(), Mode::Cluster);
    let ttl = Duration::from_secs(5);
    let mut items = Vec::new();
    for i in 0..30 {
        let key = LockKey::new(format!("spread/{i}"))?;
        let token = Token::random();
        backend.cas(&key, None, &token, ttl).await?;
        items.push(RenewItem { key, token, ttl });
    }
    assert_eq!(backend.renew_many(&items).await?, vec![true; 30]);
    assert_eq!(backend.list("spread/").await?.len(), 30);
    for i in &items {
        assert!(backend.delete(&i.key, &i.token).await?);
    }
    let manager = LockManager::new(backend);
    let g = manager.lock("a}b{c").await?;
    g.release().await?;
    Ok(())
}

/// `cas_multi` on a Cluster: the derived keys of one name share a slot and
/// go in one script (one request each call); keys of several slots are
/// read at once, then taken one `cas` at a time, and behave the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cas_multi_in_one_slot_and_across_slots() -> common::Res {
    use moltlock_core::MultiMode;

    let cluster = fx::start_cluster()?;
    let backend = RedisBackend::from_url(&cluster.url()).await?;
    let urls: Vec<String> = cluster.nodes.iter().map(|n| n.raw_url()).collect();
    let one_slot = common::keys(["sem#~s0", "sem#~s1", "sem#~w"])?;
    let spread = common::keys(["spread/a", "spread/b", "spread/c"])?;
    let ttl = Duration::from_secs(20);
    // One script in one slot; across slots 3 reads (sent at once), then
    // one cas per key.
    for (keys, requests) in [(&one_slot, 1), (&spread, 6)] {
        common::all_checks(&backend, keys).await?;
        let token = Token::random();
        common::reset_stats(&urls).await?;
        let out = common::batch(&backend)?
            .cas_multi(keys, &token, ttl, MultiMode::All)
            .await?;
        assert_eq!(common::acquired(out)?.len(), 3);
        assert_eq!(
            common::script_calls(&urls).await?,
            (requests, 0),
            "{keys:?}"
        );
        let listed: Vec<String> = backend.list("").await?.into_iter().map(|h| h.key).collect();
        let mut want: Vec<&str> = keys.iter().map(LockKey::as_str).collect();
        want.sort();
        assert_eq!(listed, want);
        for key in keys {
            assert!(backend.delete(key, &token).await?);
        }
    }
    Ok(())
}

/// A backend over the application's own `ClusterClient` locks across the
/// cluster and wakes its waiters; a single-server configuration is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_from_the_applications_cluster_client() -> common::Res {
    use moltlock_redis::ClusterClient;
    use moltlock_redis::RedisConfig;

    let cluster = fx::start_cluster()?;
    let seeds: Vec<String> = cluster.nodes.iter().map(|n| n.raw_url()).collect();
    let client = ClusterClient::new(seeds.clone())?;
    let cfg = RedisConfig::from_url(&cluster.url())?;
    let backend = RedisBackend::from_cluster_client(client.clone(), cfg).await?;
    assert_eq!(backend.config().mode(), Mode::Cluster);
    let manager = LockManager::builder(backend)
        .ttl(Duration::from_secs(10))
        .retry(moltlock_core::RetryPolicy::Fixed(Duration::from_secs(30)))
        .build()?;
    let guard = manager.lock("cluster-client/a").await?;
    assert!(manager.try_lock("cluster-client/a").await?.is_none());
    // A waiter of another manager on the same client is woken by the release,
    // not by its 30 s retry delay.
    let other = LockManager::builder(
        RedisBackend::from_cluster_client(client, RedisConfig::from_url(&cluster.url())?).await?,
    )
    .retry(moltlock_core::RetryPolicy::Fixed(Duration::from_secs(30)))
    .build()?;
    let waiter = tokio::spawn(async move { other.lock("cluster-client/a").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    guard.release().await?;
    let next = tokio::time::timeout(Duration::from_secs(5), waiter).await???;
    next.release().await?;

    let single = RedisConfig::from_url(&seeds[0])?;
    let refused = RedisBackend::from_cluster_client(ClusterClient::new(seeds)?, single).await;
    assert!(
        matches!(refused, Err(moltlock_core::Error::Config(_))),
        "{:?}",
        refused.err()
    );
    Ok(())
}
