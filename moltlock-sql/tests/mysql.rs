//! MySQL/MariaDB: the conformance suite against `MOLTLOCK_MYSQL_URL`, or a
//! private MariaDB the fixture starts when it is unset.

use moltlock_core::Error;
use moltlock_fixtures::mysql;
use moltlock_sql::{MySqlBackend, SqlConfig};

fn url() -> Result<String, Error> {
    mysql::shared_url().map_err(Error::Config)
}

fn mysql() -> moltlock_conformance::Factory {
    let url = mysql::shared_url();
    moltlock_fixtures::conformance_factory(url.clone(), |url| async move {
        MySqlBackend::from_url(&url).await
    })
    .with_cleanup(moltlock_fixtures::rows::cleanup(url))
}

moltlock_conformance::conformance_tests!(mysql(), without: [watch, in_order]);

#[tokio::test]
async fn table_names_are_validated() {
    let url = url().unwrap_or_else(|e| panic!("{e}"));
    let res =
        MySqlBackend::connect(SqlConfig::from_url(&url).unwrap().table("x`; DROP TABLE y")).await;
    assert!(matches!(res, Err(Error::Config(_))), "{res:?}");
}

#[tokio::test]
async fn wrong_password_is_an_auth_error() {
    let url = url().unwrap_or_else(|e| panic!("{e}"));
    let bad = url.replacen("root@", "root:definitely-wrong@", 1);
    let res = MySqlBackend::from_url(&bad).await;
    assert!(matches!(res, Err(Error::Auth { .. })), "{res:?}");
}

/// Two thousand holds of one manager stay held across several TTLs: renewal
/// is batched, so it keeps up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_holds_stay_renewed() {
    use std::time::Duration;
    let url = url().unwrap_or_else(|e| panic!("{e}"));
    let backend = MySqlBackend::from_url(&url).await.unwrap();
    let manager = moltlock_core::LockManager::builder(backend)
        .ttl(Duration::from_secs(2))
        .build()
        .unwrap();
    let prefix = format!("many/{}", moltlock_core::Token::random());
    let mut guards = Vec::new();
    for i in 0..2000 {
        guards.push(manager.lock(format!("{prefix}/{i}")).await.unwrap());
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let lost = guards.iter().filter(|g| !g.is_held()).count();
    assert_eq!(lost, 0, "{lost} of 2000 holds were lost");
    assert_eq!(manager.held_count(), 2000);
    // Released, then the released rows (kept for the sweep) deleted: the
    // table is shared.
    for g in guards {
        g.release().await.unwrap();
    }
    moltlock_fixtures::rows::forget_or_say(&url, &[format!("{prefix}/")]).await;
}

