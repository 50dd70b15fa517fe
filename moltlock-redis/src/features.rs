//! The optional features Redis offers: release watches over pub/sub,
//! inspection, pipelined batch renewal, holder descriptions and raising
//! fences.

use moltlock_core::{
    async_trait, Backend, CasOutcome, Describe, Error, Fence, HolderInfo, Inspect, LockKey,
    RaiseFence, ReleaseWatch, RenewItem, RenewMany, Token, Watch,
};

use tokio::time::Instant;

use crate::backend::{expires_in, millis, RedisBackend, LIMITS};
use crate::config::Mode;
use crate::scripts::{self, DESCRIBE, INSPECT, RAISE, RENEW_MANY};

/// The most holds one renewal script renews.
const RENEW_CHUNK: usize = 1000;

impl RedisBackend {
    /// Renews in one pipelined round trip (single server): one script per
    /// [`RENEW_CHUNK`] holds, so the server never runs one script for long.
    async fn renew_pipelined(&self, items: &[RenewItem]) -> Result<Vec<bool>, Error> {
        let layout = &self.inner.layout;
        let chunks: Vec<(Vec<String>, Vec<String>)> = items
            .chunks(RENEW_CHUNK)
            .map(|chunk| {
                let mut keys = Vec::with_capacity(chunk.len() * 3);
                let mut args = vec![self.keep()];
                for i in chunk {
                    keys.extend([
                        layout.lock(&i.key),
                        layout.info(&i.key),
                        layout.fence(&i.key),
                    ]);
                    args.extend([i.token.as_str().to_owned(), millis(i.ttl)]);
                }
                (keys, args)
            })
            .collect();
        let build = |by_source: bool| {
            let mut pipe = redis::pipe();
            for (keys, args) in &chunks {
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                pipe.add_command(RENEW_MANY.cmd(by_source, &keys, &args));
            }
            pipe
        };
        let mut conn = self.inner.conn.clone();
        let sent_at = Instant::now();
        let replies: Vec<(i64, Vec<i64>)> =
            self.timed(scripts::run_pipeline(&mut conn, build)).await?;
        if let Some(&(clock, _)) = replies.first() {
            self.saw_clock(sent_at, clock);
        }
        let done: Vec<bool> = replies
            .into_iter()
            .flat_map(|(_, done)| done.into_iter().map(|d| d == 1))
            .collect();
        if done.len() != items.len() {
            return Err(crate::error::bad_reply(format!(
                "{} renewal answers for {} holds",
                done.len(),
                items.len()
            )));
        }
        Ok(done)
    }

    /// Renews concurrently, one script per hold (cluster: holds live on
    /// different slots, so no single pipeline can carry them).
    async fn renew_concurrently(&self, items: &[RenewItem]) -> Result<Vec<bool>, Error> {
        let calls = items
            .iter()
            .map(|i| self.cas(&i.key, Some(&i.token), &i.token, i.ttl));
        let outcomes = futures_util::future::join_all(calls).await;
        outcomes
            .into_iter()
            .map(|o| o.map(|o| matches!(o, CasOutcome::Acquired { .. })))
            .collect()
    }

    /// Every stored lock key under the caller's `prefix`.
    async fn stored_keys(&self, prefix: &str) -> Result<Vec<String>, Error> {
        let pattern = self.inner.layout.scan_pattern(prefix);
        let mut conn = self.inner.conn.clone();
        if self.inner.cfg.mode == Mode::Cluster {
            // KEYS goes to every primary; SCAN cursors cannot span nodes.
            let cmd = redis::cmd("KEYS").arg(&pattern).to_owned();
            return self.timed(cmd.query_async(&mut conn)).await;
        }
        let mut out = Vec::new();
        let mut cursor = 0u64;
        loop {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(500);
            let (next, batch): (u64, Vec<String>) = self.timed(cmd.query_async(&mut conn)).await?;
            out.extend(batch);
            if next == 0 {
                return Ok(out);
            }
            cursor = next;
        }
    }
}

