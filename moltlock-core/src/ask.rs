//! Cooperative revocation: anyone may ask a key's current holder to give
//! it back ([`request_release`](crate::LockManager::request_release)); the
//! holder hears of it through
//! [`release_requested`](crate::LockGuard::release_requested), checked
//! with its renewals.
//!
//! A request is a hold of its own on the key's derived `…#~release` key,
//! owned by the token of the holder it is meant for: it names one hold, so
//! a newer holder of the key never mistakes an old request for its own,
//! and it expires by itself when nobody takes it up.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;

use crate::hold::Hold;
use crate::{Backend, CasOutcome, Error, HolderInfo, LockKey, Token};

/// The suffix of a key's release-request key.
pub(crate) const ASK: &str = "release";

/// The request's TTL when the store reports no time left.
const ASK_DEFAULT_TTL: Duration = Duration::from_secs(10);

/// Writes the request for `holder` of `key`, replacing one meant for an
/// earlier holder; `false` (nothing written) when `holder` no longer holds
/// the key.
pub(crate) async fn post(
    backend: &dyn Backend,
    key: &LockKey,
    holder: &Token,
    ttl: Duration,
) -> Result<bool, Error> {
    let ask = key.derive(ASK);
    let inspector = crate::forward::require(backend.name(), backend.inspector(), "inspect")?;
    let mut expected: Option<Token> = None;
    for _ in 0..4 {
        match backend.cas(&ask, expected.as_ref(), holder, ttl).await? {
            CasOutcome::Acquired { .. } => return Ok(true),
            CasOutcome::Held(seen) => match seen.holder {
                Some(t) if &t == holder => return Ok(true),
                // A request for someone else: replace it only while our
                // holder still holds the key (else it may be the request
                // meant for a newer holder).
                other => {
                    let now = inspector.inspect(key).await?;
                    if now.is_none_or(|h| &h.holder != holder) {
                        return Ok(false);
                    }
                    expected = other;
                }
            },
        }
    }
    Err(Error::Store {
        backend: backend.name(),
        message: "the release request was replaced under this one again and again".into(),
        retryable: true,
        source: None,
    })
}

/// A request lives about as long as its holder's hold has left (so a
/// store that caps TTLs by the holds it grants accepts it), which its
/// holder's next renewal falls within.
pub(crate) fn ask_ttl(holder: &HolderInfo, min_ttl: Duration) -> Duration {
    holder
        .expires_in
        .unwrap_or(ASK_DEFAULT_TTL)
        .clamp(min_ttl.max(Duration::from_secs(1)), crate::MAX_TTL)
}

/// Looks for requests to the holds of `due` that listen for them, one
/// inspect each, side by side, in a task of its own (the renewal never
/// waits for it), for at most half the shortest renewal interval; marks
/// those asked.
pub(crate) fn spawn_check(backend: &Arc<dyn Backend>, due: &[Arc<Hold>]) {
    let listening: Vec<Arc<Hold>> = due
        .iter()
        .filter(|h| h.listening.load(Ordering::Acquire) && !h.was_asked())
        .cloned()
        .collect();
    let Some(interval) = listening.iter().map(|h| h.interval).min() else {
        return;
    };
    let backend = backend.clone();
    tokio::spawn(async move {
        let reads = check(&backend, &listening);
        let _ = tokio::time::timeout(interval / 2, reads).await;
    });
}

async fn check(backend: &Arc<dyn Backend>, listening: &[Arc<Hold>]) {
    let mut reads = JoinSet::new();
    for hold in listening {
        let (backend, hold) = (backend.clone(), hold.clone());
        reads.spawn(async move {
            let Some(inspector) = backend.inspector() else {
                return;
            };
            match inspector.inspect(&hold.key.derive(ASK)).await {
                Ok(Some(ask)) if ask.holder == hold.token => {
                    hold.ask();
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(key = %hold.key, error = %e, "could not read the release requests"),
            }
        });
    }
    while reads.join_next().await.is_some() {}
}

/// Removes the request a released hold was asked with, in the background
/// (owner-checked: only the request meant for this hold).
pub(crate) fn forget(backend: &Arc<dyn Backend>, hold: &Hold) {
    if !hold.was_asked() {
        return;
    }
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let (backend, key, token) = (backend.clone(), hold.key.derive(ASK), hold.token.clone());
    rt.spawn(async move {
        if let Err(e) = backend.delete(&key, &token).await {
            tracing::debug!(%key, error = %e, "the release request stays until its TTL");
        }
    });
}
