//! Postgres: the conformance suite on the shared server (or one the fixture
//! starts), and the checks particular to Postgres on servers of our own.

use moltlock_core::BackendExt;
use std::time::Duration;

use moltlock_core::{Backend, Error, LockManager, Token};
use moltlock_fixtures::postgres::{self, PgOptions};
use moltlock_sql::{PostgresBackend, SqlConfig};

mod pg_common;
use pg_common::{drop_lock_table, shared, uuid_suffix};

fn pg() -> moltlock_conformance::Factory {
    let url = postgres::shared_url();
    moltlock_fixtures::conformance_factory(url.clone(), |url| async move {
        PostgresBackend::from_url(&url).await
    })
    .with_cleanup(moltlock_fixtures::rows::cleanup(url))
}

moltlock_conformance::conformance_tests!(pg(), without: [in_order]);

#[tokio::test]
async fn table_and_schema_names_are_validated() {
    let url = shared();
    for bad in ["x; DROP TABLE y", "a\"b", "", "9z", "Ünïcode"] {
        let res = PostgresBackend::connect(SqlConfig::from_url(&url).unwrap().table(bad)).await;
        assert!(
            matches!(res, Err(Error::Config(_))),
            "table {bad:?}: {res:?}"
        );
        let res = PostgresBackend::connect(SqlConfig::from_url(&url).unwrap().schema(bad)).await;
        assert!(
            matches!(res, Err(Error::Config(_))),
            "schema {bad:?}: {res:?}"
        );
    }
}

#[tokio::test]
async fn custom_schema_and_unlogged_table_work() {
    let url = shared();
    let suffix = uuid_suffix();
    let cfg = SqlConfig::from_url(&url)
        .unwrap()
        .schema(format!("ml_{suffix}"))
        .table("fast_locks")
        .unlogged(true);
    let b = PostgresBackend::connect(cfg).await.unwrap();
    let persistence: String = sqlx::query_scalar(
        "SELECT relpersistence::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND c.relname = 'fast_locks'",
    )
    .bind(format!("ml_{suffix}"))
    .fetch_one(b.pool())
    .await
    .unwrap();
    assert_eq!(persistence, "u", "the table is not unlogged");
    let g = LockManager::new(b.clone()).lock("k").await.unwrap();
    assert!(g.is_held());
    g.release().await.unwrap();
    sqlx::query(&format!("DROP SCHEMA ml_{suffix} CASCADE"))
        .execute(b.pool())
        .await
        .unwrap();
}

#[tokio::test]
async fn concurrent_migrations_do_not_race() {
    let url = shared();
    let table = format!("race_{}", uuid_suffix());
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let cfg = SqlConfig::from_url(&url).unwrap().table(&table);
        tasks.push(tokio::spawn(PostgresBackend::connect(cfg)));
    }
    let mut last = None;
    for t in tasks {
        last = Some(t.await.unwrap().unwrap());
    }
    let b = last.unwrap();
    b.migrate().await.unwrap();
    for stmt in [
        format!("DROP TABLE {table}, {table}_queue"),
        format!("DROP SEQUENCE {table}_fence"),
    ] {
        sqlx::query(&stmt).execute(b.pool()).await.unwrap();
    }
}

#[tokio::test]
async fn ddl_is_documented_for_operators() {
    let ddl = PostgresBackend::ddl(&SqlConfig::from_url("postgres://x/y").unwrap()).unwrap();
    assert!(
        ddl.contains("CREATE SEQUENCE IF NOT EXISTS \"moltlock_locks_fence\""),
        "{ddl}"
    );
    assert!(
        ddl.contains("CREATE TABLE IF NOT EXISTS \"moltlock_locks\""),
        "{ddl}"
    );
}

#[tokio::test]
async fn down_server_is_unavailable() {
    let port = moltlock_fixtures::free_port().unwrap();
    let cfg = SqlConfig::from_url(&format!("postgres://postgres@127.0.0.1:{port}/postgres"))
        .unwrap()
        .acquire_timeout(Duration::from_secs(2));
    let res = PostgresBackend::connect(cfg).await;
    assert!(
        matches!(res, Err(ref e) if e.is_retryable()),
        "expected a retryable Unavailable error: {res:?}"
    );
}

