// The README is the crate's documentation, and its examples are doctests.
// They name every store's module, so they are collected only in a build
// with every store and `serde` (`cargo test --doc -p moltlock --all-features`).
#![cfg_attr(
    any(
        not(doctest),
        all(
            feature = "sqlite",
            feature = "postgres",
            feature = "mysql",
            feature = "redis",
            feature = "etcd",
            feature = "serde"
        )
    ),
    doc = include_str!("../README.md")
)]
//!
//! # The `moltlock` crate
//!
//! This crate re-exports the core API ([`LockManager`], [`LockGuard`],
//! [`Backend`], …) and chooses a backend by cargo feature or by URL:
//!
//! | feature | URL schemes | backend |
//! |---|---|---|
//! | `sqlite` (default) | `sqlite://path/to/file.db` | `sqlite::SqliteBackend` |
//! | `postgres` | `postgres://`, `postgresql://` | `postgres::PostgresBackend` |
//! | `mysql` | `mysql://`, `mariadb://` | `mysql::MySqlBackend` |
//! | `redis` | `redis://`, `rediss://`, `redis+cluster://`, `rediss+cluster://` | `redis::RedisBackend` |
//! | `etcd` | `etcd://`, `etcds://` | `etcd::EtcdBackend` |
//! | `serde` | | `Deserialize` for [`StoreConfig`], [`ManagerConfig`] and every backend's config |
//! | `metrics` | | counters and histograms through the `metrics` facade |
//!
//! ```no_run
//! # async fn demo() -> Result<(), moltlock::Error> {
//! let url = std::env::var("MOLTLOCK_URL").unwrap_or_else(|_| "sqlite://locks.db".into());
//! let manager = moltlock::manager(&url).await?;
//! let guard = manager.lock("jobs/nightly").await?;
//! // ... work, passing guard.fence() with every write ...
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! A URL whose backend was not compiled in gives an [`Error::Config`] that
//! names the missing feature.
//!
//! **A quorum over several stores**: `quorum:<url>|<url>|<url>` gives a
//! [`QuorumBackend`] over the stores the URLs name, of any kinds.
//!
//! **Migrating between stores**: `migrate+<phase>:<old url>|<new url>`, with
//! phase `old`, `both` or `new`, gives a [`MigratingBackend`] — for example
//! `migrate+both:redis://10.0.0.5:6379/|etcd://10.0.0.7:2379`. See
//! `docs/MIGRATION.md` for the runbook.

use std::sync::Arc;

mod quorum_url;
pub use quorum_url::parse_quorum;

pub use moltlock_core::*;

mod store_config;
pub use store_config::StoreConfig;

#[cfg(feature = "etcd")]
pub use moltlock_etcd as etcd;
#[cfg(feature = "redis")]
pub use moltlock_redis as redis;
#[cfg(feature = "mysql")]
pub use moltlock_sql::mysql;
#[cfg(feature = "postgres")]
pub use moltlock_sql::postgres;
#[cfg(feature = "sqlite")]
pub use moltlock_sql::sqlite;
/// The settings of the SQL backends (`SqlConfig::from_url`, builder
/// setters) and the generic backend they share.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub use moltlock_sql::{SqlBackend, SqlConfig};

/// The stores a URL can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Store {
    /// etcd v3.
    Etcd,
    /// Redis or Redis Cluster.
    Redis,
    /// Postgres.
    Postgres,
    /// SQLite.
    Sqlite,
    /// MySQL or MariaDB.
    Mysql,
    /// A migration between two stores (`migrate+<phase>:<old>|<new>`).
    Migrate,
    /// A quorum over several stores (`quorum:<url>|<url>|…`).
    Quorum,
}

impl Store {
    /// The store a URL names, by its scheme.
    ///
    /// # Errors
    /// [`Error::Config`] for a URL without a known scheme.
    pub fn of(url: &str) -> Result<Self, Error> {
        let scheme = url.split_once(':').map(|(s, _)| s).unwrap_or_default();
        if scheme.to_ascii_lowercase().starts_with("migrate+") {
            return Ok(Self::Migrate);
        }
        if scheme.eq_ignore_ascii_case("quorum") {
            return Ok(Self::Quorum);
        }
        match scheme.to_ascii_lowercase().as_str() {
            "etcd" | "etcds" => Ok(Self::Etcd),
            "redis" | "rediss" | "redis+cluster" | "rediss+cluster" => Ok(Self::Redis),
            "postgres" | "postgresql" => Ok(Self::Postgres),
            "sqlite" => Ok(Self::Sqlite),
            "mysql" | "mariadb" => Ok(Self::Mysql),
            _ => Err(Error::Config(format!(
                "unknown lock store URL {:?}: use etcd://, etcds://, redis://, rediss://, \
                 redis+cluster://, postgres://, sqlite:// or mysql://",
                redact(url)
            ))),
        }
    }

