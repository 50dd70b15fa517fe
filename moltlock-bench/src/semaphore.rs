//! The semaphore section: acquire + release cycles of one
//! `semaphore(name, permits)` with one task and with many (more tasks
//! than permits), next to a plain lock's lock + release cycles on one key
//! with the same tasks, on the same store in the same run. Every task has
//! its own manager and connection, as separate processes would; all of
//! them count their store requests into one sum.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use moltlock::{LockManager, LockOptions, Semaphore};
use serde::Serialize;

use crate::counting::{CountReader, Counting};
use crate::primitives::{held, rate_cells, request_cells, warm_loop, Hold, PrimResult, Take};
use crate::stats::ratio;
use crate::target::Target;
use crate::workload::{Bounds, Holding};

/// One task count, both primitives.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SemaphoreRun {
    /// Tasks taking the primitive.
    pub tasks: usize,
    /// A plain lock on one key.
    pub mutex: PrimResult,
    /// The semaphore.
    pub semaphore: PrimResult,
    /// Semaphore ÷ mutex, in cycles per second.
    pub ratio: f64,
}

/// The semaphore as measured on one backend.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SemaphoreResult {
    /// Its permits.
    pub permits: u32,
    /// Whether the backend hands out `cas_multi` (`Backend::batch_cas`).
    pub cas_multi: bool,
    /// One task first, then many.
    pub runs: Vec<SemaphoreRun>,
}

/// A plain lock on one key.
struct MutexTake {
    manager: LockManager,
    key: String,
}

#[async_trait]
impl Take for MutexTake {
    async fn take(
        &self,
        _task: usize,
        _cycle: u64,
        wait: Duration,
    ) -> Result<Option<Box<dyn Holding>>, String> {
        let opts = LockOptions::new().timeout(wait);
        held(self.manager.acquire(&self.key, opts).await, Hold::Mutex)
    }
}

/// A permit of one semaphore.
struct PermitTake(Semaphore);

#[async_trait]
impl Take for PermitTake {
    async fn take(
        &self,
        _task: usize,
        _cycle: u64,
        wait: Duration,
    ) -> Result<Option<Box<dyn Holding>>, String> {
        let opts = LockOptions::new().timeout(wait);
        held(self.0.acquire_with(opts).await, Hold::Permit)
    }
}

/// `n` managers, each over its own connection, counting into one sum.
async fn managers(t: &Target, n: usize) -> Result<(Vec<LockManager>, CountReader), String> {
    let (first, counts) = Counting::new(t.backend().await?);
    let mut out = vec![build(first)?];
    for _ in 1..n {
        out.push(build(Counting::sharing(t.backend().await?, &counts))?);
    }
    Ok((out, counts))
}

fn build(backend: Counting) -> Result<LockManager, String> {
    LockManager::builder(backend)
        .build()
        .map_err(|e| e.to_string())
}

/// Measures a semaphore of `permits` permits and a plain lock with one
/// task and with `contenders` tasks.
///
/// # Errors
/// Connection, acquire or release errors, as text.
pub async fn semaphore(
    t: &Target,
    permits: u32,
    contenders: usize,
    bounds: Bounds,
) -> Result<SemaphoreResult, String> {
    let n = contenders.max(1);
    let (all, counts) = managers(t, n).await?;
    let cas_multi = all
        .first()
        .is_some_and(|m| m.backend().batch_cas().is_some());
    let mut runs = Vec::new();
    let mut sizes = vec![1, n];
    sizes.dedup();
    for tasks in sizes {
        let mine = all.get(..tasks).unwrap_or(&all);
        let run = measure(t, mine, permits, bounds, &counts).await?;
        runs.push(run);
    }
    Ok(SemaphoreResult {
        permits,
        cas_multi,
        runs,
    })
}

async fn measure(
    t: &Target,
    managers: &[LockManager],
    permits: u32,
    bounds: Bounds,
    counts: &CountReader,
) -> Result<SemaphoreRun, String> {
    let tasks = managers.len();
    let key = t.key("sem-mutex", tasks);
    let locks: Vec<Arc<dyn Take>> = managers
        .iter()
        .map(|m| {
            let manager = m.clone();
            Arc::new(MutexTake {
                manager,
                key: key.clone(),
            }) as Arc<dyn Take>
        })
        .collect();
    let mutex = warm_loop(&locks, bounds, counts).await?;
    let name = t.key("semaphore", tasks);
    let mut sems: Vec<Arc<dyn Take>> = Vec::with_capacity(tasks);
    for m in managers {
        let sem = m.semaphore(&name, permits).map_err(|e| e.to_string())?;
        sems.push(Arc::new(PermitTake(sem)));
    }
    let semaphore = warm_loop(&sems, bounds, counts).await?;
    Ok(SemaphoreRun {
        tasks,
        ratio: ratio(semaphore.cycles.per_sec, mutex.cycles.per_sec),
        mutex,
        semaphore,
    })
}

/// The markdown table of the section: per backend and task count, the
/// plain lock's row, then the semaphore's.
pub fn table<'a>(s: &mut String, rows: impl IntoIterator<Item = (&'a str, &'a SemaphoreResult)>) {
    let rows: Vec<_> = rows.into_iter().collect();
    let Some((_, first)) = rows.first() else {
        return;
    };
    let _ = writeln!(
        s,
        "### Semaphore of {} permits next to a plain lock (cycles/s; requests per acquisition)\n\n\
         | backend | cas_multi | tasks | primitive | cycles/s | p50 µs | p99 µs | requests | acquire | delete | ÷ lock | timeouts |\n\
         |---|---|---:|---|---:|---:|---:|---:|---|---:|---:|---:|",
        first.permits
    );
    for (store, r) in rows {
        let batch = if r.cas_multi { "native" } else { "none" };
        for run in &r.runs {
            let lock = ("lock (one key)".to_owned(), &run.mutex, 1.0);
            let sem = (
                format!("semaphore({})", r.permits),
                &run.semaphore,
                run.ratio,
            );
            for (what, p, x) in [lock, sem] {
                let _ = writeln!(
                    s,
                    "| {store} | {batch} | {} | {what} | {} | {} | {x:.2} | {} |",
                    run.tasks,
                    rate_cells(p),
                    request_cells(p),
                    p.timeouts
                );
            }
        }
    }
    s.push('\n');
}
