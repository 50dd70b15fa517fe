//! The blocking API through the facade, on real stores: two managers (two
//! pools, two runtimes) exclude each other, a dropped guard frees its key
//! before the drop returns, and a held key stays held while the caller's
//! thread is blocked past the TTL.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap

use std::time::Duration;

use moltlock::blocking;

fn exclude_and_hand_over(url: &str) {
    let a = blocking::manager(url).unwrap_or_else(|e| panic!("{url}: {e}"));
    let b = blocking::manager(url).unwrap();
    let key = format!("facade-blocking/{}", moltlock::Token::random());
    let _forget = moltlock_fixtures::rows::Forget::new(url, &key);
    let guard = a.lock(&key).unwrap();
    assert!(b.try_lock(&key).unwrap().is_none(), "{url}: taken twice");
    drop(guard);
    let next = b
        .try_lock(&key)
        .unwrap()
        .expect("the dropped guard kept the key");
    let fence = next.fence();
    next.release().unwrap();
    let value = a
        .with_lock(&key, |g| {
            assert!(g.fence() > fence, "{url}: fences went backwards");
            7
        })
        .unwrap();
    assert_eq!(value, 7);
    assert!(
        b.try_lock(&key).unwrap().is_some(),
        "with_lock kept the key"
    );
}

fn sqlite_url(dir: &tempfile::TempDir) -> String {
    format!("sqlite://{}", dir.path().join("blocking.db").display())
}

#[test]
fn sqlite_blocking_managers_exclude_each_other() {
    let dir = tempfile::tempdir().unwrap();
    exclude_and_hand_over(&sqlite_url(&dir));
}

#[test]
fn sqlite_blocking_hold_is_renewed_while_the_thread_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(&dir);
    let make = |url: String| {
        blocking::LockManager::start(async move {
            moltlock::LockManager::builder(moltlock::connect(&url).await?)
                .ttl(Duration::from_secs(1))
                .build()
        })
        .unwrap()
    };
    let (a, b) = (make(url.clone()), make(url));
    let guard = a.lock("renewed").unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    assert!(guard.is_held());
    assert!(b.try_lock("renewed").unwrap().is_none(), "the hold expired");
    guard.release().unwrap();
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_blocking_managers_exclude_each_other() {
    let url = moltlock_fixtures::postgres::shared_url().unwrap_or_else(|e| panic!("{e}"));
    exclude_and_hand_over(&url);
}

#[cfg(feature = "redis")]
#[test]
fn redis_blocking_managers_exclude_each_other() {
    let redis = moltlock_fixtures::redis::redis().unwrap_or_else(|e| panic!("{e}"));
    exclude_and_hand_over(&redis.url());
}
