//! Settings shared by the SQL backends: [`SqlConfig::from_url`] and builder
//! setters, the one convention every MoltLock store follows.

use std::fmt;
use std::time::Duration;

use moltlock_core::{parse_duration, redact, Error, Secret};

/// The default table name.
pub const DEFAULT_TABLE: &str = "moltlock_locks";

/// How to reach the database and where the locks live.
///
/// Made by [`from_url`](Self::from_url) (or [`Default`], for a backend built
/// from an application's pool with `from_client`) and adjusted by the
/// builder setters. The URL may hold a password; `Debug` shows it through
/// [`moltlock_core::redact`].
///
/// With the `serde` feature it is `serde::Deserialize`, so a config file
/// can give it: `url` and the options of the URL's query by the same names
/// (durations written `"250ms"`, `"5s"`, `"2m"`), each optional. A field
/// given beside a `url` replaces the URL's parameter of that name; an
/// unknown field is refused. In TOML:
///
/// ```toml
/// url = "postgres://app@db/locks?sslmode=require"
/// table = "jobs_locks"
/// acquire_timeout = "2s"
/// expiry = "observed"
/// ```
#[derive(Clone)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(try_from = "raw::Sql"))]
pub struct SqlConfig {
    pub(crate) url: Secret,
    pub(crate) table: String,
    pub(crate) schema: Option<String>,
    pub(crate) unlogged: bool,
    pub(crate) max_connections: u32,
    pub(crate) acquire_timeout: Duration,
    pub(crate) connect_timeout: Option<Duration>,
    pub(crate) auto_migrate: bool,
    pub(crate) expiry: Expiry,
}

/// How holds expire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Expiry {
    /// By the database clock (the default): a hold is free once its
    /// `expires_at` has passed by the server's clock. One round trip frees
    /// an expired key, but a forward step of that clock can free a hold
    /// early (see the crate docs).
    #[default]
    StoreClock,
    /// With no wall clock: a waiter takes over a hold only after it saw the
    /// hold's record unchanged for the holder's whole TTL on its own
    /// monotonic clock (URL parameter `expiry=observed`). Immune to clock
    /// steps; a waiter behind a dead holder waits up to twice the TTL.
    /// Both modes use the same table and see each other's holds, so a fleet
    /// can move between them node by node: observed-expiry nodes take over
    /// a store-clock node's dead hold after watching it, and store-clock
    /// nodes judge observed-expiry holds by the clock as their own.
    /// Postgres and SQLite only.
    Observed,
}

impl std::str::FromStr for Expiry {
    type Err = Error;

    /// `store` or `observed`, as the URL parameter `expiry` writes them.
    fn from_str(value: &str) -> Result<Self, Error> {
        match value {
            "store" => Ok(Self::StoreClock),
            "observed" => Ok(Self::Observed),
            other => Err(Error::config(format!(
                "unknown expiry mode {other:?}: use expiry=store or expiry=observed"
            ))),
        }
    }
}

impl fmt::Debug for SqlConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlConfig")
            .field("url", &redact(self.url.expose()))
            .field("table", &self.table)
            .field("schema", &self.schema)
            .field("unlogged", &self.unlogged)
            .field("max_connections", &self.max_connections)
            .field("acquire_timeout", &self.acquire_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("auto_migrate", &self.auto_migrate)
            .field("expiry", &self.expiry)
            .finish()
    }
}

/// The defaults, with no URL: for `from_client`, which reuses a pool.
impl Default for SqlConfig {
    fn default() -> Self {
        Self {
            url: Secret::new(String::new()),
            table: DEFAULT_TABLE.to_owned(),
            schema: None,
            unlogged: false,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            acquire_timeout: Duration::from_secs(5),
            connect_timeout: None,
            auto_migrate: true,
            expiry: Expiry::StoreClock,
        }
    }
}

/// The default pool size: ten connections for lock statements, one for
/// Postgres's `LISTEN`, one for the rest (see [`SqlConfig::max_connections`]).
pub const DEFAULT_MAX_CONNECTIONS: u32 = 12;

