//! Ownership: hand-over, exact tokens and keys, holder reports, duplicate
//! delivery and per-item batch renewal.

use std::time::Duration;

use moltlock_core::{BackendExt, CasOutcome, Error, LockManager, RenewItem, RetryPolicy, Token};
use tokio::time::Instant;

use super::common::*;
use crate::{CaseResult, Duplicating, Factory, Outcome};

/// A long TTL for holds that must not expire during a case.
const LONG: Duration = Duration::from_secs(10);

/// `cas(Some(a), b)` hands the key to `b` with a fresh fence above `a`'s;
/// `a` can then neither renew nor delete, and `b` can do both.
pub async fn hand_over_gives_a_fresh_fence(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let k = key("hand-over");
    let (a, fa) = raw_acquire(&b, &k, LONG).await?;
    let lk = k.parse().map_err(err)?;
    let next = Token::random();
    let fb = match b.cas(&lk, Some(&a), &next, LONG).await.map_err(err)? {
        CasOutcome::Acquired { fence } => fence,
        CasOutcome::Held(h) => return Err(format!("the holder could not hand over: {h:?}")),
    };
    ensure!(
        fb > fa,
        "the hand-over kept fence {fb}, not above the old holder's {fa}"
    );
    ensure!(
        !renew(&b, &k, &a, LONG).await?,
        "the old holder renewed after handing over"
    );
    ensure!(
        !b.delete(&lk, &a).await.map_err(err)?,
        "the old holder deleted after handing over"
    );
    ensure!(
        renew(&b, &k, &next, LONG).await?,
        "the new holder could not renew"
    );
    let other = f.open().await?;
    ensure!(
        !is_free(&other, &k, LONG).await?,
        "the key was free after the hand-over"
    );
    ensure!(
        b.delete(&lk, &next).await.map_err(err)?,
        "the new holder could not delete"
    );
    Ok(Outcome::Passed)
}

/// Tokens that share a long prefix with the holder's, differ only in case,
/// or extend it, change nothing.
pub async fn tokens_are_compared_exactly(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let k = key("token-exact");
    let (owner, _) = raw_acquire(&b, &k, LONG).await?;
    let t = owner.as_str();
    let mut last_changed: String = t[..t.len() - 1].to_owned();
    last_changed.push(if t.ends_with('0') { '1' } else { '0' });
    let lookalikes = [
        last_changed,
        t.to_uppercase(),
        format!("{t} "),
        format!("{t}0"),
        t[..t.len() - 1].to_owned(),
        t[..8].to_owned(),
    ];
    let lk = k.parse().map_err(err)?;
    for l in lookalikes {
        let fake = Token::from_stored(l.clone());
        ensure!(
            !b.delete(&lk, &fake).await.map_err(err)?,
            "the token {l:?} deleted the hold of {t:?}"
        );
        ensure!(
            !renew(&b, &k, &fake, LONG).await?,
            "the token {l:?} renewed the hold of {t:?}"
        );
        let out = b
            .cas(&lk, Some(&fake), &Token::random(), LONG)
            .await
            .map_err(err)?;
        ensure!(
            matches!(out, CasOutcome::Held(_)),
            "the token {l:?} handed over the hold of {t:?}"
        );
    }
    let out = b.cas(&lk, Some(&owner), &owner, LONG).await.map_err(err)?;
    ensure!(
        matches!(out, CasOutcome::Acquired { .. }),
        "the owner lost its hold to a look-alike token: {out:?}"
    );
    ensure!(
        b.delete(&lk, &owner).await.map_err(err)?,
        "the owner could not delete after the look-alikes"
    );
    Ok(Outcome::Passed)
}

