//! A blocking API for callers without an async runtime, as
//! `std::sync::Mutex` users expect: each call blocks the calling thread.
//!
//! A [`blocking::LockManager`](LockManager) owns a small tokio runtime of
//! its own (one worker thread) on which the store's client, the renewal of
//! every hold and the lost-lock timers run, so holds stay renewed while the
//! calling thread does its (synchronous) work. Build the backend inside
//! that runtime with [`LockManager::start`], since store clients bind their
//! connections to the runtime they are made on.
//!
//! Do not call it from inside an async runtime: every call then fails with
//! [`Error::Config`] (blocking a runtime's thread would stall it); use the
//! async [`crate::LockManager`] there.
//!
//! ```
//! use moltlock_core::{blocking, LockManager, MemoryBackend};
//!
//! # fn main() -> Result<(), moltlock_core::Error> {
//! let manager = blocking::LockManager::start(async { Ok(LockManager::new(MemoryBackend::new())) })?;
//! let guard = manager.lock("jobs/nightly")?;
//! println!("writing with fence {}", guard.fence());
//! guard.release()?;
//! # Ok(()) }
//! ```

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Runtime;

use crate::{Busy, Error, Fence, LockKey, LockOptions, LostReason, LostToken, Token};

/// Owns the runtime; on the last drop it lets best-effort releases finish
/// (up to the manager's release timeout) before shutting down.
struct Engine {
    runtime: Option<Runtime>,
    release_timeout: Duration,
}

impl Engine {
    fn block_on<F: Future>(&self, fut: F) -> Result<F::Output, Error> {
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(Error::Config(
                "the blocking API was called inside an async runtime: use the async LockManager there"
                    .into(),
            ));
        }
        match &self.runtime {
            Some(rt) => Ok(rt.block_on(fut)),
            None => Err(Error::Config("the blocking runtime is shut down".into())),
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let Some(rt) = self.runtime.take() else {
            return;
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            rt.shutdown_background();
            return;
        }
        rt.block_on(crate::wait_for_cleanups(self.release_timeout));
    }
}

/// A lock manager whose calls block the calling thread. Cheap to clone;
/// clones share one runtime and one renewal driver.
#[derive(Clone)]
pub struct LockManager {
    // Dropped first: the backend goes while the runtime still runs.
    manager: crate::LockManager,
    engine: Arc<Engine>,
}

impl fmt::Debug for LockManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("blocking::LockManager")
            .field(&self.manager)
            .finish()
    }
}

/// What [`LockManager::try_acquire`] found.
#[derive(Debug)]
#[must_use = "an acquired guard releases the lock when dropped"]
pub enum TryAcquire {
    /// The key was free: it is now held.
    Acquired(LockGuard),
    /// The key is held elsewhere.
    Busy(Busy),
}

impl LockManager {
    /// Starts the runtime and builds the async manager on it with `make`
    /// (connect the backend inside it).
    ///
    /// # Errors
    /// [`Error::Config`] when called inside an async runtime, or when the
    /// runtime cannot start; what `make` returns.
    pub fn start<F>(make: F) -> Result<Self, Error>
    where
        F: Future<Output = Result<crate::LockManager, Error>>,
    {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("moltlock-blocking")
            .enable_all()
            .build()
            .map_err(|e| Error::Config(format!("the blocking runtime could not start: {e}")))?;
        let mut engine = Engine {
            runtime: Some(runtime),
            release_timeout: Duration::from_secs(5),
        };
        let manager = engine.block_on(make)??;
        engine.release_timeout = manager.inner().cfg.release_timeout;
        Ok(Self {
            engine: Arc::new(engine),
            manager,
        })
    }

    /// The async manager behind this one (for code that has a runtime).
    pub fn manager(&self) -> &crate::LockManager {
        &self.manager
    }

    fn guard(&self, guard: crate::LockGuard) -> LockGuard {
        LockGuard::new(guard, self.engine.clone())
    }

    /// Blocks until `key` is acquired.
    ///
    /// # Errors
    /// As [`crate::LockManager::lock`].
    pub fn lock(&self, key: impl AsRef<str>) -> Result<LockGuard, Error> {
        let guard = self.engine.block_on(self.manager.lock(key))??;
        Ok(self.guard(guard))
    }

    /// Blocks at most `timeout` for `key`.
    ///
    /// # Errors
    /// [`Error::Timeout`], or as [`lock`](Self::lock).
    pub fn lock_timeout(
        &self,
        key: impl AsRef<str>,
        timeout: Duration,
    ) -> Result<LockGuard, Error> {
        let guard = self
            .engine
            .block_on(self.manager.lock_timeout(key, timeout))??;
        Ok(self.guard(guard))
    }

    /// One attempt: the guard, or `None` when `key` is held elsewhere.
    ///
    /// # Errors
    /// As [`crate::LockManager::try_lock`].
    pub fn try_lock(&self, key: impl AsRef<str>) -> Result<Option<LockGuard>, Error> {
        let guard = self.engine.block_on(self.manager.try_lock(key))??;
        Ok(guard.map(|g| self.guard(g)))
    }

