//! Lost signals: a guard learns of a loss before the store can grant the key
//! to anyone else.

use super::common::*;

/// Deleting the key behind the holder's back fires `lost()` within about one
/// renewal interval (TTL/3).
pub async fn lost_fires_when_key_deleted_behind_holder(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let ttl = short_ttl(&b) * 3;
    let m = manager(&b, ttl)?;
    let k = key("lost-deleted");
    let g = m.lock(&k).await.map_err(err)?;
    let other = f.open().await?;
    ensure!(
        other.delete(g.key(), g.token()).await.map_err(err)?,
        "the second handle could not delete the hold"
    );
    let deleted_at = Instant::now();
    let bound = ttl / 3 + ttl / 6;
    let reason = tokio::time::timeout(bound, g.lost()).await;
    ensure!(
        reason.is_ok(),
        "lost() did not fire within {bound:?} of the deletion"
    );
    ensure!(!g.is_held(), "is_held() is true after lost()");
    ensure!(g.check().is_err(), "check() passes after lost()");
    ensure!(
        deleted_at.elapsed() < ttl,
        "lost() fired only after a whole TTL"
    );
    Ok(Outcome::Passed)
}

/// When renewals stop reaching the store, `lost()` fires before the store
/// could hand the key to anyone else, with the manager's default drift
/// allowance (2 %) and a TTL that is not a whole number of seconds.
pub async fn lost_fires_before_store_expiry_when_cut_off(f: Factory) -> CaseResult {
    let store = f.open().await?;
    let ttl = short_ttl(&store) * 2 + Duration::from_millis(250);
    let cut = Partition::new(store);
    let m = LockManager::builder(cut.clone())
        .ttl(ttl)
        .build()
        .map_err(err)?;
    let k = key("lost-cut");
    let other = f.open().await?;
    // The earliest expiry the store can give is the request's start + TTL,
    // and the request starts after `asked_at`: warm the connection first,
    // so a slow connect (a TLS handshake on a busy machine) does not count
    // as time the store gave.
    let warm = m.lock(format!("{k}/warm")).await.map_err(err)?;
    warm.release().await.map_err(err)?;
    let asked_at = Instant::now();
    let g = m.lock(&k).await.map_err(err)?;
    cut.cut();
    // A store whose holds hang on a lease of whole seconds may promise more
    // than the TTL; `lost()` must come before what it promised.
    let promised = (asked_at + ttl).max(cut.earliest_expiry(ttl, asked_at));
    // A timer of our own for the guard's deadline: if it too wakes well past
    // it, the runtime stalled and a late lost() proves nothing.
    let deadline = Instant::now() + g.valid_for().unwrap_or_default();
    let own_timer = tokio::spawn(async move {
        tokio::time::sleep_until(deadline).await;
        Instant::now()
    });
    let reason = tokio::time::timeout(ttl * 2, g.lost()).await;
    let lost_at = Instant::now();
    let own_woke = own_timer.await.map_err(|e| e.to_string())?;
    let margin = promised.saturating_duration_since(deadline);
    if lost_at >= promised && own_woke >= deadline + margin / 2 {
        return Err(format!(
            "{INCONCLUSIVE}: a timer for the guard's deadline woke {:?} late",
            own_woke - deadline
        ));
    }
    let still_held = !is_free(&other, &k, ttl).await?;
    let probed_at = Instant::now();
    ensure!(reason.is_ok(), "lost() never fired while cut off");
    ensure!(
        lost_at < promised,
        "lost() fired {:?} after the acquire was sent, past the TTL {ttl:?} and the store's \
         promise ({:?})",
        lost_at - asked_at,
        promised - asked_at
    );
    if !still_held && probed_at >= promised {
        return Err(format!(
            "{INCONCLUSIVE}: the probe after lost() was answered only {:?} after the acquire \
             was sent (TTL {ttl:?})",
            probed_at - asked_at
        ));
    }
    ensure!(
        still_held,
        "the store had already freed the key when lost() fired ({:?} after the acquire was \
         sent, TTL {ttl:?})",
        lost_at - asked_at
    );
    ensure!(!g.is_held(), "is_held() is true after lost()");
    cut.heal();
    drop(g);
    ensure!(
        becomes_free(&other, &k, ttl * 2).await?,
        "the key never became free after the cut-off holder gave up"
    );
    Ok(Outcome::Passed)
}

/// The manager's lost callback runs once for a lost hold, not for releases.
pub async fn lost_callback_is_called(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let ttl = short_ttl(&b) * 3;
    let calls = Arc::new(AtomicU64::new(0));
    let seen = calls.clone();
    let m = LockManager::builder(b.clone())
        .ttl(ttl)
        .on_lost(move |_| {
            seen.fetch_add(1, Ordering::SeqCst);
        })
        .build()
        .map_err(err)?;
    let released = m.lock(key("callback-released")).await.map_err(err)?;
    released.release().await.map_err(err)?;
    let g = m.lock(key("callback-lost")).await.map_err(err)?;
    let other = f.open().await?;
    other.delete(g.key(), g.token()).await.map_err(err)?;
    let until = Instant::now() + ttl;
    while calls.load(Ordering::SeqCst) == 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(ttl / 3).await;
    let n = calls.load(Ordering::SeqCst);
    ensure!(n == 1, "the lost callback ran {n} times, not once");
    Ok(Outcome::Passed)
}
