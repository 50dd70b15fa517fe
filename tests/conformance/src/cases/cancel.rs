//! Cancellation and limits: dropped waiters, acquisitions and guards leave no
//! hold nobody owns; the longest key works.

use super::common::*;

/// Dropping a waiting `lock()` future leaves no hold once the holder releases.
pub async fn dropped_waiter_leaves_no_hold(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let m = manager(&b, Duration::from_secs(10))?;
    let k = key("dropped-waiter");
    let g = m.lock(&k).await.map_err(err)?;
    let waiter = manager(&f.open().await?, Duration::from_secs(10))?;
    let w = tokio::time::timeout(Duration::from_millis(200), waiter.lock(&k)).await;
    ensure!(w.is_err(), "the waiter acquired a held key");
    g.release().await.map_err(err)?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let third = f.open().await?;
    ensure!(
        is_free(&third, &k, Duration::from_secs(10)).await?,
        "a dropped waiter left a hold"
    );
    ensure!(
        waiter.held_count() == 0,
        "the dropped waiter's manager renews a hold"
    );
    Ok(Outcome::Passed)
}

/// Acquisitions cancelled mid-request leave no hold behind. A delay wrapper
/// makes every request take 15 ms on each side of the store, and the
/// acquisitions are dropped at budgets spread over that window: before the
/// request leaves, while the store works, and after it granted the hold but
/// before the reply arrives. The key (TTL 30 s) must be free soon after,
/// and still free once every cleanup has had its time (a request that lands
/// late must not leave an orphan either).
pub async fn cancelled_acquires_leave_no_orphan(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let ttl = Duration::from_secs(30);
    let side = Duration::from_millis(15);
    let slow = Delay::new(b, side, side);
    let m = LockManager::builder(slow.clone())
        .ttl(ttl)
        .retry(RetryPolicy::Fixed(Duration::from_millis(20)))
        .build()
        .map_err(err)?;
    let k = key("cancelled");
    let budgets_ms = [2u64, 10, 16, 20, 24, 28, 33, 40];
    for i in 0..32u64 {
        let fixed = budgets_ms[usize::try_from(i).unwrap_or(0) % budgets_ms.len()];
        let jitter = fastish_random(i) % 4_000;
        let budget = Duration::from_millis(fixed) + Duration::from_micros(jitter);
        if let Ok(r) = tokio::time::timeout(budget, m.lock(&k)).await {
            r.map_err(err)?.release().await.map_err(err)?;
        }
    }
    let last_cancel = Instant::now();
    ensure!(
        slow.landed_then_dropped() >= 2,
        "{INCONCLUSIVE}: only {} acquisitions were cancelled after the store granted them",
        slow.landed_then_dropped()
    );
    let other = f.open().await?;
    ensure!(
        becomes_free(&other, &k, Duration::from_secs(5)).await?,
        "a cancelled acquire left a hold that outlived its cleanup (TTL is {ttl:?})"
    );
    tokio::time::sleep_until(last_cancel + Duration::from_secs(6)).await;
    ensure!(
        is_free(&other, &k, Duration::from_secs(5)).await?,
        "a cancelled acquire landed after its cleanup and left a hold nobody owns (TTL {ttl:?})"
    );
    Ok(Outcome::Passed)
}

fn fastish_random(seed: u64) -> u64 {
    let x = uuid::Uuid::new_v4().as_u128() as u64;
    x ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Dropping a guard releases its key in the background, soon.
pub async fn dropped_guard_releases_key(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let m = manager(&b, Duration::from_secs(30))?;
    let k = key("dropped-guard");
    let g = m.lock(&k).await.map_err(err)?;
    drop(g);
    let other = f.open().await?;
    ensure!(
        becomes_free(&other, &k, Duration::from_secs(3)).await?,
        "a dropped guard kept its key"
    );
    ensure!(
        m.held_count() == 0,
        "the manager still renews a dropped guard"
    );
    Ok(Outcome::Passed)
}

/// The longest key the backend declares, and non-ASCII keys, work.
pub async fn longest_allowed_key_and_unicode_work(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let m = manager(&b, Duration::from_secs(10))?;
    let limit = b.limits().max_key_len;
    let prefix = key("long");
    let mut longest = prefix.clone();
    while longest.len() < limit {
        longest.push('x');
    }
    let g = m.try_lock(&longest).await.map_err(err)?;
    ensure!(
        g.is_some(),
        "a key of exactly {limit} bytes was not acquired"
    );
    let uni = format!("{prefix}/ключ/锁/🔒 space'quote\"");
    let g = m.try_lock(&uni).await.map_err(err)?;
    ensure!(g.is_some(), "a Unicode key was not acquired");
    let again = manager(&f.open().await?, Duration::from_secs(10))?;
    ensure!(
        again.try_lock(&uni).await.map_err(err)?.is_none(),
        "the Unicode key was not exclusive"
    );
    Ok(Outcome::Passed)
}
