//! A three-member etcd cluster loses its leader (SIGKILL) while 8 tasks
//! contend on one key: no two tasks are ever inside at once, no stale fence
//! reaches the resource, and acquisitions resume after the election.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use moltlock_conformance::{FencedResource, OverlapDetector};
use moltlock_core::{LockManager, RetryPolicy};
use moltlock_etcd::{EtcdBackend, EtcdConfig};
use moltlock_fixtures::etcd::EtcdCluster;
use tokio::time::Instant;

const TASKS: usize = 8;
const RUN: Duration = Duration::from_secs(24);
const KILL_AFTER: Duration = Duration::from_secs(4);

#[derive(Default)]
struct Tally {
    acquired: AtomicU64,
    after_kill: AtomicU64,
    stale: AtomicU64,
    errors: AtomicU64,
    killed_at: Mutex<Option<Instant>>,
}

impl Tally {
    fn killed(&self) -> Option<Instant> {
        self.killed_at.lock().ok().and_then(|k| *k)
    }
}

async fn manager(endpoints: Vec<String>) -> Result<LockManager, moltlock_core::Error> {
    let cfg = EtcdConfig::new(endpoints)
        .request_timeout(Duration::from_secs(1))
        .connect_timeout(Duration::from_secs(1));
    LockManager::builder(EtcdBackend::connect(cfg).await?)
        .ttl(Duration::from_secs(3))
        .retry(RetryPolicy::Fixed(Duration::from_millis(50)))
        .build()
}

async fn contend(
    m: LockManager,
    until: Instant,
    d: OverlapDetector,
    r: FencedResource,
    t: Arc<Tally>,
) {
    let key = "cluster/contended";
    while Instant::now() < until {
        let g = match m.lock_timeout(key, Duration::from_secs(3)).await {
            Ok(g) => g,
            Err(_) => {
                t.errors.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        if g.check().is_ok() {
            d.enter();
            if !r.write(g.fence()) {
                t.stale.fetch_add(1, Ordering::Relaxed);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
            d.exit();
            t.acquired.fetch_add(1, Ordering::Relaxed);
            if t.killed()
                .is_some_and(|k| k.elapsed() > Duration::from_millis(1))
            {
                t.after_kill.fetch_add(1, Ordering::Relaxed);
            }
        }
        let _ = g.release().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_kill_keeps_mutual_exclusion() -> Result<(), Box<dyn std::error::Error>> {
    // Started on the test's own thread: the fixture ties each server's life
    // to the thread that started it (parent-death signal), and blocking-pool
    // threads exit when idle.
    let mut cluster = EtcdCluster::start(3)?;
    let endpoints = cluster.endpoints();
    let (d, r, tally) = (
        OverlapDetector::new(),
        FencedResource::new(),
        Arc::new(Tally::default()),
    );
    let started = Instant::now();
    let mut tasks = Vec::new();

    for _ in 0..TASKS {
        let m = manager(endpoints.clone()).await?;
        tasks.push(tokio::spawn(contend(
            m,
            started + RUN,
            d.clone(),
            r.clone(),
            tally.clone(),
        )));
    }
    tokio::time::sleep(KILL_AFTER).await;
    let before = tally.acquired.load(Ordering::Relaxed);
    let (killed, cluster) = tokio::task::spawn_blocking(move || {
        let killed = cluster.kill_leader();
        (killed, cluster)
    })
    .await?;
    let killed = killed?;
    if let Ok(mut k) = tally.killed_at.lock() {
        *k = Some(Instant::now());
    }
    let new_leader = tokio::task::spawn_blocking(move || {
        let l = cluster.wait_for_leader(Duration::from_secs(15));
        (l, cluster)
    })
    .await?;
    let (new_leader, _cluster) = (new_leader.0?, new_leader.1);
    for t in tasks {
        tokio::time::timeout(RUN + Duration::from_secs(20), t).await??;
    }
    let after = tally.after_kill.load(Ordering::Relaxed);
    println!(
        "killed leader m{killed}, new leader m{new_leader}; {before} acquisitions before, {after} after; {} errors",
        tally.errors.load(Ordering::Relaxed)
    );
    assert!(before > 0, "nothing was acquired before the kill");
    assert_eq!(d.overlaps(), 0, "overlapping critical sections");
    assert_eq!(
        tally.stale.load(Ordering::Relaxed),
        0,
        "a stale fence reached the resource"
    );
    assert!(after > 0, "no acquisition after the leader was killed");
    Ok(())
}
