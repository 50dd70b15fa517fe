//! Best-effort, owner-checked cleanup for holds whose owner went away.

use std::sync::Arc;
use std::time::Duration;

use crate::registry::Inner;
use tracing::Instrument;

use crate::{Backend, CasOutcome, Error, Fence, LockKey, Token};

/// Pauses before each further delete of a cancelled acquisition: its request
/// may still be in flight (on another connection, or in a blocking task) and
/// land after the first delete. The last pause repeats until the backend's
/// [`late_write`](crate::Limits::late_write) bound has passed.
const CANCELLED_PAUSES: [Duration; 4] = [
    Duration::from_millis(50),
    Duration::from_millis(200),
    Duration::from_secs(1),
    Duration::from_secs(3),
];

/// The longest pause between the deletes of a release that keeps failing.
const LONGEST_ERROR_PAUSE: Duration = Duration::from_secs(30);

/// When a background delete is sent again, at growing pauses, until its
/// bound has passed.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Again {
    /// Until the key is gone: a cancelled acquisition's request may still
    /// land, up to the backend's late-write bound.
    UntilGone(Duration),
    /// After a failed delete only, and only while its failures are
    /// retryable (the store did not answer, or refused for now): the hold
    /// it would end lives until its TTL otherwise, so the bound is the time
    /// the hold has left.
    OnError(Duration),
}

impl Again {
    /// [`Again::OnError`] for `hold`: until its validity deadline.
    pub(crate) fn on_error_for(hold: &crate::hold::Hold) -> Self {
        let now = tokio::time::Instant::now();
        Self::OnError(hold.valid_until().saturating_duration_since(now))
    }

    /// The pause after `pause`, once the first pauses are spent: the same
    /// until a late write's short bound; doubling up to
    /// [`LONGEST_ERROR_PAUSE`] after errors, so a store that stays down
    /// through a long hold is not asked every few seconds for all of it.
    fn after(self, pause: Duration) -> Duration {
        match self {
            Self::UntilGone(_) => pause,
            Self::OnError(_) => (pause * 2).min(LONGEST_ERROR_PAUSE),
        }
    }

    /// `pause` as slept: after errors, within ±25 %, so the releases of
    /// many holds that failed together do not come back at once.
    fn spread(self, pause: Duration) -> Duration {
        match self {
            Self::UntilGone(_) => pause,
            Self::OnError(_) => pause.mul_f64(0.75 + fastrand::f64() * 0.5),
        }
    }

    fn bound(self) -> Duration {
        match self {
            Self::UntilGone(bound) | Self::OnError(bound) => bound,
        }
    }
}

/// Spawns an owner-checked delete bounded by the manager's release timeout
/// on top of `again`'s bound, sent again as `again` says. On a thread with
/// no tokio runtime, it runs on the runtime the manager first acquired on;
/// once that runtime is gone too, the hold lives until its TTL.
pub(crate) fn spawn_release(
    inner: &Arc<Inner>,
    key: LockKey,
    token: Token,
    fence: Option<Fence>,
    again: Again,
) {
    let span = background_span(inner, std::slice::from_ref(&key), fence);
    spawn_deletes(inner, vec![key], token, false, again, span);
}

/// The `moltlock.release` span of a release done in the background (a
/// dropped guard, a cancelled acquisition, a lost hold's cleanup): the key
/// when there is one, the backend, and the fence when the hold had one.
fn background_span(inner: &Inner, keys: &[LockKey], fence: Option<Fence>) -> tracing::Span {
    let span = tracing::debug_span!(
        "moltlock.release",
        key = tracing::field::Empty,
        keys = keys.len(),
        backend = inner.backend.name(),
        fence = tracing::field::Empty,
        background = true,
    );
    if let [key] = keys {
        span.record("key", tracing::field::display(key));
    }
    if let Some(fence) = fence {
        span.record("fence", fence.0);
    }
    span
}

