//! Revocation and owner-scoped reentrancy, on the in-memory store.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use moltlock_core::{
    async_trait, Backend, CasOutcome, Error, Inspect, LockKey, LockManager, LostReason,
    MemoryBackend, Token,
};
use tokio::time::sleep;

const TTL: Duration = Duration::from_secs(3);

fn manager(backend: impl Backend) -> LockManager {
    LockManager::builder(backend).ttl(TTL).build().unwrap()
}

#[tokio::test(start_paused = true)]
async fn revoke_removes_the_holder_and_its_lost_fires() {
    let store = MemoryBackend::new();
    let victim = manager(store.clone());
    let admin = manager(store.clone());
    let guard = victim.lock("k").await.unwrap();
    let removed = admin.revoke("k").await.unwrap().expect("nothing revoked");
    assert_eq!(&removed.holder, guard.token());
    assert_eq!(removed.fence, Some(guard.fence()));
    let reason = tokio::time::timeout(TTL / 2, guard.lost()).await.unwrap();
    assert_eq!(reason, LostReason::Refused);
    let next = admin
        .try_lock("k")
        .await
        .unwrap()
        .expect("the key stayed held");
    assert!(next.fence() > guard.fence());
    assert!(admin.revoke("free").await.unwrap().is_none());
}

/// Between the read and the delete of a revoke, the holder releases and a
/// new holder takes the key: the new holder is not removed.
#[derive(Clone)]
struct RaceAfterInspect {
    store: MemoryBackend,
    newcomer: LockManager,
    taken: Arc<std::sync::Mutex<Option<moltlock_core::LockGuard>>>,
}

#[async_trait]
impl Backend for RaceAfterInspect {
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
        self.store.delete(key, owner).await
    }

    fn inspector(&self) -> Option<&dyn Inspect> {
        Some(self)
    }
}

#[async_trait]
impl Inspect for RaceAfterInspect {
    async fn inspect(&self, key: &LockKey) -> Result<Option<moltlock_core::HolderInfo>, Error> {
        let seen = self.store.inspect(key).await?;
        if let Some(info) = &seen {
            self.store.delete(key, &info.holder).await?;
            let guard = self.newcomer.lock(key.as_str()).await?;
            *self.taken.lock().unwrap() = Some(guard);
        }
        Ok(seen)
    }

    async fn list(&self, prefix: &str) -> Result<Vec<moltlock_core::HolderInfo>, Error> {
        self.store.list(prefix).await
    }
}

#[tokio::test(start_paused = true)]
async fn revoke_never_removes_a_newer_holder() {
    let store = MemoryBackend::new();
    let first = manager(store.clone());
    let _old = first.lock("k").await.unwrap();
    let racy = RaceAfterInspect {
        store: store.clone(),
        newcomer: manager(store.clone()),
        taken: Arc::default(),
    };
    let admin = manager(racy.clone());
    assert!(
        admin.revoke("k").await.unwrap().is_none(),
        "claimed a revoke"
    );
    let newer = racy.taken.lock().unwrap().take().expect("no newcomer");
    sleep(TTL).await;
    assert!(newer.is_held(), "the revoke removed the newer holder");
}

#[tokio::test(start_paused = true)]
async fn revoke_without_inspection_is_unsupported() {
    #[derive(Clone, Default)]
    struct Bare(MemoryBackend);
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
    let got = manager(Bare::default()).revoke("k").await;
    assert!(matches!(got, Err(Error::Unsupported { .. })), "{got:?}");
}

/// Counts `cas` calls that acquire (not renewals).
#[derive(Clone, Default)]
struct Counting(MemoryBackend, Arc<AtomicUsize>, Arc<AtomicUsize>);

