//! MoltLock backend for etcd v3.
//!
//! ```no_run
//! use std::time::Duration;
//! use moltlock_core::LockManager;
//! use moltlock_etcd::EtcdBackend;
//!
//! # async fn run() -> Result<(), moltlock_core::Error> {
//! let backend = EtcdBackend::from_url("etcd://127.0.0.1:2379/locks").await?;
//! let manager = LockManager::builder(backend).ttl(Duration::from_secs(10)).build()?;
//! let guard = manager.lock("jobs/nightly").await?;
//! // … send guard.fence() with every write the lock protects …
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Configuration
//!
//! [`EtcdConfig::from_url`] or [`EtcdConfig::new`] plus setters (`key_prefix`,
//! `connect_timeout`, `request_timeout`, `session_ttl`, `auth`, `tls_*`),
//! then [`EtcdBackend::connect`], which checks the settings. An application
//! that already has an `etcd_client::Client` shares it with
//! [`EtcdBackend::from_client`]. The password is kept in a
//! [`Secret`](moltlock_core::Secret) and never shows in `Debug` output or
//! errors.
//!
//! # Cancel safety
//!
//! Every async method documents what a dropped future leaves in etcd. In
//! short: reads leave nothing; an acquisition may still land, on the
//! session lease, and is removed by the manager's owner-checked cleanup; a
//! release that did not finish is retried before the session's next
//! acquisition or renewal round; a dropped fair wait deletes its queue
//! entry.
//!
//! # How it works
//!
//! - **Session**: each [`EtcdBackend`] instance is one session with one lease
//!   per distinct hold TTL (rounded up to whole seconds; etcd's floor is
//!   2 s, so that is the shortest TTL accepted). No background task keeps
//!   the lease alive: the manager's renewal driver calls
//!   [`renew_many`](moltlock_core::RenewMany::renew_many) every TTL/3, which
//!   sends one keep-alive per lease and checks the holds with one
//!   `LeaseTimeToLive(keys)` query per lease: a key still attached to the
//!   session's lease carries the token the session last wrote to it (any
//!   other write detaches it), so only keys whose last write by this session
//!   is uncertain (in flight, failed, or since replaced by another hold of
//!   the same session) are read back, 100 per request. If nobody renews, the lease
//!   expires and its keys vanish. A lease with less than 2/3 of its TTL left
//!   is refreshed before a new hold is written on it, and
//!   [`earliest_expiry`](moltlock_core::Backend::earliest_expiry) reports
//!   the lease's own bound. A lease that is gone (revoked, expired) makes
//!   every hold on it report lost; the next acquisition grants a fresh one.
//!   Leases are shared by attempts, so a failed attempt never leaks one.
//!   Note: any keep-alive of a lease extends every key on it, so within one
//!   instance a hold written by a bare `cas` and never renewed lives as
//!   long as other holds of the same TTL are renewed. For the same reason a
//!   release that fails (or is dropped before etcd answers) is remembered
//!   and retried, owner-checked, before the session's next acquisition or
//!   renewal round; otherwise the session's own use would keep the
//!   orphaned key alive.
//! - **Acquire**: `Txn(if create_revision(key) == 0 then put(key, token,
//!   lease) else get(key))`. The fence is the revision of the put that gave
//!   the key to its holder (its create revision; for a hand-over
//!   `cas(Some(a), b)`, the hand-over's own revision), which grows with every
//!   acquisition, across clients and server restarts (etcd
//!   revisions survive restarts with the data directory; restoring an older
//!   snapshot or wiping the data breaks the order).
//! - **Release**: `Txn(if value(key) == token then delete(key))`.
//! - **Several keys** ([`CasMulti`](moltlock_core::CasMulti), under
//!   `lock_all`, semaphores and read-write locks): one Txn per call. `All`
//!   compares every key absent and puts every key on the session lease in
//!   its success branch (else reads every key, to report the holders);
//!   `Any` is a chain of nested Txns, one level per key, so etcd takes the
//!   first absent key. Fences are what single acquisitions give. At most
//!   a third of [`EtcdConfig::max_txn_ops`] keys per call, and at most 42;
//!   longer lists take one key at a time.
//! - **Waiting**: a watch on the key from the revision right after the
//!   failed attempt, so no release is missed; a compacted start revision
//!   gives a spurious wake-up.
//! - **Fair queue**: see [`fair`](crate#fair-queue) below.
//!
//! # Fair queue
//!
//! `LockOptions::fair()` waits in a queue of entries
//! `<prefix><key>\0queue/<token>` ordered by create revision; each waiter
//! watches only its predecessor, the holder keeps its entry until release,
//! and the release deletes key and entry in one Txn, so one release wakes
//! exactly one waiter. Non-fair acquisitions of the same key may overtake
//! the queue but never break mutual exclusion.
//!
//! # Limits
//!
//! Keys: up to 256 bytes (core's limit); TTLs: 2 s (or the configured
//! session TTL) to one week. Errors map as described in the `error` module:
//! unreachable or leaderless etcd → `Unavailable`; bad credentials → `Auth`.

mod backend;
mod config;
mod core;
mod error;
mod fair;
mod holds;
mod inspect;
mod keys;
mod multi;
mod pending;
mod renew;
mod session;
mod txn;
mod url;
mod watch;
mod written;

pub use backend::EtcdBackend;
pub use config::{
    EtcdConfig, Pem, TlsSettings, DEFAULT_MAX_TXN_OPS, DEFAULT_PREFIX, MIN_SESSION_TTL,
};
/// The etcd client library this backend is built on, for
/// [`EtcdBackend::from_client`] and administration beside the locks.
pub use etcd_client;
/// The etcd client [`EtcdBackend::from_client`] takes (the same type as
/// [`etcd_client::Client`]), so an application needs no etcd-client
/// dependency of its own.
pub use etcd_client::Client;
