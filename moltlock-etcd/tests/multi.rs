//! `CasMulti` on real etcd: `All` is one atomic Txn, `Any` takes the first
//! free key, fences are per key and respect raised minimums, holds taken
//! together renew and release through the manager, and lists longer than
//! `max_keys` go through the one-cas-per-key fallback.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use moltlock_core::{
    Backend, BackendExt, CasOutcome, Fence, LockKey, LockManager, MultiMode, MultiOutcome,
    RetryPolicy, Token,
};
use moltlock_etcd::{EtcdBackend, EtcdConfig};
use moltlock_fixtures::etcd::{etcd, start_member, start_single, EtcdMember};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const TTL: Duration = Duration::from_secs(10);

async fn open(endpoints: &[String]) -> Result<EtcdBackend, moltlock_core::Error> {
    EtcdBackend::connect(EtcdConfig::new(endpoints.to_vec())).await
}

fn manager(b: EtcdBackend, ttl: Duration) -> Result<LockManager, moltlock_core::Error> {
    LockManager::builder(b)
        .ttl(ttl)
        .retry(RetryPolicy::Fixed(Duration::from_millis(20)))
        .build()
}

fn base(name: &str) -> String {
    format!("etcd-multi/{name}/{}/", uuid::Uuid::new_v4().simple())
}

fn keys(base: &str, n: usize) -> Result<Vec<LockKey>, moltlock_core::Error> {
    (0..n)
        .map(|i| LockKey::new(format!("{base}k{i:02}")))
        .collect()
}

/// The lock keys under `base` and their values, read at one revision.
async fn snapshot(
    b: &EtcdBackend,
    base: &str,
) -> Result<BTreeMap<String, String>, Box<dyn std::error::Error>> {
    let mut c = b.client().clone();
    let opts = etcd_client::GetOptions::new().with_prefix();
    let resp = c
        .get(format!("{}{base}", b.key_prefix()), Some(opts))
        .await?;
    Ok(resp
        .kvs()
        .iter()
        .map(|kv| {
            let k = String::from_utf8_lossy(kv.key()).into_owned();
            (k, String::from_utf8_lossy(kv.value()).into_owned())
        })
        .filter(|(k, _)| !k.contains('\0'))
        .collect())
}

fn taken(outcome: &MultiOutcome) -> Vec<(usize, Fence)> {
    match outcome {
        MultiOutcome::Acquired(t) => t.clone(),
        MultiOutcome::Held(_) => Vec::new(),
    }
}

/// One key held elsewhere: `Held` names it with its holder and revision,
/// and nothing else is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_with_one_key_held_takes_nothing() -> TestResult {
    let etcd = etcd()?;
    let (a, b) = (open(&etcd.endpoints).await?, open(&etcd.endpoints).await?);
    let base = base("all-held");
    let ks = keys(&base, 5)?;
    let other = Token::random();
    assert!(matches!(
        b.cas(&ks[2], None, &other, TTL).await?,
        CasOutcome::Acquired { .. }
    ));
    let mine = Token::random();
    let outcome = a.cas_multi(&ks, &mine, TTL, MultiMode::All).await?;
    let MultiOutcome::Held(busy) = outcome else {
        return Err(format!("took a set with a held key: {outcome:?}").into());
    };
    assert_eq!(busy.len(), 1, "{busy:?}");
    assert_eq!(busy[0].0, 2);
    assert_eq!(busy[0].1.holder.as_ref(), Some(&other));
    assert!(busy[0].1.revision.is_some());
    let seen = snapshot(&a, &base).await?;
    assert_eq!(seen.len(), 1, "only the held key may exist: {seen:?}");
    // The same key held by the caller's own token counts as held.
    b.delete(&ks[2], &other).await?;
    assert!(matches!(
        a.cas(&ks[2], None, &mine, TTL).await?,
        CasOutcome::Acquired { .. }
    ));
    let again = a.cas_multi(&ks, &mine, TTL, MultiMode::All).await?;
    let MultiOutcome::Held(busy) = again else {
        return Err("a key held by the same token counted as free".into());
    };
    assert_eq!(busy[0].1.holder.as_ref(), Some(&mine));
    a.delete(&ks[2], &mine).await?;
    Ok(())
}

