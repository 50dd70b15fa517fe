//! Postgres and MySQL: the connections the lock statements keep out of the
//! backend's own pool. A backend on its own pool keeps the connection of a
//! statement that succeeded; one on the application's pool keeps none; a
//! statement dropped mid-way gives its connection back to the pool (which
//! drains it), and the statements after it get their own replies.

#![allow(clippy::unwrap_used)] // helpers of the tests unwrap

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use moltlock_core::{Backend, CasOutcome, Inspect, LockKey, Token};
use moltlock_sql::{MySqlBackend, PostgresBackend, SqlConfig};
use sqlx::{Database, Pool};

mod pg_common;
use pg_common::{drop_lock_table, shared, uuid_suffix};

const TTL: Duration = Duration::from_secs(30);

fn key(name: &str) -> LockKey {
    name.parse().unwrap_or_else(|e| panic!("{e}"))
}

/// Connections checked out of `pool`, once the returns in flight (each
/// pings its connection first) have landed.
async fn out_of<DB: Database>(pool: &Pool<DB>) -> u32 {
    tokio::time::sleep(Duration::from_millis(300)).await;
    pool.size() - u32::try_from(pool.num_idle()).unwrap_or(u32::MAX)
}

/// Twenty acquisitions and releases of `k`, one after another.
async fn cycles(b: &impl Backend, k: &LockKey) {
    for _ in 0..20 {
        let t = Token::random();
        let got = b.cas(k, None, &t, TTL).await.unwrap();
        assert!(matches!(got, CasOutcome::Acquired { .. }), "{got:?}");
        assert!(b.delete(k, &t).await.unwrap());
    }
}

/// `own` (on its own pool) keeps one connection out after sequential
/// statements; `theirs` (on `app`) keeps none.
async fn keeps_only_its_own<DB: Database>(
    own: &impl Backend,
    own_pool: &Pool<DB>,
    theirs: &impl Backend,
    app: &Pool<DB>,
) {
    let k = key("kept/cycles");
    cycles(own, &k).await;
    assert_eq!(out_of(own_pool).await, 1, "its own pool: one kept");
    cycles(theirs, &k).await;
    assert_eq!(out_of(app).await, 0, "the application's pool: none kept");
}

/// A `cas` of `k` blocked by `blocker` (a transaction holding the key's
/// row) and dropped after 300 ms: its connection goes back to the pool,
/// and later statements read their own replies (the dropped statement ran
/// once the blocker ended: its token holds the key).
async fn dropped_mid_way<DB: Database>(
    b: &impl Backend,
    pool: &Pool<DB>,
    k: &LockKey,
    blocker: sqlx::Transaction<'_, DB>,
) {
    let dropped = Token::random();
    let cut = tokio::time::timeout(Duration::from_millis(300), b.cas(k, None, &dropped, TTL)).await;
    assert!(cut.is_err(), "the blocked statement returned: {cut:?}");
    blocker.commit().await.unwrap();
    assert_eq!(
        out_of(pool).await,
        0,
        "the dropped statement's connection was kept"
    );
    let next = Token::random();
    match b.cas(k, None, &next, TTL).await.unwrap() {
        CasOutcome::Held(h) => assert!(h.holder.is_none() || h.holder == Some(dropped.clone())),
        other => panic!("the key held by the dropped statement's token was taken: {other:?}"),
    }
    assert!(
        b.delete(k, &dropped).await.unwrap(),
        "the dropped token does not hold"
    );
    let got = b.cas(k, None, &next, TTL).await.unwrap();
    assert!(matches!(got, CasOutcome::Acquired { .. }), "{got:?}");
    assert!(b.delete(k, &next).await.unwrap());
}

