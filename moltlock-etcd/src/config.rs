//! Connection settings: endpoints, key prefix, session TTL, auth, TLS and
//! timeouts. Built with [`EtcdConfig::new`] and its setters or parsed by
//! [`EtcdConfig::from_url`] (in `url.rs`); checked when the backend
//! connects. Passwords and private keys never appear in `Debug` output.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use etcd_client::ConnectOptions;
use moltlock_core::{Error, Secret};

/// The default key prefix under which every lock lives.
pub const DEFAULT_PREFIX: &str = "/moltlock/";

/// etcd's own floor for lease TTLs with its default timing (heartbeat 100 ms,
/// election timeout 1 s): it answers a shorter grant with this TTL.
pub const MIN_SESSION_TTL: Duration = Duration::from_secs(2);

/// etcd's default `--max-txn-ops`: the most operations in one list
/// (compares, success or failure) of a Txn.
pub const DEFAULT_MAX_TXN_OPS: usize = 128;

/// PEM data, given inline or read from a file when connecting.
#[derive(Clone)]
pub enum Pem {
    /// PEM text held in memory.
    Inline(Vec<u8>),
    /// A PEM file read when the backend connects.
    File(PathBuf),
}

impl Pem {
    pub(crate) fn load(&self) -> Result<Vec<u8>, Error> {
        match self {
            Self::Inline(b) => Ok(b.clone()),
            Self::File(p) => std::fs::read(p)
                .map_err(|e| Error::Config(format!("etcd: cannot read {}: {e}", p.display()))),
        }
    }
}

impl fmt::Debug for Pem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Inline(b) => write!(f, "Pem(<{} bytes>)", b.len()),
            Self::File(p) => write!(f, "Pem({})", p.display()),
        }
    }
}

/// TLS settings: the CA that signed the server's certificate, and an
/// optional client certificate and key.
#[derive(Clone, Default)]
pub struct TlsSettings {
    pub(crate) ca: Option<Pem>,
    pub(crate) client: Option<(Pem, Pem)>,
    pub(crate) domain: Option<String>,
}

impl fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsSettings")
            .field("ca", &self.ca)
            .field("client_cert", &self.client.as_ref().map(|(c, _)| c))
            .field("client_key", &self.client.as_ref().map(|_| "<redacted>"))
            .field("domain", &self.domain)
            .finish()
    }
}

/// How to reach etcd and where to keep locks: `EtcdConfig::new(endpoints)`
/// or [`from_url`](Self::from_url), then setters that take and return the
/// configuration. `EtcdBackend::connect` checks it.
///
/// ```
/// use std::time::Duration;
/// use moltlock_etcd::EtcdConfig;
///
/// let config = EtcdConfig::new(["127.0.0.1:2379"])
///     .key_prefix("/jobs/locks")
///     .connect_timeout(Duration::from_secs(2))
///     .auth("app", "s3cret");
/// assert!(!format!("{config:?}").contains("s3cret"));
/// ```
///
/// With the `serde` feature it is `serde::Deserialize`, so a config file
/// can give it: `url` (or `endpoints`, a list of `host:port`), `key_prefix`
/// and the options of the URL's query by the same names (`session_ttl`,
/// `connect_timeout`, `request_timeout` written `"250ms"`, `"5s"`, `"2m"`;
/// `ca`, `cert`, `key` as PEM file paths; `domain`), plus `max_txn_ops`,
/// each optional. A field given beside a `url` replaces the URL's setting
/// of that name; an unknown field is refused. In TOML:
///
/// ```toml
/// endpoints = ["10.0.0.7:2379", "10.0.0.8:2379"]
/// key_prefix = "/jobs/locks"
/// request_timeout = "2s"
/// ca = "/etc/ssl/etcd-ca.pem"
/// ```
#[derive(Clone, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(try_from = "raw::Etcd"))]
pub struct EtcdConfig {
    pub(crate) endpoints: Vec<String>,
    pub(crate) key_prefix: String,
    pub(crate) session_ttl: Duration,
    pub(crate) user: Option<(String, Secret)>,
    pub(crate) tls: Option<TlsSettings>,
    pub(crate) connect_timeout: Duration,
    pub(crate) request_timeout: Duration,
    pub(crate) max_txn_ops: usize,
}

impl Default for EtcdConfig {
    /// No endpoints (enough for `EtcdBackend::from_client`, which does not
    /// dial) and every other setting at its default.
    fn default() -> Self {
        Self::new(Vec::<String>::new())
    }
}

impl EtcdConfig {
    /// A configuration with the given endpoints (`host:port`,
    /// `http://host:port` or `https://host:port`) and every other setting
    /// at its default.
    pub fn new<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> Self {
        Self {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            key_prefix: DEFAULT_PREFIX.to_owned(),
            session_ttl: MIN_SESSION_TTL,
            user: None,
            tls: None,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            max_txn_ops: DEFAULT_MAX_TXN_OPS,
        }
    }