/// Two clients race for overlapping sets while an observer reads the keys
/// at one revision at a time: it sees a client's whole set or none of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_observer_never_sees_part_of_a_set() -> TestResult {
    let etcd = etcd()?;
    let base = base("atomic");
    let all = keys(&base, 8)?;
    let (left, right) = (all[0..5].to_vec(), all[3..8].to_vec());
    let observer = open(&etcd.endpoints).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let watching = {
        let (stop, base) = (stop.clone(), base.clone());
        tokio::spawn(async move {
            let mut looks = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let seen = snapshot(&observer, &base)
                    .await
                    .map_err(|e| e.to_string())?;
                let mut per_token: BTreeMap<&String, usize> = BTreeMap::new();
                for v in seen.values() {
                    *per_token.entry(v).or_default() += 1;
                }
                if per_token.values().any(|n| *n != 5) {
                    return Err(format!("saw part of a set: {seen:?}"));
                }
                looks += 1;
            }
            Ok(looks)
        })
    };
    let (a, c) = (open(&etcd.endpoints).await?, open(&etcd.endpoints).await?);
    let mut wins = [0u32; 2];
    for _ in 0..40 {
        let (ta, tc) = (Token::random(), Token::random());
        let (ra, rc) = tokio::join!(
            a.cas_multi(&left, &ta, TTL, MultiMode::All),
            c.cas_multi(&right, &tc, TTL, MultiMode::All),
        );
        let (ra, rc) = (taken(&ra?), taken(&rc?));
        assert!(ra.is_empty() || rc.is_empty(), "both took the shared keys");
        wins[0] += u32::from(!ra.is_empty());
        wins[1] += u32::from(!rc.is_empty());
        // Clear the winner's set in one Txn, so the observer may see it
        // whole or gone.
        let dels: Vec<etcd_client::TxnOp> = all
            .iter()
            .map(|k| etcd_client::TxnOp::delete(format!("{}{}", a.key_prefix(), k.as_str()), None))
            .collect();
        a.client()
            .clone()
            .txn(etcd_client::Txn::new().and_then(dels))
            .await?;
    }
    stop.store(true, Ordering::Relaxed);
    let looks = watching.await??;
    assert!(
        wins[0] + wins[1] >= 40,
        "every round has a winner: {wins:?}"
    );
    println!("wins {wins:?}, {looks} snapshots");
    Ok(())
}

/// `Any` takes the first free key in the order given; with every key busy
/// it reports each of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_takes_the_first_free_key() -> TestResult {
    let etcd = etcd()?;
    let (a, b) = (open(&etcd.endpoints).await?, open(&etcd.endpoints).await?);
    let ks = keys(&base("any"), 4)?;
    let other = Token::random();
    for k in &ks[0..2] {
        b.cas(k, None, &other, TTL).await?;
    }
    let mine = Token::random();
    let got = taken(&a.cas_multi(&ks, &mine, TTL, MultiMode::Any).await?);
    assert_eq!(got.iter().map(|(i, _)| *i).collect::<Vec<_>>(), vec![2]);
    assert!(a.inspect(&ks[3]).await?.is_none(), "a second key was taken");
    let held = a
        .inspect(&ks[2])
        .await?
        .ok_or("the key taken is not held")?;
    assert_eq!(held.holder, mine);
    b.cas(&ks[3], None, &other, TTL).await?;
    let outcome = a
        .cas_multi(&ks, &Token::random(), TTL, MultiMode::Any)
        .await?;
    let MultiOutcome::Held(busy) = outcome else {
        return Err(format!("took a key of a full set: {outcome:?}").into());
    };
    let holders: Vec<(usize, Option<Token>)> =
        busy.into_iter().map(|(i, h)| (i, h.holder)).collect();
    let want = [&other, &other, &mine, &other];
    assert_eq!(
        holders,
        want.iter()
            .enumerate()
            .map(|(i, t)| (i, Some((*t).clone())))
            .collect::<Vec<_>>()
    );
    for (i, k) in ks.iter().enumerate() {
        let owner = if i == 2 { &mine } else { &other };
        b.delete(k, owner).await?;
    }
    Ok(())
}

