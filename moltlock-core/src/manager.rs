//! The lock manager: acquiring and waiting. The holds it keeps live in
//! the registry ([`crate::registry`]).

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::cleanup::PendingAcquire;
use crate::guard::LockGuard;
use crate::hold::{Grant, Hold};
use crate::job::Terms;
use crate::options::LockOptions;
use crate::registry::{Config, Inner, LostEvent};
use crate::{
    check_ttl, metrics, Backend, CasOutcome, Error, LockKey, MultiMode, ReleaseWatch, RetryPolicy,
    Token,
};

/// Builds a [`LockManager`]. Defaults: TTL 30 s, renewal every TTL/3, clock
/// drift allowance 2 %, exponential backoff with jitter (10 ms to 1 s),
/// best-effort release on drop within 5 s.
pub struct LockManagerBuilder {
    backend: Arc<dyn Backend>,
    cfg: Config,
}

impl LockManagerBuilder {
    /// The TTL of every hold unless [`LockOptions::ttl`] says otherwise.
    /// Holds are renewed every TTL/3 while their guard lives.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.cfg.ttl = ttl;
        self
    }

    /// The clock-drift allowance: a hold is trusted locally for
    /// `ttl × (1 − drift)` after the request that confirmed it was sent.
    /// Clamped to 0..=0.5.
    pub fn drift(mut self, drift: f64) -> Self {
        self.cfg.drift = if drift.is_finite() {
            drift.clamp(0.0, 0.5)
        } else {
            0.02
        };
        self
    }

    /// How waiters back off between attempts when no notification wakes them.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.cfg.retry = policy;
        self
    }

    /// Called once for every hold that is lost (not for releases).
    pub fn on_lost(mut self, f: impl Fn(&LostEvent) + Send + Sync + 'static) -> Self {
        self.cfg.on_lost = Some(Arc::new(f));
        self
    }

    /// How long the best-effort release spawned by a dropped guard may take.
    pub fn release_timeout(mut self, timeout: Duration) -> Self {
        self.cfg.release_timeout = timeout;
        self
    }

    /// Checks the settings and builds the manager.
    ///
    /// # Errors
    /// [`Error::InvalidTtl`] when the default TTL is out of range for the backend.
    pub fn build(self) -> Result<LockManager, Error> {
        check_ttl(self.cfg.ttl, self.backend.limits().min_ttl)?;
        Ok(LockManager {
            inner: Inner::new(self.backend, self.cfg),
        })
    }
}

/// Acquires locks through one [`Backend`] and keeps them renewed while their
/// guards live. Cheap to clone; clones share one renewal driver.
#[derive(Clone)]
pub struct LockManager {
    inner: Arc<Inner>,
}

impl fmt::Debug for LockManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockManager")
            .field("backend", &self.inner.backend.name())
            .field("ttl", &self.inner.cfg.ttl)
            .finish_non_exhaustive()
    }
}

impl LockManager {
    /// A manager with default settings over `backend` (a backend, or a
    /// shared one: `Arc<dyn Backend>` and `Box<dyn Backend>` are backends).
    pub fn new(backend: impl Backend) -> Self {
        Self {
            inner: Inner::new(Arc::new(backend), Config::default()),
        }
    }

    /// A builder over `backend` (a backend, or a shared one, as
    /// [`new`](Self::new)).
    pub fn builder(backend: impl Backend) -> LockManagerBuilder {
        LockManagerBuilder {
            backend: Arc::new(backend),
            cfg: Config::default(),
        }
    }