/// The server's clock runs an hour ahead of the client's. Expiry must follow
/// the server: a 2 s hold stays held for about 2 s, then frees. Were the
/// client's clock used for `expires_at`, the hold would be expired on arrival.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_follows_the_database_clock() {
    let opts = PgOptions {
        clock_offset: Some("+1h".into()),
        ..PgOptions::default()
    };
    let server = postgres::start(&opts).unwrap_or_else(|e| panic!("{e}"));
    let b = PostgresBackend::from_url(&server.url).await.unwrap();
    let skew: f64 = sqlx::query_scalar("SELECT extract(epoch FROM now())::float8")
        .fetch_one(b.pool())
        .await
        .unwrap();
    let local = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        skew - local > 3000.0,
        "the server clock is not skewed: {skew} vs {local}"
    );
    let holder = Token::random();
    let key: moltlock_core::LockKey = "skewed".parse().unwrap();
    let out = b
        .cas(&key, None, &holder, Duration::from_secs(2))
        .await
        .unwrap();
    assert!(matches!(out, moltlock_core::CasOutcome::Acquired { .. }));
    let other = Token::random();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let early = b
        .cas(&key, None, &other, Duration::from_secs(2))
        .await
        .unwrap();
    assert!(
        matches!(early, moltlock_core::CasOutcome::Held(_)),
        "the hold expired at once: expiry used the client's clock"
    );
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let late = b
        .cas(&key, None, &other, Duration::from_secs(2))
        .await
        .unwrap();
    assert!(
        matches!(late, moltlock_core::CasOutcome::Acquired { .. }),
        "the hold outlived its TTL on the server clock"
    );
}

/// Holders keep their locks across a server restart or report lost — never
/// a silent double holder — and fences after the restart are greater.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_or_reports_holds_and_fences_grow() {
    let mut server = postgres::start(&PgOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let b = PostgresBackend::from_url(&server.url).await.unwrap();
    let ttl = Duration::from_secs(3);
    let m = LockManager::builder(b.clone()).ttl(ttl).build().unwrap();
    let mut guards = Vec::new();
    for i in 0..5 {
        guards.push(m.lock(format!("restart/{i}")).await.unwrap());
    }
    let before = guards.iter().map(|g| g.fence()).max().unwrap();
    server
        .server
        .as_mut()
        .unwrap()
        .restart_with("INT")
        .unwrap_or_else(|e| panic!("{e}"));
    tokio::time::sleep(ttl * 2).await;
    let other = LockManager::new(PostgresBackend::from_url(&server.url).await.unwrap());
    for (i, g) in guards.iter().enumerate() {
        let stolen = other.try_lock(format!("restart/{i}")).await.unwrap();
        assert!(
            !(g.is_held() && stolen.is_some()),
            "hold {i} is held locally while another client acquired it"
        );
    }
    let after = other.lock("restart/fresh").await.unwrap();
    assert!(
        after.fence() > before,
        "fence {} after restart, {before} before",
        after.fence()
    );
}

/// scram-sha-256 over TLS (`sslmode=require`) on a server of our own; a
/// wrong password is a clear authentication error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_password_over_tls() {
    let opts = PgOptions {
        tls: true,
        password: Some("s3cret-pw".into()),
        ..PgOptions::default()
    };
    let server = postgres::start(&opts).unwrap_or_else(|e| panic!("{e}"));
    let url = format!("{}?sslmode=require", server.url);
    let b = PostgresBackend::from_url(&url).await.unwrap();
    let ssl: bool = sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(b.pool())
        .await
        .unwrap();
    assert!(ssl, "the connection is not encrypted");
    let g = LockManager::new(b).lock("tls").await.unwrap();
    g.release().await.unwrap();
    let wrong = url.replace("s3cret-pw", "wrong-pw");
    let res = PostgresBackend::from_url(&wrong).await;
    assert!(
        matches!(res, Err(Error::Auth { .. })),
        "expected Error::Auth: {res:?}"
    );
    let shown = format!("{:?}", SqlConfig::from_url(&url).unwrap());
    assert!(
        !shown.contains("s3cret-pw"),
        "the password shows in Debug: {shown}"
    );
}

