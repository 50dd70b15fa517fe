//! Wrappers that change how requests travel: slower ([`Delay`]) or sent
//! twice ([`Duplicating`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use moltlock_core::{
    async_trait, Backend, BackendExt, CasMulti, CasOutcome, Error, FairQueue, Fence, Forward,
    LockKey, MultiMode, MultiOutcome, RenewItem, RenewMany, Token,
};

/// Wraps a backend so every request takes longer: each call waits `before`
/// ahead of reaching the store and `after` once the store answered. A
/// future dropped during `after` was cancelled after its request landed;
/// [`landed_then_dropped`](Self::landed_then_dropped) counts such
/// acquisitions, so a cancellation case can show it really cancelled
/// requests mid-flight.
#[derive(Clone)]
pub struct Delay {
    inner: Arc<dyn Backend>,
    before: Duration,
    after: Duration,
    landed_then_dropped: Arc<AtomicU64>,
}

impl Delay {
    /// Delays every call to `inner` by `before` and `after`.
    pub fn new(inner: Arc<dyn Backend>, before: Duration, after: Duration) -> Self {
        Self {
            inner,
            before,
            after,
            landed_then_dropped: Arc::default(),
        }
    }

    /// How many acquisitions the store granted whose caller then dropped
    /// the request before its reply came back.
    pub fn landed_then_dropped(&self) -> u64 {
        self.landed_then_dropped.load(Ordering::SeqCst)
    }
}

/// Counts a drop that happens while armed.
struct DropProbe {
    armed: bool,
    count: Arc<AtomicU64>,
}

impl Drop for DropProbe {
    fn drop(&mut self) {
        if self.armed {
            self.count.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Delay {
    async fn around<T>(&self, call: impl std::future::Future<Output = T>) -> T {
        self.counting(call, |_| false).await
    }

    /// As [`around`](Self::around), counting a drop during the `after`
    /// pause when `landed` says the store granted a hold.
    async fn counting<T>(
        &self,
        call: impl std::future::Future<Output = T>,
        landed: impl Fn(&T) -> bool,
    ) -> T {
        tokio::time::sleep(self.before).await;
        let out = call.await;
        let mut probe = DropProbe {
            armed: landed(&out),
            count: self.landed_then_dropped.clone(),
        };
        tokio::time::sleep(self.after).await;
        probe.armed = false;
        out
    }
}

#[async_trait]
impl Forward for Delay {
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
        let call = self.inner.cas(key, expected, new, ttl);
        let fresh = expected.is_none();
        self.counting(call, |out| {
            fresh && matches!(out, Ok(CasOutcome::Acquired { .. }))
        })
        .await
    }

    async fn delete(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        self.around(self.inner.delete(key, owner)).await
    }

    fn renewer(&self) -> Option<&dyn RenewMany> {
        self.inner.renewer().map(|_| self as _)
    }

    fn fair_queue(&self) -> Option<&dyn FairQueue> {
        self.inner.fair_queue().map(|_| self as _)
    }

    fn batch_cas(&self) -> Option<&dyn CasMulti> {
        self.inner.batch_cas().map(|_| self as _)
    }
}

#[async_trait]
impl CasMulti for Delay {
    async fn cas_multi(
        &self,
        keys: &[LockKey],
        token: &Token,
        ttl: Duration,
        mode: MultiMode,
    ) -> Result<MultiOutcome, Error> {
        let call = self.inner.cas_multi(keys, token, ttl, mode);
        self.counting(call, |out| matches!(out, Ok(MultiOutcome::Acquired(_))))
            .await
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
impl RenewMany for Delay {
    async fn renew_many(&self, items: &[RenewItem]) -> Result<Vec<bool>, Error> {
        self.around(self.inner.renew_many(items)).await
    }
}

#[async_trait]
impl FairQueue for Delay {
    async fn acquire(&self, key: &LockKey, token: &Token, ttl: Duration) -> Result<Fence, Error> {
        self.around(self.inner.fair_acquire(key, token, ttl)).await
    }
}

/// Wraps a backend like a client that re-sends a request after losing its
/// reply: the first acquisition (`cas` with no expected holder) reaches the
/// store twice, and the caller sees the second reply (the store already
/// holds the key for the caller's own token). Later calls pass through.
#[derive(Clone)]
pub struct Duplicating {
    inner: Arc<dyn Backend>,
    armed: Arc<AtomicBool>,
    duplicated: Arc<AtomicU64>,
}

impl Duplicating {
    /// Duplicates the first acquisition sent to `inner`.
    pub fn new(inner: Arc<dyn Backend>) -> Self {
        Self {
            inner,
            armed: Arc::new(AtomicBool::new(true)),
            duplicated: Arc::default(),
        }
    }

    /// How many requests were applied twice.
    pub fn duplicated(&self) -> u64 {
        self.duplicated.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Forward for Duplicating {
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
        let first = self.inner.cas(key, expected, new, ttl).await;
        let lost_reply = expected.is_none()
            && matches!(first, Ok(CasOutcome::Acquired { .. }))
            && self.armed.swap(false, Ordering::SeqCst);
        if !lost_reply {
            return first;
        }
        self.duplicated.fetch_add(1, Ordering::SeqCst);
        self.inner.cas(key, expected, new, ttl).await
    }
}
