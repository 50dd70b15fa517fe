//! A waiter whose release watch failed opens it again: it hears a later
//! release instead of polling for the rest of its wait.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use moltlock_core::{
    async_trait, Error, Forward, Held, LockKey, LockManager, MemoryBackend, ReleaseWatch,
    RetryPolicy, Watch,
};
use tokio::time::{sleep, Instant};

/// The memory store, whose release watches fail the first wait any of
/// them is asked for (a dropped subscription); every later wait works.
#[derive(Clone, Default)]
struct FirstWatchFails {
    store: MemoryBackend,
    failed: Arc<AtomicBool>,
}

#[async_trait]
impl Forward for FirstWatchFails {
    type Inner = MemoryBackend;

    fn inner(&self) -> &MemoryBackend {
        &self.store
    }

    fn watcher(&self) -> Option<&dyn Watch> {
        Some(self)
    }
}

#[async_trait]
impl Watch for FirstWatchFails {
    async fn watch(&self, key: &LockKey) -> Result<Box<dyn ReleaseWatch>, Error> {
        let inner = self.store.watch(key).await?;
        let failed = self.failed.clone();
        Ok(Box::new(Breaking { inner, failed }))
    }
}

struct Breaking {
    inner: Box<dyn ReleaseWatch>,
    failed: Arc<AtomicBool>,
}

#[async_trait]
impl ReleaseWatch for Breaking {
    async fn released(&mut self, held: &Held) -> Result<(), Error> {
        if !self.failed.swap(true, Ordering::SeqCst) {
            return Err(Error::unavailable("memory", "the subscription dropped"));
        }
        self.inner.released(held).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_failed_watch_is_opened_again() {
    let store = FirstWatchFails::default();
    let holder = LockManager::builder(store.clone())
        .ttl(Duration::from_secs(600))
        .build()
        .unwrap();
    // Neither the retry policy nor the hold's expiry wakes this waiter soon.
    let waiter = LockManager::builder(store)
        .retry(RetryPolicy::Fixed(Duration::from_secs(300)))
        .build()
        .unwrap();
    let held = holder.lock("k").await.unwrap();
    let task = tokio::spawn(async move {
        let g = waiter.lock("k").await.unwrap();
        (Instant::now(), g)
    });
    sleep(Duration::from_secs(10)).await;
    assert!(!task.is_finished(), "the waiter took a held key");
    let released = Instant::now();
    held.release().await.unwrap();
    let (got, g) = task.await.unwrap();
    assert!(
        got - released < Duration::from_secs(2),
        "the waiter took {:?} after the release",
        got - released
    );
    g.release().await.unwrap();
}
