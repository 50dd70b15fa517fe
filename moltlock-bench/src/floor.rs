//! The floor: the store's bare commands for one acquire and one release,
//! issued directly with the client library the backend uses. A lock cycle
//! can only approach this figure; the ratio to it is MoltLock's overhead.
//!
//! | store | acquire | release |
//! |---|---|---|
//! | Redis | `SET k t NX PX ttl` | the compare-and-`DEL` script (`EVALSHA`) |
//! | etcd | `Txn(if create_revision(k) == 0 then put(k, t, lease) else get(k))` | `Txn(if value(k) == t then delete(k))` |
//! | Postgres | `INSERT … ON CONFLICT (k) DO UPDATE … WHERE expires_at < now()` | `DELETE … WHERE k = $1 AND token = $2` |
//! | SQLite | the same, with the expiry in milliseconds of the process clock, on a `WITHOUT ROWID` table (one B-tree page per write) in a database file of its own beside the backend's | the same |
//! | MySQL/MariaDB | `INSERT … ON DUPLICATE KEY UPDATE` taking only an expired row, by the server's clock | the same `DELETE` |
//!
//! The SQL floors are written here against a table of the harness's own
//! (`moltlock_bench_floor`, dropped by [`Floor::cleanup`]), not through
//! the backend: a floor measured with the backend's own statements would
//! make a slow backend look like its own floor.

use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use moltlock::Store;
use redis::aio::ConnectionManager;
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::SqliteSynchronous;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use sqlx::Executor;

use crate::target::{etcd_prefix, redis_prefix, Target};

mod lent;
mod sql;
use crate::workload::Cycler;
pub use lent::Lent;

/// The TTL of floor holds (they are released at once).
const TTL: Duration = Duration::from_secs(30);
/// Connections of the SQL floors: the backends' default pool size. On
/// Postgres and MySQL they are kept checked out (see [`Lent`]), the
/// cheapest correct way to drive the store, and their pools have one more
/// for the harness's own statements. SQLite's floor goes through its pool,
/// as its backend does: a connection kept out of it holds its finished
/// statements' read transactions open, and the write-ahead log is never
/// checkpointed.
const POOL: u32 = 10;

const REDIS_CAD: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/// A direct client of one store, issuing the floor's commands.
#[derive(Clone)]
pub enum Floor {
    /// Redis, through the `redis` crate's connection manager.
    Redis {
        /// The connection.
        conn: ConnectionManager,
        /// The key prefix the backend uses in this run.
        prefix: String,
    },
    /// etcd, through `etcd-client`.
    Etcd {
        /// The client (boxed: it is large).
        client: Box<etcd_client::Client>,
        /// The lease floor holds hang on.
        lease: i64,
        /// The key prefix the backend uses in this run.
        prefix: String,
    },
    /// Postgres: a raw pool.
    Postgres {
        /// A pool of its own.
        pool: PgPool,
        /// Its connections, kept checked out.
        lent: Arc<Lent<sqlx::Postgres>>,
    },
    /// SQLite: a raw pool, on a database file of its own.
    Sqlite {
        /// A pool of its own.
        pool: SqlitePool,
        /// Its file, removed by [`Floor::cleanup`] (an in-memory
        /// database's name names no file, and nothing is removed).
        file: std::path::PathBuf,
    },
    /// MySQL or MariaDB: a raw pool.
    Mysql {
        /// A pool of its own.
        pool: MySqlPool,
        /// Its connections, kept checked out.
        lent: Arc<Lent<sqlx::MySql>>,
    },
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

impl Floor {
    /// Connects to the target's store (and creates the SQL floor's table).
    ///
    /// # Errors
    /// Connection errors, as text.
    pub async fn connect(t: &Target) -> Result<Self, String> {
        match t.store {
            Store::Redis => {
                let client = redis::Client::open(t.plain_url()).map_err(err)?;
                let conn = ConnectionManager::new(client).await.map_err(err)?;
                Ok(Self::Redis {
                    conn,
                    prefix: redis_prefix(&t.run),
                })
            }
            Store::Etcd => {
                let mut client = etcd_client::Client::connect(t.etcd_endpoints(), None)
                    .await
                    .map_err(err)?;
                let lease = client.lease_grant(120, None).await.map_err(err)?.id();
                Ok(Self::Etcd {
                    client: Box::new(client),
                    lease,
                    prefix: etcd_prefix(&t.run),
                })
            }
            Store::Postgres => {
                let pool = PgPoolOptions::new()
                    .max_connections(POOL + 1)
                    .test_before_acquire(false);
                let pool = pool.connect(&t.url).await.map_err(err)?;
                sqlx::query(&sql::PG_TABLE)
                    .execute(&pool)
                    .await
                    .map_err(err)?;
                let lent = Arc::new(Lent::new(&pool, POOL).await?);
                Ok(Self::Postgres { pool, lent })
            }
            Store::Sqlite => {
                let opts = SqliteConnectOptions::from_str(&t.url).map_err(err)?;
                let (opts, file) = own_file(opts, &t.run);
                let opts = opts
                    .journal_mode(SqliteJournalMode::Wal)
                    .synchronous(SqliteSynchronous::Normal)
                    .busy_timeout(Duration::from_secs(10));
                let pool = SqlitePoolOptions::new()
                    .max_connections(POOL)
                    .test_before_acquire(false);
                let pool = pool.connect_with(opts).await.map_err(err)?;
                sqlx::query(&sql::SQLITE_TABLE)
                    .execute(&pool)
                    .await
                    .map_err(err)?;
                Ok(Self::Sqlite { pool, file })
            }
            Store::Mysql => {
                let pool = MySqlPoolOptions::new()
                    .max_connections(POOL + 1)
                    .test_before_acquire(false);
                let pool = pool.connect(&t.url).await.map_err(err)?;
                sqlx::query(&sql::MYSQL_TABLE)
                    .execute(&pool)
                    .await
                    .map_err(err)?;
                let lent = Arc::new(Lent::new(&pool, POOL).await?);
                Ok(Self::Mysql { pool, lent })
            }
            #[allow(unreachable_patterns)]
            other => Err(format!("{other:?} is not a store the harness measures")),
        }
    }

