//! SQLite: the conformance suite on a temporary database file, and the
//! checks particular to the embedded store.

use moltlock_core::BackendExt;

use moltlock_core::{Backend, Error, LockManager};
use moltlock_sql::{SqlConfig, SqliteBackend};

fn sqlite() -> moltlock_conformance::Factory {
    let dir = tempfile::tempdir().map_err(|e| e.to_string());
    moltlock_fixtures::conformance_factory(dir, |dir| async move {
        SqliteBackend::from_url(&dir.path().join("locks.db").display().to_string()).await
    })
}

moltlock_conformance::conformance_tests!(sqlite(), without: [watch, in_order]);

#[tokio::test]
async fn table_names_are_validated() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("x.db").display());
    for bad in ["locks; DROP TABLE x", "a\"b", "", "1abc"] {
        let res = SqliteBackend::connect(SqlConfig::from_url(&url).unwrap().table(bad)).await;
        assert!(matches!(res, Err(Error::Config(_))), "{bad:?}: {res:?}");
    }
    let ok = SqliteBackend::connect(SqlConfig::from_url(&url).unwrap().table("custom_locks")).await;
    assert!(ok.is_ok(), "{ok:?}");
}

#[tokio::test]
async fn migration_is_idempotent_and_keeps_fences() {
    let dir = tempfile::tempdir().unwrap();
    let url = dir.path().join("m.db").display().to_string();
    let first = SqliteBackend::from_url(&url).await.unwrap();
    let m = LockManager::new(first.clone());
    let g = m.lock("k").await.unwrap();
    let before = g.fence();
    g.release().await.unwrap();
    first.migrate().await.unwrap();
    let second = SqliteBackend::from_url(&url).await.unwrap();
    let g = LockManager::new(second).lock("k").await.unwrap();
    assert!(g.fence() > before, "fence {} after {before}", g.fence());
}

#[tokio::test]
async fn unopenable_file_is_a_clear_error() {
    let res = SqliteBackend::from_url("sqlite:///nonexistent-dir/for/sure/locks.db").await;
    let err = res.expect_err("a file in a missing directory opened");
    assert!(!err.to_string().is_empty());
    assert!(!matches!(err, Error::InvalidKey { .. }));
}

#[tokio::test]
async fn names_itself_and_hands_out_its_extensions() {
    let dir = tempfile::tempdir().unwrap();
    let b = SqliteBackend::from_url(&dir.path().join("c.db").display().to_string())
        .await
        .unwrap();
    assert_eq!(b.name(), "sqlite");
    let extensions = moltlock_core::extension::extensions(&b);
    assert_eq!(
        extensions,
        [
            "inspect",
            "renew_many",
            "describe",
            "raise_fence",
            "fair_queue",
            "cas_multi"
        ],
        "SQLite has no release notifications"
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
    let b = SqliteBackend::from_url(&dir.path().join("r.db").display().to_string())
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

/// A backend built on the application's own pool takes and releases a
/// lock, and the pool stays the application's, open and usable.
#[tokio::test]
async fn a_backend_on_the_applications_pool_leaves_it_usable() {
    let dir = tempfile::tempdir().unwrap();
    let opts = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(dir.path().join("app.db"))
        .create_if_missing(true);
    let pool = sqlx::SqlitePool::connect_with(opts).await.unwrap();
    sqlx::query("CREATE TABLE app (x INTEGER)")
        .execute(&pool)
        .await
        .unwrap();
    let cfg = SqlConfig::default().table("app_locks");
    let b = SqliteBackend::from_client(pool.clone(), cfg).await.unwrap();
    let manager = LockManager::new(b);
    let g = manager.lock("app/job").await.unwrap();
    assert!(g.is_held());
    g.release().await.unwrap();
    drop(manager);
    sqlx::query("INSERT INTO app VALUES (1)")
        .execute(&pool)
        .await
        .unwrap();
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM app")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert!(!pool.is_closed());
}

/// The URL carries MoltLock's options; they never reach the driver.
#[tokio::test]
async fn options_in_the_url_apply() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "sqlite://{}?table=url_locks&max_connections=2&acquire_timeout=2s&connect_timeout=30s",
        dir.path().join("u.db").display()
    );
    let b = SqliteBackend::from_url(&url).await.unwrap();
    let g = LockManager::new(b.clone()).lock("k").await.unwrap();
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM url_locks")
        .fetch_one(b.pool())
        .await
        .unwrap();
    assert_eq!(n, 1);
    g.release().await.unwrap();
    let bad = SqliteBackend::from_url(&format!("{url}&acquire_timeout=2")).await;
    assert!(matches!(bad, Err(Error::Config(_))), "{bad:?}");
}