#[async_trait]
impl Backend for Counting {
    async fn cas(
        &self,
        key: &LockKey,
        expected: Option<&Token>,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error> {
        if expected.is_none() {
            self.1.fetch_add(1, Ordering::SeqCst);
        }
        self.0.cas(key, expected, new, ttl).await
    }

    async fn delete(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        self.2.fetch_add(1, Ordering::SeqCst);
        self.0.delete(key, owner).await
    }
}

#[tokio::test(start_paused = true)]
async fn an_owner_reenters_its_own_lock_without_the_store() {
    let backend = Counting::default();
    let (acquires, deletes) = (backend.1.clone(), backend.2.clone());
    let mgr = manager(backend.clone());
    let owner = mgr.owner();
    let outer = owner.lock("k").await.unwrap();
    let inner = owner.clone().lock("k").await.unwrap();
    assert_eq!(inner.fence(), outer.fence(), "not the same hold");
    assert_eq!((outer.uses(), acquires.load(Ordering::SeqCst)), (2, 1));
    let other = manager(backend.clone());
    inner.release().await.unwrap();
    assert!(
        other.try_lock("k").await.unwrap().is_none(),
        "freed too early"
    );
    assert_eq!(
        deletes.load(Ordering::SeqCst),
        0,
        "an inner release reached the store"
    );
    outer.release().await.unwrap();
    assert_eq!(deletes.load(Ordering::SeqCst), 1);
    assert!(
        other.try_lock("k").await.unwrap().is_some(),
        "the last release kept the key"
    );
}

#[tokio::test(start_paused = true)]
async fn two_owners_exclude_each_other_and_concurrent_first_locks_go_once() {
    let backend = Counting::default();
    let acquires = backend.1.clone();
    let mgr = manager(backend);
    let owner = mgr.owner();
    let (a, b) = tokio::join!(owner.lock("k"), owner.lock("k"));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.fence(), b.fence());
    assert_eq!(
        acquires.load(Ordering::SeqCst),
        1,
        "two first locks both went to the store"
    );
    let stranger = mgr.owner();
    let waited = tokio::time::timeout(Duration::from_secs(1), stranger.lock("k")).await;
    assert!(waited.is_err(), "a second owner entered a held lock");
    drop((a, b));
    sleep(Duration::from_millis(10)).await;
    assert!(stranger.lock("k").await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_lost_hold_is_not_joined() {
    let store = MemoryBackend::new();
    let mgr = manager(store.clone());
    let owner = mgr.owner();
    let first = owner.lock("k").await.unwrap();
    manager(store.clone()).revoke("k").await.unwrap();
    first.lost().await;
    let again = owner.lock("k").await.unwrap();
    assert!(again.fence() > first.fence(), "joined a lost hold");
    assert!(again.is_held());
}

/// A store whose reads of holds never answer (a hung replica, a stalled
/// connection) while its writes do.
#[derive(Clone, Default)]
struct HangingInspect(MemoryBackend);

#[async_trait]
impl Backend for HangingInspect {
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

    fn inspector(&self) -> Option<&dyn Inspect> {
        Some(self)
    }
}

#[async_trait]
impl Inspect for HangingInspect {
    async fn inspect(&self, _key: &LockKey) -> Result<Option<moltlock_core::HolderInfo>, Error> {
        std::future::pending().await
    }

    async fn list(&self, _prefix: &str) -> Result<Vec<moltlock_core::HolderInfo>, Error> {
        std::future::pending().await
    }
}

/// Listening for release requests never holds up renewal: with every read
/// of the requests hanging, a listening hold and its neighbour stay valid
/// across several TTLs (and are never asked).
#[tokio::test(start_paused = true)]
async fn a_hanging_request_check_does_not_hold_up_renewal() {
    let m = manager(HangingInspect::default());
    let listening = m.lock("asked").await.unwrap();
    let neighbour = m.lock("beside").await.unwrap();
    assert!(!listening.is_release_requested());
    let heard = tokio::time::timeout(TTL * 4, listening.release_requested()).await;
    assert!(heard.is_err(), "a request was heard that nobody made");
    assert!(listening.is_held(), "the listening hold was lost");
    assert!(neighbour.is_held(), "the neighbour was lost");
    assert!(listening.valid_for().unwrap() > TTL / 2);
}
