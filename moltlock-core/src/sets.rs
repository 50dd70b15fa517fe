//! Acquiring several keys at once: the engine under semaphores, read-write
//! locks and multi-locks. Each key is an ordinary hold (renewed, fenced,
//! expired by the store's clock), so these primitives are exactly as safe
//! as the single-key contract the conformance suite proves per backend.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::cleanup::PendingAcquire;
use crate::guard::LockGuard;
use crate::job::Terms;
use crate::manager::LockManager;
use crate::options::LockOptions;
use crate::queue::{Freed, Place, Watches};
use crate::retry::Backoff;
use crate::{BackendExt, Error, Held, LockKey, MultiMode, MultiOutcome, Token};

/// Waiters on more keys than this poll instead of watching each key.
const WATCH_LIMIT: usize = 16;

/// The shortest pause between two looks at the manager's own hold of a
/// key (a retry policy of no delay must not spin).
const MIN_LOOK: Duration = Duration::from_millis(1);

/// How many times in a row an acquire retries at once after the store
/// answered with the caller's own hold, before it backs off as usual.
const SELF_HELD_RETRIES: u32 = 3;

/// How long a waiter whose release watch failed sleeps at most before it
/// opens the watch again and looks.
const REOPEN_AFTER: Duration = Duration::from_secs(1);

/// What one attempt at a set of keys saw.
pub(crate) enum Attempt {
    /// The holds taken, in the order of the keys given.
    Got(Vec<LockGuard>),
    /// Nothing is held; the busy keys as (index, what was seen). Empty when
    /// a grant expired before it was confirmed (try again at once).
    Busy(Vec<(usize, Held)>),
    /// The store answered with our own hold (our request applied twice, by
    /// a client that re-sent it after a lost reply): its fence is unknown,
    /// so every key was given back. Worth trying again at once.
    Own(Vec<(usize, Held)>),
}

/// How an acquisition waits: once or until it holds, the semaphore limit
/// check, and its place in the manager's queue for the key.
struct Wait<'a> {
    no_wait: bool,
    check: Option<&'a crate::slots::SlotSet>,
    place: Option<&'a Place<'a>>,
}

/// A boxed future borrowing from the caller.
pub(crate) type Pinned<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Whether no live release watch covers any of the busy keys: the waiter
/// learns of a release only by looking again.
fn polling(watches: &Watches, busy: &[(usize, Held)]) -> bool {
    !busy
        .iter()
        .any(|(i, _)| watches.get(*i).is_some_and(Option::is_some))
}

/// Resolves with the first of `futures` to finish; never, when empty.
pub(crate) async fn first_of<T>(mut futures: Vec<Pinned<'_, T>>) -> T {
    std::future::poll_fn(|cx| {
        for f in futures.iter_mut() {
            if let Poll::Ready(v) = f.as_mut().poll(cx) {
                return Poll::Ready(v);
            }
        }
        Poll::Pending
    })
    .await
}

/// Runs `work` within `timeout` (when given), failing with
/// [`Error::Timeout`] naming `label`.
pub(crate) async fn within<T>(
    label: &str,
    timeout: Option<Duration>,
    work: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    let Some(limit) = timeout else {
        return work.await;
    };
    let started = Instant::now();
    match tokio::time::timeout(limit, work).await {
        Ok(r) => r,
        Err(_) => Err(Error::Timeout {
            key: label.to_owned(),
            waited: started.elapsed(),
        }),
    }
}

/// Refuses an answer that names keys it was not asked for, or (for `All`)
/// leaves some out: a guard missing a key would claim what it does not
/// hold. The cleanup stays armed, so whatever was taken is deleted.
fn check_taken(
    backend: &'static str,
    len: usize,
    mode: MultiMode,
    taken: &[(usize, crate::Fence)],
) -> Result<(), Error> {
    let mut seen: Vec<usize> = taken.iter().map(|(i, _)| *i).collect();
    seen.sort_unstable();
    seen.dedup();
    let fits = seen.len() == taken.len() && seen.iter().all(|i| *i < len);
    let count = match mode {
        MultiMode::All => len,
        MultiMode::Any => 1,
    };
    if fits && seen.len() == count {
        return Ok(());
    }
    Err(Error::store(
        backend,
        format!("cas_multi answered {taken:?} for {len} keys ({mode:?})"),
        false,
    ))
}

