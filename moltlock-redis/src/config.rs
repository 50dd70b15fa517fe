//! Connection settings: a builder, `from_url`, and secrets kept out of `Debug`.

use std::fmt;
use std::time::Duration;

use moltlock_core::{parse_duration, Error};
use percent_encoding::percent_decode_str;

/// The key prefix used when none is configured.
pub const DEFAULT_PREFIX: &str = "moltlock:";
/// The connect timeout used when none is configured.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The per-command timeout used when none is configured.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// How long after a server start no free key is granted, unless configured.
pub const DEFAULT_RESTART_QUARANTINE: Duration = Duration::from_secs(30);

pub use moltlock_core::Secret;

/// How the backend talks to Redis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// One server (or a primary behind a proxy).
    Single,
    /// A Redis Cluster; the nodes given are seeds, the rest is discovered.
    Cluster,
}

/// PEM material for TLS connections (`rediss://`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// CA certificate(s) to trust instead of the system roots.
    pub ca_cert_pem: Option<Vec<u8>>,
    /// Client certificate and key for mutual TLS.
    pub client_cert_pem: Option<(Vec<u8>, Secret)>,
}

impl fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsFiles")
            .field("ca_cert", &self.ca_cert_pem.is_some())
            .field("client_cert", &self.client_cert_pem.is_some())
            .finish()
    }
}