#[async_trait]
impl Watch for RedisBackend {
    /// Registers on the backend's shared pub/sub subscription. Errors when
    /// the subscription is not live within the connect timeout; the manager
    /// then polls.
    async fn watch(&self, key: &LockKey) -> Result<Box<dyn ReleaseWatch>, Error> {
        let channel = self.inner.layout.channel(key);
        let within = self.inner.cfg.connect_timeout;
        let w = self.notifier().await.watch(channel, within).await?;
        Ok(Box::new(w))
    }
}

impl RedisBackend {
    /// The holder of `key`; `mark`: also mark a held key waited for, so its
    /// release is announced (see the crate docs).
    async fn inspect_marking(
        &self,
        key: &LockKey,
        mark: bool,
    ) -> Result<Option<HolderInfo>, Error> {
        key.check_len(LIMITS.max_key_len)?;
        let layout = &self.inner.layout;
        let (lock, fence, info) = (layout.lock(key), layout.fence(key), layout.info(key));
        let wait = layout.wait(key);
        let flag = if mark { "1" } else { "0" };
        let (holder, fence, pttl, description): (
            Option<String>,
            Option<String>,
            i64,
            Option<String>,
        ) = self
            .script(&INSPECT, &[&lock, &fence, &info, &wait], &[flag])
            .await?;
        let Some(holder) = holder else {
            return Ok(None);
        };
        Ok(Some(HolderInfo {
            key: key.as_str().to_owned(),
            holder: Token::from_stored(holder),
            fence: fence.and_then(|f| f.parse().ok()).map(Fence),
            expires_in: expires_in(pttl),
            description,
        }))
    }
}

#[async_trait]
impl Inspect for RedisBackend {
    /// Also marks a held key waited for, as a failed acquire does: callers
    /// that inspect and then wait for the release (an election's
    /// observers, a cross-slot `cas_multi`) hear it.
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        self.inspect_marking(key, true).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<HolderInfo>, Error> {
        let mut out = Vec::new();
        for stored in self.stored_keys(prefix).await? {
            let Some(key) = self.inner.layout.caller_key(&stored) else {
                continue;
            };
            let Ok(key) = LockKey::new(key) else {
                continue;
            };
            if !key.as_str().starts_with(prefix) {
                continue;
            }
            if let Some(info) = self.inspect_marking(&key, false).await? {
                out.push(info);
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }
}

#[async_trait]
impl RenewMany for RedisBackend {
    /// Single server: all holds in one pipelined round trip. Cluster: one
    /// script per hold, all in flight at once.
    async fn renew_many(&self, items: &[RenewItem]) -> Result<Vec<bool>, Error> {
        for i in items {
            self.check(&i.key, i.ttl)?;
        }
        if items.is_empty() {
            return Ok(Vec::new());
        }
        match self.inner.cfg.mode {
            Mode::Single => self.renew_pipelined(items).await,
            Mode::Cluster => self.renew_concurrently(items).await,
        }
    }
}

#[async_trait]
impl Describe for RedisBackend {
    async fn describe(&self, key: &LockKey, owner: &Token, text: &str) -> Result<bool, Error> {
        key.check_len(LIMITS.max_key_len)?;
        let layout = &self.inner.layout;
        let (lock, info) = (layout.lock(key), layout.info(key));
        let done: i64 = self
            .script(&DESCRIBE, &[&lock, &info], &[owner.as_str(), text])
            .await?;
        Ok(done == 1)
    }
}

#[async_trait]
impl RaiseFence for RedisBackend {
    async fn raise_fence(&self, key: &LockKey, minimum: Fence) -> Result<(), Error> {
        key.check_len(LIMITS.max_key_len)?;
        let fence = self.inner.layout.fence(key);
        let _: i64 = self
            .script(&RAISE, &[&fence], &[&minimum.get().to_string()])
            .await?;
        Ok(())
    }
}