/// The guard of a waiting acquisition (which returns `None` only when
/// asked not to wait).
pub(crate) fn granted<T>(mgr: &LockManager, got: Option<T>) -> Result<T, Error> {
    got.ok_or_else(|| Error::store(mgr.backend().name(), "no hold returned", false))
}

impl LockManager {
    /// One attempt at `keys` under one fresh token.
    ///
    /// # Cancel safety
    /// Every key is covered by an armed cleanup while the request is in
    /// flight; once the store answered, each hold is owned by its guard.
    pub(crate) async fn attempt_set(
        &self,
        keys: &[LockKey],
        mode: MultiMode,
        terms: Terms,
    ) -> Result<Attempt, Error> {
        self.attempt_as(keys, mode, terms, Token::random()).await
    }

    /// As [`attempt_set`](Self::attempt_set), under the fresh `token` given.
    pub(crate) async fn attempt_as(
        &self,
        keys: &[LockKey],
        mode: MultiMode,
        terms: Terms,
        token: Token,
    ) -> Result<Attempt, Error> {
        let inner = self.inner();
        let any = mode == MultiMode::Any;
        let mut pending = PendingAcquire::new(inner.clone(), keys, &token, any);
        let sent_at = Instant::now();
        let outcome = inner
            .backend
            .cas_multi(keys, &token, terms.first_ttl(), mode)
            .await?;
        match outcome {
            MultiOutcome::Held(busy) => {
                if busy.iter().any(|(_, h)| h.holder.as_ref() == Some(&token)) {
                    tracing::debug!("the store answered with our own hold; giving it back");
                    self.give_back_all(keys, &token, &mut pending).await;
                    return Ok(Attempt::Own(busy));
                }
                pending.disarm();
                Ok(Attempt::Busy(busy))
            }
            MultiOutcome::Acquired(taken) => {
                check_taken(inner.backend.name(), keys.len(), mode, &taken)?;
                self.confirm_set(keys, token, terms, sent_at, taken, pending)
                    .await
            }
        }
    }

    /// The store reported a key held by our own token (a request applied
    /// twice): every key is deleted by the token, and a key whose delete
    /// failed is left to the cleanup.
    async fn give_back_all(&self, keys: &[LockKey], token: &Token, pending: &mut PendingAcquire) {
        for key in keys {
            if self.inner().backend.delete(key, token).await.is_ok() {
                pending.settle(key);
            }
        }
    }

    /// Makes guards of the holds taken; a grant a clock step cut short is
    /// given back, and the attempt counts as busy with nothing seen.
    async fn confirm_set(
        &self,
        keys: &[LockKey],
        token: Token,
        terms: Terms,
        sent_at: Instant,
        taken: Vec<(usize, crate::Fence)>,
        mut pending: PendingAcquire,
    ) -> Result<Attempt, Error> {
        let mut guards = Vec::with_capacity(taken.len());
        let mut whole = true;
        for (i, fence) in taken {
            let Some(key) = keys.get(i) else { continue };
            let ttl = terms.first_ttl();
            let confirmed = self.confirm_late_grant(key, &token, ttl, sent_at).await?;
            pending.settle(key);
            match confirmed {
                Some(at) => {
                    guards.push(self.guard(key, token.clone(), fence, terms, (sent_at, at)))
                }
                None => whole = false,
            }
        }
        pending.disarm();
        if !whole {
            // Dropping the guards gives the rest back.
            drop(guards);
            return Ok(Attempt::Busy(Vec::new()));
        }
        Ok(Attempt::Got(guards))
    }

    /// Waits for `keys` (all of them, or any one) and holds them; `None`
    /// only with `no_wait`. `check` runs once, the first time every key
    /// is found busy (a semaphore's limit check).
    ///
    /// # Cancel safety
    /// As [`attempt_set`](Self::attempt_set): a dropped wait holds nothing.
    pub(crate) async fn acquire_set(
        &self,
        keys: &[LockKey],
        mode: MultiMode,
        terms: Terms,
        no_wait: bool,
        check: Option<&crate::slots::SlotSet>,
    ) -> Result<Option<Vec<LockGuard>>, Error> {
        let mut watches = if no_wait {
            Vec::new()
        } else {
            self.open_watches(keys).await
        };
        let wait = Wait {
            no_wait,
            check,
            place: None,
        };
        self.wait_for_set(keys, mode, terms, wait, &mut watches)
            .await
    }

