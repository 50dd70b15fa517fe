//! The fair queue: a sorted set of places per key, served in arrival order.
//!
//! A fair waiter subscribes to the key's releases, then runs the
//! [`FAIR`] script: it takes a place at the tail of
//! `<lock key>:queue` (scored by the server's clock, strictly after the
//! last place), renews its place's deadline in `<lock key>:alive` for the
//! hold's TTL, and takes the key only when its place is the head and the
//! key is free, in the same script — a free key with an empty queue costs
//! one round trip, as a plain acquire does. Otherwise it waits for a
//! release announcement (the script marks the key waited for) or a third
//! of its TTL, whichever comes first, and looks again, which renews its
//! place. A release names the head, which is woken at once; the other
//! waiters look a turn later (see the `pubsub` module). A place whose
//! waiter stopped looking (a crash, or a pause through which a whole TTL
//! passes from its last look: looks come every third of the TTL, so a
//! pause of more than two thirds of it can) is dropped by the next look
//! of any waiter; a dropped wait
//! takes its place out at once and, when it was the head, wakes the next.
//! Fair and plain holders stay mutually exclusive because both take the
//! same lock key with the same fences; a plain `lock()` may still overtake
//! the queue.

use std::sync::LazyLock;
use std::time::Duration;

use moltlock_core::{
    async_trait, CasOutcome, Error, FairQueue, Fence, LockKey, ReleaseWatch, Token,
};
use tokio::time::Instant;

use crate::backend::{millis, outcome, RedisBackend};
use crate::scripts::{Lua, TAKE};

