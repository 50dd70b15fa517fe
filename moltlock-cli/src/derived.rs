//! Reading the store keys MoltLock derives from a primitive's name
//! (`name#~s<i>` for a semaphore's slots, `name#~w` and `name#~r<i>` for
//! a read-write lock's writer key and reader slots).

use std::fmt;

use moltlock::RESERVED_MARK;

/// What a derived key is to its primitive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Slot `i` of a semaphore.
    Permit(u32),
    /// Reader slot `i` of a read-write lock.
    Reader(u32),
    /// The writer key of a read-write lock.
    Writer,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Permit(i) => write!(f, "permit {i}"),
            Self::Reader(i) => write!(f, "reader {i}"),
            Self::Writer => f.write_str("writer"),
        }
    }
}

/// The primitive's name and the key's role, for a key MoltLock derived;
/// `None` for a caller's key or a suffix it does not know.
pub fn role(key: &str) -> Option<(&str, Role)> {
    let at = key.find(RESERVED_MARK)?;
    let (name, suffix) = (&key[..at], &key[at + RESERVED_MARK.len()..]);
    let slot = |rest: &str| -> Option<u32> {
        let digits = !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit());
        digits.then(|| rest.parse().ok()).flatten()
    };
    let role = match suffix.split_at_checked(1)? {
        ("w", "") => Role::Writer,
        ("s", rest) => Role::Permit(slot(rest)?),
        ("r", rest) => Role::Reader(slot(rest)?),
        _ => return None,
    };
    Some((name, role))
}

/// The prefix of a primitive's slot keys: `name#~s` or `name#~r`.
pub fn slot_prefix(name: &str, kind: char) -> String {
    format!("{name}{RESERVED_MARK}{kind}")
}

/// A read-write lock's writer key.
pub fn writer_key(name: &str) -> String {
    format!("{name}{RESERVED_MARK}w")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_are_read_back() {
        assert_eq!(role("jobs/a#~s3"), Some(("jobs/a", Role::Permit(3))));
        assert_eq!(role("db#~r0"), Some(("db", Role::Reader(0))));
        assert_eq!(role("db#~w"), Some(("db", Role::Writer)));
        for other in [
            "plain", "db#~", "db#~x1", "db#~s", "db#~s-1", "db#~wx", "db#~r1a",
        ] {
            assert_eq!(role(other), None, "{other}");
        }
        assert_eq!(Role::Permit(2).to_string(), "permit 2");
        assert_eq!(slot_prefix("db", 'r'), "db#~r");
        assert_eq!(writer_key("db"), "db#~w");
    }
}
