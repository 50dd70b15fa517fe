//! The fair queue on every SQL database: a table of places beside the
//! locks, served in the order the database numbered them.
//!
//! A fair acquire first asks whether the key has a live place: a key with
//! an empty queue is taken by the plain acquisition at once, with no place
//! (one statement, whose acquisition checks the queue itself; two on
//! Postgres with `expiry=observed`). Otherwise, and
//! when the key was held, the waiter takes a place at the tail and looks:
//! each look drops the key's dead places, keeps its own alive for the TTL
//! (at least 500 ms, by the database clock), and tells how many live places
//! are ahead of it. Only the head tries the key, with the plain
//! acquisition, and leaves the queue once it holds it; so fair waiters are
//! served in arrival order and a fair newcomer never overtakes a queued
//! waiter. A plain `lock()` may still take a free key before the head does,
//! as on every fair backend.
//!
//! Between looks a waiter sleeps until the key may have been released:
//! Postgres wakes it by `LISTEN/NOTIFY` (its wait marks the hold, so the
//! release notifies; a waiter the release names as the head tries the key
//! at once, with no look first, by a statement that checks it is still
//! the live head), at the latest after a third of its TTL (a waiter
//! behind others that finds the key free between a release and the head's
//! take looks again within 1 ms, doubling, so it marks the head's hold in
//! time to hear its release); SQLite and
//! MySQL have no notifications, so waiters poll by their place: the head
//! after 1 ms, doubling to 25 ms while the key stays held (never past the
//! holder's time left), the next in line every 5 ms (so it looks soon after
//! the head took the key), the rest every 25 ms. A waiter that stopped
//! looking (a crash, or a pause through which a whole TTL passes from its
//! last look, which a pause shorter than the TTL can be) loses its place to the
//! next look of anyone once its place's time has passed; a dropped wait
//! takes its place out at once (and again until a look it dropped in flight
//! can no longer land).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use moltlock_core::{
    Backend, CasOutcome, Error, FairQueue, Fence, Held, LockKey, ReleaseWatch, Token,
};
use tokio::time::Instant;

use crate::backend::SqlBackend;
use crate::dialect::{Dialect, TurnWatch, Write};

/// The least time a place lives past a look.
const LEAST_LIVE: Duration = Duration::from_millis(500);
/// How often a waiter further back looks on a database with no
/// notifications, and the most a head's pause grows to.
const POLL: Duration = Duration::from_millis(25);
/// The head's first pause on such a database (doubled while the key stays
/// held).
const HEAD_FIRST: Duration = Duration::from_millis(1);
/// How often the next in line looks on such a database.
const NEXT_POLL: Duration = Duration::from_millis(5);
/// A watch that answered within this answered at once (it found the key
/// free).
const AT_ONCE: Duration = Duration::from_millis(1);
/// The least time between two looks of one waiter.
const GAP: Duration = Duration::from_millis(1);
/// Pauses between the leaves of a dropped wait (then each second).
const LEAVE_PAUSES: [Duration; 4] = [
    Duration::from_millis(50),
    Duration::from_millis(200),
    Duration::from_millis(500),
    Duration::from_secs(1),
];
/// How often a waiter with a watch looks again per place ahead of it when
/// no release woke it: a head that stopped waiting keeps its place until
/// the place's time passes, and takes no key, so no release follows; the
/// next in line takes the key this soon after the place died.
const BEHIND: Duration = Duration::from_millis(250);
/// Pause after a retryable failure.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// What one look found.
enum Looked {
    /// The key is ours; `true` when the statement that took it also took
    /// the waiter's place out.
    Taken(Fence, bool),
    /// Wait: the head found the key held (as `Some`), or places are ahead.
    Wait(Option<Held>, u64),
}

/// `ahead` as a multiplier of [`BEHIND`].
fn places(ahead: u64) -> u32 {
    u32::try_from(ahead.min(40)).unwrap_or(40)
}

/// A waiter's next pauses.
struct Pauses {
    /// The head's next pause on a database with no notifications.
    head: Duration,
    /// The next pause of a waiter behind others whose watch found the key
    /// free (the head has not taken it yet).
    soon: Duration,
}

impl Default for Pauses {
    fn default() -> Self {
        Self {
            head: HEAD_FIRST,
            soon: HEAD_FIRST,
        }
    }
}

