//! SQLite: the conformance suite on a temporary database file, and the
//! checks particular to the embedded store.

use std::sync::Arc;

use moltlock_core::{Backend, Error, LockManager};
use moltlock_sql::{SqlConfig, SqliteBackend};

fn sqlite() -> moltlock_conformance::Factory {
    let dir = Arc::new(tempfile::tempdir());
    moltlock_conformance::factory(move || {
        let dir = dir.clone();
        async move {
            let dir = dir
                .as_ref()
                .as_ref()
                .map_err(|e| Error::Config(e.to_string()))?;
            SqliteBackend::connect(&dir.path().join("locks.db").display().to_string()).await
        }
    })
}

moltlock_conformance::conformance_tests!(sqlite());

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
async fn names_itself_and_declares_capabilities() {
    let dir = tempfile::tempdir().unwrap();
    let b = SqliteBackend::connect(&dir.path().join("c.db").display().to_string())
        .await
        .unwrap();
    assert_eq!(b.name(), "sqlite");
    let caps = b.capabilities();
    assert!(caps.inspect && caps.batch_renew && !caps.notifies_release);
}
