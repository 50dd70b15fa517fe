//! The multi-lock section: `lock_all` of a few distinct keys, one task,
//! uncontended, once with the backend as it is (its own `cas_multi` where
//! it has one) and once with `cas_multi` hidden, so the core's fallback of
//! one `cas` per key is measured on the same store in the same run.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use moltlock::{Backend, CasMulti, Forward, LockManager, LockOptions};
use serde::Serialize;

use crate::counting::Counting;
use crate::primitives::{held, rate_cells, request_cells, warm_loop, Hold, PrimResult, Take};
use crate::stats::ratio;
use crate::target::Target;
use crate::workload::{Bounds, Holding};

/// Key sets each task rotates over, so the store does not fill up.
const SETS_PER_TASK: u64 = 16;

/// A backend with its `cas_multi` hidden (everything else forwarded), so
/// the manager takes several keys one `cas` at a time.
pub struct NoBatch(Arc<dyn Backend>);

impl NoBatch {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Backend>) -> Self {
        Self(inner)
    }
}

impl Forward for NoBatch {
    type Inner = dyn Backend;

    fn inner(&self) -> &dyn Backend {
        &*self.0
    }

    fn batch_cas(&self) -> Option<&dyn CasMulti> {
        None
    }
}

/// `lock_all` as measured on one backend.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LockAllResult {
    /// Keys per `lock_all`.
    pub keys: usize,
    /// Whether the backend hands out `cas_multi` (`Backend::batch_cas`).
    pub cas_multi: bool,
    /// The most keys its `cas_multi` takes at once, where it is limited.
    pub max_keys: Option<u64>,
    /// The backend as it is.
    pub as_is: PrimResult,
    /// The backend with `cas_multi` hidden: one `cas` per key.
    pub hidden: PrimResult,
    /// As is ÷ hidden, in cycles per second.
    pub speedup: f64,
}

/// `lock_all` of fresh keys by one manager.
struct AllTake {
    manager: LockManager,
    target: Target,
    label: &'static str,
    keys: usize,
}

#[async_trait]
impl Take for AllTake {
    async fn take(
        &self,
        task: usize,
        cycle: u64,
        wait: Duration,
    ) -> Result<Option<Box<dyn Holding>>, String> {
        let set = cycle % SETS_PER_TASK;
        let keys: Vec<String> = (0..self.keys)
            .map(|j| {
                let name = format!("{}-{task}-{set}-{j}", self.label);
                self.target.key("lock-all", name)
            })
            .collect();
        let opts = LockOptions::new().timeout(wait);
        held(
            self.manager.lock_all(&keys, opts).await.map(Some),
            Hold::All,
        )
    }
}

/// Measures `lock_all` of `keys` keys, as is and with `cas_multi` hidden.
///
/// # Errors
/// Connection, acquire or release errors, as text.
pub async fn lock_all(t: &Target, keys: usize, bounds: Bounds) -> Result<LockAllResult, String> {
    let backend = t.backend().await?;
    let batch = backend.batch_cas();
    let max_keys = batch
        .map(|b| b.max_keys())
        .filter(|n| *n != usize::MAX)
        .map(|n| n as u64);
    let cas_multi = batch.is_some();
    let as_is = measure(t, backend.clone(), "as-is", keys, bounds).await?;
    let hidden_backend = Arc::new(NoBatch::new(backend));
    let hidden = measure(t, hidden_backend, "hidden", keys, bounds).await?;
    Ok(LockAllResult {
        keys,
        cas_multi,
        max_keys,
        speedup: ratio(as_is.cycles.per_sec, hidden.cycles.per_sec),
        as_is,
        hidden,
    })
}

async fn measure(
    t: &Target,
    backend: Arc<dyn Backend>,
    label: &'static str,
    keys: usize,
    bounds: Bounds,
) -> Result<PrimResult, String> {
    let (counting, counts) = Counting::new(backend);
    let manager = LockManager::builder(counting)
        .build()
        .map_err(|e| e.to_string())?;
    let take: Arc<dyn Take> = Arc::new(AllTake {
        manager,
        target: t.clone(),
        label,
        keys: keys.max(1),
    });
    warm_loop(&[take], bounds, &counts).await
}

/// What the backend's `cas_multi` is, in words.
fn batch_words(r: &LockAllResult) -> String {
    match (r.cas_multi, r.max_keys) {
        (false, _) => "none".to_owned(),
        (true, Some(n)) if (n as usize) < r.keys => format!("native, ≤ {n} keys (not used)"),
        (true, Some(n)) => format!("native, ≤ {n} keys"),
        (true, None) => "native".to_owned(),
    }
}

/// The markdown table of the section, one pair of rows per backend.
pub fn table<'a>(s: &mut String, rows: impl IntoIterator<Item = (&'a str, &'a LockAllResult)>) {
    let rows: Vec<_> = rows.into_iter().collect();
    let Some((_, first)) = rows.first() else {
        return;
    };
    let _ = writeln!(
        s,
        "### lock_all of {} keys (1 task, uncontended; requests per acquisition)\n\n\
         | backend | cas_multi | measured | cycles/s | p50 µs | p99 µs | requests | acquire | delete | × hidden |\n\
         |---|---|---|---:|---:|---:|---:|---|---:|---:|",
        first.keys
    );
    for (store, r) in rows {
        let as_is = if r.cas_multi {
            "as is (cas_multi)"
        } else {
            "as is (one cas per key)"
        };
        let _ = writeln!(
            s,
            "| {store} | {} | {as_is} | {} | {} | {:.2} |",
            batch_words(r),
            rate_cells(&r.as_is),
            request_cells(&r.as_is),
            r.speedup
        );
        let _ = writeln!(
            s,
            "| {store} | hidden | cas_multi hidden (one cas per key) | {} | {} | 1.00 |",
            rate_cells(&r.hidden),
            request_cells(&r.hidden)
        );
    }
    s.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a backend with `cas_multi` (memory), the section measures one
    /// `cas_multi` per acquisition as is, and one `cas` per key hidden.
    #[tokio::test]
    async fn measures_the_batch_and_its_fallback() -> Result<(), String> {
        let t = Target::new("sqlite:///unused.db", "unit")?;
        let backend: Arc<dyn Backend> = Arc::new(moltlock::MemoryBackend::new());
        let bounds = Bounds {
            duration: Duration::from_millis(100),
            max_cycles: 50,
        };
        let as_is = measure(&t, backend.clone(), "as-is", 4, bounds).await?;
        let hidden = measure(&t, Arc::new(NoBatch::new(backend)), "hidden", 4, bounds).await?;
        assert!(as_is.cycles.cycles > 0 && hidden.cycles.cycles > 0);
        let (a, h) = (as_is.requests, hidden.requests);
        assert_eq!((a.cas_multi, a.cas, a.delete), (1.0, 0.0, 4.0));
        assert_eq!((h.cas_multi, h.cas, h.delete), (0.0, 4.0, 4.0));
        Ok(())
    }
}
