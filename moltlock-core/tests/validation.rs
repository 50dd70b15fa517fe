//! What the manager checks before anything reaches a backend: key and TTL
//! validation, owner tokens and timeouts. No backend can change these
//! outcomes, so they are proved here once rather than in every backend's
//! conformance run.

#![allow(clippy::unwrap_used)] // helpers shared by the tests below unwrap like the tests do

use std::collections::HashSet;
use std::time::Duration;

use moltlock_core::{
    Error, Forward, Limits, LockGuard, LockManager, LockOptions, MemoryBackend, MAX_KEY_LEN,
    MAX_TTL, MIN_TTL,
};

fn manager() -> LockManager {
    LockManager::builder(MemoryBackend::new())
        .ttl(Duration::from_secs(10))
        .build()
        .unwrap()
}

fn invalid_key(res: Result<Option<LockGuard>, Error>) -> bool {
    matches!(res, Err(Error::InvalidKey { .. }))
}

#[tokio::test]
async fn empty_key_rejected() {
    assert!(invalid_key(manager().try_lock("").await));
}

#[tokio::test]
async fn overlong_key_rejected() {
    let m = manager();
    assert!(invalid_key(m.try_lock("k".repeat(MAX_KEY_LEN + 1)).await));
    assert!(invalid_key(m.try_lock("k".repeat(1 << 20)).await));
    assert!(m.try_lock("k".repeat(MAX_KEY_LEN)).await.unwrap().is_some());
}

/// A backend that declares a 16-byte key limit.
#[derive(Clone, Default)]
struct Short(MemoryBackend);

impl Forward for Short {
    type Inner = MemoryBackend;

    fn inner(&self) -> &MemoryBackend {
        &self.0
    }

    fn limits(&self) -> Limits {
        Limits::new().with_max_key_len(16)
    }
}

#[tokio::test]
async fn backend_key_limit_is_applied() {
    let m = LockManager::new(Short::default());
    assert!(invalid_key(m.try_lock("k".repeat(17)).await));
    assert!(m.try_lock("k".repeat(16)).await.unwrap().is_some());
}

#[tokio::test]
async fn control_character_key_rejected() {
    let m = manager();
    for bad in [
        "a\0b",
        "line\nbreak",
        "esc\u{1b}[0m",
        "tab\there",
        "del\u{7f}",
    ] {
        assert!(invalid_key(m.try_lock(bad).await), "{bad:?} was accepted");
    }
}

#[tokio::test]
async fn bad_ttl_rejected() {
    let store = MemoryBackend::new();
    let m = LockManager::builder(store.clone())
        .ttl(Duration::from_secs(10))
        .build()
        .unwrap();
    let below = MIN_TTL - Duration::from_millis(1);
    for ttl in [Duration::ZERO, below, MAX_TTL + Duration::from_secs(1)] {
        let res = m
            .acquire("ttl", LockOptions::new().ttl(ttl).no_wait())
            .await;
        assert!(
            matches!(res, Err(Error::InvalidTtl { .. })),
            "TTL {ttl:?}: {res:?}"
        );
    }
    assert!(LockManager::builder(store.clone())
        .ttl(Duration::ZERO)
        .build()
        .is_err());
    // Nothing reached the store.
    assert!(LockManager::new(store)
        .try_lock("ttl")
        .await
        .unwrap()
        .is_some());
}

#[tokio::test]
async fn tokens_are_random_uuid_v4() {
    let m = manager();
    let mut seen = HashSet::new();
    for _ in 0..20 {
        let g = m.lock("tokens").await.unwrap();
        let id = uuid::Uuid::parse_str(g.token().as_str()).unwrap();
        assert_eq!(id.get_version_num(), 4);
        assert!(seen.insert(id), "a token repeated");
        g.release().await.unwrap();
    }
}

#[tokio::test]
async fn lock_timeout_returns_timeout_error() {
    let m = manager();
    let _g = m.lock("timeout").await.unwrap();
    let started = tokio::time::Instant::now();
    let res = m.lock_timeout("timeout", Duration::from_millis(300)).await;
    let took = started.elapsed();
    assert!(matches!(res, Err(Error::Timeout { .. })), "{res:?}");
    assert!(took >= Duration::from_millis(290), "early: {took:?}");
    assert!(took < Duration::from_secs(3), "late: {took:?}");
}

/// Keys with the reserved mark are refused everywhere a caller names a
/// key, so no caller's lock can be a semaphore slot or a read-write lock's
/// part; a primitive's name must leave room for its derived keys.
#[tokio::test]
async fn reserved_mark_and_derived_room_are_checked() {
    let m = manager();
    let reserved = format!("jobs{}s0", moltlock_core::RESERVED_MARK);
    assert!(invalid_key(m.try_lock(&reserved).await));
    assert!(matches!(
        m.semaphore(&reserved, 2),
        Err(Error::InvalidKey { .. })
    ));
    assert!(matches!(
        m.rw_lock(&reserved, moltlock_core::RwOptions::new()),
        Err(Error::InvalidKey { .. })
    ));
    let multi = m
        .try_lock_all(["a", reserved.as_str()], LockOptions::new())
        .await;
    assert!(matches!(multi, Err(Error::InvalidKey { .. })), "{multi:?}");
    let room = MAX_KEY_LEN - moltlock_core::DERIVED_ROOM;
    assert!(m.semaphore("n".repeat(room + 1), 2).is_err());
    let sem = m.semaphore("n".repeat(room), 2).unwrap();
    let permit = sem.try_acquire().await.unwrap().unwrap();
    assert!(permit.key().as_str().len() <= MAX_KEY_LEN);
    assert!(matches!(m.semaphore("s", 0), Err(Error::Config(_))));
    assert!(matches!(
        m.semaphore("s", moltlock_core::MAX_PERMITS + 1),
        Err(Error::Config(_))
    ));
    let empty: [&str; 0] = [];
    assert!(matches!(
        m.try_lock_all(empty, LockOptions::new()).await,
        Err(Error::Config(_))
    ));
    assert!(matches!(
        sem.acquire_with(LockOptions::new().fair()).await,
        Err(Error::Config(_))
    ));
}

/// The same key named twice in a multi-lock is one key; the guard lists
/// keys in bytewise order whatever order they were named in.
#[tokio::test]
async fn multi_lock_dedupes_and_sorts() {
    let m = manager();
    let g = m
        .try_lock_all(["b", "a", "b", "c"], LockOptions::new())
        .await
        .unwrap()
        .unwrap();
    let keys: Vec<&str> = g.keys().iter().map(|k| k.as_str()).collect();
    assert_eq!(keys, ["a", "b", "c"]);
    g.release().await.unwrap();
}