    /// One bare round trip (PING, a read, `SELECT 1`).
    ///
    /// # Errors
    /// Store errors, as text.
    pub async fn round_trip(&self) -> Result<(), String> {
        match self {
            Self::Redis { conn, .. } => {
                let mut c = conn.clone();
                let _: String = redis::cmd("PING").query_async(&mut c).await.map_err(err)?;
            }
            Self::Etcd { client, prefix, .. } => {
                let mut kv = client.kv_client();
                kv.get(format!("{prefix}rtt"), None).await.map_err(err)?;
            }
            Self::Postgres { lent, .. } => sql::select_one(lent).await?,
            Self::Sqlite { pool, .. } => {
                sqlx::query("SELECT 1").execute(pool).await.map_err(err)?;
            }
            Self::Mysql { lent, .. } => sql::select_one(lent).await?,
        }
        Ok(())
    }

    /// One acquire of the free key `key` and its release.
    ///
    /// # Errors
    /// Store errors, or a message when the free key was not taken.
    pub async fn acquire_release(&self, key: &str) -> Result<(), String> {
        self.timed_cycle(key).await.map(|_| ())
    }

    /// As [`acquire_release`](Self::acquire_release); returns how long
    /// the take and the release each took.
    ///
    /// # Errors
    /// As [`acquire_release`](Self::acquire_release).
    pub async fn timed_cycle(&self, key: &str) -> Result<(Duration, Duration), String> {
        let token = uuid::Uuid::new_v4().to_string();
        let mut split = Split::default();
        let s = &mut split;
        let started = Instant::now();
        let taken = match self {
            Self::Redis { conn, prefix } => {
                redis_cycle(conn, &format!("{prefix}{{{key}}}"), &token, s).await?
            }
            Self::Etcd {
                client,
                lease,
                prefix,
            } => etcd_cycle(client, *lease, format!("{prefix}{key}"), &token, s).await?,
            Self::Postgres { lent, .. } => {
                let mut c = lent.take().await?;
                let done = sql::pg_cycle(&mut c, key, &token, s).await;
                lent.give(c);
                done?
            }
            Self::Sqlite { pool, .. } => sql::sqlite_cycle(pool, key, &token, s).await?,
            Self::Mysql { lent, .. } => {
                let mut c = lent.take().await?;
                let done = sql::mysql_cycle(&mut c, key, &token, s).await;
                lent.give(c);
                done?
            }
        };
        let ended = Instant::now();
        if !taken {
            return Err(format!("the floor did not take the free key {key}"));
        }
        let mid = split.0.unwrap_or(ended);
        Ok((mid - started, ended - mid))
    }

    /// Deletes the rows the run's lock keys left in the backend's tables
    /// (Postgres and MySQL keep a released key's row; the other stores'
    /// keys go with [`cleanup`](Self::cleanup) or at their release).
    ///
    /// # Errors
    /// A statement's error, as text.
    pub async fn forget_run(&self, t: &Target) -> Result<(), String> {
        let Some(table) = t.backend_table() else {
            return Ok(());
        };
        match self {
            Self::Postgres { pool, .. } => sql::pg_forget(pool, &table, &t.key_prefix()).await,
            Self::Mysql { pool, .. } => sql::mysql_forget(pool, &table, &t.key_prefix()).await,
            _ => Ok(()),
        }
    }

