//! Fences under plain contention: 8 clients (one manager each) take turns on
//! one key until 10,000 hand-offs, on every backend; each new holder's fence
//! must exceed the previous holder's. The count bounds the run, not a clock.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use moltlock::{LockManager, Token};
use moltlock_fixtures as fixtures;

const CLIENTS: usize = 8;
const HANDOFFS: usize = 10_000;

/// Runs the contention on `url` and checks the fences in hold order.
fn fences_rise(url: &str, ttl: Duration) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(contend(url, ttl));
}

async fn contend(url: &str, ttl: Duration) {
    let key = format!("fences/{}", Token::random());
    let _forget = fixtures::rows::Forget::new(url, &key);
    let order: Arc<Mutex<Vec<u64>>> = Arc::default();
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let backend = moltlock::connect(url).await.unwrap();
        let mgr = LockManager::builder(backend).ttl(ttl).build().unwrap();
        let (key, order) = (key.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let guard = mgr.lock(&key).await.unwrap();
                let done = {
                    let mut order = order.lock().unwrap();
                    order.push(guard.fence().get());
                    order.len() >= HANDOFFS
                };
                guard.release().await.unwrap();
                if done {
                    return;
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let order = order.lock().unwrap();
    let back: Vec<_> = order.windows(2).filter(|w| w[1] <= w[0]).collect();
    println!(
        "{url}: {} hand-offs, {} fences not rising",
        order.len(),
        back.len()
    );
    assert!(
        back.is_empty(),
        "{} of {} hand-offs gave a fence not above the previous one, e.g. {:?}",
        back.len(),
        order.len(),
        back.first()
    );
}

#[test]
fn fences_rise_over_10000_handoffs_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    fences_rise(
        &format!("sqlite://{}", dir.path().join("f.db").display()),
        Duration::from_secs(5),
    );
}

#[test]
fn fences_rise_over_10000_handoffs_postgres() {
    fences_rise(
        &fixtures::postgres::shared_url().expect("postgres"),
        Duration::from_secs(5),
    );
}

#[test]
fn fences_rise_over_10000_handoffs_mysql() {
    let url = fixtures::mysql::shared_url().expect("mysql");
    fences_rise(&url, Duration::from_secs(5));
}

#[test]
fn fences_rise_over_10000_handoffs_redis() {
    let redis = fixtures::redis::redis().expect("redis");
    fences_rise(&redis.url(), Duration::from_secs(5));
}

#[test]
fn fences_rise_over_10000_handoffs_etcd() {
    let etcd = fixtures::etcd::etcd().expect("etcd");
    fences_rise(&etcd.url(), Duration::from_secs(5));
}
