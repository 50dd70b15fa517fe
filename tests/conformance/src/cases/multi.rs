//! Multi-locks (all keys or none, in one order, one deadline) and the
//! optional `cas_multi` batch.

use moltlock_core::{BackendExt, LockKey, LockOptions, MultiMode, MultiOutcome};

use super::common::*;

/// `n` keys under one case prefix.
fn keys(case: &str, n: usize) -> Vec<String> {
    let base = key(case);
    (0..n).map(|i| format!("{base}/{i}")).collect()
}

/// `n` keys derived from one name (as a primitive's are), which every
/// backend with `cas_multi` must take together.
fn derived(case: &str, n: usize) -> Vec<String> {
    let base = key(case);
    let mark = moltlock_core::RESERVED_MARK;
    (0..n).map(|i| format!("{base}{mark}m{i}")).collect()
}

fn lock_keys(names: &[String]) -> Result<Vec<LockKey>, String> {
    names.iter().map(|k| k.parse().map_err(err)).collect()
}

/// One key held elsewhere: `try_lock_all` returns none and holds none of
/// the others; once it is free, every key is taken with a fence each.
pub async fn lock_all_is_all_or_nothing(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let m = manager(&b, LONG)?;
    let names = keys("multi-all", 3);
    let (token, _) = raw_acquire(&f.open().await?, &names[1], LONG).await?;
    let none = m
        .try_lock_all(&names, LockOptions::new())
        .await
        .map_err(err)?;
    ensure!(
        none.is_none(),
        "try_lock_all succeeded with a key held elsewhere"
    );
    for k in [&names[0], &names[2]] {
        ensure!(
            is_free(&b, k, LONG).await?,
            "a failed try_lock_all left {k} held"
        );
    }
    b.delete(&names[1].parse().map_err(err)?, &token)
        .await
        .map_err(err)?;
    let all = m
        .lock_all(names.iter().rev(), LockOptions::new().timeout(LONG))
        .await
        .map_err(err)?;
    let held: Vec<&str> = all.keys().iter().map(|k| k.as_str()).collect();
    ensure!(
        held == names,
        "lock_all holds {held:?}, not the keys in order"
    );
    ensure!(
        all.fences().len() == 3 && all.is_held(),
        "not every key is held"
    );
    ensure!(
        m.try_lock(&names[0]).await.map_err(err)?.is_none(),
        "a key of a held multi-lock was free"
    );
    all.release().await.map_err(err)?;
    for k in &names {
        ensure!(is_free(&b, k, LONG).await?, "{k} was held after release");
    }
    Ok(Outcome::Passed)
}

/// 8 tasks on 2 clients lock the same 3 keys named in shuffled orders, with
/// single-key lockers beside them: no deadlock, no key ever held twice.
pub async fn lock_all_in_any_order_never_deadlocks(f: Factory) -> CaseResult {
    let names = keys("multi-order", 3);
    let detectors: Vec<OverlapDetector> = names.iter().map(|_| OverlapDetector::new()).collect();
    let mut tasks = Vec::new();
    for c in 0..2usize {
        let m = manager(&f.open().await?, LONG)?;
        for t in 0..4usize {
            let (m, names, detectors) = (m.clone(), names.clone(), detectors.clone());
            tasks.push(tokio::spawn(async move {
                for round in 0..8usize {
                    let mut order = names.clone();
                    order.rotate_left((c + t + round) % 3);
                    if (t + round) % 2 == 0 {
                        order.reverse();
                    }
                    multi_round(&m, &order, &names, &detectors, t == 3).await?;
                }
                Ok::<(), String>(())
            }));
        }
    }
    let all = async {
        for t in tasks {
            t.await.map_err(|e| format!("a task panicked: {e}"))??;
        }
        Ok::<(), String>(())
    };
    tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .map_err(|_| "lockers of the same keys in different orders deadlocked".to_owned())??;
    for (k, d) in names.iter().zip(&detectors) {
        ensure!(
            d.overlaps() == 0,
            "{k} was held twice at once ({} times)",
            d.overlaps()
        );
    }
    Ok(Outcome::Passed)
}

/// One round: every key (or, for a single-key locker, the first named).
async fn multi_round(
    m: &LockManager,
    order: &[String],
    names: &[String],
    detectors: &[OverlapDetector],
    single: bool,
) -> Result<(), String> {
    let wanted: Vec<&String> = if single {
        order.iter().take(1).collect()
    } else {
        order.iter().collect()
    };
    let idx: Vec<usize> = wanted
        .iter()
        .filter_map(|k| names.iter().position(|n| n == *k))
        .collect();
    let g = m.lock_all(wanted, LockOptions::new()).await.map_err(err)?;
    idx.iter().for_each(|i| detectors[*i].enter());
    tokio::time::sleep(Duration::from_millis(1)).await;
    idx.iter().for_each(|i| detectors[*i].exit());
    g.release().await.map_err(err)
}

