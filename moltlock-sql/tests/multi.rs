//! Taking several keys in one request (`CasMulti`) on each dialect:
//! Postgres and MariaDB/MySQL on the shared servers (or the fixtures'),
//! SQLite in a temporary file, each test on a table of its own that it
//! drops afterwards.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use moltlock_core::{
    Backend, CasOutcome, Fence, LockKey, LockManager, LockOptions, MultiMode, MultiOutcome, Token,
};
use moltlock_fixtures::{mysql as my_fixture, postgres as pg_fixture};
use moltlock_sql::{Expiry, MySqlBackend, PostgresBackend, SqlConfig, SqliteBackend};

const TTL: Duration = Duration::from_secs(10);

type Check = fn(Arc<dyn Backend>) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

fn suffix() -> String {
    Token::random().as_str().replace('-', "")[..12].to_owned()
}

/// Runs `check` on a fresh Postgres table, then drops the table.
async fn on_postgres(check: Check, observed: bool) {
    let url = pg_fixture::shared_url().unwrap();
    let table = format!("multi_{}", suffix());
    let expiry = match observed {
        true => Expiry::Observed,
        false => Expiry::StoreClock,
    };
    let cfg = SqlConfig::from_url(&url)
        .unwrap()
        .table(&table)
        .expiry(expiry);
    let b = PostgresBackend::connect(cfg).await.unwrap();
    let ran = tokio::spawn(check(Arc::new(b.clone()))).await;
    for drop in [
        format!("DROP TABLE IF EXISTS \"{table}\", \"{table}_queue\""),
        format!("DROP SEQUENCE IF EXISTS \"{table}_fence\""),
    ] {
        sqlx::query(&drop).execute(b.pool()).await.unwrap();
    }
    if let Err(e) = ran {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// Runs `check` on a fresh MySQL table, then drops it.
async fn on_mysql(check: Check) {
    let url = my_fixture::shared_url().unwrap();
    let table = format!("multi_{}", suffix());
    let cfg = SqlConfig::from_url(&url).unwrap().table(&table);
    let b = MySqlBackend::connect(cfg).await.unwrap();
    let ran = tokio::spawn(check(Arc::new(b.clone()))).await;
    let drop = format!("DROP TABLE IF EXISTS `{table}`, `{table}_floor`, `{table}_queue`");
    sqlx::query(&drop).execute(b.pool()).await.unwrap();
    if let Err(e) = ran {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// Runs `check` on a fresh SQLite file.
async fn on_sqlite(check: Check, observed: bool) {
    let dir = tempfile::tempdir().unwrap();
    let mode = if observed { "?expiry=observed" } else { "" };
    let url = format!("sqlite://{}{mode}", dir.path().join("m.db").display());
    let b = SqliteBackend::from_url(&url).await.unwrap();
    check(Arc::new(b)).await;
}

fn keys(prefix: &str, names: &[&str]) -> Vec<LockKey> {
    names
        .iter()
        .map(|n| LockKey::new(format!("{prefix}/{n}")).unwrap())
        .collect()
}

async fn multi(b: &dyn Backend, keys: &[LockKey], t: &Token, mode: MultiMode) -> MultiOutcome {
    let batch = b
        .batch_cas()
        .expect("the SQL backends take batches natively");
    batch.cas_multi(keys, t, TTL, mode).await.unwrap()
}

async fn take(b: &dyn Backend, key: &LockKey, t: &Token, ttl: Duration) -> Fence {
    match b.cas(key, None, t, ttl).await.unwrap() {
        CasOutcome::Acquired { fence } => fence,
        CasOutcome::Held(h) => panic!("{key:?} is held: {h:?}"),
    }
}

fn taken(out: &MultiOutcome) -> Vec<(usize, Fence)> {
    match out {
        MultiOutcome::Acquired(t) => t.clone(),
        MultiOutcome::Held(h) => panic!("nothing taken: {h:?}"),
    }
}

/// One key held by another token: `Held` names it with what `cas`
/// reports, and no other key was taken.
fn all_is_atomic(b: Arc<dyn Backend>) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> {
    Box::pin(async move {
        let k = keys("atomic", &["c", "a", "b"]);
        let (other, me) = (Token::random(), Token::random());
        take(&*b, &k[2], &other, TTL).await;
        let out = multi(&*b, &k, &me, MultiMode::All).await;
        let MultiOutcome::Held(busy) = out else {
            panic!("taken while a key is held: {out:?}")
        };
        let (i, held) = &busy[0];
        assert_eq!(*i, 2, "{busy:?}");
        assert_eq!(held.holder.as_ref(), Some(&other));
        assert!(held.expires_in.is_some_and(|d| d <= TTL), "{held:?}");
        let single = b.cas(&k[2], None, &me, TTL).await.unwrap();
        let CasOutcome::Held(single) = single else {
            panic!("{single:?}")
        };
        assert_eq!(single.holder, held.holder);
        for key in [&k[0], &k[1]] {
            let seen = b.inspector().unwrap().inspect(key).await.unwrap();
            assert!(seen.is_none(), "{key:?} was taken: {seen:?}");
        }
        // The same token holding a key counts as held, reported as its own.
        assert!(b.delete(&k[2], &other).await.unwrap());
        take(&*b, &k[2], &me, TTL).await;
        let out = multi(&*b, &k, &me, MultiMode::All).await;
        let MultiOutcome::Held(busy) = out else {
            panic!("{out:?}")
        };
        assert_eq!(busy[0].1.holder.as_ref(), Some(&me));
        assert!(b.delete(&k[2], &me).await.unwrap());
        let got = taken(&multi(&*b, &k, &me, MultiMode::All).await);
        assert_eq!(got.iter().map(|(i, _)| *i).collect::<Vec<_>>(), [0, 1, 2]);
        for key in &k {
            let seen = b.inspector().unwrap().inspect(key).await.unwrap().unwrap();
            assert_eq!(seen.holder, me);
        }
    })
}

/// Two tokens take and release one set over and over (releasing in key
/// order); an observer listing the keys never sees the first key held by a
/// token without every other key held by it too.
fn no_one_sees_part_of_a_set(
    b: Arc<dyn Backend>,
) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> {
    Box::pin(async move {
        let k = keys("seen", &["k0", "k1", "k2", "k3"]);
        let done = Arc::new(AtomicBool::new(false));
        let observer = {
            let (b, done) = (b.clone(), done.clone());
            tokio::spawn(async move {
                let mut looks = 0;
                while !done.load(Ordering::Relaxed) {
                    let held = b.inspector().unwrap().list("seen/").await.unwrap();
                    if let Some(first) = held.iter().find(|h| h.key == "seen/k0") {
                        let same = held.iter().filter(|h| h.holder == first.holder).count();
                        assert_eq!(same, 4, "part of a set seen held: {held:?}");
                    }
                    looks += 1;
                }
                looks
            })
        };
        let mut takers = Vec::new();
        for _ in 0..2 {
            let (b, k) = (b.clone(), k.clone());
            takers.push(tokio::spawn(async move {
                let mut wins = 0;
                for _ in 0..40 {
                    let t = Token::random();
                    if let MultiOutcome::Acquired(_) = multi(&*b, &k, &t, MultiMode::All).await {
                        wins += 1;
                        for key in &k {
                            assert!(b.delete(key, &t).await.unwrap());
                        }
                    }
                }
                wins
            }));
        }
        let mut wins = 0;
        for t in takers {
            wins += t.await.unwrap();
        }
        done.store(true, Ordering::Relaxed);
        let looks = observer.await.unwrap();
        assert!(wins > 0 && looks > 0, "wins {wins}, looks {looks}");
    })
}

/// A batch racing single acquisitions of its keys, each round on keys no
/// row exists for yet: either the batch holds every key and the single
/// acquisitions were refused, or the batch took nothing.
fn races_with_single_acquisitions(
    b: Arc<dyn Backend>,
) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> {
    Box::pin(async move {
        for round in 0..60 {
            let k = keys(&format!("race{round}"), &["a", "b", "c"]);
            let me = Token::random();
            let batch = {
                let (b, k, me) = (b.clone(), k.clone(), me.clone());
                tokio::spawn(async move { multi(&*b, &k, &me, MultiMode::All).await })
            };
            let mut singles = Vec::new();
            for key in [&k[1], &k[2]] {
                let (b, key) = (b.clone(), key.clone());
                singles.push(tokio::spawn(async move {
                    let t = Token::random();
                    let out = b.cas(&key, None, &t, TTL).await.unwrap();
                    matches!(out, CasOutcome::Acquired { .. })
                }));
            }
            let out = batch.await.unwrap();
            let mut single_won = false;
            for s in singles {
                single_won |= s.await.unwrap();
            }
            let holds = b
                .inspector()
                .unwrap()
                .list(&format!("race{round}/"))
                .await
                .unwrap();
            let mine = holds.iter().filter(|h| h.holder == me).count();
            match out {
                MultiOutcome::Acquired(_) => {
                    assert!(!single_won, "round {round}: a key was taken twice");
                    assert_eq!(mine, 3, "round {round}: {holds:?}");
                }
                MultiOutcome::Held(busy) => {
                    assert!(single_won, "round {round}: refused for nothing: {busy:?}");
                    assert_eq!(mine, 0, "round {round}: part of a set left: {holds:?}");
                }
            }
        }
    })
}

/// `Any` takes the first free key in the order given, else reports every
/// key.
fn any_takes_the_first_free_key(
    b: Arc<dyn Backend>,
) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> {
    Box::pin(async move {
        let k = keys("any", &["s2", "s0", "s1"]);
        let (other, me) = (Token::random(), Token::random());
        take(&*b, &k[0], &other, TTL).await;
        let got = taken(&multi(&*b, &k, &me, MultiMode::Any).await);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, 1, "not the first free key: {got:?}");
        let got = taken(&multi(&*b, &k, &other, MultiMode::Any).await);
        assert_eq!(got[0].0, 2, "{got:?}");
        let out = multi(&*b, &k, &me, MultiMode::Any).await;
        let MultiOutcome::Held(busy) = out else {
            panic!("{out:?}")
        };
        let holders: Vec<_> = busy.iter().map(|(i, h)| (*i, h.holder.clone())).collect();
        assert_eq!(
            holders,
            [
                (0, Some(other.clone())),
                (1, Some(me.clone())),
                (2, Some(other))
            ]
        );
        assert!(busy.iter().all(|(_, h)| h.expires_in.is_some()), "{busy:?}");
    })
}

/// Fences of each key rise across batches and single acquisitions, and
/// exceed a raised minimum.
fn fences_rise_per_key(b: Arc<dyn Backend>) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> {
    Box::pin(async move {
        let k = keys("fence", &["a", "b"]);
        let t = Token::random();
        let single = take(&*b, &k[0], &t, TTL).await;
        assert!(b.delete(&k[0], &t).await.unwrap());
        let first = taken(&multi(&*b, &k, &t, MultiMode::All).await);
        assert!(first[0].1 > single, "{first:?} after {single:?}");
        assert_ne!(first[0].1, first[1].1);
        for key in &k {
            assert!(b.delete(key, &t).await.unwrap());
        }
        let minimum = Fence(first[1].1.get() + 1_000_000_000);
        b.fence_raiser()
            .unwrap()
            .raise_fence(&k[1], minimum)
            .await
            .unwrap();
        let second = taken(&multi(&*b, &k, &t, MultiMode::All).await);
        assert!(second[0].1 > first[0].1, "{second:?} after {first:?}");
        assert!(second[1].1 > minimum, "{second:?} below {minimum:?}");
        for key in &k {
            assert!(b.delete(key, &t).await.unwrap());
        }
        let any = taken(&multi(&*b, &k[1..], &t, MultiMode::Any).await);
        assert!(any[0].1 > second[1].1, "{any:?} after {second:?}");
        let again = take(&*b, &k[0], &Token::random(), TTL).await;
        assert!(b.delete(&k[1], &t).await.unwrap());
        assert!(again > second[0].1);
    })
}

/// A hold past its TTL counts as free for both modes.
fn expired_holds_are_free(
    b: Arc<dyn Backend>,
) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> {
    Box::pin(async move {
        let k = keys("expired", &["a", "b"]);
        let (other, me) = (Token::random(), Token::random());
        let short = Duration::from_millis(300);
        let old = take(&*b, &k[1], &other, short).await;
        tokio::time::sleep(short * 2).await;
        let got = taken(&multi(&*b, &k, &me, MultiMode::All).await);
        assert!(got[1].1 > old);
        for key in &k {
            assert!(b.delete(key, &me).await.unwrap());
        }
        take(&*b, &k[0], &other, short).await;
        tokio::time::sleep(short * 2).await;
        let got = taken(&multi(&*b, &k, &me, MultiMode::Any).await);
        assert_eq!(got[0].0, 0, "{got:?}");
    })
}

/// The manager's multi-lock and semaphore, on top of the batch.
fn manager_sets_work(b: Arc<dyn Backend>) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> {
    Box::pin(async move {
        let m = LockManager::new(b.clone());
        let all = m
            .lock_all(["set/x", "set/y", "set/z"], LockOptions::new())
            .await
            .unwrap();
        assert!(all.is_held());
        let other = LockManager::new(b.clone());
        let busy = other
            .try_lock_all(["set/y", "set/w"], LockOptions::new())
            .await
            .unwrap();
        assert!(busy.is_none());
        let w = b
            .inspector()
            .unwrap()
            .inspect(&LockKey::new("set/w").unwrap())
            .await;
        assert!(
            w.unwrap().is_none(),
            "a part of a refused set was left held"
        );
        all.release().await.unwrap();
        let later = other
            .lock_all(
                ["set/y", "set/w"],
                LockOptions::new().timeout(Duration::from_secs(5)),
            )
            .await
            .unwrap();
        later.release().await.unwrap();

        let sem = m.semaphore("pool", 2).unwrap();
        let p1 = sem.try_acquire().await.unwrap().expect("a free permit");
        let p2 = sem.try_acquire().await.unwrap().expect("a second permit");
        assert_ne!(p1.slot(), p2.slot());
        assert!(
            sem.try_acquire().await.unwrap().is_none(),
            "a third permit of two"
        );
        assert_eq!(sem.in_use().await.unwrap().len(), 2);
        p1.release().await.unwrap();
        let p3 = sem.acquire_timeout(Duration::from_secs(5)).await.unwrap();
        p2.release().await.unwrap();
        p3.release().await.unwrap();
    })
}

macro_rules! per_dialect {
    ($($check:ident),* $(,)?) => {
        mod pg {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() { super::on_postgres(super::$check, false).await; } )*
        }
        mod pg_observed {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() { super::on_postgres(super::$check, true).await; } )*
        }
        mod mysql {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() { super::on_mysql(super::$check).await; } )*
        }
        mod sqlite {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() { super::on_sqlite(super::$check, false).await; } )*
        }
        mod sqlite_observed {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() { super::on_sqlite(super::$check, true).await; } )*
        }
    };
}