/// Each key's fence exceeds every earlier fence of that key and its raised
/// minimum, in either mode, and a later single `cas` exceeds it in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_rise_per_key_and_respect_raised_minimums() -> TestResult {
    let etcd = etcd()?;
    let a = open(&etcd.endpoints).await?;
    let ks = keys(&base("fences"), 3)?;
    let t = Token::random();
    let CasOutcome::Acquired { fence: single } = a.cas(&ks[0], None, &t, TTL).await? else {
        return Err("a free key was held".into());
    };
    a.delete(&ks[0], &t).await?;
    let first = taken(&a.cas_multi(&ks[0..2], &t, TTL, MultiMode::All).await?);
    assert!(first[0].1 > single, "{first:?} after {single:?}");
    let minimum = Fence(first[1].1.get() + 1_000_000);
    a.raise_fence(&ks[1], minimum).await?;
    a.raise_fence(&ks[2], Fence(minimum.get() * 2)).await?;
    for k in &ks[0..2] {
        a.delete(k, &t).await?;
    }
    let second = taken(&a.cas_multi(&ks[0..2], &t, TTL, MultiMode::All).await?);
    assert!(
        second[0].1 > first[0].1 && second[0].1 < minimum,
        "{second:?}"
    );
    assert!(
        second[1].1 > minimum,
        "{second:?} ignores the minimum {minimum:?}"
    );
    let any = taken(&a.cas_multi(&ks[1..3], &t, TTL, MultiMode::Any).await?);
    assert_eq!(any[0].0, 1, "ks[1] is held, so Any takes ks[2]");
    assert!(any[0].1 > Fence(minimum.get() * 2), "{any:?}");
    a.delete(&ks[1], &t).await?;
    let CasOutcome::Acquired { fence: after } = a.cas(&ks[1], None, &t, TTL).await? else {
        return Err("a free key was held".into());
    };
    assert!(after > second[1].1);
    for k in &ks {
        a.delete(k, &t).await?;
    }
    Ok(())
}

/// Holds taken together (a multi-lock, semaphore permits) are renewed past
/// several TTLs and released through the manager.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manager_renews_and_releases_holds_taken_together() -> TestResult {
    let etcd = etcd()?;
    let ttl = Duration::from_secs(2);
    let a = open(&etcd.endpoints).await?;
    let m = manager(a.clone(), ttl)?;
    let base = base("manager");
    let names: Vec<String> = (0..6).map(|i| format!("{base}m{i}")).collect();
    let multi = m.lock_all(&names, Default::default()).await?;
    let sem = m.semaphore(format!("{base}sem"), 3)?;
    let permits = [
        sem.acquire().await?,
        sem.acquire().await?,
        sem.acquire().await?,
    ];
    assert!(
        sem.try_acquire().await?.is_none(),
        "a fourth permit of three"
    );
    tokio::time::sleep(ttl * 3).await;
    assert!(multi.is_held());
    assert!(permits.iter().all(|p| p.guard().is_held()));
    assert_eq!(
        snapshot(&a, &base).await?.len(),
        9,
        "a renewed hold expired"
    );
    multi.release().await?;
    let [p0, p1, p2] = permits;
    p0.release().await?;
    let again = sem
        .try_acquire()
        .await?
        .ok_or("a released permit was not free")?;
    for p in [p1, p2, again] {
        p.release().await?;
    }
    assert!(
        snapshot(&a, &base).await?.is_empty(),
        "released keys remain"
    );
    Ok(())
}

/// At `max_keys` the native Txn is accepted by etcd in both modes (the
/// deepest `Any` chain included); longer lists go through the fallback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_keys_fits_etcd_and_longer_lists_fall_back() -> TestResult {
    let etcd = etcd()?;
    let (a, b) = (open(&etcd.endpoints).await?, open(&etcd.endpoints).await?);
    let n = a.batch_cas().ok_or("no CasMulti")?.max_keys();
    assert_eq!(n, 42);
    let base = base("max");
    let ks = keys(&base, n + 8)?;
    let t = Token::random();
    let all = taken(&a.cas_multi(&ks[0..n], &t, TTL, MultiMode::All).await?);
    assert_eq!(all.len(), n);
    for k in &ks[0..n] {
        a.delete(k, &t).await?;
    }
    let other = Token::random();
    for k in &ks[0..n - 1] {
        b.cas(k, None, &other, TTL).await?;
    }
    let any = taken(&a.cas_multi(&ks[0..n], &t, TTL, MultiMode::Any).await?);
    assert_eq!(any.iter().map(|(i, _)| *i).collect::<Vec<_>>(), vec![n - 1]);
    a.delete(&ks[n - 1], &t).await?;
    for k in &ks[0..n - 1] {
        b.delete(k, &other).await?;
    }
    let long = taken(&a.cas_multi(&ks, &t, TTL, MultiMode::All).await?);
    assert_eq!(long.len(), n + 8);
    for k in &ks {
        a.delete(k, &t).await?;
    }
    let m = manager(a.clone(), TTL)?;
    let names: Vec<String> = ks.iter().map(|k| k.as_str().to_owned()).collect();
    let g = m.lock_all(&names, Default::default()).await?;
    assert_eq!(g.guards().len(), n + 8);
    g.release().await?;
    assert!(snapshot(&a, &base).await?.is_empty());
    Ok(())
}