    /// Waits for one key in this manager's queue of its waiters: only the
    /// head of the queue asks the store, and a head behind a hold of this
    /// very manager waits for its end here, asking nothing.
    ///
    /// # Cancel safety
    /// As [`acquire_set`](Self::acquire_set); a dropped waiter leaves the
    /// queue, and a dropped head hands its turn (and the key's release
    /// watch) to the next.
    pub(crate) async fn acquire_queued(
        &self,
        key: &LockKey,
        terms: Terms,
    ) -> Result<Option<Vec<LockGuard>>, Error> {
        let place = self.inner().queues.join(key);
        let mut watches = place.turn().await;
        let keys = std::slice::from_ref(key);
        // Opened by the first head; a watch that failed is opened again by
        // the next head, so one failure does not make the queue poll.
        if watches.is_empty() || watches.iter().any(Option::is_none) {
            *watches = self.open_watches(keys).await;
        }
        let wait = Wait {
            no_wait: false,
            check: None,
            place: Some(&place),
        };
        self.wait_for_set(keys, MultiMode::All, terms, wait, &mut watches)
            .await
    }

    async fn wait_for_set(
        &self,
        keys: &[LockKey],
        mode: MultiMode,
        terms: Terms,
        wait: Wait<'_>,
        watches: &mut Watches,
    ) -> Result<Option<Vec<LockGuard>>, Error> {
        let no_wait = wait.no_wait;
        let mut checked = false;
        let mut attempt = 0u32;
        let mut backoff = Backoff::default();
        loop {
            if let Some(place) = wait.place {
                self.behind_own_hold(place).await;
            }
            let freed = wait.place.map(|p| p.freed());
            self.reopen_failed(watches, keys).await;
            match self.attempt_set(keys, mode, terms).await {
                Ok(Attempt::Got(guards)) => return Ok(Some(guards)),
                Ok(Attempt::Busy(busy)) if busy.is_empty() => {
                    // Grants cut short by a clock step (or a set too slow
                    // to confirm): again at once, then backing off.
                    if attempt >= 2 {
                        tokio::time::sleep(self.inner().cfg.retry.delay(attempt)).await;
                    }
                }
                Ok(Attempt::Own(_)) if attempt < SELF_HELD_RETRIES => {}
                Ok(Attempt::Busy(busy) | Attempt::Own(busy)) => {
                    if let (Some(set), false) = (wait.check, checked) {
                        set.check_limit(self).await?;
                        checked = true;
                    }
                    if no_wait {
                        return Ok(None);
                    }
                    let step = backoff.next(&busy, polling(watches, &busy));
                    self.pause_set(watches, keys, &busy, step, freed).await;
                }
                Err(e) if e.is_retryable() && !no_wait => {
                    tracing::debug!(error = %e, "acquire attempt failed; retrying");
                    // A watch may have failed with the store, unseen: the
                    // next attempt comes soon and opens it again.
                    let mut delay = self.inner().cfg.retry.delay(attempt);
                    if !watches.is_empty() && self.inner().backend.watcher().is_some() {
                        delay = delay.min(REOPEN_AFTER);
                    }
                    tokio::time::sleep(delay).await;
                }
                Err(e) => return Err(e),
            }
            attempt = attempt.saturating_add(1);
        }
    }

    /// While this manager holds the place's key (a guard of it lives), the key is
    /// ours: wait for that hold's end (told by its release or loss, or seen
    /// at the next look), without asking the store.
    async fn behind_own_hold(&self, place: &Place<'_>) {
        let mut looks = 0u32;
        loop {
            let freed = place.freed();
            if !self.inner().registry().holds_key(place.key()) {
                return;
            }
            let delay = self.inner().cfg.retry.delay(looks).max(MIN_LOOK);
            let span = tracing::debug_span!(
                "moltlock.wait",
                key = %place.key(),
                keys = 1,
                backend = self.inner().backend.name(),
                behind = "own hold",
                ?delay
            );
            let pause = async {
                tokio::select! {
                    _ = freed => {}
                    _ = tokio::time::sleep(delay) => {}
                }
            };
            pause.instrument(span).await;
            looks = looks.saturating_add(1);
        }
    }