/// How long a waiter on a database with no notifications pauses: by its
/// place in the queue (see the module docs); `head` is the head's next
/// pause, doubled here.
fn poll_pause(ahead: u64, head: &mut Duration) -> Duration {
    match ahead {
        0 => {
            let pause = *head;
            *head = (*head * 2).min(POLL);
            pause
        }
        1 => {
            *head = HEAD_FIRST;
            NEXT_POLL
        }
        _ => {
            *head = HEAD_FIRST;
            POLL
        }
    }
}

impl<D: Dialect> SqlBackend<D> {
    /// The plain acquisition of a head (with its leave, where the dialect
    /// has one statement for both); a hold of its own (taken by an earlier
    /// try whose reply was lost) is confirmed by renewing it.
    async fn try_take(&self, key: &LockKey, token: &Token, ttl: Duration) -> Result<Looked, Error> {
        let w = Write {
            key,
            new: token,
            ttl,
        };
        let (taken, left) = match self.run(D::queue(&self.inner).take_head(w)).await? {
            Some(outcome) => (outcome, true),
            None => (self.cas(key, None, token, ttl).await?, false),
        };
        match taken {
            CasOutcome::Acquired { fence } => Ok(Looked::Taken(fence, left)),
            CasOutcome::Held(h) if h.holder.as_ref() == Some(token) => {
                match self.cas(key, Some(token), token, ttl).await? {
                    CasOutcome::Acquired { fence } => Ok(Looked::Taken(fence, false)),
                    CasOutcome::Held(h) => Ok(Looked::Wait(Some(h), 0)),
                }
            }
            CasOutcome::Held(h) => Ok(Looked::Wait(Some(h), 0)),
        }
    }

    /// The take of a waiter a release named as the head, in one statement
    /// that checks its place is live and first; `None` when it took
    /// nothing (the key is held, the naming went stale, or the dialect has
    /// no such statement).
    async fn take_named(
        &self,
        key: &LockKey,
        token: &Token,
        ttl: Duration,
    ) -> Result<Option<Fence>, Error> {
        let w = Write {
            key,
            new: token,
            ttl,
        };
        Ok(match self.run(D::queue(&self.inner).take_named(w)).await? {
            Some(CasOutcome::Acquired { fence }) => Some(fence),
            _ => None,
        })
    }

    /// Takes the key at once when it is free and has no live place: one
    /// statement where the dialect has it, else two.
    async fn take_unqueued(
        &self,
        key: &LockKey,
        token: &Token,
        ttl: Duration,
    ) -> Result<Option<Fence>, Error> {
        let queue = D::queue(&self.inner);
        let w = Write {
            key,
            new: token,
            ttl,
        };
        let taken = match self.run(queue.take_unqueued(w)).await? {
            Some(outcome) => outcome,
            None if self.run(queue.occupied(key)).await? => return Ok(None),
            None => self.cas(key, None, token, ttl).await?,
        };
        Ok(match taken {
            CasOutcome::Acquired { fence } => Some(fence),
            CasOutcome::Held(_) => None,
        })
    }

    /// One look: renews the place, and takes the key at the head.
    async fn look(&self, key: &LockKey, token: &Token, ttl: Duration) -> Result<Looked, Error> {
        let queue = D::queue(&self.inner);
        let live = ttl.max(LEAST_LIVE);
        match self.run(queue.look(key, token, live)).await? {
            0 => self.try_take(key, token, ttl).await,
            ahead => Ok(Looked::Wait(None, ahead)),
        }
    }

    /// A look, or for a waiter that a recent look found at the head (at
    /// `head_since`, within a quarter of its place's time), only the head's
    /// attempt: newcomers are numbered after the head, and its place, which
    /// the look left with at least three quarters of its time, is still
    /// alive (and is written again by the next look, at most a third of
    /// its time later), so a look would find it at the head again
    /// (short of a waiter that stopped looking coming back to its dead
    /// place before anyone removed it; the key then goes to one of the
    /// two, as it would after a look).
    async fn next_look(
        &self,
        key: &LockKey,
        token: &Token,
        ttl: Duration,
        head_since: &mut Option<Instant>,
    ) -> Result<Looked, Error> {
        let now = Instant::now();
        if head_since.is_some_and(|t| now < t + ttl.max(LEAST_LIVE) / 4) {
            return self.try_take(key, token, ttl).await;
        }
        let looked = self.look(key, token, ttl).await;
        *head_since = matches!(looked, Ok(Looked::Wait(_, 0))).then_some(now);
        looked
    }

