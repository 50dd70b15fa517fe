//! The fair queue: arrival order, no barging, dropped waiters leave.

use super::common::*;
use moltlock_core::{LockGuard, LockKey, LockOptions};

/// A fair hold of `k` on a manager of its own.
async fn fair_holder(f: &Factory, k: &str) -> Result<(LockManager, LockGuard), String> {
    let holder = manager(&f.open().await?, LONG)?;
    let guard = holder
        .acquire(k, LockOptions::new().fair())
        .await
        .map_err(err)?
        .ok_or("fair acquire returned no guard")?;
    Ok((holder, guard))
}

/// A fair newcomer that arrives as the key is released queues behind the
/// waiter already queued; it never barges ahead on the free key.
pub async fn fair_newcomer_does_not_barge(f: Factory) -> CaseResult {
    let k = key("fair-barge");
    let (_holder, first) = fair_holder(&f, &k).await?;
    let order: Arc<Mutex<Vec<&'static str>>> = Arc::default();
    let spawn_fair = |name: &'static str, m: LockManager| {
        let (k, order) = (k.clone(), order.clone());
        tokio::spawn(async move {
            let g = m
                .acquire(&k, LockOptions::new().fair())
                .await
                .map_err(err)?
                .ok_or("fair acquire returned no guard")?;
            if let Ok(mut o) = order.lock() {
                o.push(name);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            g.release().await.map_err(err)
        })
    };
    let queued = spawn_fair("queued", manager(&f.open().await?, LONG)?);
    let newcomer_m = manager(&f.open().await?, LONG)?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    first.release().await.map_err(err)?;
    let newcomer = spawn_fair("newcomer", newcomer_m);
    queued.await.map_err(|e| e.to_string())??;
    newcomer.await.map_err(|e| e.to_string())??;
    let got = order.lock().map(|o| o.clone()).unwrap_or_default();
    ensure!(
        got == vec!["queued", "newcomer"],
        "served in the order {got:?}: the newcomer barged ahead of the queued waiter"
    );
    Ok(Outcome::Passed)
}

