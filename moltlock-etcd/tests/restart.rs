//! Waiters across a restart of a private etcd: they keep waiting while the
//! store is down and hear the release that comes after it is back.

use std::time::Duration;

use moltlock_core::{LockManager, LockOptions, RetryPolicy};
use moltlock_etcd::{EtcdBackend, EtcdConfig};
use moltlock_fixtures::etcd::{start_single, EtcdMember};
use tokio::time::Instant;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// How long etcd stays down: longer than the waiters' pauses after a
/// failed request (200 ms in the fair queue).
const DOWN: Duration = Duration::from_secs(1);

async fn manager(
    own: &EtcdMember,
    retry: RetryPolicy,
) -> Result<LockManager, Box<dyn std::error::Error>> {
    let cfg = EtcdConfig::new([own.endpoint()])
        .connect_timeout(Duration::from_millis(500))
        .request_timeout(Duration::from_secs(1));
    let backend = EtcdBackend::connect(cfg).await?;
    Ok(LockManager::builder(backend)
        .ttl(Duration::from_secs(10))
        .retry(retry)
        .build()?)
}

/// A fair acquisition of `key` by `m`, waiting at most `timeout`, on a
/// task of its own.
fn fair_wait(
    m: LockManager,
    key: &str,
    timeout: Duration,
) -> tokio::task::JoinHandle<Result<Option<moltlock_core::LockGuard>, moltlock_core::Error>> {
    let key = key.to_owned();
    tokio::spawn(async move {
        let opts = LockOptions::new().fair().timeout(timeout);
        m.acquire(&key, opts).await
    })
}

/// Kills etcd, keeps it down for [`DOWN`], and starts it again on the same
/// data and port.
fn restart(own: &mut EtcdMember) -> TestResult {
    own.process.kill();
    std::thread::sleep(DOWN);
    own.process.restart()?;
    Ok(())
}

/// A fair waiter keeps its wait through a restart of the store (its
/// requests fail while etcd is down) and takes the key once the holder
/// releases it: the wait does not end in an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_waiter_waits_through_a_store_restart() -> TestResult {
    let mut own = start_single()?;
    let holder = manager(&own, RetryPolicy::default()).await?;
    let waiter = manager(&own, RetryPolicy::default()).await?;
    let k = format!("restart/fair/{}", uuid::Uuid::new_v4().simple());
    let g = holder.lock(&k).await?;
    let w = fair_wait(waiter, &k, Duration::from_secs(30));
    tokio::time::sleep(Duration::from_millis(300)).await;
    restart(&mut own)?;
    // Back for a while (a restarted member takes a moment to serve writes).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !w.is_finished(),
        "the fair wait ended while the key was held: {:?}",
        w.await?
    );
    g.release().await?;
    let got = tokio::time::timeout(Duration::from_secs(20), w).await??;
    let g = got?.ok_or("no guard for a waiting acquire")?;
    g.release().await?;
    Ok(())
}

/// A waiter whose retry policy would look again only after 20 s hears a
/// release that comes after a restart of the store: its watch broke with
/// the store, and it opens it again within a second of the store's return
/// rather than sleeping out its retry delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_hears_a_release_after_a_store_restart() -> TestResult {
    let mut own = start_single()?;
    let holder = manager(&own, RetryPolicy::default()).await?;
    let slow = RetryPolicy::Fixed(Duration::from_secs(20));
    let waiter = manager(&own, slow).await?;
    let k = format!("restart/plain/{}", uuid::Uuid::new_v4().simple());
    let g = holder.lock(&k).await?;
    let w = tokio::spawn({
        let k = k.clone();
        async move {
            let g = waiter.lock_timeout(&k, Duration::from_secs(60)).await?;
            Ok::<_, moltlock_core::Error>((Instant::now(), g))
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    restart(&mut own)?;
    // Back for a while: the waiter's failed attempts are behind it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let released = Instant::now();
    g.release().await?;
    let (acquired, g) = tokio::time::timeout(Duration::from_secs(30), w).await???;
    let took = acquired - released;
    println!("the waiter took the key {took:?} after the release");
    assert!(
        took < Duration::from_secs(5),
        "the waiter took {took:?} after the release"
    );
    g.release().await?;
    Ok(())
}

/// A fair wait dropped while etcd is down cannot take its place out at
/// once. Its place hangs on the session's lease, which the same manager
/// keeps alive for another hold of the same TTL, so the place would block
/// every waiter behind it for as long as that manager lives: the removal
/// is kept and sent again once the store is back (by the session's next
/// renewal round), and the waiter behind takes the key after the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_wait_dropped_while_the_store_is_down_leaves_the_queue() -> TestResult {
    let mut own = start_single()?;
    let holder = manager(&own, RetryPolicy::default()).await?;
    let dropped = manager(&own, RetryPolicy::default()).await?;
    let behind = manager(&own, RetryPolicy::default()).await?;
    let k = format!("restart/left/{}", uuid::Uuid::new_v4().simple());
    let g = holder.lock(&k).await?;
    // The same manager holds another key on the same lease, and renews it.
    let other = dropped.lock(format!("{k}/other")).await?;
    let first = fair_wait(dropped.clone(), &k, Duration::from_secs(60));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = fair_wait(behind, &k, Duration::from_secs(40));
    tokio::time::sleep(Duration::from_millis(300)).await;
    own.process.kill();
    first.abort();
    assert!(first.await.is_err_and(|e| e.is_cancelled()));
    // Down long enough for the removal to fail (requests time out in 1 s).
    std::thread::sleep(Duration::from_secs(2));
    own.process.restart()?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    g.release().await?;
    let released = Instant::now();
    let got = tokio::time::timeout(Duration::from_secs(45), second).await??;
    let g = got?.ok_or("no guard for a waiting acquire")?;
    let took = released.elapsed();
    println!("the waiter behind took the key {took:?} after the release");
    // One renewal round (every TTL/3: 3.3 s) sends the removal again.
    assert!(
        took < Duration::from_secs(8),
        "the waiter behind the dropped wait took {took:?} after the release"
    );
    assert!(other.is_held(), "the other hold was lost");
    g.release().await?;
    other.release().await?;
    Ok(())
}

/// A release sent while etcd is down fails (retryably); once etcd is back,
/// the key is freed with no further use of the holder's manager, long
/// before its hold would end (the hold's lease is the backend's session,
/// kept alive as long as the backend lives).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_while_the_store_is_down_frees_the_key_once_it_is_back() -> TestResult {
    let mut own = start_single()?;
    let holder = manager(&own, RetryPolicy::default()).await?;
    // The other manager connects first: a client's first request to a
    // store that has just started may take longer than its timeout.
    let other = manager(&own, RetryPolicy::default()).await?;
    let guard = holder.lock("down-release").await?;
    own.process.kill();
    let err = guard
        .release()
        .await
        .err()
        .ok_or("a release succeeded on a stopped etcd")?;
    assert!(err.is_retryable(), "{err:?}");
    std::thread::sleep(DOWN);
    own.process.restart()?;
    let back = Instant::now();
    let taken = other
        .acquire(
            "down-release",
            LockOptions::new().timeout(Duration::from_secs(8)),
        )
        .await?;
    let taken =
        taken.ok_or_else(|| format!("still held {:?} after etcd came back", back.elapsed()))?;
    println!("freed {:?} after etcd came back", back.elapsed());
    taken.release().await?;
    drop(holder);
    Ok(())
}