/// Spawns one task deleting every key of `keys` by `token` (see
/// [`spawn_release`]); with `any`, it stops at the first key it deletes
/// (an `Any` request takes one key at most).
fn spawn_deletes(
    inner: &Arc<Inner>,
    keys: Vec<LockKey>,
    token: Token,
    any: bool,
    again: Again,
    span: tracing::Span,
) {
    let Some(handle) = runtime_of(inner) else {
        tracing::debug!(?keys, "no runtime; the hold lives until its TTL");
        keys.iter().for_each(|key| inner.queues.freed(key));
        return;
    };
    let backend = inner.backend.clone();
    let limit = inner.cfg.release_timeout.saturating_add(again.bound());
    let ticket = crate::pending::Ticket::new();
    let manager = Arc::downgrade(inner);
    handle.spawn(async move {
        let _ticket = ticket;
        let work = delete_until_gone(backend.as_ref(), keys.clone(), &token, any, again);
        if tokio::time::timeout(limit, work)
            .instrument(span)
            .await
            .is_err()
        {
            tracing::debug!("best-effort release timed out");
        }
        if let Some(inner) = manager.upgrade() {
            keys.iter().for_each(|key| inner.queues.freed(key));
        }
    });
}

/// Deletes each key by `token`, again at the cancelled pauses as `again`
/// says, until every key was dealt with (`any`: one was deleted) or its
/// bound has passed (a bound of zero: one round).
async fn delete_until_gone(
    backend: &dyn Backend,
    mut keys: Vec<LockKey>,
    token: &Token,
    any: bool,
    again: Again,
) {
    let bound = again.bound();
    let until_gone = matches!(again, Again::UntilGone(_));
    let started = tokio::time::Instant::now();
    let mut pauses = CANCELLED_PAUSES.iter();
    let mut pause = Duration::ZERO;
    loop {
        let mut left = Vec::with_capacity(keys.len());
        for key in keys {
            match backend.delete(&key, token).await {
                Ok(true) if any => return,
                Ok(true) => {}
                Ok(false) if until_gone => left.push(key),
                Ok(false) => {}
                Err(e) => {
                    tracing::debug!(%key, error = %e, "best-effort release failed");
                    if until_gone || e.is_retryable() {
                        left.push(key);
                    }
                }
            }
        }
        keys = left;
        let waited = started.elapsed();
        if keys.is_empty() || waited > bound {
            return;
        }
        pause = pauses.next().copied().unwrap_or_else(|| again.after(pause));
        // The last delete comes only after the bound has passed.
        let wait = again
            .spread(pause)
            .min(bound - waited + Duration::from_millis(50));
        tokio::time::sleep(wait).await;
    }
}

/// Armed while an acquire request is in flight: if the acquiring future is
/// dropped (or the attempt failed with an error after the store may have
/// written), every key it named is deleted by its token in one background
/// task, until the backend's late-write bound has passed. For an `Any`
/// request the task stops at the first key it finds held: at most one is.
pub(crate) struct PendingAcquire {
    inner: Arc<Inner>,
    keys: Vec<LockKey>,
    token: Token,
    any: bool,
    armed: bool,
}

impl PendingAcquire {
    pub(crate) fn new(inner: Arc<Inner>, keys: &[LockKey], token: &Token, any: bool) -> Self {
        Self {
            inner,
            keys: keys.to_vec(),
            token: token.clone(),
            any,
            armed: true,
        }
    }

