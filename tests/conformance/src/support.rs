//! Test helpers: a partition switch, a fenced resource and an overlap detector.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use moltlock_core::{
    async_trait, Backend, BackendExt, CasMulti, CasOutcome, Describe, Error, FairQueue, Fence,
    Forward, HolderInfo, Inspect, LockKey, MultiMode, MultiOutcome, RaiseFence, ReleaseWatch,
    RenewItem, RenewMany, Token, Watch,
};
use tokio::sync::Notify;

mod requests;

pub use requests::{Delay, Duplicating};

/// Wraps a backend with a switch that makes every call hang, as if the
/// client were cut off from the store or paused; healing lets calls through.
/// It also records the size of every batch renewal it passes on.
#[derive(Clone)]
pub struct Partition {
    inner: Arc<dyn Backend>,
    cut: Arc<AtomicBool>,
    healed: Arc<Notify>,
    renewals: Arc<Mutex<Vec<usize>>>,
}

impl Partition {
    /// A partition switch over `inner`, closed (calls go through).
    pub fn new(inner: Arc<dyn Backend>) -> Self {
        Self {
            inner,
            cut: Arc::new(AtomicBool::new(false)),
            healed: Arc::new(Notify::new()),
            renewals: Arc::default(),
        }
    }

    /// How many holds each `renew_many` call so far carried, in order.
    pub fn renewal_batches(&self) -> Vec<usize> {
        self.renewals.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// From now on every call hangs until [`heal`](Self::heal).
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }

    /// Lets calls through again.
    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
        self.healed.notify_waiters();
    }

    async fn gate(&self) {
        loop {
            let healed = self.healed.notified();
            if !self.cut.load(Ordering::SeqCst) {
                return;
            }
            healed.await;
        }
    }
}

#[async_trait]
impl Forward for Partition {
    type Inner = dyn Backend;

    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }

    async fn cas(
        &self,
        key: &LockKey,
        expected: Option<&Token>,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error> {
        self.gate().await;
        self.inner.cas(key, expected, new, ttl).await
    }

    async fn delete(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        self.gate().await;
        self.inner.delete(key, owner).await
    }

    fn watcher(&self) -> Option<&dyn Watch> {
        self.inner.watcher().map(|_| self as _)
    }

    fn inspector(&self) -> Option<&dyn Inspect> {
        self.inner.inspector().map(|_| self as _)
    }

    fn renewer(&self) -> Option<&dyn RenewMany> {
        self.inner.renewer().map(|_| self as _)
    }

    fn describer(&self) -> Option<&dyn Describe> {
        self.inner.describer().map(|_| self as _)
    }

    fn fence_raiser(&self) -> Option<&dyn RaiseFence> {
        self.inner.fence_raiser().map(|_| self as _)
    }

    fn fair_queue(&self) -> Option<&dyn FairQueue> {
        self.inner.fair_queue().map(|_| self as _)
    }

    fn batch_cas(&self) -> Option<&dyn CasMulti> {
        self.inner.batch_cas().map(|_| self as _)
    }
}

#[async_trait]
impl CasMulti for Partition {
    async fn cas_multi(
        &self,
        keys: &[LockKey],
        token: &Token,
        ttl: Duration,
        mode: MultiMode,
    ) -> Result<MultiOutcome, Error> {
        self.gate().await;
        self.inner.cas_multi(keys, token, ttl, mode).await
    }

    fn max_keys(&self) -> usize {
        self.inner.batch_cas().map_or(usize::MAX, |b| b.max_keys())
    }

    fn takes_together(&self, keys: &[LockKey]) -> bool {
        self.inner
            .batch_cas()
            .is_some_and(|b| b.takes_together(keys))
    }
}

#[async_trait]
impl Watch for Partition {
    async fn watch(&self, key: &LockKey) -> Result<Box<dyn ReleaseWatch>, Error> {
        self.gate().await;
        self.inner.watch(key).await
    }
}