    /// The prefix under which lock keys live (default `/moltlock/`); a
    /// trailing `/` is added when missing.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = normalize_prefix(prefix.into());
        self
    }

    /// The shortest lease to grant (default and floor: 2 s, etcd's own
    /// floor). Holds with shorter TTLs are refused as invalid.
    pub fn session_ttl(mut self, ttl: Duration) -> Self {
        self.session_ttl = ttl;
        self
    }

    /// Authenticate as `user` with `password`.
    pub fn auth(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((user.into(), Secret::new(password)));
        self
    }

    /// Use TLS, trusting the CA in this PEM file.
    pub fn tls_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.tls_mut().ca = Some(Pem::File(path.into()));
        self
    }

    /// Use TLS, trusting the CA in this PEM text.
    pub fn tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_mut().ca = Some(Pem::Inline(pem.into()));
        self
    }

    /// Present this client certificate and key (PEM files) to the server.
    pub fn tls_client_files(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.tls_mut().client = Some((Pem::File(cert.into()), Pem::File(key.into())));
        self
    }

    /// Present this client certificate and key (PEM text) to the server.
    pub fn tls_client_pem(mut self, cert: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> Self {
        self.tls_mut().client = Some((Pem::Inline(cert.into()), Pem::Inline(key.into())));
        self
    }

    /// Check the server certificate against this name instead of the
    /// endpoint's host.
    pub fn tls_domain(mut self, domain: impl Into<String>) -> Self {
        self.tls_mut().domain = Some(domain.into());
        self
    }

    /// Use TLS with the system's defaults and no client certificate.
    pub fn tls(mut self) -> Self {
        self.tls_mut();
        self
    }

    /// How long connecting may take (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long each request may take (default 5 s).
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The server's `--max-txn-ops` (default 128, etcd's default): the
    /// most operations per list of one Txn. Multi-key acquisitions take 3
    /// per key, so one Txn takes at most a third as many keys (and at most
    /// 42, the depth of nested answers the client decodes); longer lists
    /// fall back to one acquisition per key.
    pub fn max_txn_ops(mut self, ops: usize) -> Self {
        self.max_txn_ops = ops;
        self
    }

    /// The endpoints.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The user name, if auth is configured.
    pub fn user(&self) -> Option<&str> {
        self.user.as_ref().map(|(u, _)| u.as_str())
    }

    /// Whether TLS is configured.
    pub fn uses_tls(&self) -> bool {
        self.tls.is_some()
    }

    fn tls_mut(&mut self) -> &mut TlsSettings {
        self.tls.get_or_insert_with(TlsSettings::default)
    }

    /// Checks everything but the endpoints (all a backend over an existing
    /// client uses): a prefix without control characters, timeouts above
    /// zero, a session TTL from 2 s to [`MAX_TTL`](moltlock_core::MAX_TTL).
    pub(crate) fn validate_session(&self) -> Result<(), Error> {
        if self.key_prefix.chars().any(char::is_control) {
            return Err(Error::Config(
                "etcd: the key prefix contains a control character".into(),
            ));
        }
        if self.connect_timeout.is_zero() || self.request_timeout.is_zero() {
            return Err(Error::Config("etcd: timeouts must be above zero".into()));
        }
        if self.session_ttl < MIN_SESSION_TTL || self.session_ttl > moltlock_core::MAX_TTL {
            return Err(Error::Config(format!(
                "etcd: the session TTL must be between {MIN_SESSION_TTL:?} and {:?}",
                moltlock_core::MAX_TTL
            )));
        }
        Ok(())
    }

    /// Checks the settings and turns them into the client's options.
    pub(crate) fn connect_options(&self) -> Result<ConnectOptions, Error> {
        if self.endpoints.is_empty() || self.endpoints.iter().any(|e| e.trim().is_empty()) {
            return Err(Error::Config("etcd: no endpoints given".into()));
        }
        self.validate_session()?;
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(self.connect_timeout)
            .with_keep_alive(Duration::from_secs(2), self.connect_timeout)
            .with_require_leader(true);
        if let Some((user, pass)) = &self.user {
            opts = opts.with_user(user.clone(), pass.expose());
        }
        if let Some(tls) = &self.tls {
            let mut t = etcd_client::TlsOptions::new();
            if let Some(ca) = &tls.ca {
                t = t.ca_certificate(etcd_client::Certificate::from_pem(ca.load()?));
            }
            if let Some((cert, key)) = &tls.client {
                t = t.identity(etcd_client::Identity::from_pem(cert.load()?, key.load()?));
            }
            if let Some(d) = &tls.domain {
                t = t.domain_name(d.clone());
            }
            opts = opts.with_tls(t);
        }
        Ok(opts)
    }
}

/// The shape of [`EtcdConfig`] in a config file, checked by `TryFrom`.
#[cfg(feature = "serde")]
mod raw {
    use std::path::PathBuf;
    use std::time::Duration;

    use moltlock_core::duration::deserialize_option as duration;
    use moltlock_core::Error;

