//! Semaphores: at most N holders, each permit an ordinary hold.

use moltlock_core::Semaphore;

use super::common::*;

/// A semaphore of `n` permits on a manager of its own over `b`.
fn semaphore(b: &Arc<dyn Backend>, ttl: Duration, n: u32) -> Result<(Semaphore, String), String> {
    let name = key("sem");
    let s = manager(b, ttl)?.semaphore(&name, n).map_err(err)?;
    Ok((s, name))
}

/// Counts holders inside at once and records the most seen.
#[derive(Clone, Default)]
struct Peak {
    inside: Arc<AtomicU64>,
    most: Arc<AtomicU64>,
}

impl Peak {
    fn enter(&self) {
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
    }

    fn exit(&self) {
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }

    fn most(&self) -> u64 {
        self.most.load(Ordering::SeqCst)
    }
}

/// 16 tasks on 2 clients × 10 acquisitions of a 3-permit semaphore: never
/// more than 3 inside at once, and 3 do get in together.
pub async fn semaphore_never_over_admits(f: Factory) -> CaseResult {
    let name = key("sem-admit");
    let peak = Peak::default();
    let mut tasks = Vec::new();
    for c in 0..2 {
        let m = manager(&f.open().await?, LONG)?;
        let sem = m.semaphore(&name, 3).map_err(err)?;
        for t in 0..8 {
            let (sem, peak) = (sem.clone(), peak.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..10 {
                    let p = sem.acquire().await.map_err(err)?;
                    peak.enter();
                    tokio::time::sleep(Duration::from_millis(2 + (c + t) % 3)).await;
                    peak.exit();
                    p.release().await.map_err(err)?;
                }
                Ok::<(), String>(())
            }));
        }
    }
    for t in tasks {
        t.await.map_err(|e| format!("a task panicked: {e}"))??;
    }
    ensure!(
        peak.most() <= 3,
        "{} holders were inside a 3-permit semaphore at once",
        peak.most()
    );
    // Acquisitions slower than the short holds (a loaded machine, a quorum
    // of slow stores) may never overlap three: tried again, and a
    // semaphore that never fills (a permit that never came back) fails.
    if peak.most() < 3 {
        return Err(format!(
            "{INCONCLUSIVE}: 16 tasks never filled 3 permits (at most {} inside at once)",
            peak.most()
        ));
    }
    Ok(Outcome::Passed)
}

/// A holder that dies (stops renewing) gives its permit back when its hold
/// expires by the store's clock, and only then.
pub async fn semaphore_permit_of_dead_holder_returns(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let ttl = short_ttl(&b);
    let (sem, _) = semaphore(&b, LONG, 2)?;
    let live = sem.acquire().await.map_err(err)?;
    let free = sem
        .slot_keys()
        .iter()
        .find(|k| k.as_str() != live.key().as_str())
        .ok_or("a 2-permit semaphore has no second slot")?;
    let dead = timed_acquire(&f.open().await?, free.as_str(), ttl).await?;
    ensure!(
        sem.try_acquire().await.map_err(err)?.is_none(),
        "a permit was granted while both were held"
    );
    tokio::time::sleep_until(dead.surely_gone()).await;
    let back = sem.acquire_timeout(LONG).await.map_err(err)?;
    ensure!(
        back.key() == free,
        "the permit returned on {} instead of the dead holder's slot",
        back.key()
    );
    ensure!(live.is_held(), "the live holder's permit was lost");
    Ok(Outcome::Passed)
}

/// Permits held across several TTLs are renewed: no one else gets in.
pub async fn semaphore_renewal_keeps_permits(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let ttl = short_ttl(&b);
    let (sem, name) = semaphore(&b, ttl, 2)?;
    let held = [
        sem.acquire().await.map_err(err)?,
        sem.acquire().await.map_err(err)?,
    ];
    let other = manager(&f.open().await?, ttl)?
        .semaphore(&name, 2)
        .map_err(err)?;
    let until = Instant::now() + ttl * 3 + EXPIRY_SLACK;
    while Instant::now() < until {
        ensure!(
            other.try_acquire().await.map_err(err)?.is_none(),
            "a third permit was granted while two renewed permits were held"
        );
        tokio::time::sleep(ttl / 4).await;
    }
    for p in &held {
        ensure!(p.is_held(), "a renewed permit was lost");
    }
    Ok(Outcome::Passed)
}

