//! Postgres wake-ups: a release notifies only when a waiter marked its
//! key, marks and fair places are written only when they run low, and a
//! release of a key with a fair queue names its head.

use std::time::Duration;

use moltlock_core::{LockGuard, LockManager, LockOptions};
use moltlock_sql::{PostgresBackend, SqlConfig};

mod pg_common;
use pg_common::{drop_lock_table, shared, uuid_suffix};

/// A test's own lock table on the shared server, a pool, and a listener on
/// the table's release channel.
struct Case {
    pool: sqlx::PgPool,
    table: String,
    listener: sqlx::postgres::PgListener,
}

impl Case {
    async fn new(name: &str) -> Self {
        let url = shared();
        let table = format!("{name}_{}", uuid_suffix());
        let opened = async {
            let pool = sqlx::PgPool::connect(&url).await?;
            let mut listener = sqlx::postgres::PgListener::connect(&url).await?;
            listener.listen(&format!("moltlock_{table}")).await?;
            Ok::<_, sqlx::Error>((pool, listener))
        };
        match opened.await {
            Ok((pool, listener)) => Self {
                pool,
                table,
                listener,
            },
            Err(e) => panic!("connecting to {url}: {e}"),
        }
    }

    /// A backend of its own on the table.
    async fn backend(&self) -> PostgresBackend {
        let cfg = SqlConfig::default().table(&self.table);
        match PostgresBackend::from_client(self.pool.clone(), cfg).await {
            Ok(b) => b,
            Err(e) => panic!("a backend: {e}"),
        }
    }

    /// Drops the table.
    async fn done(self) {
        drop_lock_table(&self.pool, &self.table).await;
    }
}

/// A manager whose retry policy would not look again for a minute: only a
/// notification (or the hold's expiry) wakes it. Its holds last 30 s, so a
/// fair waiter's own next look is 10 s away.
fn slow_waiter(backend: PostgresBackend) -> LockManager {
    LockManager::builder(backend)
        .ttl(Duration::from_secs(30))
        .retry(moltlock_core::RetryPolicy::Fixed(Duration::from_secs(60)))
        .build()
        .unwrap_or_else(|e| panic!("a manager: {e}"))
}

/// The payloads of the notifications `listener` receives within `within`.
async fn heard(listener: &mut sqlx::postgres::PgListener, within: Duration) -> Vec<String> {
    let mut payloads = Vec::new();
    let until = tokio::time::Instant::now() + within;
    while let Ok(Ok(n)) = tokio::time::timeout_at(until, listener.recv()).await {
        payloads.push(n.payload().to_owned());
    }
    payloads
}

/// The waiter's guard once `task` took the key within `secs`, after a
/// notification naming `key` reached `listener`.
async fn woken_and_told<T>(
    task: tokio::task::JoinHandle<Result<T, moltlock_core::Error>>,
    listener: &mut sqlx::postgres::PgListener,
    key: &str,
    secs: u64,
) -> T {
    let got = match tokio::time::timeout(Duration::from_secs(secs), task).await {
        Ok(Ok(Ok(got))) => got,
        Ok(Ok(Err(e))) => panic!("the waiter failed: {e}"),
        Ok(Err(e)) => panic!("the waiter panicked: {e}"),
        Err(_) => panic!("the waiter was not woken by the release"),
    };
    let told = heard(listener, Duration::from_millis(200)).await;
    assert!(told.iter().any(|k| k == key), "no notification: {told:?}");
    got
}

/// A waiter that waits longer than its mark lasts (10 s) keeps the row
/// marked: the release of a hold renewed all along still notifies.
#[tokio::test]
async fn a_long_wait_keeps_its_mark() {
    let mut c = Case::new("notify_long").await;
    let holder = LockManager::builder(c.backend().await)
        .ttl(Duration::from_secs(30))
        .build()
        .unwrap();
    let waiter = slow_waiter(c.backend().await);
    let held = holder.lock("long").await.unwrap();
    let task = tokio::spawn(async move { waiter.lock("long").await.map(|g| (g, waiter)) });
    tokio::time::sleep(Duration::from_secs(12)).await; // past the first mark
    assert!(!task.is_finished(), "the waiter took a held key");
    held.release().await.unwrap();
    let (next, _waiter) = woken_and_told(task, &mut c.listener, "long", 5).await;
    next.release().await.unwrap();
    c.done().await;
}