/// A forward step of the server's clock, shown by the reply of any request,
/// shortens every hold of the manager at once and has them renewed at once:
/// their rows get a full TTL again instead of expiring early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_clock_step_renews_every_hold_at_once() {
    let clock = moltlock_fixtures::clock::FakeClock::new().unwrap();
    let opts = PgOptions {
        clock_file: Some(clock.path()),
        ..PgOptions::default()
    };
    let server = postgres::start(&opts).unwrap_or_else(|e| panic!("{e}"));
    let b = PostgresBackend::from_url(&server.url).await.unwrap();
    let mgr = LockManager::builder(b.clone())
        .ttl(Duration::from_secs(30))
        .build()
        .unwrap();
    let a = mgr.lock("stepped/a").await.unwrap();
    let before = a.valid_for().unwrap();
    clock.step("+20s").unwrap();
    let _c = mgr.lock("stepped/c").await.unwrap(); // its reply shows the step
    tokio::time::sleep(Duration::from_millis(500)).await;
    let left: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM expires_at - now())::float8 FROM moltlock_locks WHERE key = $1",
    )
    .bind("stepped/a")
    .fetch_one(b.pool())
    .await
    .unwrap();
    assert!(
        left > 28.0,
        "the hold was not renewed after the step: {left:.1} s left in the store"
    );
    assert!(a.is_held());
    assert!(a.valid_for().unwrap() <= before);
}

/// A statement that drew its `nextval` early and waited on the row can win
/// with the row's last fence + 1, above the sequence. The sweep must then
/// keep that row, or the next fresh fence would repeat it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_keeps_a_row_whose_fence_is_above_the_sequence() {
    use sqlx::Connection;
    let url = shared();
    let table = format!("sweep_{}", uuid_suffix());
    let b = PostgresBackend::connect(SqlConfig::from_url(&url).unwrap().table(&table))
        .await
        .unwrap();
    let key: moltlock_core::LockKey = "k".parse().unwrap();
    let ttl = Duration::from_secs(30);
    let fenced = |out: moltlock_core::CasOutcome| match out {
        moltlock_core::CasOutcome::Acquired { fence } => fence,
        other => panic!("not acquired: {other:?}"),
    };
    let t0 = Token::random();
    fenced(b.cas(&key, None, &t0, ttl).await.unwrap());
    assert!(b.delete(&key, &t0).await.unwrap());
    // Another client takes and releases the key while `a`, which drew its
    // sequence value first, waits on the row lock.
    let mut other = sqlx::PgConnection::connect(&url).await.unwrap();
    let mut tx = other.begin().await.unwrap();
    let lock_row = format!("SELECT fence FROM \"{table}\" WHERE key = 'k' FOR UPDATE");
    sqlx::query(&lock_row).execute(&mut *tx).await.unwrap();
    let waiting = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move { b.cas(&key, None, &Token::random(), ttl).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let take = format!(
        "UPDATE \"{table}\" SET owner = 'b', fence = GREATEST(fence + 1, nextval('\"{table}_fence\"')), \
         expires_at = now() + interval '30 s' WHERE key = 'k'"
    );
    sqlx::query(&take).execute(&mut *tx).await.unwrap();
    let release =
        format!("UPDATE \"{table}\" SET owner = '', expires_at = 'epoch' WHERE key = 'k'");
    sqlx::query(&release).execute(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    let won = fenced(waiting.await.unwrap().unwrap());
    let last: i64 = sqlx::query_scalar(&format!("SELECT last_value FROM \"{table}_fence\""))
        .fetch_one(b.pool())
        .await
        .unwrap();
    assert!(
        won.get() > u64::try_from(last).unwrap(),
        "the stale draw did not win above the sequence"
    );
    // The winner releases, and an hour passes.
    let row_owner: String =
        sqlx::query_scalar(&format!("SELECT owner FROM \"{table}\" WHERE key = 'k'"))
            .fetch_one(b.pool())
            .await
            .unwrap();
    assert!(b
        .delete(&key, &Token::from_stored(row_owner))
        .await
        .unwrap());
    let age = format!(
        "UPDATE \"{table}\" SET expires_at = now() - interval '2 h', acquired_at = now() - interval '2 h'"
    );
    sqlx::query(&age).execute(b.pool()).await.unwrap();
    b.sweep().await.unwrap();
    let next = fenced(b.cas(&key, None, &Token::random(), ttl).await.unwrap());
    assert!(
        next > won,
        "fence {next} after {won}: the sweep lost the key's last fence"
    );
    for drop_it in [
        format!("DROP TABLE \"{table}\", \"{table}_queue\""),
        format!("DROP SEQUENCE \"{table}_fence\""),
    ] {
        sqlx::query(&drop_it).execute(b.pool()).await.unwrap();
    }
}

/// A release frees the key whatever the database clock does next: a step
/// back by an hour must not make the released hold look live again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_key_is_free_after_the_clock_steps_back() {
    let clock = moltlock_fixtures::clock::FakeClock::new().unwrap();
    let opts = PgOptions {
        clock_file: Some(clock.path()),
        ..PgOptions::default()
    };
    let server = postgres::start(&opts).unwrap_or_else(|e| panic!("{e}"));
    let b = PostgresBackend::from_url(&server.url).await.unwrap();
    let mgr = LockManager::new(b.clone());
    let g = mgr.lock("stepped-back").await.unwrap();
    g.release().await.unwrap();
    clock.step("-1h").unwrap();
    let again = mgr.try_lock("stepped-back").await.unwrap();
    assert!(
        again.is_some(),
        "a released key looked held after the clock stepped back"
    );
    let shown = b.list("stepped").await.unwrap();
    assert_eq!(
        shown.len(),
        1,
        "the new hold is the only one shown: {shown:?}"
    );
}

