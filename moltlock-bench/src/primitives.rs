//! The loop under the semaphore and multi-lock sections: tasks that take a
//! primitive and give it back at once, until the bounds are reached. Next
//! to throughput and latency it records the store requests each
//! acquisition cost (through a [`Counting`](crate::counting::Counting)
//! wrapper) and the waits that ran out. Each measured loop follows a short
//! warm-up whose figures are dropped. (There is no overlap check here: a
//! primitive given back at once is held for no time by the client's clock;
//! the contended section checks exclusion, with a hold.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use moltlock::{Error, LockGuard, MultiGuard, Permit};
use serde::Serialize;
use tokio::time::Instant;

use crate::counting::{CountReader, Counts};
use crate::stats::{ratio, Summary};
use crate::workload::{Bounds, Holding, LoopResult};

/// How long past the budget a waiter may still wait before it gives up
/// (and counts as a timeout).
pub const GRACE: Duration = Duration::from_secs(5);

/// Something that can wait for a primitive.
#[async_trait]
pub trait Take: Send + Sync {
    /// Waits at most `wait` for the primitive, for cycle `cycle` of task
    /// `task`; `None` when the wait ran out.
    async fn take(
        &self,
        task: usize,
        cycle: u64,
        wait: Duration,
    ) -> Result<Option<Box<dyn Holding>>, String>;
}

/// A held primitive of any kind.
pub enum Hold {
    /// A plain lock.
    Mutex(LockGuard),
    /// A semaphore's permit.
    Permit(Permit),
    /// Several keys held together.
    All(MultiGuard),
}

#[async_trait]
impl Holding for Hold {
    async fn release(self: Box<Self>) -> Result<(), String> {
        let done = match *self {
            Hold::Mutex(g) => g.release().await,
            Hold::Permit(p) => p.release().await,
            Hold::All(m) => m.release().await,
        };
        done.map_err(|e| e.to_string())
    }
}

/// A waited-for guard as a boxed hold; a timeout is `None`.
pub fn held<G>(
    got: Result<Option<G>, Error>,
    wrap: fn(G) -> Hold,
) -> Result<Option<Box<dyn Holding>>, String> {
    match got {
        Ok(Some(g)) => Ok(Some(Box::new(wrap(g)))),
        Ok(None) | Err(Error::Timeout { .. }) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// Store requests per acquisition, as the manager issued them.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct PerAcquisition {
    /// Single-key `cas` calls.
    pub cas: f64,
    /// `cas_multi` calls (several keys in one request).
    pub cas_multi: f64,
    /// `inspect` and `list` calls (a semaphore's permit-count check).
    pub inspect: f64,
    /// `delete` calls (releases, and keys given back).
    pub delete: f64,
    /// Batch renewal rounds.
    pub renew_many: f64,
    /// The requests that acquire: `cas` + `cas_multi` + `inspect`.
    pub acquire: f64,
    /// Every request.
    pub total: f64,
}

impl PerAcquisition {
    /// The counts `c`, divided by `n` acquisitions.
    pub fn of(c: &Counts, n: u64) -> Self {
        let per = |v: u64| ratio(v as f64, n as f64);
        Self {
            cas: per(c.cas),
            cas_multi: per(c.cas_multi),
            inspect: per(c.inspect),
            delete: per(c.delete),
            renew_many: per(c.renew_many),
            acquire: per(c.cas + c.cas_multi + c.inspect),
            total: per(c.requests()),
        }
    }
}

/// One loop over a primitive.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct PrimResult {
    /// Cycles (acquire + release), their rate and latency.
    pub cycles: LoopResult,
    /// Store requests per acquisition.
    pub requests: PerAcquisition,
    /// Waits that ran out.
    pub timeouts: u64,
}

/// The longest warm-up before a measured loop.
const WARM_UP: Duration = Duration::from_millis(300);

/// [`run_loop`] after a short loop whose figures are dropped (a tenth of
/// the budget, at most 300 ms and 32 cycles per task), so that
/// whichever configuration runs first does not also pay for opening
/// connections and preparing statements.
///
/// # Errors
/// The first acquire or release error of either loop.
pub async fn warm_loop(
    takers: &[Arc<dyn Take>],
    bounds: Bounds,
    counts: &CountReader,
) -> Result<PrimResult, String> {
    let warm = Bounds {
        duration: (bounds.duration / 10).min(WARM_UP),
        max_cycles: bounds.max_cycles.min(32 * takers.len().max(1) as u64),
    };
    run_loop(takers, warm, counts).await?;
    run_loop(takers, bounds, counts).await
}

/// Runs one task per taker, each taking and releasing at once, until the
/// bounds are reached; `counts` is read before and after.
///
/// # Errors
/// The first acquire or release error.
pub async fn run_loop(
    takers: &[Arc<dyn Take>],
    bounds: Bounds,
    counts: &CountReader,
) -> Result<PrimResult, String> {
    let tasks = takers.len().max(1);
    let per_task = (bounds.max_cycles / tasks as u64).max(1);
    let timeouts = Arc::new(AtomicU64::new(0));
    let before = counts.get();
    let started = Instant::now();
    let deadline = started + bounds.duration;
    let mut handles = Vec::with_capacity(tasks);
    for (task, take) in takers.iter().enumerate() {
        let (take, timeouts) = (take.clone(), timeouts.clone());
        handles.push(tokio::spawn(async move {
            task_loop(task, take, &timeouts, per_task, deadline).await
        }));
    }
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.map_err(|e| e.to_string())??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let spent = counts.get().since(&before);
    let n = all.len() as u64;
    Ok(PrimResult {
        cycles: LoopResult {
            tasks,
            cycles: n,
            per_sec: ratio(n as f64, elapsed),
            latency: Summary::of(&mut all),
        },
        requests: PerAcquisition::of(&spent, n),
        timeouts: timeouts.load(Ordering::Relaxed),
    })
}

async fn task_loop(
    task: usize,
    take: Arc<dyn Take>,
    timeouts: &AtomicU64,
    per_task: u64,
    deadline: Instant,
) -> Result<Vec<Duration>, String> {
    let mut out = Vec::with_capacity(per_task.min(100_000) as usize);
    let mut i = 0u64;
    while i < per_task && Instant::now() < deadline {
        let t0 = Instant::now();
        let wait = deadline.saturating_duration_since(t0) + GRACE;
        let Some(h) = take.take(task, i, wait).await? else {
            timeouts.fetch_add(1, Ordering::Relaxed);
            break;
        };
        h.release().await?;
        out.push(t0.elapsed());
        i += 1;
    }
    Ok(out)
}

/// `cycles/s` as a table cell, with p50 and p99 latency.
pub fn rate_cells(r: &PrimResult) -> String {
    let l = &r.cycles.latency;
    format!(
        "{:.0} | {:.0} | {:.0}",
        r.cycles.per_sec, l.p50_us, l.p99_us
    )
}

/// Requests per acquisition as table cells: total, acquire, delete.
pub fn request_cells(r: &PrimResult) -> String {
    let q = &r.requests;
    format!(
        "{:.2} | {:.2} ({:.2} cas + {:.2} cas_multi + {:.2} list) | {:.2}",
        q.total, q.acquire, q.cas, q.cas_multi, q.inspect, q.delete
    )
}