/// A backend on its own fresh pool and the table `table`, with the key
/// `k`'s row written once (so a transaction can lock it).
async fn prepared<B: Backend>(b: B, k: &LockKey) -> B {
    let t = Token::random();
    b.cas(k, None, &t, TTL).await.unwrap();
    assert!(b.delete(k, &t).await.unwrap());
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_keeps_connections_of_its_own_pool_only() {
    let table = format!("kept_{}", uuid_suffix());
    let cfg = SqlConfig::from_url(&shared()).unwrap().table(&table);
    let own = PostgresBackend::connect(cfg).await.unwrap();
    let app = sqlx::PgPool::connect(&shared()).await.unwrap();
    let cfg = SqlConfig::default().table(&table);
    let theirs = PostgresBackend::from_client(app.clone(), cfg)
        .await
        .unwrap();
    keeps_only_its_own(&own, own.pool(), &theirs, &app).await;
    drop_lock_table(&app, &table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_statement_dropped_mid_way_is_not_kept() {
    let table = format!("kept_{}", uuid_suffix());
    let cfg = SqlConfig::from_url(&shared()).unwrap().table(&table);
    let k = key("kept/dropped");
    let b = prepared(PostgresBackend::connect(cfg).await.unwrap(), &k).await;
    let app = sqlx::PgPool::connect(&shared()).await.unwrap();
    let blocker = block_row(&app, &table, &k).await;
    dropped_mid_way(&b, b.pool(), &k, blocker).await;
    drop_lock_table(&app, &table).await;
}

fn mysql_url() -> String {
    moltlock_fixtures::mysql::shared_url().unwrap_or_else(|e| panic!("{e}"))
}

/// Drops the tables of the MySQL backend on `table`.
async fn drop_mysql_tables(pool: &sqlx::MySqlPool, table: &str) {
    for t in [
        table.to_owned(),
        format!("{table}_floor"),
        format!("{table}_queue"),
    ] {
        let dropped = sqlx::query(&format!("DROP TABLE `{t}`"))
            .execute(pool)
            .await;
        dropped.unwrap_or_else(|e| panic!("dropping {t}: {e}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_keeps_connections_of_its_own_pool_only() {
    let table = format!("kept_{}", uuid_suffix());
    let cfg = SqlConfig::from_url(&mysql_url()).unwrap().table(&table);
    let own = MySqlBackend::connect(cfg).await.unwrap();
    let app = sqlx::MySqlPool::connect(&mysql_url()).await.unwrap();
    let cfg = SqlConfig::default().table(&table);
    let theirs = MySqlBackend::from_client(app.clone(), cfg).await.unwrap();
    keeps_only_its_own(&own, own.pool(), &theirs, &app).await;
    drop_mysql_tables(&app, &table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_statement_dropped_mid_way_is_not_kept() {
    let table = format!("kept_{}", uuid_suffix());
    let cfg = SqlConfig::from_url(&mysql_url()).unwrap().table(&table);
    let k = key("kept/dropped");
    let b = prepared(MySqlBackend::connect(cfg).await.unwrap(), &k).await;
    let app = sqlx::MySqlPool::connect(&mysql_url()).await.unwrap();
    let lock_row = format!("SELECT 1 FROM `{table}` WHERE lock_key = ? FOR UPDATE");
    let blocker = block_with(&app, &lock_row, &k).await;
    dropped_mid_way(&b, b.pool(), &k, blocker).await;
    drop_mysql_tables(&app, &table).await;
}

/// A pool of three: one connection kept for lock statements, one for
/// `LISTEN` (waiters of a contended key), one for reads and sweeps. Four
/// contenders, reads and sweeps at once, and a read after them, all get a
/// connection within the pool's 1 s acquire timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_small_pool_serves_waiters_reads_and_sweeps() {
    let table = format!("kept_{}", uuid_suffix());
    let cfg = SqlConfig::from_url(&shared()).unwrap().table(&table);
    let cfg = cfg
        .max_connections(3)
        .acquire_timeout(Duration::from_secs(1));
    let b = PostgresBackend::connect(cfg).await.unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..4 {
        // A manager each: four statements can be in flight at once.
        let m = moltlock_core::LockManager::new(b.clone());
        tasks.spawn(async move {
            for _ in 0..10 {
                let g = m.lock("kept/small").await.map_err(|e| e.to_string())?;
                tokio::time::sleep(Duration::from_millis(5)).await;
                g.release().await.map_err(|e| e.to_string())?;
            }
            Ok::<_, String>(())
        });
    }
    let k = key("kept/small");
    for _ in 0..20 {
        b.inspect(&k)
            .await
            .unwrap_or_else(|e| panic!("a read: {e}"));
        b.sweep().await.unwrap_or_else(|e| panic!("a sweep: {e}"));
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap().unwrap_or_else(|e| panic!("a contender: {e}"));
    }
    let reads = b.inspect(&k).await;
    assert!(reads.is_ok(), "a read after the contenders: {reads:?}");
    drop_lock_table(b.pool(), &table).await;
}

/// A pool of three keeps one connection: a lock statement blocked on its
/// row (by another transaction) holds it, and a statement on another key
/// runs meanwhile on a connection of the pool, as it would without kept
/// connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_statement_runs_beside_a_blocked_one() {
    let table = format!("kept_{}", uuid_suffix());
    let cfg = SqlConfig::from_url(&shared()).unwrap().table(&table);
    let cfg = cfg
        .max_connections(3)
        .acquire_timeout(Duration::from_secs(1));
    let k = key("kept/blocked");
    let b = prepared(PostgresBackend::connect(cfg).await.unwrap(), &k).await;
    let app = sqlx::PgPool::connect(&shared()).await.unwrap();
    let blocker = block_row(&app, &table, &k).await;
    let blocked = {
        let (b, k) = (b.clone(), k.clone());
        tokio::spawn(async move { b.cas(&k, None, &Token::random(), TTL).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!blocked.is_finished(), "the statement was not blocked");
    let other = Token::random();
    let beside = tokio::time::timeout(
        Duration::from_secs(3),
        b.cas(&key("kept/beside"), None, &other, TTL),
    )
    .await;
    let beside = beside.unwrap_or_else(|_| panic!("no connection within 3 s"));
    assert!(
        matches!(beside, Ok(CasOutcome::Acquired { .. })),
        "{beside:?}"
    );
    blocker.commit().await.unwrap();
    let got = blocked.await.unwrap();
    assert!(matches!(got, Ok(CasOutcome::Acquired { .. })), "{got:?}");
    drop_lock_table(&app, &table).await;
}

/// A backend on a fresh pool of `max` connections (a 2 s acquire
/// timeout) and the table `table`, with the rows of `keys` written once.
async fn small_pool(table: &str, max: u32, keys: &[&LockKey]) -> PostgresBackend {
    let cfg = SqlConfig::from_url(&shared()).unwrap().table(table);
    let cfg = cfg
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(2));
    let mut b = PostgresBackend::connect(cfg).await.unwrap();
    for k in keys {
        b = prepared(b, k).await;
    }
    b
}

/// Locks the row of `k` (in `table`) in a transaction of `app`'s.
async fn block_row<'a>(
    app: &'a sqlx::PgPool,
    table: &str,
    k: &LockKey,
) -> sqlx::Transaction<'a, sqlx::Postgres> {
    let lock_row = format!("SELECT 1 FROM \"{table}\" WHERE key = $1 FOR UPDATE");
    block_with(app, &lock_row, k).await
}

/// Runs `lock_row` (which locks the row of `k`) in a transaction of
/// `app`'s.
async fn block_with<'a, DB>(
    app: &'a Pool<DB>,
    lock_row: &str,
    k: &LockKey,
) -> sqlx::Transaction<'a, DB>
where
    DB: Database,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    let mut blocker = app.begin().await.unwrap();
    sqlx::query(lock_row)
        .bind(k.as_str())
        .execute(&mut *blocker)
        .await
        .unwrap();
    blocker
}

/// A pool of three, every connection busy: one kept (its statement blocked
/// on `z`'s row) and two of the pool (blocked on `x`'s). A fourth
/// statement waits; when `z`'s row is freed, the kept connection is free
/// (and stays out of the pool): the fourth statement takes it at once,
/// not after the pool's 2 s acquire timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_waiting_statement_takes_a_kept_connection_freed_meanwhile() {
    let table = format!("kept_{}", uuid_suffix());
    let (z, x) = (key("kept/z"), key("kept/x"));
    let b = small_pool(&table, 3, &[&z, &x]).await;
    let app = sqlx::PgPool::connect(&shared()).await.unwrap();
    let (on_z, on_x) = (
        block_row(&app, &table, &z).await,
        block_row(&app, &table, &x).await,
    );
    let mut blocked = tokio::task::JoinSet::new();
    for k in [&z, &x, &x] {
        let (b, k) = (b.clone(), k.clone());
        blocked.spawn(async move { b.cas(&k, None, &Token::random(), TTL).await });
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let fourth = {
        let b = b.clone();
        tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            let got = b.cas(&key("kept/w"), None, &Token::random(), TTL).await;
            (got, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    on_z.commit().await.unwrap();
    let (got, took) = fourth.await.unwrap();
    assert!(
        matches!(got, Ok(CasOutcome::Acquired { .. })),
        "{got:?} after {took:?}"
    );
    assert!(took < Duration::from_secs(1), "took {took:?}");
    on_x.commit().await.unwrap();
    while let Some(done) = blocked.join_next().await {
        assert!(done.unwrap().is_ok());
    }
    drop_lock_table(&app, &table).await;
}

/// A loopback proxy to `target` (host:port) that stops forwarding once
/// `frozen` is set: a link gone silent.
async fn silent_link(target: String) -> (u16, Arc<AtomicBool>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let frozen = Arc::new(AtomicBool::new(false));
    let flag = frozen.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(&target).await else {
                continue;
            };
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            tokio::spawn(forward(cr, sw, flag.clone()));
            tokio::spawn(forward(sr, cw, flag.clone()));
        }
    });
    (port, frozen)
}

/// Copies `from` to `to` until either closes; once `frozen`, holds what
/// it reads.
async fn forward(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    frozen: Arc<AtomicBool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    while let Ok(n) = from.read(&mut buf).await {
        if n == 0 {
            return;
        }
        if frozen.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// A kept connection idle for over a second is pinged before its next
/// statement; on a link gone silent that ping never returns, and the
/// statement fails after the pool's acquire timeout (1 s) as a statement
/// on a plain pool would, instead of hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_ping_on_a_silent_link_ends_with_the_acquire_timeout() {
    let table = format!("kept_{}", uuid_suffix());
    let url = shared();
    let host = url
        .split('@')
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap();
    let (port, frozen) = silent_link(host.to_owned()).await;
    let via = url.replacen(host, &format!("127.0.0.1:{port}"), 1);
    let cfg = SqlConfig::from_url(&via).unwrap().table(&table);
    let cfg = cfg.acquire_timeout(Duration::from_secs(1));
    let k = key("kept/silent");
    let b = prepared(PostgresBackend::connect(cfg).await.unwrap(), &k).await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    frozen.store(true, Ordering::SeqCst);
    let started = tokio::time::Instant::now();
    let got = tokio::time::timeout(
        Duration::from_secs(6),
        b.cas(&k, None, &Token::random(), TTL),
    )
    .await;
    let took = started.elapsed();
    assert!(matches!(got, Ok(Err(_))), "{got:?} after {took:?}");
    assert!(took < Duration::from_secs(3), "took {took:?}");
    let app = sqlx::PgPool::connect(&shared()).await.unwrap();
    drop_lock_table(&app, &table).await;
}

/// After a burst of four statements at once, four connections are kept;
/// once they sat unused for over 10 s, the next statement's end gives
/// back all but its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_connections_unused_for_10_s_go_back_to_the_pool() {
    let table = format!("kept_{}", uuid_suffix());
    let cfg = SqlConfig::from_url(&shared()).unwrap().table(&table);
    let b = PostgresBackend::connect(cfg).await.unwrap();
    let app = sqlx::PgPool::connect(&shared()).await.unwrap();
    burst(&b, &app, &table).await;
    assert_eq!(
        out_of(b.pool()).await,
        4,
        "the burst's connections are kept"
    );
    tokio::time::sleep(Duration::from_millis(10_500)).await;
    cycles(&b, &key("kept/after")).await;
    assert_eq!(out_of(b.pool()).await, 1, "unused ones went back");
    drop_lock_table(&app, &table).await;
}

/// Four statements at once on `b` (blocked on a row until all four are
/// sent): `b` keeps four connections.
async fn burst(b: &PostgresBackend, app: &sqlx::PgPool, table: &str) {
    let k = key("kept/burst");
    let b = prepared(b.clone(), &k).await;
    let blocker = block_row(app, table, &k).await;
    let mut burst = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let (b, k) = (b.clone(), k.clone());
        burst.spawn(async move { b.cas(&k, None, &Token::random(), TTL).await });
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    blocker.commit().await.unwrap();
    while let Some(done) = burst.join_next().await {
        assert!(done.unwrap().is_ok());
    }
}

/// The server ends the four kept connections of a backend
/// (`pg_terminate_backend`, as a restart would): the first statement after
/// fails, and its failure sends the other kept connections back to the
/// pool (which pings them and closes the dead), so the next ones succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_one_statement_fails_when_the_server_ends_the_kept_connections() {
    let table = format!("kept_{}", uuid_suffix());
    let name = format!("{table}_app");
    let url = format!("{}?application_name={name}", shared());
    let b = PostgresBackend::connect(SqlConfig::from_url(&url).unwrap().table(&table))
        .await
        .unwrap();
    let app = sqlx::PgPool::connect(&shared()).await.unwrap();
    burst(&b, &app, &table).await;
    assert_eq!(
        out_of(b.pool()).await,
        4,
        "the burst's connections are kept"
    );
    let ended: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
    )
    .bind(&name)
    .fetch_all(&app)
    .await
    .unwrap();
    assert!(ended.len() >= 4, "ended {} connections", ended.len());
    let k = key("kept/after-end");
    let mut failed = 0;
    for _ in 0..10 {
        let t = Token::random();
        match b.cas(&k, None, &t, TTL).await {
            Ok(_) => assert!(b.delete(&k, &t).await.unwrap()),
            Err(_) => failed += 1,
        }
    }
    assert_eq!(
        failed, 1,
        "statements failed after the server ended the connections"
    );
    drop_lock_table(&app, &table).await;
}

