//! etcd-specific behaviour against real servers: cancelled acquisitions,
//! session loss, the fair queue's wake-ups and order, compaction, errors.

use moltlock_core::BackendExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use moltlock_core::{
    Backend, CasOutcome, Error, Fence, LockKey, LockManager, LockOptions, RetryPolicy, Token,
};
use moltlock_etcd::{EtcdBackend, EtcdConfig};
use moltlock_fixtures::etcd::{etcd, start_single, Etcd, EtcdMember};
use tokio::time::Instant;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn server() -> Result<Etcd, String> {
    etcd()
}

async fn open(endpoints: &[String]) -> Result<EtcdBackend, Error> {
    EtcdBackend::connect(EtcdConfig::new(endpoints.to_vec())).await
}

fn manager(b: EtcdBackend, ttl: Duration) -> Result<LockManager, Error> {
    LockManager::builder(b)
        .ttl(ttl)
        .retry(RetryPolicy::Fixed(Duration::from_millis(20)))
        .build()
}

fn key(name: &str) -> String {
    format!("etcd-tests/{name}/{}", uuid::Uuid::new_v4().simple())
}

/// A cheap random number (no extra dependency).
fn rand(seed: u64) -> u64 {
    let x = uuid::Uuid::new_v4().as_u128() as u64;
    x ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Everything stored under the prefix of `key` (lock key and queue entries).
async fn keys_under(b: &EtcdBackend, key: &str) -> Result<Vec<String>, etcd_client::Error> {
    let mut c = b.client().clone();
    let opts = etcd_client::GetOptions::new()
        .with_prefix()
        .with_keys_only();
    let resp = c
        .get(format!("{}{key}", b.key_prefix()), Some(opts))
        .await?;
    Ok(resp
        .kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect())
}

async fn wait_until_empty(
    b: &EtcdBackend,
    key: &str,
    within: Duration,
) -> Result<bool, Box<dyn std::error::Error>> {
    let until = Instant::now() + within;
    loop {
        if keys_under(b, key).await?.is_empty() {
            return Ok(true);
        }
        if Instant::now() >= until {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Acquisitions (plain and fair) dropped at random points leave nothing
/// behind: no lock key and no queue entry, long before the 30 s TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquires_leave_nothing_behind() -> TestResult {
    let etcd = server()?;
    let b = open(&etcd.endpoints).await?;
    let m = manager(b.clone(), Duration::from_secs(30))?;
    let k = key("cancelled");
    let mut finished = 0;
    for i in 0..60u64 {
        let budget = Duration::from_micros(rand(i) % 4000);
        let opts = if i % 2 == 0 {
            LockOptions::new()
        } else {
            LockOptions::new().fair()
        };
        if let Ok(r) = tokio::time::timeout(budget, m.acquire(&k, opts)).await {
            if let Some(g) = r? {
                g.release().await?;
                finished += 1;
            }
        }
    }
    let observer = open(&etcd.endpoints).await?;
    assert!(
        wait_until_empty(&observer, &k, Duration::from_secs(5)).await?,
        "cancelled acquires left keys behind: {:?}",
        keys_under(&observer, &k).await?
    );
    assert_eq!(m.held_count(), 0);
    println!("{finished} of 60 acquisitions finished before their budget");
    Ok(())
}

/// A fair waiter dropped while queued behind a holder removes its entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_fair_waiter_leaves_the_queue() -> TestResult {
    let etcd = server()?;
    let holder = manager(open(&etcd.endpoints).await?, Duration::from_secs(10))?;
    let k = key("fair-dropped");
    let g = holder.lock(&k).await?;
    let waiter = manager(open(&etcd.endpoints).await?, Duration::from_secs(10))?;
    let w = tokio::time::timeout(
        Duration::from_millis(500),
        waiter.acquire(&k, LockOptions::new().fair()),
    )
    .await;
    assert!(w.is_err(), "the fair waiter acquired a held key");
    let observer = open(&etcd.endpoints).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let left = keys_under(&observer, &k).await?;
    assert_eq!(left.len(), 1, "only the lock key should remain: {left:?}");
    g.release().await?;
    assert!(wait_until_empty(&observer, &k, Duration::from_secs(2)).await?);
    Ok(())
}

/// Revoking the session lease behind the manager's back: every hold of
/// the session reports lost, another manager acquires, and the first
/// manager's next acquisition works on a fresh lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoked_session_lease_fires_lost() -> TestResult {
    let etcd = server()?;
    let ttl = Duration::from_secs(3);
    let b = open(&etcd.endpoints).await?;
    let m = manager(b.clone(), ttl)?;
    let (k1, k2) = (key("session-a"), key("session-b"));
    let g1 = m.lock(&k1).await?;
    let g2 = m.lock(&k2).await?;
    let leases = b.lease_ids();
    assert_eq!(
        leases.len(),
        1,
        "one lease per session and TTL, got {leases:?}"
    );
    let mut admin = open(&etcd.endpoints).await?.client().clone();
    admin.lease_revoke(leases[0]).await?;
    let revoked_at = Instant::now();
    let bound = ttl / 3 + ttl / 6 + Duration::from_millis(200);
    tokio::time::timeout(bound, g1.lost())
        .await
        .map_err(|_| "g1 not lost in time")?;
    tokio::time::timeout(bound, g2.lost())
        .await
        .map_err(|_| "g2 not lost in time")?;
    assert!(
        revoked_at.elapsed() < ttl,
        "lost() fired only after a whole TTL"
    );
    let other = manager(open(&etcd.endpoints).await?, ttl)?;
    let taken = other.try_lock(&k1).await?;
    assert!(
        taken.is_some(),
        "another manager could not acquire after the session ended"
    );
    let again = m.lock_timeout(&k2, Duration::from_secs(2)).await?;
    assert!(again.is_held());
    assert_ne!(
        b.lease_ids(),
        leases,
        "a fresh lease should have been granted"
    );
    Ok(())
}

/// Renewal checks a session's holds with one lease query, trusting a key on
/// the lease to carry the token this session last wrote. Two managers share
/// one backend (one session, one lease): when A's key is deleted behind it
/// and B takes the key on the same lease, the key is attached again, yet A
/// must still learn it lost the key, and B must keep it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_session_reacquire_after_delete_is_lost_for_the_first() -> TestResult {
    let etcd = server()?;
    let ttl = Duration::from_secs(3);
    let b = open(&etcd.endpoints).await?;
    let (a, other) = (manager(b.clone(), ttl)?, manager(b.clone(), ttl)?);
    let k = key("same-session");
    let first = a.lock(&k).await?;
    let mut admin = open(&etcd.endpoints).await?.client().clone();
    admin.delete(format!("{}{k}", b.key_prefix()), None).await?;
    let second = other.lock_timeout(&k, Duration::from_secs(2)).await?;
    assert_eq!(b.lease_ids().len(), 1, "both holds share the session lease");
    tokio::time::timeout(ttl, first.lost())
        .await
        .map_err(|_| "the first holder never learnt it lost the key")?;
    assert!(!first.is_held());
    // Several renewal rounds later, the second still holds it.
    tokio::time::sleep(ttl).await;
    assert!(second.is_held(), "the second holder lost a live key");
    let on_store = b.inspect(&LockKey::new(&k)?).await?.map(|h| h.holder);
    assert_eq!(on_store.as_ref(), Some(second.token()));
    Ok(())
}

