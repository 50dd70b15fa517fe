//! The lock manager: acquiring, waiting, and the registry of held locks.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::cleanup::PendingAcquire;
use crate::clock::StepListener;
use crate::hold::{Grant, Hold};
use crate::{
    check_ttl, metrics, Backend, CasOutcome, Error, Held, Limits, LockGuard, LockKey, LostReason,
    ReleaseWatch, RetryPolicy, Token,
};

/// What the lost-lock callback is told.
#[derive(Clone, Debug)]
pub struct LostEvent {
    /// The key that was lost.
    pub key: LockKey,
    /// The fence of the lost hold.
    pub fence: crate::Fence,
    /// Why it was lost.
    pub reason: LostReason,
}

/// How many times in a row an acquire retries at once after the store
/// answered with the caller's own hold, before it backs off as usual.
const SELF_HELD_RETRIES: u32 = 3;

type LostCallback = Arc<dyn Fn(&LostEvent) + Send + Sync>;

#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) ttl: Duration,
    pub(crate) drift: f64,
    pub(crate) retry: RetryPolicy,
    pub(crate) on_lost: Option<LostCallback>,
    pub(crate) release_timeout: Duration,
}

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

/// Options for one acquisition.
#[derive(Clone, Debug, Default)]
pub struct LockOptions {
    ttl: Option<Duration>,
    timeout: Option<Duration>,
    no_wait: bool,
    fair: bool,
    description: Option<String>,
}

impl LockOptions {
    /// Wait as long as it takes, with the manager's TTL.
    pub fn new() -> Self {
        Self::default()
    }

    /// The TTL of this hold.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Give up with [`Error::Timeout`] after waiting this long.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Try once and return `None` when the key is held elsewhere.
    pub fn no_wait(mut self) -> Self {
        self.no_wait = true;
        self
    }

    /// Store this description with the hold (host, pid, command, since
    /// when: who holds it, for `inspect`, `list` and `moltlock status`),
    /// where the backend stores descriptions
    /// ([`Backend::describer`](crate::Backend::describer)); elsewhere it is left out. At most
    /// [`MAX_DESCRIPTION_LEN`](crate::MAX_DESCRIPTION_LEN) bytes, no control
    /// characters. Costs one more round trip after the acquisition.
    pub fn description(mut self, text: impl Into<String>) -> Self {
        self.description = Some(text.into());
        self
    }

    /// Wait in the backend's first-come, first-served queue (backends with
    /// [`Backend::fair_queue`](crate::Backend::fair_queue) only).
    pub fn fair(mut self) -> Self {
        self.fair = true;
        self
    }
}

#[derive(Default)]
pub(crate) struct Registry {
    pub(crate) holds: HashMap<u64, Arc<Hold>>,
    pub(crate) driver: Option<JoinHandle<()>>,
    /// When the driver means to look next; a new hold due later needs no wake.
    pub(crate) scheduled: Option<Instant>,
}

pub(crate) struct Inner {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) limits: Limits,
    pub(crate) cfg: Config,
    pub(crate) registry: Mutex<Registry>,
    pub(crate) wake: Arc<Notify>,
    next_id: AtomicU64,
    /// Forward steps of the store's clock: when each was seen, and its size.
    steps: Mutex<Vec<(Instant, Duration)>>,
    /// Kept alive here; the store clock holds it weakly.
    _on_step: Option<Arc<StepListener>>,
    /// The runtime the manager was built or first acquired on, for releases
    /// asked for on a thread without one (a guard or an acquire future
    /// dropped there). Every hold is taken inside an acquire, so it is set
    /// before any release can be asked for.
    pub(crate) runtime: std::sync::OnceLock<tokio::runtime::Handle>,
}

/// Steps remembered for confirmations still in flight.
const STEPS_KEPT: usize = 64;

impl Inner {
    fn new(backend: Arc<dyn Backend>, cfg: Config) -> Arc<Self> {
        Arc::new_cyclic(|me: &std::sync::Weak<Inner>| {
            let on_step = backend.store_clock().map(|clock| {
                let me = me.clone();
                let listener: Arc<StepListener> = Arc::new(move |step: Duration| {
                    if let Some(inner) = me.upgrade() {
                        inner.store_clock_stepped(step);
                    }
                });
                clock.subscribe(&listener);
                listener
            });
            Inner {
                limits: backend.limits(),
                backend,
                cfg,
                registry: Mutex::new(Registry::default()),
                wake: Arc::new(Notify::new()),
                next_id: AtomicU64::new(1),
                steps: Mutex::default(),
                _on_step: on_step,
                runtime: tokio::runtime::Handle::try_current()
                    .map(std::sync::OnceLock::from)
                    .unwrap_or_default(),
            }
        })
    }