    /// The cargo feature that compiles this store's backend in.
    pub fn feature(self) -> &'static str {
        match self {
            Self::Etcd => "etcd",
            Self::Redis => "redis",
            Self::Postgres => "postgres",
            Self::Sqlite => "sqlite",
            Self::Mysql => "mysql",
            Self::Migrate => "the features of both stores",
            Self::Quorum => "the features of every member store",
        }
    }

    /// Whether this build has the store's backend.
    pub fn compiled_in(self) -> bool {
        match self {
            Self::Etcd => cfg!(feature = "etcd"),
            Self::Redis => cfg!(feature = "redis"),
            Self::Postgres => cfg!(feature = "postgres"),
            Self::Sqlite => cfg!(feature = "sqlite"),
            Self::Mysql => cfg!(feature = "mysql"),
            Self::Migrate | Self::Quorum => true,
        }
    }

    /// The error for a store whose backend this build lacks.
    pub fn missing(self) -> Error {
        Error::Config(format!(
            "this build of moltlock has no {self:?} backend: enable the cargo feature `{}`",
            self.feature()
        ))
    }
}

/// The URL with any user information (and so any password) hidden, for
/// messages and listings: [`redact`] (one rule for well-formed and
/// malformed URLs alike).
pub fn redact_url(url: &str) -> String {
    redact(url)
}

/// A migration URL taken apart: the phase, the old store's URL and the new
/// store's. `None` for a URL that is not a migration.
///
/// # Errors
/// [`Error::Config`] for a malformed migration URL.
pub fn parse_migration(url: &str) -> Result<Option<(Phase, String, String)>, Error> {
    let Some(rest) = strip_prefix_ci(url, "migrate+") else {
        return Ok(None);
    };
    let bad = || {
        Error::Config(
            "a migration URL is migrate+<old|both|new>:<old store URL>|<new store URL>".into(),
        )
    };
    let (phase, stores) = rest.split_once(':').ok_or_else(bad)?;
    let (old, new) = stores.split_once('|').ok_or_else(bad)?;
    if old.is_empty() || new.is_empty() || new.contains('|') {
        return Err(bad());
    }
    for inner in [old, new] {
        if Store::of(inner)? == Store::Migrate {
            return Err(Error::Config(
                "a migration cannot nest another migration".into(),
            ));
        }
    }
    Ok(Some((phase.parse()?, old.to_owned(), new.to_owned())))
}

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}

/// Connects to the store a URL names and returns its backend.
///
/// # Errors
/// [`Error::Config`] for an unknown scheme or a backend this build lacks
/// (naming the feature to enable), and the backend's own connection errors.
pub async fn connect(url: &str) -> Result<Arc<dyn Backend>, Error> {
    let store = Store::of(url)?;
    if !store.compiled_in() {
        return Err(store.missing());
    }
    check_authority(store, url)?;
    open(store, url).await.map_err(redact_error)
}

/// A network store's URL must name its server after `scheme://`: a URL such
/// as `postgres:/user:pw@host/db` would otherwise reach a default server with
/// the rest taken as a path (a database name the server then echoes back).
fn check_authority(store: Store, url: &str) -> Result<(), Error> {
    if matches!(store, Store::Sqlite | Store::Migrate | Store::Quorum) {
        return Ok(());
    }
    let Some((scheme, rest)) = url.split_once(':') else {
        return Ok(());
    };
    if rest.starts_with("//") && !rest.starts_with("///") {
        return Ok(());
    }
    Err(Error::Config(format!(
        "a {scheme} URL names its server: {scheme}://[user[:password]@]host[:port]/…, \
         not {:?}",
        redact(url)
    )))
}

/// A [`LockManager`] with default settings over the store a URL names.
///
/// # Errors
/// As [`connect`].
pub async fn manager(url: &str) -> Result<LockManager, Error> {
    Ok(LockManager::new(connect(url).await?))
}

async fn open_migration(url: &str) -> Result<Arc<dyn Backend>, Error> {
    let (phase, old, new) =
        parse_migration(url)?.ok_or_else(|| Error::Config("not a migration URL".into()))?;
    let old = Box::pin(connect(&old)).await?;
    let new = Box::pin(connect(&new)).await?;
    Ok(Arc::new(MigratingBackend::new(old, new, phase)?))
}

async fn open(store: Store, url: &str) -> Result<Arc<dyn Backend>, Error> {
    match store {
        Store::Migrate => open_migration(url).await,
        Store::Quorum => quorum_url::open_quorum(url).await,
        one => open_one(one, url).await,
    }
}

/// Connects to one store (not a migration or a quorum), as [`connect`]
/// does: what a quorum's members are opened with.
pub(crate) async fn connect_one(url: &str) -> Result<Arc<dyn Backend>, Error> {
    let store = Store::of(url)?;
    if !store.compiled_in() {
        return Err(store.missing());
    }
    check_authority(store, url)?;
    open_one(store, url).await.map_err(redact_error)
}

