//! Connection settings: endpoints, key prefix, session TTL, auth, TLS and
//! timeouts. Built with [`EtcdConfig::builder`] or parsed by
//! [`EtcdConfig::from_url`]. Passwords and private keys never appear in
//! `Debug` output.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use moltlock_core::Error;

/// The default key prefix under which every lock lives.
pub const DEFAULT_PREFIX: &str = "/moltlock/";

/// etcd's own floor for lease TTLs with its default timing (heartbeat 100 ms,
/// election timeout 1 s): it answers a shorter grant with this TTL.
pub const MIN_SESSION_TTL: Duration = Duration::from_secs(2);

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

/// How to reach etcd and where to keep locks.
#[derive(Clone)]
pub struct EtcdConfig {
    pub(crate) endpoints: Vec<String>,
    pub(crate) prefix: String,
    pub(crate) session_ttl: Duration,
    pub(crate) user: Option<(String, String)>,
    pub(crate) tls: Option<TlsSettings>,
    pub(crate) dial_timeout: Duration,
    pub(crate) request_timeout: Duration,
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("session_ttl", &self.session_ttl)
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .field("password", &self.user.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls)
            .field("dial_timeout", &self.dial_timeout)
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

impl EtcdConfig {
    /// A builder with the given endpoints (`host:port`, `http://host:port` or
    /// `https://host:port`).
    pub fn builder<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> EtcdConfigBuilder {
        EtcdConfigBuilder {
            cfg: Self {
                endpoints: endpoints.into_iter().map(Into::into).collect(),
                prefix: DEFAULT_PREFIX.to_owned(),
                session_ttl: MIN_SESSION_TTL,
                user: None,
                tls: None,
                dial_timeout: Duration::from_secs(5),
                request_timeout: Duration::from_secs(5),
            },
        }
    }

    /// Parses `etcd://[user:password@]host:port[,host:port…][/prefix][?options]`
    /// (or `etcds://` for TLS). Options: `ca`, `cert`, `key` (PEM file paths),
    /// `domain` (the name to check the server certificate against),
    /// `session_ttl`, `dial_timeout`, `request_timeout` (whole seconds or
    /// with an `ms` suffix). User and password may be percent-encoded.
    ///
    /// # Errors
    /// [`Error::Config`] when the URL does not have this shape.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        crate::url::parse(url)
    }

    /// The endpoints.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The key prefix (always ending in `/`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The shortest lease this backend grants.
    pub fn session_ttl(&self) -> Duration {
        self.session_ttl
    }

    /// The user name, if auth is configured.
    pub fn user(&self) -> Option<&str> {
        self.user.as_ref().map(|(u, _)| u.as_str())
    }

    /// Whether TLS is configured.
    pub fn uses_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The timeout for connecting.
    pub fn dial_timeout(&self) -> Duration {
        self.dial_timeout
    }

    /// The timeout of every unary request.
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    pub(crate) fn validate(&self) -> Result<(), Error> {
        if self.endpoints.is_empty() || self.endpoints.iter().any(|e| e.trim().is_empty()) {
            return Err(Error::Config("etcd: no endpoints given".into()));
        }
        if self.prefix.chars().any(char::is_control) {
            return Err(Error::Config(
                "etcd: the key prefix contains a control character".into(),
            ));
        }
        if self.dial_timeout.is_zero() || self.request_timeout.is_zero() {
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
}

/// Builds an [`EtcdConfig`].
#[derive(Clone, Debug)]
pub struct EtcdConfigBuilder {
    cfg: EtcdConfig,
}

impl EtcdConfigBuilder {
    /// The prefix under which lock keys live (default `/moltlock/`); a
    /// trailing `/` is added when missing.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.cfg.prefix = normalize_prefix(prefix.into());
        self
    }

    /// The shortest lease to grant (default and floor: 2 s, etcd's own
    /// floor). Holds with shorter TTLs are refused as invalid.
    pub fn session_ttl(mut self, ttl: Duration) -> Self {
        self.cfg.session_ttl = ttl;
        self
    }

    /// Authenticate as `user` with `password`.
    pub fn auth(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.cfg.user = Some((user.into(), password.into()));
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
    pub fn dial_timeout(mut self, timeout: Duration) -> Self {
        self.cfg.dial_timeout = timeout;
        self
    }

    /// How long each request may take (default 5 s).
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.cfg.request_timeout = timeout;
        self
    }

    /// Checks the settings and returns the configuration.
    ///
    /// # Errors
    /// [`Error::Config`] for no endpoints, a prefix with control characters,
    /// zero timeouts, or a session TTL below 2 s.
    pub fn build(self) -> Result<EtcdConfig, Error> {
        self.cfg.validate()?;
        Ok(self.cfg)
    }

    fn tls_mut(&mut self) -> &mut TlsSettings {
        self.cfg.tls.get_or_insert_with(TlsSettings::default)
    }
}

/// Adds a trailing `/` to a non-empty prefix that lacks one.
pub(crate) fn normalize_prefix(mut prefix: String) -> String {
    if !prefix.ends_with('/') {
        prefix.push('/');
    }
    prefix
}