/// A renewal batch with a key MySQL cannot store (a trailing space: such a
/// key was never held here, as a quorum member may be asked to renew one
/// its peers hold) answers `false` for it and renews the rest; a TTL above
/// the longest refuses the whole batch, renewing nothing.
#[tokio::test]
async fn a_key_mysql_cannot_store_is_answered_in_its_batch() {
    use moltlock_core::{Backend, BackendExt, CasOutcome, LockKey, RenewItem, Token, MAX_TTL};
    use std::time::Duration;
    let url = url().unwrap_or_else(|e| panic!("{e}"));
    let b = MySqlBackend::from_url(&url).await.unwrap();
    let token = Token::random();
    let held = LockKey::new(format!("renew-odd/{token}")).unwrap();
    let short = Duration::from_secs(5);
    let taken = b.cas(&held, None, &token, short).await.unwrap();
    assert!(matches!(taken, CasOutcome::Acquired { .. }), "{taken:?}");
    let odd = LockKey::new(format!("renew-odd/{token} ")).unwrap();
    let item = |key: &LockKey, ttl| RenewItem {
        key: key.clone(),
        token: token.clone(),
        ttl,
    };
    let long = Duration::from_secs(60);
    // Alone: were it sent, MySQL would match it to `held` (same token,
    // trailing spaces ignored) and renew that.
    let alone = b.renew_many(&[item(&odd, long)]).await;
    assert_eq!(alone.unwrap(), vec![false]);
    let left = b.inspect(&held).await.unwrap().unwrap().expires_in.unwrap();
    assert!(
        left <= short,
        "the unstorable key renewed another: {left:?} left"
    );
    let answers = b.renew_many(&[item(&odd, long), item(&held, long)]).await;
    assert_eq!(answers.unwrap(), vec![false, true]);
    let left = b.inspect(&held).await.unwrap().unwrap().expires_in.unwrap();
    assert!(
        left > short,
        "the storable item was not renewed: {left:?} left"
    );
    // Nor is a description of it written on the key without the space.
    let described = b.describe(&odd, &token, "not mine").await;
    assert!(
        matches!(described, Err(Error::InvalidKey { .. })),
        "{described:?}"
    );
    assert_eq!(b.inspect(&held).await.unwrap().unwrap().description, None);
    let too_long = MAX_TTL + Duration::from_millis(1);
    let refused = b
        .renew_many(&[item(&held, short), item(&held, too_long)])
        .await;
    assert!(
        matches!(refused, Err(Error::InvalidTtl { .. })),
        "{refused:?}"
    );
    let left = b.inspect(&held).await.unwrap().unwrap().expires_in.unwrap();
    assert!(
        left > short,
        "a refused batch renewed an item: {left:?} left"
    );
    assert!(b.delete(&held, &token).await.unwrap());
    moltlock_fixtures::rows::forget_or_say(&url, &[held.to_string()]).await;
}

/// A release writes an expiry long past, not the server's current time, so
/// a later backward step of the server clock cannot make the released hold
/// look live again; the release time goes to `acquired_at`, for the sweep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_writes_an_expiry_no_clock_step_revives() {
    use sqlx::Connection;
    let url = url().unwrap_or_else(|e| panic!("{e}"));
    let table = format!("rel_{}", &moltlock_core::Token::random().as_str()[..8]);
    let backend = MySqlBackend::connect(SqlConfig::from_url(&url).unwrap().table(&table))
        .await
        .unwrap();
    let manager = moltlock_core::LockManager::new(backend);
    manager.lock("k").await.unwrap().release().await.unwrap();
    let mut conn = sqlx::MySqlConnection::connect(&url).await.unwrap();
    let (past, recent): (i64, i64) = sqlx::query_as(&format!(
        "SELECT expires_at < '2000-01-01', acquired_at > UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE \
         FROM `{table}` WHERE lock_key = 'k'"
    ))
    .fetch_one(&mut conn)
    .await
    .unwrap();
    drop_tables(&mut conn, &table).await;
    assert_eq!(
        past, 1,
        "the release wrote an expiry a backward clock step can revive"
    );
    assert_eq!(recent, 1, "the release time was not recorded for the sweep");
}

#[tokio::test]
async fn names_itself_and_hands_out_its_extensions() {
    use moltlock_core::Backend;
    let b = MySqlBackend::from_url(&url().unwrap_or_else(|e| panic!("{e}")))
        .await
        .unwrap();
    assert_eq!(b.name(), "mysql");
    assert_eq!(
        moltlock_core::extension::extensions(&b),
        [
            "inspect",
            "renew_many",
            "describe",
            "raise_fence",
            "fair_queue",
            "cas_multi"
        ],
        "MySQL has no release notifications"
    );
}

/// A backend built on the application's own pool takes and releases a
/// lock, and the pool stays the application's, open and usable.
#[tokio::test]
async fn a_backend_on_the_applications_pool_leaves_it_usable() {
    let url = url().unwrap_or_else(|e| panic!("{e}"));
    let pool = sqlx::MySqlPool::connect(&url).await.unwrap();
    let table = format!(
        "app_{}",
        &moltlock_core::Token::random().as_str().replace('-', "")[..12]
    );
    let cfg = SqlConfig::default().table(&table);
    let b = MySqlBackend::from_client(pool.clone(), cfg).await.unwrap();
    let g = moltlock_core::LockManager::new(b)
        .lock("app/job")
        .await
        .unwrap();
    assert!(g.is_held());
    g.release().await.unwrap();
    // The application's pool still serves the application: it drops the table.
    drop_tables(&mut pool.acquire().await.unwrap(), &table).await;
    assert!(!pool.is_closed());
}

