//! The guard of a held lock.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use crate::cleanup::{spawn_release, Again};
use crate::hold::Hold;
use crate::registry::Inner;
use crate::{Error, Fence, LockKey, LostReason, LostToken, Token};

/// Proof of a hold. The lock is renewed while the guard lives; release it with
/// [`release`](Self::release), or drop it for a best-effort release in the
/// background. A guard dropped on a thread with no tokio runtime is
/// released on the runtime its manager first acquired on (so its key is
/// free at once, not at its TTL); once that runtime is gone too, the hold
/// lives until its TTL.
///
/// # Acting on a loss
/// A hold can be lost while its guard lives (a renewal refused, or no
/// renewal confirmed before the local validity deadline). The usual ways
/// to stop writing in time:
///
/// - race the work against the loss: `tokio::select! { r = guard.lost() => …, v = work(guard.fence()) => … }`,
///   or let [`LockManager::with_lock_until_lost`](crate::LockManager::with_lock_until_lost)
///   do it;
/// - hand [`lost_token`](Self::lost_token) to another task (it is
///   `Clone + 'static`) that stops a worker or a stream when it resolves;
/// - call [`check`](Self::check) right before each write and send the fence
///   with it, so the resource refuses a late write
///   (`UPDATE … WHERE last_fence < $fence`) even when the loss was not
///   seen in time.
#[must_use = "dropping the guard releases the lock at once"]
#[clippy::has_significant_drop]
pub struct LockGuard {
    inner: Arc<Inner>,
    hold: Arc<Hold>,
    released: bool,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.hold.key)
            .field("fence", &self.hold.fence)
            .field("held", &self.is_held())
            .finish()
    }
}

impl LockGuard {
    pub(crate) fn new(inner: Arc<Inner>, hold: Arc<Hold>) -> Self {
        Self {
            inner,
            hold,
            released: false,
        }
    }

    /// The shared state of the hold.
    pub(crate) fn hold(&self) -> &Arc<Hold> {
        &self.hold
    }

    /// The backend the hold is in.
    pub(crate) fn manager_backend(&self) -> &Arc<dyn crate::Backend> {
        &self.inner.backend
    }

    /// The key held.
    pub fn key(&self) -> &LockKey {
        &self.hold.key
    }

    /// The owner token of this hold.
    pub fn token(&self) -> &Token {
        &self.hold.token
    }

    /// The fencing token: pass it with every write to the guarded resource.
    pub fn fence(&self) -> Fence {
        self.hold.fence
    }

    /// The TTL this hold is renewed with.
    pub fn ttl(&self) -> Duration {
        self.hold.ttl
    }

    /// Whether the hold is still valid in this process's view: not lost, and
    /// before the local validity deadline.
    pub fn is_held(&self) -> bool {
        crate::lost::gone(&self.hold).is_none()
    }

    /// Time left before the local validity deadline, unless renewed; `None`
    /// once the hold is not held.
    pub fn valid_for(&self) -> Option<Duration> {
        crate::lost::valid_for(&self.hold)
    }

    /// The fence, if the hold is still valid; use it right before a write.
    ///
    /// # Errors
    /// [`Error::Lost`] once the hold is lost or past its deadline.
    pub fn check(&self) -> Result<Fence, Error> {
        crate::lost::check(&self.hold)
    }

    /// Resolves when the hold is lost: a renewal was refused, or the local
    /// validity deadline passed without a confirmed renewal (fired by a timer,
    /// even while a renewal request hangs).
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes; call it again to keep waiting.
    pub async fn lost(&self) -> LostReason {
        crate::lost::wait_lost(&self.inner, &self.hold).await
    }

    /// A cloneable, `'static` handle on this hold's lost signal (with its
    /// key and fence), to move into a task that must stop when the lock is
    /// lost. It does not keep the lock: once the guard is released or
    /// dropped, the handle reports [`LostReason::Released`].
    pub fn lost_token(&self) -> LostToken {
        LostToken::new(self.inner.clone(), self.hold.clone())
    }

