//! Scoped locks (`with_lock`, `with_lock_until_lost`), the lost token, the
//! busy facts of `try_acquire`, and the points the docs promise about
//! reentrancy. On the in-memory backend, mostly on tokio's paused clock.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use moltlock_core::{
    async_trait, Backend, CasOutcome, Error, Inspect, LockKey, LockManager, LockOptions,
    LostReason, MemoryBackend, Token, TryAcquire,
};
use tokio::time::{sleep, Instant};

const TTL: Duration = Duration::from_secs(3);

fn manager(backend: impl Backend) -> LockManager {
    LockManager::builder(backend).ttl(TTL).build().unwrap()
}

/// Takes a hold away from its owner behind its back, as an operator's
/// delete or an expiry the owner did not see.
async fn steal(store: &MemoryBackend, key: &str, owner: &Token) {
    let key = LockKey::new(key).unwrap();
    assert!(store.delete(&key, owner).await.unwrap(), "nothing to steal");
}

#[tokio::test(start_paused = true)]
async fn lost_token_fires_in_another_task_when_the_store_refuses() {
    let store = MemoryBackend::new();
    let mgr = manager(store.clone());
    let guard = mgr.lock("k").await.unwrap();
    let token = guard.lost_token();
    assert!(!token.is_lost());
    assert_eq!(token.fence(), guard.fence());
    let watcher = tokio::spawn(async move { token.lost().await });
    steal(&store, "k", guard.token()).await;
    let reason = tokio::time::timeout(TTL, watcher).await.unwrap().unwrap();
    assert_eq!(reason, LostReason::Refused);
    assert!(guard.lost_token().is_lost());
    assert!(matches!(
        guard.lost_token().check(),
        Err(Error::Lost { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn lost_token_reports_the_release_and_does_not_spin() {
    let mgr = manager(MemoryBackend::new());
    let guard = mgr.lock("k").await.unwrap();
    let token = guard.lost_token();
    let watcher = tokio::spawn({
        let token = token.clone();
        async move { token.lost().await }
    });
    guard.release().await.unwrap();
    let reason = tokio::time::timeout(Duration::from_millis(10), watcher)
        .await
        .expect("a released hold's token did not resolve")
        .unwrap();
    assert_eq!(reason, LostReason::Released);
    assert_eq!(token.reason(), Some(LostReason::Released));
    assert_eq!(token.valid_for(), None);
    // Long after its deadline, waiting again still answers at once.
    sleep(TTL * 3).await;
    let again = tokio::time::timeout(Duration::from_millis(10), token.lost()).await;
    assert_eq!(again.unwrap(), LostReason::Released);
}

#[tokio::test(start_paused = true)]
async fn with_lock_returns_the_value_and_frees_the_key() {
    let mgr = manager(MemoryBackend::new());
    let other = mgr.clone();
    let seen = mgr
        .with_lock("k", |lock| async move {
            assert!(
                other.try_lock("k").await.unwrap().is_none(),
                "not exclusive"
            );
            lock.check().unwrap()
        })
        .await
        .unwrap();
    assert!(seen.0 > 0);
    assert!(mgr.try_lock("k").await.unwrap().is_some(), "still held");
}

#[tokio::test(start_paused = true)]
async fn with_lock_releases_when_the_closure_panics() {
    let mgr = manager(MemoryBackend::new());
    let runner = mgr.clone();
    let task = tokio::spawn(async move {
        runner
            .with_lock("k", |_lock| async move {
                sleep(Duration::from_millis(5)).await;
                panic!("the job failed");
            })
            .await
    });
    assert!(task.await.unwrap_err().is_panic());
    // Well before the TTL, the key is free again.
    let got = mgr.lock_timeout("k", TTL / 10).await;
    assert!(got.is_ok(), "a panicking closure kept the key: {got:?}");
}

/// Sets its flag when dropped: shows a future was cancelled.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test(start_paused = true)]
async fn with_lock_until_lost_cancels_the_work_at_the_loss() {
    let store = MemoryBackend::new();
    let mgr = manager(store.clone());
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = DropFlag(dropped.clone());
    let (owner_tx, owner_rx) = tokio::sync::oneshot::channel();
    let runner = mgr.clone();
    let task = tokio::spawn(async move {
        runner
            .with_lock_until_lost("k", |lock| async move {
                let _flag = flag;
                owner_tx.send(lock.fence()).unwrap();
                std::future::pending::<()>().await;
            })
            .await
    });
    let fence = owner_rx.await.unwrap();
    let holder = store
        .inspect(&LockKey::new("k").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(holder.fence, Some(fence));
    steal(&store, "k", &holder.holder).await;
    let outcome = tokio::time::timeout(TTL, task).await.unwrap().unwrap();
    assert!(
        matches!(
            outcome,
            Err(Error::Lost {
                reason: LostReason::Refused,
                ..
            })
        ),
        "{outcome:?}"
    );
    assert!(dropped.load(Ordering::SeqCst), "the work was not cancelled");
}

/// Renewals never answer: the hold can only end at its local deadline.
#[derive(Clone, Default)]
struct HungRenewals(MemoryBackend);

#[async_trait]
impl Backend for HungRenewals {
    async fn cas(
        &self,
        key: &LockKey,
        expected: Option<&Token>,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error> {
        if expected.is_some() {
            std::future::pending::<()>().await;
        }
        self.0.cas(key, expected, new, ttl).await
    }

    async fn delete(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        self.0.delete(key, owner).await
    }
}

#[tokio::test(start_paused = true)]
async fn with_lock_until_lost_stops_at_the_deadline_while_renewals_hang() {
    let mgr = manager(HungRenewals::default());
    let started = Instant::now();
    let outcome = mgr
        .with_lock_until_lost("k", |_lock| std::future::pending::<()>())
        .await;
    assert!(
        matches!(
            outcome,
            Err(Error::Lost {
                reason: LostReason::Deadline,
                ..
            })
        ),
        "{outcome:?}"
    );
    let took = started.elapsed();
    assert!(took <= TTL, "the work ran past the TTL: {took:?}");
    assert!(took >= TTL.mul_f64(0.9), "stopped early: {took:?}");
}

#[tokio::test(start_paused = true)]
async fn try_acquire_tells_who_holds_a_busy_key() {
    let store = MemoryBackend::new();
    let mgr = manager(store.clone());
    let opts = LockOptions::new().description("host-a pid 42");
    let held = mgr.acquire("k", opts).await.unwrap().unwrap();
    sleep(Duration::from_millis(500)).await;
    let other = manager(store);
    let TryAcquire::Busy(busy) = other.try_acquire("k").await.unwrap() else {
        panic!("a held key was acquired");
    };
    assert_eq!(busy.key, "k");
    assert_eq!(busy.holder.as_deref(), Some("host-a pid 42"));
    assert_eq!(busy.fence, Some(held.fence()));
    let left = busy.expires_in.unwrap();
    assert!(left <= TTL && left > Duration::ZERO, "{left:?}");
    held.release().await.unwrap();
    let free = other.try_acquire("k").await.unwrap();
    assert!(free.acquired().is_some(), "a free key was reported busy");
}

#[tokio::test(start_paused = true)]
async fn try_acquire_without_inspection_reports_no_facts() {
    let store = HungRenewals::default();
    let mgr = manager(store.clone());
    let _held = mgr.lock("k").await.unwrap();
    match manager(store).try_acquire("k").await.unwrap() {
        TryAcquire::Busy(busy) => {
            assert_eq!(busy.key, "k");
            assert_eq!(
                (busy.holder, busy.expires_in, busy.fence),
                (None, None, None)
            );
        }
        TryAcquire::Acquired(_) => panic!("a held key was acquired"),
    }
}

/// Locks are not reentrant: a second `lock` of a held key from the same
/// manager (or task) waits like anyone else's.
#[tokio::test(start_paused = true)]
async fn a_second_lock_of_a_held_key_from_the_same_manager_waits() {
    let mgr = manager(MemoryBackend::new());
    let first = mgr.lock("k").await.unwrap();
    let second = mgr.lock_timeout("k", Duration::from_secs(1)).await;
    assert!(matches!(second, Err(Error::Timeout { .. })), "{second:?}");
    assert!(first.is_held(), "the waiter disturbed the first hold");
    first.release().await.unwrap();
    assert!(mgr.try_lock("k").await.unwrap().is_some());
}
