//! Where a lock lives in Redis.
//!
//! A lock key `k` is stored at `<prefix>{<esc(k)>}` (value: the holder's
//! token, with a PX expiry), its fence at `<prefix>{<esc(k)>}:fence` (no
//! expiry unless a fence retention is set), and its release channel is
//! named like the lock key. `esc`
//! replaces `%` with `%25` and `}` with `%7D`, so the braces always enclose a
//! non-empty hash tag: both keys of one lock hash to the same Cluster slot.

use moltlock_core::LockKey;

/// The key layout of one backend (its prefix).
#[derive(Clone, Debug)]
pub(crate) struct Layout {
    prefix: String,
}

impl Layout {
    pub(crate) fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
        }
    }

    /// The key holding the owner token.
    pub(crate) fn lock(&self, key: &LockKey) -> String {
        format!("{}{{{}}}", self.prefix, escape(key.as_str()))
    }

    /// The key holding the last fence handed out.
    pub(crate) fn fence(&self, key: &LockKey) -> String {
        format!("{}:fence", self.lock(key))
    }

    /// The key holding the holder's description (same hash tag).
    pub(crate) fn info(&self, key: &LockKey) -> String {
        format!("{}:info", self.lock(key))
    }

    /// The pub/sub channel a release is announced on (channel names are a
    /// namespace apart from keys).
    pub(crate) fn channel(&self, key: &LockKey) -> String {
        self.lock(key)
    }

    /// The PSUBSCRIBE pattern matching every release channel.
    pub(crate) fn channel_pattern(&self) -> String {
        format!("{}{{*", glob_escape(&self.prefix))
    }

    /// The SCAN pattern for lock keys whose caller key starts with `prefix`.
    pub(crate) fn scan_pattern(&self, prefix: &str) -> String {
        format!(
            "{}{{{}*",
            glob_escape(&self.prefix),
            glob_escape(&escape(prefix))
        )
    }

    /// The caller's key of a stored lock key, or `None` for other keys
    /// (fence and quarantine keys, foreign keys).
    pub(crate) fn caller_key(&self, stored: &str) -> Option<String> {
        let inner = stored
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix('{')?
            .strip_suffix('}')?;
        if inner.contains('}') {
            return None;
        }
        unescape(inner)
    }
}

fn escape(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for c in key.chars() {
        match c {
            '%' => out.push_str("%25"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
    out
}

fn unescape(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        let code = rest.get(i + 1..i + 3)?;
        out.push(match code {
            "25" => '%',
            "7D" => '}',
            _ => return None,
        });
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Some(out)
}

fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_hash_tag() -> Result<(), moltlock_core::Error> {
        let l = Layout::new("moltlock:");
        for k in ["jobs/a", "}x", "a}b{c", "100%", "ключ*?[", "%7D"] {
            let key = LockKey::new(k)?;
            let stored = l.lock(&key);
            assert_eq!(l.caller_key(&stored).as_deref(), Some(k), "{stored}");
            assert_eq!(l.caller_key(&l.fence(&key)), None);
            assert_eq!(l.caller_key(&l.info(&key)), None);
            let tag = &stored["moltlock:{".len()..stored.len() - 1];
            assert!(!tag.is_empty() && !tag.contains('}'));
        }
        assert_eq!(l.scan_pattern("a*"), "moltlock:{a\\**");
        assert_eq!(l.channel_pattern(), "moltlock:{*");
        Ok(())
    }
}
