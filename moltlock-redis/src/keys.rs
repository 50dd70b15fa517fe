//! Where a lock lives in Redis.
//!
//! A lock key `k` is stored at `<prefix>{<esc(k)>}` (value: the holder's
//! token, with a PX expiry). A key MoltLock derived from a name
//! (`name#~suffix`, see [`LockKey::derived_parts`]) is stored at
//! `<prefix>{<esc(name)>}<esc_rest(#~suffix)>`, so every key of one
//! semaphore or read-write lock shares the hash tag of its name, and so one
//! Cluster slot. The fence of a lock key is at `<lock key>:fence` (no expiry
//! unless a fence retention is set), its description at `<lock key>:info`,
//! a waiter's mark at `<lock key>:wait`, the instances waiting for
//! its next turn at `<lock key>:turns` and the turn's reservation at
//! `<lock key>:next`, its fair queue at `<lock key>:queue` and
//! `<lock key>:alive`, and its release channel is named like the lock key.
//!
//! `esc` replaces `%` with `%25` and `}` with `%7D`, so the braces always
//! enclose a non-empty hash tag; `esc_rest` also replaces `:` with `%3A`,
//! so no lock key ends like a fence or description key.

use moltlock_core::{LockKey, RESERVED_MARK};

/// The suffix of a lock's fence key.
pub(crate) const FENCE: &str = ":fence";
/// The suffix of a lock's description key.
pub(crate) const INFO: &str = ":info";
/// The suffix of a lock's waiter mark.
pub(crate) const WAIT: &str = ":wait";

/// The key layout of one backend (its prefix).
#[derive(Clone, Debug)]
pub(crate) struct Layout {
    prefix: String,
}

/// The part of `key` inside the hash tag and the part after it: for a
/// derived key (split as [`LockKey::derived_parts`] splits it) with a
/// non-empty name, the name and `#~suffix`; else the whole key and `""`
/// (an empty name would leave an empty hash tag, which Redis ignores).
fn split(key: &str) -> (&str, &str) {
    match key.find(RESERVED_MARK) {
        Some(at) if at > 0 => key.split_at(at),
        _ => (key, ""),
    }
}

impl Layout {
    pub(crate) fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
        }
    }

    /// The hash tag of `key`'s stored keys (without braces): keys with
    /// equal tags live in one Cluster slot.
    pub(crate) fn tag(&self, key: &LockKey) -> String {
        escape(split(key.as_str()).0, false)
    }

    /// The key holding the owner token.
    pub(crate) fn lock(&self, key: &LockKey) -> String {
        let (tagged, rest) = split(key.as_str());
        let mut out = String::with_capacity(self.prefix.len() + key.as_str().len() + 16);
        out.push_str(&self.prefix);
        out.push('{');
        escape_into(&mut out, tagged, false);
        out.push('}');
        escape_into(&mut out, rest, true);
        out
    }

    /// The key of the stored lock key `lock` with `suffix` (same hash tag).
    pub(crate) fn beside(lock: &str, suffix: &str) -> String {
        let mut out = String::with_capacity(lock.len() + suffix.len());
        out.push_str(lock);
        out.push_str(suffix);
        out
    }

    /// The key holding the last fence handed out.
    pub(crate) fn fence(&self, key: &LockKey) -> String {
        Self::beside(&self.lock(key), FENCE)
    }

    /// The key holding the holder's description (same hash tag).
    pub(crate) fn info(&self, key: &LockKey) -> String {
        Self::beside(&self.lock(key), INFO)
    }

    /// The key marking that a waiter waits for the lock's release (same
    /// hash tag): a release publishes only while it exists.
    pub(crate) fn wait(&self, key: &LockKey) -> String {
        Self::beside(&self.lock(key), WAIT)
    }

    /// For the stored lock key `lock`: the instances waiting for its next
    /// turn (a set) and the instance the current turn is reserved for,
    /// same hash tag (see the `ACQUIRE` script).
    pub(crate) fn turns(lock: &str) -> (String, String) {
        (Self::beside(lock, ":turns"), Self::beside(lock, ":next"))
    }

    /// The fair queue's places (a sorted set: token by arrival) and their
    /// liveness (token by the deadline of its place), same hash tag.
    pub(crate) fn queue(&self, key: &LockKey) -> (String, String) {
        let lock = self.lock(key);
        (Self::queue_of(&lock), format!("{lock}:alive"))
    }

    /// The fair queue's places of the stored lock key `lock`.
    pub(crate) fn queue_of(lock: &str) -> String {
        Self::beside(lock, ":queue")
    }

    /// The pub/sub channel a release is announced on (channel names are a
    /// namespace apart from keys).
    pub(crate) fn channel(&self, key: &LockKey) -> String {
        Self::channel_of(&self.lock(key)).to_owned()
    }

    /// The release channel of the stored lock key `lock`.
    pub(crate) fn channel_of(lock: &str) -> &str {
        lock
    }

    /// The PSUBSCRIBE pattern matching every release channel.
    pub(crate) fn channel_pattern(&self) -> String {
        format!("{}{{*", glob_escape(&self.prefix))
    }

    /// A SCAN pattern matching every lock key whose caller key starts with
    /// `prefix` (and some other keys: callers filter by
    /// [`Layout::caller_key`] and the prefix).
    pub(crate) fn scan_pattern(&self, prefix: &str) -> String {
        let (tagged, rest) = split(prefix);
        let stored = if rest.is_empty() {
            // A derived key `name#~…` starts with a prefix `name#` but is
            // stored as `{name}#~…`: match from the name on.
            let head = prefix.strip_suffix('#').unwrap_or(prefix);
            format!("{{{}", escape(head, false))
        } else {
            format!("{{{}}}{}", escape(tagged, false), escape(rest, true))
        };
        format!("{}{}*", glob_escape(&self.prefix), glob_escape(&stored))
    }

    /// The caller's key of a stored lock key, or `None` for other keys
    /// (fence, description and foreign keys): exactly the inverse of
    /// [`Layout::lock`].
    pub(crate) fn caller_key(&self, stored: &str) -> Option<String> {
        let inner = stored
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix('{')?;
        let (tagged, rest) = inner.split_once('}')?;
        let key = unescape(tagged)? + &unescape(rest)?;
        let key = LockKey::new(key).ok()?;
        (self.lock(&key) == stored).then(|| key.as_str().to_owned())
    }
}

