//! A [`Backend`] wrapper that counts the requests the manager issues through
//! it: the honest "requests issued by the client" for the renewal section.
//! It forwards everything else, extensions included, unchanged.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use moltlock::{Backend, CasOutcome, Error, Forward, LockKey, RenewItem, RenewMany, Token};

/// Request counts so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// `cas` calls (acquisitions and single renewals).
    pub cas: u64,
    /// `delete` calls.
    pub delete: u64,
    /// `renew_many` calls (renewal rounds).
    pub renew_many: u64,
    /// Holds renewed through `renew_many`, in all.
    pub renew_items: u64,
}

#[derive(Default)]
struct Counters {
    cas: AtomicU64,
    delete: AtomicU64,
    renew_many: AtomicU64,
    renew_items: AtomicU64,
}

/// Forwards every call to the inner backend, counting them.
pub struct Counting {
    inner: Arc<dyn Backend>,
    counters: Arc<Counters>,
}

/// Reads the counts of a [`Counting`] backend after it moved into a manager.
#[derive(Clone)]
pub struct CountReader(Arc<Counters>);

impl CountReader {
    /// The counts now.
    pub fn get(&self) -> Counts {
        let c = &self.0;
        Counts {
            cas: c.cas.load(Ordering::Relaxed),
            delete: c.delete.load(Ordering::Relaxed),
            renew_many: c.renew_many.load(Ordering::Relaxed),
            renew_items: c.renew_items.load(Ordering::Relaxed),
        }
    }
}

impl Counting {
    /// Wraps `inner`; the reader sees the counts.
    pub fn new(inner: Arc<dyn Backend>) -> (Self, CountReader) {
        let counters = Arc::new(Counters::default());
        let reader = CountReader(counters.clone());
        (Self { inner, counters }, reader)
    }
}

#[async_trait]
impl Forward for Counting {
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
        self.counters.cas.fetch_add(1, Ordering::Relaxed);
        self.inner.cas(key, expected, new, ttl).await
    }

    async fn delete(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        self.counters.delete.fetch_add(1, Ordering::Relaxed);
        self.inner.delete(key, owner).await
    }

    fn renewer(&self) -> Option<&dyn RenewMany> {
        self.inner.renewer().map(|_| self as &dyn RenewMany)
    }
}

#[async_trait]
impl RenewMany for Counting {
    async fn renew_many(&self, items: &[RenewItem]) -> Result<Vec<bool>, Error> {
        self.counters.renew_many.fetch_add(1, Ordering::Relaxed);
        let n = items.len() as u64;
        self.counters.renew_items.fetch_add(n, Ordering::Relaxed);
        let batch =
            moltlock::extension::require(self.inner.name(), self.inner.renewer(), "batch renewal")?;
        batch.renew_many(items).await
    }
}
