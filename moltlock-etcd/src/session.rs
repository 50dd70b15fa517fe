//! The session: the leases one backend instance (one manager) hangs its
//! holds on, one per distinct TTL in whole seconds.
//!
//! Leases are not kept alive by a background task: the manager's renewal
//! driver calls `renew_many` every TTL/3, which sends one keep-alive per
//! lease, and an acquisition refreshes a lease that has less than 2/3 of its
//! TTL left. So if nobody renews, the lease expires and its keys vanish.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use etcd_client::Client;
use moltlock_core::Error;
use tokio::time::Instant;

use crate::error::{call, is_lease_not_found, map};

/// One granted lease and what we know of its life.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Lease {
    /// The lease id.
    pub(crate) id: i64,
    /// The TTL etcd granted (it may raise a short request to its floor).
    pub(crate) ttl: Duration,
    /// An instant before the last grant or keep-alive request that etcd
    /// confirmed: the lease lives at least until `confirmed_at + ttl`.
    pub(crate) confirmed_at: Instant,
}

impl Lease {
    /// The earliest instant etcd may expire this lease.
    pub(crate) fn expires(&self) -> Instant {
        self.confirmed_at + self.ttl
    }

    fn has_at_least(&self, part: f64, now: Instant) -> bool {
        self.expires().saturating_duration_since(now) >= self.ttl.mul_f64(part)
    }
}

/// The leases of one backend instance.
pub(crate) struct Session {
    client: Client,
    leases: Mutex<HashMap<u64, Lease>>,
    refresh: tokio::sync::Mutex<()>,
    floor_secs: u64,
    timeout: Duration,
}

/// A lease with less than this share of its TTL left is refreshed before a
/// new hold is written on it.
const REFRESH_BELOW: f64 = 2.0 / 3.0;

impl Session {
    pub(crate) fn new(client: Client, floor: Duration, timeout: Duration) -> Self {
        Self {
            client,
            leases: Mutex::new(HashMap::new()),
            refresh: tokio::sync::Mutex::new(()),
            floor_secs: whole_secs(floor).max(1),
            timeout,
        }
    }