/// A locks table made before the table was `WITHOUT ROWID` (a rowid table
/// with the first schema's columns) is brought up to date and serves: a
/// lock taken on it excludes a second taker and its fences keep rising.
#[tokio::test]
async fn a_rowid_table_of_the_first_schema_keeps_working() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    let opts = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true);
    let pool = sqlx::SqlitePool::connect_with(opts).await.unwrap();
    sqlx::query(
        "CREATE TABLE moltlock_locks (key TEXT PRIMARY KEY, owner TEXT NOT NULL, \
         fence INTEGER NOT NULL, expires_at INTEGER NOT NULL, acquired_at INTEGER NOT NULL)",
    )
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;
    let backend = SqliteBackend::from_url(&path.display().to_string())
        .await
        .unwrap();
    let kept: String =
        sqlx::query_scalar("SELECT sql FROM sqlite_master WHERE name = 'moltlock_locks'")
            .fetch_one(backend.pool())
            .await
            .unwrap();
    assert!(
        !kept.contains("WITHOUT ROWID"),
        "the old table was replaced: {kept}"
    );
    let m = LockManager::new(backend.clone());
    let g = m.lock("k").await.unwrap();
    let other = LockManager::new(backend.clone());
    assert!(
        other.try_lock("k").await.unwrap().is_none(),
        "a second taker got a held key"
    );
    let first = g.fence();
    g.release().await.unwrap();
    let g = other.lock("k").await.unwrap();
    assert!(g.fence() > first, "fence {} after {first}", g.fence());
    g.release().await.unwrap();
}

/// A new locks table keeps its rows in the key's B-tree.
#[tokio::test]
async fn a_new_locks_table_is_without_rowid() {
    let dir = tempfile::tempdir().unwrap();
    let backend = SqliteBackend::from_url(&dir.path().join("new.db").display().to_string())
        .await
        .unwrap();
    let sql: String =
        sqlx::query_scalar("SELECT sql FROM sqlite_master WHERE name = 'moltlock_locks'")
            .fetch_one(backend.pool())
            .await
            .unwrap();
    assert!(sql.contains("WITHOUT ROWID"), "{sql}");
}

/// A TTL above core's longest is refused by the backend itself, with the
/// typed error the manager gives, and writes nothing (the statements'
/// expiry arithmetic would overflow).
#[tokio::test]
async fn a_ttl_above_the_longest_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let url = dir.path().join("ttl.db").display().to_string();
    let b = SqliteBackend::from_url(&url).await.unwrap();
    let key: moltlock_core::LockKey = "huge-ttl".parse().unwrap();
    let token = moltlock_core::Token::random();
    let too_long = moltlock_core::MAX_TTL + std::time::Duration::from_millis(1);
    for ttl in [too_long, std::time::Duration::MAX] {
        let res = b.cas(&key, None, &token, ttl).await;
        assert!(
            matches!(res, Err(Error::InvalidTtl { .. })),
            "{ttl:?}: {res:?}"
        );
        let keys = std::slice::from_ref(&key);
        let multi = BackendExt::cas_multi(&b, keys, &token, ttl, moltlock_core::MultiMode::All);
        let multi = multi.await;
        assert!(
            matches!(multi, Err(Error::InvalidTtl { .. })),
            "{ttl:?}: {multi:?}"
        );
    }
    let fair = BackendExt::fair_acquire(&b, &key, &token, too_long).await;
    assert!(matches!(fair, Err(Error::InvalidTtl { .. })), "{fair:?}");
    assert!(
        b.inspect(&key).await.unwrap().is_none(),
        "the key was written"
    );
    let ttl = std::time::Duration::from_secs(30);
    let free = b.cas(&key, None, &token, ttl).await.unwrap();
    assert!(
        matches!(free, moltlock_core::CasOutcome::Acquired { .. }),
        "{free:?}"
    );
    let renew = [moltlock_core::RenewItem {
        key: key.clone(),
        token: token.clone(),
        ttl: too_long,
    }];
    let renewed = b.renew_many(&renew).await;
    assert!(
        matches!(renewed, Err(Error::InvalidTtl { .. })),
        "{renewed:?}"
    );
    let left = b.inspect(&key).await.unwrap().unwrap().expires_in;
    assert!(left.is_some_and(|l| l <= ttl), "renewed anyway: {left:?}");
    assert!(b.delete(&key, &token).await.unwrap());
}

/// No hold ends before its TTL, counted from the send of its request: a
/// second handle that polls the key finds it free only once its probe's
/// reply comes after that. (SQLite's clock reads whole ms, and read through
/// a float it came out a ms low about half the time: holds ended up to
/// 2 ms early; the old statements failed this in its first round.)
/// Polling can only find the key free late, never early, so a loaded
/// machine cannot fail this.
#[tokio::test]
async fn no_hold_ends_before_its_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let url = dir.path().join("ttl.db").display().to_string();
    let holder = SqliteBackend::from_url(&url).await.unwrap();
    let prober = SqliteBackend::from_url(&url).await.unwrap();
    let ttl = std::time::Duration::from_millis(30);
    for round in 0..20 {
        let key: moltlock_core::LockKey = format!("ttl-{round}").parse().unwrap();
        let token = moltlock_core::Token::random();
        let sent = tokio::time::Instant::now();
        let got = holder.cas(&key, None, &token, ttl).await.unwrap();
        assert!(
            matches!(got, moltlock_core::CasOutcome::Acquired { .. }),
            "{got:?}"
        );
        let probe = moltlock_core::Token::random();
        loop {
            let seen = prober.cas(&key, None, &probe, ttl).await.unwrap();
            let replied = tokio::time::Instant::now();
            if let moltlock_core::CasOutcome::Acquired { .. } = seen {
                let early = (sent + ttl).saturating_duration_since(replied);
                assert!(
                    early.is_zero(),
                    "round {round}: free {early:?} before its TTL"
                );
                break;
            }
        }
    }
}