per_dialect!(
    all_is_atomic,
    no_one_sees_part_of_a_set,
    races_with_single_acquisitions,
    any_takes_the_first_free_key,
    fences_rise_per_key,
    manager_sets_work,
);

/// Expiry by the store clock (the observed-expiry mode waits a TTL from
/// its first look instead; `observed.rs` covers it).
mod expiry {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        super::on_postgres(super::expired_holds_are_free, false).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mysql() {
        super::on_mysql(super::expired_holds_are_free).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite() {
        super::on_sqlite(super::expired_holds_are_free, false).await;
    }
}

/// Postgres: a release of a key taken in a batch still notifies its
/// waiters (`LISTEN/NOTIFY`), well before the hold would expire.
fn release_notifies_waiters(
    b: Arc<dyn Backend>,
) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> {
    Box::pin(async move {
        let k = keys("notify", &["a", "b"]);
        let me = Token::random();
        taken(&multi(&*b, &k, &me, MultiMode::All).await);
        let mut watch = b.watcher().unwrap().watch(&k[1]).await.unwrap();
        let CasOutcome::Held(held) = b.cas(&k[1], None, &Token::random(), TTL).await.unwrap()
        else {
            panic!("a key of the batch was free")
        };
        let waiter = tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            watch.released(&held).await.unwrap();
            started.elapsed()
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(b.delete(&k[1], &me).await.unwrap());
        let waited = tokio::time::timeout(Duration::from_secs(3), waiter)
            .await
            .expect("no wake-up after the release")
            .unwrap();
        assert!(waited < TTL / 2, "woken only after {waited:?}");
        assert!(b.delete(&k[0], &me).await.unwrap());
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_release_notifies_waiters() {
    on_postgres(release_notifies_waiters, false).await;
}
