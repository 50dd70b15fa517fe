//! The floor: the store's bare commands for one acquire and one release,
//! issued directly with the client library the backend uses. A lock cycle
//! can only approach this figure; the ratio to it is MoltLock's overhead.
//!
//! | store | acquire | release |
//! |---|---|---|
//! | Redis | `SET k t NX PX ttl` | the compare-and-`DEL` script (`EVALSHA`) |
//! | etcd | `Txn(if create_revision(k) == 0 then put(k, t, lease) else get(k))` | `Txn(if value(k) == t then delete(k))` |
//! | Postgres, SQLite, MySQL | the backend's own `cas` (its one conditional insert), called without the manager | the backend's own owner-checked `delete` |
//!
//! The SQL floors call the backend directly, so they always issue exactly
//! the statements the backend does.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use moltlock::{Backend, CasOutcome, LockKey, Store, Token};
use redis::aio::ConnectionManager;
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::SqliteSynchronous;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};

use crate::target::{etcd_prefix, redis_prefix, Target};
use crate::workload::Cycler;

/// The TTL of floor holds (they are released at once).
const TTL: Duration = Duration::from_secs(30);
/// Pool size of the SQL floors: the backends' default.
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
    /// Postgres: the backend, and a pool for the bare round trip.
    Postgres {
        /// The backend, used without a manager.
        backend: Arc<dyn Backend>,
        /// A pool of its own for `SELECT 1`.
        pool: PgPool,
    },
    /// SQLite: the backend, and a pool for the bare round trip.
    Sqlite {
        /// The backend, used without a manager.
        backend: Arc<dyn Backend>,
        /// A pool of its own for `SELECT 1`.
        pool: SqlitePool,
    },
    /// MySQL or MariaDB: the backend, and a pool for the bare round trip.
    Mysql {
        /// The backend, used without a manager.
        backend: Arc<dyn Backend>,
        /// A pool of its own for `SELECT 1`.
        pool: MySqlPool,
    },
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

impl Floor {
    /// Connects to the target's store. The backend must have been opened
    /// first (it creates the SQL schema).
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
                let pool = PgPoolOptions::new().max_connections(POOL);
                Ok(Self::Postgres {
                    backend: t.backend().await?,
                    pool: pool.connect(&t.url).await.map_err(err)?,
                })
            }
            Store::Sqlite => {
                let opts = SqliteConnectOptions::from_str(&t.url)
                    .map_err(err)?
                    .journal_mode(SqliteJournalMode::Wal)
                    .synchronous(SqliteSynchronous::Normal)
                    .busy_timeout(Duration::from_secs(10));
                let pool = SqlitePoolOptions::new().max_connections(POOL);
                Ok(Self::Sqlite {
                    backend: t.backend().await?,
                    pool: pool.connect_with(opts).await.map_err(err)?,
                })
            }
            Store::Mysql => {
                let pool = MySqlPoolOptions::new().max_connections(POOL);
                Ok(Self::Mysql {
                    backend: t.backend().await?,
                    pool: pool.connect(&t.url).await.map_err(err)?,
                })
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
            Self::Postgres { pool, .. } => {
                sqlx::query("SELECT 1").execute(pool).await.map_err(err)?;
            }
            Self::Sqlite { pool, .. } => {
                sqlx::query("SELECT 1").execute(pool).await.map_err(err)?;
            }
            Self::Mysql { pool, .. } => {
                sqlx::query("SELECT 1").execute(pool).await.map_err(err)?;
            }
        }
        Ok(())
    }

    /// One acquire of the free key `key` and its release.
    ///
    /// # Errors
    /// Store errors, or a message when the free key was not taken.
    pub async fn acquire_release(&self, key: &str) -> Result<(), String> {
        let token = uuid::Uuid::new_v4().to_string();
        let taken = match self {
            Self::Redis { conn, prefix } => {
                redis_cycle(conn, &format!("{prefix}{{{key}}}"), &token).await?
            }
            Self::Etcd {
                client,
                lease,
                prefix,
            } => etcd_cycle(client, *lease, format!("{prefix}{key}"), &token).await?,
            Self::Postgres { backend, .. }
            | Self::Sqlite { backend, .. }
            | Self::Mysql { backend, .. } => backend_cycle(backend.as_ref(), key).await?,
        };
        if taken {
            Ok(())
        } else {
            Err(format!("the floor did not take the free key {key}"))
        }
    }

    /// Removes what the run left in the store: Redis fence keys under the
    /// run's prefix, the etcd lease (and keys under the run's prefix).
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
            _ => Ok(()),
        }
    }
}

/// The backend's own `cas` of a free key, then its `delete`.
async fn backend_cycle(backend: &dyn Backend, key: &str) -> Result<bool, String> {
    let key = LockKey::new(key).map_err(err)?;
    let token = Token::random();
    let taken = matches!(
        backend.cas(&key, None, &token, TTL).await.map_err(err)?,
        CasOutcome::Acquired { .. }
    );
    let released = backend.delete(&key, &token).await.map_err(err)?;
    Ok(taken && released)
}

async fn redis_cycle(conn: &ConnectionManager, key: &str, token: &str) -> Result<bool, String> {
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
    let script = redis::Script::new(REDIS_CAD);
    let deleted: i64 = script
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
) -> Result<bool, String> {
    let mut kv = client.kv_client();
    let put = PutOptions::new().with_lease(lease);
    let take = Txn::new()
        .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(key.clone(), token, Some(put))])
        .or_else([TxnOp::get(key.clone(), None)]);
    let taken = kv.txn(take).await.map_err(err)?.succeeded();
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
