//! Revocation: removing the current holder (`revoke`) and asking it to
//! let go (`request_release`). Both aim at the one hold the store names,
//! never at the holder after it.

use moltlock_core::{LockGuard, LockKey, LostReason};

use super::common::*;

/// A revoked holder is told at its next renewal (the store refuses it),
/// the next holder's fence is above it, and the victim's token removes
/// nothing of the next holder.
pub async fn revoke_stops_the_holder_and_spares_the_next(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let ttl = short_ttl(&b);
    let m = manager(&b, ttl)?;
    let admin_store = f.open().await?;
    let admin = manager(&admin_store, ttl)?;
    let k = key("revoke");
    let victim = m.lock(&k).await.map_err(err)?;
    let gone = admin.revoke(&k).await.map_err(err)?;
    let gone = gone.ok_or("revoke found no holder of a held key")?;
    ensure!(
        &gone.holder == victim.token(),
        "revoke removed {:?}, not the holder",
        gone.holder
    );
    let reason = tokio::time::timeout(ttl, victim.lost()).await;
    ensure!(
        reason == Ok(LostReason::Refused),
        "the revoked holder's lost() gave {reason:?} within a TTL, not Refused"
    );
    let next = admin.try_lock(&k).await.map_err(err)?;
    let next = next.ok_or("the key stayed held after the revoke")?;
    ensure!(
        next.fence() > victim.fence(),
        "the next holder's fence {} is not above the revoked one's {}",
        next.fence(),
        victim.fence()
    );
    let lock_key = LockKey::new(k.as_str()).map_err(err)?;
    let removed = b.delete(&lock_key, victim.token()).await.map_err(err)?;
    ensure!(!removed, "the revoked holder's token removed the next hold");
    ensure!(next.is_held(), "the next hold was lost");
    next.release().await.map_err(err)?;
    ensure!(
        admin.revoke(&k).await.map_err(err)?.is_none(),
        "revoke of a free key found a holder"
    );
    Ok(Outcome::Passed)
}

/// A release request reaches the holder it names within a TTL and takes
/// nothing away; the next holder does not hear the request meant for the
/// one before it, and hears its own.
pub async fn release_request_reaches_only_its_holder(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let ttl = short_ttl(&b);
    let m = manager(&b, ttl)?;
    let other_store = f.open().await?;
    let other = manager(&other_store, ttl)?;
    let k = key("release-request");
    let none = other.request_release(&k).await.map_err(err)?;
    ensure!(none.is_none(), "a request on a free key found {none:?}");
    let first = m.lock(&k).await.map_err(err)?;
    ensure!(!first.is_release_requested(), "asked before anyone asked");
    heard(&other, &k, &first, ttl).await?;
    ensure!(first.is_held(), "a release request took the hold away");
    first.release().await.map_err(err)?;
    let second = other.lock(&k).await.map_err(err)?;
    ensure!(
        !second.is_release_requested(),
        "the next holder was asked at once"
    );
    tokio::time::sleep(ttl).await;
    ensure!(
        !second.is_release_requested(),
        "a request meant for the earlier holder reached the next one"
    );
    heard(&m, &k, &second, ttl).await?;
    second.release().await.map_err(err)?;
    Ok(Outcome::Passed)
}

/// `asker` asks the holder of `k`; `holder` must be the one named and hear
/// it within a TTL.
async fn heard(
    asker: &LockManager,
    k: &str,
    holder: &LockGuard,
    ttl: Duration,
) -> Result<(), String> {
    let asked = asker.request_release(k).await.map_err(err)?;
    let Some(asked) = asked else {
        let what = "a request on a held key found no holder";
        if holder.is_held() {
            return Err(what.into());
        }
        return Err(format!("{SLOW}: {what} (its hold ran out meanwhile)"));
    };
    ensure!(
        &asked.holder == holder.token(),
        "the request named {:?}, not the holder",
        asked.holder
    );
    let within = ttl + EXPIRY_SLACK;
    ensure!(
        tokio::time::timeout(within, holder.release_requested())
            .await
            .is_ok(),
        "the holder did not hear the request within {within:?}"
    );
    ensure!(holder.is_release_requested(), "heard, yet not asked");
    Ok(())
}
