//! Scheduled-job locks: `at_least` keeps a key blocked by the store's
//! clock after an early release, and `at_most` stops the holder.

use moltlock_core::{LockOptions, LostReason};

use super::common::*;

/// A job that ends early leaves its key blocked until `at_least` after its
/// acquire request, and free soon after: the release hands the key to a
/// throwaway hold of what is left (rounded up), which nothing renews (a store
/// that kept the old expiry, or hung the throwaway on a lease something
/// else keeps alive, blocks the next run too long).
pub async fn job_at_least_blocks_after_an_early_release(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let ttl = short_ttl(&b);
    let least = ttl * 2;
    let m = manager(&b, ttl)?;
    // A second hold of the same TTL keeps its lease (if any) alive.
    let k = key("job-at-least");
    let neighbour = m.lock(format!("{k}/neighbour")).await.map_err(err)?;
    let asked = Instant::now();
    let opts = LockOptions::new().at_least(least);
    let g = m.acquire(&k, opts).await.map_err(err)?;
    let g = g.ok_or("no guard for a waiting acquire")?;
    // The manager counts the at-least time from its acquire request, sent
    // by now.
    let granted = Instant::now();
    let other = f.open().await?;
    tokio::time::sleep_until(asked + least.mul_f64(0.9)).await;
    // What the release may leave: the rest of the at-least time, counted
    // from the release's send (the store counts it from its arrival, or,
    // observing expiry, from when a client first saw the throwaway).
    let may_leave = (granted + least).saturating_duration_since(Instant::now()) + REPORT_SLACK;
    g.release().await.map_err(err)?;
    ends_within(&other, &k, ttl, may_leave, least).await?;
    let mut freed = None;
    let slack = b.limits().min_ttl + EXPIRY_SLACK;
    while Instant::now() < asked + least + slack {
        if is_free(&other, &k, ttl).await? {
            freed = Some(Instant::now());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    neighbour.release().await.map_err(err)?;
    let freed = freed.ok_or_else(|| {
        format!("{SLOW}: the key was still blocked {slack:?} after its at-least time of {least:?}")
    })?;
    ensure!(
        freed >= asked + least,
        "the key was free {:?} after the acquire, before its at-least time of {least:?}",
        freed - asked
    );
    Ok(Outcome::Passed)
}

/// A job released with a few milliseconds of its at-least time left still
/// leaves its key blocked until that time: the throwaway hold lasts a
/// short while past it rather than not at all. (A probe that comes only
/// after the at-least time and finds the key free judges nothing: the
/// attempt is inconclusive.)
pub async fn job_at_least_blocks_to_its_last_millisecond(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let ttl = short_ttl(&b);
    let least = ttl * 2;
    let m = manager(&b, ttl)?;
    let k = key("job-at-least-last");
    let other = f.open().await?;
    let asked = Instant::now();
    let g = m.acquire(&k, LockOptions::new().at_least(least)).await;
    let g = g.map_err(err)?.ok_or("no guard for a waiting acquire")?;
    let end = asked + least;
    tokio::time::sleep_until(end - Duration::from_millis(5)).await;
    g.release().await.map_err(err)?;
    let free = is_free(&other, &k, ttl).await?;
    let replied = Instant::now();
    if free && replied >= end {
        return Err(format!(
            "{INCONCLUSIVE}: the release and the probe took past the at-least time"
        ));
    }
    ensure!(
        !free,
        "the key was free {:?} before its at-least time of {least:?} ran out, released \
         with 5 ms of it left",
        end - replied
    );
    Ok(Outcome::Passed)
}

/// How far past the at-least time a store's own report of a throwaway
/// hold's end may be (its rounding and clock rate).
const REPORT_SLACK: Duration = Duration::from_millis(150);

/// Where the store reports how long the key stays held (a probe that finds
/// it held), it is held for `may_leave` at most: a hold that kept the
/// job's own expiry, or a lease kept alive by another hold, reports more.
/// The store's own report: a slow store or machine only makes it smaller.
async fn ends_within(
    b: &Arc<dyn Backend>,
    k: &str,
    ttl: Duration,
    may_leave: Duration,
    least: Duration,
) -> Result<(), String> {
    let Some(held) = holder_of(b, k, ttl).await? else {
        return Ok(());
    };
    if let Some(left) = held.expires_in {
        ensure!(
            left <= may_leave,
            "after an early release the store reports the key held {left:?} more, past what \
             was left of its at-least time of {least:?} ({may_leave:?} with slack): the \
             throwaway hold did not end with what was left"
        );
    }
    Ok(())
}

/// A job past its `at_most` time is stopped: `lost()` fires with
/// `AtMost` by then, and the key is free for the next run right after.
pub async fn job_at_most_stops_the_holder(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let ttl = short_ttl(&b) * 3;
    let most = short_ttl(&b) * 2;
    let m = manager(&b, ttl)?;
    let k = key("job-at-most");
    let asked = Instant::now();
    let opts = LockOptions::new().at_most(most);
    let g = m.acquire(&k, opts).await.map_err(err)?;
    let g = g.ok_or("no guard for a waiting acquire")?;
    let reason = tokio::time::timeout(most + ttl, g.lost()).await;
    let lost_at = Instant::now();
    ensure!(reason.is_ok(), "lost() did not fire after the at-most time");
    ensure!(
        reason == Ok(LostReason::AtMost),
        "lost() fired with {reason:?}, not AtMost"
    );
    ensure!(
        lost_at <= asked + most + Duration::from_millis(100),
        "the holder ran {:?}, past its at-most time of {most:?}",
        lost_at - asked
    );
    ensure!(
        lost_at >= asked + most.mul_f64(0.9),
        "the holder was stopped after {:?}, well before its at-most time of {most:?}",
        lost_at - asked
    );
    ensure!(g.check().is_err(), "check() passes past the at-most time");
    let other = f.open().await?;
    ensure!(
        becomes_free(&other, &k, EXPIRY_SLACK).await?,
        "the key stayed held after the at-most time"
    );
    Ok(Outcome::Passed)
}