/// The requests etcd has started, by method, from its `/metrics`.
fn started(port: u16) -> Result<BTreeMap<String, u64>, Box<dyn std::error::Error>> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(s, "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let mut out = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("grpc_server_started_total{"))
    {
        let method = line
            .split("grpc_method=\"")
            .nth(1)
            .and_then(|r| r.split('"').next());
        let count = line.rsplit(' ').next().and_then(|c| c.parse::<f64>().ok());
        if let (Some(m), Some(c)) = (method, count) {
            *out.entry(m.to_owned()).or_default() += c as u64;
        }
    }
    Ok(out)
}

/// Requests between two `started` readings.
fn delta(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter_map(|(m, n)| {
            let d = n - before.get(m).copied().unwrap_or(0);
            (d > 0).then(|| (m.clone(), d))
        })
        .collect()
}

/// One call is one Txn once the session has its lease: taking, failing
/// and `Any` down to the last key alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_call_is_one_txn() -> TestResult {
    let server = start_single()?;
    let endpoints = vec![server.endpoint()];
    let (a, b) = (open(&endpoints).await?, open(&endpoints).await?);
    let ks = keys(&base("trips"), 10)?;
    let (t, other) = (Token::random(), Token::random());
    b.cas(&ks[9], None, &other, TTL).await?;
    a.cas(&ks[0], None, &t, TTL).await?; // grants the session's lease
    a.delete(&ks[0], &t).await?;
    let one_txn: BTreeMap<String, u64> = [("Txn".to_owned(), 1)].into();
    for (range, mode) in [
        (0..9, MultiMode::All),
        (0..10, MultiMode::All),
        (0..10, MultiMode::Any),
        (5..10, MultiMode::Any),
    ] {
        let before = started(server.client_port)?;
        a.cas_multi(&ks[range.clone()], &t, TTL, mode).await?;
        assert_eq!(
            delta(&before, &started(server.client_port)?),
            one_txn,
            "{range:?} {mode:?}"
        );
    }
    Ok(())
}

/// A private etcd whose `--max-txn-ops` is `ops`.
fn start_limited(ops: usize) -> Result<EtcdMember, Box<dyn std::error::Error>> {
    let (c, p) = (
        std::net::TcpListener::bind("127.0.0.1:0")?,
        std::net::TcpListener::bind("127.0.0.1:0")?,
    );
    let (client, peer) = (c.local_addr()?.port(), p.local_addr()?.port());
    drop((c, p));
    let cluster = format!("m0=http://127.0.0.1:{peer}");
    let extra = ["--max-txn-ops".to_owned(), ops.to_string()];
    Ok(start_member("m0", client, peer, &cluster, &extra)?)
}

/// A server with a lower `--max-txn-ops`: configured, a call stays one Txn
/// within the lower limit; not configured, a refused Txn falls back to one
/// cas per key, with the same outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lower_server_limit_is_configured_or_falls_back() -> TestResult {
    let server = start_limited(16)?;
    let endpoints = vec![server.endpoint()];
    let (unaware, b) = (open(&endpoints).await?, open(&endpoints).await?);
    let ks = keys(&base("limited"), 10)?;
    let (t, other) = (Token::random(), Token::random());
    let all = taken(&unaware.cas_multi(&ks, &t, TTL, MultiMode::All).await?);
    assert_eq!(all.len(), 10);
    for k in &ks {
        unaware.delete(k, &t).await?;
    }
    for k in &ks[0..7] {
        b.cas(k, None, &other, TTL).await?;
    }
    let any = taken(&unaware.cas_multi(&ks, &t, TTL, MultiMode::Any).await?);
    assert_eq!(any.iter().map(|(i, _)| *i).collect::<Vec<_>>(), vec![7]);
    unaware.delete(&ks[7], &t).await?;
    for k in &ks[0..7] {
        b.delete(k, &other).await?;
    }
    let aware = EtcdBackend::connect(EtcdConfig::new(endpoints).max_txn_ops(16)).await?;
    assert_eq!(aware.batch_cas().ok_or("no CasMulti")?.max_keys(), 5);
    aware.cas(&ks[9], None, &t, TTL).await?; // grants the session's lease
    aware.delete(&ks[9], &t).await?;
    let one_txn: BTreeMap<String, u64> = [("Txn".to_owned(), 1)].into();
    for (range, mode, want) in [(5..10, MultiMode::All, 5), (3..8, MultiMode::Any, 1)] {
        let before = started(server.client_port)?;
        let got = taken(&aware.cas_multi(&ks[range.clone()], &t, TTL, mode).await?);
        assert_eq!(got.len(), want, "{range:?} {mode:?}");
        assert_eq!(
            delta(&before, &started(server.client_port)?),
            one_txn,
            "{range:?} {mode:?}"
        );
    }
    Ok(())
}
