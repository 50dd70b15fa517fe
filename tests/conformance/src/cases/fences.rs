//! Fences: long-lived clients, contention, raising minimums, fair and plain.

use std::time::Duration;

use moltlock_core::{BackendExt, Fence, LockKey, LockOptions};

use super::common::*;
use crate::{CaseResult, Factory, Outcome};

/// Two clients that take turns for many rounds see the fence rise every
/// time: no per-client blocks or caches of fences.
pub async fn fences_rise_across_long_lived_clients(f: Factory) -> CaseResult {
    let managers = [
        manager(&f.open().await?, LONG)?,
        manager(&f.open().await?, LONG)?,
    ];
    let k = key("fence-turns");
    let mut last: Option<Fence> = None;
    for i in 0..20 {
        let g = managers[i % 2].lock(&k).await.map_err(err)?;
        if let Some(prev) = last {
            ensure!(
                g.fence() > prev,
                "round {i}: client {} got fence {} after {prev}",
                i % 2,
                g.fence()
            );
        }
        last = Some(g.fence());
        g.release().await.map_err(err)?;
    }
    Ok(Outcome::Passed)
}

/// Eight clients contend for one key over 400 hand-offs: every new holder's
/// fence exceeds the previous holder's (the order of critical sections is
/// the order of holds, so this is what a fenced resource sees).
pub async fn fences_rise_under_contention(f: Factory) -> CaseResult {
    let mut managers = Vec::new();
    for _ in 0..8 {
        managers.push(manager(&f.open().await?, LONG)?);
    }
    let c = contend(managers, key("fence-contention"), 1, 50).await?;
    ensure!(
        c.detector.entries() == 400,
        "expected 400 holds, saw {}",
        c.detector.entries()
    );
    ensure!(
        c.detector.overlaps() == 0,
        "{} overlapping critical sections",
        c.detector.overlaps()
    );
    ensure!(
        c.fence_errors == 0,
        "{} of 400 hand-offs gave the new holder a fence not above the previous one's (first: {})",
        c.fence_errors,
        c.first_fence_error.unwrap_or_default()
    );
    Ok(Outcome::Passed)
}

/// `raise_fence` is a max: a minimum below the current fence lowers nothing,
/// a lower minimum after a higher one undoes nothing, and later fences exceed
/// every minimum and every earlier fence.
pub async fn raise_fence_is_a_max(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let m = manager(&b, LONG)?;
    let k = key("raise-max");
    for _ in 0..3 {
        m.lock(&k)
            .await
            .map_err(err)?
            .release()
            .await
            .map_err(err)?;
    }
    // Each low minimum on its own: a later higher minimum must not hide it.
    let mut g = m.lock(&k).await.map_err(err)?;
    for low in ["1", "the current fence - 1", "the current fence"] {
        let current = g.fence();
        let minimum = match low {
            "1" => Fence(1),
            "the current fence - 1" => Fence(current.get().saturating_sub(1)),
            _ => current,
        };
        b.raise_fence(g.key(), minimum).await.map_err(err)?;
        g.release().await.map_err(err)?;
        g = m.lock(&k).await.map_err(err)?;
        ensure!(
            g.fence() > current,
            "fence {} after {current}: raising the minimum to {low} ({minimum}) lowered later fences",
            g.fence()
        );
    }
    let high = Fence(g.fence().get().saturating_add(1_000));
    b.raise_fence(g.key(), high).await.map_err(err)?;
    b.raise_fence(g.key(), Fence(high.get() - 500))
        .await
        .map_err(err)?;
    g.release().await.map_err(err)?;
    let g = m.lock(&k).await.map_err(err)?;
    ensure!(
        g.fence() > high,
        "fence {} after raising the minimum to {high} and then to a lower one",
        g.fence()
    );
    g.release().await.map_err(err)?;
    Ok(Outcome::Passed)
}

/// Fences rise across fair and plain acquisitions of one key, taken in turn.
pub async fn fences_rise_across_fair_and_plain(f: Factory) -> CaseResult {
    let m = manager(&f.open().await?, LONG)?;
    let k = key("fence-fair");
    let mut last: Option<Fence> = None;
    for i in 0..8 {
        let g = if i % 2 == 0 {
            let g = m
                .acquire(&k, LockOptions::new().fair())
                .await
                .map_err(err)?;
            g.ok_or("fair acquire returned no guard")?
        } else {
            m.lock(&k).await.map_err(err)?
        };
        if let Some(prev) = last {
            ensure!(
                g.fence() > prev,
                "round {i} ({}) got fence {} after {prev}",
                if i % 2 == 0 { "fair" } else { "plain" },
                g.fence()
            );
        }
        last = Some(g.fence());
        g.release().await.map_err(err)?;
    }
    Ok(Outcome::Passed)
}

/// Fences grow strictly from one acquisition to the next after release.
pub async fn fences_increase_across_release(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let m = manager(&b, Duration::from_secs(10))?;
    let k = key("fence-release");
    let mut last: Option<Fence> = None;
    for i in 0..10 {
        let g = m.lock(&k).await.map_err(err)?;
        if let Some(prev) = last {
            ensure!(
                g.fence() > prev,
                "fence {} after {prev} at round {i}",
                g.fence()
            );
        }
        last = Some(g.fence());
        g.release().await.map_err(err)?;
    }
    Ok(Outcome::Passed)
}

