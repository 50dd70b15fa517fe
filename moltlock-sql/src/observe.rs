//! Expiry judged with no wall clock: the observed-expiry mode.
//!
//! In this mode a hold never expires by a clock in the store. Each renewal
//! bumps the row's `version`, and the row records the holder's TTL. A waiter
//! that finds a key held remembers `(holder, version)` and the instant of the
//! reply on its own monotonic clock; only once the same pair has stood for
//! the holder's full TTL may it take the key over, and the takeover is one
//! statement conditioned on that pair (a renewal in between changes the
//! version and the takeover changes nothing). The holder's own deadline ends
//! at most a TTL (less the drift allowance) after the request that wrote the
//! version was sent, which is before the waiter first saw it: so the holder
//! has stopped believing it holds before the takeover, whatever the wall
//! clocks of the store or the clients do. Amazon's DynamoDB lock client
//! judges leases the same way.
//!
//! The cost: a waiter behind a dead holder waits a full TTL from its first
//! look, not from the holder's last renewal (up to twice the TTL in all).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// What one waiter process has seen of held keys.
#[derive(Default)]
pub(crate) struct Observed {
    seen: Mutex<HashMap<String, Seen>>,
}

struct Seen {
    holder: String,
    version: i64,
    ttl: Duration,
    since: Instant,
}

impl Observed {
    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, Seen>) -> T) -> T {
        match self.seen.lock() {
            Ok(mut g) => f(&mut g),
            Err(poisoned) => f(&mut poisoned.into_inner()),
        }
    }

    /// The `(holder, version)` a takeover of `key` may name now: one that
    /// has stood unchanged for its holder's TTL since this process saw it.
    pub(crate) fn ready(&self, key: &str) -> Option<(String, i64)> {
        self.with(|seen| {
            let s = seen.get(key)?;
            (s.since.elapsed() >= s.ttl).then(|| (s.holder.clone(), s.version))
        })
    }

    /// Records the hold a failed attempt saw, in a reply received just now;
    /// returns how long until it may be taken over.
    pub(crate) fn saw(&self, key: &str, holder: String, version: i64, ttl: Duration) -> Duration {
        let now = Instant::now();
        self.with(|seen| {
            let same = seen
                .get(key)
                .is_some_and(|s| s.holder == holder && s.version == version);
            if !same {
                let s = Seen {
                    holder,
                    version,
                    ttl,
                    since: now,
                };
                seen.insert(key.to_owned(), s);
            }
            seen.get(key)
                .map_or(ttl, |s| s.ttl.saturating_sub(now - s.since))
        })
    }

    /// Forgets `key` (it was acquired, or found free).
    pub(crate) fn forget(&self, key: &str) {
        self.with(|seen| seen.remove(key));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_pair_is_ready_only_after_standing_for_its_ttl() {
        let o = Observed::default();
        let ttl = Duration::from_secs(3);
        assert_eq!(o.saw("k", "a".into(), 1, ttl), ttl);
        assert_eq!(o.ready("k"), None);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(o.saw("k", "a".into(), 1, ttl), Duration::from_secs(1));
        // A renewal (new version) starts the wait again.
        assert_eq!(o.saw("k", "a".into(), 2, ttl), ttl);
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(o.ready("k"), Some(("a".to_owned(), 2)));
        o.forget("k");
        assert_eq!(o.ready("k"), None);
    }
}
