//! Secrets kept out of messages: one redaction for every URL parser and
//! error path.
//!
//! [`redact`] works on any text, not only on well-formed URLs, because the
//! URLs people mistype are the ones that end up in error messages:
//! `postgres//app:pw@db/x` (no colon), `etcd:u:pw@h:2379` (no slashes), or a
//! server echoing `u:pw@h/x` back as a database name. It hides
//!
//! - the user information before the last `@` of every word (a word ends at
//!   white space, a quote or `<`/`>`), keeping a leading scheme such as
//!   `postgres://`, `etcd:` or `redis//`: `postgres://app:pw@db/x` becomes
//!   `postgres://***@db/x`;
//! - the value of every password-like `name=value` parameter (the name holds
//!   `pass`, `pwd`, `secret`, `token`, `credential`, `apikey` or `api_key`,
//!   any case) that starts a word or follows `?`, `&` or `;`:
//!   `?password=pw` becomes `?password=***`.
//!
//! It may hide more than a secret (an e-mail address's local part, say),
//! never less of the forms above.

use std::fmt;

/// A password (or key) that never shows in `Debug` or `Display` output,
/// logs or errors. Every backend's configuration keeps its secrets in one.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself; use it only to hand it to the client library.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(MASK)
    }
}

/// The mask put where a secret was.
const MASK: &str = "***";

/// Parameter names (lower case) whose values are secrets when they appear
/// anywhere in the name.
const SECRET_NAMES: [&str; 7] = [
    "pass",
    "pwd",
    "secret",
    "token",
    "credential",
    "apikey",
    "api_key",
];

/// `text` with the user information before the last `@` of every word and
/// the values of password-like `name=value` parameters hidden (the rules are
/// in the docs of this crate's `redact` source). Never fails, never panics.
///
/// ```
/// use moltlock_core::redact;
/// assert_eq!(redact("postgres://app:pw@db/x"), "postgres://***@db/x");
/// assert_eq!(redact("etcd:u:pw@h:2379"), "etcd:***@h:2379");
/// assert_eq!(redact("mongodb://h/db?password=pw&x=1"), "mongodb://h/db?password=***&x=1");
/// assert_eq!(redact("sqlite:///tmp/locks.db"), "sqlite:///tmp/locks.db");
/// ```
pub fn redact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        let start = rest.find(|c: char| !is_boundary(c)).unwrap_or(rest.len());
        out.push_str(&rest[..start]);
        rest = &rest[start..];
        let end = rest.find(is_boundary).unwrap_or(rest.len());
        redact_word(&rest[..end], &mut out);
        rest = &rest[end..];
    }
    out
}

/// Word boundaries: white space, quotes and angle brackets.
fn is_boundary(c: char) -> bool {
    c.is_whitespace() || matches!(c, '"' | '\'' | '`' | '<' | '>')
}

/// Appends `word` to `out` with its user information and secret
/// parameters masked.
fn redact_word(word: &str, out: &mut String) {
    let tail = match word.rfind('@') {
        Some(at) => {
            let before = &word[..at];
            let keep = scheme_len(before);
            out.push_str(&before[..keep]);
            if keep < before.len() {
                out.push_str(MASK);
            }
            &word[at..]
        }
        None => word,
    };
    mask_params(tail, out);
}

/// The length of a leading scheme-like part to keep before user
/// information: `letters[letters digits + . -]*` then an optional `:` and
/// any `/`s (or, without a scheme, only leading `/`s). Without a `:` or `/`
/// after it, the letters are the user name itself and nothing is kept.
fn scheme_len(s: &str) -> usize {
    let bytes = s.as_bytes();
    let mut i = 0;
    if bytes.first().is_some_and(u8::is_ascii_alphabetic) {
        i = 1;
        while bytes
            .get(i)
            .is_some_and(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'.' | b'-'))
        {
            i += 1;
        }
        let name_end = i;
        if bytes.get(i) == Some(&b':') {
            i += 1;
        }
        while bytes.get(i) == Some(&b'/') {
            i += 1;
        }
        if i == name_end {
            // A bare name (`user@host`): no secret in it, keep it whole.
            return s.len();
        }
    } else {
        while bytes.get(i) == Some(&b'/') {
            i += 1;
        }
    }
    i
}

