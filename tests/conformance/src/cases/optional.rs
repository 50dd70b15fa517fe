//! Optional features: release watches, inspect/list, holder descriptions.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use moltlock_core::{BackendExt, CasOutcome, LockManager, RetryPolicy, Token};
use tokio::time::Instant;

use super::common::*;
use crate::{CaseResult, Factory, Outcome};

/// `watch()` subscribes before it returns: a release between `watch()` and
/// `released()` still resolves the watch.
pub async fn watch_subscribes_before_it_returns(f: Factory) -> CaseResult {
    let holder = f.open().await?;
    let waiter = f.open().await?;
    let k = key("watch-early");
    let (owner, _) = raw_acquire(&holder, &k, LONG).await?;
    let lk = k.parse().map_err(err)?;
    let mut watch = waiter.watch(&lk).await.map_err(err)?;
    let held = match waiter
        .cas(&lk, None, &Token::random(), LONG)
        .await
        .map_err(err)?
    {
        CasOutcome::Held(h) => h,
        CasOutcome::Acquired { .. } => return Err("a held key was acquired".into()),
    };
    ensure!(
        holder.delete(&lk, &owner).await.map_err(err)?,
        "the holder could not release"
    );
    let within = Duration::from_secs(2);
    match tokio::time::timeout(within, watch.released(&held)).await {
        Ok(r) => r.map_err(err)?,
        Err(_) => {
            return Err(format!(
                "a release between watch() and released() was missed (waited {within:?})"
            ))
        }
    }
    Ok(Outcome::Passed)
}

