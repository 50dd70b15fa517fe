//! A fair acquisition whose earlier Txn landed although its caller saw it
//! fail (a timeout on the way back) finds the key held by its own token.
//! It must give that hold back and take the key, not wait on itself.

use std::time::Duration;

use moltlock_core::{Backend, CasOutcome, LockKey, Token};
use moltlock_etcd::{EtcdBackend, EtcdConfig};
use moltlock_fixtures::etcd::etcd;

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_wait_does_not_wait_on_its_own_landed_take() -> TestResult {
    let server = etcd()?;
    let b = EtcdBackend::connect(EtcdConfig::new(server.endpoints.clone())).await?;
    let k = LockKey::new(format!("etcd-tests/fair-own/{}", Token::random()))?;
    let (token, ttl) = (Token::random(), Duration::from_secs(10));
    // The landed take: the key held by the token the fair wait will use.
    let landed = b.cas(&k, None, &token, ttl).await?;
    assert!(matches!(landed, CasOutcome::Acquired { .. }), "{landed:?}");
    let queue = b.fair_queue().ok_or("no fair queue")?;
    let got = tokio::time::timeout(Duration::from_secs(5), queue.acquire(&k, &token, ttl)).await;
    let fence = got.map_err(|_| "the fair wait waited on its own hold")??;
    let held = b.inspector().ok_or("no inspect")?.inspect(&k).await?;
    let held = held.ok_or("nobody holds the key after the fair take")?;
    assert_eq!(held.holder, token);
    assert_eq!(
        held.fence,
        Some(fence),
        "the fence returned is not the hold's"
    );
    assert!(b.delete(&k, &token).await?);
    Ok(())
}
