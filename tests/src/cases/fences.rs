//! Fences: long-lived clients, contention, raising minimums, fair and plain.

use std::time::Duration;

use moltlock_core::{BackendExt, Fence, LockOptions};

use super::{contend, err, key, manager};
use crate::{CaseResult, Factory, Outcome};

/// A long TTL for holds that must not expire during a case.
const LONG: Duration = Duration::from_secs(10);

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