    /// Removes what the run left in the store: Redis fence keys under the
    /// run's prefix, the etcd lease (and keys under the run's prefix), the
    /// SQL floor's table.
    ///
    /// # Errors
    /// Store errors, as text.
    pub async fn cleanup(&self) -> Result<(), String> {
        match self {
            Self::Redis { conn, prefix } => redis_cleanup(conn, prefix).await,
            Self::Etcd {
                client,
                lease,
                prefix,
            } => {
                let mut c = client.clone();
                let _ = c.lease_revoke(*lease).await;
                let opts = etcd_client::DeleteOptions::new().with_prefix();
                c.delete(prefix.as_str(), Some(opts)).await.map_err(err)?;
                Ok(())
            }
            Self::Postgres { pool, .. } => drop_table(pool.execute(sql::DROP.as_str())).await,
            Self::Sqlite { pool, file } => {
                let dropped = drop_table(pool.execute(sql::DROP.as_str())).await;
                pool.close().await;
                dropped.and(remove_database(file))
            }
            Self::Mysql { pool, .. } => drop_table(pool.execute(sql::DROP.as_str())).await,
        }
    }
}

/// The SQLite floor's own database file, beside the backend's (its name
/// with `-floor-<run id>` added): the floor and MoltLock alternate cycle
/// by cycle, and on one file each commit of one side makes the other
/// side's connections read their pages again, a cost neither would have
/// on its own.
fn own_file(opts: SqliteConnectOptions, run: &str) -> (SqliteConnectOptions, std::path::PathBuf) {
    let mut name = opts.get_filename().as_os_str().to_owned();
    name.push(format!("-floor-{run}"));
    let file = std::path::PathBuf::from(name);
    (opts.filename(&file).create_if_missing(true), file)
}

/// Removes a closed SQLite database: its file and the WAL's two.
fn remove_database(file: &std::path::Path) -> Result<(), String> {
    for suffix in ["", "-wal", "-shm"] {
        let mut name = file.as_os_str().to_owned();
        name.push(suffix);
        match std::fs::remove_file(&name) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(format!("{}: {e}", file.display()))
            }
            _ => {}
        }
    }
    Ok(())
}

/// Awaits the drop of the SQL floor's table.
async fn drop_table<T, E: std::fmt::Display>(
    done: impl std::future::Future<Output = Result<T, E>>,
) -> Result<(), String> {
    done.await.map(|_| ()).map_err(err)
}

/// When a floor cycle's take returned (and its release began).
#[derive(Default)]
pub(crate) struct Split(Option<Instant>);

impl Split {
    /// Notes that the take returned now.
    pub(crate) fn mark(&mut self) {
        self.0 = Some(Instant::now());
    }
}

/// The compare-and-`DEL` script, hashed once (a raw client keeps its
/// `Script`; hashing it per cycle would slow the floor).
static REDIS_CAD_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(REDIS_CAD));

async fn redis_cycle(
    conn: &ConnectionManager,
    key: &str,
    token: &str,
    split: &mut Split,
) -> Result<bool, String> {
    let mut c = conn.clone();
    let ttl = u64::try_from(TTL.as_millis()).unwrap_or(u64::MAX);
    let set: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg(token)
        .arg("NX")
        .arg("PX")
        .arg(ttl)
        .query_async(&mut c)
        .await
        .map_err(err)?;
    split.mark();
    let deleted: i64 = REDIS_CAD_SCRIPT
        .key(key)
        .arg(token)
        .invoke_async(&mut c)
        .await
        .map_err(err)?;
    Ok(set.is_some() && deleted == 1)
}

async fn redis_cleanup(conn: &ConnectionManager, prefix: &str) -> Result<(), String> {
    let mut c = conn.clone();
    let mut cursor = 0u64;
    for _ in 0..100_000 {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut c)
            .await
            .map_err(err)?;
        if !keys.is_empty() {
            let _: i64 = redis::cmd("DEL")
                .arg(&keys)
                .query_async(&mut c)
                .await
                .map_err(err)?;
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
    Ok(())
}

async fn etcd_cycle(
    client: &etcd_client::Client,
    lease: i64,
    key: String,
    token: &str,
    split: &mut Split,
) -> Result<bool, String> {
    let mut kv = client.kv_client();
    let put = PutOptions::new().with_lease(lease);
    let take = Txn::new()
        .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(key.clone(), token, Some(put))])
        .or_else([TxnOp::get(key.clone(), None)]);
    let taken = kv.txn(take).await.map_err(err)?.succeeded();
    split.mark();
    let release = Txn::new()
        .when([Compare::value(key.clone(), CompareOp::Equal, token)])
        .and_then([TxnOp::delete(key, None)]);
    let released = kv.txn(release).await.map_err(err)?.succeeded();
    Ok(taken && released)
}

#[async_trait]
impl Cycler for Floor {
    async fn cycle(&self, key: &str) -> Result<(), String> {
        self.acquire_release(key).await
    }
}
