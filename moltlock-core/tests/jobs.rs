//! Scheduled-job locks on the in-memory store and tokio's paused clock:
//! `at_most` stops the holder and frees the key, `at_least` keeps the key
//! blocked after a release and after a crash, and bad limits are refused.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use moltlock_core::{
    async_trait, Backend, CasOutcome, Error, Inspect, LockKey, LockManager, LockOptions,
    LostReason, MemoryBackend, Token,
};
use tokio::time::{sleep, sleep_until, Instant};

const TTL: Duration = Duration::from_secs(3);
const S: Duration = Duration::from_secs(1);

fn manager(backend: impl Backend) -> LockManager {
    LockManager::builder(backend).ttl(TTL).build().unwrap()
}

async fn held(store: &MemoryBackend, key: &str) -> bool {
    let key = LockKey::new(key).unwrap();
    store.inspect(&key).await.unwrap().is_some()
}

#[tokio::test(start_paused = true)]
async fn at_most_stops_renewal_fires_lost_and_frees_the_key() {
    let store = MemoryBackend::new();
    let mgr = manager(store.clone());
    let asked = Instant::now();
    let opts = LockOptions::new().at_most(10 * S);
    let guard = mgr.acquire("job", opts).await.unwrap().unwrap();
    let reason = guard.lost().await;
    assert_eq!(reason, LostReason::AtMost);
    let took = asked.elapsed();
    assert!(took <= 10 * S && took >= 9 * S, "stopped after {took:?}");
    assert!(guard.check().is_err());
    sleep(Duration::from_millis(50)).await;
    assert!(
        !held(&store, "job").await,
        "the key outlived the at-most time"
    );
}

#[tokio::test(start_paused = true)]
async fn at_most_is_kept_by_the_renewal_driver_alone() {
    let store = MemoryBackend::new();
    let mgr = manager(store.clone());
    let opts = LockOptions::new().at_most(5 * S);
    let guard = mgr.acquire("job", opts).await.unwrap().unwrap();
    sleep(Duration::from_millis(5100)).await;
    assert!(
        !guard.is_held(),
        "nobody awaited lost(), and the hold ran on"
    );
    assert!(
        !held(&store, "job").await,
        "the key outlived the at-most time"
    );
}

#[tokio::test(start_paused = true)]
async fn at_least_keeps_the_key_blocked_after_an_early_release() {
    let store = MemoryBackend::new();
    let mgr = manager(store.clone());
    let asked = Instant::now();
    let opts = LockOptions::new().at_least(20 * S);
    let guard = mgr.acquire("job", opts).await.unwrap().unwrap();
    sleep(2 * S).await;
    guard.release().await.unwrap();
    let other = manager(store.clone());
    sleep_until(asked + 19 * S).await;
    assert!(
        other.try_lock("job").await.unwrap().is_none(),
        "free too soon"
    );
    sleep_until(asked + 20 * S + Duration::from_millis(10)).await;
    assert!(
        other.try_lock("job").await.unwrap().is_some(),
        "blocked too long"
    );
}

#[tokio::test(start_paused = true)]
async fn at_least_covers_a_dropped_guard() {
    let store = MemoryBackend::new();
    let mgr = manager(store.clone());
    let asked = Instant::now();
    let opts = LockOptions::new().at_least(8 * S);
    drop(mgr.acquire("job", opts).await.unwrap().unwrap());
    sleep(Duration::from_millis(50)).await;
    assert!(
        held(&store, "job").await,
        "a dropped guard freed the key early"
    );
    sleep_until(asked + 8 * S + Duration::from_millis(10)).await;
    assert!(!held(&store, "job").await, "blocked past the at-least time");
}

/// Every request fails once `dead` is set: a process that crashed.
#[derive(Clone, Default)]
struct Crashes(MemoryBackend, Arc<AtomicBool>);

#[async_trait]
impl Backend for Crashes {
    async fn cas(
        &self,
        key: &LockKey,
        expected: Option<&Token>,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error> {
        if self.1.load(Ordering::SeqCst) {
            return Err(Error::store("crashed", "gone", true));
        }
        self.0.cas(key, expected, new, ttl).await
    }

    async fn delete(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        if self.1.load(Ordering::SeqCst) {
            return Err(Error::store("crashed", "gone", true));
        }
        self.0.delete(key, owner).await
    }
}

#[tokio::test(start_paused = true)]
async fn at_least_blocks_after_a_crash_at_any_point() {
    for crash_after in [S, 7 * S, 13 * S] {
        let backend = Crashes::default();
        let store = backend.0.clone();
        let mgr = manager(backend.clone());
        let asked = Instant::now();
        let opts = LockOptions::new().at_least(15 * S);
        let guard = mgr.acquire("job", opts).await.unwrap().unwrap();
        sleep(crash_after).await;
        backend.1.store(true, Ordering::SeqCst);
        std::mem::forget(guard);
        sleep_until(asked + 15 * S - Duration::from_millis(10)).await;
        assert!(
            held(&store, "job").await,
            "a crash {crash_after:?} in freed the key before its at-least time"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn bad_limits_are_refused() {
    let mgr = manager(MemoryBackend::new());
    let both = LockOptions::new().at_least(10 * S).at_most(5 * S);
    assert!(matches!(
        mgr.acquire("k", both).await,
        Err(Error::Config(_))
    ));
    let tiny = LockOptions::new().at_most(Duration::from_millis(1));
    assert!(matches!(
        mgr.acquire("k", tiny).await,
        Err(Error::Config(_))
    ));
    let fair = LockOptions::new().fair().at_most(5 * S);
    assert!(matches!(
        mgr.acquire("k", fair).await,
        Err(Error::Config(_))
    ));
    let on_a_set = LockOptions::new().at_least(5 * S);
    let got = mgr.lock_all(["a", "b"], on_a_set).await;
    assert!(matches!(got, Err(Error::Config(_))), "{got:?}");
    assert!(
        mgr.try_lock("k").await.unwrap().is_some(),
        "a refusal held the key"
    );
}

/// Fresh acquisitions land 2.5 s after they are sent (a queued statement):
/// `at_most` still counts from the send of the acquire request, not from
/// when the grant came back.
#[derive(Clone, Default)]
struct SlowGrant(MemoryBackend);

#[async_trait]
impl Backend for SlowGrant {
    async fn cas(
        &self,
        key: &LockKey,
        expected: Option<&Token>,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error> {
        if expected.is_none() {
            sleep(Duration::from_millis(2500)).await;
        }
        self.0.cas(key, expected, new, ttl).await
    }

    async fn delete(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        self.0.delete(key, owner).await
    }
}

#[tokio::test(start_paused = true)]
async fn at_most_counts_from_the_acquire_request_of_a_late_grant() {
    let mgr = manager(SlowGrant::default());
    let asked = Instant::now();
    let opts = LockOptions::new().at_most(5 * S);
    let guard = mgr.acquire("job", opts).await.unwrap().unwrap();
    assert!(asked.elapsed() >= 2 * S, "the grant was not late");
    assert_eq!(guard.lost().await, LostReason::AtMost);
    let took = asked.elapsed();
    assert!(
        took <= 5 * S,
        "ran {took:?}, past at_most counted from the request"
    );
}