/// Everything needed to open a [`RedisBackend`](crate::RedisBackend).
///
/// Make one with [`RedisConfig::new`] and its setters, or
/// [`RedisConfig::from_url`]. The
/// password is held as a [`Secret`] and never appears in `Debug` output.
///
/// With the `serde` feature it is `serde::Deserialize`, so a config file
/// can give it: `url` and the options of the URL's query by the same names
/// (durations written `"250ms"`, `"5s"`, `"2m"`; `node` a list of
/// `"host:port"` seeds), each optional. A field given beside a `url`
/// replaces the URL's parameter of that name (`node` adds to its seeds);
/// an unknown field is refused. In TOML:
///
/// ```toml
/// url = "redis+cluster://10.0.0.5:7000"
/// node = ["10.0.0.6:7000", "10.0.0.7:7000"]
/// key_prefix = "jobs:"
/// restart_quarantine = "60s"
/// ```
#[derive(Clone, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(try_from = "raw::Redis"))]
pub struct RedisConfig {
    pub(crate) mode: Mode,
    pub(crate) tls: bool,
    pub(crate) nodes: Vec<(String, u16)>,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<Secret>,
    pub(crate) database: i64,
    pub(crate) prefix: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) request_timeout: Duration,
    pub(crate) tls_files: TlsFiles,
    pub(crate) fence_retention: Option<Duration>,
    pub(crate) restart_quarantine: Option<Duration>,
    /// Whether a node was given (the first replaces the default).
    explicit_nodes: bool,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl RedisConfig {
    /// The defaults: `127.0.0.1:6379`, database 0, key prefix
    /// [`DEFAULT_PREFIX`], no TLS, single-server mode. Settings are checked
    /// when the backend connects.
    pub fn new() -> Self {
        Self {
            mode: Mode::Single,
            tls: false,
            nodes: vec![("127.0.0.1".into(), 6379)],
            username: None,
            password: None,
            database: 0,
            prefix: DEFAULT_PREFIX.into(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            tls_files: TlsFiles::default(),
            fence_retention: None,
            restart_quarantine: Some(DEFAULT_RESTART_QUARANTINE),
            explicit_nodes: false,
        }
    }

    /// Parses a URL:
    ///
    /// - `redis://[user[:password]@]host[:port][/db]` — one server;
    /// - `rediss://…` — the same over TLS (system roots unless a CA is set
    ///   through [`RedisConfig::tls_ca_cert_pem`]);
    /// - `redis+cluster://…` and `rediss+cluster://…` — a Redis Cluster seeded
    ///   by the host given and any `node=host:port` query parameters.
    ///
    /// Query parameters: `key_prefix`, `connect_timeout`, `request_timeout`,
    /// `fence_retention`, `restart_quarantine` (durations as
    /// [`parse_duration`] reads them: `250ms`, `5s`, `0s`), `node` (cluster
    /// seeds, repeatable).
    ///
    /// # Errors
    /// [`Error::Config`] for an unparsable URL, an unknown scheme or
    /// parameter, or a bad value.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        let cfg = Self::new().apply_url(url)?;
        cfg.check()?;
        Ok(cfg)
    }

    /// Adds a server address; the first call replaces the default
    /// `127.0.0.1:6379`. In cluster mode each address is a seed node.
    pub fn node(mut self, host: impl Into<String>, port: u16) -> Self {
        if !self.explicit_nodes {
            self.nodes.clear();
            self.explicit_nodes = true;
        }
        self.nodes.push((host.into(), port));
        self
    }

    /// Talks to a Redis Cluster (or to one server when `false`).
    pub fn cluster(mut self, on: bool) -> Self {
        self.mode = if on { Mode::Cluster } else { Mode::Single };
        self
    }

    /// Connects over TLS.
    pub fn tls(mut self, on: bool) -> Self {
        self.tls = on;
        self
    }

    /// Trusts this CA (PEM) for TLS instead of the system roots.
    pub fn tls_ca_cert_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_files.ca_cert_pem = Some(pem.into());
        self
    }

    /// Presents this client certificate and key (PEM) for mutual TLS.
    pub fn tls_client_cert_pem(mut self, cert: impl Into<Vec<u8>>, key: impl Into<String>) -> Self {
        self.tls_files.client_cert_pem = Some((cert.into(), Secret::new(key)));
        self
    }

    /// The ACL user name (Redis 6+).
    pub fn username(mut self, user: impl Into<String>) -> Self {
        self.username = Some(user.into());
        self
    }

    /// The password (of the ACL user, or `requirepass`).
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(Secret::new(password));
        self
    }

    /// The database number (single-server mode only; a cluster has only 0).
    pub fn database(mut self, db: i64) -> Self {
        self.database = db;
        self
    }

    /// The prefix of every key and channel this backend uses. It must not
    /// contain `{` or `}` (the backend places a hash tag after it).
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long to wait for a connection to be made.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long to wait for the answer to one request.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Lets a lock's fence key expire `retention` after its last hold was
    /// taken or renewed (at least the hold's TTL), instead of keeping it
    /// forever. Saves memory with many short-lived lock keys; after a fence
    /// key expired, fences rest on the server clock alone (see the crate's
    /// fencing notes).
    pub fn fence_retention(mut self, retention: Duration) -> Self {
        self.fence_retention = Some(retention);
        self
    }

    /// The restart quarantine (default 30 s; `Duration::ZERO` turns it
    /// off): for `quarantine` after a Redis server starts, it grants no
    /// free key. Set it to at least the longest TTL any client uses on these
    /// keys — your TTL.
    ///
    /// Why: Redis without persistence loses every key on a restart, and a
    /// lost lock key looks free. Without the quarantine a client can take
    /// the key at once while the old holder still believes it holds it,
    /// until its next renewal is refused (up to a third of the TTL later).
    /// With it, no one is granted a key until the old holder's deadline has
    /// passed, while its renewals are refused and its `lost()` fires.
    ///
    /// The cost: once per server start (per node on a Cluster) acquisitions
    /// wait until the server has been up for `quarantine`, including on a
    /// fresh server. Turn it off for a durable Redis (`appendonly yes`,
    /// `appendfsync always`), whose restarts keep holds.
    pub fn restart_quarantine(mut self, quarantine: Duration) -> Self {
        self.restart_quarantine = (!quarantine.is_zero()).then_some(quarantine);
        self
    }

    /// Whether this is a cluster configuration.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Takes every setting a URL gives (see [`RedisConfig::from_url`]).
    fn apply_url(mut self, url: &str) -> Result<Self, Error> {
        let parsed = url::Url::parse(url).map_err(|e| bad(format!("unparsable URL: {e}")))?;
        let (tls, cluster) = scheme(parsed.scheme())?;
        self = self.tls(tls).cluster(cluster);
        let host = parsed
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| bad("the URL has no host"))?;
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        self = self.node(host, parsed.port().unwrap_or(6379));
        self = self.url_credentials(&parsed)?;
        self = self.url_database(&parsed)?;
        for (name, value) in parsed.query_pairs() {
            self = self.url_param(&name, &value)?;
        }
        Ok(self)
    }

    fn url_credentials(mut self, parsed: &url::Url) -> Result<Self, Error> {
        if !parsed.username().is_empty() {
            self = self.username(decode(parsed.username())?);
        }
        if let Some(pw) = parsed.password() {
            self = self.password(decode(pw)?);
        }
        Ok(self)
    }

    fn url_database(self, parsed: &url::Url) -> Result<Self, Error> {
        let path = parsed.path().trim_matches('/');
        if path.is_empty() {
            return Ok(self);
        }
        let db = path
            .parse::<i64>()
            .map_err(|_| bad(format!("the database {path:?} is not a number")))?;
        Ok(self.database(db))
    }

    fn url_param(self, name: &str, value: &str) -> Result<Self, Error> {
        match name {
            "key_prefix" | "prefix" => Ok(self.key_prefix(value)),
            "connect_timeout" => Ok(self.connect_timeout(parse_duration(name, value)?)),
            "request_timeout" => Ok(self.request_timeout(parse_duration(name, value)?)),
            "fence_retention" => Ok(self.fence_retention(parse_duration(name, value)?)),
            "restart_quarantine" => Ok(self.restart_quarantine(parse_duration(name, value)?)),
            "node" => self.url_node(value),
            other => Err(bad(format!("unknown URL parameter {other:?}"))),
        }
    }

    /// Adds the seed node `host:port`.
    fn url_node(self, value: &str) -> Result<Self, Error> {
        let (host, port) = value
            .rsplit_once(':')
            .ok_or_else(|| bad(format!("node {value:?} is not host:port")))?;
        let port = port
            .parse()
            .map_err(|_| bad(format!("node {value:?} has a bad port")))?;
        Ok(self.node(host, port))
    }

    /// Checks the settings: [`Error::Config`] for a prefix with `{`, `}`
    /// or control characters, no nodes, a zero timeout or fence retention,
    /// a negative database, or a database other than 0 in cluster mode.
    pub(crate) fn check(&self) -> Result<(), Error> {
        let cfg = self;
        if cfg
            .prefix
            .chars()
            .any(|c| c == '{' || c == '}' || c.is_control())
        {
            return Err(bad(
                "the key prefix must not contain '{', '}' or control characters",
            ));
        }
        if cfg.nodes.is_empty() {
            return Err(bad("no Redis node given"));
        }
        let under_1ms = |d: Option<Duration>| d.is_some_and(|d| d.as_millis() == 0);
        if cfg.connect_timeout.is_zero()
            || cfg.request_timeout.is_zero()
            || under_1ms(cfg.fence_retention)
            || under_1ms(cfg.restart_quarantine)
        {
            return Err(bad(
                "timeouts and fence retention must be at least 1 ms; a restart quarantine \
                 at least 1 ms, or 0 for none",
            ));
        }
        if cfg.database < 0 || (cfg.mode == Mode::Cluster && cfg.database != 0) {
            return Err(bad("the database must be >= 0, and 0 in cluster mode"));
        }
        Ok(())
    }
}