/// `close()` revokes the session: its holds vanish at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_ends_the_session() -> TestResult {
    let etcd = server()?;
    let b = open(&etcd.endpoints).await?;
    let m = manager(b.clone(), Duration::from_secs(30))?;
    let k = key("close");
    let g = m.lock(&k).await?;
    b.close().await?;
    let observer = open(&etcd.endpoints).await?;
    assert!(wait_until_empty(&observer, &k, Duration::from_secs(1)).await?);
    tokio::time::timeout(Duration::from_secs(12), g.lost())
        .await
        .map_err(|_| "not lost")?;
    Ok(())
}

/// Five fair waiters on five sessions queue behind a fair holder, who asks
/// again right after releasing: everyone is served in arrival order, the
/// releaser last, and each release wakes exactly one waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_queue_wakes_one_waiter_per_release() -> TestResult {
    let etcd = server()?;
    let k = key("fair-wakeups");
    let holder_b = open(&etcd.endpoints).await?;
    let holder = manager(holder_b.clone(), Duration::from_secs(10))?;
    let first = holder
        .acquire(&k, LockOptions::new().fair())
        .await?
        .ok_or("no guard")?;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut backends = Vec::new();
    let mut tasks = Vec::new();
    let mut release_tx = Vec::new();
    for i in 0..5usize {
        let b = open(&etcd.endpoints).await?;
        backends.push(b.clone());
        let (m, k, order) = (
            manager(b, Duration::from_secs(10))?,
            k.clone(),
            order.clone(),
        );
        let (tx, go) = tokio::sync::oneshot::channel::<()>();
        release_tx.push(Some(tx));
        tasks.push(tokio::spawn(async move {
            let g = m
                .acquire(&k, LockOptions::new().fair())
                .await?
                .ok_or(Error::Config("no guard".into()))?;
            if let Ok(mut o) = order.lock() {
                o.push(i);
            }
            let _ = go.await;
            g.release().await
        }));
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let wakeups = |bs: &[EtcdBackend]| {
        bs.iter()
            .map(EtcdBackend::watch_wakeups)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        wakeups(&backends),
        vec![0; 5],
        "a waiter woke before any release"
    );
    first.release().await?;
    let again = {
        let (m, k) = (holder.clone(), k.clone());
        tokio::spawn(async move { m.acquire(&k, LockOptions::new().fair()).await })
    };
    for served in 1..=5usize {
        let until = Instant::now() + Duration::from_secs(5);
        while order.lock().map(|o| o.len()).unwrap_or(0) < served && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let woke: u64 = wakeups(&backends).iter().sum();
        assert_eq!(
            woke,
            served as u64,
            "after {served} releases: wake-ups {:?}",
            wakeups(&backends)
        );
        if let Some(tx) = release_tx.get_mut(served - 1).and_then(Option::take) {
            let _ = tx.send(());
        }
    }
    for t in tasks {
        t.await??;
    }
    let last = again.await??.ok_or("no guard for the releaser")?;
    let got = order.lock().map(|o| o.clone()).unwrap_or_default();
    assert_eq!(got, vec![0, 1, 2, 3, 4], "not served in arrival order");
    assert_eq!(
        wakeups(&backends),
        vec![1; 5],
        "each waiter should wake exactly once"
    );
    last.release().await?;
    Ok(())
}

