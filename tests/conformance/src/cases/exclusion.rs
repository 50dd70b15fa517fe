//! Mutual exclusion: one holder per key, on one client and across clients.

use super::common::*;

/// Acquire, see the hold, release, acquire again.
pub async fn acquire_and_release(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let m = manager(&b, Duration::from_secs(10))?;
    let k = key("acquire");
    let g = m.lock(&k).await.map_err(err)?;
    ensure!(g.is_held(), "a fresh guard must be held");
    ensure!(g.key().as_str() == k, "the guard names another key");
    ensure!(g.check().is_ok(), "check() must pass on a fresh guard");
    g.release().await.map_err(err)?;
    let again = m.try_lock(&k).await.map_err(err)?;
    ensure!(again.is_some(), "the key must be free after release");
    Ok(Outcome::Passed)
}

/// `try_lock` returns `None` at once while another owner holds the key.
pub async fn try_lock_on_held_key_returns_none(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let m = manager(&b, Duration::from_secs(10))?;
    let k = key("trylock");
    let g = m.lock(&k).await.map_err(err)?;
    let other = manager(&f.open().await?, Duration::from_secs(10))?;
    let started = Instant::now();
    let second = other.try_lock(&k).await.map_err(err)?;
    ensure!(second.is_none(), "try_lock on a held key must return None");
    ensure!(
        started.elapsed() < Duration::from_secs(2),
        "try_lock must not wait (took {:?})",
        started.elapsed()
    );
    ensure!(g.is_held(), "the holder must still hold");
    Ok(Outcome::Passed)
}

/// Holds on different keys are independent.
pub async fn distinct_keys_do_not_conflict(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let m = manager(&b, Duration::from_secs(10))?;
    let base = key("distinct");
    let mut guards = Vec::new();
    for i in 0..5 {
        let g = m.try_lock(format!("{base}/{i}")).await.map_err(err)?;
        ensure!(g.is_some(), "key {i} of 5 distinct keys was not free");
        guards.push(g);
    }
    Ok(Outcome::Passed)
}

/// 8 managers on one client × 2 tasks × 50 acquisitions of one key: never
/// two inside at once.
pub async fn mutual_exclusion_under_contention(f: Factory) -> CaseResult {
    let b = f.open().await?;
    // Waiters inside one manager queue in it (one asks the store), so the
    // store's contention comes from several managers on the one client.
    let mut managers = Vec::new();
    for _ in 0..8 {
        managers.push(manager(&b, Duration::from_secs(10))?);
    }
    let c = contend(managers, key("mutex"), 2, 50).await?;
    c.verdict(800)
}

/// 4 clients (separate handles) × 4 tasks × 10 acquisitions: no overlap.
pub async fn mutual_exclusion_across_clients(f: Factory) -> CaseResult {
    let mut managers = Vec::new();
    for _ in 0..4 {
        managers.push(manager(&f.open().await?, Duration::from_secs(10))?);
    }
    let c = contend(managers, key("mutex-clients"), 4, 10).await?;
    c.verdict(160)
}
