//! Parsing of `etcd://` and `etcds://` URLs.

use std::time::Duration;

use moltlock_core::Error;

use crate::config::{normalize_prefix, EtcdConfig, EtcdConfigBuilder};

fn bad(url: &str, why: &str) -> Error {
    // Never echo the URL itself: it may carry a password (even a malformed
    // one such as `etcd:user:pw@host`, which has no `://`).
    let scheme = url.split(':').next().unwrap_or("");
    Error::Config(moltlock_core::redact(&format!(
        "etcd: bad URL (scheme {scheme:?}): {why}"
    )))
}

/// Parses a URL as documented on [`EtcdConfig::from_url`].
pub(crate) fn parse(url: &str) -> Result<EtcdConfig, Error> {
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
    let mut b = EtcdConfig::builder(endpoints);
    if !path.is_empty() && path != "/" {
        b = b.prefix(normalize_prefix(percent_decode(path)?));
    }
    if let Some(info) = userinfo {
        let (user, pass) = info
            .split_once(':')
            .ok_or_else(|| bad(url, "user info must be user:password"))?;
        b = b.auth(percent_decode(user)?, percent_decode(pass)?);
    }
    if tls {
        b = b.tls();
    }
    if let Some(q) = query {
        b = apply_query(url, b, q)?;
    }
    b.build()
}

fn apply_query(
    url: &str,
    mut b: EtcdConfigBuilder,
    query: &str,
) -> Result<EtcdConfigBuilder, Error> {
    let mut cert = None;
    let mut key = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| bad(url, "query options must be name=value"))?;
        let v = percent_decode(v)?;
        b = match k {
            "ca" => b.tls_ca_file(v),
            "cert" => {
                cert = Some(v);
                b
            }
            "key" => {
                key = Some(v);
                b
            }
            "domain" => b.tls_domain(v),
            "session_ttl" => b.session_ttl(duration(url, &v)?),
            "dial_timeout" => b.dial_timeout(duration(url, &v)?),
            "request_timeout" => b.request_timeout(duration(url, &v)?),
            _ => return Err(bad(url, &format!("unknown option {k:?}"))),
        };
    }
    match (cert, key) {
        (Some(c), Some(k)) => Ok(b.tls_client_files(c, k)),
        (None, None) => Ok(b),
        _ => Err(bad(url, "cert and key must be given together")),
    }
}

fn duration(url: &str, v: &str) -> Result<Duration, Error> {
    let parsed = match v.strip_suffix("ms") {
        Some(ms) => ms.parse().ok().map(Duration::from_millis),
        None => v
            .strip_suffix('s')
            .unwrap_or(v)
            .parse()
            .ok()
            .map(Duration::from_secs),
    };
    parsed.ok_or_else(|| bad(url, &format!("{v:?} is not a duration (e.g. 5s or 500ms)")))
}

fn valid_host_port(e: &str) -> bool {
    match e.rsplit_once(':') {
        Some((host, port)) => !host.is_empty() && port.parse::<u16>().is_ok(),
        None => false,
    }
}

fn percent_decode(s: &str) -> Result<String, Error> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| Error::Config("etcd: bad percent-encoding in URL".into()))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| Error::Config("etcd: URL is not UTF-8 once decoded".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_tls_urls() -> Result<(), Error> {
        let c = parse("etcd://127.0.0.1:2379,127.0.0.1:22379/locks")?;
        assert_eq!(c.endpoints(), ["127.0.0.1:2379", "127.0.0.1:22379"]);
        assert_eq!(c.prefix(), "/locks/");
        assert!(!c.uses_tls());
        let c = parse("etcds://root:p%40ss@localhost:2379?ca=/tmp/ca.pem&cert=/c&key=/k")?;
        assert!(c.uses_tls());
        assert_eq!(c.user(), Some("root"));
        assert_eq!(c.prefix(), "/moltlock/");
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("p@ss"),
            "the password leaked into Debug: {shown}"
        );
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
        ] {
            match parse(url) {
                Err(Error::Config(m)) => assert!(!m.contains("secret"), "{m}"),
                other => panic!("{url}: expected a config error, got {other:?}"),
            }
        }
    }
}