    /// The shared state of this manager.
    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }

    /// The retry policy's delay before retry number `attempt`.
    pub(crate) fn retry_delay(&self, attempt: u32) -> Duration {
        self.inner.cfg.retry.delay(attempt)
    }

    /// The backend behind this manager.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.inner.backend
    }

    /// The default TTL of this manager's holds.
    pub fn ttl(&self) -> Duration {
        self.inner.cfg.ttl
    }

    /// How many holds this manager is renewing now.
    pub fn held_count(&self) -> usize {
        self.inner.registry().holds.len()
    }

    /// Waits until `key` is acquired.
    ///
    /// Locks are not reentrant: a second `lock` of a key this manager (or
    /// this very task) already holds waits like any other caller, until the
    /// first guard is released or lost.
    ///
    /// # Cancel safety
    /// Dropping the future at any point leaves no hold behind that nobody
    /// can release. If it is dropped while an acquire request is in flight,
    /// an owner-checked delete is spawned and repeated until the backend's
    /// late-write bound has passed; it runs on the runtime the manager
    /// first acquired on, so it runs even when the future is dropped off a
    /// runtime.
    pub async fn lock(&self, key: impl AsRef<str>) -> Result<LockGuard, Error> {
        let guard = self.acquire(key, LockOptions::new()).await?;
        guard.ok_or_else(|| Error::store(self.inner.backend.name(), "no hold returned", false))
    }

    /// Waits at most `timeout` for `key`, then fails with [`Error::Timeout`].
    ///
    /// # Cancel safety
    /// As [`lock`](Self::lock); a timeout is a drop of the attempt in flight
    /// and is cleaned up the same way.
    pub async fn lock_timeout(
        &self,
        key: impl AsRef<str>,
        timeout: Duration,
    ) -> Result<LockGuard, Error> {
        let guard = self
            .acquire(key, LockOptions::new().timeout(timeout))
            .await?;
        guard.ok_or_else(|| Error::store(self.inner.backend.name(), "no hold returned", false))
    }

    /// One attempt: the guard, or `None` when `key` is held elsewhere.
    ///
    /// # Cancel safety
    /// As [`lock`](Self::lock).
    pub async fn try_lock(&self, key: impl AsRef<str>) -> Result<Option<LockGuard>, Error> {
        self.acquire(key, LockOptions::new().no_wait()).await
    }

    /// Acquires `key` with explicit options. Returns `None` only with
    /// [`LockOptions::no_wait`].
    ///
    /// # Cancel safety
    /// As [`lock`](Self::lock). A fair acquisition dropped while it waits
    /// leaves the backend's queue (the [`FairQueue`](crate::FairQueue)
    /// contract), and a grant that lands as it is dropped is deleted.
    pub async fn acquire(
        &self,
        key: impl AsRef<str>,
        opts: LockOptions,
    ) -> Result<Option<LockGuard>, Error> {
        let key = self.user_key(key.as_ref(), 0)?;
        let ttl = self.checked_ttl(&opts)?;
        let span = tracing::debug_span!(
            "moltlock.acquire",
            %key,
            backend = self.inner.backend.name(),
            ttl = ?ttl,
            fence = tracing::field::Empty,
        );
        let got = self
            .acquire_key(key, ttl, opts)
            .instrument(span.clone())
            .await;
        if let Ok(Some(guard)) = &got {
            span.record("fence", guard.fence().0);
        }
        got
    }

    async fn acquire_key(
        &self,
        key: LockKey,
        ttl: Duration,
        opts: LockOptions,
    ) -> Result<Option<LockGuard>, Error> {
        let started = Instant::now();
        let fut = self.acquire_loop(&key, ttl, &opts, started);
        let outcome = match opts.timeout {
            Some(t) => match tokio::time::timeout(t, fut).await {
                Ok(r) => r,
                Err(_) => Err(Error::Timeout {
                    key: key.to_string(),
                    waited: started.elapsed(),
                }),
            },
            None => fut.await,
        };
        metrics::acquire_outcome(self.inner.backend.name(), &outcome, started.elapsed());
        if let (Ok(Some(guard)), Some(text)) = (&outcome, &opts.description) {
            self.describe(guard, text).await;
        }
        outcome
    }

    /// Checks a caller's key: valid, not a derived one, and with `room`
    /// bytes to spare under the backend's key limit.
    pub(crate) fn user_key(&self, key: &str, room: usize) -> Result<LockKey, Error> {
        let key = LockKey::new(key)?;
        key.check_not_reserved()?;
        let limit = self.inner.limits.max_key_len;
        if room > 0 && key.as_str().len() + room > limit {
            let reason = format!(
                "the name is {} bytes; its derived keys need {room} more, and the backend's limit is {limit}",
                key.as_str().len()
            );
            return Err(Error::invalid_key(key.as_str(), reason));
        }
        key.check_len(limit)?;
        Ok(key)
    }

    /// The TTL of an acquisition, checked with its description, and the
    /// runtime noted for releases asked for off a runtime.
    pub(crate) fn checked_ttl(&self, opts: &LockOptions) -> Result<Duration, Error> {
        if self.inner.runtime.get().is_none() {
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                let _ = self.inner.runtime.set(handle);
            }
        }
        let ttl = opts.ttl.unwrap_or(self.inner.cfg.ttl);
        check_ttl(ttl, self.inner.limits.min_ttl)?;
        opts.job.check()?;
        if let Some(text) = &opts.description {
            crate::check_description(text)?;
        }
        Ok(ttl)
    }

    /// Stores the holder description, where the backend can; a failure only
    /// costs the description.
    pub(crate) async fn describe(&self, guard: &LockGuard, text: &str) {
        let Some(describer) = self.inner.backend.describer() else {
            return;
        };
        let done = describer.describe(guard.key(), guard.token(), text).await;
        if let Err(e) = done {
            tracing::debug!(key = %guard.key(), error = %e, "the holder description was not stored");
        }
    }

    async fn acquire_loop(
        &self,
        key: &LockKey,
        ttl: Duration,
        opts: &LockOptions,
        started: Instant,
    ) -> Result<Option<LockGuard>, Error> {
        if opts.fair {
            if opts.no_wait {
                return Err(Error::Config(
                    "a fair acquisition waits in the queue: no_wait (one attempt) is not available in fair mode".into(),
                ));
            }
            if !opts.job.is_none() {
                return Err(Error::Config(
                    "at_most and at_least are not available in fair mode".into(),
                ));
            }
            return self.acquire_fair(key, ttl).await.map(Some);
        }
        let terms = Terms { ttl, job: opts.job };
        // One key is a set of one: the same attempt, wait and cleanup as
        // the primitives' (a set of one key goes to the store as one `cas`).
        // Waiters queue in the manager, so only one of them asks the store.
        let keys = std::slice::from_ref(key);
        let got = if opts.no_wait {
            self.acquire_set(keys, MultiMode::All, terms, true, None)
                .await?
        } else {
            self.acquire_queued(key, terms).await?
        };
        let guard = got.and_then(|mut g| g.pop());
        if let Some(g) = &guard {
            tracing::debug!(%key, fence = %g.fence(), waited = ?started.elapsed(), "lock acquired");
        }
        Ok(guard)
    }

    async fn acquire_fair(&self, key: &LockKey, ttl: Duration) -> Result<LockGuard, Error> {
        let backend = &*self.inner.backend;
        let queue = crate::forward::require(backend.name(), backend.fair_queue(), "fair queue")?;
        loop {
            let token = Token::random();
            let keys = std::slice::from_ref(key);
            let mut pending = PendingAcquire::new(self.inner.clone(), keys, &token, false);
            // The store may start the TTL at any point of the call, so the
            // validity deadline counts from before it, as on every path.
            let sent_at = Instant::now();
            let fence = queue.acquire(key, &token, ttl).await?;
            match self.confirm_late_grant(key, &token, ttl, sent_at).await {
                Ok(Some(sent_at)) => {
                    pending.disarm();
                    return Ok(self.guard(key, token, fence, ttl.into(), (sent_at, sent_at)));
                }
                Ok(None) => {
                    pending.disarm();
                    tracing::debug!(%key, "fair grant expired before it was confirmed; queueing again");
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// A grant whose call took long (a long wait in the queue), or that a
    /// step of the store's clock cut short, may have little validity left:
    /// renew it at once. Returns the instant the
    /// confirming request was sent, or `None` when the hold is gone.
    pub(crate) async fn confirm_late_grant(
        &self,
        key: &LockKey,
        token: &Token,
        ttl: Duration,
        sent_at: Instant,
    ) -> Result<Option<Instant>, Error> {
        let expiry = self.inner.expiry(ttl, sent_at);
        let left = expiry.saturating_duration_since(Instant::now());
        if left.mul_f64(1.0 - self.inner.cfg.drift) > ttl / 3 {
            return Ok(Some(sent_at));
        }
        let renew_at = Instant::now();
        match self.inner.backend.cas(key, Some(token), token, ttl).await? {
            CasOutcome::Acquired { .. } => Ok(Some(renew_at)),
            CasOutcome::Held(_) => Ok(None),
        }
    }

    pub(crate) async fn open_watch(&self, key: &LockKey) -> Option<Box<dyn ReleaseWatch>> {
        let watcher = self.inner.backend.watcher()?;
        match watcher.watch(key).await {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::debug!(%key, error = %e, "no release watch; polling instead");
                None
            }
        }
    }

    pub(crate) fn guard(
        &self,
        key: &LockKey,
        token: Token,
        fence: crate::Fence,
        terms: Terms,
        (first_sent, sent_at): (Instant, Instant),
    ) -> LockGuard {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let expiry = self.inner.expiry(terms.first_ttl(), sent_at);
        let grant = Grant {
            key: key.clone(),
            token,
            fence,
            terms,
        };
        let hold = Hold::new(
            id,
            grant,
            self.inner.cfg.drift,
            (first_sent, sent_at),
            expiry,
        );
        let hold = self
            .inner
            .register(hold, || crate::renew::spawn_driver(&self.inner));
        LockGuard::new(self.inner.clone(), hold)
    }
}