/// The timeout covers the whole set: with both keys held until they
/// expire, `lock_all` gives up once, at its timeout; after the holds
/// expire by the store's clock it gets every key.
pub async fn lock_all_timeout_is_cumulative(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let ttl = short_ttl(&b) * 2;
    let names = keys("multi-timeout", 2);
    let other = f.open().await?;
    let first = timed_acquire(&other, &names[0], ttl).await?;
    let second = timed_acquire(&other, &names[1], ttl).await?;
    let m = manager(&b, LONG)?;
    let limit = ttl / 4;
    let started = Instant::now();
    let r = m.lock_all(&names, LockOptions::new().timeout(limit)).await;
    let waited = started.elapsed();
    ensure!(
        matches!(r, Err(Error::Timeout { .. })),
        "lock_all of held keys with a timeout gave {r:?}"
    );
    ensure!(
        waited < limit + Duration::from_millis(500),
        "lock_all with a timeout of {limit:?} gave up only after {waited:?}"
    );
    tokio::time::sleep_until(first.surely_gone().max(second.surely_gone())).await;
    let g = m
        .lock_all(&names, LockOptions::new().timeout(LONG))
        .await
        .map_err(|e| format!("after the holds expired: {e}"))?;
    ensure!(g.is_held(), "the multi-lock is not held");
    Ok(Outcome::Passed)
}

/// Multi-locks cancelled at points spread over their requests (a delay
/// wrapper slows each one) leave every key free.
pub async fn lock_all_cancel_leaves_nothing(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let slow: Arc<dyn Backend> = Arc::new(Delay::new(
        b.clone(),
        Duration::from_millis(3),
        Duration::from_millis(3),
    ));
    // Longer than the case waits: a hold left behind cannot expire away.
    let m = manager(&slow, Duration::from_secs(30))?;
    let names = keys("multi-cancel", 3);
    for i in 0..24u64 {
        let cut = Duration::from_micros(3_500 + i * 400);
        if let Ok(r) = tokio::time::timeout(cut, m.lock_all(&names, LockOptions::new())).await {
            r.map_err(err)?.release().await.map_err(err)?;
        }
    }
    let last_cancel = Instant::now();
    moltlock_core::wait_for_cleanups(LONG).await;
    for k in &names {
        ensure!(
            becomes_free(&b, k, LONG).await?,
            "{k} stayed held after the multi-locks were cancelled"
        );
    }
    ensure!(m.held_count() == 0, "the manager still renews holds");
    free_after_late_writes(&b, &names, last_cancel).await
}

/// Deleting one key behind the holder's back makes the multi-lock's
/// `lost()` fire, naming that key, within a renewal interval or so.
pub async fn lock_all_lost_fires_when_any_key_is_lost(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let ttl = short_ttl(&b) * 3;
    let m = manager(&b, ttl)?;
    let names = keys("multi-lost", 3);
    let g = m.lock_all(&names, LockOptions::new()).await.map_err(err)?;
    let victim = &g.guards()[1];
    ensure!(
        f.open()
            .await?
            .delete(victim.key(), victim.token())
            .await
            .map_err(err)?,
        "the second handle could not delete the hold"
    );
    let bound = ttl / 3 + ttl / 6;
    let lost = tokio::time::timeout(bound, g.lost()).await;
    let Ok((lost_key, _)) = lost else {
        return Err(format!(
            "lost() did not fire within {bound:?} of the deletion"
        ));
    };
    ensure!(
        lost_key.as_str() == names[1],
        "lost() named {lost_key}, not {}",
        names[1]
    );
    ensure!(
        !g.is_held() && g.check().is_err(),
        "the multi-lock still claims to be held"
    );
    Ok(Outcome::Passed)
}

/// `cas_multi(All)` with one key held elsewhere takes nothing and names
/// the busy key; with every key free it takes all, each with a fence above
/// that key's earlier ones.
pub async fn cas_multi_all_takes_nothing_when_one_is_held(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let names = derived("casm-all", 3);
    let ks = lock_keys(&names)?;
    let mut before = Vec::new();
    for k in &names {
        let (t, fence) = raw_acquire(&b, k, LONG).await?;
        b.delete(&k.parse().map_err(err)?, &t).await.map_err(err)?;
        before.push(fence);
    }
    let (blocker, _) = raw_acquire(&f.open().await?, &names[1], LONG).await?;
    let token = Token::random();
    let out = b
        .cas_multi(&ks, &token, LONG, MultiMode::All)
        .await
        .map_err(err)?;
    let MultiOutcome::Held(busy) = out else {
        return Err(format!(
            "cas_multi(All) took keys while one was held: {out:?}"
        ));
    };
    ensure!(
        busy.iter()
            .any(|(i, h)| *i == 1 && h.holder.as_ref().is_none_or(|t| *t == blocker)),
        "the busy answer {busy:?} does not name key 1 and its holder"
    );
    for k in [&names[0], &names[2]] {
        ensure!(
            is_free(&b, k, LONG).await?,
            "a refused cas_multi(All) left {k} held"
        );
    }
    b.delete(&ks[1], &blocker).await.map_err(err)?;
    let out = b
        .cas_multi(&ks, &token, LONG, MultiMode::All)
        .await
        .map_err(err)?;
    let MultiOutcome::Acquired(taken) = out else {
        return Err(format!("cas_multi(All) of free keys gave {out:?}"));
    };
    ensure!(taken.len() == 3, "cas_multi(All) took {taken:?}, not all 3");
    for (i, fence) in &taken {
        ensure!(
            *fence > before[*i],
            "key {i} got fence {fence} after {}",
            before[*i]
        );
        ensure!(
            b.delete(&ks[*i], &token).await.map_err(err)?,
            "key {i} was not held by the token"
        );
    }
    Ok(Outcome::Passed)
}