/// The shape of [`RedisConfig`] in a config file: `url` and the URL's
/// query options by the same names, each optional.
#[cfg(feature = "serde")]
mod raw {
    use std::time::Duration;

    use moltlock_core::duration::deserialize_option as duration;
    use moltlock_core::Error;

    use super::RedisConfig;

    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct Redis {
        #[serde(default)]
        url: Option<String>,
        #[serde(default, alias = "prefix")]
        key_prefix: Option<String>,
        #[serde(default, deserialize_with = "duration")]
        connect_timeout: Option<Duration>,
        #[serde(default, deserialize_with = "duration")]
        request_timeout: Option<Duration>,
        #[serde(default, deserialize_with = "duration")]
        fence_retention: Option<Duration>,
        #[serde(default, deserialize_with = "duration")]
        restart_quarantine: Option<Duration>,
        #[serde(default)]
        node: Vec<String>,
    }

    impl TryFrom<Redis> for RedisConfig {
        type Error = Error;

        fn try_from(raw: Redis) -> Result<Self, Error> {
            let mut cfg = match &raw.url {
                Some(url) => RedisConfig::new().apply_url(url)?,
                None => RedisConfig::new(),
            };
            if let Some(prefix) = raw.key_prefix {
                cfg = cfg.key_prefix(prefix);
            }
            if let Some(timeout) = raw.connect_timeout {
                cfg = cfg.connect_timeout(timeout);
            }
            if let Some(timeout) = raw.request_timeout {
                cfg = cfg.request_timeout(timeout);
            }
            if let Some(retention) = raw.fence_retention {
                cfg = cfg.fence_retention(retention);
            }
            if let Some(quarantine) = raw.restart_quarantine {
                cfg = cfg.restart_quarantine(quarantine);
            }
            for node in &raw.node {
                cfg = cfg.url_node(node)?;
            }
            cfg.check()?;
            Ok(cfg)
        }
    }
}

fn bad(msg: impl Into<String>) -> Error {
    // A message may quote part of a URL: never let a password through.
    Error::Config(moltlock_core::redact(&msg.into()))
}

fn scheme(s: &str) -> Result<(bool, bool), Error> {
    match s {
        "redis" => Ok((false, false)),
        "rediss" => Ok((true, false)),
        "redis+cluster" => Ok((false, true)),
        "rediss+cluster" => Ok((true, true)),
        other => Err(bad(format!(
            "unknown scheme {other:?}; use redis, rediss, redis+cluster or rediss+cluster"
        ))),
    }
}