    /// The store's clock stepped forward by `step`: every hold expires that
    /// much sooner in the store, so each loses that much validity now and
    /// is renewed at once.
    fn store_clock_stepped(&self, step: Duration) {
        {
            let mut steps = lock(&self.steps);
            steps.push((Instant::now(), step));
            let extra = steps.len().saturating_sub(STEPS_KEPT);
            steps.drain(..extra);
        }
        let holds: Vec<Arc<Hold>> = self.registry().holds.values().cloned().collect();
        for hold in holds {
            hold.shorten(step);
        }
        self.wake.notify_one();
    }

    /// The store's expiry for a hold written by a request sent at
    /// `sent_at`, less every clock step seen since the request was sent (a
    /// reply may have been written before the step).
    pub(crate) fn expiry(&self, ttl: Duration, sent_at: Instant) -> Instant {
        let expiry = self.backend.earliest_expiry(ttl, sent_at);
        let stepped: Duration = lock(&self.steps)
            .iter()
            .filter(|(seen, _)| *seen > sent_at)
            .map(|(_, step)| *step)
            .sum();
        expiry.checked_sub(stepped).unwrap_or(sent_at)
    }

    pub(crate) fn registry(&self) -> MutexGuard<'_, Registry> {
        match self.registry.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Removes the hold from renewal and, if it was not lost before, records why.
    pub(crate) fn finish(&self, hold: &Hold, reason: LostReason) {
        let marked = hold.mark_lost(reason.clone());
        if marked || reason == LostReason::Released {
            self.registry().holds.remove(&hold.id);
        }
        if !marked {
            return;
        }
        if reason == LostReason::Released {
            metrics::released(self.backend.name(), hold.acquired_at.elapsed());
            return;
        }
        tracing::warn!(key = %hold.key, fence = %hold.fence, %reason, "lock lost");
        metrics::lost(self.backend.name());
        if let Some(cb) = &self.cfg.on_lost {
            cb(&LostEvent {
                key: hold.key.clone(),
                fence: hold.fence,
                reason,
            });
        }
    }

