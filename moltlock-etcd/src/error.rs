//! Mapping of etcd client failures into [`moltlock_core::Error`].
//!
//! | etcd failure | MoltLock error |
//! |---|---|
//! | connection refused, transport error, `Unavailable`, `DeadlineExceeded`, `Unknown` (the client's code for a broken connection; etcd's for "leader changed"), no leader, `Aborted`, `ResourceExhausted` | [`Error::Unavailable`] (retryable) |
//! | `Unauthenticated`, `PermissionDenied`, "authentication failed", "invalid auth token", "permission denied" | [`Error::Auth`] |
//! | lease not found | [`Error::Store`], retryable (the next attempt grants a fresh lease) |
//! | request too large, too many operations in a Txn | [`Error::Store`], not retryable |
//! | a bad endpoint or URI | [`Error::Config`] |
//! | anything else | [`Error::Store`], not retryable |
//!
//! `Unavailable`, `Auth` and `Store` errors keep the client's
//! `etcd_client::Error` as their [`source`](std::error::Error::source), for
//! callers that downcast to it; their messages are redacted.

use moltlock_core::Error;
use tonic::Code;

/// The backend's name in errors, logs and metric labels.
pub(crate) const NAME: &str = "etcd";

/// Whether an etcd error says the lease is gone.
pub(crate) fn is_lease_not_found(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => {
            s.code() == Code::NotFound || s.message().contains("lease not found")
        }
        etcd_client::Error::LeaseKeepAliveError(m) => m.contains("lease not found"),
        _ => false,
    }
}

/// Maps an etcd client error into core's error, keeping it as the
/// error's [`source`](std::error::Error::source) (`Config` errors, which
/// have none, keep only its message).
pub(crate) fn map(e: etcd_client::Error) -> Error {
    use etcd_client::Error as E;
    let mapped = match &e {
        E::GRpcStatus(s) => map_status(s),
        E::TransportError(t) => Error::unavailable(NAME, format!("transport error: {t}")),
        E::IoError(io) => Error::unavailable(NAME, format!("i/o error: {io}")),
        E::WatchError(m) => Error::unavailable(NAME, format!("watch failed: {m}")),
        E::LeaseKeepAliveError(m) if m.contains("lease not found") => {
            Error::store(NAME, "the session lease is gone (lease not found)", true)
        }
        E::LeaseKeepAliveError(m) => Error::unavailable(NAME, format!("lease keep-alive: {m}")),
        E::InvalidArgs(m) => Error::config(format!("etcd: {m}")),
        E::InvalidUri(u) => Error::config(format!("etcd: invalid endpoint: {u}")),
        E::EndpointError(m) => Error::config(format!("etcd: endpoint: {m}")),
        other => Error::store(NAME, other, false),
    };
    mapped.with_source(e)
}

fn map_status(s: &tonic::Status) -> Error {
    let msg = s.message();
    if is_auth_message(msg) || matches!(s.code(), Code::Unauthenticated | Code::PermissionDenied) {
        return Error::auth(NAME, msg);
    }
    if msg.contains("lease not found") {
        return Error::store(NAME, "the session lease is gone (lease not found)", true);
    }
    if msg.contains("too large") || msg.contains("too many operations") {
        return Error::store(NAME, msg, false);
    }
    if is_transient_message(msg) {
        return Error::unavailable(NAME, msg);
    }
    match s.code() {
        Code::Unavailable
        | Code::DeadlineExceeded
        | Code::Aborted
        | Code::ResourceExhausted
        | Code::Cancelled
        | Code::Unknown => Error::unavailable(NAME, format!("{:?}: {msg}", s.code())),
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
            Error::store(NAME, format!("{:?}: {msg}", s.code()), false)
        }
        code => Error::store(NAME, format!("{code:?}: {msg}"), false),
    }
}

fn is_auth_message(msg: &str) -> bool {
    [
        "authentication failed",
        "invalid auth token",
        "permission denied",
        "user name is empty",
        "authentication is not enabled",
    ]
    .iter()
    .any(|m| msg.contains(m))
}

fn is_transient_message(msg: &str) -> bool {
    [
        "leader changed",
        "no leader",
        "timed out",
        "timeout",
        "too many requests",
        "not capable",
        "stopped",
        "transport error",
        "connection",
    ]
    .iter()
    .any(|m| msg.contains(m))
}

/// A request that did not answer within the configured request timeout.
pub(crate) fn timed_out(what: &str, after: std::time::Duration) -> Error {
    Error::unavailable(NAME, format!("{what} did not answer within {after:?}"))
}

/// Runs one etcd request with the request timeout, mapping its failure.
pub(crate) async fn call<T, F>(what: &str, timeout: std::time::Duration, fut: F) -> Result<T, Error>
where
    F: std::future::Future<Output = Result<T, etcd_client::Error>>,
{
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r.map_err(map),
        Err(_) => Err(timed_out(what, timeout)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_kinds() {
        let unavailable = tonic::Status::unavailable("connection refused");
        assert!(map(etcd_client::Error::GRpcStatus(unavailable)).is_retryable());
        let auth = tonic::Status::invalid_argument(
            "etcdserver: authentication failed, invalid user ID or password",
        );
        assert!(matches!(
            map(etcd_client::Error::GRpcStatus(auth)),
            Error::Auth { .. }
        ));
        let big = tonic::Status::invalid_argument("etcdserver: request is too large");
        assert!(matches!(
            map(etcd_client::Error::GRpcStatus(big)),
            Error::Store {
                retryable: false,
                ..
            }
        ));
        let lease = tonic::Status::not_found("etcdserver: requested lease not found");
        let e = etcd_client::Error::GRpcStatus(lease);
        assert!(is_lease_not_found(&e));
        assert!(map(e).is_retryable());
        let leader = tonic::Status::unknown("etcdserver: leader changed");
        assert!(map(etcd_client::Error::GRpcStatus(leader)).is_retryable());
    }

    #[test]
    fn the_client_error_is_the_source() {
        let e = map(etcd_client::Error::GRpcStatus(tonic::Status::unavailable(
            "down",
        )));
        let source =
            std::error::Error::source(&e).and_then(|s| s.downcast_ref::<etcd_client::Error>());
        assert!(
            matches!(source, Some(etcd_client::Error::GRpcStatus(s)) if s.message() == "down"),
            "{e:?}"
        );
    }
}
