//! Taking several keys in one script (`CasMulti`).

use std::time::Duration;

use moltlock_core::extension::cas_each;
use moltlock_core::{
    async_trait, CasMulti, CasOutcome, Error, LockKey, MultiMode, MultiOutcome, Token,
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

    /// Lock, fence and description key of each key in turn.
    fn stored_keys_of(&self, keys: &[LockKey]) -> Vec<String> {
        let layout = &self.inner.layout;
        keys.iter()
            .flat_map(|k| [layout.lock(k), layout.fence(k), layout.info(k)])
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
    /// ([`cas_each`](moltlock_core::extension::cas_each)).
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
            return Ok(match mode {
                MultiMode::All => MultiOutcome::Acquired(Vec::new()),
                MultiMode::Any => MultiOutcome::Held(Vec::new()),
            });
        }
        if !self.one_script(keys) {
            return cas_each(self, keys, token, ttl, mode).await;
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
}