/// Pause after a retryable failure, and between looks while the release
/// subscription is down.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// Waits in the queue of `key`, then holds it as `token`.
async fn acquire(
    backend: &RedisBackend,
    key: &LockKey,
    token: &Token,
    ttl: Duration,
) -> Result<Fence, Error> {
    backend.check(key, ttl)?;
    backend.check_quarantine(ttl)?;
    let layout = &backend.inner.layout;
    let channel = layout.channel(key);
    let within = backend.inner.cfg.connect_timeout;
    let watch = backend.notifier().await.watch(channel, within).await;
    let mut watch = watch.ok().map(|w| w.for_token(token.as_str()));
    let mut place = Place {
        backend: backend.clone(),
        key: key.clone(),
        token: token.clone(),
        left: false,
    };
    let period = (ttl / 3).max(Duration::from_millis(10));
    loop {
        let held = match look(backend, key, token, ttl).await {
            Ok(CasOutcome::Acquired { fence }) => {
                place.left = true;
                return Ok(fence);
            }
            Ok(CasOutcome::Held(held)) => held,
            Err(e) if e.is_retryable() => {
                tracing::debug!(%key, error = %e, "fair queue look failed; retrying");
                tokio::time::sleep(RETRY_PAUSE).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        // Until the hold ends, or the head's place may be dropped.
        let mut pause = period;
        if let Some(left) = held.expires_in {
            pause = pause.min(left + Duration::from_millis(1));
        }
        match watch.as_mut() {
            Some(w) => {
                tokio::select! {
                    told = w.released(&held) => if told.is_err() { watch = None },
                    _ = tokio::time::sleep(pause) => {}
                }
            }
            None => tokio::time::sleep(pause.min(RETRY_PAUSE)).await,
        }
    }
}

/// One run of the fair script.
async fn look(
    backend: &RedisBackend,
    key: &LockKey,
    token: &Token,
    ttl: Duration,
) -> Result<CasOutcome, Error> {
    let layout = &backend.inner.layout;
    let (lock, fence, info, wait) = (
        layout.lock(key),
        layout.fence(key),
        layout.info(key),
        layout.wait(key),
    );
    let (queue, alive) = layout.queue(key);
    let keys = [
        lock.as_str(),
        fence.as_str(),
        info.as_str(),
        wait.as_str(),
        queue.as_str(),
        alive.as_str(),
    ];
    let (ttl, keep, q) = (millis(ttl), backend.keep(), backend.quarantine());
    let args = [token.as_str(), &ttl, &keep, &q];
    let sent_at = Instant::now();
    let reply: crate::backend::CasReply = backend.script(&FAIR, &keys, &args).await?;
    backend.saw_clock(sent_at, reply.3);
    outcome(reply)
}

/// A waiter's place; leaving the queue (on drop, unless the key was taken)
/// is spawned on the current runtime. Should that fail or no runtime be
/// left, the place is dropped by the next look of any waiter once its
/// deadline (the TTL) has passed.
struct Place {
    backend: RedisBackend,
    key: LockKey,
    token: Token,
    left: bool,
}

impl Drop for Place {
    fn drop(&mut self) {
        if self.left {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (backend, key, token) = (self.backend.clone(), self.key.clone(), self.token.clone());
        handle.spawn(async move {
            let layout = &backend.inner.layout;
            let (queue, alive) = layout.queue(&key);
            let channel = layout.channel(&key);
            let left: Result<i64, Error> = backend
                .script(&LEAVE, &[&queue, &alive], &[token.as_str(), &channel])
                .await;
            if let Err(e) = left {
                tracing::debug!(error = %e, "could not leave the fair queue; the place ends with its deadline");
            }
        });
    }
}

#[async_trait]
impl FairQueue for RedisBackend {
    /// Waits in the key's queue of places, served in arrival order (see the
    /// [crate docs](crate#fair-queue)): one script per look, a look per
    /// release announcement or a third of the TTL.
    ///
    /// # Cancel safety
    /// A dropped wait spawns the removal of its place on the current
    /// runtime (waking the next waiter when it was the head); should that
    /// fail, or no runtime be left, the place is dropped by another
    /// waiter's look once its deadline (the TTL) has passed. A hold taken
    /// as the future was dropped lives until the manager's owner-checked
    /// delete removes it.
    async fn acquire(&self, key: &LockKey, token: &Token, ttl: Duration) -> Result<Fence, Error> {
        acquire(self, key, token, ttl).await
    }
}

/// `KEYS`: lock, fence, info, wait mark, queue, liveness. `ARGV`: token,
/// ttl ms, fence retention ms (0: forever), restart quarantine ms (0: off).
/// One look at the key's fair queue (see the `fair` module): drops the
/// places whose waiters stopped renewing them; reports the key taken (with
/// its fence) when `token` already holds it (an earlier look whose reply
/// was lost took it); takes the key as [`ACQUIRE`](crate::scripts::ACQUIRE) does when it is free and
/// the queue is empty or headed by `token` (whose place then leaves the
/// queue): a free key with an empty queue costs no place. Otherwise puts
/// `token` at the tail if it has no place, renews its place for `ttl` (at
/// least 500 ms, longer than a look's period), and reports the rest of the
/// restart quarantine, or marks the key waited for and reports the holder
/// and its PTTL, or, when the key is free but another waiter is ahead, no
/// holder and the ms left of the head's place (when a look may drop it).
///
/// Reply: as [`ACQUIRE`](crate::scripts::ACQUIRE).
pub(crate) static FAIR: LazyLock<Lua> = LazyLock::new(|| {
    Lua::compose(&[
        r"
local ttl, keep, q = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
",
        TAKE,
        r"
local token, queue, alive = ARGV[1], KEYS[5], KEYS[6]
local now_ms = math.floor(clock / 1000)
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', alive, '-inf', '(' .. now_ms)) do
  redis.call('ZREM', queue, gone)
  redis.call('ZREM', alive, gone)
end
local cur = redis.call('GET', KEYS[1])
if cur == token then
  redis.call('ZREM', queue, token)
  redis.call('ZREM', alive, token)
  return {1, redis.call('GET', KEYS[2]) or '0', 0, clock}
end
local head = redis.call('ZRANGE', queue, 0, 0)[1]
local left = 0
if not cur and (not head or head == token) then
  left = quarantined()
  if left == 0 then
    if head then
      redis.call('ZREM', queue, token)
      redis.call('ZREM', alive, token)
    end
    return {1, take(KEYS[1], KEYS[2], KEYS[3], token), 0, clock}
  end
end
if not redis.call('ZSCORE', queue, token) then
  local place = clock
  local last = redis.call('ZRANGE', queue, -1, -1, 'WITHSCORES')
  if last[2] and tonumber(last[2]) >= place then
    place = tonumber(last[2]) + 1
  end
  redis.call('ZADD', queue, string.format('%.0f', place), token)
  head = head or token
end
redis.call('ZADD', alive, now_ms + math.max(ttl, 500), token)
if redis.call('PTTL', queue) < 2 * ttl then
  redis.call('PEXPIRE', queue, 2 * ttl)
  redis.call('PEXPIRE', alive, 2 * ttl)
end
if cur then
  local pttl = redis.call('PTTL', KEYS[1])
  mark(KEYS[4], pttl)
  return {0, cur, pttl, clock}
end
if left > 0 then
  return {0, false, left, clock}
end
mark(KEYS[4], ttl)
local until_ms = tonumber(redis.call('ZSCORE', alive, head)) or now_ms
return {0, false, math.max(until_ms - now_ms, 1), clock}
",
    ])
});

/// `KEYS`: queue, liveness. `ARGV`: token, channel. Takes `token`'s place
/// out of the fair queue; when it was the head, announces the new head on
/// the release channel (`fair:<token>`, or `left` when none is left) so it
/// looks at once. Reply: 1.
pub(crate) static LEAVE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"
local head = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if head == ARGV[1] then
  local next = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
  if next then
    redis.call('PUBLISH', ARGV[2], 'fair:' .. next)
  else
    redis.call('PUBLISH', ARGV[2], 'left')
  end
end
return 1
"
        .to_owned(),
    )
});
