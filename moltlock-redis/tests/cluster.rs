//! The whole conformance suite against a local three-primary Redis Cluster
//! (started per case by the fixture), plus cluster-specific checks.

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
    moltlock_conformance::conformance_tests!(cluster_store(), without: [fair_queue, cas_multi]);
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