#[async_trait]
impl Inspect for Partition {
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        self.gate().await;
        self.inner.inspect(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<HolderInfo>, Error> {
        self.gate().await;
        self.inner.list(prefix).await
    }
}

#[async_trait]
impl RenewMany for Partition {
    async fn renew_many(&self, items: &[RenewItem]) -> Result<Vec<bool>, Error> {
        if let Ok(mut r) = self.renewals.lock() {
            r.push(items.len());
        }
        self.gate().await;
        self.inner.renew_many(items).await
    }
}

#[async_trait]
impl RaiseFence for Partition {
    async fn raise_fence(&self, key: &LockKey, minimum: Fence) -> Result<(), Error> {
        self.gate().await;
        self.inner.raise_fence(key, minimum).await
    }
}

#[async_trait]
impl Describe for Partition {
    async fn describe(&self, key: &LockKey, owner: &Token, text: &str) -> Result<bool, Error> {
        self.gate().await;
        self.inner.describe(key, owner, text).await
    }
}

#[async_trait]
impl FairQueue for Partition {
    async fn acquire(&self, key: &LockKey, token: &Token, ttl: Duration) -> Result<Fence, Error> {
        self.gate().await;
        self.inner.fair_acquire(key, token, ttl).await
    }
}

/// A resource that remembers the highest fence it has accepted and refuses
/// writes that carry a lower one.
#[derive(Clone, Default)]
pub struct FencedResource {
    highest: Arc<Mutex<Option<Fence>>>,
    writes: Arc<AtomicU64>,
}

impl FencedResource {
    /// An empty resource.
    pub fn new() -> Self {
        Self::default()
    }

    /// Accepts the write if `fence` is at least the highest seen.
    pub fn write(&self, fence: Fence) -> bool {
        let mut highest = match self.highest.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if highest.is_some_and(|h| fence < h) {
            return false;
        }
        *highest = Some(fence);
        self.writes.fetch_add(1, Ordering::SeqCst);
        true
    }

    /// How many writes were accepted.
    pub fn accepted(&self) -> u64 {
        self.writes.load(Ordering::SeqCst)
    }
}

/// Counts callers inside a critical section and records any overlap.
#[derive(Clone, Default)]
pub struct OverlapDetector {
    inside: Arc<AtomicU64>,
    overlaps: Arc<AtomicU64>,
    entries: Arc<AtomicU64>,
}

impl OverlapDetector {
    /// A detector with nobody inside.
    pub fn new() -> Self {
        Self::default()
    }

    /// Marks entry into the critical section.
    pub fn enter(&self) {
        self.entries.fetch_add(1, Ordering::SeqCst);
        if self.inside.fetch_add(1, Ordering::SeqCst) != 0 {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Marks exit from the critical section.
    pub fn exit(&self) {
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }

    /// How many entries found someone already inside.
    pub fn overlaps(&self) -> u64 {
        self.overlaps.load(Ordering::SeqCst)
    }

    /// How many entries there were.
    pub fn entries(&self) -> u64 {
        self.entries.load(Ordering::SeqCst)
    }
}

/// Measures how late the runtime wakes a ticker, to tell a backend's
/// failure from a test that was held up by the scheduler.
pub struct StallMonitor {
    worst_micros: Arc<AtomicU64>,
    task: Option<tokio::task::JoinHandle<()>>,
}

/// How often the [`StallMonitor`] ticks.
const TICK: Duration = Duration::from_millis(10);

impl StallMonitor {
    /// Starts ticking on the current runtime (without one it measures nothing).
    pub fn start() -> Self {
        let worst_micros = Arc::new(AtomicU64::new(0));
        let worst = worst_micros.clone();
        let task = tokio::runtime::Handle::try_current().ok().map(|h| {
            h.spawn(async move {
                loop {
                    let before = std::time::Instant::now();
                    tokio::time::sleep(TICK).await;
                    let late = before.elapsed().saturating_sub(TICK);
                    let micros = u64::try_from(late.as_micros()).unwrap_or(u64::MAX);
                    worst.fetch_max(micros, Ordering::SeqCst);
                }
            })
        });
        Self { worst_micros, task }
    }

    /// The latest wake-up seen so far.
    pub fn worst(&self) -> Duration {
        Duration::from_micros(self.worst_micros.load(Ordering::SeqCst))
    }

    /// Stops ticking and returns the latest wake-up seen.
    pub fn stop(mut self) -> Duration {
        if let Some(t) = self.task.take() {
            t.abort();
        }
        self.worst()
    }
}

impl Drop for StallMonitor {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// A backend with only the two required methods, over an in-memory store:
/// for tests of what happens when a backend hands out no extension.
/// Clones share one store.
#[derive(Clone, Default)]
pub struct Bare(moltlock_core::MemoryBackend);

#[async_trait]
impl Backend for Bare {
    async fn cas(
        &self,
        key: &LockKey,
        expected: Option<&Token>,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error> {
        self.0.cas(key, expected, new, ttl).await
    }

    async fn delete(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        self.0.delete(key, owner).await
    }
}
