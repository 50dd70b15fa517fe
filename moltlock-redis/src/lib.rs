//! MoltLock backend for Redis: `SET NX PX` semantics in one Lua script per
//! operation, pub/sub wake-ups, fences that survive a restart, Redis Cluster,
//! TLS and ACL users.
//!
//! ```no_run
//! use std::time::Duration;
//! use moltlock_core::LockManager;
//! use moltlock_redis::RedisBackend;
//!
//! # async fn run() -> Result<(), moltlock_core::Error> {
//! let backend = RedisBackend::from_url("redis://127.0.0.1:6379/0").await?;
//! let manager = LockManager::builder(backend).ttl(Duration::from_secs(10)).build()?;
//! let guard = manager.lock("jobs/nightly").await?;
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Keys
//!
//! A lock key `k` lives at `<prefix>{k}` (the owner token, with a `PX`
//! expiry) and its fence at `<prefix>{k}:fence`; `%` and `}` inside `k` are
//! written `%25` and `%7D`. The braces are a Cluster hash tag, so every
//! single-key script touches one slot. A key of a semaphore or read-write
//! lock (`name#~s3`, `name#~w`) lives at `<prefix>{name}#~s3` (`:` after
//! the tag written `%3A`): every key of one primitive shares its name's
//! hash tag, so its slot. `list` returns such keys whole (`name#~s3`). The
//! default prefix is `moltlock:`. Keys are 1 to 256 bytes (core's limit);
//! TTLs 10 ms to one week.
//!
//! # Operations
//!
//! - acquire: one script does the `SET NX PX` and advances the fence, and on
//!   failure returns the holder and its `PTTL`, so a waiter sleeps at most
//!   until the hold expires;
//! - renew: compare-and-`PEXPIRE`; release: compare-and-`DEL`, then
//!   `PUBLISH` on the key's channel only when a waiter marked the key. Never
//!   a read followed by a separate write;
//! - notify only when someone waits: an acquire attempt that finds the key
//!   held also marks it waited for (`<lock key>:wait`, until 5 s past the
//!   hold's expiry), in the same script and after its waiter subscribed;
//!   the release deletes the mark and publishes only if it found one. A
//!   waiter looks again by the hold's expiry at the latest, marking again
//!   if the hold was renewed, so no release it waits for is unannounced,
//!   and a release nobody waits for costs no `PUBLISH`. Waiters of versions
//!   without marks are not woken by this version's releases (they look
//!   again by the hold's expiry or their retry policy): upgrade a fleet's
//!   waiters first;
//! - scripts go as `EVALSHA`, repeated as `EVAL` when the script cache was
//!   flushed (`NOSCRIPT`);
//! - `renew_many` renews all holds of a manager in one pipelined round trip
//!   of one script per 1,000 holds, three commands per hold (a compare
//!   `GET` and two `PEXPIRE`s; in Cluster mode: one script per hold, all in
//!   flight at once);
//! - `cas_multi` (all of several keys, or the first free one) is one script,
//!   one round trip, judging each key as the acquire script does; in
//!   Cluster mode keys that do not share one hash tag are taken one `cas` at
//!   a time, as no script can span slots (an `All` reads every key first and
//!   refuses without writing when one is held; still, such a call is not
//!   atomic: a key taken elsewhere between the read and its `cas` leaves the
//!   keys before it held until they are given back);
//! - waiting: one pub/sub connection per backend (`PSUBSCRIBE <prefix>{*`)
//!   shared by all waiters, reconnecting by itself; while it is down the
//!   manager polls by its retry policy.
//!
//! # Fair queue
//!
//! `LockOptions::fair()` waits in the key's queue, a sorted set of places
//! (`<lock key>:queue`, with each place's deadline in `<lock key>:alive`),
//! served in arrival order with no barging between fair waiters. Each look
//! is one script that renews the waiter's place and takes the key only
//! when that place is the head and the key is free: a free key with an
//! empty queue is taken in one round trip. Waiters look again on a release
//! announcement and every third of their TTL; a place not renewed for a
//! TTL (a crashed or paused waiter) is dropped by the next look, and a
//! dropped wait leaves at once. A plain `lock()` is not queued and may take
//! a free key ahead of the queue, as on etcd.
//!
//! # Fencing guarantee and its limits
//!
//! Each acquisition sets the fence to `max(stored fence + 1, server TIME in
//! microseconds)`, inside the acquire script. So fences strictly increase
//! per key while the fence key exists, and — because the fence key is given
//! no expiry unless [`RedisConfig::fence_retention`] asks for one —
//! across release and expiry too. When Redis restarts
//! *without persistence* (or the key is flushed or evicted), the stored
//! fence is lost, but the next fence is the server's clock in microseconds,
//! which is greater than every earlier fence as long as:
//!
//! - the server's clock did not step backwards across the restart (an NTP
//!   step, a different host after failover with a slower clock), and
//! - earlier fences did not run ahead of the clock (they only do if a key is
//!   acquired more than once per microsecond, which one Redis cannot do).
//!
//! A failover to a replica that had not yet received the latest fence write
//! is covered by the same clock rule (the replica's clock must not be
//! behind the old primary's by more than the time since that write). Lua
//! numbers are doubles: fences are exact up to 2^53 µs (the year 2255).
//! By default fence keys stay in Redis (about 80 bytes per distinct lock
//! key) so the counter survives; with a fence retention they expire that
//! long after their last hold, and fences then rest on the clock rule above.
//!
//! # Mutual exclusion across a restart: the restart quarantine (on by default)
//!
//! When Redis restarts *without persistence* (or the keys are flushed), a
//! held lock key is gone and looks free, while its old holder still
//! believes it holds it (`is_held()` is true) until its next renewal is
//! refused — up to a third of the TTL later. Fences stay monotonic (above),
//! but for that window two processes would believe they hold the lock.
//!
//! So by default the acquire script grants no free key while the server has
//! been up for less than the restart quarantine (30 s,
//! [`DEFAULT_RESTART_QUARANTINE`]): it
//! reads `uptime_in_seconds` from `INFO server` and reports the key held
//! (no holder) for the rest of the quarantine. The old holders' renewals are
//! refused meanwhile (a renewal never recreates a vanished key) and their
//! `lost()` fires. A new hold whose TTL is longer than the quarantine is
//! refused (`Error::InvalidTtl`), since it could outlive the quarantine.
//! **Set it to at least the longest TTL any client uses**
//! ([`RedisConfig::restart_quarantine`], URL `restart_quarantine`):
//! then even a holder cut off from the server has passed its own deadline
//! before anyone else is granted a key.
//!
//! The cost: one wait per server start (per node on a Cluster), including
//! the first start of a fresh server; keys already held are renewed as
//! usual. `restart_quarantine=0s` turns it off, for a durable Redis
//! (`appendonly yes`, `appendfsync always`), whose restarts keep holds.
//! Not covered: a `FLUSHALL` or an eviction of lock keys without a restart
//! (use `noeviction`), and a failover to a replica that missed the latest
//! writes (asynchronous replication; see Limits).
//!
//! # Limits
//!
//! - Redis replication is asynchronous: a failover can lose a hold just
//!   written (the usual caveat of single-instance Redis locks; no Redlock).
//! - Cluster mode: `list` uses `KEYS` on every primary (SCAN cursors cannot
//!   span nodes), so keep it for debugging; the pub/sub connection goes to
//!   one node (Cluster broadcasts `PUBLISH`), moving to the next seed when it
//!   fails.
//! - ACL users need `EVAL`, `EVALSHA`, `GET`, `MGET`, `SET`, `DEL`,
//!   `PEXPIRE`, `PTTL`, `TIME`, `PUBLISH`, `PSUBSCRIBE`, `SCAN` (cluster:
//!   `KEYS`), and for the restart quarantine `LASTSAVE` and `INFO`, and
//!   for the turns of waiting instances `SADD`, `SREM`, `SPOP`, and for the
//!   fair queue `ZADD`, `ZREM`, `ZRANGE`, `ZRANGEBYSCORE`, `ZSCORE`; the
//!   key pattern `<prefix>*` and the channel pattern `<prefix>{*` *exactly*
//!   (Redis checks `PSUBSCRIBE` patterns literally).

mod backend;
mod config;
mod conn;
mod error;
mod fair;
mod features;
mod keys;
mod multi;
mod pubsub;
mod scripts;

pub use backend::{RedisBackend, MIN_TTL};
pub use config::{
    Mode, RedisConfig, Secret, TlsFiles, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PREFIX,
    DEFAULT_REQUEST_TIMEOUT, DEFAULT_RESTART_QUARANTINE,
};
/// The Redis client library this backend is built on, for [`RedisBackend::from_client`].
pub use redis;
/// The Redis Cluster client [`RedisBackend::from_cluster_client`] takes.
pub use redis::cluster::ClusterClient;
/// The Redis client [`RedisBackend::from_client`] takes (the same type as
/// [`redis::Client`]), so an application needs no redis dependency of its own.
pub use redis::Client;
