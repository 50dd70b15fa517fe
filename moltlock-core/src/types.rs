//! Validated inputs: lock keys, owner tokens, fencing tokens and TTL limits.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::Error;

/// Longest key, in bytes, that core accepts. Backends may declare a lower limit
/// through [`Limits::max_key_len`](crate::Limits::max_key_len).
pub const MAX_KEY_LEN: usize = 256;

/// The sequence that marks the keys MoltLock derives from a name (a
/// semaphore's slots, a read-write lock's parts): `name#~s3`. The manager
/// refuses keys that contain it, so a derived key never names a caller's
/// own lock.
pub const RESERVED_MARK: &str = "#~";

/// Bytes a primitive's name leaves for the suffixes of its derived keys:
/// a semaphore's name is at most the backend's key limit less this.
pub const DERIVED_ROOM: usize = 16;

/// Longest holder description, in bytes (see
/// [`Describe::describe`](crate::Describe::describe)).
pub const MAX_DESCRIPTION_LEN: usize = 256;

/// Checks a holder description: at most [`MAX_DESCRIPTION_LEN`] bytes, no
/// control characters.
///
/// # Errors
/// [`Error::Config`] saying what is wrong.
pub fn check_description(text: &str) -> Result<(), Error> {
    if text.len() > MAX_DESCRIPTION_LEN {
        return Err(Error::Config(format!(
            "the holder description is {} bytes; the limit is {MAX_DESCRIPTION_LEN}",
            text.len()
        )));
    }
    if let Some(c) = text.chars().find(|c| c.is_control()) {
        return Err(Error::Config(format!(
            "the holder description contains the control character {c:?}"
        )));
    }
    Ok(())
}

/// Shortest TTL core accepts. Backends may declare a higher floor through
/// [`Limits::min_ttl`](crate::Limits::min_ttl).
pub const MIN_TTL: Duration = Duration::from_millis(10);

/// Longest TTL core accepts (one week). Longer holds should renew instead.
pub const MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// The name of a lock: 1 to [`MAX_KEY_LEN`] bytes of UTF-8 without control
/// characters (so no NUL, newline or escape sequences reach a store or a log).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockKey(String);

impl LockKey {
    /// Validates `key` and wraps it.
    ///
    /// # Errors
    /// [`Error::InvalidKey`] when the key is empty, longer than [`MAX_KEY_LEN`]
    /// bytes, or contains a control character.
    pub fn new(key: impl Into<String>) -> Result<Self, Error> {
        let key = key.into();
        check_key(&key, MAX_KEY_LEN)?;
        Ok(Self(key))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// For a key MoltLock derived from a name ([`RESERVED_MARK`]): the name
    /// and the suffix after the mark. Backends that keep a primitive's keys
    /// together (Redis Cluster hash tags) use the name.
    pub fn derived_parts(&self) -> Option<(&str, &str)> {
        let at = self.0.find(RESERVED_MARK)?;
        Some((&self.0[..at], &self.0[at + RESERVED_MARK.len()..]))
    }

    /// The key `self` + [`RESERVED_MARK`] + `suffix`.
    pub(crate) fn derive(&self, suffix: &str) -> LockKey {
        LockKey(format!("{}{RESERVED_MARK}{suffix}", self.0))
    }

    /// Refuses keys that hold [`RESERVED_MARK`]: a caller's key must not
    /// spell a derived one.
    pub(crate) fn check_not_reserved(&self) -> Result<(), Error> {
        if self.0.contains(RESERVED_MARK) {
            let reason = format!("the key contains {RESERVED_MARK:?}, which MoltLock reserves for the keys of semaphores and read-write locks");
            return Err(Error::invalid_key(&self.0, reason));
        }
        Ok(())
    }

    /// Checks the key against a backend's own length limit.
    ///
    /// # Errors
    /// [`Error::InvalidKey`] when the key is longer than `max_len` bytes.
    pub fn check_len(&self, max_len: usize) -> Result<(), Error> {
        check_key(&self.0, max_len)
    }
}

fn check_key(key: &str, max_len: usize) -> Result<(), Error> {
    if key.is_empty() {
        return Err(Error::invalid_key(key, "the key is empty"));
    }
    if key.len() > max_len {
        let reason = format!("the key is {} bytes; the limit is {max_len}", key.len());
        return Err(Error::invalid_key(key, reason));
    }
    if let Some(c) = key.chars().find(|c| c.is_control()) {
        let reason = format!("the key contains the control character {:?}", c);
        return Err(Error::invalid_key(key, reason));
    }
    Ok(())
}

impl fmt::Display for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LockKey({:?})", self.0)
    }
}

impl FromStr for LockKey {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Self::new(s)
    }
}

impl TryFrom<&str> for LockKey {
    type Error = Error;
    fn try_from(s: &str) -> Result<Self, Error> {
        Self::new(s)
    }
}

impl TryFrom<String> for LockKey {
    type Error = Error;
    fn try_from(s: String) -> Result<Self, Error> {
        Self::new(s)
    }
}

impl TryFrom<&LockKey> for LockKey {
    type Error = Error;
    fn try_from(k: &LockKey) -> Result<Self, Error> {
        Ok(k.clone())
    }
}

/// The owner of a hold: a random UUID v4 made for each acquisition.
///
/// Knowing a token is what lets a caller renew or release a hold, so tokens
/// are unguessable and `Debug` shows only their first eight characters.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Token(String);

impl Token {
    /// A fresh random token (UUID v4, 122 random bits).
    pub fn random() -> Self {
        Self(uuid::Uuid::new_v4().hyphenated().to_string())
    }

    /// Wraps a holder value read back from a store (which may have been
    /// written by another tool and need not be a UUID).
    pub fn from_stored(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The token as stored.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let short: String = self.0.chars().take(8).collect();
        write!(f, "Token({short}…)")
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A fencing token: strictly greater for every new acquisition of a key.
///
/// Pass it with every write to the guarded resource; a resource that keeps the
/// highest fence it has seen can refuse writes from a stale holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fence(pub u64);

impl Fence {
    /// The fence as a number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Checks a TTL against core's limits and a backend's floor.
///
/// # Errors
/// [`Error::InvalidTtl`] when `ttl` is below `min` (or [`MIN_TTL`]) or above [`MAX_TTL`].
pub fn check_ttl(ttl: Duration, min: Duration) -> Result<(), Error> {
    let min = min.max(MIN_TTL);
    if ttl < min {
        return Err(Error::InvalidTtl {
            ttl,
            reason: format!("the shortest TTL this backend accepts is {min:?}"),
        });
    }
    if ttl > MAX_TTL {
        return Err(Error::InvalidTtl {
            ttl,
            reason: format!("the longest TTL is {MAX_TTL:?}; renew instead"),
        });
    }
    Ok(())
}