/// A fence after expiry exceeds the expired hold's fence.
pub async fn fences_increase_across_expiry(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let ttl = short_ttl(&b);
    let k = key("fence-expiry");
    let (_, first) = raw_acquire(&b, &k, ttl).await?;
    let m = manager(&f.open().await?, ttl)?;
    let g = m.lock_timeout(&k, ttl * 4).await.map_err(err)?;
    ensure!(
        g.fence() > first,
        "fence {} after expiry of fence {first}",
        g.fence()
    );
    Ok(Outcome::Passed)
}

/// Fences keep growing when a new client (a restarted process) takes over.
pub async fn fences_increase_across_clients(f: Factory) -> CaseResult {
    let k = key("fence-clients");
    let mut last: Option<Fence> = None;
    for i in 0..4 {
        let m = manager(&f.open().await?, Duration::from_secs(10))?;
        let g = m.lock(&k).await.map_err(err)?;
        if let Some(prev) = last {
            ensure!(
                g.fence() > prev,
                "client {i} got fence {} after {prev}",
                g.fence()
            );
        }
        last = Some(g.fence());
        g.release().await.map_err(err)?;
    }
    Ok(Outcome::Passed)
}

/// A resource that remembers fences refuses the expired holder's late write.
pub async fn fenced_resource_refuses_stale_holder(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let ttl = short_ttl(&b);
    let k = key("fenced");
    let resource = FencedResource::new();
    let (_, stale) = raw_acquire(&b, &k, ttl).await?;
    ensure!(
        resource.write(stale),
        "the first holder's write was refused"
    );
    let m = manager(&f.open().await?, ttl)?;
    let g = m.lock_timeout(&k, ttl * 4).await.map_err(err)?;
    ensure!(
        resource.write(g.fence()),
        "the new holder's write was refused"
    );
    ensure!(
        !resource.write(stale),
        "the stale holder's late write was accepted"
    );
    ensure!(resource.accepted() == 2, "expected 2 accepted writes");
    Ok(Outcome::Passed)
}

/// `raise_fence` makes every later fence of the key exceed the minimum, and
/// later fences keep rising from there.
pub async fn raise_fence_lifts_later_fences(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let m = manager(&b, Duration::from_secs(10))?;
    let k = key("raise");
    let g = m.lock(&k).await.map_err(err)?;
    let minimum = Fence(g.fence().get().saturating_add(1_000_000));
    b.raise_fence(g.key(), minimum).await.map_err(err)?;
    g.release().await.map_err(err)?;
    let other = manager(&f.open().await?, Duration::from_secs(10))?;
    let mut last = minimum;
    let inspect = b.inspector().is_some();
    for _ in 0..3 {
        let g = other.lock(&k).await.map_err(err)?;
        ensure!(
            g.fence() > last,
            "fence {} after {last} (the minimum was raised to {minimum})",
            g.fence()
        );
        last = g.fence();
        if inspect {
            // What inspect and list report is the hold's own fence, minimum
            // included.
            let info = b.inspect(g.key()).await.map_err(err)?;
            let reported = info.and_then(|i| i.fence);
            ensure!(
                reported.is_none_or(|r| r == g.fence()),
                "inspect reports fence {reported:?} for a hold of fence {}",
                g.fence()
            );
            let listed = b.list(&k).await.map_err(err)?;
            let reported = listed.iter().find(|i| i.key == k).and_then(|i| i.fence);
            ensure!(
                reported.is_none_or(|r| r == g.fence()),
                "list reports fence {reported:?} for a hold of fence {}",
                g.fence()
            );
        }
        g.release().await.map_err(err)?;
    }
    Ok(Outcome::Passed)
}

/// Raises that race — several clients at once, each with a minimum of its
/// own, the largest sent first — leave the largest: the next fence exceeds
/// every minimum. A raise that reads and then writes loses updates. The
/// race is run three times: one race leaves the largest by chance once in
/// twelve even where updates are lost.
pub async fn racing_raises_keep_the_largest(f: Factory) -> CaseResult {
    const RAISERS: u64 = 12;
    let b = f.open().await?;
    let m = manager(&b, LONG)?;
    let k = key("raise-race");
    let mut handles = Vec::new();
    for _ in 0..RAISERS {
        handles.push(f.open().await?);
    }
    for _ in 0..3 {
        let g = m.lock(&k).await.map_err(err)?;
        let top = g.fence().get().saturating_add(1_000_000);
        race_raises(&handles, g.key(), top).await?;
        g.release().await.map_err(err)?;
        let next = m.lock(&k).await.map_err(err)?;
        let fence = next.fence().get();
        next.release().await.map_err(err)?;
        ensure!(
            fence > top,
            "fence {fence} after {RAISERS} racing raises whose largest minimum was {top}"
        );
    }
    Ok(Outcome::Passed)
}

/// Each handle raises `key`'s fence at once, to `top` less 10,000 per place.
async fn race_raises(handles: &[Arc<dyn Backend>], key: &LockKey, top: u64) -> Result<(), String> {
    let start = Arc::new(tokio::sync::Barrier::new(handles.len()));
    let mut raises = Vec::new();
    for (i, h) in (0u64..).zip(handles.iter().cloned()) {
        let (lk, start) = (key.clone(), start.clone());
        let minimum = Fence(top - i * 10_000);
        raises.push(tokio::spawn(async move {
            start.wait().await;
            h.raise_fence(&lk, minimum).await
        }));
    }
    for r in raises {
        r.await.map_err(|e| e.to_string())?.map_err(err)?;
    }
    Ok(())
}