/// Acquisitions cancelled at random points (while every permit is taken,
/// and mid-request once they are free) leave no permit behind.
pub async fn semaphore_cancelled_acquire_leaves_no_permit(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let delayed: Arc<dyn Backend> = Arc::new(Delay::new(
        b.clone(),
        Duration::from_millis(2),
        Duration::from_millis(2),
    ));
    let (sem, name) = semaphore(&b, LONG, 2)?;
    let full = [
        sem.acquire().await.map_err(err)?,
        sem.acquire().await.map_err(err)?,
    ];
    let waiter = manager(&delayed, LONG)?.semaphore(&name, 2).map_err(err)?;
    let dropped = tokio::time::timeout(Duration::from_millis(80), waiter.acquire()).await;
    ensure!(
        dropped.is_err(),
        "a permit was granted while both were held"
    );
    for p in full {
        p.release().await.map_err(err)?;
    }
    for i in 0..20u64 {
        let cut = Duration::from_micros(2_500 + i * 400);
        drop(tokio::time::timeout(cut, waiter.acquire()).await);
    }
    let last_cancel = Instant::now();
    moltlock_core::wait_for_cleanups(LONG).await;
    let slots: Vec<String> = sem.slot_keys().iter().map(|k| k.to_string()).collect();
    for k in &slots {
        ensure!(
            becomes_free(&b, k, LONG).await?,
            "slot {k} stayed held after every acquisition was cancelled"
        );
    }
    free_after_late_writes(&b, &slots, last_cancel).await
}

/// On each slot, every new permit's fence is above the slot's last one.
pub async fn semaphore_fences_rise_per_slot(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let (sem, _) = semaphore(&b, LONG, 2)?;
    let mut last: std::collections::HashMap<u32, Fence> = Default::default();
    for _ in 0..12 {
        let p = sem.acquire().await.map_err(err)?;
        if let Some(prev) = last.insert(p.slot(), p.fence()) {
            ensure!(
                p.fence() > prev,
                "slot {} gave fence {} after {prev}",
                p.slot(),
                p.fence()
            );
        }
        ensure!(p.slot() < 2, "slot {} of a 2-permit semaphore", p.slot());
        p.release().await.map_err(err)?;
    }
    Ok(Outcome::Passed)
}

/// A client that allows fewer permits than another one uses sees the
/// larger count's slot held and says so; once that hold expires, it does
/// not (a busy answer again).
pub async fn semaphore_limit_mismatch_is_reported(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let (big, name) = semaphore(&b, LONG, 3)?;
    let slots = big.slot_keys();
    let mut low = Vec::new();
    for k in &slots[..2] {
        low.push((k.clone(), raw_acquire(&b, k.as_str(), LONG).await?.0));
    }
    // A handle of its own, so no longer hold shares a lease with it.
    let third = timed_acquire(&f.open().await?, slots[2].as_str(), short_ttl(&b)).await?;
    let small = manager(&f.open().await?, LONG)?
        .semaphore(&name, 2)
        .map_err(err)?;
    let seen = small.try_acquire().await;
    ensure!(
        matches!(
            seen,
            Err(Error::LimitMismatch {
                permits: 2,
                seen: 2,
                ..
            })
        ),
        "slot 2 was held, but a 2-permit client saw {seen:?} instead of a limit mismatch"
    );
    tokio::time::sleep_until(third.surely_gone()).await;
    let after = small.try_acquire().await;
    ensure!(
        matches!(after, Ok(None)),
        "once slot 2 expired, a 2-permit client with both slots held saw {after:?}, not a busy answer"
    );
    for (k, t) in &low {
        b.delete(k, t).await.map_err(err)?;
    }
    Ok(Outcome::Passed)
}