/// A release between the failed attempt and the watch is not missed, and a
/// watch whose start revision was compacted away wakes instead of failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_sees_earlier_release_and_survives_compaction() -> TestResult {
    let etcd = server()?;
    let a = open(&etcd.endpoints).await?;
    let b = open(&etcd.endpoints).await?;
    let k: LockKey = key("watch").parse()?;
    let owner = Token::random();
    assert!(matches!(
        a.cas(&k, None, &owner, Duration::from_secs(10)).await?,
        CasOutcome::Acquired { .. }
    ));
    let CasOutcome::Held(held) = b
        .cas(&k, None, &Token::random(), Duration::from_secs(10))
        .await?
    else {
        return Err("the key should be held".into());
    };
    assert!(held.revision.is_some() && held.holder.as_ref() == Some(&owner));
    assert!(a.delete(&k, &owner).await?);
    let mut w = b.watch(&k).await?;
    tokio::time::timeout(Duration::from_secs(2), w.released(&held))
        .await
        .map_err(|_| "missed the release")??;

    let mut admin = a.client().clone();
    for i in 0..5 {
        admin
            .put(format!("{}filler", a.key_prefix()), format!("{i}"), None)
            .await?;
    }
    let rev = admin
        .get("x", None)
        .await?
        .header()
        .map_or(0, |h| h.revision());
    admin.compact(rev, None).await?;
    tokio::time::timeout(Duration::from_secs(2), w.released(&held))
        .await
        .map_err(|_| "compacted watch hung")??;
    Ok(())
}