    fn register(self: &Arc<Self>, hold: Hold) -> Arc<Hold> {
        let hold = Arc::new(hold);
        let mut reg = self.registry();
        reg.holds.insert(hold.id, hold.clone());
        let running = reg.driver.as_ref().is_some_and(|h| !h.is_finished());
        if !running {
            reg.scheduled = None;
            reg.driver = Some(tokio::spawn(crate::renew::drive(
                Arc::downgrade(self),
                self.wake.clone(),
            )));
        }
        let due = hold.next_renew().min(hold.valid_until());
        let wake = reg.scheduled.is_none_or(|at| due < at);
        drop(reg);
        if wake {
            self.wake.notify_one();
        }
        hold
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
            inner: Inner::new(Arc::new(backend), default_config()),
        }
    }

    /// A builder over `backend` (a backend, or a shared one, as
    /// [`new`](Self::new)).
    pub fn builder(backend: impl Backend) -> LockManagerBuilder {
        LockManagerBuilder {
            backend: Arc::new(backend),
            cfg: default_config(),
        }
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
    /// Cancel safe: dropping the future at any point leaves no hold behind
    /// that nobody can release. If it is dropped while an acquire request is
    /// in flight, a best-effort owner-checked delete is spawned; without a
    /// runtime to run it, the hold lives only until its TTL.
    pub async fn lock(&self, key: impl AsRef<str>) -> Result<LockGuard, Error> {
        let guard = self.acquire(key, LockOptions::new()).await?;
        guard.ok_or_else(|| Error::store(self.inner.backend.name(), "no hold returned", false))
    }

    /// Waits at most `timeout` for `key`, then fails with [`Error::Timeout`].
    /// Cancel safe, as [`lock`](Self::lock).
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
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn try_lock(&self, key: impl AsRef<str>) -> Result<Option<LockGuard>, Error> {
        self.acquire(key, LockOptions::new().no_wait()).await
    }

    /// Acquires `key` with explicit options. Returns `None` only with
    /// [`LockOptions::no_wait`]. Cancel safe, as [`lock`](Self::lock).
    pub async fn acquire(
        &self,
        key: impl AsRef<str>,
        opts: LockOptions,
    ) -> Result<Option<LockGuard>, Error> {
        let key = LockKey::new(key.as_ref())?;
        key.check_len(self.inner.limits.max_key_len)?;
        if self.inner.runtime.get().is_none() {
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                let _ = self.inner.runtime.set(handle);
            }
        }
        let ttl = opts.ttl.unwrap_or(self.inner.cfg.ttl);
        check_ttl(ttl, self.inner.limits.min_ttl)?;
        if let Some(text) = &opts.description {
            crate::check_description(text)?;
        }
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

    /// Stores the holder description, where the backend can; a failure only
    /// costs the description.
    async fn describe(&self, guard: &LockGuard, text: &str) {
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
            return self.acquire_fair(key, ttl).await.map(Some);
        }
        let backend = &self.inner.backend;
        // Subscribe before the first attempt, so a release between a failed
        // attempt and the wait is never missed and a busy key costs no extra
        // round trip. Backends register watches locally (the store-side
        // subscription is shared per backend), so this is cheap.
        let mut watch = if opts.no_wait {
            None
        } else {
            self.open_watch(key).await
        };
        let mut attempt = 0u32;
        loop {
            let token = Token::random();
            let mut pending = PendingAcquire::new(self.inner.clone(), key, &token);
            let sent_at = Instant::now();
            match backend.cas(key, None, &token, ttl).await {
                Ok(CasOutcome::Acquired { fence }) => {
                    // A clock step seen meanwhile may have cut the grant short.
                    let Some(sent_at) = self.confirm_late_grant(key, &token, ttl, sent_at).await?
                    else {
                        pending.disarm();
                        continue;
                    };
                    pending.disarm();
                    tracing::debug!(%key, %fence, waited = ?started.elapsed(), "lock acquired");
                    return Ok(Some(self.guard(key, token, fence, ttl, sent_at)));
                }
                Ok(CasOutcome::Held(held)) if held.holder.as_ref() == Some(&token) => {
                    // Our own request applied twice (a client that re-sent it
                    // after a lost reply): the hold is ours, but its fence is
                    // unknown. Give it back and try again at once.
                    tracing::debug!(%key, "the store answered with our own hold; retrying");
                    if backend.delete(key, &token).await.is_ok() {
                        pending.disarm();
                    }
                    drop(pending);
                    if attempt >= SELF_HELD_RETRIES {
                        self.pause(&mut watch, &held, attempt).await;
                    }
                }
                Ok(CasOutcome::Held(held)) => {
                    pending.disarm();
                    if opts.no_wait {
                        return Ok(None);
                    }
                    self.pause(&mut watch, &held, attempt).await;
                }
                Err(e) if e.is_retryable() && !opts.no_wait => {
                    tracing::debug!(%key, error = %e, "acquire attempt failed; retrying");
                    drop(pending);
                    tokio::time::sleep(self.inner.cfg.retry.delay(attempt)).await;
                }
                Err(e) => return Err(e),
            }
            attempt = attempt.saturating_add(1);
        }
    }

    async fn acquire_fair(&self, key: &LockKey, ttl: Duration) -> Result<LockGuard, Error> {
        let backend = &*self.inner.backend;
        let queue = crate::extension::require(backend.name(), backend.fair_queue(), "fair queue")?;
        loop {
            let token = Token::random();
            let mut pending = PendingAcquire::new(self.inner.clone(), key, &token);
            // The store may start the TTL at any point of the call, so the
            // validity deadline counts from before it, as on every path.
            let sent_at = Instant::now();
            let fence = queue.fair_acquire(key, &token, ttl).await?;
            match self.confirm_late_grant(key, &token, ttl, sent_at).await {
                Ok(Some(sent_at)) => {
                    pending.disarm();
                    return Ok(self.guard(key, token, fence, ttl, sent_at));
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
    async fn confirm_late_grant(
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

    async fn open_watch(&self, key: &LockKey) -> Option<Box<dyn ReleaseWatch>> {
        let watcher = self.inner.backend.watcher()?;
        match watcher.watch(key).await {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::debug!(%key, error = %e, "no release watch; polling instead");
                None
            }
        }
    }

    /// Sleeps until a release notification, the holder's expiry, or the retry delay.
    async fn pause(&self, watch: &mut Option<Box<dyn ReleaseWatch>>, held: &Held, attempt: u32) {
        let mut delay = self.inner.cfg.retry.delay(attempt);
        if let Some(left) = held.expires_in {
            delay = delay.min(left + Duration::from_millis(1));
        }
        let Some(w) = watch.as_mut() else {
            tokio::time::sleep(delay).await;
            return;
        };
        tokio::select! {
            r = w.released(held) => if let Err(e) = r {
                tracing::debug!(error = %e, "release watch failed; polling instead");
                *watch = None;
            },
            _ = tokio::time::sleep(delay) => {}
        }
    }

    fn guard(
        &self,
        key: &LockKey,
        token: Token,
        fence: crate::Fence,
        ttl: Duration,
        sent_at: Instant,
    ) -> LockGuard {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let expiry = self.inner.expiry(ttl, sent_at);
        let grant = Grant {
            key: key.clone(),
            token,
            fence,
            ttl,
        };
        let hold = Hold::new(id, grant, self.inner.cfg.drift, sent_at, expiry);
        let hold = self.inner.register(hold);
        LockGuard::new(self.inner.clone(), hold)
    }
}

fn default_config() -> Config {
    Config {
        ttl: Duration::from_secs(30),
        drift: 0.02,
        retry: RetryPolicy::default(),
        on_lost: None,
        release_timeout: Duration::from_secs(5),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}