fn decode(s: &str) -> Result<String, Error> {
    percent_decode_str(s)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| bad("the URL's user or password is not UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_with_everything() -> Result<(), Error> {
        let cfg = RedisConfig::from_url(
            "rediss://locker:p%40ss@127.0.0.1:6390/3?key_prefix=app:&request_timeout=250ms",
        )?;
        assert!(cfg.tls);
        assert_eq!(cfg.nodes, vec![("127.0.0.1".to_string(), 6390)]);
        assert_eq!(cfg.username.as_deref(), Some("locker"));
        assert_eq!(cfg.password.as_ref().map(Secret::expose), Some("p@ss"));
        assert_eq!(cfg.database, 3);
        assert_eq!(cfg.prefix, "app:");
        assert_eq!(cfg.request_timeout, Duration::from_millis(250));
        let shown = format!("{cfg:?}");
        assert!(
            !shown.contains("p@ss") && !shown.contains("p%40ss"),
            "{shown}"
        );
        Ok(())
    }

    #[test]
    fn restart_quarantine_is_on_unless_turned_off() -> Result<(), Error> {
        assert_eq!(
            RedisConfig::from_url("redis://127.0.0.1")?.restart_quarantine,
            Some(DEFAULT_RESTART_QUARANTINE)
        );
        let off = RedisConfig::from_url("redis://127.0.0.1/?restart_quarantine=0s")?;
        assert_eq!(off.restart_quarantine, None);
        let cfg = RedisConfig::from_url("redis://127.0.0.1/?restart_quarantine=30s")?;
        assert_eq!(cfg.restart_quarantine, Some(Duration::from_secs(30)));
        let built = RedisConfig::new().restart_quarantine(Duration::from_secs(2));
        assert_eq!(built.restart_quarantine, Some(Duration::from_secs(2)));
        Ok(())
    }

    #[test]
    fn cluster_url_with_seeds() -> Result<(), Error> {
        let cfg = RedisConfig::from_url("redis+cluster://127.0.0.1:7000/?node=127.0.0.1:7001")?;
        assert_eq!(cfg.mode, Mode::Cluster);
        assert_eq!(cfg.nodes.len(), 2);
        Ok(())
    }

    #[cfg(feature = "serde")]
    #[test]
    fn settings_from_a_config_file() -> Result<(), serde_json::Error> {
        let cfg: RedisConfig = serde_json::from_str(
            r#"{"url": "redis+cluster://u:pw@127.0.0.1:7000?key_prefix=url:",
                "node": ["127.0.0.1:7001", "127.0.0.1:7002"], "key_prefix": "app:",
                "connect_timeout": "2s", "request_timeout": "250ms",
                "fence_retention": "10m", "restart_quarantine": "0s"}"#,
        )?;
        assert_eq!(cfg.mode, Mode::Cluster);
        assert_eq!(cfg.nodes.len(), 3);
        assert_eq!(cfg.password.as_ref().map(Secret::expose), Some("pw"));
        assert_eq!(cfg.prefix, "app:");
        assert_eq!(cfg.connect_timeout, Duration::from_secs(2));
        assert_eq!(cfg.request_timeout, Duration::from_millis(250));
        assert_eq!(cfg.fence_retention, Some(Duration::from_secs(600)));
        assert_eq!(cfg.restart_quarantine, None);
        // No URL: the defaults, the first node replacing 127.0.0.1:6379.
        let cfg: RedisConfig = serde_json::from_str(r#"{"node": ["10.0.0.5:6380"]}"#)?;
        assert_eq!(cfg.nodes, vec![("10.0.0.5".to_string(), 6380)]);
        assert_eq!(cfg.restart_quarantine, Some(DEFAULT_RESTART_QUARANTINE));
        for (json, says) in [
            (r#"{"request_timeout": "3"}"#, "\"3\" is not a duration"),
            (r#"{"request_timeout": "0s"}"#, "at least 1 ms"),
            (r#"{"key_prefix": "a{b"}"#, "key prefix"),
            (r#"{"node": ["nohost"]}"#, "not host:port"),
            (r#"{"url": "http://127.0.0.1"}"#, "unknown scheme"),
            (r#"{"prefx": "a:"}"#, "unknown field `prefx`"),
        ] {
            let err = match serde_json::from_str::<RedisConfig>(json) {
                Ok(cfg) => panic!("{json} gave {cfg:?}"),
                Err(e) => e.to_string(),
            };
            assert!(err.contains(says), "{json}: {err}");
        }
        Ok(())
    }

    #[test]
    fn bad_urls_are_config_errors() {
        for url in [
            "http://127.0.0.1",
            "redis://",
            "not a url",
            "redis://127.0.0.1/x",
            "redis://127.0.0.1/?nope=1",
            "redis://127.0.0.1/?key_prefix=a{b",
            "redis+cluster://127.0.0.1/2",
            "redis://127.0.0.1/?restart_quarantine=2",
            "redis://127.0.0.1/?request_timeout=0s",
        ] {
            assert!(
                matches!(RedisConfig::from_url(url), Err(Error::Config(_))),
                "{url}"
            );
        }
    }
}
