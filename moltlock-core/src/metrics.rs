//! Counters and histograms for operators, through the `metrics` facade when
//! the `metrics` feature is on; no-ops otherwise. Labelled by backend, never
//! by key (keys are unbounded).
//!
//! | name | kind | meaning |
//! |---|---|---|
//! | `moltlock_acquire_total{backend,outcome}` | counter | acquisitions: `acquired`, `busy`, `timeout`, `error` |
//! | `moltlock_wait_seconds{backend}` | histogram | time from asking to holding |
//! | `moltlock_hold_seconds{backend}` | histogram | time from acquiring to releasing |
//! | `moltlock_renewals_total{backend}` | counter | holds renewed |
//! | `moltlock_renewal_failures_total{backend}` | counter | renewal rounds that failed |
//! | `moltlock_lost_total{backend}` | counter | holds lost |

use std::time::Duration;

use crate::Error;

#[cfg(feature = "metrics")]
pub(crate) fn acquire_outcome(
    backend: &'static str,
    outcome: &Result<Option<impl Sized>, Error>,
    waited: Duration,
) {
    let label = match outcome {
        Ok(Some(_)) => "acquired",
        Ok(None) => "busy",
        Err(Error::Timeout { .. }) => "timeout",
        Err(_) => "error",
    };
    metrics::counter!("moltlock_acquire_total", "backend" => backend, "outcome" => label)
        .increment(1);
    if matches!(outcome, Ok(Some(_))) {
        metrics::histogram!("moltlock_wait_seconds", "backend" => backend)
            .record(waited.as_secs_f64());
    }
}

#[cfg(not(feature = "metrics"))]
pub(crate) fn acquire_outcome(
    _backend: &'static str,
    _outcome: &Result<Option<impl Sized>, Error>,
    _waited: Duration,
) {
}

#[cfg(feature = "metrics")]
pub(crate) fn released(backend: &'static str, held: Duration) {
    metrics::histogram!("moltlock_hold_seconds", "backend" => backend).record(held.as_secs_f64());
}

#[cfg(not(feature = "metrics"))]
pub(crate) fn released(_backend: &'static str, _held: Duration) {}

#[cfg(feature = "metrics")]
pub(crate) fn renewed(backend: &'static str, count: usize) {
    metrics::counter!("moltlock_renewals_total", "backend" => backend).increment(count as u64);
}

#[cfg(not(feature = "metrics"))]
pub(crate) fn renewed(_backend: &'static str, _count: usize) {}

#[cfg(feature = "metrics")]
pub(crate) fn renew_failed(backend: &'static str) {
    metrics::counter!("moltlock_renewal_failures_total", "backend" => backend).increment(1);
}

#[cfg(not(feature = "metrics"))]
pub(crate) fn renew_failed(_backend: &'static str) {}

#[cfg(feature = "metrics")]
pub(crate) fn lost(backend: &'static str) {
    metrics::counter!("moltlock_lost_total", "backend" => backend).increment(1);
}

#[cfg(not(feature = "metrics"))]
pub(crate) fn lost(_backend: &'static str) {}