/// A release notifies only when a waiter marked its key: a release nobody
/// waited for, or only a `try_lock` looked at, sends nothing; a waiter
/// whose retry policy would not look for a minute is woken by the release.
#[tokio::test]
async fn a_release_notifies_only_when_a_waiter_marked_the_key() {
    let mut c = Case::new("notify").await;
    let holder = LockManager::new(c.backend().await);
    let waiter = slow_waiter(c.backend().await);

    let alone = holder.lock("alone").await.unwrap();
    alone.release().await.unwrap();
    let tried = holder.lock("tried").await.unwrap();
    assert!(waiter.try_lock("tried").await.unwrap().is_none());
    tried.release().await.unwrap();
    let quiet = heard(&mut c.listener, Duration::from_millis(500)).await;
    assert!(
        quiet.is_empty(),
        "releases nobody waited for notified: {quiet:?}"
    );

    let held = holder.lock("waited").await.unwrap();
    let task = tokio::spawn(async move { waiter.lock("waited").await.map(|g| (g, waiter)) });
    tokio::time::sleep(Duration::from_millis(500)).await; // the waiter waits
    held.release().await.unwrap();
    let (next, _waiter) = woken_and_told(task, &mut c.listener, "waited", 10).await;
    next.release().await.unwrap();

    c.done().await;
}

/// The row's mark (`wait_until`) as ms from now.
async fn mark_left(pool: &sqlx::PgPool, table: &str, key: &str) -> i64 {
    let sql = format!(
        "SELECT (extract(epoch FROM wait_until - now()) * 1000)::bigint FROM \"{table}\" WHERE key = $1"
    );
    match sqlx::query_scalar(&sql).bind(key).fetch_one(pool).await {
        Ok(left) => left,
        Err(e) => panic!("reading the mark: {e}"),
    }
}

/// A waiting task of its own manager on `key`.
fn wait_for(
    waiter: LockManager,
    key: &'static str,
    opts: LockOptions,
) -> tokio::task::JoinHandle<Result<(LockGuard, LockManager), moltlock_core::Error>> {
    tokio::spawn(async move {
        match waiter.acquire(key, opts).await {
            Ok(Some(g)) => Ok((g, waiter)),
            Ok(None) => panic!("the waiter timed out"),
            Err(e) => Err(e),
        }
    })
}

/// A second waiter finds the key marked by the first and does not write
/// the mark again; a mark with less than 5 s left is written again (to
/// 10 s); and the release still wakes the first waiter.
#[tokio::test]
async fn a_fresh_mark_is_read_not_written() {
    let mut c = Case::new("notify_mark").await;
    let holder = LockManager::new(c.backend().await);
    let held = holder.lock("m").await.unwrap();
    let wait = LockOptions::new().timeout(Duration::from_secs(30));
    let first = wait_for(slow_waiter(c.backend().await), "m", wait.clone());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let marked = mark_left(&c.pool, &c.table, "m").await;
    assert!(marked > 9_000, "the first waiter's mark: {marked} ms");
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let second = wait_for(slow_waiter(c.backend().await), "m", wait.clone());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let kept = mark_left(&c.pool, &c.table, "m").await;
    assert!(
        kept < marked - 1_200,
        "a fresh mark was written again: {marked} ms, then {kept} ms"
    );
    let lower = format!(
        "UPDATE \"{}\" SET wait_until = now() + interval '2 seconds'",
        c.table
    );
    sqlx::query(&lower).execute(&c.pool).await.unwrap();
    let third = wait_for(slow_waiter(c.backend().await), "m", wait);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let renewed = mark_left(&c.pool, &c.table, "m").await;
    assert!(
        renewed > 9_000,
        "a mark running low was not written: {renewed} ms"
    );
    second.abort();
    third.abort();
    held.release().await.unwrap();
    let (next, _waiter) = woken_and_told(first, &mut c.listener, "m", 10).await;
    next.release().await.unwrap();
    c.done().await;
}

/// The payload that names `token` as the head of `key`'s fair queue.
fn naming(key: &str, token: &str) -> String {
    format!("{key}\u{1}{token}")
}

/// The guard `task` got within `secs`.
async fn got_within(
    task: tokio::task::JoinHandle<Result<(LockGuard, LockManager), moltlock_core::Error>>,
    secs: u64,
) -> LockGuard {
    match tokio::time::timeout(Duration::from_secs(secs), task).await {
        Ok(Ok(Ok((guard, _)))) => guard,
        Ok(Ok(Err(e))) => panic!("the waiter failed: {e}"),
        Ok(Err(e)) => panic!("the waiter panicked: {e}"),
        Err(_) => panic!("the waiter did not get the key within {secs} s"),
    }
}