fn escape(key: &str, colon: bool) -> String {
    let mut out = String::with_capacity(key.len());
    escape_into(&mut out, key, colon);
    out
}

/// Appends `key` to `out`, escaped as [`escape`] escapes it.
fn escape_into(out: &mut String, key: &str, colon: bool) {
    let special = |c: char| c == '%' || c == '}' || (colon && c == ':');
    if !key.contains(special) {
        out.push_str(key);
        return;
    }
    for c in key.chars() {
        match c {
            '%' => out.push_str("%25"),
            '}' => out.push_str("%7D"),
            ':' if colon => out.push_str("%3A"),
            c => out.push(c),
        }
    }
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
            "3A" => ':',
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

    /// The hash tag Redis Cluster reads from a stored key: between the
    /// first `{` and the first `}` after it.
    fn redis_tag(stored: &str) -> &str {
        let open = stored.find('{').map_or(0, |i| i + 1);
        let len = stored[open..].find('}').unwrap_or(0);
        &stored[open..open + len]
    }

    const KEYS: [&str; 13] = [
        "jobs/a",
        "}x",
        "a}b{c",
        "100%",
        "ключ*?[",
        "%7D",
        "jobs#~s3",
        "a}b#~r0",
        "n#~s1:fence",
        "n#~s1:info",
        "#~x",
        "a#~b#~c",
        "x#~%3A}{",
    ];

    #[test]
    fn round_trip_and_hash_tag() -> Result<(), moltlock_core::Error> {
        let l = Layout::new("moltlock:");
        let mut seen = std::collections::HashSet::new();
        for k in KEYS {
            let key = LockKey::new(k)?;
            let stored = l.lock(&key);
            assert_eq!(l.caller_key(&stored).as_deref(), Some(k), "{stored}");
            for other in [l.fence(&key), l.info(&key)] {
                assert_eq!(l.caller_key(&other), None, "{other}");
                assert_eq!(redis_tag(&other), redis_tag(&stored));
                assert!(seen.insert(other));
            }
            assert!(seen.insert(stored.clone()), "{stored} stored twice");
            let tag = redis_tag(&stored);
            assert!(!tag.is_empty() && !tag.contains('}'));
            assert_eq!(tag, l.tag(&key));
            if let Some((name, _)) = key.derived_parts().filter(|(n, _)| !n.is_empty()) {
                assert_eq!(unescape(tag).as_deref(), Some(name));
            }
        }
        assert_eq!(l.caller_key("moltlock:{jobs}"), Some("jobs".to_owned()));
        assert_eq!(l.caller_key("moltlock:{jobs#~s3}"), None);
        assert_eq!(l.caller_key("other:{jobs}"), None);
        Ok(())
    }

    #[test]
    fn derived_keys_share_their_name_tag() -> Result<(), moltlock_core::Error> {
        let l = Layout::new("p:");
        let name = LockKey::new("jobs/x")?;
        for suffix in ["s0", "s1", "w", "r0"] {
            let key = LockKey::new(format!("jobs/x#~{suffix}"))?;
            assert_eq!(l.tag(&key), l.tag(&name));
            assert_eq!(redis_tag(&l.lock(&key)), "jobs/x");
            assert_eq!(l.lock(&key), format!("p:{{jobs/x}}#~{suffix}"));
        }
        assert_ne!(l.tag(&LockKey::new("jobs/y#~s0")?), l.tag(&name));
        Ok(())
    }

    #[test]
    fn scan_patterns() {
        let l = Layout::new("moltlock:");
        assert_eq!(l.scan_pattern("a*"), "moltlock:{a\\**");
        assert_eq!(l.scan_pattern("jobs#"), "moltlock:{jobs*");
        assert_eq!(l.scan_pattern("jobs#~s"), "moltlock:{jobs}#~s*");
        assert_eq!(l.scan_pattern(""), "moltlock:{*");
        assert_eq!(l.channel_pattern(), "moltlock:{*");
    }
}