/// Keys of the maximum length that differ only in their last byte, keys
/// that differ only in case, in an accent or a trailing space, and keys that
/// are prefixes of each other are distinct locks. A backend may refuse a
/// variant its store cannot tell apart with [`Error::InvalidKey`] (a
/// documented limit), but never treat two of them as one lock.
pub async fn keys_are_distinct_exactly(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let limit = b.limits().max_key_len;
    let base = key("key-exact");
    let mut longest = base.clone();
    while longest.len() < limit - 1 {
        longest.push('x');
    }
    let groups: Vec<Vec<String>> = vec![
        vec![format!("{longest}a"), format!("{longest}b")],
        vec![format!("{base}/Case"), format!("{base}/case")],
        vec![format!("{base}/caf\u{e9}"), format!("{base}/cafe")],
        vec![format!("{base}/pad"), format!("{base}/pad ")],
        vec![
            format!("{base}/p"),
            format!("{base}/p/q"),
            format!("{base}/pq"),
        ],
    ];
    for group in groups {
        let mut held = Vec::new();
        for (i, k) in group.iter().enumerate() {
            if k.len() > limit {
                continue;
            }
            let lk = k.parse().map_err(err)?;
            let token = Token::random();
            match b.cas(&lk, None, &token, LONG).await {
                Ok(CasOutcome::Acquired { .. }) => held.push((lk, token)),
                Ok(CasOutcome::Held(_)) => {
                    return Err(format!(
                        "{k:?} was held already: the store confuses it with one of {:?}",
                        &group[..i]
                    ))
                }
                // A key the store cannot tell apart may be refused with a
                // clear error (contract point 8), never merged silently.
                Err(Error::InvalidKey { .. }) if i > 0 => {}
                Err(e) => return Err(err(e)),
            }
        }
        for (lk, token) in held {
            ensure!(
                b.delete(&lk, &token).await.map_err(err)?,
                "the holder of {:?} could not delete it (another key's hold replaced it)",
                lk.as_str()
            );
        }
    }
    Ok(Outcome::Passed)
}

/// A refused `cas` that names a holder names the real one, never the caller
/// (the manager takes a reply naming its own token for a request that
/// landed twice).
pub async fn held_reply_names_the_real_holder(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let other = f.open().await?;
    let k = key("held-reply");
    let (owner, _) = raw_acquire(&b, &k, LONG).await?;
    let lk = k.parse().map_err(err)?;
    let me = Token::random();
    let attempts = [
        ("a fresh acquisition", None),
        ("a renewal by a stranger", Some(me.clone())),
    ];
    for (what, expected) in attempts {
        match other
            .cas(&lk, expected.as_ref(), &me, LONG)
            .await
            .map_err(err)?
        {
            CasOutcome::Acquired { .. } => return Err(format!("{what} of a held key succeeded")),
            CasOutcome::Held(h) => {
                if let Some(holder) = &h.holder {
                    ensure!(
                        holder == &owner,
                        "{what} was refused naming the holder {holder:?}, not the real one {owner:?}"
                    );
                }
                if let Some(left) = h.expires_in {
                    ensure!(
                        left <= LONG,
                        "{what} was refused saying {left:?} remain of a {LONG:?} hold"
                    );
                }
            }
        }
    }
    Ok(Outcome::Passed)
}

/// A client that re-sends an acquisition after losing its reply sees the
/// key held by its own token: the manager must take the hold (or clean it
/// up and try again), not wait on itself until the TTL.
pub async fn duplicate_delivery_does_not_wait_on_itself(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let twice = Duplicating::new(b);
    let m = LockManager::builder(twice.clone())
        .ttl(LONG)
        .retry(RetryPolicy::Fixed(Duration::from_millis(20)))
        .build()
        .map_err(err)?;
    let k = key("duplicate");
    let within = Duration::from_secs(3);
    let g = match tokio::time::timeout(within, m.lock(&k)).await {
        Ok(g) => g.map_err(err)?,
        Err(_) => {
            return Err(format!(
                "an acquisition that reached the store twice was still waiting after {within:?}: \
                 the caller waits on its own hold (TTL {LONG:?})"
            ))
        }
    };
    ensure!(
        twice.duplicated() == 1,
        "the acquisition was not delivered twice"
    );
    ensure!(
        g.is_held(),
        "the guard of a duplicated acquisition is not held"
    );
    let other = f.open().await?;
    ensure!(
        !is_free(&other, &k, LONG).await?,
        "the store does not hold the key for the guard"
    );
    let mine = g.token().clone();
    g.release().await.map_err(err)?;
    left_after_release(&other, &k, &mine).await
}

