//! The one error type of MoltLock.

use std::fmt;
use std::time::Duration;

use crate::redact::redact;

/// Why a held lock stopped being held.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// A renewal reached the store and the store said the key is no longer
    /// ours (it expired, was deleted, or another owner holds it).
    Refused,
    /// No renewal was confirmed before the local validity deadline.
    Deadline,
    /// The backend's session (for example an etcd lease) ended.
    Session(String),
    /// Its owner released the hold: what a [`LostToken`](crate::LostToken)
    /// (or a scoped lock's handle) reports once its guard is gone.
    Released,
    /// The job's [`LockOptions::at_most`](crate::LockOptions::at_most)
    /// time passed: renewal stopped.
    AtMost,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Refused => f.write_str("the store refused a renewal (the key is no longer ours)"),
            Self::Deadline => f.write_str("no renewal was confirmed before the validity deadline"),
            Self::Session(why) => write!(f, "the backend session ended: {why}"),
            Self::Released => f.write_str("the owner released the lock"),
            Self::AtMost => f.write_str("the job's at-most time passed"),
        }
    }
}

/// A client library's error, kept as the source of an [`Error`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Every failure MoltLock reports. [`Error::is_retryable`] tells transient
/// store trouble (worth another try) from permanent mistakes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock key was rejected before reaching the store.
    #[error("invalid lock key {key:?}: {reason}")]
    InvalidKey {
        /// The start of the offending key (at most 64 characters).
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The TTL was rejected before reaching the store.
    #[error("invalid TTL {ttl:?}: {reason}")]
    InvalidTtl {
        /// The TTL given.
        ttl: Duration,
        /// What is wrong with it.
        reason: String,
    },
    /// A configuration value (URL, table name, option) is not valid.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Waiting for the lock took longer than the caller allowed.
    #[error("timed out after {waited:?} waiting for lock {key:?}")]
    Timeout {
        /// The key waited for.
        key: String,
        /// How long the caller waited.
        waited: Duration,
    },
    /// The store could not be reached or did not answer in time. Retryable.
    #[error("{backend}: store unavailable: {message}")]
    Unavailable {
        /// The backend's name.
        backend: &'static str,
        /// What the client library said, secrets redacted.
        message: String,
        /// The client library's own error, where there was one.
        #[source]
        source: Option<BoxError>,
    },
    /// The store refused our credentials or permissions. Permanent.
    #[error("{backend}: authentication or permission failure: {message}")]
    Auth {
        /// The backend's name.
        backend: &'static str,
        /// What the store said, secrets redacted.
        message: String,
        /// The client library's own error, where there was one.
        #[source]
        source: Option<BoxError>,
    },
    /// The store answered with an error.
    #[error("{backend}: store error: {message}")]
    Store {
        /// The backend's name.
        backend: &'static str,
        /// What the store said, secrets redacted.
        message: String,
        /// Whether trying again may succeed.
        retryable: bool,
        /// The client library's own error, where there was one.
        #[source]
        source: Option<BoxError>,
    },
    /// The backend does not offer this optional operation.
    #[error("{backend}: {what} is not supported by this backend")]
    Unsupported {
        /// The backend's name.
        backend: &'static str,
        /// The operation asked for.
        what: &'static str,
    },
    /// A release or renewal found that the key is not held by this owner.
    #[error("lock {key:?} is not held by this owner")]
    NotHeld {
        /// The key.
        key: String,
    },
    /// A semaphore (or a read-write lock's readers) is used elsewhere with
    /// more permits than this client allows: a slot at or past this
    /// client's count is held. Clients must agree on the count.
    #[error("semaphore {key:?} allows {permits} permits here, but slot {seen} is held elsewhere: every client must use the same count")]
    LimitMismatch {
        /// The semaphore's name.
        key: String,
        /// This client's count.
        permits: u32,
        /// The held slot past it.
        seen: u32,
    },
    /// The lock was lost while held.
    #[error("lock {key:?} was lost: {reason}")]
    Lost {
        /// The key.
        key: String,
        /// Why it was lost.
        reason: LostReason,
    },
}

impl Error {
    /// Whether trying the same operation again may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Unavailable { .. } => true,
            Self::Store { retryable, .. } => *retryable,
            _ => false,
        }
    }

    /// An [`Error::InvalidKey`] that quotes at most 64 characters of the key.
    pub fn invalid_key(key: &str, reason: impl Into<String>) -> Self {
        Self::InvalidKey {
            key: key.chars().take(64).collect(),
            reason: reason.into(),
        }
    }

    /// A retryable [`Error::Unavailable`]; the message is redacted.
    pub fn unavailable(backend: &'static str, message: impl fmt::Display) -> Self {
        Self::Unavailable {
            backend,
            message: redact(&message.to_string()),
            source: None,
        }
    }

    /// An [`Error::Store`] with the given retryability; the message is
    /// redacted.
    pub fn store(backend: &'static str, message: impl fmt::Display, retryable: bool) -> Self {
        Self::Store {
            backend,
            message: redact(&message.to_string()),
            retryable,
            source: None,
        }
    }

    /// A permanent [`Error::Auth`]; the message is redacted.
    pub fn auth(backend: &'static str, message: impl fmt::Display) -> Self {
        Self::Auth {
            backend,
            message: redact(&message.to_string()),
            source: None,
        }
    }

    /// The same error with `cause` (the client library's error) as its
    /// [`source`](std::error::Error::source), so callers can downcast to
    /// it. Only `Unavailable`, `Auth` and `Store` keep a source; other
    /// variants are returned unchanged. The message shown stays the
    /// redacted one; the source is the client's error as it is.
    pub fn with_source(mut self, cause: impl Into<BoxError>) -> Self {
        if let Self::Unavailable { source, .. }
        | Self::Auth { source, .. }
        | Self::Store { source, .. } = &mut self
        {
            *source = Some(cause.into());
        }
        self
    }

    /// An [`Error::Config`] with the message redacted.
    pub fn config(message: impl fmt::Display) -> Self {
        Self::Config(redact(&message.to_string()))
    }

    /// An [`Error::Unsupported`]: `backend` has no `what`.
    pub fn unsupported(backend: &'static str, what: &'static str) -> Self {
        Self::Unsupported { backend, what }
    }
}

/// An [`Error`] whose messages went through [`redact`](crate::redact); for errors that may
/// quote a URL or a store's echo of one.
pub fn redact_error(mut error: Error) -> Error {
    if let Error::Config(message)
    | Error::Unavailable { message, .. }
    | Error::Auth { message, .. }
    | Error::Store { message, .. } = &mut error
    {
        *message = redact(message);
    }
    error
}
