//! Key layout: where a lock, its fence offset, its description and its
//! fair-queue entries live under the backend's key prefix.
//!
//! Every name is `<prefix><lock key>` plus a mark. Lock keys never contain
//! control characters, so no lock key can name another key's fence offset,
//! description or queue entry.

use moltlock_core::{LockKey, Token};

/// Marks queue entries: `<prefix><key>` + this + `<token>`.
const QUEUE_MARK: &str = "\u{0}queue/";
/// Marks the key holding a lock's fence offset (no lease: it outlives every
/// hold).
const OFFSET_MARK: &str = "\u{0}fence";
/// Marks the key holding a hold's description, on the hold's own lease.
const INFO_MARK: &str = "\u{0}info";

/// What a key read back from under the prefix is.
pub(crate) enum Stored<'a> {
    /// A lock key (the lock key's name, without the prefix).
    Lock(&'a str),
    /// The fence offset of the named lock key.
    Offset(&'a str),
    /// The description of the named lock key's hold.
    Info(&'a str),
    /// A fair-queue entry, or anything else that is not a lock key.
    Other,
}

/// The names of one backend's keys.
pub(crate) struct Keys {
    prefix: String,
}

impl Keys {
    pub(crate) fn new(prefix: String) -> Self {
        Self { prefix }
    }

    /// The prefix every key of this backend starts with.
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    fn marked(&self, key: &LockKey, mark: &str) -> Vec<u8> {
        format!("{}{}{mark}", self.prefix, key.as_str()).into_bytes()
    }

    /// The lock key itself.
    pub(crate) fn lock(&self, key: &LockKey) -> Vec<u8> {
        self.marked(key, "")
    }

    /// Where `raise_fence` keeps the key's fence offset.
    pub(crate) fn offset(&self, key: &LockKey) -> Vec<u8> {
        self.marked(key, OFFSET_MARK)
    }

    /// The key holding the description of `key`'s hold.
    pub(crate) fn info(&self, key: &LockKey) -> Vec<u8> {
        self.marked(key, INFO_MARK)
    }

    /// The prefix of `key`'s fair-queue entries.
    pub(crate) fn queue(&self, key: &LockKey) -> Vec<u8> {
        self.marked(key, QUEUE_MARK)
    }

    /// The fair-queue entry of `token` waiting for `key`.
    pub(crate) fn queue_entry(&self, key: &LockKey, token: &Token) -> Vec<u8> {
        let mut entry = self.queue(key);
        entry.extend_from_slice(token.as_str().as_bytes());
        entry
    }

    /// The range `list(prefix)` reads: every key of the lock keys starting
    /// with `prefix`, their offsets, descriptions and queue entries included.
    pub(crate) fn range(&self, prefix: &str) -> String {
        format!("{}{prefix}", self.prefix)
    }

    /// What `name`, read from [`range`](Self::range), is; `None` when it is
    /// not under this backend's prefix.
    pub(crate) fn classify<'a>(&self, name: &'a str) -> Option<Stored<'a>> {
        let key = name.strip_prefix(&self.prefix)?;
        Some(if let Some(held) = key.strip_suffix(INFO_MARK) {
            Stored::Info(held)
        } else if let Some(held) = key.strip_suffix(OFFSET_MARK) {
            Stored::Offset(held)
        } else if key.contains('\0') {
            Stored::Other
        } else {
            Stored::Lock(key)
        })
    }
}