/// While one key is held elsewhere, an observer racing repeated
/// `cas_multi(All)` attempts never finds another key of the set taken:
/// no part of an All set is ever visible.
pub async fn cas_multi_all_is_never_seen_partial(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let names = derived("casm-partial", 3);
    let ks = lock_keys(&names)?;
    let (blocker, _) = raw_acquire(&f.open().await?, &names[2], LONG).await?;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let observer = {
        let (obs, names, stop) = (f.open().await?, names.clone(), stop.clone());
        tokio::spawn(async move {
            let mut seen = 0u64;
            while !stop.load(Ordering::SeqCst) {
                for k in &names[..2] {
                    if !is_free(&obs, k, LONG).await? {
                        seen += 1;
                    }
                }
            }
            Ok::<u64, String>(seen)
        })
    };
    let until = Instant::now() + Duration::from_millis(800);
    let mut attempts = 0u64;
    while Instant::now() < until {
        let out = b
            .cas_multi(&ks, &Token::random(), LONG, MultiMode::All)
            .await
            .map_err(err)?;
        ensure!(
            matches!(out, MultiOutcome::Held(_)),
            "cas_multi(All) took a held key: {out:?}"
        );
        attempts += 1;
    }
    stop.store(true, Ordering::SeqCst);
    let seen = observer
        .await
        .map_err(|e| format!("the observer panicked: {e}"))??;
    b.delete(&ks[2], &blocker).await.map_err(err)?;
    ensure!(
        seen == 0,
        "an observer found a key of a refused All set held {seen} times in {attempts} attempts"
    );
    Ok(Outcome::Passed)
}

/// `cas_multi(Any)` takes the first free key in the order given (an
/// expired hold counts as free) and only that one; with none free it
/// reports every key.
pub async fn cas_multi_any_takes_the_first_free(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let free = lock_keys(&derived("casm-any-free", 3))?;
    let first = Token::random();
    let out = b
        .cas_multi(&free, &first, LONG, MultiMode::Any)
        .await
        .map_err(err)?;
    ensure!(
        matches!(&out, MultiOutcome::Acquired(t) if t.len() == 1 && t[0].0 == 0),
        "cas_multi(Any) of 3 free keys gave {out:?}, not the first key"
    );
    for k in &free[1..] {
        ensure!(
            is_free(&b, k.as_str(), LONG).await?,
            "cas_multi(Any) took {k} as well"
        );
    }
    b.delete(&free[0], &first).await.map_err(err)?;
    let names = derived("casm-any", 3);
    let ks = lock_keys(&names)?;
    let other = f.open().await?;
    // A handle of its own, so no longer hold shares a lease with it.
    let expired = timed_acquire(&f.open().await?, &names[0], short_ttl(&b)).await?;
    let (held, _) = raw_acquire(&other, &names[1], LONG).await?;
    let mine = Token::random();
    let out = b
        .cas_multi(&ks, &mine, LONG, MultiMode::Any)
        .await
        .map_err(err)?;
    ensure!(
        matches!(&out, MultiOutcome::Acquired(t) if t.len() == 1 && t[0].0 == 2),
        "cas_multi(Any) with only key 2 free gave {out:?}"
    );
    let out = b
        .cas_multi(&ks, &Token::random(), LONG, MultiMode::Any)
        .await
        .map_err(err)?;
    ensure!(
        matches!(&out, MultiOutcome::Held(busy) if busy.len() == 3),
        "cas_multi(Any) with no key free gave {out:?}, not a busy answer for each key"
    );
    tokio::time::sleep_until(expired.surely_gone()).await;
    let late = Token::random();
    let out = b
        .cas_multi(&ks, &late, LONG, MultiMode::Any)
        .await
        .map_err(err)?;
    ensure!(
        matches!(&out, MultiOutcome::Acquired(t) if t.len() == 1 && t[0].0 == 0),
        "cas_multi(Any) with key 0 expired gave {out:?}"
    );
    for (k, t) in [(&ks[0], &late), (&ks[1], &held), (&ks[2], &mine)] {
        ensure!(
            b.delete(k, t).await.map_err(err)?,
            "{k} was not held by its taker"
        );
    }
    Ok(Outcome::Passed)
}