#[tokio::test]
async fn names_itself_and_hands_out_its_extensions() {
    let b = PostgresBackend::from_url(&shared()).await.unwrap();
    assert_eq!(b.name(), "postgres");
    assert_eq!(
        moltlock_core::extension::extensions(&b),
        [
            "watch",
            "inspect",
            "renew_many",
            "describe",
            "raise_fence",
            "fair_queue",
            "cas_multi"
        ],
        "Postgres hands out every extension"
    );
}

/// A backend built on the application's own pool takes and releases a
/// lock, and the pool stays the application's, open and usable.
#[tokio::test]
async fn a_backend_on_the_applications_pool_leaves_it_usable() {
    let pool = sqlx::PgPool::connect(&shared()).await.unwrap();
    let table = format!("app_{}", uuid_suffix());
    let cfg = SqlConfig::default().table(&table);
    let b = PostgresBackend::from_client(pool.clone(), cfg)
        .await
        .unwrap();
    let g = LockManager::new(b).lock("app/job").await.unwrap();
    assert!(g.is_held());
    g.release().await.unwrap();
    // The application's pool still serves the application: it drops the table.
    drop_lock_table(&pool, &table).await;
    assert!(!pool.is_closed());
}

/// The pool pings only connections idle for a second or more, so a server
/// restart under steady use leaves connections that were in use a moment
/// ago dead in the pool. Each fails its statement once and is discarded:
/// soon after the server is back, statements succeed again, with at most
/// about one failure per pooled connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_pool_recovers_from_a_server_restart() {
    let mut server = postgres::start(&PgOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let b = PostgresBackend::from_url(&server.url).await.unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut users = Vec::new();
    for i in 0..6 {
        let (b, stop, log) = (b.clone(), stop.clone(), log.clone());
        users.push(tokio::spawn(async move {
            let key: moltlock_core::LockKey = format!("busy/{i}").parse().unwrap();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let token = Token::random();
                let ok = match b.cas(&key, None, &token, Duration::from_secs(5)).await {
                    Ok(_) => b.delete(&key, &token).await.is_ok(),
                    Err(_) => false,
                };
                log.lock().unwrap().push((tokio::time::Instant::now(), ok));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pg = server.server.as_mut().unwrap();
    tokio::task::block_in_place(|| pg.restart_with("INT")).unwrap_or_else(|e| panic!("{e}"));
    let back = tokio::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for u in users {
        u.await.unwrap();
    }
    let log = log.lock().unwrap();
    let after: Vec<bool> = log
        .iter()
        .filter(|(t, _)| *t >= back)
        .map(|(_, ok)| *ok)
        .collect();
    let failed = after.iter().filter(|ok| !**ok).count();
    let tail_ok = after.iter().rev().take(12).all(|ok| *ok);
    assert!(
        tail_ok && failed <= 12,
        "after the restart: {failed} failures of {}, the last ones ok: {tail_ok}",
        after.len()
    );
    assert!(
        log.iter().any(|(t, ok)| *t < back && !*ok),
        "no statement failed during the restart: the case did not test a broken pool"
    );
}
