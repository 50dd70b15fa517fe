//! The guard of a held lock.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::cleanup::spawn_release;
use crate::hold::Hold;
use crate::registry::Inner;
use crate::{Error, Fence, LockKey, LostReason, Token};

/// Proof of a hold. The lock is renewed while the guard lives; release it with
/// [`release`](Self::release), or drop it for a best-effort release in the
/// background.
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
        let s = self.hold.snapshot();
        s.lost.is_none() && Instant::now() < s.valid_until
    }

    /// Time left before the local validity deadline, unless renewed; `None`
    /// once the hold is not held.
    pub fn valid_for(&self) -> Option<Duration> {
        let s = self.hold.snapshot();
        if s.lost.is_some() {
            return None;
        }
        s.valid_until.checked_duration_since(Instant::now())
    }

    /// The fence, if the hold is still valid; use it right before a write.
    ///
    /// # Errors
    /// [`Error::Lost`] once the hold is lost or past its deadline.
    pub fn check(&self) -> Result<Fence, Error> {
        if self.is_held() {
            return Ok(self.hold.fence);
        }
        Err(Error::Lost {
            key: self.hold.key.to_string(),
            reason: self.hold.snapshot().lost.unwrap_or(LostReason::Deadline),
        })
    }

    /// Resolves when the hold is lost: a renewal was refused, or the local
    /// validity deadline passed without a confirmed renewal (fired by a timer,
    /// even while a renewal request hangs).
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes; call it again to keep waiting.
    pub async fn lost(&self) -> LostReason {
        let mut rx = self.hold.state.subscribe();
        loop {
            let s = rx.borrow_and_update().clone();
            if let Some(reason) = s.lost {
                return reason;
            }
            tokio::select! {
                changed = rx.changed() => if changed.is_err() {
                    return LostReason::Deadline;
                },
                _ = tokio::time::sleep_until(s.valid_until) => {
                    self.inner.finish(&self.hold, LostReason::Deadline);
                }
            }
        }
    }

    /// Stops renewal and deletes the hold (owner-checked).
    ///
    /// # Cancel safety
    /// If the future is dropped before the store answers, the hold is still
    /// removed from renewal, so it lives at most until its TTL (for
    /// lease-based stores such as etcd, until the backend's own retry of
    /// the release, or the end of its session).
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the store no longer had this hold (it expired
    /// or was taken over); store errors as they come.
    pub async fn release(mut self) -> Result<(), Error> {
        self.released = true;
        self.inner.release(&self.hold);
        let deleted = self
            .inner
            .backend
            .delete(&self.hold.key, &self.hold.token)
            .await?;
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

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.inner.release(&self.hold);
        spawn_release(
            &self.inner,
            self.hold.key.clone(),
            self.hold.token.clone(),
            None,
        );
    }
}
