//! A polling waiter behind a key that keeps changing hands keeps looking
//! at it often; behind one long hold it backs off as its policy says.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use moltlock_core::{
    async_trait, Backend, CasOutcome, Error, Forward, LockKey, LockManager, MemoryBackend,
    RetryPolicy, Token, Watch,
};
use tokio::time::sleep;

const LONG: Duration = Duration::from_secs(600);

/// The memory store with no release watch (its waiters poll), counting
/// the attempts made through it.
struct Polling {
    store: MemoryBackend,
    looks: Arc<AtomicU32>,
}

#[async_trait]
impl Forward for Polling {
    type Inner = MemoryBackend;

    fn inner(&self) -> &MemoryBackend {
        &self.store
    }

    async fn cas(
        &self,
        key: &LockKey,
        expected: Option<&Token>,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error> {
        self.looks.fetch_add(1, Ordering::SeqCst);
        self.store.cas(key, expected, new, ttl).await
    }

    fn watcher(&self) -> Option<&dyn Watch> {
        None
    }
}

/// How many attempts a waiter makes in two seconds at a key that is never
/// free: held by one holder throughout, or handed from holder to holder
/// every 5 ms (never free in between).
async fn looks_in_two_seconds(hands_change: bool) -> u32 {
    let store = MemoryBackend::default();
    let key = LockKey::new("k").unwrap();
    let mut holder = Token::random();
    let first = store.cas(&key, None, &holder, LONG).await.unwrap();
    assert!(matches!(first, CasOutcome::Acquired { .. }));
    let churn = {
        let store = store.clone();
        tokio::spawn(async move {
            loop {
                sleep(Duration::from_millis(5)).await;
                if hands_change {
                    let next = Token::random();
                    let got = store.cas(&key, Some(&holder), &next, LONG).await.unwrap();
                    assert!(matches!(got, CasOutcome::Acquired { .. }));
                    holder = next;
                }
            }
        })
    };
    let looks = Arc::new(AtomicU32::new(0));
    let backend = Polling {
        store,
        looks: looks.clone(),
    };
    let waiter = LockManager::builder(backend)
        .retry(RetryPolicy::Exponential {
            initial: Duration::from_millis(10),
            max: Duration::from_secs(2),
        })
        .build()
        .unwrap();
    let task = tokio::spawn(async move { waiter.lock("k").await.map(|_| ()) });
    sleep(Duration::from_secs(2)).await;
    assert!(!task.is_finished(), "the waiter took a key never free");
    task.abort();
    churn.abort();
    looks.load(Ordering::SeqCst)
}

#[tokio::test(start_paused = true)]
async fn a_waiter_keeps_looking_at_a_key_that_changes_hands() {
    let looks = looks_in_two_seconds(true).await;
    // A look every 5–10 ms (the first delay) for two seconds.
    assert!(looks >= 150, "only {looks} looks at a moving key");
}

#[tokio::test(start_paused = true)]
async fn a_waiter_backs_off_behind_one_long_hold() {
    let looks = looks_in_two_seconds(false).await;
    // 10, 20, 40 … 1,280 ms, each with up to half taken off: at most 9
    // looks fit in two seconds.
    assert!(looks <= 12, "{looks} looks at a key held throughout");
}
