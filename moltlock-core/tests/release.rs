//! A release the store fails for the moment (a connection reset, a server
//! restarting) is sent again in the background, so the key does not stay
//! held for the rest of its TTL; a release the store refuses for good is
//! not repeated.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test wrappers and tests unwrap

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use moltlock_core::{
    async_trait, Backend, BackendExt, CasOutcome, Error, LockKey, LockManager, MemoryBackend, Token,
};
use tokio::time::{sleep, Instant};

const TTL: Duration = Duration::from_secs(30);

/// Fails the next `failing` deletes (retryable when `retryable`), then
/// passes them on; counts every delete asked. With `then_for_good`, the
/// failures after the first are not retryable.
#[derive(Clone)]
struct FailingDeletes {
    store: MemoryBackend,
    failing: Arc<AtomicUsize>,
    retryable: bool,
    then_for_good: bool,
    asked: Arc<AtomicUsize>,
    /// When each delete was asked.
    times: Arc<std::sync::Mutex<Vec<Instant>>>,
    /// How many of the next deletes get no answer for an hour.
    hanging: Arc<AtomicUsize>,
}

impl FailingDeletes {
    fn new(retryable: bool) -> Self {
        Self {
            store: MemoryBackend::new(),
            failing: Arc::default(),
            retryable,
            then_for_good: false,
            asked: Arc::default(),
            times: Arc::default(),
            hanging: Arc::default(),
        }
    }

    fn fail_next(&self, n: usize) {
        self.failing.store(n, Ordering::SeqCst);
    }
}

