//! Expiry: boundary races, TTL precision, shared leases, renewal semantics.

use std::sync::Arc;
use std::time::Duration;

use moltlock_core::{Backend, CasOutcome, Token};
use tokio::sync::Barrier;
use tokio::time::Instant;

use super::common::*;
use crate::{CaseResult, Factory, Outcome, INCONCLUSIVE};

/// How many clients race for an expired key.
const RACERS: usize = 6;

/// Many clients race for a key whose holder's TTL just ran out: exactly one
/// wins, with a higher fence; the expired holder can then neither renew nor
/// delete, and the winner renews (a takeover replaces the token). Two rounds,
/// so the winner's own hold expires and is raced for too.
pub async fn expired_key_race_has_one_winner(f: Factory) -> CaseResult {
    let mut clients = Vec::new();
    for _ in 0..RACERS {
        clients.push(f.open().await?);
    }
    let ttl = short_ttl(&clients[0]);
    let k = key("expired-race");
    let mut holder = 0usize;
    let mut held = timed_acquire(&clients[holder], &k, ttl).await?;
    for round in 0..2 {
        tokio::time::sleep_until(held.expiry).await;
        // Liveness only: on a loaded machine etcd's first revoke of an
        // expired lease may not land, and its lessor tries again 3 s later.
        let give_up = held.surely_gone() + Duration::from_secs(5);
        let (winner, token, fence) = loop {
            let winners = race(&clients, &k, ttl).await?;
            if winners.len() > 1 {
                return Err(format!(
                    "round {round}: {} clients acquired the expired key at once",
                    winners.len()
                ));
            }
            if let Some(w) = winners.into_iter().next() {
                break w;
            }
            if Instant::now() > give_up {
                return Err(format!(
                    "round {round}: nobody acquired the key long after its TTL ran out"
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        ensure!(
            fence > held.fence,
            "round {round}: the takeover got fence {fence}, not above the expired hold's {}",
            held.fence
        );
        let old = &clients[holder];
        ensure!(
            !renew(old, &k, &held.token, ttl).await?,
            "round {round}: the expired holder renewed a key another client took over"
        );
        let lk = k.parse().map_err(err)?;
        ensure!(
            !old.delete(&lk, &held.token).await.map_err(err)?,
            "round {round}: the expired holder deleted the new holder's key"
        );
        let sent = Instant::now();
        ensure!(
            renew(&clients[winner], &k, &token, ttl).await?,
            "round {round}: the winner of the race could not renew its hold"
        );
        let third = &clients[(winner + 1) % RACERS];
        ensure!(
            !is_free(third, &k, ttl).await?,
            "round {round}: the key was free right after the winner renewed it"
        );
        holder = winner;
        held = Timed {
            token,
            fence,
            ttl,
            sent,
            replied: Instant::now(),
            expiry: clients[winner].earliest_expiry(ttl, sent),
        };
    }
    Ok(Outcome::Passed)
}

/// Every client sends one `cas(None)` at the same instant; returns the
/// winners with their tokens and fences.
async fn race(
    clients: &[Arc<dyn Backend>],
    k: &str,
    ttl: Duration,
) -> Result<Vec<(usize, Token, moltlock_core::Fence)>, String> {
    let barrier = Arc::new(Barrier::new(clients.len()));
    let mut tasks = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        let (c, barrier) = (c.clone(), barrier.clone());
        let lk: moltlock_core::LockKey = k.parse().map_err(err)?;
        tasks.push(tokio::spawn(async move {
            let token = Token::random();
            barrier.wait().await;
            let out = c.cas(&lk, None, &token, ttl).await.map_err(err)?;
            Ok::<_, String>(match out {
                CasOutcome::Acquired { fence } => Some((i, token, fence)),
                CasOutcome::Held(_) => None,
            })
        }));
    }
    let mut winners = Vec::new();
    for t in tasks {
        if let Some(w) = t.await.map_err(|e| e.to_string())?? {
            winners.push(w);
        }
    }
    Ok(winners)
}

/// TTLs that are not whole seconds are honoured to the millisecond: each
/// hold is still held just before the deadline a manager with the default
/// drift (2 %) trusts it to, and gone soon after the latest instant its
/// TTL allows. Stores that truncate, round or coarsen time fail.
pub async fn fractional_ttls_are_honoured(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let probe = f.open().await?;
    let base = short_ttl(&b);
    let ttls = [
        base + Duration::from_millis(100),
        base + Duration::from_millis(250),
        base + Duration::from_millis(500),
    ];
    let mut checks = Vec::new();
    for ttl in ttls {
        let (b, probe) = (b.clone(), probe.clone());
        // Made here, on the case's own thread, for the factory's cleanup.
        let k = key("fractional");
        checks.push(tokio::spawn(async move {
            let t = timed_acquire(&b, &k, ttl).await?;
            let what = format!("TTL {ttl:?}");
            expect_held_until_deadline(&probe, &k, &t, &what).await?;
            expect_gone_after_expiry(&probe, &k, &t, &what).await
        }));
    }
    let mut first_err = None;
    for c in checks {
        if let Err(e) = c.await.map_err(|e| e.to_string())? {
            // A definite failure wins over an inconclusive one.
            if first_err
                .as_ref()
                .is_none_or(|f: &String| f.starts_with(INCONCLUSIVE))
            {
                first_err = Some(e);
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(Outcome::Passed),
    }
}

/// No hold ends before the expiry its backend promised (its
/// `earliest_expiry`, from the send of its request): a probe polls the key
/// from shortly before that instant, and the first probe that finds it
/// free must be answered after it. Polling only ever finds a key free late,
/// never early, so a slow machine cannot fail this. A store that ends
/// holds early by more than about one round trip (the hold's request on
/// its way in, the probe's reply on its way back; under a millisecond on
/// a local store) fails within a few rounds, as SQLite's statements did
/// when a float read of its clock came out a millisecond low and a key
/// was freed in the millisecond it expired.
pub async fn no_hold_ends_before_its_promised_expiry(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let probe = f.open().await?;
    let ttl = b.limits().min_ttl.max(Duration::from_millis(50));
    let rounds = if ttl <= Duration::from_millis(100) {
        8
    } else {
        2
    };
    for round in 0..rounds {
        let k = key(&format!("ends-early-{round}"));
        let t = timed_acquire(&b, &k, ttl).await?;
        first_free_after_expiry(&probe, &k, &t).await?;
    }
    Ok(Outcome::Passed)
}

/// Polls `key` (held as `t`) from 10 ms before its promised expiry until a
/// probe takes it: that probe must be answered after the expiry. Until
/// 20 ms past the expiry each probe follows the last one's reply with no
/// pause, then 2 ms after it.
async fn first_free_after_expiry(
    probe: &Arc<dyn Backend>,
    key: &str,
    t: &Timed,
) -> Result<(), String> {
    let k = key.parse().map_err(err)?;
    let give_up = t.surely_gone() + Duration::from_secs(5);
    tokio::time::sleep_until(t.expiry - Duration::from_millis(10)).await;
    loop {
        let token = Token::random();
        let out = probe.cas(&k, None, &token, t.ttl).await.map_err(err)?;
        let replied = Instant::now();
        if matches!(out, CasOutcome::Acquired { .. }) {
            probe.delete(&k, &token).await.map_err(err)?;
            ensure!(
                replied >= t.expiry,
                "a hold of TTL {:?} was free {:?} before the earliest expiry its backend \
                 promised ({:?} after its request was sent)",
                t.ttl,
                t.expiry - replied,
                replied - t.sent
            );
            return Ok(());
        }
        ensure!(
            replied < give_up,
            "{INCONCLUSIVE}: the hold was still held {:?} after its promised expiry",
            replied - t.expiry
        );
        match replied < t.expiry + Duration::from_millis(20) {
            true => tokio::task::yield_now().await,
            false => tokio::time::sleep(Duration::from_millis(2)).await,
        }
    }
}

/// A client that took one key half a TTL earlier takes another: the second
/// hold stays held until the deadline its `earliest_expiry` gives (on a
/// store whose holds hang on one lease, the lease's bound, not the request's
/// time plus the TTL), and so does the first.
pub async fn shared_lease_reports_earliest_expiry(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let probe = f.open().await?;
    let ttl = short_ttl(&b);
    let (k1, k2) = (key("lease-first"), key("lease-second"));
    let first = timed_acquire(&b, &k1, ttl).await?;
    tokio::time::sleep_until(first.sent + ttl / 2).await;
    let second = timed_acquire(&b, &k2, ttl).await?;
    let (a, c) = tokio::join!(
        expect_held_until_deadline(&probe, &k1, &first, "the first hold"),
        expect_held_until_deadline(&probe, &k2, &second, "the hold taken half a TTL later"),
    );
    a?;
    c?;
    Ok(Outcome::Passed)
}

/// Renewing after the TTL ran out is refused (no silent re-acquisition, no
/// old fence), and leaves the key free.
pub async fn renewal_after_expiry_is_refused(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let ttl = short_ttl(&b);
    let k = key("renew-expired");
    let t = timed_acquire(&b, &k, ttl).await?;
    tokio::time::sleep_until(t.surely_gone()).await;
    let lk = k.parse().map_err(err)?;
    let out = b
        .cas(&lk, Some(&t.token), &t.token, ttl)
        .await
        .map_err(err)?;
    ensure!(
        matches!(out, CasOutcome::Held(_)),
        "renewing a hold {:?} after its TTL ran out succeeded: {out:?}",
        Instant::now() - t.replied
    );
    let other = f.open().await?;
    ensure!(
        is_free(&other, &k, ttl).await?,
        "a refused renewal of an expired hold left the key held"
    );
    Ok(Outcome::Passed)
}

/// Deleting your own expired hold reports `false`: delete never reports
/// what it did not do.
pub async fn delete_of_expired_hold_reports_false(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let ttl = short_ttl(&b);
    let k = key("delete-expired");
    let t = timed_acquire(&b, &k, ttl).await?;
    tokio::time::sleep_until(t.surely_gone()).await;
    let lk = k.parse().map_err(err)?;
    ensure!(
        !b.delete(&lk, &t.token).await.map_err(err)?,
        "deleting an expired hold reported success"
    );
    let (k2, t2) = (key("delete-live"), Token::random());
    let lk2 = k2.parse().map_err(err)?;
    ensure!(
        matches!(
            b.cas(&lk2, None, &t2, ttl).await.map_err(err)?,
            CasOutcome::Acquired { .. }
        ),
        "a free key could not be acquired"
    );
    ensure!(
        b.delete(&lk2, &t2).await.map_err(err)?,
        "deleting a live hold of one's own reported failure"
    );
    ensure!(
        !b.delete(&lk2, &t2).await.map_err(err)?,
        "deleting a hold twice reported success twice"
    );
    Ok(Outcome::Passed)
}

/// Renewal sets the expiry to now + TTL, never adds to the old expiry:
/// after renewing every TTL/3 for two TTLs, a holder that stops renewing
/// loses the key within about one TTL of its last renewal.
pub async fn renewal_sets_expiry_from_now(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let ttl = short_ttl(&b);
    let k = key("renew-from-now");
    let mut t = timed_acquire(&b, &k, ttl).await?;
    for i in 0..6 {
        tokio::time::sleep_until(t.sent + ttl / 3).await;
        let sent = Instant::now();
        if sent >= t.trusted() {
            return Err(format!(
                "{INCONCLUSIVE}: renewal {i} was sent only at the end of the hold's validity"
            ));
        }
        ensure!(
            renew(&b, &k, &t.token, ttl).await?,
            "renewal {i} of a live hold was refused"
        );
        t.renewed(&b, sent);
    }
    let other = f.open().await?;
    expect_gone_after_expiry(&other, &k, &t, "after six renewals").await?;
    Ok(Outcome::Passed)
}

/// A hold nobody renews is still held before its TTL and free after it.
pub async fn key_expires_after_ttl(f: Factory) -> CaseResult {
    let holder = f.open().await?;
    let other = f.open().await?;
    let ttl = short_ttl(&holder);
    let k = key("expiry");
    let t = timed_acquire(&holder, &k, ttl).await?;
    let probes = [
        ("right after acquisition", t.replied),
        ("at half its TTL", t.sent + ttl / 2),
    ];
    for (what, at) in probes {
        tokio::time::sleep_until(at).await;
        if is_free(&other, &k, ttl).await? {
            ensure!(Instant::now() >= t.expiry, "the key was free {what}");
            return Err(format!("{INCONCLUSIVE}: the probe {what} ran past the TTL"));
        }
    }
    tokio::time::sleep_until(t.expiry).await;
    ensure!(
        becomes_free(&other, &k, ttl + EXPIRY_SLACK * 2).await?,
        "the key was still held long after its TTL"
    );
    Ok(Outcome::Passed)
}

/// A waiting `lock()` gets the key once an unrenewed hold expires.
pub async fn waiter_acquires_after_holder_stops_renewing(f: Factory) -> CaseResult {
    let holder = f.open().await?;
    let ttl = short_ttl(&holder);
    let k = key("waiter-expiry");
    let started = Instant::now();
    raw_acquire(&holder, &k, ttl).await?;
    let m = manager(&f.open().await?, ttl)?;
    let g = m.lock_timeout(&k, ttl * 4).await.map_err(err)?;
    let waited = started.elapsed();
    ensure!(
        waited >= ttl.mul_f64(0.9),
        "acquired after {waited:?}, before the TTL {ttl:?}"
    );
    ensure!(g.is_held(), "the waiter's guard must be held");
    // The takeover must have made the waiter the owner: its renewals over
    // the next TTL keep it held.
    let probe = f.open().await?;
    tokio::time::sleep(ttl).await;
    ensure!(
        g.is_held(),
        "the waiter lost the key it took over within one TTL (its renewals were refused)"
    );
    ensure!(
        !is_free(&probe, &k, ttl).await?,
        "the key taken over from an expired holder was free a TTL later"
    );
    Ok(Outcome::Passed)
}

/// A guard that lives for several TTLs keeps its key all along.
pub async fn renewal_keeps_lock_past_several_ttls(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let ttl = short_ttl(&b);
    let m = manager(&b, ttl)?;
    let k = key("renewal");
    let g = m.lock(&k).await.map_err(err)?;
    let other = manager(&f.open().await?, ttl)?;
    let until = Instant::now() + ttl * 3;
    while Instant::now() < until {
        ensure!(g.is_held(), "the guard stopped being held while renewed");
        let stolen = other.try_lock(&k).await.map_err(err)?;
        ensure!(stolen.is_none(), "another client acquired a renewed key");
        tokio::time::sleep(ttl / 4).await;
    }
    g.release().await.map_err(err)?;
    Ok(Outcome::Passed)
}

/// 20 holds of one manager all stay held across three TTLs.
pub async fn batch_renewal_keeps_many_locks(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let ttl = short_ttl(&b);
    let m = manager(&b, ttl)?;
    let base = key("batch");
    let mut guards = Vec::new();
    for i in 0..20 {
        guards.push(m.lock(format!("{base}/{i}")).await.map_err(err)?);
    }
    tokio::time::sleep(ttl * 3).await;
    let other = f.open().await?;
    for (i, g) in guards.iter().enumerate() {
        ensure!(g.is_held(), "hold {i} of 20 was lost");
        ensure!(
            !is_free(&other, &format!("{base}/{i}"), ttl).await?,
            "key {i} of 20 expired"
        );
    }
    ensure!(
        m.held_count() == 20,
        "the manager renews {} holds, not 20",
        m.held_count()
    );
    Ok(Outcome::Passed)
}
