//! A service's config file names its lock store: `StoreConfig`, the
//! manager's settings and every backend's config deserialize from it (the
//! `serde` feature), with durations written as URLs write them and unknown
//! fields refused.
#![cfg(feature = "serde")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap

use std::time::Duration;

use moltlock::{ManagerConfig, StoreConfig};

/// A service's own settings, with the lock store in one section.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Service {
    name: String,
    locks: StoreConfig,
}

/// The error of deserializing `json` as `T`, which must fail.
fn refused<T: serde::de::DeserializeOwned + std::fmt::Debug>(json: &str) -> String {
    match serde_json::from_str::<T>(json) {
        Ok(v) => panic!("{json} gave {v:?}"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test]
async fn a_store_config_from_a_file_connects_to_sqlite_and_locks() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let json = format!(
        r#"{{"name": "reports",
            "locks": {{"url": {url:?}, "ttl": "2m", "drift": 0.05, "release_timeout": "1s",
                       "retry_initial": "5ms", "retry_max": "250ms"}}}}"#
    );
    let service: Service = serde_json::from_str(&json).unwrap();
    assert_eq!(service.name, "reports");
    let locks = &service.locks;
    assert_eq!(locks.url, url);
    assert_eq!(locks.manager.ttl, Some(Duration::from_secs(120)));
    assert_eq!(locks.manager.drift, Some(0.05));
    assert_eq!(locks.manager.retry_max, Some(Duration::from_millis(250)));

    let manager = locks.manager().await.unwrap();
    assert_eq!(manager.ttl(), Duration::from_secs(120));
    assert_eq!(manager.backend().name(), "sqlite");
    let guard = manager.lock("jobs/nightly").await.unwrap();
    assert_eq!(guard.ttl(), Duration::from_secs(120));
    assert!(manager.try_lock("jobs/nightly").await.unwrap().is_none());
    guard.release().await.unwrap();
    assert!(manager.try_lock("jobs/nightly").await.unwrap().is_some());
}

#[tokio::test]
async fn only_the_url_is_required() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let locks: StoreConfig = serde_json::from_str(&format!(r#"{{"url": {url:?}}}"#)).unwrap();
    assert_eq!(locks.manager, ManagerConfig::default());
    assert_eq!(locks, StoreConfig::new(url));
    let backend = locks.connect().await.unwrap();
    assert_eq!(backend.name(), "sqlite");
}

#[test]
fn bad_store_configs_say_what_is_wrong() {
    for (json, says) in [
        (r#"{"ttl": "30s"}"#, "missing field `url`"),
        (
            r#"{"url": "sqlite://x.db", "ttl": "30"}"#,
            "\"30\" is not a duration",
        ),
        (
            r#"{"url": "sqlite://x.db", "ttl": 30}"#,
            "expected a duration",
        ),
        (r#"{"url": "sqlite://x.db", "drift": 2.0}"#, "drift = 2"),
        (
            r#"{"url": "sqlite://x.db", "table": "t"}"#,
            "unknown field `table`",
        ),
        (
            r#"{"url": "mongodb://u:hunter2@h/db"}"#,
            "unknown lock store URL",
        ),
    ] {
        let err = refused::<StoreConfig>(json);
        assert!(err.contains(says), "{json}: {err}");
        assert!(!err.contains("hunter2"), "{err}");
    }
}

#[tokio::test]
async fn a_ttl_below_the_stores_floor_is_refused_when_connecting() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let locks: StoreConfig =
        serde_json::from_str(&format!(r#"{{"url": {url:?}, "ttl": "1ms"}}"#)).unwrap();
    let err = locks.manager().await.unwrap_err();
    assert!(matches!(err, moltlock::Error::InvalidTtl { .. }), "{err}");
}

#[test]
fn debug_hides_the_password() {
    let locks: StoreConfig =
        serde_json::from_str(r#"{"url": "postgres://app:s3cret@db/locks"}"#).unwrap();
    let shown = format!("{locks:?}");
    assert!(!shown.contains("s3cret"), "{shown}");
}

#[test]
fn manager_settings_alone() {
    let cfg: ManagerConfig = serde_json::from_str(r#"{"ttl": "5s", "drift": 0.1}"#).unwrap();
    assert_eq!(cfg.ttl, Some(Duration::from_secs(5)));
    assert!(refused::<ManagerConfig>(r#"{"url": "sqlite://x.db"}"#).contains("unknown field"));
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn a_sql_config_from_a_file_connects_to_sqlite() {
    use moltlock::sqlite::{SqlConfig, SqliteBackend};

    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let cfg: SqlConfig = serde_json::from_str(&format!(
        r#"{{"url": {url:?}, "table": "jobs_locks", "acquire_timeout": "2s", "expiry": "observed"}}"#
    ))
    .unwrap();
    let backend = SqliteBackend::connect(cfg).await.unwrap();
    let manager = moltlock::LockManager::new(backend.clone());
    let guard = manager.lock("jobs/a").await.unwrap();
    let n: (i64,) = moltlock::sqlite::sqlx::query_as("SELECT count(*) FROM jobs_locks")
        .fetch_one(backend.pool())
        .await
        .unwrap();
    assert_eq!(n.0, 1);
    guard.release().await.unwrap();
    let err = refused::<SqlConfig>(r#"{"url": "sqlite://x.db", "expiry": "never"}"#);
    assert!(err.contains("unknown expiry mode"), "{err}");
}

#[cfg(feature = "postgres")]
#[test]
fn a_sql_config_through_the_postgres_module() {
    let cfg: moltlock::postgres::SqlConfig =
        serde_json::from_str(r#"{"url": "postgres://app@db/locks", "schema": "locks"}"#).unwrap();
    assert!(format!("{cfg:?}").contains("schema: Some(\"locks\")"));
    let err = refused::<moltlock::postgres::SqlConfig>(r#"{"unlogged": "yes"}"#);
    assert!(err.contains("invalid type"), "{err}");
}

#[cfg(feature = "redis")]
#[test]
fn a_redis_config_from_a_file() {
    use moltlock::redis::{Mode, RedisConfig};

    let cfg: RedisConfig = serde_json::from_str(
        r#"{"url": "redis+cluster://10.0.0.5:7000", "node": ["10.0.0.6:7000"],
            "key_prefix": "jobs:", "restart_quarantine": "60s"}"#,
    )
    .unwrap();
    assert_eq!(cfg.mode(), Mode::Cluster);
    let err = refused::<RedisConfig>(r#"{"restart_quarantine": "1 minute"}"#);
    assert!(err.contains("is not a duration"), "{err}");
}

#[cfg(feature = "etcd")]
#[test]
fn an_etcd_config_from_a_file() {
    use moltlock::etcd::EtcdConfig;

    let cfg: EtcdConfig = serde_json::from_str(
        r#"{"endpoints": ["10.0.0.7:2379", "10.0.0.8:2379"], "key_prefix": "/jobs",
            "request_timeout": "2s"}"#,
    )
    .unwrap();
    assert_eq!(cfg.endpoints(), ["10.0.0.7:2379", "10.0.0.8:2379"]);
    let err = refused::<EtcdConfig>(r#"{"endpoint": "10.0.0.7:2379"}"#);
    assert!(err.contains("unknown field `endpoint`"), "{err}");
}
