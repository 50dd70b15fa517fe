//! A [`Backend`] wrapper that counts the requests the manager issues through
//! it: the honest "requests issued by the client" for the renewal,
//! semaphore and multi-lock sections. It forwards everything else,
//! extensions included, unchanged; the extensions that issue store requests
//! (batch renewal, batch `cas`, inspection) are counted too, so a request
//! that bypasses `cas` is never missed. Release watches are counted
//! apart, as waits: most backends serve them from one shared
//! subscription, and a Postgres wait first marks the key's row.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use moltlock::extension::require;
use moltlock::{
    Backend, CasMulti, CasOutcome, Error, Forward, Held, HolderInfo, Inspect, LockKey, MultiMode,
    MultiOutcome, ReleaseWatch, RenewItem, RenewMany, Token, Watch,
};

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
    /// `cas_multi` calls (several keys in one request).
    pub cas_multi: u64,
    /// `inspect` and `list` calls.
    pub inspect: u64,
    /// Waits on a release watch (`released` calls), not in [`requests`](Self::requests).
    pub waits: u64,
}

impl Counts {
    /// The requests counted since `earlier`.
    pub fn since(&self, earlier: &Counts) -> Counts {
        Counts {
            cas: self.cas.saturating_sub(earlier.cas),
            delete: self.delete.saturating_sub(earlier.delete),
            renew_many: self.renew_many.saturating_sub(earlier.renew_many),
            renew_items: self.renew_items.saturating_sub(earlier.renew_items),
            cas_multi: self.cas_multi.saturating_sub(earlier.cas_multi),
            inspect: self.inspect.saturating_sub(earlier.inspect),
            waits: self.waits.saturating_sub(earlier.waits),
        }
    }

    /// Every store request counted (each call is one request).
    pub fn requests(&self) -> u64 {
        self.cas + self.delete + self.renew_many + self.cas_multi + self.inspect
    }
}

#[derive(Default)]
struct Counters {
    cas: AtomicU64,
    delete: AtomicU64,
    renew_many: AtomicU64,
    renew_items: AtomicU64,
    cas_multi: AtomicU64,
    inspect: AtomicU64,
    waits: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
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
            cas_multi: c.cas_multi.load(Ordering::Relaxed),
            inspect: c.inspect.load(Ordering::Relaxed),
            waits: c.waits.load(Ordering::Relaxed),
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

    /// Wraps `inner`, adding to the counts `reader` already sees (several
    /// managers, one sum).
    pub fn sharing(inner: Arc<dyn Backend>, reader: &CountReader) -> Self {
        Self {
            inner,
            counters: reader.0.clone(),
        }
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
        bump(&self.counters.cas);
        self.inner.cas(key, expected, new, ttl).await
    }

    async fn delete(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        bump(&self.counters.delete);
        self.inner.delete(key, owner).await
    }

    fn renewer(&self) -> Option<&dyn RenewMany> {
        self.inner.renewer().map(|_| self as &dyn RenewMany)
    }

    fn batch_cas(&self) -> Option<&dyn CasMulti> {
        self.inner.batch_cas().map(|_| self as &dyn CasMulti)
    }

    fn inspector(&self) -> Option<&dyn Inspect> {
        self.inner.inspector().map(|_| self as &dyn Inspect)
    }

    fn watcher(&self) -> Option<&dyn Watch> {
        self.inner.watcher().map(|_| self as &dyn Watch)
    }
}

#[async_trait]
impl Watch for Counting {
    async fn watch(&self, key: &LockKey) -> Result<Box<dyn ReleaseWatch>, Error> {
        let watcher = require(self.inner.name(), self.inner.watcher(), "release watch")?;
        Ok(Box::new(CountingWatch {
            inner: watcher.watch(key).await?,
            counters: self.counters.clone(),
        }))
    }
}

/// A release watch whose waits are counted.
struct CountingWatch {
    inner: Box<dyn ReleaseWatch>,
    counters: Arc<Counters>,
}

#[async_trait]
impl ReleaseWatch for CountingWatch {
    async fn released(&mut self, held: &Held) -> Result<(), Error> {
        bump(&self.counters.waits);
        self.inner.released(held).await
    }
}

#[async_trait]
impl RenewMany for Counting {
    async fn renew_many(&self, items: &[RenewItem]) -> Result<Vec<bool>, Error> {
        bump(&self.counters.renew_many);
        let n = items.len() as u64;
        self.counters.renew_items.fetch_add(n, Ordering::Relaxed);
        let batch = require(self.inner.name(), self.inner.renewer(), "batch renewal")?;
        batch.renew_many(items).await
    }
}

#[async_trait]
impl CasMulti for Counting {
    async fn cas_multi(
        &self,
        keys: &[LockKey],
        token: &Token,
        ttl: Duration,
        mode: MultiMode,
    ) -> Result<MultiOutcome, Error> {
        bump(&self.counters.cas_multi);
        let batch = require(self.inner.name(), self.inner.batch_cas(), "batch cas")?;
        batch.cas_multi(keys, token, ttl, mode).await
    }

    fn max_keys(&self) -> usize {
        self.inner.batch_cas().map_or(usize::MAX, |b| b.max_keys())
    }
}

#[async_trait]
impl Inspect for Counting {
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        bump(&self.counters.inspect);
        let inspector = require(self.inner.name(), self.inner.inspector(), "inspect")?;
        inspector.inspect(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<HolderInfo>, Error> {
        bump(&self.counters.inspect);
        let inspector = require(self.inner.name(), self.inner.inspector(), "list")?;
        inspector.list(prefix).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use moltlock::{BackendExt, MemoryBackend};

    fn keys(names: &[&str]) -> Result<Vec<LockKey>, Error> {
        names.iter().map(|n| LockKey::new(*n)).collect()
    }

    #[tokio::test]
    async fn counts_batches_and_their_fallback() -> Result<(), Error> {
        let inner: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
        let (counting, reader) = Counting::new(inner.clone());
        let ks = keys(&["a", "b", "c"])?;
        let ttl = Duration::from_secs(5);
        BackendExt::cas_multi(&counting, &ks, &Token::random(), ttl, MultiMode::All).await?;
        let batched = reader.get();
        assert_eq!((batched.cas_multi, batched.cas), (1, 0));
        let hidden = Counting::sharing(Arc::new(crate::lockall::NoBatch::new(inner)), &reader);
        assert!(Backend::batch_cas(&hidden).is_none());
        let more = keys(&["d", "e"])?;
        BackendExt::cas_multi(&hidden, &more, &Token::random(), ttl, MultiMode::All).await?;
        let after = reader.get().since(&batched);
        assert_eq!((after.cas_multi, after.cas), (0, 2));
        assert_eq!(after.requests(), 2);
        Ok(())
    }
}
