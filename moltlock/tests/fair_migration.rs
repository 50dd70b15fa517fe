//! A fair lock through a `migrate+…` URL: in the `old` and `new` phases the
//! migrating backend is the store that decides, fair queue included, so a
//! fleet on etcd's fair queue keeps it while it migrates to or from etcd.
#![cfg(feature = "etcd")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap

use std::time::Duration;

use moltlock::{connect, Error, LockManager, LockOptions};

/// Two fair waiters behind a holder get the key in the order they queued.
async fn fair_queue_serves_in_order(url: &str) {
    let manager = LockManager::new(connect(url).await.unwrap());
    assert!(
        manager.backend().fair_queue().is_some(),
        "{url}: no fair queue"
    );
    let key = format!("fair-migrate/{}", moltlock::Token::random());
    let fair = || LockOptions::new().fair();
    let holder = manager.acquire(&key, fair()).await.unwrap().unwrap();
    let (order_tx, mut order_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    for n in 0..2 {
        let (manager, key, order_tx) = (manager.clone(), key.clone(), order_tx.clone());
        waiters.push(tokio::spawn(async move {
            let guard = manager.acquire(&key, fair()).await.unwrap().unwrap();
            order_tx.send(n).unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
            guard.release().await.unwrap();
        }));
        // Let waiter n take its place in the queue before the next one comes.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    holder.release().await.unwrap();
    for w in waiters {
        w.await.unwrap();
    }
    let order = [order_rx.recv().await, order_rx.recv().await];
    assert_eq!(order, [Some(0), Some(1)], "{url}: served out of order");
}

/// A fresh etcd and a SQLite file: the servers (kept alive by the caller)
/// and the two URLs.
struct Stores {
    _etcd: moltlock_fixtures::etcd::EtcdMember,
    _dir: tempfile::TempDir,
    sqlite: String,
    etcd: String,
}

fn stores() -> Stores {
    let etcd = moltlock_fixtures::etcd::start_single().unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap();
    Stores {
        sqlite: format!("sqlite://{}", dir.path().join("m.db").display()),
        etcd: format!("etcd://{}", etcd.endpoint()),
        _etcd: etcd,
        _dir: dir,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_lock_works_through_a_migration_to_etcd() {
    let Stores { sqlite, etcd, .. } = &stores();
    fair_queue_serves_in_order(&format!("migrate+new:{sqlite}|{etcd}")).await;
    fair_queue_serves_in_order(&format!("migrate+old:{etcd}|{sqlite}")).await;
}

/// In `both`, two queues cannot hand a key out in one order: a fair lock is
/// refused with a clear error, never silently unfair.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_lock_in_the_both_phase_is_refused() {
    let Stores { sqlite, etcd, .. } = &stores();
    let url = format!("migrate+both:{sqlite}|{etcd}");
    let manager = LockManager::new(connect(&url).await.unwrap());
    let res = manager
        .acquire("fair-both", LockOptions::new().fair())
        .await;
    assert!(
        matches!(
            res,
            Err(Error::Unsupported {
                what: "fair queue",
                ..
            })
        ),
        "{res:?}"
    );
}