/// Appends `s` with the values of secret `name=value` parameters masked;
/// parameters are separated by `?`, `&` and `;`.
fn mask_params(s: &str, out: &mut String) {
    let mut rest = s;
    while !rest.is_empty() {
        let end = rest.find(['?', '&', ';']).unwrap_or(rest.len());
        let param = &rest[..end];
        match param.split_once('=') {
            Some((name, value)) if !value.is_empty() && is_secret_name(last_segment(name)) => {
                out.push_str(name);
                out.push('=');
                out.push_str(MASK);
            }
            _ => out.push_str(param),
        }
        // The separator itself, if any (all are one byte).
        out.push_str(rest.get(end..(end + 1).min(rest.len())).unwrap_or(""));
        rest = rest.get(end + 1..).unwrap_or("");
    }
}

/// The parameter name in `name`: what follows the last character that
/// cannot be part of one (so `x/db?password` and `password` both give
/// `password`).
fn last_segment(name: &str) -> &str {
    name.rsplit(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
        .next()
        .unwrap_or(name)
}

fn is_secret_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    !lower.is_empty() && SECRET_NAMES.iter().any(|s| lower.contains(s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{redact_error, Error};

    #[test]
    fn malformed_urls_lose_their_passwords() {
        let cases = [
            ("postgres://app:PW@db/x", "postgres://***@db/x"),
            ("postgres//app:PW@db/x", "postgres//***@db/x"),
            ("redis//:PW@h", "redis//***@h"),
            ("redis://:PW@h:6379/0", "redis://***@h:6379/0"),
            ("mongodb://h/db?password=PW", "mongodb://h/db?password=***"),
            ("etcd:u:PW@h:2379", "etcd:***@h:2379"),
            ("etcd:/u:PW@h:2379/p", "etcd:/***@h:2379/p"),
            ("postgres:/u:PW@h/x", "postgres:/***@h/x"),
            ("mysql:/u:PW@h/x", "mysql:/***@h/x"),
            ("mysql://u:p@ss@h/x", "mysql://***@h/x"),
            ("postgres://u:p/w,x@h/x", "postgres://***@h/x"),
            (
                "database \"u:PW@h/x\" does not exist",
                "database \"u:***@h/x\" does not exist",
            ),
            (
                "host=db password=PW user=app",
                "host=db password=*** user=app",
            ),
            (
                "x://h/?a=1&sslpassword=PW;Token=PW&b=2",
                "x://h/?a=1&sslpassword=***;Token=***&b=2",
            ),
            ("URL 'etcd:u:PW@h'.", "URL 'etcd:***@h'."),
        ];
        for (input, want) in cases {
            let got = redact(input);
            assert_eq!(got, want, "{input}");
            assert!(!got.contains("PW"), "{input} -> {got}");
        }
    }

    #[test]
    fn harmless_text_is_kept() {
        for s in [
            "sqlite:///tmp/x.db",
            "sqlite://./moltlock.db",
            "redis://127.0.0.1:6379/",
            "etcds://a:1,b:2/p?ca=/x/ca.pem&key=/x/k.pem",
            "no locks held",
            "",
            "user@host",
            "é @ ü",
        ] {
            assert_eq!(redact(s), s);
        }
    }

    #[test]
    fn errors_are_redacted() {
        let e = redact_error(Error::Config("bad postgres//a:PW@h".into()));
        assert!(!e.to_string().contains("PW"), "{e}");
        let e = redact_error(Error::store("postgres", "database \"a:PW@h\"", false));
        assert!(!e.to_string().contains("PW"), "{e}");
    }
}
