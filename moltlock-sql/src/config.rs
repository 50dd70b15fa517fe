//! Settings shared by the SQL backends.

use std::fmt;
use std::time::Duration;

use moltlock_core::Error;

/// The default table name.
pub const DEFAULT_TABLE: &str = "moltlock_locks";

/// How to reach the database and where the locks live.
///
/// The URL may hold a password; `Debug` never shows it.
#[derive(Clone)]
pub struct SqlConfig {
    pub(crate) url: String,
    pub(crate) table: String,
    pub(crate) schema: Option<String>,
    pub(crate) unlogged: bool,
    pub(crate) max_connections: u32,
    pub(crate) acquire_timeout: Duration,
    pub(crate) auto_migrate: bool,
    pub(crate) expiry: Result<Expiry, String>,
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
    Observed,
}

impl fmt::Debug for SqlConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlConfig")
            .field("url", &redact(&self.url))
            .field("table", &self.table)
            .field("schema", &self.schema)
            .field("unlogged", &self.unlogged)
            .field("max_connections", &self.max_connections)
            .field("acquire_timeout", &self.acquire_timeout)
            .field("auto_migrate", &self.auto_migrate)
            .field("expiry", &self.expiry)
            .finish()
    }
}

impl SqlConfig {
    /// Settings for `url` with the defaults: table `moltlock_locks`, the
    /// connection's default schema, a logged table, 10 pooled connections,
    /// 5 s to get one, and the schema created on connect.
    ///
    /// A URL parameter `expiry=observed` (or `expiry=store`) chooses the
    /// [`Expiry`] mode; it is taken out of the URL the driver sees.
    pub fn new(url: impl Into<String>) -> Self {
        let (url, expiry) = take_expiry(url.into());
        Self {
            url,
            expiry,
            table: DEFAULT_TABLE.to_owned(),
            schema: None,
            unlogged: false,
            max_connections: 10,
            acquire_timeout: Duration::from_secs(5),
            auto_migrate: true,
        }
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

    /// The most pooled connections.
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

    /// Whether connecting creates the schema (default `true`). Turn it off
    /// where the application's role may not create tables, and have an
    /// operator run the DDL the backend documents.
    pub fn auto_migrate(mut self, on: bool) -> Self {
        self.auto_migrate = on;
        self
    }

    /// How holds expire (default: by the database clock).
    pub fn expiry(mut self, expiry: Expiry) -> Self {
        self.expiry = Ok(expiry);
        self
    }

    /// The expiry mode after validation.
    pub(crate) fn checked_expiry(&self) -> Result<Expiry, Error> {
        self.expiry.clone().map_err(Error::Config)
    }

    /// The table name after validation.
    pub(crate) fn checked_table(&self) -> Result<&str, Error> {
        check_ident(&self.table, "table")?;
        Ok(&self.table)
    }

    /// The schema name after validation.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn checked_schema(&self) -> Result<Option<&str>, Error> {
        match &self.schema {
            Some(s) => check_ident(s, "schema").map(|()| Some(s.as_str())),
            None => Ok(None),
        }
    }
}

/// Splits an `expiry=` query parameter off `url`.
fn take_expiry(url: String) -> (String, Result<Expiry, String>) {
    let Some((base, query)) = url.split_once('?') else {
        return (url, Ok(Expiry::default()));
    };
    let mut expiry = Ok(Expiry::default());
    let rest: Vec<&str> = query
        .split('&')
        .filter(|pair| match pair.strip_prefix("expiry=") {
            Some("observed") => {
                expiry = Ok(Expiry::Observed);
                false
            }
            Some("store") => false,
            Some(other) => {
                expiry = Err(format!(
                    "unknown expiry mode {other:?}: use expiry=store or expiry=observed"
                ));
                false
            }
            None => true,
        })
        .collect();
    let url = match rest.is_empty() {
        true => base.to_owned(),
        false => format!("{base}?{}", rest.join("&")),
    };
    (url, expiry)
}

/// Accepts `[A-Za-z_][A-Za-z0-9_]{0,47}`: safe to splice into SQL quoted, and
/// short enough for derived names (sequences, triggers, channels) to fit the
/// 63-byte identifier limit.
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

/// The URL with its user information and any password-like query parameter
/// (`?password=…`) replaced by `***`: [`moltlock_core::redact`], the one
/// rule every parser and error path uses.
pub fn redact(url: &str) -> String {
    moltlock_core::redact(url)
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
        let cfg = SqlConfig::new("postgres://h/db?sslmode=disable&expiry=observed");
        assert_eq!(cfg.url, "postgres://h/db?sslmode=disable");
        assert_eq!(cfg.checked_expiry().ok(), Some(Expiry::Observed));
        let cfg = SqlConfig::new("sqlite://x.db?expiry=store");
        assert_eq!(cfg.url, "sqlite://x.db");
        assert_eq!(cfg.checked_expiry().ok(), Some(Expiry::StoreClock));
        let bad = SqlConfig::new("sqlite://x.db?expiry=sometimes");
        assert!(matches!(bad.checked_expiry(), Err(Error::Config(_))));
        assert_eq!(
            SqlConfig::new("sqlite://x.db").checked_expiry().ok(),
            Some(Expiry::StoreClock)
        );
    }

    #[test]
    fn passwords_never_show() {
        let cfg = SqlConfig::new("postgres://app:s3cret@db:5432/locks?sslmode=require");
        let shown = format!("{cfg:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("postgres://***@db:5432/locks"), "{shown}");
        let cfg = SqlConfig::new("postgres://db/locks?user=app&password=s3cret");
        let shown = format!("{cfg:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert_eq!(redact("sqlite://./x.db"), "sqlite://./x.db");
        assert_eq!(redact("mysql://root:pw@h/db"), "mysql://***@h/db");
    }
}