    /// One attempt that says who holds the key when it is busy.
    ///
    /// # Errors
    /// As [`crate::LockManager::try_acquire`].
    pub fn try_acquire(&self, key: impl AsRef<str>) -> Result<TryAcquire, Error> {
        let found = self.engine.block_on(self.manager.try_acquire(key))??;
        Ok(match found {
            crate::TryAcquire::Acquired(g) => TryAcquire::Acquired(self.guard(g)),
            crate::TryAcquire::Busy(busy) => TryAcquire::Busy(busy),
        })
    }

    /// Acquires `key` with explicit options; `None` only with
    /// [`LockOptions::no_wait`].
    ///
    /// # Errors
    /// As [`crate::LockManager::acquire`].
    pub fn acquire(
        &self,
        key: impl AsRef<str>,
        opts: LockOptions,
    ) -> Result<Option<LockGuard>, Error> {
        let guard = self.engine.block_on(self.manager.acquire(key, opts))??;
        Ok(guard.map(|g| self.guard(g)))
    }

    /// Blocks until `key` is acquired, runs `f` on this thread with the
    /// guard (renewed meanwhile), releases, and returns what `f` returned.
    /// A panic in `f` unwinds through here; the guard's drop releases the
    /// key first.
    ///
    /// # Errors
    /// As [`lock`](Self::lock). A failed release is logged, not returned.
    pub fn with_lock<T>(
        &self,
        key: impl AsRef<str>,
        f: impl FnOnce(&LockGuard) -> T,
    ) -> Result<T, Error> {
        let guard = self.lock(key)?;
        let value = f(&guard);
        let key = guard.key().clone();
        if let Err(e) = guard.release() {
            tracing::warn!(%key, error = %e, "release after a scoped lock failed");
        }
        Ok(value)
    }
}

/// A held lock whose release blocks. Renewed in the background while it
/// lives; dropped, it releases the lock before the drop returns (bounded by
/// the manager's release timeout).
#[must_use = "dropping the guard releases the lock at once"]
#[clippy::has_significant_drop]
pub struct LockGuard {
    /// The async guard, until it is released.
    guard: Option<crate::LockGuard>,
    token: Token,
    lost: LostToken,
    engine: Arc<Engine>,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("blocking::LockGuard")
            .field("key", self.key())
            .field("fence", &self.fence())
            .field("held", &self.is_held())
            .finish()
    }
}

impl LockGuard {
    fn new(guard: crate::LockGuard, engine: Arc<Engine>) -> Self {
        Self {
            token: guard.token().clone(),
            lost: guard.lost_token(),
            guard: Some(guard),
            engine,
        }
    }

    /// The key held.
    pub fn key(&self) -> &LockKey {
        self.lost.key()
    }

    /// The owner token of this hold.
    pub fn token(&self) -> &Token {
        &self.token
    }

    /// The fencing token: pass it with every write to the guarded resource.
    pub fn fence(&self) -> Fence {
        self.lost.fence()
    }

    /// Whether the hold is still valid in this process's view.
    pub fn is_held(&self) -> bool {
        !self.lost.is_lost()
    }

    /// Time left before the local validity deadline, unless renewed.
    pub fn valid_for(&self) -> Option<Duration> {
        self.lost.valid_for()
    }

    /// The fence, if the hold is still valid; use it right before a write.
    ///
    /// # Errors
    /// [`Error::Lost`] once the hold is lost or past its deadline.
    pub fn check(&self) -> Result<Fence, Error> {
        self.lost.check()
    }

    /// A cloneable handle on the lost signal, for another thread or task.
    pub fn lost_token(&self) -> LostToken {
        self.lost.clone()
    }

    /// Blocks until the hold is lost, or `timeout` passed (`None`).
    ///
    /// # Errors
    /// [`Error::Config`] inside an async runtime.
    pub fn wait_lost(&self, timeout: Duration) -> Result<Option<LostReason>, Error> {
        let token = self.lost.clone();
        let waited = self
            .engine
            .block_on(async move { tokio::time::timeout(timeout, token.lost()).await })?;
        Ok(waited.ok())
    }

    /// Stops renewal and deletes the hold (owner-checked), blocking until
    /// the store answered.
    ///
    /// # Errors
    /// As [`crate::LockGuard::release`]; [`Error::Config`] inside an async
    /// runtime (the hold is then released in the background).
    pub fn release(mut self) -> Result<(), Error> {
        let Some(guard) = self.guard.take() else {
            return Ok(());
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            // Released in the background on this manager's runtime.
            if let Some(rt) = &self.engine.runtime {
                let _entered = rt.enter();
                drop(guard);
            }
            return Err(Error::Config(
                "the blocking API was called inside an async runtime: the lock is released in the background"
                    .into(),
            ));
        }
        self.engine.block_on(guard.release())?
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let Some(guard) = self.guard.take() else {
            return;
        };
        let Some(rt) = &self.engine.runtime else {
            return;
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            let _entered = rt.enter();
            drop(guard);
            return;
        }
        let limit = self.engine.release_timeout;
        let key = guard.key().clone();
        let done = rt.block_on(async move { tokio::time::timeout(limit, guard.release()).await });
        if !matches!(done, Ok(Ok(()))) {
            tracing::debug!(%key, "the release of a dropped blocking guard did not complete");
        }
    }
}