    /// A release watch per key, opened before the first attempt (none for
    /// more than [`WATCH_LIMIT`] keys: those waiters poll).
    pub(crate) async fn open_watches(&self, keys: &[LockKey]) -> Watches {
        let mut out = Vec::with_capacity(keys.len());
        if keys.len() > WATCH_LIMIT {
            return out;
        }
        for key in keys {
            out.push(self.open_watch(key).await);
        }
        out
    }

    /// Opens again, before an attempt, the release watches that failed, so
    /// a waiter whose watch broke (a dropped connection, a store restart)
    /// hears releases again once the store notifies; until then it looks
    /// every [`REOPEN_AFTER`] at least (after a failed attempt too).
    async fn reopen_failed(&self, watches: &mut Watches, keys: &[LockKey]) {
        if self.inner().backend.watcher().is_none() {
            return;
        }
        for (slot, key) in watches.iter_mut().zip(keys) {
            if slot.is_none() {
                *slot = self.open_watch(key).await;
            }
        }
    }

    /// Sleeps until a busy key's release, the earliest expiry seen, or the
    /// retry delay (at most [`REOPEN_AFTER`] while a busy key's watch has
    /// failed). `busy` indexes `keys` (and `watches`).
    pub(crate) async fn pause_set(
        &self,
        watches: &mut Watches,
        keys: &[LockKey],
        busy: &[(usize, Held)],
        attempt: u32,
        freed: Option<Freed<'_>>,
    ) {
        let mut delay = self.inner().cfg.retry.delay(attempt);
        for (_, held) in busy {
            if let Some(left) = held.expires_in {
                delay = delay.min(left + Duration::from_millis(1));
            }
        }
        let failed_watch = busy
            .iter()
            .any(|(i, _)| watches.get(*i).is_some_and(Option::is_none));
        if failed_watch && self.inner().backend.watcher().is_some() {
            delay = delay.min(REOPEN_AFTER);
        }
        let mut waits: Vec<Pinned<'_, (usize, Result<(), Error>)>> = Vec::new();
        for (i, slot) in watches.iter_mut().enumerate() {
            let (Some(w), Some((_, held))) = (slot.as_mut(), busy.iter().find(|(j, _)| *j == i))
            else {
                continue;
            };
            waits.push(Box::pin(async move { (i, w.released(held).await) }));
        }
        if let Some(freed) = freed {
            waits.push(Box::pin(async move {
                freed.await;
                (usize::MAX, Ok(()))
            }));
        }
        let span = tracing::debug_span!(
            "moltlock.wait",
            key = tracing::field::Empty,
            keys = busy.len(),
            backend = self.inner().backend.name(),
            attempt,
            ?delay
        );
        if let [(i, _)] = busy {
            if let Some(key) = keys.get(*i) {
                span.record("key", tracing::field::display(key));
            }
        }
        let failed = tokio::select! {
            (i, r) = first_of(waits).instrument(span.clone()) => r.err().map(|e| (i, e)),
            _ = tokio::time::sleep(delay).instrument(span) => None,
        };
        if let Some((i, e)) = failed {
            tracing::debug!(error = %e, "release watch failed; polling instead");
            if let Some(slot) = watches.get_mut(i) {
                *slot = None;
            }
        }
    }

    /// Checks a primitive's options: the TTL and the description.
    pub(crate) fn set_ttl(&self, opts: &LockOptions) -> Result<Duration, Error> {
        if !opts.job.is_none() {
            return Err(Error::Config(
                "at_most and at_least are for single-key locks, not semaphores, read-write locks or multi-locks".into(),
            ));
        }
        if opts.fair {
            return Err(Error::Config(
                "semaphores, read-write locks and multi-locks have no fair mode".into(),
            ));
        }
        self.checked_ttl(opts)
    }

    /// Releases a guard. A delete that fails for the moment is sent again
    /// in the background by the release itself, so a turnstile key does not
    /// stay held for its TTL.
    pub(crate) async fn release_or_retry(&self, guard: LockGuard) {
        let key = guard.key().clone();
        if let Err(e) = guard.release().await {
            tracing::debug!(%key, error = %e, "release failed");
        }
    }

    /// Stores the description with every guard, where the backend can.
    pub(crate) async fn describe_all(&self, guards: &[LockGuard], opts: &LockOptions) {
        if let Some(text) = &opts.description {
            for g in guards {
                self.describe(g, text).await;
            }
        }
    }
}