impl SqlConfig {
    /// Settings for `url` (`postgres://user:pw@host/db`, `mysql://…`,
    /// `sqlite://path/to/file.db` or a bare SQLite path). Defaults: table
    /// `moltlock_locks`, the connection's default schema, a logged table,
    /// 12 pooled connections ([`DEFAULT_MAX_CONNECTIONS`]), 5 s to get one,
    /// no connect timeout of its own (getting the first connection is
    /// bounded by the acquire timeout),
    /// the schema created on connect, expiry by the database clock.
    ///
    /// Query parameters MoltLock reads, taken out of the URL the driver
    /// sees (every other parameter goes to the driver): `table`, `schema`,
    /// `unlogged=true|false`, `max_connections`, `acquire_timeout` and
    /// `connect_timeout` (durations as [`moltlock_core::parse_duration`]
    /// writes them: `250ms`, `5s`, `2m`), `auto_migrate=true|false` and
    /// `expiry=store|observed` ([`Expiry`]). Names are checked when
    /// connecting.
    ///
    /// # Errors
    /// [`Error::Config`] for a malformed value of one of those parameters.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        let (base, query) = match url.split_once('?') {
            Some((base, query)) => (base, query),
            None => (url, ""),
        };
        let mut cfg = Self::default();
        let mut rest = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            if !cfg.set(name, value)? {
                rest.push(pair);
            }
        }
        cfg.url = Secret::new(match rest.is_empty() {
            true => base.to_owned(),
            false => format!("{base}?{}", rest.join("&")),
        });
        Ok(cfg)
    }

    /// Applies the URL parameter `name=value` if it is one of ours.
    fn set(&mut self, name: &str, value: &str) -> Result<bool, Error> {
        let flag = |v: &str| match v {
            "true" | "1" | "" => Ok(true),
            "false" | "0" => Ok(false),
            other => Err(Error::config(format!(
                "{name}={other:?}: use {name}=true or {name}=false"
            ))),
        };
        match name {
            "table" => self.table = value.to_owned(),
            "schema" => self.schema = Some(value.to_owned()),
            "unlogged" => self.unlogged = flag(value)?,
            "auto_migrate" => self.auto_migrate = flag(value)?,
            "max_connections" => {
                let n = value.parse().map_err(|_| {
                    Error::config(format!("max_connections={value:?} is not a number"))
                })?;
                self.max_connections = u32::max(n, 1);
            }
            "acquire_timeout" => self.acquire_timeout = parse_duration(name, value)?,
            "connect_timeout" => self.connect_timeout = Some(parse_duration(name, value)?),
            "expiry" => self.expiry = value.parse()?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The table name: 1 to 48 ASCII letters, digits and underscores, not
    /// starting with a digit. Checked when connecting.
    pub fn table(mut self, name: impl Into<String>) -> Self {
        self.table = name.into();
        self
    }

    /// The Postgres schema of the table (created if missing). Same rules as
    /// [`table`](Self::table).
    pub fn schema(mut self, name: impl Into<String>) -> Self {
        self.schema = Some(name.into());
        self
    }

    /// Postgres only: make the table `UNLOGGED`. Writes skip the WAL, so
    /// acquisitions are faster, but after a crash of the server the table is
    /// emptied: every hold vanishes at once (holders learn it at their next
    /// renewal). Fences stay monotonic, since the fence sequence stays logged.
    /// Default: logged.
    pub fn unlogged(mut self, unlogged: bool) -> Self {
        self.unlogged = unlogged;
        self
    }

    /// The most pooled connections (at least 1). On Postgres and MySQL the
    /// backend's own pool keeps all but two of them checked out between
    /// lock statements (none of a pool of two or fewer), so a statement's
    /// connection is neither checked out nor pinged on its way back; the
    /// two left serve Postgres's `LISTEN`, migrations, sweeps and reads.
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// How long to wait for a pooled connection before
    /// [`Error::Unavailable`].
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// How long connecting (first connection, schema, sweep) may take in
    /// all before [`Error::Unavailable`]. Default: no bound of its own.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// Whether connecting creates the schema (default `true`). Turn it off
    /// where the application's role may not create tables, and have an
    /// operator run the DDL the backend documents.
    pub fn auto_migrate(mut self, on: bool) -> Self {
        self.auto_migrate = on;
        self
    }

    /// How holds expire (default: by the database clock).
    pub fn expiry(mut self, expiry: Expiry) -> Self {
        self.expiry = expiry;
        self
    }

    /// The URL the driver connects to (MoltLock's parameters taken out).
    pub(crate) fn url(&self) -> &str {
        self.url.expose()
    }

    /// The table name after validation.
    pub(crate) fn checked_table(&self) -> Result<&str, Error> {
        check_ident(&self.table, "table")?;
        Ok(&self.table)
    }

    /// The schema name after validation.
    #[cfg(feature = "postgres")]
    pub(crate) fn checked_schema(&self) -> Result<Option<&str>, Error> {
        match &self.schema {
            Some(s) => check_ident(s, "schema").map(|()| Some(s.as_str())),
            None => Ok(None),
        }
    }
}

/// The shape of [`SqlConfig`] in a config file: `url` and the URL's query
/// options by the same names, each optional. A field given beside a `url`
/// replaces the URL's own parameter of that name.
#[cfg(feature = "serde")]
mod raw {
    use std::time::Duration;

    use moltlock_core::duration::deserialize_option as duration;
    use moltlock_core::Error;

    use super::SqlConfig;

    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct Sql {
        #[serde(default)]
        url: Option<String>,
        #[serde(default)]
        table: Option<String>,
        #[serde(default)]
        schema: Option<String>,
        #[serde(default)]
        unlogged: Option<bool>,
        #[serde(default)]
        max_connections: Option<u32>,
        #[serde(default, deserialize_with = "duration")]
        acquire_timeout: Option<Duration>,
        #[serde(default, deserialize_with = "duration")]
        connect_timeout: Option<Duration>,
        #[serde(default)]
        auto_migrate: Option<bool>,
        #[serde(default)]
        expiry: Option<String>,
    }

    impl TryFrom<Sql> for SqlConfig {
        type Error = Error;

        fn try_from(raw: Sql) -> Result<Self, Error> {
            let mut cfg = match &raw.url {
                Some(url) => SqlConfig::from_url(url)?,
                None => SqlConfig::default(),
            };
            if let Some(table) = raw.table {
                super::check_ident(&table, "table")?;
                cfg = cfg.table(table);
            }
            if let Some(schema) = raw.schema {
                super::check_ident(&schema, "schema")?;
                cfg = cfg.schema(schema);
            }
            if let Some(on) = raw.unlogged {
                cfg = cfg.unlogged(on);
            }
            if let Some(n) = raw.max_connections {
                if n == 0 {
                    return Err(Error::config("max_connections must be at least 1"));
                }
                cfg = cfg.max_connections(n);
            }
            if let Some(timeout) = raw.acquire_timeout {
                cfg = cfg.acquire_timeout(timeout);
            }
            if let Some(timeout) = raw.connect_timeout {
                cfg = cfg.connect_timeout(timeout);
            }
            if let Some(on) = raw.auto_migrate {
                cfg = cfg.auto_migrate(on);
            }
            if let Some(expiry) = raw.expiry {
                cfg = cfg.expiry(expiry.parse()?);
            }
            Ok(cfg)
        }
    }
}

/// Accepts `[A-Za-z_][A-Za-z0-9_]{0,47}`: safe to splice into SQL quoted, and
/// short enough for derived names (sequences, triggers, channels) to fit the
/// 63-byte identifier limit.
///
/// # Errors
/// [`Error::Config`] naming `what` for any other name.
pub fn check_ident(name: &str, what: &str) -> Result<(), Error> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if first_ok && rest_ok && name.len() <= 48 {
        return Ok(());
    }
    Err(Error::Config(format!(
        "the {what} name {name:?} is not a plain SQL identifier (letters, digits and _, \
         not starting with a digit, at most 48 bytes)"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_checked() {
        assert!(check_ident("moltlock_locks", "table").is_ok());
        assert!(check_ident("_x9", "table").is_ok());
        for bad in [
            "",
            "9a",
            "a-b",
            "a\"b",
            "locks; DROP TABLE x",
            "ключ",
            &"a".repeat(49),
        ] {
            assert!(
                matches!(check_ident(bad, "table"), Err(Error::Config(_))),
                "{bad:?} was accepted"
            );
        }
    }

    #[test]
    fn expiry_mode_comes_from_the_url() {
        let cfg = SqlConfig::from_url("postgres://h/db?sslmode=disable&expiry=observed").unwrap();
        assert_eq!(cfg.url(), "postgres://h/db?sslmode=disable");
        assert_eq!(cfg.expiry, Expiry::Observed);
        let cfg = SqlConfig::from_url("sqlite://x.db?expiry=store").unwrap();
        assert_eq!(cfg.url(), "sqlite://x.db");
        assert_eq!(cfg.expiry, Expiry::StoreClock);
        let bad = SqlConfig::from_url("sqlite://x.db?expiry=sometimes");
        assert!(matches!(bad, Err(Error::Config(_))), "{bad:?}");
        let cfg = SqlConfig::from_url("sqlite://x.db").unwrap();
        assert_eq!(cfg.expiry, Expiry::StoreClock);
    }

    #[test]
    fn options_come_from_the_url() {
        let cfg = SqlConfig::from_url(
            "postgres://h/db?table=t1&schema=s1&unlogged=true&max_connections=3\
             &acquire_timeout=250ms&connect_timeout=5s&auto_migrate=false&sslmode=require",
        )
        .unwrap();
        assert_eq!(cfg.url(), "postgres://h/db?sslmode=require");
        assert_eq!(
            (cfg.table.as_str(), cfg.schema.as_deref()),
            ("t1", Some("s1"))
        );
        assert!(cfg.unlogged && !cfg.auto_migrate);
        assert_eq!(cfg.max_connections, 3);
        assert_eq!(cfg.acquire_timeout, Duration::from_millis(250));
        assert_eq!(cfg.connect_timeout, Some(Duration::from_secs(5)));
        for bad in [
            "acquire_timeout=5",
            "connect_timeout=x",
            "unlogged=maybe",
            "max_connections=-1",
        ] {
            let res = SqlConfig::from_url(&format!("postgres://h/db?{bad}"));
            assert!(matches!(res, Err(Error::Config(_))), "{bad}: {res:?}");
        }
    }

    #[cfg(feature = "serde")]
    #[test]
    fn settings_from_a_config_file() -> Result<(), serde_json::Error> {
        let cfg: SqlConfig = serde_json::from_str(
            r#"{"url": "postgres://h/db?sslmode=require&table=from_url",
                "table": "t1", "schema": "s1", "unlogged": true, "max_connections": 3,
                "acquire_timeout": "250ms", "connect_timeout": "5s",
                "auto_migrate": false, "expiry": "observed"}"#,
        )?;
        assert_eq!(cfg.url(), "postgres://h/db?sslmode=require");
        assert_eq!(
            (cfg.table.as_str(), cfg.schema.as_deref()),
            ("t1", Some("s1"))
        );
        assert!(cfg.unlogged && !cfg.auto_migrate);
        assert_eq!(cfg.max_connections, 3);
        assert_eq!(cfg.acquire_timeout, Duration::from_millis(250));
        assert_eq!(cfg.connect_timeout, Some(Duration::from_secs(5)));
        assert_eq!(cfg.expiry, Expiry::Observed);
        // The URL's own parameters count when no field replaces them.
        let cfg: SqlConfig =
            serde_json::from_str(r#"{"url": "sqlite://x.db?table=jobs&acquire_timeout=2s"}"#)?;
        assert_eq!(cfg.table, "jobs");
        assert_eq!(cfg.acquire_timeout, Duration::from_secs(2));
        // No URL: the defaults, for from_client.
        let cfg: SqlConfig = serde_json::from_str(r#"{"table": "jobs"}"#)?;
        assert_eq!((cfg.url(), cfg.table.as_str()), ("", "jobs"));
        for (json, says) in [
            (r#"{"acquire_timeout": "5"}"#, "\"5\" is not a duration"),
            (r#"{"expiry": "sometimes"}"#, "unknown expiry mode"),
            (r#"{"table": "a-b"}"#, "not a plain SQL identifier"),
            (r#"{"max_connections": 0}"#, "max_connections"),
            (r#"{"url": "sqlite://x.db?unlogged=maybe"}"#, "unlogged"),
            (r#"{"tabel": "x"}"#, "unknown field `tabel`"),
        ] {
            let err = match serde_json::from_str::<SqlConfig>(json) {
                Ok(cfg) => panic!("{json} gave {cfg:?}"),
                Err(e) => e.to_string(),
            };
            assert!(err.contains(says), "{json}: {err}");
        }
        Ok(())
    }

    #[test]
    fn passwords_never_show() {
        let cfg =
            SqlConfig::from_url("postgres://app:s3cret@db:5432/locks?sslmode=require").unwrap();
        let shown = format!("{cfg:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("postgres://***@db:5432/locks"), "{shown}");
        let cfg = SqlConfig::from_url("postgres://db/locks?user=app&password=s3cret").unwrap();
        let shown = format!("{cfg:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
    }
}