/// A watch keeps firing for every release: three waiters queued behind one
/// holder (retry policy 5 s) are each handed the key within a second of the
/// release before it.
pub async fn watch_fires_for_every_release(f: Factory) -> CaseResult {
    let holder = manager(&f.open().await?, LONG)?;
    let k = key("watch-every");
    let g = holder.lock(&k).await.map_err(err)?;
    let log: Arc<Mutex<Vec<(usize, Instant, Instant)>>> = Arc::default();
    let mut tasks = Vec::new();
    for i in 0..3 {
        let m = LockManager::builder(f.open().await?)
            .ttl(LONG)
            .retry(RetryPolicy::Fixed(Duration::from_secs(5)))
            .build()
            .map_err(err)?;
        let (k, log) = (k.clone(), log.clone());
        tasks.push(tokio::spawn(async move {
            let g = m.lock(&k).await.map_err(err)?;
            let got = Instant::now();
            tokio::time::sleep(Duration::from_millis(50)).await;
            let released = Instant::now();
            g.release().await.map_err(err)?;
            if let Ok(mut l) = log.lock() {
                l.push((i, got, released));
            }
            Ok::<(), String>(())
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut released = Instant::now();
    g.release().await.map_err(err)?;
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    let mut log = log.lock().map(|l| l.clone()).unwrap_or_default();
    log.sort_by_key(|(_, got, _)| *got);
    for (n, (i, got, rel)) in log.iter().enumerate() {
        let gap = got.saturating_duration_since(released);
        ensure!(
            gap < Duration::from_secs(1),
            "waiter {i} (served #{}) got the key {gap:?} after the release before it",
            n + 1
        );
        released = *rel;
    }
    Ok(Outcome::Passed)
}

/// `inspect` and `list` are exact: `list(prefix)` returns exactly the holds
/// under the prefix (not a sibling that shares its first characters, nor
/// one that matches it when `_ % * ? [ ]` are taken as wildcards), each with
/// its own holder and fence; time left shrinks as time passes.
pub async fn inspect_and_list_are_exact(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let base = key("list");
    // The prefix carries the wildcards of SQL LIKE and of glob patterns; the
    // siblings match it only if they are taken as wildcards.
    let prefix = format!("{base}/w_%*?[ab]/");
    let under = [format!("{prefix}a"), format!("{prefix}b/c")];
    let outside = [
        format!("{base}/wX%*?[ab]/d"),
        format!("{base}/w_%Qa/d"),
        format!("{base}x/d"),
        key("list-other"),
    ];
    let mut holds = Vec::new();
    for k in under.iter().chain(outside.iter()) {
        let (token, fence) = raw_acquire(&b, k, LONG).await?;
        holds.push((k.clone(), token, fence));
    }
    let listed = b.list(&prefix).await.map_err(err)?;
    let got: BTreeSet<String> = listed.iter().map(|i| i.key.clone()).collect();
    let want: BTreeSet<String> = under.iter().cloned().collect();
    ensure!(
        got == want,
        "list({prefix:?}) returned {got:?}, not exactly {want:?}"
    );
    for info in &listed {
        let Some((_, token, fence)) = holds.iter().find(|(k, _, _)| *k == info.key) else {
            continue;
        };
        ensure!(
            &info.holder == token,
            "list reports another holder for {:?}",
            info.key
        );
        if let Some(reported) = info.fence {
            ensure!(
                reported == *fence,
                "list reports fence {reported} for {:?}, whose hold has fence {fence}",
                info.key
            );
        }
    }
    let (first_k, first_token, first_fence) = &holds[0];
    let lk = first_k.parse().map_err(err)?;
    let before = b
        .inspect(&lk)
        .await
        .map_err(err)?
        .ok_or("inspect found no holder of a held key")?;
    ensure!(
        &before.holder == first_token,
        "inspect reports another holder"
    );
    if let Some(reported) = before.fence {
        ensure!(
            reported == *first_fence,
            "inspect reports fence {reported}, not the hold's own {first_fence}"
        );
    }
    let slept_from = Instant::now();
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let after = b
        .inspect(&lk)
        .await
        .map_err(err)?
        .ok_or("inspect lost a held key")?;
    let slept = slept_from.elapsed();
    if let (Some(e1), Some(e2)) = (before.expires_in, after.expires_in) {
        ensure!(e1 <= LONG, "inspect reports {e1:?} left of a {LONG:?} hold");
        ensure!(
            e2 < e1,
            "time left did not shrink: {e1:?} then {e2:?} after {slept:?}"
        );
        ensure!(
            e1 - e2 <= slept + Duration::from_millis(1_000),
            "time left shrank by {:?} in {slept:?}",
            e1 - e2
        );
    }
    Ok(Outcome::Passed)
}

/// Expired holds are never reported by `inspect` or `list`.
pub async fn inspect_hides_expired_holds(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let ttl = short_ttl(&b);
    let base = key("inspect-expired");
    let k = format!("{base}/gone");
    let t = timed_acquire(&b, &k, ttl).await?;
    tokio::time::sleep_until(t.surely_gone()).await;
    let lk = k.parse().map_err(err)?;
    let info = b.inspect(&lk).await.map_err(err)?;
    ensure!(info.is_none(), "inspect reports an expired hold: {info:?}");
    let listed = b.list(&format!("{base}/")).await.map_err(err)?;
    ensure!(
        listed.is_empty(),
        "list reports an expired hold: {listed:?}"
    );
    Ok(Outcome::Passed)
}

/// A holder description is owner-checked (as a renewal), is what `inspect`
/// and `list` report for its hold (where declared), and ends with the hold:
/// a new hold of the key starts with none.
pub async fn descriptions_belong_to_their_hold(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let other = f.open().await?;
    let k = key("describe");
    let lk = k.parse().map_err(err)?;
    let (owner, _) = raw_acquire(&b, &k, LONG).await?;
    let text = "host-a pid 42";
    ensure!(
        b.describe(&lk, &owner, text).await.map_err(err)?,
        "the holder could not describe its hold"
    );
    ensure!(
        !other
            .describe(&lk, &Token::random(), "intruder")
            .await
            .map_err(err)?,
        "a stranger's description of another's hold was accepted"
    );
    let inspect = b.inspector().is_some();
    if inspect {
        let info = other.inspect(&lk).await.map_err(err)?;
        let got = info.and_then(|i| i.description);
        ensure!(
            got.as_deref() == Some(text),
            "inspect reports the description {got:?}, not the holder's {text:?}"
        );
        let listed = other.list(&k).await.map_err(err)?;
        let got = listed
            .into_iter()
            .find(|i| i.key == k)
            .and_then(|i| i.description);
        ensure!(
            got.as_deref() == Some(text),
            "list reports the description {got:?}, not the holder's {text:?}"
        );
    }
    ensure!(
        b.delete(&lk, &owner).await.map_err(err)?,
        "the holder could not release"
    );
    ensure!(
        !b.describe(&lk, &owner, "late").await.map_err(err)?,
        "a released hold could still be described"
    );
    let (next, _) = raw_acquire(&other, &k, LONG).await?;
    if inspect {
        let info = other.inspect(&lk).await.map_err(err)?;
        let got = info.and_then(|i| i.description);
        ensure!(
            got.is_none(),
            "a new hold of the key reports the old hold's description {got:?}"
        );
    }
    ensure!(
        other.delete(&lk, &next).await.map_err(err)?,
        "the next holder could not release"
    );
    Ok(Outcome::Passed)
}

/// With release notifications, a waiter gets the key well before its next
/// poll would (the retry policy here waits 5 s).
pub async fn release_wakes_waiter_quickly(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let holder = manager(&b, Duration::from_secs(10))?;
    let waiter = LockManager::builder(f.open().await?)
        .ttl(Duration::from_secs(10))
        .retry(RetryPolicy::Fixed(Duration::from_secs(5)))
        .build()
        .map_err(err)?;
    let k = key("wakeup");
    let g = holder.lock(&k).await.map_err(err)?;
    let k2 = k.clone();
    let task = tokio::spawn(async move {
        let g = waiter.lock(&k2).await.map_err(err)?;
        Ok::<_, String>((Instant::now(), g))
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let released_at = Instant::now();
    g.release().await.map_err(err)?;
    let (acquired_at, _g) = task.await.map_err(|e| e.to_string())??;
    let gap = acquired_at - released_at;
    ensure!(
        gap < Duration::from_secs(1),
        "the waiter took {gap:?} after the release"
    );
    Ok(Outcome::Passed)
}

/// `inspect` and `list` report the holder, its fence and time left.
pub async fn inspect_reports_holder(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let m = manager(&b, Duration::from_secs(10))?;
    let k = key("inspect");
    let g = m.lock(&k).await.map_err(err)?;
    let info = b.inspect(g.key()).await.map_err(err)?;
    let info = info.ok_or("inspect found no holder of a held key")?;
    ensure!(&info.holder == g.token(), "inspect reports another holder");
    ensure!(info.key == k, "inspect reports the key {:?}", info.key);
    if let Some(fence) = info.fence {
        ensure!(
            fence == g.fence(),
            "inspect reports fence {fence}, not {}",
            g.fence()
        );
    }
    if let Some(left) = info.expires_in {
        ensure!(
            left <= Duration::from_secs(10),
            "inspect reports {left:?} left of a 10 s TTL"
        );
    }
    let prefix = k.rsplit_once('/').map(|(p, _)| p).unwrap_or(&k);
    let listed = b.list(prefix).await.map_err(err)?;
    ensure!(
        listed.iter().any(|i| i.key == k),
        "list under {prefix:?} misses the hold"
    );
    g.release().await.map_err(err)?;
    let info = b.inspect(&k.parse().map_err(err)?).await.map_err(err)?;
    ensure!(info.is_none(), "inspect reports a holder after release");
    Ok(Outcome::Passed)
}

/// A backend that declares its requests in order
/// ([`Limits::in_order`](moltlock_core::Limits)) applies a delete before an
/// attempt the same handle sends after the delete's future was first
/// polled: the attempt takes the key the delete freed. A manager relies on
/// it to wake its own waiter as soon as it has sent a release.
pub async fn delete_lands_before_a_later_attempt(f: Factory) -> CaseResult {
    use std::future::Future;

    let b = f.open().await?;
    let k = key("in-order");
    let lk: moltlock_core::LockKey = k.parse().map_err(err)?;
    for round in 0..20 {
        let (owner, _) = raw_acquire(&b, &k, LONG).await?;
        let mut delete = std::pin::pin!(b.delete(&lk, &owner));
        let sent =
            std::future::poll_fn(|cx| std::task::Poll::Ready(delete.as_mut().poll(cx))).await;
        let next = Token::random();
        let attempt = b.cas(&lk, None, &next, LONG).await.map_err(err);
        let deleted = match sent {
            std::task::Poll::Ready(done) => done,
            std::task::Poll::Pending => delete.await,
        };
        ensure!(
            deleted.map_err(err)?,
            "round {round}: the delete did not find its own hold"
        );
        match attempt? {
            CasOutcome::Acquired { .. } => {
                b.delete(&lk, &next).await.map_err(err)?;
            }
            CasOutcome::Held(h) => {
                return Err(format!(
                    "round {round}: an attempt sent after a delete found the key still held \
                     (by {:?}): the backend declares its requests in order, but applied the \
                     delete after the attempt",
                    h.holder
                ))
            }
        }
    }
    Ok(Outcome::Passed)
}