/// Drops the three tables of the backend on `table`.
async fn drop_tables(conn: &mut sqlx::MySqlConnection, table: &str) {
    for t in [
        table.to_owned(),
        format!("{table}_floor"),
        format!("{table}_queue"),
    ] {
        sqlx::query(&format!("DROP TABLE `{t}`"))
            .execute(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

/// The prepared statements the server has run on `pool`'s one connection
/// (read as text, so the read is not one of them).
async fn executed(pool: &sqlx::MySqlPool) -> u64 {
    use sqlx::Row;
    let rows = sqlx::raw_sql("SHOW SESSION STATUS LIKE 'Com_stmt_execute'")
        .fetch_all(pool)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let text: String = rows[0].try_get(1).unwrap_or_else(|e| panic!("{e}"));
    text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
}

/// A fair acquisition of a free key with an empty queue is one statement,
/// which also checks the queue: with a live place of another waiter there,
/// the same statement writes nothing, and the newcomer queues behind it
/// although the key is free.
#[tokio::test]
async fn a_fair_take_of_a_free_key_is_one_statement_that_minds_the_queue() {
    use moltlock_core::{Backend, LockKey, Token};
    use std::time::Duration;
    let url = url().unwrap_or_else(|e| panic!("{e}"));
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .unwrap();
    let table = format!("one_{}", &Token::random().as_str().replace('-', "")[..12]);
    let b = MySqlBackend::from_client(pool.clone(), SqlConfig::default().table(&table))
        .await
        .unwrap();
    let fair = b.fair_queue().unwrap();
    let ttl = Duration::from_secs(10);
    // The statements are prepared on the connection, and its last insert
    // id is left at a fence.
    let (warm, t) = (LockKey::new("warm").unwrap(), Token::random());
    fair.acquire(&warm, &t, ttl).await.unwrap();
    assert!(b.delete(&warm, &t).await.unwrap());

    let before = executed(&pool).await;
    let free = LockKey::new("free").unwrap();
    fair.acquire(&free, &Token::random(), ttl).await.unwrap();
    let statements = executed(&pool).await - before;

    sqlx::query(&format!(
        "INSERT INTO `{table}_queue` (lock_key, owner, alive_until) \
         VALUES ('queued', 'someone-else', UTC_TIMESTAMP(6) + INTERVAL 30 SECOND)"
    ))
    .execute(&pool)
    .await
    .unwrap();
    let queued = LockKey::new("queued").unwrap();
    let barged = tokio::time::timeout(
        Duration::from_millis(600),
        fair.acquire(&queued, &Token::random(), ttl),
    )
    .await;
    let (held,): (i64,) = sqlx::query_as(&format!(
        "SELECT COUNT(*) FROM `{table}` WHERE lock_key = 'queued' AND expires_at > UTC_TIMESTAMP(6)"
    ))
    .fetch_one(&pool)
    .await
    .unwrap();
    drop_tables(&mut pool.acquire().await.unwrap(), &table).await;
    assert_eq!(
        statements, 1,
        "a free key with an empty queue took {statements} statements"
    );
    assert!(
        barged.is_err(),
        "the newcomer passed a live place: {barged:?}"
    );
    assert_eq!(
        held, 0,
        "the newcomer's statement took the key past a live place"
    );
}

/// A fair take of a free key that the database picks as a deadlock's
/// victim queues instead of failing the acquisition: here another
/// transaction holds the key's row while the take has read the queue, then
/// puts a place in the range the take read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_take_that_loses_a_deadlock_queues() {
    use moltlock_core::{LockManager, LockOptions, Token};
    use sqlx::Connection;
    use std::time::Duration;
    let url = url().unwrap_or_else(|e| panic!("{e}"));
    let table = format!("dl_{}", &Token::random().as_str().replace('-', "")[..12]);
    let b = MySqlBackend::connect(SqlConfig::from_url(&url).unwrap().table(&table))
        .await
        .unwrap();
    let manager = LockManager::new(b);
    // The key's row exists (a release expires it rather than deleting it).
    manager.lock("k").await.unwrap().release().await.unwrap();
    let mut other = sqlx::MySqlConnection::connect(&url).await.unwrap();
    let mut tx = other.begin().await.unwrap();
    // Rows written make this transaction the heavier one, which the
    // database keeps when it breaks the deadlock.
    for i in 0..50 {
        sqlx::query(&format!(
            "INSERT INTO `{table}_floor` (lock_key, floor) VALUES ('pad/{i}', 1)"
        ))
        .execute(&mut *tx)
        .await
        .unwrap();
    }
    sqlx::query(&format!(
        "UPDATE `{table}` SET owner = 'other', expires_at = UTC_TIMESTAMP(6) + INTERVAL 30 SECOND \
         WHERE lock_key = 'k'"
    ))
    .execute(&mut *tx)
    .await
    .unwrap();
    let m = manager.clone();
    let waiter = tokio::spawn(async move { m.acquire("k", LockOptions::new().fair()).await });
    // The take has read the queue's range and waits for the row.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let placed = sqlx::query(&format!(
        "INSERT INTO `{table}_queue` (lock_key, owner, alive_until) \
         VALUES ('k', 'other', UTC_TIMESTAMP(6) + INTERVAL 30 SECOND)"
    ))
    .execute(&mut *tx)
    .await;
    let other_won = placed.is_ok();
    if other_won {
        tx.commit().await.unwrap();
        // The other side leaves; the queued waiter becomes the head.
        tokio::time::sleep(Duration::from_millis(300)).await;
        for stmt in [
            format!("DELETE FROM `{table}_queue` WHERE owner = 'other'"),
            format!(
                "UPDATE `{table}` SET expires_at = '1970-01-01 00:00:01' WHERE owner = 'other'"
            ),
        ] {
            sqlx::query(&stmt).execute(&mut other).await.unwrap();
        }
    } else {
        tx.rollback().await.unwrap_or_else(|e| panic!("{e}"));
    }
    let got = tokio::time::timeout(Duration::from_secs(10), waiter).await;
    drop_tables(&mut other, &table).await;
    assert!(
        other_won,
        "the database chose the other transaction as the victim: {placed:?}"
    );
    let got = got.unwrap().unwrap();
    assert!(got.is_ok(), "the fair acquisition failed: {got:?}");
}

/// A fair acquisition from a database that cannot be reached fails at
/// once, as a plain one does, instead of queueing and looking again for
/// ever.
#[tokio::test]
async fn a_fair_acquire_from_a_database_out_of_reach_fails() {
    use moltlock_core::{Backend, Error, LockKey, Token};
    use std::time::Duration;
    let url = url().unwrap_or_else(|e| panic!("{e}"));
    let pool = sqlx::MySqlPool::connect(&url).await.unwrap();
    let table = format!("gone_{}", &Token::random().as_str().replace('-', "")[..12]);
    let b = MySqlBackend::from_client(pool.clone(), SqlConfig::default().table(&table))
        .await
        .unwrap();
    drop_tables(&mut pool.acquire().await.unwrap(), &table).await;
    pool.close().await;
    let fair = b.fair_queue().unwrap();
    let k = LockKey::new("k").unwrap();
    let ttl = Duration::from_secs(10);
    let got = tokio::time::timeout(
        Duration::from_secs(5),
        fair.acquire(&k, &Token::random(), ttl),
    )
    .await;
    assert!(
        matches!(got, Ok(Err(Error::Unavailable { .. }))),
        "expected a prompt Unavailable, got {got:?}"
    );
}
