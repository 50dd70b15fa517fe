//! SQLite: the conformance suite on a temporary database file, and the
//! checks particular to the embedded store.

use moltlock_core::BackendExt;

use moltlock_core::{Backend, Error, LockManager};
use moltlock_sql::{SqlConfig, SqliteBackend};

fn sqlite() -> moltlock_conformance::Factory {
    let dir = tempfile::tempdir().map_err(|e| e.to_string());
    moltlock_fixtures::conformance_factory(dir, |dir| async move {
        SqliteBackend::connect(&dir.path().join("locks.db").display().to_string()).await
    })
}

moltlock_conformance::conformance_tests!(sqlite(), without: [watch, fair_queue]);

#[tokio::test]
async fn table_names_are_validated() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("x.db").display());
    for bad in ["locks; DROP TABLE x", "a\"b", "", "1abc"] {
        let res = SqliteBackend::with_config(SqlConfig::new(&url).table(bad)).await;
        assert!(matches!(res, Err(Error::Config(_))), "{bad:?}: {res:?}");
    }
    let ok = SqliteBackend::with_config(SqlConfig::new(&url).table("custom_locks")).await;
    assert!(ok.is_ok(), "{ok:?}");
}

#[tokio::test]
async fn migration_is_idempotent_and_keeps_fences() {
    let dir = tempfile::tempdir().unwrap();
    let url = dir.path().join("m.db").display().to_string();
    let first = SqliteBackend::connect(&url).await.unwrap();
    let m = LockManager::new(first.clone());
    let g = m.lock("k").await.unwrap();
    let before = g.fence();
    g.release().await.unwrap();
    first.migrate().await.unwrap();
    let second = SqliteBackend::connect(&url).await.unwrap();
    let g = LockManager::new(second).lock("k").await.unwrap();
    assert!(g.fence() > before, "fence {} after {before}", g.fence());
}

#[tokio::test]
async fn unopenable_file_is_a_clear_error() {
    let res = SqliteBackend::connect("sqlite:///nonexistent-dir/for/sure/locks.db").await;
    let err = res.expect_err("a file in a missing directory opened");
    assert!(!err.to_string().is_empty());
    assert!(!matches!(err, Error::InvalidKey { .. }));
}

#[tokio::test]
async fn names_itself_and_hands_out_its_extensions() {
    let dir = tempfile::tempdir().unwrap();
    let b = SqliteBackend::connect(&dir.path().join("c.db").display().to_string())
        .await
        .unwrap();
    assert_eq!(b.name(), "sqlite");
    let extensions = moltlock_core::extension::extensions(&b);
    assert_eq!(
        extensions,
        ["inspect", "renew_many", "describe", "raise_fence"],
        "SQLite has no release notifications and no fair queue"
    );
}

/// One batch past a statement's 8,000 holds, with two TTLs, a foreign token
/// and a key nobody holds: every live hold is renewed and reported so, and
/// nothing else is.
#[tokio::test]
async fn batch_renewal_reports_each_hold_across_statements() {
    use std::time::Duration;

    use moltlock_core::{CasOutcome, LockKey, RenewItem, Token};

    let dir = tempfile::tempdir().unwrap();
    let b = SqliteBackend::connect(&dir.path().join("r.db").display().to_string())
        .await
        .unwrap();
    let owner = Token::random();
    let ttl = Duration::from_secs(10);
    let mut items = Vec::new();
    for i in 0..8_100 {
        let key = LockKey::new(format!("batch/{i}")).unwrap();
        let out = b.cas(&key, None, &owner, ttl).await.unwrap();
        assert!(matches!(out, CasOutcome::Acquired { .. }), "{out:?}");
        let ttl = Duration::from_secs(if i % 2 == 0 { 30 } else { 40 });
        items.push(RenewItem {
            key,
            token: owner.clone(),
            ttl,
        });
    }
    let foreign = RenewItem {
        key: items[0].key.clone(),
        token: Token::random(),
        ttl,
    };
    let unheld = RenewItem {
        key: LockKey::new("batch/none").unwrap(),
        token: owner.clone(),
        ttl,
    };
    items.push(foreign);
    items.push(unheld);
    let renewed = b.renew_many(&items).await.unwrap();
    assert_eq!(renewed.len(), items.len());
    assert!(
        renewed[..8_100].iter().all(|r| *r),
        "a live hold was not renewed"
    );
    assert_eq!(&renewed[8_100..], &[false, false]);
    // Each hold now runs for the TTL it was renewed with, not the 10 s it
    // was taken with.
    for (i, range) in [(8_098, 20..=30), (8_099, 30..=40)] {
        let key = LockKey::new(format!("batch/{i}")).unwrap();
        let hold = b.inspect(&key).await.unwrap().unwrap();
        assert_eq!(hold.holder, owner);
        let left = hold.expires_in.unwrap().as_secs();
        assert!(range.contains(&left), "hold {i}: {left} s left");
    }
}
