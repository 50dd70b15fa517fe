//! What `moltlock run` holds while the command runs: one key, a slot of a
//! semaphore or of a read-write lock's readers, a write lock, or several
//! keys. One type, so supervision is the same for every kind.

use std::time::Duration;

use moltlock::{Error, LockGuard, LockKey, LostReason, MultiGuard, SlotGuard, WriteGuard};

/// A hold of any kind, with what the command is told about it.
pub enum Hold {
    /// One key (a plain run).
    One(LockGuard),
    /// A semaphore's permit (`--permits`).
    Permit(SlotGuard),
    /// A shared hold of a read-write lock (`--shared`).
    Read(SlotGuard),
    /// The exclusive hold of a read-write lock (`--exclusive`).
    Write(WriteGuard),
    /// Several keys at once (`--key` given more than once).
    All(MultiGuard),
}

impl Hold {
    /// Time left before the earliest local validity deadline; `None` once
    /// any part of the hold is not held.
    pub fn valid_for(&self) -> Option<Duration> {
        match self {
            Self::One(g) => g.valid_for(),
            Self::Permit(g) | Self::Read(g) => g.valid_for(),
            Self::Write(g) => g.valid_for(),
            Self::All(g) => g.valid_for(),
        }
    }

    /// Whether every part of the hold is still valid in this process's view.
    pub fn is_held(&self) -> bool {
        match self {
            Self::One(g) => g.is_held(),
            Self::Permit(g) | Self::Read(g) => g.is_held(),
            Self::Write(g) => g.is_held(),
            Self::All(g) => g.is_held(),
        }
    }

    /// Resolves when the first part of the hold is lost: its store key and why.
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    pub async fn lost(&self) -> (LockKey, LostReason) {
        match self {
            Self::One(g) => (g.key().clone(), g.lost().await),
            Self::Permit(g) | Self::Read(g) => (g.key().clone(), g.lost().await),
            Self::Write(g) => g.lost().await,
            Self::All(g) => g.lost().await,
        }
    }

    /// Resolves once someone asked the holder of a plain key to release it
    /// (`moltlock revoke --ask`); never for the other kinds of hold.
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    pub async fn release_requested(&self) {
        match self {
            Self::One(g) => g.release_requested().await,
            _ => std::future::pending().await,
        }
    }

    /// Why the hold ended, once it has (a deadline passed without a
    /// confirmed renewal, when nothing else is known).
    pub fn lost_reason(&self) -> LostReason {
        let checked = match self {
            Self::One(g) => g.check().map(drop),
            Self::Permit(g) | Self::Read(g) => g.check().map(drop),
            Self::Write(g) => g.check().map(drop),
            Self::All(g) => g.check().map(drop),
        };
        match checked {
            Err(Error::Lost { reason, .. }) => reason,
            _ => LostReason::Deadline,
        }
    }

    /// The fence to report when the hold is acquired: the key's, the
    /// slot's, the writer's, or every key's.
    pub fn fence_text(&self) -> String {
        match self {
            Self::One(g) => g.fence().to_string(),
            Self::Permit(g) | Self::Read(g) => format!("{}, slot {}", g.fence(), g.slot()),
            Self::Write(g) => g.fence().to_string(),
            Self::All(g) => fence_list(g),
        }
    }

    /// The command's environment for the hold (see `moltlock run --help`).
    pub fn env(&self, name: &str) -> Vec<(String, String)> {
        let pair = |k: &str, v: String| (k.to_owned(), v);
        match self {
            Self::One(g) => vec![
                pair("MOLTLOCK_KEY", g.key().to_string()),
                pair("MOLTLOCK_FENCE", g.fence().to_string()),
            ],
            Self::Permit(g) => slot_env(name, g, None),
            Self::Read(g) => slot_env(name, g, Some("shared")),
            Self::Write(g) => vec![
                pair("MOLTLOCK_KEY", name.to_owned()),
                pair("MOLTLOCK_FENCE", g.fence().to_string()),
                pair("MOLTLOCK_MODE", "exclusive".to_owned()),
            ],
            Self::All(g) => multi_env(g),
        }
    }

    /// Gives every part of the hold back.
    ///
    /// # Errors
    /// The first failure ([`Error::NotHeld`] for a part that had ended).
    pub async fn release(self) -> Result<(), Error> {
        match self {
            Self::One(g) => g.release().await,
            Self::Permit(g) | Self::Read(g) => g.release().await,
            Self::Write(g) => g.release().await,
            Self::All(g) => g.release().await,
        }
    }
}

/// `key=fence` for every key of a multi-lock, in key order.
fn fence_list(g: &MultiGuard) -> String {
    g.fences()
        .iter()
        .map(|(k, f)| format!("{k}={f}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn slot_env(name: &str, g: &SlotGuard, mode: Option<&str>) -> Vec<(String, String)> {
    let mut env = vec![
        ("MOLTLOCK_KEY".to_owned(), name.to_owned()),
        ("MOLTLOCK_FENCE".to_owned(), g.fence().to_string()),
        ("MOLTLOCK_SLOT".to_owned(), g.slot().to_string()),
    ];
    if let Some(mode) = mode {
        env.push(("MOLTLOCK_MODE".to_owned(), mode.to_owned()));
    }
    env
}

/// `MOLTLOCK_KEYS` (how many), `MOLTLOCK_KEY_<i>` and `MOLTLOCK_FENCE_<i>`
/// for each key in bytewise order: a key may hold any character but a
/// control character, so one variable per key needs no quoting.
fn multi_env(g: &MultiGuard) -> Vec<(String, String)> {
    let fences = g.fences();
    let mut env = vec![("MOLTLOCK_KEYS".to_owned(), fences.len().to_string())];
    for (i, (k, f)) in fences.iter().enumerate() {
        env.push((format!("MOLTLOCK_KEY_{i}"), k.to_string()));
        env.push((format!("MOLTLOCK_FENCE_{i}"), f.to_string()));
    }
    env
}