/// A store that is down gives a retryable `Unavailable`, quickly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_down_is_unavailable() -> TestResult {
    let mut own = start_single()?;
    let b = open(&[own.endpoint()]).await?;
    let k: LockKey = key("down").parse()?;
    own.process.kill();
    let started = Instant::now();
    let res = b
        .cas(&k, None, &Token::random(), Duration::from_secs(5))
        .await;
    assert!(
        matches!(&res, Err(e) if e.is_retryable()),
        "expected a retryable error, got {res:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(12));
    let cfg = EtcdConfig::new([own.endpoint()]).connect_timeout(Duration::from_millis(500));
    let res = EtcdBackend::connect(cfg).await;
    assert!(
        matches!(res, Err(Error::Unavailable { .. })),
        "expected Unavailable, got {res:?}"
    );
    Ok(())
}

/// Bad configuration is refused with `Error::Config`.
#[tokio::test]
async fn bad_config_is_refused() {
    assert!(matches!(
        EtcdBackend::connect(EtcdConfig::new(Vec::<String>::new())).await,
        Err(Error::Config(_))
    ));
    assert!(matches!(
        EtcdBackend::connect(EtcdConfig::new(["127.0.0.1:1"]).session_ttl(Duration::from_secs(1)))
            .await,
        Err(Error::Config(_))
    ));
    assert!(matches!(
        EtcdBackend::connect(EtcdConfig::new(["127.0.0.1:1"]).connect_timeout(Duration::ZERO))
            .await,
        Err(Error::Config(_))
    ));
    assert!(matches!(
        EtcdBackend::from_url("http://127.0.0.1:1").await,
        Err(Error::Config(_))
    ));
    let cfg = EtcdConfig::new(["127.0.0.1:1"]).auth("root", "hunter2");
    let shown = format!("{cfg:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
}

/// Every waiter of a backend shares one watch stream: waits add and cancel
/// watches on it, and open no stream of their own (a stream opened and
/// reset per wait draws `ENHANCE_YOUR_CALM` from etcd under contention).
/// Fair and plain waits both count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_share_one_watch_stream() -> TestResult {
    let etcd = server()?;
    let backend = open(&etcd.endpoints).await?;
    let mgr = LockManager::builder(backend.clone())
        .ttl(Duration::from_secs(5))
        .retry(RetryPolicy::Fixed(Duration::from_secs(5)))
        .build()?;
    let k = key("one-stream");
    let mut tasks = Vec::new();
    for i in 0..4 {
        let (m, k) = (mgr.clone(), k.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                let opts = match i % 2 {
                    0 => LockOptions::new().fair(),
                    _ => LockOptions::new(),
                };
                let g = m
                    .acquire(&k, opts)
                    .await?
                    .ok_or(Error::Config("no guard".into()))?;
                tokio::time::sleep(Duration::from_millis(2)).await;
                g.release().await?;
            }
            Ok::<_, Error>(())
        }));
    }
    let started = Instant::now();
    for t in tasks {
        t.await??;
    }
    assert!(
        backend.watch_wakeups() > 0,
        "no waiter was woken by a watch"
    );
    assert_eq!(backend.watch_streams_opened(), 1);
    // 40 hand-offs by watch, not by the 5 s retry policy.
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    Ok(())
}

/// `list` reports a hold's fence with the key's raised floor, exactly as
/// `inspect` does (`moltlock status` reads `list`; during a migration the
/// new store's floors are raised above the old store's fences).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_reports_the_raised_fence_as_inspect_does() -> TestResult {
    let etcd = server()?;
    let b = open(&etcd.endpoints).await?;
    let m = manager(b.clone(), Duration::from_secs(10))?;
    let k = key("raised-list");
    let lk = LockKey::new(&k)?;
    let floor = Fence(1_000_000);
    b.raise_fence(&lk, floor).await?;
    let g = m.lock(&k).await?;
    assert!(g.fence() > floor, "{:?} is not above {floor:?}", g.fence());
    let inspected = b.inspect(&lk).await?.ok_or("inspect saw no holder")?;
    let listed = b.list(&k).await?;
    let listed: Vec<_> = listed.iter().filter(|h| h.key == k).collect();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(inspected.fence, Some(g.fence()), "inspect: {inspected:?}");
    assert_eq!(listed[0].fence, inspected.fence, "list: {listed:?}");
    g.release().await?;
    Ok(())
}