/// A dropped fair waiter's place is removed: the waiter behind it gets the
/// key within a second of the release.
pub async fn fair_dropped_waiter_leaves_the_queue(f: Factory) -> CaseResult {
    let k = key("fair-dropped");
    let (_holder, first) = fair_holder(&f, &k).await?;
    let dropped_m = manager(&f.open().await?, LONG)?;
    let k2 = k.clone();
    let dropped = tokio::spawn(async move {
        let _ = dropped_m.acquire(&k2, LockOptions::new().fair()).await;
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let behind_m = manager(&f.open().await?, LONG)?;
    let k3 = k.clone();
    let behind = tokio::spawn(async move {
        let g = behind_m
            .acquire(&k3, LockOptions::new().fair())
            .await
            .map_err(err)?
            .ok_or("fair acquire returned no guard")?;
        let got = Instant::now();
        g.release().await.map_err(err)?;
        Ok::<Instant, String>(got)
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    dropped.abort();
    let _ = dropped.await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let released = Instant::now();
    first.release().await.map_err(err)?;
    let got = tokio::time::timeout(Duration::from_secs(5), behind)
        .await
        .map_err(|_| "the waiter behind a dropped one never got the key".to_owned())?
        .map_err(|e| e.to_string())??;
    let gap = got.saturating_duration_since(released);
    ensure!(
        gap < Duration::from_secs(1),
        "the waiter behind a dropped one got the key {gap:?} after the release"
    );
    Ok(Outcome::Passed)
}

/// A fair acquisition that finds the key held by its own token (an earlier
/// attempt of its that landed although its caller saw it fail) does not
/// wait on itself: it holds the key, with the fence the store reports for
/// it, within a second, long before that hold's TTL.
pub async fn fair_acquire_does_not_wait_on_its_own_hold(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let k = LockKey::new(key("fair-own")).map_err(err)?;
    let token = Token::random();
    if !matches!(
        b.cas(&k, None, &token, LONG).await.map_err(err)?,
        CasOutcome::Acquired { .. }
    ) {
        return Err("a fresh key was not granted".into());
    }
    let queue = b.fair_queue().ok_or("the backend declares no fair queue")?;
    let got = tokio::time::timeout(Duration::from_secs(1), queue.acquire(&k, &token, LONG)).await;
    let fence = got
        .map_err(|_| format!("a fair acquisition waited on its own hold (TTL {LONG:?})"))?
        .map_err(err)?;
    let seen = match b.inspector() {
        Some(i) => i.inspect(&k).await.map_err(err)?.and_then(|h| h.fence),
        None => None,
    };
    let held = holder_of(&b, k.as_str(), LONG).await;
    let _ = b.delete(&k, &token).await;
    let held = held?.ok_or("nobody holds the key after the fair acquisition")?;
    ensure!(
        held.holder.as_ref() == Some(&token),
        "held by {:?}",
        held.holder
    );
    ensure!(
        seen.is_none_or(|f| f == fence),
        "the fair acquisition returned fence {fence:?}, the store reports {seen:?}"
    );
    Ok(Outcome::Passed)
}

/// In fair mode waiters get the key strictly in arrival order.
pub async fn fair_queue_serves_in_arrival_order(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let m = manager(&b, Duration::from_secs(10))?;
    let k = key("fair");
    let first = m
        .acquire(&k, LockOptions::new().fair())
        .await
        .map_err(err)?;
    let first = first.ok_or("fair acquire returned no guard")?;
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..5usize {
        let (m, k, order) = (
            manager(&f.open().await?, Duration::from_secs(10))?,
            k.clone(),
            order.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let g = m
                .acquire(&k, LockOptions::new().fair())
                .await
                .map_err(err)?;
            let g = g.ok_or("fair acquire returned no guard")?;
            if let Ok(mut o) = order.lock() {
                o.push(i);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            g.release().await.map_err(err)
        }));
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    first.release().await.map_err(err)?;
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    let got = order.lock().map(|o| o.clone()).unwrap_or_default();
    ensure!(
        got == vec![0, 1, 2, 3, 4],
        "served in the order {got:?}, not arrival order"
    );
    Ok(Outcome::Passed)
}

/// A fair waiter that stops looking loses its place once its time has
/// passed: the waiter behind it gets the key within twice the TTL of the
/// release, where a store that keeps every place until its waiter leaves
/// would hold it back for good. The frozen waiter runs on a runtime of its
/// own that then stalls (as a crashed or stopped process does: nothing of
/// it runs, nothing of it is dropped).
pub async fn fair_frozen_waiter_loses_its_place(f: Factory) -> CaseResult {
    let Frozen {
        b, ttl, k, first, ..
    } = behind_a_frozen_waiter(&f, "fair-frozen").await?;
    let behind_m = manager(&f.open().await?, ttl)?;
    let k2 = k.clone();
    let behind = tokio::spawn(async move {
        let g = behind_m
            .acquire(&k2, LockOptions::new().fair())
            .await
            .map_err(err)?
            .ok_or("fair acquire returned no guard")?;
        let got = Instant::now();
        g.release().await.map_err(err)?;
        Ok::<Instant, String>(got)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    first.release().await.map_err(err)?;
    let within = ttl * 2 + b.limits().min_ttl + Duration::from_secs(1);
    let mut behind = behind;
    let got = match tokio::time::timeout(within, &mut behind).await {
        Ok(got) => got,
        Err(_) => {
            let waited = ends_while_the_store_answers(&b, &mut behind, within * 2).await;
            match waited {
                Ok(Some(got)) => got,
                Ok(None) => {
                    behind.abort();
                    return Err(format!(
                        "the waiter behind a frozen one had no key {:?} after the release, \
                         while the store answered every probe within {PROMPT:?}: the frozen \
                         waiter's place was kept",
                        within * 3
                    ));
                }
                Err(e) => {
                    behind.abort();
                    return Err(e);
                }
            }
        }
    };
    let got = got.map_err(|e| e.to_string())??;
    ensure!(
        got >= released,
        "the waiter behind a frozen one got the key before the release"
    );
    Ok(Outcome::Passed)
}

/// A fair newcomer that finds the key free while a queued waiter's place is
/// alive (the waiter frozen just after it queued, so it cannot take the
/// key) does not take it: a free key is taken at once only with an empty
/// queue.
pub async fn fair_newcomer_waits_behind_a_frozen_place(f: Factory) -> CaseResult {
    let Frozen { ttl, k, first, .. } = behind_a_frozen_waiter(&f, "fair-frozen-newcomer").await?;
    let frozen = Instant::now();
    let newcomer = manager(&f.open().await?, ttl)?;
    first.release().await.map_err(err)?;
    let opts = LockOptions::new().fair().timeout(Duration::from_millis(50));
    match newcomer.acquire(&k, opts).await {
        Err(Error::Timeout { .. }) | Ok(None) => {}
        // A place may end half a second after its waiter's last look.
        Ok(Some(_)) if frozen.elapsed() > Duration::from_millis(500) => {
            return Err(format!(
                "{SLOW}: the frozen waiter's place could have ended before the newcomer came"
            ))
        }
        Ok(Some(_)) => {
            return Err(
                "a fair newcomer took the free key at once while a queued waiter's place was alive"
                    .into(),
            )
        }
        Err(e) => return Err(err(e)),
    }
    Ok(Outcome::Passed)
}

/// A waiter woken because the place just ahead of it left does not pass a
/// live place further ahead: queued behind a leaving waiter and, before
/// it, a frozen one, it does not take the free key when the leaving
/// waiter drops out.
pub async fn fair_waiter_does_not_pass_a_place_ahead(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let ttl = short_ttl(&b);
    let (leaving_m, behind_m) = (manager(&f.open().await?, ttl)?, manager(&b, ttl)?);
    let Frozen { k, first, .. } = behind_a_frozen_waiter(&f, "fair-pass").await?;
    // A place may end half a second after its waiter's last look.
    let frozen = Instant::now();
    let alive_until = frozen + Duration::from_millis(450);
    let fair_task = |m: LockManager, k: String| {
        tokio::spawn(async move {
            let g = m.acquire(&k, LockOptions::new().fair()).await;
            let g = g.map_err(err)?.ok_or("fair acquire returned no guard")?;
            g.release().await.map_err(err)
        })
    };
    let leaving = fair_task(leaving_m, k.clone());
    tokio::time::sleep(Duration::from_millis(60)).await;
    let behind = fair_task(behind_m, k.clone());
    tokio::time::sleep(Duration::from_millis(60)).await;
    if leaving.is_finished() || behind.is_finished() {
        let ended = if leaving.is_finished() {
            leaving
        } else {
            behind
        };
        let why = ended.await.map_err(|e| e.to_string())?.err();
        return Err(format!(
            "a fair waiter stopped waiting behind a held key: {why:?}"
        ));
    }
    first.release().await.map_err(err)?;
    leaving.abort();
    while Instant::now() < alive_until && !behind.is_finished() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if !behind.is_finished() {
        behind.abort();
        return Ok(Outcome::Passed);
    }
    behind.await.map_err(|e| e.to_string())??;
    if frozen.elapsed() > Duration::from_millis(500) {
        return Err(format!(
            "{SLOW}: the frozen waiter's place could have ended before the waiter behind took the key"
        ));
    }
    Err(
        "a fair waiter took the free key past a live place ahead of it when the place just ahead left"
            .into(),
    )
}

/// A fair hold of a fresh key with a fair waiter frozen behind it.
struct Frozen {
    b: Arc<dyn Backend>,
    ttl: Duration,
    k: String,
    _holder: LockManager,
    first: LockGuard,
}

/// Holds a fresh key named after `name` fairly and freezes a fair waiter
/// behind the hold for far longer than its TTL.
async fn behind_a_frozen_waiter(f: &Factory, name: &str) -> Result<Frozen, String> {
    let b = f.open().await?;
    let ttl = short_ttl(&b);
    let k = key(name);
    let (_holder, first) = fair_holder(f, &k).await?;
    let freeze = ttl * 4 + Duration::from_secs(10);
    freeze_a_fair_waiter(f.clone(), k.clone(), ttl, freeze).await?;
    Ok(Frozen {
        b,
        ttl,
        k,
        _holder,
        first,
    })
}

/// Starts a fair waiter for `k` on a runtime of its own, in a thread of
/// its own, and returns once it waits; its runtime then stalls for
/// `freeze` and is dropped.
async fn freeze_a_fair_waiter(
    f: Factory,
    k: String,
    ttl: Duration,
    freeze: Duration,
) -> Result<(), String> {
    let (tx, rx) = tokio::sync::oneshot::channel::<Result<(), String>>();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    std::thread::spawn(move || {
        runtime.block_on(async move {
            let waiting = async {
                let m = manager(&f.open().await?, ttl)?;
                let task = tokio::spawn(async move {
                    let _ = m.acquire(&k, LockOptions::new().fair()).await;
                });
                tokio::time::sleep(Duration::from_millis(300)).await;
                ensure!(
                    !task.is_finished(),
                    "the fair waiter to freeze stopped waiting"
                );
                Ok::<_, String>(task)
            };
            let task = waiting.await;
            let _ = tx.send(task.as_ref().map(|_| ()).map_err(Clone::clone));
            // The stall: nothing on this runtime runs meanwhile.
            std::thread::sleep(freeze);
            drop(task);
        });
    });
    rx.await
        .map_err(|_| "the frozen waiter's thread ended".to_owned())?
}