/// A backend dropped after its runtime ended (as a blocking caller's is)
/// closes its kept connection without a runtime to hand it back to the
/// pool, and does not panic.
#[test]
fn postgres_backend_dropped_outside_a_runtime_closes_its_kept_connections() {
    let table = format!("kept_{}", uuid_suffix());
    let runtime = || tokio::runtime::Runtime::new().unwrap();
    let rt = runtime();
    let b = rt.block_on(async {
        let cfg = SqlConfig::from_url(&shared()).unwrap().table(&table);
        let b = PostgresBackend::connect(cfg).await.unwrap();
        cycles(&b, &key("kept/outside")).await;
        assert_eq!(out_of(b.pool()).await, 1, "one kept");
        b
    });
    drop(rt);
    // Without a runtime, handing a connection back panics in a `drop`,
    // which aborts the test binary.
    drop(b);
    runtime().block_on(async {
        let app = sqlx::PgPool::connect(&shared()).await.unwrap();
        drop_lock_table(&app, &table).await;
    });
}

/// A pool of four keeps two connections. Both are busy (their statements
/// blocked on rows two transactions free 10 ms later) when a third
/// statement comes: it waits for a kept connection rather than taking one
/// of the pool (whose return pings it), so the pool opens no third
/// connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_statement_waits_briefly_for_a_kept_connection() {
    let table = format!("kept_{}", uuid_suffix());
    let (y, z) = (key("kept/y"), key("kept/z"));
    let b = small_pool(&table, 4, &[&y, &z]).await;
    let app = sqlx::PgPool::connect(&shared()).await.unwrap();
    let (on_y, on_z) = (
        block_row(&app, &table, &y).await,
        block_row(&app, &table, &z).await,
    );
    let mut blocked = tokio::task::JoinSet::new();
    for k in [&y, &z] {
        let (b, k) = (b.clone(), k.clone());
        blocked.spawn(async move { b.cas(&k, None, &Token::random(), TTL).await });
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(b.pool().size(), 2, "two kept connections in use");
    let third = {
        let b = b.clone();
        tokio::spawn(async move { b.cas(&key("kept/third"), None, &Token::random(), TTL).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    on_y.commit().await.unwrap();
    on_z.commit().await.unwrap();
    let got = third.await.unwrap();
    assert!(matches!(got, Ok(CasOutcome::Acquired { .. })), "{got:?}");
    while let Some(done) = blocked.join_next().await {
        assert!(done.unwrap().is_ok());
    }
    assert_eq!(
        b.pool().size(),
        2,
        "the pool opened no connection beyond the kept"
    );
    drop_lock_table(&app, &table).await;
}
