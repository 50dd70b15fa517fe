//! Maps the Redis client's errors into MoltLock's error kinds.

use moltlock_core::Error;
use redis::{ErrorKind, RedisError};

/// The backend's name in errors, logs and metric labels.
pub(crate) const NAME: &str = "redis";

/// Maps a client error: connection trouble, timeouts and cluster
/// reconfiguration (`READONLY`, `MOVED`, `TRYAGAIN`, `CLUSTERDOWN`,
/// `LOADING`) are [`Error::Unavailable`]; refused credentials or ACL
/// permissions are [`Error::Auth`]; `OOM` and `NOSCRIPT` are retryable
/// [`Error::Store`]; everything else is a permanent [`Error::Store`].
///
/// Every mapped error keeps the client's as its
/// [`source`](std::error::Error::source), to downcast to [`RedisError`].
pub(crate) fn map(e: RedisError) -> Error {
    let error = if is_auth(&e) {
        Error::auth(NAME, &e)
    } else if is_transient(&e) {
        Error::unavailable(NAME, &e)
    } else {
        match e.kind() {
            ErrorKind::InvalidClientConfig => return Error::config(format!("{NAME}: {e}")),
            ErrorKind::NoScriptError => Error::store(NAME, &e, true),
            _ if e.code() == Some("OOM") => Error::store(NAME, &e, true),
            _ => Error::store(NAME, &e, false),
        }
    };
    error.with_source(e)
}

fn is_auth(e: &RedisError) -> bool {
    e.kind() == ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("NOPERM" | "WRONGPASS" | "NOAUTH"))
}

fn is_transient(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || matches!(
            e.kind(),
            ErrorKind::BusyLoadingError
                | ErrorKind::ReadOnly
                | ErrorKind::Moved
                | ErrorKind::Ask
                | ErrorKind::TryAgain
                | ErrorKind::ClusterDown
                | ErrorKind::MasterDown
                | ErrorKind::ClusterConnectionNotFound
        )
}

/// The error for a command that did not answer within the command timeout.
pub(crate) fn timed_out(what: &str) -> Error {
    Error::unavailable(NAME, format!("{what} timed out"))
}

/// The error for a reply the backend cannot read.
pub(crate) fn bad_reply(what: impl std::fmt::Display) -> Error {
    Error::store(NAME, format!("unexpected reply: {what}"), false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(code: &str, detail: &str) -> RedisError {
        RedisError::from((ErrorKind::ExtensionError, "", format!("{code} {detail}")))
    }

    #[test]
    fn kinds() {
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(matches!(map(refused), Error::Unavailable { .. }));
        let ro = RedisError::from((ErrorKind::ReadOnly, "READONLY"));
        assert!(matches!(map(ro), Error::Unavailable { .. }));
        let auth = RedisError::from((ErrorKind::AuthenticationFailed, "WRONGPASS"));
        assert!(matches!(map(auth), Error::Auth { .. }));
        let noscript = RedisError::from((ErrorKind::NoScriptError, "NOSCRIPT"));
        assert!(map(noscript).is_retryable());
        let other = RedisError::from((ErrorKind::ResponseError, "ERR bad"));
        let mapped = map(other);
        assert!(!mapped.is_retryable());
        let source =
            std::error::Error::source(&mapped).and_then(|s| s.downcast_ref::<RedisError>());
        assert_eq!(source.map(RedisError::kind), Some(ErrorKind::ResponseError));
        let _ = server("OOM", "command not allowed");
    }
}
