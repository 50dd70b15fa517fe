//! The store's wall clock, as its replies report it: a forward step of that
//! clock expires holds early, so the manager shortens its deadlines at once.
//!
//! A store whose holds expire by its own wall clock (Postgres `now()`,
//! Redis `PX`, SQLite's process clock) reports, with each reply that
//! confirms a hold, the clock reading that judged it. Each reading bounds
//! the store's offset from this process's monotonic clock: it was taken
//! between the request's send and the reply. While the clock runs steadily
//! the bounds agree; a reading whose lower bound lies above the tightest
//! upper bound seen — by more than 10 ms plus 1,000 ppm of the time since
//! (room for NTP slewing) — is a forward step, of at most the difference.
//! Every hold on the store loses that much of its validity at once, and is
//! renewed at once. A step is seen only by the next reply from the store,
//! so up to one renewal interval can pass before the manager knows; the
//! observed-expiry mode of the SQL backends needs no wall clock at all.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;

/// Called with the size of each forward step.
pub(crate) type StepListener = dyn Fn(Duration) + Send + Sync;

/// Readings of one store's wall clock. A backend makes one, feeds it with
/// [`observe`](Self::observe) and hands it out from
/// [`Backend::store_clock`](crate::Backend::store_clock).
pub struct StoreClock {
    anchor: Instant,
    best: Mutex<Option<Bound>>,
    listeners: Mutex<Vec<Weak<StepListener>>>,
}

/// The tightest upper bound of the offset (store µs − local µs) and when it
/// was taken.
#[derive(Clone, Copy)]
struct Bound {
    high: i128,
    at: Instant,
}

impl Default for StoreClock {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for StoreClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreClock").finish_non_exhaustive()
    }
}

impl StoreClock {
    /// No readings yet.
    pub fn new() -> Self {
        Self {
            anchor: Instant::now(),
            best: Mutex::new(None),
            listeners: Mutex::new(Vec::new()),
        }
    }

    /// A reply to a request sent at `sent_at`, received just now, reported
    /// the store's clock as `store_time` since the Unix epoch.
    pub fn observe(&self, sent_at: Instant, store_time: Duration) {
        let now = Instant::now();
        let store = i128::try_from(store_time.as_micros()).unwrap_or(i128::MAX);
        let local = |t: Instant| i128::try_from((t - self.anchor).as_micros()).unwrap_or(0);
        let (low, high) = (store - local(now), store - local(sent_at));
        let step = {
            let mut best = lock(&self.best);
            let step = best.and_then(|b| {
                let since = i128::try_from((now - b.at).as_micros()).unwrap_or(i128::MAX);
                let allowance = 10_000 + since / 1000;
                (low > b.high.saturating_add(allowance)).then(|| high - b.high)
            });
            match (*best, step) {
                (Some(b), None) if high >= b.high => {}
                _ => *best = Some(Bound { high, at: now }),
            }
            step
        };
        if let Some(step) = step {
            let step = Duration::from_micros(u64::try_from(step).unwrap_or(u64::MAX));
            tracing::warn!(?step, "the store's clock stepped forward");
            self.notify(step);
        }
    }

    /// Calls `listener` on every forward step while it lives.
    pub(crate) fn subscribe(&self, listener: &Arc<StepListener>) {
        let mut listeners = lock(&self.listeners);
        listeners.retain(|l| l.strong_count() > 0);
        listeners.push(Arc::downgrade(listener));
    }

    /// Passes every forward step of `from` on to `to` while the returned
    /// listener is kept (a quorum's clock, from its members').
    pub(crate) fn relay(to: &Arc<StoreClock>, from: &StoreClock) -> Arc<StepListener> {
        let to = Arc::downgrade(to);
        let relay: Arc<StepListener> = Arc::new(move |step| {
            if let Some(c) = to.upgrade() {
                c.notify(step);
            }
        });
        from.subscribe(&relay);
        relay
    }

    fn notify(&self, step: Duration) {
        let live: Vec<Arc<StepListener>> = lock(&self.listeners)
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for listener in live {
            listener(step);
        }
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    fn unix(secs: u64, ms: u64) -> Duration {
        Duration::from_secs(secs) + Duration::from_millis(ms)
    }

    #[tokio::test(start_paused = true)]
    async fn steady_readings_are_no_step_and_a_jump_is() {
        let clock = StoreClock::new();
        let seen = Arc::new(AtomicU64::new(0));
        let s = seen.clone();
        let listener: Arc<StepListener> =
            Arc::new(move |d: Duration| s.store(d.as_millis() as u64, Ordering::Relaxed));
        clock.subscribe(&listener);
        let base = 1_800_000_000;
        for i in 0..10u64 {
            let sent = Instant::now();
            tokio::time::sleep(Duration::from_millis(2)).await;
            clock.observe(sent, unix(base, i * 1002 + 1));
            tokio::time::sleep(Duration::from_millis(1000)).await;
        }
        assert_eq!(
            seen.load(Ordering::Relaxed),
            0,
            "a steady clock was taken for a step"
        );
        let sent = Instant::now();
        tokio::time::sleep(Duration::from_millis(2)).await;
        clock.observe(sent, unix(base + 10, 10 * 1002 + 1));
        let step = seen.load(Ordering::Relaxed);
        assert!((10_000..=10_010).contains(&step), "step {step} ms");
        // A step backwards shortens nothing.
        seen.store(0, Ordering::Relaxed);
        clock.observe(Instant::now(), unix(base, 0));
        assert_eq!(seen.load(Ordering::Relaxed), 0);
    }
}
