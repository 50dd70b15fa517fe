//! The renewal driver: one task per manager renews all of its holds.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::Instrument;

use crate::hold::Hold;
use crate::registry::Inner;
use crate::{metrics, LostReason, RenewItem};

/// How long the driver sleeps when it has nothing scheduled.
const IDLE: Duration = Duration::from_secs(3600);

/// How long the driver stays once the manager holds nothing, before it
/// stops. A manager that takes and releases locks in a loop would otherwise
/// start a driver for nearly every lock: the driver started by one
/// acquisition often first runs after that lock's release, finds nothing
/// and stops, and the next acquisition starts another (a task spawned, a
/// worker thread woken and the registry contended, per lock).
const LINGER: Duration = Duration::from_secs(5);

/// Starts the renewal driver of `inner`'s holds.
pub(crate) fn spawn_driver(inner: &Arc<Inner>) -> tokio::task::JoinHandle<()> {
    inner
        .drivers_started
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    tokio::spawn(drive(Arc::downgrade(inner), inner.wake.clone()))
}

/// Runs until the manager is gone, or has held nothing for [`LINGER`].
async fn drive(inner: Weak<Inner>, wake: Arc<Notify>) {
    loop {
        let notified = wake.notified();
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let Some(next) = round(&inner) else {
            return;
        };
        drop(inner);
        tokio::select! {
            _ = notified => {}
            _ = tokio::time::sleep_until(next) => {}
        }
    }
}

/// One pass: expire overdue holds and, once any hold is due, renew in one
/// batch every hold that would fall due within its next interval. Renewing
/// early only moves an expiry later, and it keeps all holds on one schedule:
/// however scattered their acquisitions, the manager sends one renewal
/// request per interval.
///
/// A batch runs in a task of its own, so a request that hangs never holds up
/// the driver: holds taken meanwhile get their own batches, and every
/// deadline (and its `on_lost` callback) fires by the driver's timer. A hold
/// is in at most one batch at a time. Returns when to look again, or `None`
/// (having cleared the driver slot) when the manager has held nothing
/// since the previous round.
fn round(inner: &Arc<Inner>) -> Option<Instant> {
    let Some(holds) = snapshot(inner) else {
        return linger(inner);
    };
    let now = Instant::now();
    for hold in holds.iter().filter(|h| h.valid_until() <= now) {
        lose_at_deadline(inner, hold);
    }
    let idle: Vec<Arc<Hold>> = holds
        .into_iter()
        .filter(|h| !h.is_lost() && !h.is_renewing())
        .collect();
    if idle.iter().any(|h| h.next_renew() <= now) {
        let due: Vec<Arc<Hold>> = idle
            .into_iter()
            .filter(|h| h.next_renew() <= now + h.interval)
            .collect();
        for hold in &due {
            hold.set_renewing(true);
        }
        tokio::spawn(renew_batch(inner.clone(), due));
    }
    Some(next_wake(inner))
}

/// Renews one batch, then tells the driver to look again.
async fn renew_batch(inner: Arc<Inner>, due: Vec<Arc<Hold>>) {
    let span = tracing::debug_span!(
        "moltlock.renew",
        backend = inner.backend.name(),
        holds = due.len(),
        key = tracing::field::Empty,
        fence = tracing::field::Empty,
    );
    if let [one] = due.as_slice() {
        span.record("key", tracing::field::display(&one.key));
        span.record("fence", one.fence.0);
    }
    renew(&inner, &due).instrument(span).await;
    for hold in &due {
        hold.set_renewing(false);
    }
    inner.wake.notify_one();
}

fn snapshot(inner: &Arc<Inner>) -> Option<Vec<Arc<Hold>>> {
    let mut reg = inner.registry();
    if reg.holds.is_empty() {
        return None;
    }
    reg.idle_since = None;
    Some(reg.holds.values().cloned().collect())
}

/// Nothing held: the driver looks again when it will have held nothing for
/// [`LINGER`] (a hold taken meanwhile and due later needs no wake, see
/// `Inner::register`), and stops then, clearing the driver slot.
fn linger(inner: &Arc<Inner>) -> Option<Instant> {
    let mut reg = inner.registry();
    let now = Instant::now();
    if !reg.holds.is_empty() {
        // Taken since the snapshot: look again at once.
        return Some(now);
    }
    let until = *reg.idle_since.get_or_insert(now) + LINGER;
    if now >= until {
        reg.idle_since = None;
        reg.driver = None;
        reg.scheduled = None;
        return None;
    }
    reg.scheduled = Some(until);
    Some(until)
}