/// A release of a key with fair waiters names the queue's head (`key`,
/// `\x01`, its token): the waiters are served in their order, each named
/// by the release before its turn.
#[tokio::test]
async fn a_release_names_the_fair_queues_head() {
    let mut c = Case::new("notify_fair").await;
    let holder = LockManager::new(c.backend().await);
    let mut held = holder.lock("f").await.unwrap();
    let fair = LockOptions::new().fair().timeout(Duration::from_secs(30));
    let mut queue = Vec::new();
    for _ in 0..3 {
        queue.push(wait_for(slow_waiter(c.backend().await), "f", fair.clone()));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    for task in queue {
        held.release().await.unwrap();
        let told = heard(&mut c.listener, Duration::from_millis(300)).await;
        let next = got_within(task, 10).await;
        assert_eq!(told, [naming("f", next.token().as_str())], "not named");
        held = next;
    }
    held.release().await.unwrap();
    c.done().await;
}

/// A release that names a head which no longer waits (its place outlives
/// it) does not stall the queue: the waiter behind it is woken a turn
/// later and takes the key once that place has died, long before its own
/// next look (a third of its 30 s TTL).
#[tokio::test]
async fn a_named_head_that_is_gone_does_not_stall_the_queue() {
    let mut c = Case::new("notify_gone").await;
    let holder = LockManager::new(c.backend().await);
    let held = holder.lock("g").await.unwrap();
    c.on_queue(
        "INSERT INTO {queue} (key, owner, alive_until) \
         VALUES ('g', 'gone', now() + interval '2 seconds')",
    )
    .await;
    let fair = LockOptions::new().fair().timeout(Duration::from_secs(30));
    let task = wait_for(slow_waiter(c.backend().await), "g", fair);
    tokio::time::sleep(Duration::from_millis(500)).await;
    held.release().await.unwrap();
    let told = heard(&mut c.listener, Duration::from_millis(300)).await;
    assert_eq!(told, [naming("g", "gone")], "the release named another");
    got_within(task, 5).await.release().await.unwrap();
    c.done().await;
}

/// The ms the fair place of the waiter behind the head has left (`None`
/// while it has none).
async fn place_left(c: &Case, key: &str) -> Option<i64> {
    let sql = format!(
        "SELECT (extract(epoch FROM alive_until - now()) * 1000)::bigint FROM \"{}_queue\" \
         WHERE key = $1 ORDER BY seq OFFSET 1 LIMIT 1",
        c.table
    );
    match sqlx::query_scalar(&sql)
        .bind(key)
        .fetch_optional(&c.pool)
        .await
    {
        Ok(left) => left,
        Err(e) => panic!("reading the place: {e}"),
    }
}

/// A fair waiter's look writes its place only once a quarter of the
/// place's time has passed (a look is a read before), and the place is
/// written again before it dies: the waiter behind the head (looking
/// every 250 ms, with a 2 s TTL) keeps its place through a 3 s wait.
#[tokio::test]
async fn a_place_is_written_only_when_a_quarter_of_its_time_passed() {
    let c = Case::new("notify_place").await;
    let holder = LockManager::new(c.backend().await);
    let held = holder.lock("p").await.unwrap();
    let fair = LockOptions::new().fair().timeout(Duration::from_secs(30));
    let short = |b| {
        LockManager::builder(b)
            .ttl(Duration::from_secs(2))
            .build()
            .unwrap_or_else(|e| panic!("a manager: {e}"))
    };
    let head = wait_for(short(c.backend().await), "p", fair.clone());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let behind = wait_for(short(c.backend().await), "p", fair);
    let mut first = None;
    for _ in 0..100 {
        first = place_left(&c, "p").await;
        if first.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let Some(first) = first else {
        panic!("the second waiter took no place")
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let read = place_left(&c, "p").await.unwrap_or(0);
    assert!(
        read < first - 250,
        "a look within a quarter of the place's time wrote it: {first} ms, then {read} ms"
    );
    let mut lowest = read;
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let left = place_left(&c, "p").await.unwrap_or(0);
        assert!(left > 0, "the waiter's place died while it waited");
        lowest = lowest.min(left);
    }
    assert!(lowest > 500, "the place came within {lowest} ms of dying");
    held.release().await.unwrap();
    got_within(head, 10).await.release().await.unwrap();
    got_within(behind, 10).await.release().await.unwrap();
    c.done().await;
}

impl Case {
    /// Runs `sql` with `{queue}` standing for the table's fair queue.
    async fn on_queue(&self, sql: &str) {
        let sql = sql.replace("{queue}", &format!("\"{}_queue\"", self.table));
        if let Err(e) = sqlx::raw_sql(&sql).execute(&self.pool).await {
            panic!("{sql}: {e}");
        }
    }

    /// How many places of `key` have `owner`.
    async fn places_of(&self, key: &str, owner: &str) -> i64 {
        let sql = format!(
            "SELECT count(*) FROM \"{}_queue\" WHERE key = $1 AND owner = $2",
            self.table
        );
        let counted = sqlx::query_scalar(&sql).bind(key).bind(owner);
        counted
            .fetch_one(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The owner of the first place of `key` that a waiter took, once the
    /// waiter waits: its place taken (the places a test puts by hand have
    /// owners starting with `~`) and the key marked, which its attempt and
    /// its mark do in two statements (a release between them notifies
    /// nobody, and the waiter looks again on its own).
    async fn waiter_place(&self, key: &str) -> String {
        let sql = format!(
            "SELECT owner FROM \"{}_queue\" WHERE key = $1 AND owner NOT LIKE '~%'",
            self.table
        );
        for _ in 0..200 {
            let found = sqlx::query_scalar::<_, String>(&sql).bind(key);
            match found.fetch_optional(&self.pool).await {
                Ok(Some(token)) if mark_left(&self.pool, &self.table, key).await > 0 => {
                    return token
                }
                Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                Err(e) => panic!("reading the queue: {e}"),
            }
        }
        panic!("the waiter took no place, or did not mark the key")
    }

    /// Sends the notification that names `token` the head of `key`.
    async fn name_head(&self, key: &str, token: &str) {
        let sent = sqlx::query("SELECT pg_notify($1, $2)")
            .bind(format!("moltlock_{}", self.table))
            .bind(naming(key, token));
        if let Err(e) = sent.execute(&self.pool).await {
            panic!("notifying: {e}");
        }
    }
}

/// A fair waiter named by a release takes the key with its next
/// statement: the release's own read found it at the head, so it does not
/// look at the queue first. A look would drop the dead place put behind
/// it; the place is still there once the waiter holds the key. The waiter
/// last looked with 40 live places ahead of it (its next look 10 s away),
/// and those places are gone by the release.
#[tokio::test]
async fn a_named_head_takes_the_key_without_looking_first() {
    let mut c = Case::new("notify_named").await;
    let holder = LockManager::new(c.backend().await);
    let held = holder.lock("n").await.unwrap();
    c.on_queue(
        "INSERT INTO {queue} (key, owner, alive_until) \
         SELECT 'n', '~ahead-' || i, now() + interval '60 seconds' FROM generate_series(1, 40) i",
    )
    .await;
    let fair = LockOptions::new().fair().timeout(Duration::from_secs(30));
    let task = wait_for(slow_waiter(c.backend().await), "n", fair);
    c.waiter_place("n").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    c.on_queue(
        "DELETE FROM {queue} WHERE owner LIKE '~ahead-%'; \
         INSERT INTO {queue} (key, owner, alive_until) \
         VALUES ('n', '~dead', now() - interval '1 second')",
    )
    .await;
    held.release().await.unwrap();
    let next = got_within(task, 5).await;
    let told = heard(&mut c.listener, Duration::from_millis(300)).await;
    assert_eq!(told, [naming("n", next.token().as_str())], "not named");
    assert_eq!(
        c.places_of("n", "~dead").await,
        1,
        "the named waiter looked at the queue before its take"
    );
    next.release().await.unwrap();
    c.done().await;
}

/// A naming that no longer holds (it went stale while the waiter could not
/// act on it: paused, its place dead and taken again at the tail) lets the
/// waiter take nothing while a live place is ahead of it: it looks again
/// and waits its turn. Here the naming is sent by hand while the key is
/// free: for a waiter with a live place ahead of it, then for one whose
/// place is gone, with a later waiter's place live.
#[tokio::test]
async fn a_stale_naming_takes_nothing_past_a_live_place() {
    let mut c = Case::new("notify_stale").await;
    let holder = LockManager::new(c.backend().await);
    let held = holder.lock("s").await.unwrap();
    let live = |owner: &str| {
        format!(
            "INSERT INTO {{queue}} (key, owner, alive_until) \
             VALUES ('s', '{owner}', now() + interval '60 seconds')"
        )
    };
    c.on_queue(&live("~ahead")).await;
    let fair = LockOptions::new().fair().timeout(Duration::from_secs(30));
    let task = wait_for(slow_waiter(c.backend().await), "s", fair);
    let token = c.waiter_place("s").await;
    held.release().await.unwrap();
    let told = heard(&mut c.listener, Duration::from_millis(300)).await;
    assert_eq!(told, [naming("s", "~ahead")], "the release named another");
    c.name_head("s", &token).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !task.is_finished(),
        "a waiter took the key past a live place ahead of it"
    );
    // Its place gone (as a dead place is dropped), a later waiter's place
    // live: named again, it takes nothing and queues behind that place.
    c.on_queue(&format!("DELETE FROM {{queue}}; {}", live("~later")))
        .await;
    c.name_head("s", &token).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !task.is_finished(),
        "a waiter whose place was gone took the key past a live place"
    );
    c.on_queue("DELETE FROM {queue} WHERE owner = '~later'")
        .await;
    got_within(task, 5).await.release().await.unwrap();
    c.done().await;
}