    fn leases(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Lease>> {
        self.leases.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The lease TTL, in whole seconds, for holds of `ttl`.
    pub(crate) fn secs_for(&self, ttl: Duration) -> u64 {
        whole_secs(ttl).max(self.floor_secs)
    }

    /// The lease currently used for holds of `ttl`, if any.
    pub(crate) fn current(&self, ttl: Duration) -> Option<Lease> {
        self.leases().get(&self.secs_for(ttl)).copied()
    }

    /// The bound `earliest_expiry` reports: the lease's own, or `sent_at`
    /// (no validity at all) when the session has no lease for this TTL.
    pub(crate) fn bound(&self, ttl: Duration, sent_at: Instant) -> Instant {
        self.current(ttl).map_or(sent_at, |l| l.expires())
    }

    /// The ids of the session's leases.
    pub(crate) fn ids(&self) -> Vec<i64> {
        self.leases().values().map(|l| l.id).collect()
    }

    /// Drops the lease `id` from the session (it is gone on the server).
    pub(crate) fn forget(&self, id: i64) {
        self.leases().retain(|_, l| l.id != id);
    }

    fn confirm(&self, id: i64, sent_at: Instant) -> Option<Lease> {
        let mut leases = self.leases();
        let lease = leases.values_mut().find(|l| l.id == id)?;
        if sent_at > lease.confirmed_at {
            lease.confirmed_at = sent_at;
        }
        Some(*lease)
    }

    /// A lease for a new hold of `ttl` with at least 2/3 of its TTL left:
    /// the current one (kept alive first if needed) or a fresh grant.
    pub(crate) async fn lease_for(&self, ttl: Duration) -> Result<Lease, Error> {
        let secs = self.secs_for(ttl);
        if let Some(l) = self.current(ttl) {
            if l.has_at_least(REFRESH_BELOW, Instant::now()) {
                return Ok(l);
            }
        }
        let _one_at_a_time = self.refresh.lock().await;
        match self.current(ttl) {
            Some(l) if l.has_at_least(REFRESH_BELOW, Instant::now()) => Ok(l),
            Some(l) => match self.keep_alive(l.id).await? {
                Some(l) => Ok(l),
                None => self.grant(secs).await,
            },
            None => self.grant(secs).await,
        }
    }

    /// A lease of its own for one hold of `ttl`, which the session neither
    /// tracks nor keeps alive: it ends at its TTL unless that hold is
    /// renewed (a hand-over to a token this session does not renew, such
    /// as an at-least hold left behind by a release).
    pub(crate) async fn lease_of_its_own(&self, ttl: Duration) -> Result<i64, Error> {
        let mut client = self.client.clone();
        let secs = i64::try_from(self.secs_for(ttl)).unwrap_or(i64::MAX);
        let resp = call("lease grant", self.timeout, client.lease_grant(secs, None)).await?;
        Ok(resp.id())
    }

    /// Revokes a lease of its own that ended up holding nothing, in the
    /// background (it would otherwise live its TTL, harmlessly).
    pub(crate) fn revoke_unused(&self, id: i64) {
        let mut client = self.client.clone();
        let timeout = self.timeout;
        tokio::spawn(async move {
            let _ = call("lease revoke", timeout, client.lease_revoke(id)).await;
        });
    }

    async fn grant(&self, secs: u64) -> Result<Lease, Error> {
        let mut client = self.client.clone();
        let sent_at = Instant::now();
        let ttl = i64::try_from(secs).unwrap_or(i64::MAX);
        let resp = call("lease grant", self.timeout, client.lease_grant(ttl, None)).await?;
        let granted = u64::try_from(resp.ttl()).unwrap_or(0).max(secs);
        let lease = Lease {
            id: resp.id(),
            ttl: Duration::from_secs(granted),
            confirmed_at: sent_at,
        };
        tracing::debug!(lease = lease.id, ttl = ?lease.ttl, "granted a session lease");
        self.leases().insert(secs, lease);
        Ok(lease)
    }

    /// One keep-alive of lease `id`. `Ok(None)` when etcd says the lease is
    /// gone (it is then dropped from the session). Leases that are not the
    /// session's own (a hold written by another instance) are kept alive
    /// but not tracked, and come back with `confirmed_at` of this request.
    pub(crate) async fn keep_alive(&self, id: i64) -> Result<Option<Lease>, Error> {
        let mut client = self.client.clone();
        let sent_at = Instant::now();
        let res = tokio::time::timeout(self.timeout, client.lease_keep_alive(id)).await;
        match res {
            Err(_) => Err(crate::error::timed_out("lease keep-alive", self.timeout)),
            Ok(Err(e)) if is_lease_not_found(&e) => {
                tracing::warn!(lease = id, "the session lease is gone");
                self.forget(id);
                Ok(None)
            }
            Ok(Err(e)) => Err(map(e)),
            Ok(Ok(_)) => Ok(Some(self.confirm(id, sent_at).unwrap_or(Lease {
                id,
                ttl: Duration::ZERO,
                confirmed_at: sent_at,
            }))),
        }
    }

    /// Keeps the lease for holds of `ttl` alive for a renewal round.
    /// Returns the lease if it lives, `None` if it is gone. A lease
    /// confirmed within the last tenth of its TTL is not sent again.
    pub(crate) async fn renew(&self, ttl: Duration) -> Result<Option<Lease>, Error> {
        let Some(l) = self.current(ttl) else {
            return Ok(None);
        };
        if l.has_at_least(0.9, Instant::now()) {
            return Ok(Some(l));
        }
        self.keep_alive(l.id).await
    }

    /// Revokes every lease of the session (their keys vanish at once).
    pub(crate) async fn revoke_all(&self) -> Result<(), Error> {
        let ids: Vec<i64> = self.leases().drain().map(|(_, l)| l.id).collect();
        for id in ids {
            let mut client = self.client.clone();
            match tokio::time::timeout(self.timeout, client.lease_revoke(id)).await {
                Ok(Err(e)) if !is_lease_not_found(&e) => return Err(map(e)),
                Err(_) => return Err(crate::error::timed_out("lease revoke", self.timeout)),
                _ => {}
            }
        }
        Ok(())
    }
}

/// `d` rounded up to whole seconds.
fn whole_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}