    /// Sleeps until the key may have been released, or a pause passed
    /// (on a database with no notifications, by the waiter's place; see
    /// [`Pauses`]). A watch answers at once while the key is free and the
    /// head has not taken it yet: a waiter behind others then pauses 1 ms,
    /// doubling while it stays so (at most its place's poll pause), as
    /// looking again at once would only spin. It then watches the head's
    /// hold, and hears its release: a waiter that slept its whole poll
    /// pause would miss the release of a hold shorter than that, and look
    /// only after it.
    ///
    /// Returns whether a release named this waiter as the queue's head.
    async fn sleep(
        &self,
        wake: &mut Wake,
        (held, ahead): (Option<Held>, u64),
        pauses: &mut Pauses,
        ttl: Duration,
    ) -> bool {
        let started = Instant::now();
        let polled = poll_pause(ahead, &mut pauses.head);
        let mut pause = match wake.watch {
            Some(_) if ahead == 0 => (ttl / 3).max(GAP),
            Some(_) => (ttl / 3).min(BEHIND * places(ahead)).max(GAP),
            None => polled,
        };
        if let Some(left) = held.as_ref().and_then(|h| h.expires_in) {
            pause = pause.min(left + Duration::from_millis(1));
        }
        let Some(w) = wake.watch.as_mut() else {
            tokio::time::sleep(pause).await;
            return false;
        };
        let held = held.unwrap_or_default();
        tokio::select! {
            told = w.released(&held) => if told.is_err() { wake.watch = None },
            _ = tokio::time::sleep(pause) => {}
        }
        let named = wake.was_named();
        if ahead == 0 || named {
            return named;
        }
        if started.elapsed() < AT_ONCE {
            let pause = pauses.soon.min(polled);
            pauses.soon = (pauses.soon * 2).min(polled);
            tokio::time::sleep_until(started + pause).await;
        } else {
            pauses.soon = HEAD_FIRST;
        }
        false
    }

    /// Waits in the queue of `key`, then holds it as `token`.
    async fn wait_in_queue(
        &self,
        key: &LockKey,
        token: &Token,
        ttl: Duration,
    ) -> Result<Fence, Error> {
        let mut wake = Wake::open(self, key, token).await;
        // A try that lost to contention (a deadlock over the queue's range
        // locks, a lock wait timeout) queues. A database that cannot be
        // reached fails the acquisition, as before it queued.
        match self.take_unqueued(key, token, ttl).await {
            Ok(Some(fence)) => return Ok(fence),
            Ok(None) => {}
            Err(
                e @ Error::Store {
                    retryable: true, ..
                },
            ) => {
                tracing::debug!(%key, error = %e, "fair take of a free key failed; queueing");
            }
            Err(e) => return Err(e),
        }
        let mut place = Place {
            backend: self.clone(),
            key: key.clone(),
            token: token.clone(),
            left: false,
        };
        let mut pauses = Pauses::default();
        let mut head_since = None;
        let mut named = false;
        loop {
            let looked = Instant::now();
            // Named by a release, whose own read found this waiter at the
            // head: take the key at once, by a statement that checks it is
            // still first; look first only when that took nothing.
            let taken = match std::mem::take(&mut named) {
                true => self.take_named(key, token, ttl).await,
                false => Ok(None),
            };
            let attempt = match taken {
                Ok(Some(fence)) => Ok(Looked::Taken(fence, true)),
                Ok(None) => self.next_look(key, token, ttl, &mut head_since).await,
                Err(e) => Err(e),
            };
            match attempt {
                Ok(Looked::Taken(fence, left)) => {
                    match left {
                        true => place.left = true,
                        false => place.leave().await,
                    }
                    return Ok(fence);
                }
                Ok(Looked::Wait(held, ahead)) => {
                    named = self.sleep(&mut wake, (held, ahead), &mut pauses, ttl).await;
                    if named {
                        continue;
                    }
                }
                Err(e) if e.is_retryable() => {
                    tracing::debug!(%key, error = %e, "fair queue look failed; retrying");
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                Err(e) => return Err(e),
            }
            tokio::time::sleep_until(looked + GAP).await;
        }
    }
}

/// How a fair waiter hears of releases.
struct Wake {
    /// The release watch; `None`: the waiter polls.
    watch: Option<Box<dyn ReleaseWatch>>,
    /// Set by a release naming the waiter as the queue's head, where the
    /// dialect's releases name heads (see [`TurnWatch`]).
    named: Option<Arc<AtomicBool>>,
}

impl Wake {
    /// The dialect's watch that hears the releases naming the waiter, or
    /// else the backend's plain release watch, or none.
    async fn open<D: Dialect>(backend: &SqlBackend<D>, key: &LockKey, token: &Token) -> Self {
        let (watch, named) = match D::queue(&backend.inner).watch_turn(key, token).await {
            Some(Ok(TurnWatch { watch, named })) => (Some(watch), Some(named)),
            Some(Err(_)) => (None, None),
            None => match backend.watcher() {
                Some(w) => (w.watch(key).await.ok(), None),
                None => (None, None),
            },
        };
        Self { watch, named }
    }