#[async_trait]
impl Backend for FailingDeletes {
    async fn cas(
        &self,
        key: &LockKey,
        expected: Option<&Token>,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error> {
        self.store.cas(key, expected, new, ttl).await
    }

    async fn delete(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        let before = self.asked.fetch_add(1, Ordering::SeqCst);
        self.times.lock().unwrap().push(Instant::now());
        if self.hanging.load(Ordering::SeqCst) > 0 {
            self.hanging.fetch_sub(1, Ordering::SeqCst);
            sleep(Duration::from_secs(3600)).await;
        }
        let left = self.failing.load(Ordering::SeqCst);
        if left > 0 {
            self.failing.store(left - 1, Ordering::SeqCst);
            let retryable = self.retryable && !(self.then_for_good && before > 0);
            return Err(Error::store("failing", "connection reset", retryable));
        }
        self.store.delete(key, owner).await
    }
}

fn manager(backend: &FailingDeletes) -> LockManager {
    LockManager::builder(backend.clone())
        .ttl(TTL)
        .build()
        .unwrap()
}

/// Whether the store still holds `key`, asked past the manager.
async fn held(store: &MemoryBackend, key: &str) -> bool {
    let key: LockKey = key.parse().unwrap();
    store.inspect(&key).await.unwrap().is_some()
}

/// Waits (on the paused clock) until `key` is free, and fails the test
/// unless it is within `within`.
async fn assert_freed_within(store: &MemoryBackend, key: &str, within: Duration) {
    let start = Instant::now();
    while start.elapsed() <= within {
        if !held(store, key).await {
            return;
        }
        sleep(Duration::from_millis(10)).await;
    }
    panic!("{key} stayed held {within:?} after its release");
}

#[tokio::test(start_paused = true)]
async fn a_release_that_failed_for_the_moment_is_sent_again() {
    let backend = FailingDeletes::new(true);
    let mgr = manager(&backend);
    let guard = mgr.lock("reset").await.unwrap();
    backend.fail_next(2);
    let err = guard.release().await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert_freed_within(&backend.store, "reset", Duration::from_secs(5)).await;
    assert_eq!(backend.asked.load(Ordering::SeqCst), 3, "deletes asked");
    let again = mgr.try_lock("reset").await.unwrap();
    assert!(again.is_some(), "the manager did not see the key free");
}

#[tokio::test(start_paused = true)]
async fn a_dropped_guard_whose_release_failed_is_sent_again() {
    let backend = FailingDeletes::new(true);
    let mgr = manager(&backend);
    let guard = mgr.lock("dropped").await.unwrap();
    backend.fail_next(3);
    drop(guard);
    assert_freed_within(&backend.store, "dropped", Duration::from_secs(10)).await;
    assert_eq!(backend.asked.load(Ordering::SeqCst), 4, "deletes asked");
}

/// A refusal for good (not retryable) is the caller's to read: sent once.
#[tokio::test(start_paused = true)]
async fn a_release_refused_for_good_is_not_repeated() {
    let backend = FailingDeletes::new(false);
    let mgr = manager(&backend);
    let guard = mgr.lock("refused").await.unwrap();
    backend.fail_next(1);
    let err = guard.release().await.unwrap_err();
    assert!(!err.is_retryable(), "{err:?}");
    sleep(Duration::from_secs(10)).await;
    assert_eq!(backend.asked.load(Ordering::SeqCst), 1, "deletes asked");
    assert!(held(&backend.store, "refused").await);
}

/// A background retry stops once the hold would have expired: a store that
/// never answers again is not asked for ever.
#[tokio::test(start_paused = true)]
async fn background_retries_end_with_the_hold() {
    let backend = FailingDeletes::new(true);
    let mgr = manager(&backend);
    let guard = mgr.lock("down").await.unwrap();
    backend.fail_next(usize::MAX);
    let _ = guard.release().await.unwrap_err();
    sleep(TTL + Duration::from_secs(60)).await;
    let asked = backend.asked.load(Ordering::SeqCst);
    sleep(Duration::from_secs(120)).await;
    assert_eq!(backend.asked.load(Ordering::SeqCst), asked, "still asking");
    assert!(asked > 3, "asked only {asked} times");
}

/// The retries of a long hold back off: a store down for the whole hour of
/// a one-hour hold is asked about once every 30 s at most, not every 3 s.
#[tokio::test(start_paused = true)]
async fn retries_of_a_long_hold_back_off() {
    let backend = FailingDeletes::new(true);
    let mgr = LockManager::builder(backend.clone())
        .ttl(Duration::from_secs(3600))
        .build()
        .unwrap();
    let guard = mgr.lock("long").await.unwrap();
    backend.fail_next(usize::MAX);
    let _ = guard.release().await.unwrap_err();
    sleep(Duration::from_secs(3700)).await;
    let asked = backend.asked.load(Ordering::SeqCst);
    assert!(
        (100..=140).contains(&asked),
        "asked {asked} times in an hour"
    );
}

/// Retries stop at the first refusal for good, on a dropped guard's
/// release too.
#[tokio::test(start_paused = true)]
async fn retries_stop_at_a_refusal_for_good() {
    let mut backend = FailingDeletes::new(true);
    backend.then_for_good = true;
    let mgr = manager(&backend);
    let guard = mgr.lock("then-refused").await.unwrap();
    backend.fail_next(usize::MAX);
    drop(guard);
    sleep(TTL + Duration::from_secs(10)).await;
    assert_eq!(backend.asked.load(Ordering::SeqCst), 2, "deletes asked");
}

/// A manager whose release timeout is as long as a duration goes still
/// releases (the background task's limit saturates).
#[tokio::test(start_paused = true)]
async fn a_release_timeout_of_duration_max_does_not_overflow() {
    let backend = FailingDeletes::new(true);
    let mgr = LockManager::builder(backend.clone())
        .ttl(TTL)
        .release_timeout(Duration::MAX)
        .build()
        .unwrap();
    let guard = mgr.lock("max").await.unwrap();
    backend.fail_next(1);
    drop(guard);
    assert_freed_within(&backend.store, "max", Duration::from_secs(5)).await;
}

/// The retries of many holds whose releases failed together spread out:
/// they do not come back to the store all at the same instants.
#[tokio::test(start_paused = true)]
async fn retries_of_many_releases_spread_out() {
    let backend = FailingDeletes::new(true);
    let mgr = manager(&backend);
    let mut guards = Vec::new();
    for i in 0..100 {
        guards.push(mgr.lock(format!("many/{i}")).await.unwrap());
    }
    backend.fail_next(usize::MAX);
    drop(guards);
    sleep(Duration::from_secs(10)).await;
    let times = backend.times.lock().unwrap().clone();
    let mut distinct = times.clone();
    distinct.sort();
    distinct.dedup();
    assert!(times.len() > 300, "only {} deletes", times.len());
    assert!(
        distinct.len() > times.len() / 2,
        "{} deletes at {} instants",
        times.len(),
        distinct.len()
    );
}

/// A release dropped before the store answered (the caller's timeout ran
/// out) is sent again in the background: the key does not stay held for
/// the rest of its TTL.
#[tokio::test(start_paused = true)]
async fn a_release_dropped_before_the_store_answered_is_sent_again() {
    let backend = FailingDeletes::new(true);
    let mgr = manager(&backend);
    let guard = mgr.lock("cut").await.unwrap();
    backend.hanging.store(1, Ordering::SeqCst);
    let cut = tokio::time::timeout(Duration::from_millis(100), guard.release()).await;
    assert!(cut.is_err(), "the hanging release answered: {cut:?}");
    assert_freed_within(&backend.store, "cut", Duration::from_secs(5)).await;
    assert_eq!(backend.asked.load(Ordering::SeqCst), 2, "deletes asked");
}
