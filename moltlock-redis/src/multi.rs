//! Taking several keys in one script (`CasMulti`).

use std::time::Duration;

use futures_util::future::join_all;
use moltlock_core::extension::cas_each;
use moltlock_core::{
    async_trait, CasMulti, CasOutcome, Error, Held, Inspect, LockKey, MultiMode, MultiOutcome,
    Token,
};
use tokio::time::Instant;

use crate::backend::{millis, outcome, RedisBackend};
use crate::config::Mode;
use crate::error::bad_reply;
use crate::scripts::ACQUIRE_MULTI;

/// The multi script's reply: status (1 taken, 0 busy), the server's clock
/// in µs, and per key reported (index, fence or holder, PTTL).
type MultiReply = (i64, i64, Vec<(i64, Option<String>, i64)>);

impl RedisBackend {
    /// Whether one script may carry `keys`: always on one server; in a
    /// Cluster only when they share one hash tag (so one slot).
    fn one_script(&self, keys: &[LockKey]) -> bool {
        if self.inner.cfg.mode == Mode::Single {
            return true;
        }
        let layout = &self.inner.layout;
        let mut tags = keys.iter().map(|k| layout.tag(k));
        let first = tags.next();
        tags.all(|t| Some(t) == first)
    }

    /// Cluster, keys of several slots: one `cas` at a time. An `All` first
    /// reads every key (all at once) and, when one is held, refuses without
    /// taking any, so a set refused for a key held at that read is never
    /// seen in part. A key taken by another client between the read and
    /// its own `cas` still leaves the keys before it held until they are
    /// given back: across slots no request is atomic.
    async fn across_slots(
        &self,
        keys: &[LockKey],
        token: &Token,
        ttl: Duration,
        mode: MultiMode,
    ) -> Result<MultiOutcome, Error> {
        if mode == MultiMode::All {
            let busy = self.busy_now(keys).await?;
            if !busy.is_empty() {
                return Ok(MultiOutcome::Held(busy));
            }
        }
        cas_each(self, keys, token, ttl, mode).await
    }

    /// The keys held now, as `cas` would report them, read concurrently.
    async fn busy_now(&self, keys: &[LockKey]) -> Result<Vec<(usize, Held)>, Error> {
        let reads = keys.iter().map(|k| Inspect::inspect(self, k));
        let mut busy = Vec::new();
        for (i, read) in join_all(reads).await.into_iter().enumerate() {
            if let Some(info) = read? {
                let held = Held {
                    holder: Some(info.holder),
                    expires_in: info.expires_in,
                    revision: None,
                };
                busy.push((i, held));
            }
        }
        Ok(busy)
    }

    /// Lock, fence and description key of each key in turn.
    fn stored_keys_of(&self, keys: &[LockKey]) -> Vec<String> {
        let layout = &self.inner.layout;
        keys.iter()
            .flat_map(|k| {
                [
                    layout.lock(k),
                    layout.fence(k),
                    layout.info(k),
                    layout.wait(k),
                ]
            })
            .collect()
    }
}

/// Maps the script's reply for `len` keys.
fn multi_outcome(reply: MultiReply, len: usize) -> Result<MultiOutcome, Error> {
    let (status, _, entries) = reply;
    if status != 0 && status != 1 {
        return Err(bad_reply(format!("status {status}")));
    }
    let mut taken = Vec::new();
    let mut busy = Vec::new();
    for (index, text, pttl) in entries {
        let i = usize::try_from(index)
            .ok()
            .filter(|i| *i < len)
            .ok_or_else(|| bad_reply(format!("key index {index} of {len}")))?;
        match outcome((status, text, pttl, 0))? {
            CasOutcome::Acquired { fence } => taken.push((i, fence)),
            CasOutcome::Held(held) => busy.push((i, held)),
        }
    }
    Ok(if status == 1 {
        MultiOutcome::Acquired(taken)
    } else {
        MultiOutcome::Held(busy)
    })
}

#[async_trait]
impl CasMulti for RedisBackend {
    /// One script, one round trip (an `EVALSHA`, repeated as `EVAL` if the
    /// script cache was flushed): each key is judged as `cas` judges it
    /// (expiry by the server's clock, the restart quarantine, a fence
    /// advanced past the stored one and the clock), and `All` takes every
    /// key or none. An `All` that finds keys busy reports every busy key.
    ///
    /// Cluster: keys that do not all share one hash tag (the keys derived
    /// from one name do) live in different slots, which no script can span;
    /// they are taken one `cas` at a time
    /// ([`cas_each`](moltlock_core::extension::cas_each)), an `All` after
    /// one concurrent read of every key that refuses without writing when
    /// one is held. Such a call is not atomic: a key taken elsewhere
    /// between that read and its `cas` leaves the keys before it visibly
    /// held until they are given back.
    async fn cas_multi(
        &self,
        keys: &[LockKey],
        token: &Token,
        ttl: Duration,
        mode: MultiMode,
    ) -> Result<MultiOutcome, Error> {
        for key in keys {
            self.check(key, ttl)?;
        }
        self.check_quarantine(ttl)?;
        if keys.is_empty() {
            return Ok(MultiOutcome::of_no_keys(mode));
        }
        if !self.one_script(keys) {
            return self.across_slots(keys, token, ttl, mode).await;
        }
        let stored = self.stored_keys_of(keys);
        let stored: Vec<&str> = stored.iter().map(String::as_str).collect();
        let which = match mode {
            MultiMode::All => "all",
            MultiMode::Any => "any",
        };
        let (ttl, keep, q) = (millis(ttl), self.keep(), self.quarantine());
        let args = [token.as_str(), &ttl, &keep, &q, which];
        let sent_at = Instant::now();
        let reply: MultiReply = self.script(&ACQUIRE_MULTI, &stored, &args).await?;
        self.saw_clock(sent_at, reply.1);
        multi_outcome(reply, keys.len())
    }

    /// One server: any keys. Cluster: keys of one hash tag only.
    fn takes_together(&self, keys: &[LockKey]) -> bool {
        self.one_script(keys)
    }
}