/// Holds past their at-most time are lost and deleted (owner-checked), not
/// renewed; the rest are renewed together.
async fn renew(inner: &Arc<Inner>, due: &[Arc<Hold>]) {
    let sent_at = Instant::now();
    let mut items = Vec::with_capacity(due.len());
    let mut renewed = Vec::with_capacity(due.len());
    for hold in due {
        match hold.ttl_at(sent_at) {
            Some(ttl) => {
                items.push(RenewItem {
                    key: hold.key.clone(),
                    token: hold.token.clone(),
                    ttl,
                });
                renewed.push(hold.clone());
            }
            None => end_at_most(inner, hold),
        }
    }
    let due = renewed;
    let Some(deadline) = due.iter().map(|h| h.valid_until()).min() else {
        return;
    };
    let name = inner.backend.name();
    let backend = &*inner.backend;
    let renewal = async {
        match backend.renewer() {
            Some(batch) => batch.renew_many(&items).await,
            None => crate::forward::renew_each(backend, &items).await,
        }
    };
    crate::ask::spawn_check(&inner.backend, &due);
    let result = tokio::time::timeout_at(deadline, renewal).await;
    match result {
        Ok(Ok(held)) if held.len() == due.len() => {
            metrics::renewed(name, due.len());
            for ((hold, still), item) in due.iter().zip(held).zip(&items) {
                if still {
                    hold.confirm(sent_at, inner.expiry(item.ttl, sent_at));
                } else {
                    inner.finish(hold, LostReason::Refused);
                }
            }
        }
        Ok(Ok(held)) => {
            tracing::warn!(
                asked = due.len(),
                answered = held.len(),
                "renewal answered the wrong number of holds"
            );
            retry_soon(&due);
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, holds = due.len(), "renewal failed; retrying");
            metrics::renew_failed(name);
            retry_soon(&due);
        }
        Err(_) => {
            tracing::warn!(
                holds = due.len(),
                "renewal did not answer before a validity deadline"
            );
            metrics::renew_failed(name);
            for hold in &due {
                lose_at_deadline(inner, hold);
            }
            retry_soon(&due);
        }
    }
}

/// A hold whose at-most time passed: lost, and its key deleted by its token
/// so the next run need not wait for the TTL.
pub(crate) fn end_at_most(inner: &Arc<Inner>, hold: &Hold) {
    if inner.finish(hold, LostReason::AtMost) {
        crate::cleanup::spawn_release(
            inner,
            hold.key.clone(),
            hold.token.clone(),
            Some(hold.fence),
            crate::cleanup::Again::on_error_for(hold),
        );
    }
}

/// A hold whose validity deadline passed: lost at its at-most time when
/// that is what ended it, else at the deadline.
pub(crate) fn lose_at_deadline(inner: &Arc<Inner>, hold: &Hold) {
    if hold.at_most_reached(Instant::now()) {
        end_at_most(inner, hold);
    } else {
        inner.finish(hold, LostReason::Deadline);
    }
}

fn retry_soon(due: &[Arc<Hold>]) {
    let now = Instant::now();
    for hold in due {
        let step = (hold.interval / 6).max(Duration::from_millis(20));
        hold.set_next_renew(now + step);
    }
}

fn next_wake(inner: &Arc<Inner>) -> Instant {
    let mut reg = inner.registry();
    let now = Instant::now();
    let next = reg
        .holds
        .values()
        .filter(|h| !h.is_lost())
        .map(|h| match h.is_renewing() {
            true => h.valid_until(),
            false => h.next_renew().min(h.valid_until()),
        })
        .min()
        .unwrap_or(now + IDLE)
        .max(now + Duration::from_millis(1));
    reg.scheduled = Some(next);
    next
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::atomic::Ordering;

    use super::*;
    use crate::{LockManager, MemoryBackend};

    /// A manager that takes and releases one lock after another starts one
    /// driver, not one per lock: each driver here first runs after the
    /// lock that started it was released.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_lock_loop_keeps_one_driver() {
        let manager = LockManager::new(MemoryBackend::new());
        for _ in 0..50 {
            let guard = manager.lock("loop").await.unwrap();
            guard.release().await.unwrap();
            tokio::task::yield_now().await;
        }
        let started = manager.inner().drivers_started.load(Ordering::Relaxed);
        assert_eq!(started, 1, "{started} drivers for 50 locks");
    }

    /// Once nothing has been held for a while the driver stops, and the
    /// next lock starts another that renews it.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn an_idle_driver_stops_and_a_new_one_renews() {
        let manager = LockManager::new(MemoryBackend::new());
        let guard = manager.lock("idle").await.unwrap();
        guard.release().await.unwrap();
        tokio::time::sleep(LINGER * 3).await;
        assert!(
            manager.inner().registry().driver.is_none(),
            "the driver outlived {:?} of holding nothing",
            LINGER * 3
        );
        let guard = manager.lock("idle").await.unwrap();
        let ttl = manager.inner().cfg.ttl;
        tokio::time::sleep(ttl * 3).await;
        assert!(
            guard.is_held(),
            "the lock taken after the idle stop was not renewed"
        );
        assert_eq!(manager.inner().drivers_started.load(Ordering::Relaxed), 2);
    }
}
