//! One store under test: its URL, the backend MoltLock opens on it, and the
//! unique key space of this run (so shared servers are never disturbed).

use std::sync::Arc;

use moltlock::{Backend, Store};

/// A store named on the command line.
#[derive(Clone, Debug)]
pub struct Target {
    /// The URL as given.
    pub url: String,
    /// Which store it names.
    pub store: Store,
    /// A run id unique to this process, in every key and prefix it writes.
    pub run: String,
}

/// The Redis key prefix of a run.
pub fn redis_prefix(run: &str) -> String {
    format!("mlbench-{run}:")
}

/// The etcd key prefix of a run (always ends in `/`).
pub fn etcd_prefix(run: &str) -> String {
    format!("/moltlock-bench/{run}/")
}

impl Target {
    /// Parses a store URL.
    ///
    /// # Errors
    /// A message for an unknown scheme.
    pub fn new(url: &str, run: &str) -> Result<Self, String> {
        let store = Store::of(url).map_err(|e| e.to_string())?;
        Ok(Self {
            url: url.to_owned(),
            store,
            run: run.to_owned(),
        })
    }

    /// A short label: the store's feature name.
    pub fn label(&self) -> &'static str {
        self.store.feature()
    }

    /// The URL the backend is opened with: the user's, plus this run's key
    /// prefix where the store has one (Redis, etcd).
    pub fn backend_url(&self) -> String {
        match self.store {
            Store::Redis => {
                let sep = if self.url.contains('?') { '&' } else { '?' };
                format!("{}{sep}key_prefix={}", self.url, redis_prefix(&self.run))
            }
            Store::Etcd => {
                let (base, query) = match self.url.split_once('?') {
                    Some((b, q)) => (b, format!("?{q}")),
                    None => (self.url.as_str(), String::new()),
                };
                let authority = base.trim_end_matches('/');
                format!(
                    "{authority}{}{query}",
                    etcd_prefix(&self.run).trim_end_matches('/')
                )
            }
            _ => self.url.clone(),
        }
    }

    /// The `host:port` endpoints of an etcd URL (without scheme, path or query).
    pub fn etcd_endpoints(&self) -> Vec<String> {
        let rest = self
            .url
            .split_once("://")
            .map_or(self.url.as_str(), |x| x.1);
        let authority = rest.split(['/', '?']).next().unwrap_or_default();
        let hosts = authority.rsplit_once('@').map_or(authority, |x| x.1);
        hosts.split(',').map(str::to_owned).collect()
    }

    /// The Redis URL without query options (for clients other than MoltLock).
    pub fn plain_url(&self) -> String {
        self.url.split('?').next().unwrap_or_default().to_owned()
    }

    /// The backend's locks table on a SQL store, quoted (and in its schema
    /// when a Postgres URL names one): the URL's `table` option (the last
    /// one, as the backend reads it), else the default. MySQL has no
    /// schema option (the database of the URL holds the table). `None`
    /// when a name is not a plain identifier.
    pub fn backend_table(&self) -> Option<String> {
        let query = self.url.split_once('?').map_or("", |x| x.1);
        let option = |name: &str| {
            query
                .rsplit('&')
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
        };
        let plain =
            |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        let table = option("table").unwrap_or("moltlock_locks");
        if !plain(table) {
            return None;
        }
        if self.store == Store::Mysql {
            return Some(format!("`{table}`"));
        }
        match option("schema") {
            Some(schema) if plain(schema) => Some(format!("\"{schema}\".\"{table}\"")),
            Some(_) => None,
            None => Some(format!("\"{table}\"")),
        }
    }

    /// The prefix of every lock key of this run (see [`key`](Self::key)).
    pub fn key_prefix(&self) -> String {
        format!("bench/{}/", self.run)
    }

    /// A lock key of this run: `bench/<run>/<section>/<name>`.
    pub fn key(&self, section: &str, name: impl std::fmt::Display) -> String {
        format!("{}{section}/{name}", self.key_prefix())
    }

    /// Opens a MoltLock backend on the store (through `moltlock::connect`).
    ///
    /// # Errors
    /// The backend's connection error, as text.
    pub async fn backend(&self) -> Result<Arc<dyn Backend>, String> {
        moltlock::connect(&self.backend_url())
            .await
            .map_err(|e| format!("{}: {e}", self.label()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_get_the_run_prefix() -> Result<(), String> {
        let t = Target::new("redis://127.0.0.1:6379/", "r1")?;
        assert_eq!(
            t.backend_url(),
            "redis://127.0.0.1:6379/?key_prefix=mlbench-r1:"
        );
        let t = Target::new("etcd://127.0.0.1:2379", "r1")?;
        assert_eq!(t.backend_url(), "etcd://127.0.0.1:2379/moltlock-bench/r1");
        assert_eq!(t.etcd_endpoints(), vec!["127.0.0.1:2379".to_owned()]);
        let t = Target::new("sqlite:///tmp/x.db", "r1")?;
        assert_eq!(t.backend_url(), "sqlite:///tmp/x.db");
        assert!(Target::new("nope://x", "r1").is_err());
        Ok(())
    }

    #[test]
    fn the_backend_table_follows_the_url() -> Result<(), String> {
        let table = |url: &str| Target::new(url, "r1").map(|t| t.backend_table());
        let pg = "postgres://u@h/db";
        assert_eq!(table(pg)?.as_deref(), Some("\"moltlock_locks\""));
        let named = table(&format!("{pg}?table=app_locks&schema=locks"))?;
        assert_eq!(named.as_deref(), Some("\"locks\".\"app_locks\""));
        let my = table("mysql://root@h/test?max_connections=4&table=l2&schema=other")?;
        assert_eq!(my.as_deref(), Some("`l2`"));
        let twice = table(&format!("{pg}?table=first&table=second"))?;
        assert_eq!(twice.as_deref(), Some("\"second\""));
        assert_eq!(table(&format!("{pg}?table=a;drop"))?, None);
        assert_eq!(table(&format!("{pg}?schema=x%22"))?, None);
        Ok(())
    }
}