    use super::EtcdConfig;

    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct Etcd {
        #[serde(default)]
        url: Option<String>,
        #[serde(default)]
        endpoints: Option<Vec<String>>,
        #[serde(default)]
        key_prefix: Option<String>,
        #[serde(default, deserialize_with = "duration")]
        session_ttl: Option<Duration>,
        #[serde(default, deserialize_with = "duration")]
        connect_timeout: Option<Duration>,
        #[serde(default, deserialize_with = "duration")]
        request_timeout: Option<Duration>,
        #[serde(default)]
        ca: Option<PathBuf>,
        #[serde(default)]
        cert: Option<PathBuf>,
        #[serde(default)]
        key: Option<PathBuf>,
        #[serde(default)]
        domain: Option<String>,
        #[serde(default)]
        max_txn_ops: Option<usize>,
    }

    impl TryFrom<Etcd> for EtcdConfig {
        type Error = Error;

        fn try_from(raw: Etcd) -> Result<Self, Error> {
            let mut cfg = match (&raw.url, raw.endpoints) {
                (Some(_), Some(_)) => {
                    return Err(Error::Config(
                        "etcd: give either url or endpoints, not both".into(),
                    ))
                }
                (Some(url), None) => EtcdConfig::from_url(url)?,
                (None, Some(endpoints)) => EtcdConfig::new(endpoints),
                (None, None) => EtcdConfig::default(),
            };
            if let Some(prefix) = raw.key_prefix {
                cfg = cfg.key_prefix(prefix);
            }
            if let Some(ttl) = raw.session_ttl {
                cfg = cfg.session_ttl(ttl);
            }
            if let Some(timeout) = raw.connect_timeout {
                cfg = cfg.connect_timeout(timeout);
            }
            if let Some(timeout) = raw.request_timeout {
                cfg = cfg.request_timeout(timeout);
            }
            if let Some(ca) = raw.ca {
                cfg = cfg.tls_ca_file(ca);
            }
            match (raw.cert, raw.key) {
                (Some(cert), Some(key)) => cfg = cfg.tls_client_files(cert, key),
                (None, None) => {}
                _ => {
                    return Err(Error::Config(
                        "etcd: cert and key must be given together".into(),
                    ))
                }
            }
            if let Some(domain) = raw.domain {
                cfg = cfg.tls_domain(domain);
            }
            if let Some(ops) = raw.max_txn_ops {
                cfg = cfg.max_txn_ops(ops);
            }
            if cfg.endpoints.iter().any(|e| e.trim().is_empty()) {
                return Err(Error::Config("etcd: an endpoint is empty".into()));
            }
            cfg.validate_session()?;
            Ok(cfg)
        }
    }
}

/// Adds a trailing `/` to a prefix that lacks one.
pub(crate) fn normalize_prefix(mut prefix: String) -> String {
    if !prefix.ends_with('/') {
        prefix.push('/');
    }
    prefix
}

#[cfg(all(test, feature = "serde"))]
mod tests {
    use super::*;

    #[test]
    fn settings_from_a_config_file() -> Result<(), serde_json::Error> {
        let cfg: EtcdConfig = serde_json::from_str(
            r#"{"url": "etcd://u:pw@127.0.0.1:2379,127.0.0.1:22379/from_url?request_timeout=9s",
                "key_prefix": "/jobs", "session_ttl": "10s", "connect_timeout": "250ms",
                "max_txn_ops": 64}"#,
        )?;
        assert_eq!(cfg.endpoints(), ["127.0.0.1:2379", "127.0.0.1:22379"]);
        assert_eq!(cfg.user(), Some("u"));
        assert_eq!(cfg.key_prefix, "/jobs/");
        assert_eq!(cfg.session_ttl, Duration::from_secs(10));
        assert_eq!(cfg.connect_timeout, Duration::from_millis(250));
        assert_eq!(cfg.request_timeout, Duration::from_secs(9));
        assert_eq!(cfg.max_txn_ops, 64);
        assert!(!cfg.uses_tls());
        let cfg: EtcdConfig = serde_json::from_str(
            r#"{"endpoints": ["10.0.0.7:2379"], "ca": "/ca.pem", "cert": "/c.pem",
                "key": "/k.pem", "domain": "etcd.internal"}"#,
        )?;
        assert_eq!(cfg.endpoints(), ["10.0.0.7:2379"]);
        assert!(cfg.uses_tls());
        assert_eq!(cfg.key_prefix, DEFAULT_PREFIX);
        let cfg: EtcdConfig = serde_json::from_str("{}")?;
        assert!(cfg.endpoints().is_empty());
        for (json, says) in [
            (r#"{"session_ttl": "10"}"#, "\"10\" is not a duration"),
            (r#"{"session_ttl": "1s"}"#, "session TTL"),
            (r#"{"url": "etcd://h:1", "endpoints": ["h:1"]}"#, "not both"),
            (r#"{"cert": "/c.pem"}"#, "cert and key"),
            (r#"{"endpoints": [" "]}"#, "endpoint is empty"),
            (r#"{"url": "etcd://host"}"#, "host:port"),
            (r#"{"prefix": "/x"}"#, "unknown field `prefix`"),
        ] {
            let err = match serde_json::from_str::<EtcdConfig>(json) {
                Ok(cfg) => panic!("{json} gave {cfg:?}"),
                Err(e) => e.to_string(),
            };
            assert!(err.contains(says), "{json}: {err}");
        }
        Ok(())
    }
}