    /// `key` is owned by a guard now (or known free): not ours to clean.
    pub(crate) fn settle(&mut self, key: &LockKey) {
        self.keys.retain(|k| k != key);
    }

    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for PendingAcquire {
    fn drop(&mut self) {
        if !self.armed || self.keys.is_empty() {
            return;
        }
        let keys = std::mem::take(&mut self.keys);
        let again = Again::UntilGone(self.inner.limits.late_write);
        let span = background_span(&self.inner, &keys, None);
        spawn_deletes(&self.inner, keys, self.token.clone(), self.any, again, span);
    }
}

/// Ends a hold whose at-least time has `left` to run: the key passes to a
/// throwaway token for what is left, by the store's clock (rounded up to
/// the store's TTL granularity), so it stays blocked that long and not the
/// whole of the hold's own, longer TTL.
///
/// # Errors
/// [`Error::NotHeld`] when the key was no longer ours; store errors as
/// they come (the hold then ends at its TTL, which covers `left`).
pub(crate) async fn linger(
    inner: &Inner,
    key: &LockKey,
    token: &Token,
    left: Duration,
) -> Result<(), Error> {
    let throwaway = Token::random();
    match inner
        .backend
        .cas(key, Some(token), &throwaway, linger_ttl(left))
        .await?
    {
        CasOutcome::Acquired { .. } => {
            tracing::debug!(%key, ?left, "released; the key stays blocked for its at-least time");
            Ok(())
        }
        CasOutcome::Held(_) => Err(Error::NotHeld {
            key: key.to_string(),
        }),
    }
}

/// The throwaway hold's TTL for an at-least time with `left` to run: in
/// whole milliseconds rounded up, and one more, so that a store which
/// counts a TTL in whole milliseconds from a clock read to the millisecond
/// below does not free the key before the at-least time. At least
/// [`LINGER_FLOOR`]; at most [`MAX_TTL`](crate::MAX_TTL) (an at-least time
/// of the longest TTL may end up to a millisecond short).
fn linger_ttl(left: Duration) -> Duration {
    let ms = left.as_nanos().div_ceil(1_000_000);
    let ms = u64::try_from(ms).unwrap_or(u64::MAX);
    Duration::from_millis(ms.saturating_add(1)).clamp(LINGER_FLOOR, crate::MAX_TTL)
}

/// The shortest throwaway hold, however little of the at-least time is
/// left: blocking the key a little past that time is allowed, freeing it
/// before is not, and a store must be able to grant the throwaway in time
/// (a quorum counts only the members' replies that come within the TTL;
/// a backend may refuse TTLs below its own shortest, 10 ms or more).
const LINGER_FLOOR: Duration = Duration::from_millis(100);

/// [`linger`] in the background, for a dropped guard (as [`spawn_release`]).
pub(crate) fn spawn_linger(inner: &Arc<Inner>, key: LockKey, token: Token, left: Duration) {
    let Some(handle) = runtime_of(inner) else {
        tracing::debug!(%key, "no runtime; the hold lives until its TTL");
        inner.queues.freed(&key);
        return;
    };
    let inner = inner.clone();
    let ticket = crate::pending::Ticket::new();
    handle.spawn(async move {
        let _ticket = ticket;
        let limit = inner.cfg.release_timeout;
        let done = tokio::time::timeout(limit, linger(&inner, &key, &token, left)).await;
        if !matches!(done, Ok(Ok(()))) {
            tracing::debug!(%key, "the at-least hand-over did not complete; the hold ends at its TTL");
        }
        inner.queues.freed(&key);
    });
}

/// The runtime a cleanup runs on: this thread's, else the one the manager
/// first acquired on.
fn runtime_of(inner: &Inner) -> Option<tokio::runtime::Handle> {
    let here = tokio::runtime::Handle::try_current().ok();
    here.or_else(|| inner.runtime.get().cloned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lingering_hold_ends_no_earlier_than_its_at_least_time() {
        let ms = Duration::from_millis;
        assert_eq!(linger_ttl(ms(1500)), ms(1501));
        assert_eq!(linger_ttl(Duration::from_micros(1_499_001)), ms(1501));
        assert_eq!(linger_ttl(Duration::from_nanos(1)), LINGER_FLOOR);
        assert_eq!(linger_ttl(ms(99)), LINGER_FLOOR);
        assert_eq!(linger_ttl(Duration::MAX), crate::MAX_TTL);
        assert_eq!(linger_ttl(crate::MAX_TTL), crate::MAX_TTL);
    }
}