#[allow(unused_variables, unreachable_code)]
async fn open_one(store: Store, url: &str) -> Result<Arc<dyn Backend>, Error> {
    match store {
        Store::Migrate | Store::Quorum => Err(Error::Config(
            "a quorum member is one store, not a quorum or a migration".into(),
        )),
        #[cfg(feature = "etcd")]
        Store::Etcd => Ok(Arc::new(etcd::EtcdBackend::from_url(url).await?)),
        #[cfg(feature = "redis")]
        Store::Redis => Ok(Arc::new(redis::RedisBackend::from_url(url).await?)),
        #[cfg(feature = "postgres")]
        Store::Postgres => Ok(Arc::new(postgres::PostgresBackend::from_url(url).await?)),
        #[cfg(feature = "sqlite")]
        Store::Sqlite => Ok(Arc::new(sqlite::SqliteBackend::from_url(url).await?)),
        #[cfg(feature = "mysql")]
        Store::Mysql => Ok(Arc::new(mysql::MySqlBackend::from_url(url).await?)),
        #[allow(unreachable_patterns)]
        other => Err(other.missing()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migration_urls_parse() {
        let (phase, old, new) = parse_migration("migrate+both:redis://h:6379/|etcd://e:2379")
            .unwrap()
            .unwrap();
        assert_eq!(phase, Phase::Both);
        assert_eq!(old, "redis://h:6379/");
        assert_eq!(new, "etcd://e:2379");
        assert_eq!(Store::of("MIGRATE+old:a://|b://").unwrap(), Store::Migrate);
        assert!(parse_migration("redis://h").unwrap().is_none());
        for bad in [
            "migrate+both:redis://h",
            "migrate+sideways:redis://h|etcd://e",
            "migrate+both:|etcd://e",
            "migrate+both:redis://h|etcd://e|x://y",
            "migrate+both:migrate+old:a://|b://|etcd://e",
        ] {
            assert!(parse_migration(bad).is_err(), "{bad} parsed");
        }
    }

    #[test]
    fn every_scheme_names_its_store() {
        let cases = [
            ("etcd://127.0.0.1:2379", Store::Etcd),
            ("etcds://a:1,b:2/p", Store::Etcd),
            ("redis://h:6379/0", Store::Redis),
            ("rediss://u:p@h:6380", Store::Redis),
            ("redis+cluster://h:7000", Store::Redis),
            ("postgres://u@h/db", Store::Postgres),
            ("postgresql://u@h/db", Store::Postgres),
            ("sqlite://./x.db", Store::Sqlite),
            ("mysql://root@h/test", Store::Mysql),
            ("MARIADB://root@h/test", Store::Mysql),
        ];
        for (url, store) in cases {
            assert_eq!(Store::of(url).unwrap(), store, "{url}");
        }
    }

    #[test]
    fn unknown_scheme_is_a_config_error_without_the_password() {
        let err = Store::of("mongodb://user:hunter2@h/db").unwrap_err();
        assert!(matches!(err, Error::Config(_)));
        assert!(!err.to_string().contains("hunter2"), "{err}");
        assert!(Store::of("no scheme at all").is_err());
    }

    #[test]
    fn network_urls_must_name_a_server() {
        for bad in [
            "postgres:/u:PW@h/x",
            "mysql:/u:PW@h/x",
            "etcd:u:PW@h:2379",
            "redis:///x",
        ] {
            let store = Store::of(bad).unwrap();
            let err = check_authority(store, bad).unwrap_err();
            assert!(!err.to_string().contains("PW"), "{err}");
        }
        for good in ["postgres://u@h/x", "sqlite:x.db", "sqlite:///tmp/x.db"] {
            assert!(
                check_authority(Store::of(good).unwrap(), good).is_ok(),
                "{good}"
            );
        }
    }

    #[test]
    fn a_missing_backend_names_its_feature() {
        for store in [
            Store::Etcd,
            Store::Redis,
            Store::Postgres,
            Store::Sqlite,
            Store::Mysql,
        ] {
            let msg = store.missing().to_string();
            assert!(msg.contains(&format!("`{}`", store.feature())), "{msg}");
        }
    }
}

/// The blocking API for callers without an async runtime (see
/// [`moltlock_core::blocking`]), with [`blocking::manager`] to open any
/// store by URL.
///
/// ```no_run
/// # fn main() -> Result<(), moltlock::Error> {
/// let manager = moltlock::blocking::manager("sqlite:///var/lib/app/locks.db")?;
/// let guard = manager.lock("jobs/nightly")?;   // blocks this thread
/// // ... work, passing guard.fence() with every write ...
/// guard.release()?;
/// # Ok(()) }
/// ```
pub mod blocking {
    pub use moltlock_core::blocking::*;

    /// A blocking manager with default settings over the store `url` names
    /// (as [`crate::manager`]), on a runtime of its own.
    ///
    /// # Errors
    /// As [`crate::manager`]; [`crate::Error::Config`] inside an async
    /// runtime.
    pub fn manager(url: &str) -> Result<LockManager, crate::Error> {
        let url = url.to_owned();
        LockManager::start(async move { crate::manager(&url).await })
    }
}
