//! The registry of holds one manager keeps: the shared state that the
//! manager, its guards, the renewal driver and cleanup all use.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::clock::StepListener;
use crate::hold::Hold;
use crate::{metrics, Backend, Limits, LockKey, LostReason, RetryPolicy};

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

pub(crate) type LostCallback = Arc<dyn Fn(&LostEvent) + Send + Sync>;

#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) ttl: Duration,
    pub(crate) drift: f64,
    pub(crate) retry: RetryPolicy,
    pub(crate) on_lost: Option<LostCallback>,
    pub(crate) release_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(30),
            drift: 0.02,
            retry: RetryPolicy::default(),
            on_lost: None,
            release_timeout: Duration::from_secs(5),
        }
    }
}

#[derive(Default)]
pub(crate) struct Registry {
    pub(crate) holds: HashMap<u64, Arc<Hold>>,
    pub(crate) driver: Option<JoinHandle<()>>,
    /// When the driver means to look next; a new hold due later needs no wake.
    pub(crate) scheduled: Option<Instant>,
    /// Since when the driver has found nothing held (it stops after
    /// holding nothing for a while).
    pub(crate) idle_since: Option<Instant>,
    /// How many of the holds are of each key.
    per_key: HashMap<LockKey, usize>,
}

impl Registry {
    fn add(&mut self, hold: &Arc<Hold>) {
        if self.holds.insert(hold.id, hold.clone()).is_none() {
            *self.per_key.entry(hold.key.clone()).or_default() += 1;
        }
    }

    fn remove(&mut self, hold: &Hold) {
        if self.holds.remove(&hold.id).is_none() {
            return;
        }
        if let Some(n) = self.per_key.get_mut(&hold.key) {
            *n -= 1;
            if *n == 0 {
                self.per_key.remove(&hold.key);
            }
        }
    }

    /// Whether this manager holds `key` (a guard of it lives, not lost).
    pub(crate) fn holds_key(&self, key: &LockKey) -> bool {
        self.per_key.contains_key(key)
    }
}

pub(crate) struct Inner {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) limits: Limits,
    pub(crate) cfg: Config,
    pub(crate) registry: Mutex<Registry>,
    pub(crate) wake: Arc<Notify>,
    pub(crate) next_id: AtomicU64,
    /// How many renewal drivers this manager started.
    pub(crate) drivers_started: AtomicU64,
    /// The waiters of each key, in the order they asked.
    pub(crate) queues: crate::queue::Queues,
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
    pub(crate) fn new(backend: Arc<dyn Backend>, cfg: Config) -> Arc<Self> {
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
                drivers_started: AtomicU64::new(0),
                queues: crate::queue::Queues::default(),
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

    /// Its owner gave the hold up: it leaves renewal, and nothing that ends
    /// it later (a renewal refused in flight) counts as a loss.
    pub(crate) fn release(&self, hold: &Hold) {
        self.registry().remove(hold);
        if hold.mark_released() {
            metrics::released(self.backend.name(), hold.acquired_at.elapsed());
        }
    }

    /// The hold was lost: it leaves renewal and, unless it was lost or
    /// released before, the loss is recorded and reported.
    pub(crate) fn finish(&self, hold: &Hold, reason: LostReason) -> bool {
        if !hold.mark_lost(reason.clone()) {
            return false;
        }
        self.registry().remove(hold);
        self.queues.freed(&hold.key);
        tracing::warn!(key = %hold.key, fence = %hold.fence, %reason, "lock lost");
        metrics::lost(self.backend.name());
        if let Some(cb) = &self.cfg.on_lost {
            cb(&LostEvent {
                key: hold.key.clone(),
                fence: hold.fence,
                reason,
            });
        }
        true
    }

    /// Adds the hold to renewal; `start_driver` starts the renewal driver
    /// when none runs.
    pub(crate) fn register(
        &self,
        hold: Hold,
        start_driver: impl FnOnce() -> JoinHandle<()>,
    ) -> Arc<Hold> {
        let hold = Arc::new(hold);
        let mut reg = self.registry();
        reg.add(&hold);
        let running = reg.driver.as_ref().is_some_and(|h| !h.is_finished());
        if !running {
            reg.scheduled = None;
            reg.idle_since = None;
            reg.driver = Some(start_driver());
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}