/// Passes when `key` is free; else names what still holds it: the
/// released guard's own token (`mine`) or another.
async fn left_after_release(
    other: &std::sync::Arc<dyn moltlock_core::Backend>,
    key: &str,
    mine: &Token,
) -> CaseResult {
    let Some(h) = holder_of(other, key, LONG).await? else {
        return Ok(Outcome::Passed);
    };
    let whose = match &h.holder {
        Some(t) if t == mine => "the released guard's own token",
        Some(_) => "another token",
        None => "an unnamed holder",
    };
    Err(format!(
        "a duplicated acquisition left a hold after release: held by {whose} ({:?}), {:?} left",
        h.holder, h.expires_in
    ))
}

/// `renew_many` answers each item for itself: a held, a deleted, a foreign
/// and an absent hold give `[true, false, false, false]` (in two orders),
/// and only the held one is renewed.
pub async fn renew_many_answers_per_item(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let other = f.open().await?;
    let base = key("renew-many");
    let (held_k, deleted_k, foreign_k, absent_k) = (
        format!("{base}/held"),
        format!("{base}/deleted"),
        format!("{base}/foreign"),
        format!("{base}/absent"),
    );
    let (held, _) = raw_acquire(&b, &held_k, LONG).await?;
    let (deleted, _) = raw_acquire(&b, &deleted_k, LONG).await?;
    ensure!(
        b.delete(&deleted_k.parse().map_err(err)?, &deleted)
            .await
            .map_err(err)?,
        "could not delete a fresh hold"
    );
    let (foreign_owner, _) = raw_acquire(&other, &foreign_k, LONG).await?;
    let item = |k: &str, token: &Token| -> Result<RenewItem, String> {
        Ok(RenewItem {
            key: k.parse().map_err(err)?,
            token: token.clone(),
            ttl: LONG,
        })
    };
    let batches = [
        (
            vec![
                item(&held_k, &held)?,
                item(&deleted_k, &deleted)?,
                item(&foreign_k, &Token::random())?,
                item(&absent_k, &Token::random())?,
            ],
            vec![true, false, false, false],
        ),
        (
            vec![
                item(&deleted_k, &deleted)?,
                item(&foreign_k, &Token::random())?,
                item(&absent_k, &Token::random())?,
                item(&held_k, &held)?,
            ],
            vec![false, false, false, true],
        ),
    ];
    for (items, want) in batches {
        let got = b.renew_many(&items).await.map_err(err)?;
        ensure!(
            got == want,
            "renew_many of [{}] answered {got:?}, not {want:?}",
            items
                .iter()
                .map(|i| i.key.as_str().rsplit('/').next().unwrap_or(""))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    ensure!(
        is_free(&other, &deleted_k, LONG).await?,
        "renew_many re-created a deleted hold"
    );
    ensure!(
        is_free(&other, &absent_k, LONG).await?,
        "renew_many created a hold for an absent key"
    );
    ensure!(
        renew(&other, &foreign_k, &foreign_owner, LONG).await?,
        "renew_many with a foreign token took the hold from its owner"
    );
    ensure!(
        !is_free(&other, &held_k, LONG).await?,
        "the held item was not held after renew_many"
    );
    Ok(Outcome::Passed)
}

/// A batch mixing TTLs renews each hold with its own TTL: the short one
/// expires on time, the long one stays.
pub async fn renew_many_uses_each_items_ttl(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let short = short_ttl(&b);
    let long = short * 4;
    let base = key("renew-many-ttl");
    let (long_k, short_k) = (format!("{base}/long"), format!("{base}/short"));
    let (long_t, _) = raw_acquire(&b, &long_k, long).await?;
    let (short_t, short_fence) = raw_acquire(&b, &short_k, short).await?;
    let items = vec![
        RenewItem {
            key: long_k.parse().map_err(err)?,
            token: long_t.clone(),
            ttl: long,
        },
        RenewItem {
            key: short_k.parse().map_err(err)?,
            token: short_t.clone(),
            ttl: short,
        },
    ];
    let sent = Instant::now();
    let got = b.renew_many(&items).await.map_err(err)?;
    ensure!(
        got == vec![true, true],
        "renew_many of two live holds answered {got:?}"
    );
    let t = Timed {
        token: short_t,
        fence: short_fence,
        ttl: short,
        sent,
        replied: Instant::now(),
        expiry: b.earliest_expiry(short, sent),
    };
    let other = f.open().await?;
    expect_gone_after_expiry(&other, &short_k, &t, "the short item of a mixed batch").await?;
    ensure!(
        Instant::now() < sent + long.mul_f64(0.9),
        "{}: the check of the long item came too late",
        crate::INCONCLUSIVE
    );
    ensure!(
        !is_free(&other, &long_k, long).await?,
        "the long item of a mixed batch expired with the short one's TTL"
    );
    Ok(Outcome::Passed)
}

/// Deleting with a token that does not hold the key changes nothing.
pub async fn release_with_foreign_token_changes_nothing(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let k = key("foreign-release");
    let (_owner, _) = raw_acquire(&b, &k, Duration::from_secs(10)).await?;
    let lk = k.parse().map_err(err)?;
    let deleted = b.delete(&lk, &Token::random()).await.map_err(err)?;
    ensure!(!deleted, "delete with a foreign token reported success");
    ensure!(
        !is_free(&b, &k, Duration::from_secs(10)).await?,
        "a foreign delete freed the key"
    );
    let free_key = key("foreign-release-free");
    let lk = free_key.parse().map_err(err)?;
    let deleted = b.delete(&lk, &Token::random()).await.map_err(err)?;
    ensure!(!deleted, "delete of a free key reported success");
    Ok(Outcome::Passed)
}

/// Renewing with a token that does not hold the key changes nothing.
pub async fn renew_with_foreign_token_changes_nothing(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let ttl = short_ttl(&b);
    let k = key("foreign-renew");
    let (_owner, _) = raw_acquire(&b, &k, ttl).await?;
    let lk = k.parse().map_err(err)?;
    let stranger = Token::random();
    let out = b
        .cas(&lk, Some(&stranger), &stranger, Duration::from_secs(60))
        .await
        .map_err(err)?;
    ensure!(
        matches!(out, CasOutcome::Held(_)),
        "renewal with a foreign token succeeded: {out:?}"
    );
    let other = f.open().await?;
    ensure!(
        becomes_free(&other, &k, ttl * 3).await?,
        "a foreign renewal extended the hold past its TTL"
    );
    Ok(Outcome::Passed)
}

/// `cas` with the wrong `expected` holder fails, on held and on free keys.
pub async fn cas_with_wrong_expected_changes_nothing(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let k = key("wrong-expected");
    let (owner, _) = raw_acquire(&b, &k, Duration::from_secs(10)).await?;
    let lk = k.parse().map_err(err)?;
    let (a, c) = (Token::random(), Token::random());
    let out = b
        .cas(&lk, Some(&a), &c, Duration::from_secs(10))
        .await
        .map_err(err)?;
    ensure!(
        matches!(out, CasOutcome::Held(_)),
        "cas with a wrong expected holder succeeded"
    );
    ensure!(
        b.delete(&lk, &owner).await.map_err(err)?,
        "the owner lost the key after a failed cas"
    );
    let out = b
        .cas(&lk, Some(&a), &c, Duration::from_secs(10))
        .await
        .map_err(err)?;
    ensure!(
        matches!(out, CasOutcome::Held(_)),
        "cas expecting a holder succeeded on a free key"
    );
    Ok(Outcome::Passed)
}

/// A second release of the same hold says it was not held.
pub async fn double_release_reports_not_held(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let m = manager(&b, Duration::from_secs(10))?;
    let k = key("double-release");
    let g = m.lock(&k).await.map_err(err)?;
    let (lk, token) = (g.key().clone(), g.token().clone());
    g.release().await.map_err(err)?;
    let again = b.delete(&lk, &token).await.map_err(err)?;
    ensure!(
        !again,
        "a second delete of a released hold reported success"
    );
    let g2 = m.lock(&k).await.map_err(err)?;
    let stale = b.delete(&lk, &token).await.map_err(err)?;
    ensure!(!stale, "a stale token deleted the next holder's key");
    ensure!(g2.is_held(), "the next holder must still hold");
    Ok(Outcome::Passed)
}
