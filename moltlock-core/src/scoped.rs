//! Scoped use of a lock (`with_lock`), and a try that tells who holds the
//! key when it is busy.

use std::future::Future;
use std::time::Duration;

use crate::guard::LockGuard;
use crate::manager::LockManager;
use crate::options::LockOptions;
use crate::{Error, Fence, LockKey, LostToken};

/// What [`LockManager::try_acquire`] found.
#[derive(Debug)]
#[must_use = "an acquired guard releases the lock when dropped"]
pub enum TryAcquire {
    /// The key was free: it is now held.
    Acquired(LockGuard),
    /// The key is held elsewhere.
    Busy(Busy),
}

impl TryAcquire {
    /// The guard, if the key was acquired.
    pub fn acquired(self) -> Option<LockGuard> {
        match self {
            Self::Acquired(guard) => Some(guard),
            Self::Busy(_) => None,
        }
    }
}

/// Facts about the holder of a busy key, as far as the store tells them.
/// Every field is `None` when the backend cannot inspect holds, or when the
/// hold ended between the attempt and the look.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Busy {
    /// The key.
    pub key: String,
    /// The holder's own words (host, pid, command, since when), where the
    /// holder gave a description and the backend stores one
    /// ([`LockOptions::description`]).
    pub holder: Option<String>,
    /// Time left before the hold expires unless renewed.
    pub expires_in: Option<Duration>,
    /// The holder's fence, where the store keeps it.
    pub fence: Option<Fence>,
}

impl LockManager {
    /// One attempt, as [`try_lock`](Self::try_lock), that says who holds
    /// the key when it is busy: the holder's description, time left and
    /// fence, read from the store after the failed attempt (where the
    /// backend can inspect holds).
    ///
    /// # Cancel safety
    /// As [`lock`](Self::lock).
    ///
    /// # Errors
    /// As [`try_lock`](Self::try_lock); a failed look at the holder only
    /// leaves the [`Busy`] fields empty.
    pub async fn try_acquire(&self, key: impl AsRef<str>) -> Result<TryAcquire, Error> {
        let key = key.as_ref();
        if let Some(guard) = self.acquire(key, LockOptions::new().no_wait()).await? {
            return Ok(TryAcquire::Acquired(guard));
        }
        Ok(TryAcquire::Busy(self.busy(key).await))
    }

    async fn busy(&self, key: &str) -> Busy {
        let mut busy = Busy {
            key: key.to_string(),
            ..Busy::default()
        };
        let (Ok(lock_key), Some(inspector)) = (LockKey::new(key), self.backend().inspector())
        else {
            return busy;
        };
        match inspector.inspect(&lock_key).await {
            Ok(Some(info)) => {
                busy.holder = info.description;
                busy.expires_in = info.expires_in;
                busy.fence = info.fence;
            }
            Ok(None) => {}
            Err(e) => tracing::debug!(%key, error = %e, "could not read the holder of a busy key"),
        }
        busy
    }

    /// Waits for `key`, runs `f` with a handle on the hold (its key, fence
    /// and lost signal), then releases the lock and returns what `f`
    /// returned. The lock is released however `f` ends: on completion, on
    /// a panic (the guard's drop gives the key back in the background), or
    /// when the returned future is dropped.
    ///
    /// `f` runs to completion even if the lock is lost meanwhile: check
    /// [`LostToken::check`] before each write, pass the fence to the
    /// resource, or use [`with_lock_until_lost`](Self::with_lock_until_lost)
    /// to stop `f` at the loss.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), moltlock_core::Error> {
    /// let manager = moltlock_core::LockManager::new(moltlock_core::MemoryBackend::new());
    /// let fence = manager
    ///     .with_lock("jobs/report", |lock| async move { lock.fence() })
    ///     .await?;
    /// # let _ = fence;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// What acquiring returns ([`lock`](Self::lock)). A failed release is
    /// logged, not returned: `f` has run and its value is kept.
    pub async fn with_lock<F, Fut, T>(&self, key: impl AsRef<str>, f: F) -> Result<T, Error>
    where
        F: FnOnce(LostToken) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.lock(key).await?;
        let value = f(guard.lost_token()).await;
        release_logged(guard, true).await;
        Ok(value)
    }

    /// As [`with_lock`](Self::with_lock), but `f` is cancelled (its future
    /// dropped at its next await point) as soon as the lock is lost, and
    /// the loss is returned as [`Error::Lost`]. The loss is watched by the
    /// same timer as [`LockGuard::lost`], so it fires at the local validity
    /// deadline even while a renewal hangs.
    ///
    /// # Errors
    /// What acquiring returns, or [`Error::Lost`] when the lock was lost
    /// before `f` finished (checked before each poll of `f`, so `f` does not
    /// run on after the loss is seen).
    pub async fn with_lock_until_lost<F, Fut, T>(
        &self,
        key: impl AsRef<str>,
        f: F,
    ) -> Result<T, Error>
    where
        F: FnOnce(LostToken) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.lock(key).await?;
        let token = guard.lost_token();
        let work = f(token.clone());
        let outcome = tokio::select! {
            biased;
            reason = token.lost() => Err(Error::Lost {
                key: guard.key().to_string(),
                reason,
            }),
            value = work => Ok(value),
        };
        release_logged(guard, outcome.is_ok()).await;
        outcome
    }
}

/// Releases `guard`; a failure is logged (the hold expires at its TTL), as
/// a warning when nobody was told of a loss.
async fn release_logged(guard: LockGuard, warn: bool) {
    let key = guard.key().clone();
    match guard.release().await {
        Err(e) if warn => tracing::warn!(%key, error = %e, "release after a scoped lock failed"),
        Err(e) => tracing::debug!(%key, error = %e, "release after a lost scoped lock failed"),
        Ok(()) => {}
    }
}
