//! Parsing of `etcd://` and `etcds://` URLs.

use moltlock_core::{parse_duration, Error};
use percent_encoding::percent_decode_str;

use crate::config::EtcdConfig;

fn bad(url: &str, why: &str) -> Error {
    // Never echo the URL itself: it may carry a password (even a malformed
    // one such as `etcd:user:pw@host`, which has no `://`).
    let scheme = url.split(':').next().unwrap_or("");
    Error::Config(moltlock_core::redact(&format!(
        "etcd: bad URL (scheme {scheme:?}): {why}"
    )))
}

impl EtcdConfig {
    /// Parses `etcd://[user:password@]host:port[,host:port…][/key_prefix][?options]`
    /// (or `etcds://` for TLS). Options: `ca`, `cert`, `key` (PEM file paths),
    /// `domain` (the name to check the server certificate against),
    /// `session_ttl`, `connect_timeout`, `request_timeout` (durations as
    /// [`parse_duration`](moltlock_core::parse_duration) reads them: `5s`,
    /// `500ms`, `2m`). User, password, prefix and option values may be
    /// percent-encoded.
    ///
    /// # Errors
    /// [`Error::Config`] when the URL does not have this shape.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        parse(url)
    }
}

/// Parses a URL as documented on [`EtcdConfig::from_url`].
fn parse(url: &str) -> Result<EtcdConfig, Error> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| bad(url, "expected etcd:// or etcds://"))?;
    let tls = match scheme {
        "etcd" => false,
        "etcds" => true,
        _ => return Err(bad(url, "the scheme must be etcd or etcds")),
    };
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let endpoints: Vec<String> = hosts.split(',').map(str::to_owned).collect();
    if endpoints.iter().any(|e| !valid_host_port(e)) {
        return Err(bad(url, "every endpoint must be host:port"));
    }
    let mut cfg = EtcdConfig::new(endpoints);
    if !path.is_empty() && path != "/" {
        cfg = cfg.key_prefix(decode(url, path)?);
    }
    if let Some(info) = userinfo {
        let (user, pass) = info
            .split_once(':')
            .ok_or_else(|| bad(url, "user info must be user:password"))?;
        cfg = cfg.auth(decode(url, user)?, decode(url, pass)?);
    }
    if tls {
        cfg = cfg.tls();
    }
    match query {
        Some(q) => apply_query(url, cfg, q),
        None => Ok(cfg),
    }
}

fn apply_query(url: &str, mut cfg: EtcdConfig, query: &str) -> Result<EtcdConfig, Error> {
    let mut cert = None;
    let mut key = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| bad(url, "query options must be name=value"))?;
        let v = decode(url, v)?;
        cfg = match k {
            "ca" => cfg.tls_ca_file(v),
            "cert" => {
                cert = Some(v);
                cfg
            }
            "key" => {
                key = Some(v);
                cfg
            }
            "domain" => cfg.tls_domain(v),
            "session_ttl" => cfg.session_ttl(parse_duration(k, &v)?),
            "connect_timeout" => cfg.connect_timeout(parse_duration(k, &v)?),
            "request_timeout" => cfg.request_timeout(parse_duration(k, &v)?),
            _ => return Err(bad(url, &format!("unknown option {k:?}"))),
        };
    }
    match (cert, key) {
        (Some(c), Some(k)) => Ok(cfg.tls_client_files(c, k)),
        (None, None) => Ok(cfg),
        _ => Err(bad(url, "cert and key must be given together")),
    }
}

fn valid_host_port(e: &str) -> bool {
    match e.rsplit_once(':') {
        Some((host, port)) => !host.is_empty() && port.parse::<u16>().is_ok(),
        None => false,
    }
}

/// `s` percent-decoded. A `%` must start an escape (`%40`): one that does
/// not is refused rather than kept, so a mistyped password fails here and
/// not as an authentication error later.
fn decode(url: &str, s: &str) -> Result<String, Error> {
    let is_escape = |h: &str| {
        h.get(..2)
            .is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
    };
    if !s.split('%').skip(1).all(is_escape) {
        return Err(bad(url, "bad percent-encoding"));
    }
    percent_decode_str(s)
        .decode_utf8()
        .map(|d| d.into_owned())
        .map_err(|_| bad(url, "not UTF-8 once percent-decoded"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn parses_plain_and_tls_urls() -> Result<(), Error> {
        let c = parse("etcd://127.0.0.1:2379,127.0.0.1:22379/locks")?;
        assert_eq!(c.endpoints(), ["127.0.0.1:2379", "127.0.0.1:22379"]);
        assert_eq!(c.key_prefix, "/locks/");
        assert!(!c.uses_tls());
        let c = parse("etcds://root:p%40ss@localhost:2379?ca=/tmp/ca.pem&cert=/c&key=/k")?;
        assert!(c.uses_tls());
        assert_eq!(c.user(), Some("root"));
        assert_eq!(c.key_prefix, "/moltlock/");
        assert_eq!(c.user.as_ref().map(|(_, p)| p.expose()), Some("p@ss"));
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("p@ss"),
            "the password leaked into Debug: {shown}"
        );
        Ok(())
    }

    #[test]
    fn durations_and_prefixes() -> Result<(), Error> {
        let c = parse("etcd://h:1/a%20b?connect_timeout=250ms&request_timeout=2s&session_ttl=1m")?;
        assert_eq!(c.key_prefix, "/a b/");
        assert_eq!(c.connect_timeout, Duration::from_millis(250));
        assert_eq!(c.request_timeout, Duration::from_secs(2));
        assert_eq!(c.session_ttl, Duration::from_secs(60));
        Ok(())
    }

    #[test]
    fn rejects_bad_urls_without_echoing_secrets() {
        for url in [
            "redis://x:1",
            "etcd://",
            "etcd://host",
            "etcd://host:notaport",
            "etcd://u:secret@h:1?cert=/only",
            "etcd://h:1?bogus=1",
            "etcd://h:1?session_ttl=abc",
            "etcd://h:1?connect_timeout=5",
            "etcd://u:p%zz@h:1",
            "etcd://u:p%4@h:1",
        ] {
            match parse(url) {
                Err(Error::Config(m)) => assert!(!m.contains("secret"), "{m}"),
                other => panic!("{url}: expected a config error, got {other:?}"),
            }
        }
    }
}