    /// Whether the last wait ended by a release naming this waiter (and
    /// forgets it).
    fn was_named(&self) -> bool {
        self.named
            .as_ref()
            .is_some_and(|n| n.swap(false, Ordering::Relaxed))
    }
}

/// A waiter's place. Dropped before it left (a dropped wait, or a leave
/// that failed), it leaves in a task spawned on the current runtime, again
/// and again until the backend's late-write bound has passed: a look
/// dropped in flight may still land after the first leave and put the
/// place back. Should that fail, or no runtime be left, the place is
/// dropped by the next look of any waiter once its time has passed.
struct Place<D: Dialect> {
    backend: SqlBackend<D>,
    key: LockKey,
    token: Token,
    /// Whether the place is gone (or, for the spawned leaver, that its own
    /// drop must not spawn another).
    left: bool,
}

impl<D: Dialect> Place<D> {
    /// Leaves the queue now (the head, once it holds the key); `left` only
    /// once the database answered.
    async fn leave(&mut self) {
        let queue = D::queue(&self.backend.inner);
        match self.backend.run(queue.leave(&self.key, &self.token)).await {
            Ok(()) => self.left = true,
            Err(e) => tracing::debug!(error = %e, "could not leave the fair queue"),
        }
    }

    /// Leaves at once and after each of [`LEAVE_PAUSES`] (then each
    /// second), the last time after the late-write bound has passed.
    async fn leave_until_settled(mut self) {
        let bound = self.backend.limits().late_write;
        let started = Instant::now();
        let mut pauses = LEAVE_PAUSES.iter();
        let mut pause = Duration::ZERO;
        loop {
            let after_bound = started.elapsed() > bound;
            self.leave().await;
            if after_bound {
                return;
            }
            pause = pauses.next().copied().unwrap_or(pause);
            tokio::time::sleep(pause).await;
        }
    }
}

impl<D: Dialect> Drop for Place<D> {
    fn drop(&mut self) {
        if self.left {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let leaver = Place {
            backend: self.backend.clone(),
            key: self.key.clone(),
            token: self.token.clone(),
            left: true,
        };
        handle.spawn(leaver.leave_until_settled());
    }
}

/// Waits in the key's queue of places, served in the order the database
/// numbered them (only the head tries the key; see the crate docs).
///
/// # Cancel safety
/// A dropped wait spawns the removal of its place on the current runtime,
/// repeated until the backend's late-write bound has passed (a look
/// dropped in flight may land late); should that fail, or no runtime be
/// left, the place is dropped by another waiter's look once its time (the
/// TTL, at least 500 ms) has passed. A
/// hold taken as the future was dropped lives until the manager's
/// owner-checked delete removes it.
#[async_trait]
impl<D: Dialect> FairQueue for SqlBackend<D> {
    async fn acquire(&self, key: &LockKey, token: &Token, ttl: Duration) -> Result<Fence, Error> {
        D::check_key(key)?;
        crate::backend::check_longest(ttl)?;
        self.wait_in_queue(key, token, ttl).await
    }
}
