//! The blocking API: calls from plain threads, renewal while the caller's
//! thread is busy, a release on drop that is done when the drop returns,
//! and a clear error instead of a stalled runtime when called from async
//! code.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap

use std::time::Duration;

use moltlock_core::blocking::{LockManager, TryAcquire};
use moltlock_core::{Error, LockKey, LostReason, MemoryBackend, Token};

const TTL: Duration = Duration::from_millis(600);

/// A blocking manager over `store` with a short TTL.
fn manager(store: &MemoryBackend) -> LockManager {
    let store = store.clone();
    LockManager::start(async move { moltlock_core::LockManager::builder(store).ttl(TTL).build() })
        .unwrap()
}

#[test]
fn lock_excludes_and_release_frees() {
    let store = MemoryBackend::new();
    let (a, b) = (manager(&store), manager(&store));
    let guard = a.lock("k").unwrap();
    assert!(guard.is_held());
    assert!(b.try_lock("k").unwrap().is_none());
    match b.try_acquire("k").unwrap() {
        TryAcquire::Busy(busy) => assert_eq!(busy.fence, Some(guard.fence())),
        TryAcquire::Acquired(_) => panic!("a held key was acquired"),
    }
    assert!(matches!(
        b.lock_timeout("k", Duration::from_millis(100)),
        Err(Error::Timeout { .. })
    ));
    guard.release().unwrap();
    let next = b.try_lock("k").unwrap().expect("the released key was busy");
    assert!(next.fence().0 > 0);
}

/// Holds are renewed on the manager's own runtime while the caller's
/// thread sleeps well past the TTL.
#[test]
fn holds_stay_renewed_while_the_caller_blocks() {
    let store = MemoryBackend::new();
    let (a, b) = (manager(&store), manager(&store));
    let guard = a.lock("k").unwrap();
    std::thread::sleep(TTL * 3);
    assert!(guard.is_held(), "the hold was not renewed");
    assert!(guard.check().is_ok());
    assert!(b.try_lock("k").unwrap().is_none(), "the key expired");
}

#[test]
fn a_dropped_guard_is_released_when_the_drop_returns() {
    let store = MemoryBackend::new();
    let (a, b) = (manager(&store), manager(&store));
    drop(a.lock("k").unwrap());
    assert!(
        b.try_lock("k").unwrap().is_some(),
        "the dropped guard's key was still held"
    );
}

#[test]
fn with_lock_runs_the_closure_under_the_lock() {
    let store = MemoryBackend::new();
    let (a, b) = (manager(&store), manager(&store));
    let fence = a
        .with_lock("k", |guard| {
            assert!(b.try_lock("k").unwrap().is_none(), "not exclusive");
            guard.fence()
        })
        .unwrap();
    let next = b.try_lock("k").unwrap().expect("with_lock kept the key");
    assert!(next.fence() > fence);
}

#[test]
fn the_loss_is_seen_from_a_plain_thread() {
    let store = MemoryBackend::new();
    let a = manager(&store);
    let guard = a.lock("k").unwrap();
    let token = guard.lost_token();
    let owner: Token = guard.token().clone();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        use moltlock_core::Backend;
        let key = LockKey::new("k").unwrap();
        assert!(store.delete(&key, &owner).await.unwrap());
    });
    let reason = guard.wait_lost(TTL * 2).unwrap();
    assert_eq!(reason, Some(LostReason::Refused));
    assert!(token.is_lost());
    assert!(matches!(guard.release(), Err(Error::NotHeld { .. })));
}

#[test]
fn calls_from_inside_a_runtime_fail_clearly() {
    let store = MemoryBackend::new();
    let a = manager(&store);
    let guard = a.lock("held").unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let err = a.lock("k").unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{err}");
        assert!(err.to_string().contains("async runtime"), "{err}");
        // A drop in async code still releases, in the background.
        drop(guard);
    });
    let deadline = std::time::Instant::now() + TTL / 2;
    loop {
        if a.try_lock("held").unwrap().is_some() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the key stayed held");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `observe()` off a runtime (from blocking code) does not panic: its
/// stream says why and ends.
#[test]
fn observing_an_election_off_a_runtime_says_why() {
    let a = manager(&MemoryBackend::new());
    let mut changes = a.manager().election("e").unwrap().observe();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let first = runtime.block_on(changes.next());
    assert!(matches!(first, Some(Err(Error::Config(_)))), "{first:?}");
    assert!(runtime.block_on(changes.next()).is_none());
}