/// A backend built on an application's own client takes and releases a
/// lock, and the client stays usable for the application's own requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_from_an_application_client() -> TestResult {
    let etcd = server()?;
    let mut app = etcd_client::Client::connect(&etcd.endpoints, None).await?;
    let b = EtcdBackend::from_client(app.clone(), EtcdConfig::default().key_prefix("/app-locks"))?;
    assert_eq!(b.key_prefix(), "/app-locks/");
    let m = manager(b.clone(), Duration::from_secs(5))?;
    let k = key("from-client");
    let g = m.lock(&k).await?;
    assert!(m.try_lock(&k).await?.is_none(), "the key is held");
    let stored = app.get(format!("/app-locks/{k}"), None).await?;
    assert_eq!(
        stored.kvs().first().map(|kv| kv.value().to_vec()),
        Some(g.token().as_str().as_bytes().to_vec())
    );
    g.release().await?;
    drop(m);
    drop(b);
    app.put("app/own-key", "still-usable", None).await?;
    let own = app.get("app/own-key", None).await?;
    assert_eq!(
        own.kvs().first().map(|kv| kv.value().to_vec()),
        Some(b"still-usable".to_vec())
    );
    assert!(matches!(
        EtcdBackend::from_client(app, EtcdConfig::default().session_ttl(Duration::ZERO)),
        Err(Error::Config(_))
    ));
    Ok(())
}

/// Waits (at most 5 s) until `member` has answered `n` more Txns than
/// `from`.
async fn txns_reach(member: &EtcdMember, from: u64, n: u64) -> TestResult {
    let deadline = Instant::now() + Duration::from_secs(5);
    while member.kv_requests("Txn")? < from + n {
        if Instant::now() > deadline {
            return Err(format!("etcd answered fewer than {n} Txns within 5 s").into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// A fair waiter joins the queue with one Txn that also reads the entry
/// ahead of its own: queueing behind a holder, and behind another waiter,
/// sends no separate read. The queue still serves in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_waiter_reads_its_place_in_the_txn_that_queues_it() -> TestResult {
    let own = start_single()?;
    let fair = || LockOptions::new().fair();
    let mut managers = Vec::new();
    for _ in 0..3 {
        managers.push(manager(
            open(&[own.endpoint()]).await?,
            Duration::from_secs(10),
        )?);
    }
    let k = key("queue-read");
    let first = managers[0].acquire(&k, fair()).await?.ok_or("no guard")?;
    let (ranges, txns) = (own.kv_requests("Range")?, own.kv_requests("Txn")?);
    // The second: a take that finds the key held, the Txn that queues it,
    // and its take as the head, which finds the key held too.
    let (m, kk) = (managers[1].clone(), k.clone());
    let second = tokio::spawn(async move { m.acquire(&kk, fair()).await });
    txns_reach(&own, txns, 3).await?;
    // The third: a take, and the Txn that queues it behind the second.
    let (m, kk) = (managers[2].clone(), k.clone());
    let third = tokio::spawn(async move { m.acquire(&kk, fair()).await });
    txns_reach(&own, txns, 5).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let reads = own.kv_requests("Range")? - ranges;
    assert_eq!(reads, 0, "queueing two waiters sent {reads} separate reads");

    first.release().await?;
    let second = tokio::time::timeout(Duration::from_secs(5), second).await???;
    let second = second.ok_or("no guard")?;
    assert!(!third.is_finished(), "the third waiter passed the second");
    second.release().await?;
    let third = tokio::time::timeout(Duration::from_secs(5), third).await???;
    third.ok_or("no guard")?.release().await?;
    Ok(())
}