    /// Resolves once someone asked this holder to release the lock
    /// ([`LockManager::request_release`](crate::LockManager::request_release)). The request is checked with
    /// each renewal (every TTL/3) from the first call on, so it is heard
    /// within about one renewal interval. It never resolves on a backend
    /// that cannot inspect holds.
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes; call it again to keep waiting.
    pub async fn release_requested(&self) {
        let hold = self.hold();
        hold.listening.store(true, Ordering::Release);
        let mut asked = hold.asked_channel().subscribe();
        // An `Err` means the hold is gone: nothing will be asked any more.
        if asked.wait_for(|a| *a).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Whether a release request reached this holder (see
    /// [`release_requested`](Self::release_requested)). The first call
    /// starts the checks, as `release_requested` does.
    pub fn is_release_requested(&self) -> bool {
        let hold = self.hold();
        hold.listening.store(true, Ordering::Release);
        hold.was_asked()
    }

    /// Stops renewal and deletes the hold (owner-checked).
    ///
    /// # Cancel safety
    /// If the future is dropped before the store answers (a caller's
    /// timeout around it, say), the hold is still removed from renewal,
    /// and the guard's drop sends the delete again in the background, as
    /// for a dropped guard: the key does not stay held for the rest of its
    /// TTL.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the store no longer had this hold (it expired
    /// or was taken over); store errors as they come. After a retryable
    /// error ([`Error::is_retryable`]: the store did not answer, or refused
    /// for the moment) the delete is sent again in the background, at
    /// growing pauses (up to 30 s) until the hold would have expired, so the key does
    /// not stay held for the rest of its TTL.
    pub async fn release(mut self) -> Result<(), Error> {
        let out = self.release_now().await;
        self.released = true;
        out
    }

    /// The release's work; the guard counts as released only once it has
    /// ended, so a drop before that releases in the background.
    async fn release_now(&self) -> Result<(), Error> {
        self.inner.release(&self.hold);
        crate::ask::forget(&self.inner.backend, &self.hold);
        let _told = self.inner.queues.told_at_end(&self.hold.key);
        // A hold cut to what is left of its at-least time keeps the key
        // blocked, and a lost one may be someone else's now: nobody to
        // tell early.
        let live = self.hold.snapshot().lost.is_none()
            && tokio::time::Instant::now() < self.hold.valid_until();
        let early = live && self.hold.at_least_left().is_none();
        if early && self.inner.backend.limits().in_order {
            let queues = &self.inner.queues;
            return queues.told_once_sent(&self.hold.key, self.delete()).await;
        }
        self.delete().await
    }

    async fn delete(&self) -> Result<(), Error> {
        if let Some(left) = self.hold.at_least_left() {
            return crate::cleanup::linger(&self.inner, &self.hold.key, &self.hold.token, left)
                .await;
        }
        let span = tracing::debug_span!(
            "moltlock.release",
            key = %self.hold.key,
            backend = self.inner.backend.name(),
            fence = self.hold.fence.0,
        );
        let deleted = self
            .inner
            .backend
            .delete(&self.hold.key, &self.hold.token)
            .instrument(span)
            .await
            .inspect_err(|e| self.retry_in_background(e))?;
        tracing::debug!(key = %self.hold.key, deleted, "lock released");
        if deleted {
            Ok(())
        } else {
            Err(Error::NotHeld {
                key: self.hold.key.to_string(),
            })
        }
    }
}

impl LockGuard {
    /// After a delete that failed for now (`e` retryable: the store did not
    /// answer, or refused for the moment), sends it again in the
    /// background until the hold would have expired, so the key is not
    /// kept for the rest of its TTL.
    fn retry_in_background(&self, e: &Error) {
        if !e.is_retryable() {
            return;
        }
        tracing::debug!(key = %self.hold.key, error = %e, "release failed; retrying in the background");
        self.release_in_background();
    }

    /// An owner-checked delete of the hold in the background, sent again
    /// after retryable failures until the hold would have expired.
    fn release_in_background(&self) {
        spawn_release(
            &self.inner,
            self.hold.key.clone(),
            self.hold.token.clone(),
            Some(self.hold.fence),
            Again::on_error_for(&self.hold),
        );
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.inner.release(&self.hold);
        crate::ask::forget(&self.inner.backend, &self.hold);
        if let Some(left) = self.hold.at_least_left() {
            let (key, token) = (self.hold.key.clone(), self.hold.token.clone());
            crate::cleanup::spawn_linger(&self.inner, key, token, left);
            return;
        }
        self.release_in_background();
    }
}
