//! The Lua scripts. Each runs atomically on the server and touches only the
//! keys of one lock (one hash tag, so one Cluster slot), except
//! [`ACQUIRE_MULTI`], whose keys share one hash tag in Cluster mode. None
//! reads and then writes across round trips.
//!
//! Scripts are sent as `EVALSHA`; when the server's script cache was flushed
//! (`NOSCRIPT`, e.g. after a restart) the same call is repeated as `EVAL`
//! with the source, which also caches it again.

use std::sync::LazyLock;

use redis::{Cmd, ErrorKind, FromRedisValue, Pipeline, RedisResult};

/// What the take scripts share, after their `ttl`, `keep` (fence retention
/// ms, 0: forever) and `q` (restart quarantine ms, 0: off) locals:
///
/// - `mark(wait_key, pttl)`: marks a held key waited for, until 5 s past
///   the hold's expiry. An attempt that finds the key held marks it in the
///   same script, after its waiter subscribed to the key's releases, and a
///   release publishes only when it finds (and deletes) a mark: so a
///   release nobody waits for publishes nothing, and none that a waiter
///   waits for goes unannounced. A waiter looks again by the hold's expiry
///   at the latest (marking again if the hold was renewed), before its
///   mark ends;
/// - `clock`: the server's `TIME` in µs (the clock that judges `PX`
///   expiry), for the reply;
/// - `advance(fence, stored)`: advances the fence key to `max(stored + 1,
///   clock)` and returns its text; `stored` is the key's value when the
///   script has read it already (`false`: absent), `nil` to read it. The
///   fence key is kept forever when `keep` is 0, else for `max(keep, ttl)`
///   ms. Lua numbers are doubles: exact up to 2^53 µs (year 2255);
/// - `take(lock, fence, info, token, stored, described)`: makes `token`
///   hold `lock` for `ttl` with a fresh fence (returned) and no
///   description; `stored` as for `advance`, and `described` `false` when
///   the script knows there is no description to delete.
///
/// Each `redis.call` costs the server about a microsecond on top of its
/// command, as much as a `GET` itself: the scripts read what they need in
/// one `MGET` and delete in one `DEL` where they can.
/// - `quarantined()`: the ms left of the restart quarantine, 0 when it has
///   passed. While the server has been up for less than the quarantine, a
///   free key is not granted and is reported held (no holder) until the
///   quarantine has passed. A restart without persistence loses every
///   hold, and the old holders may still believe they hold; after the
///   quarantine (at least their TTL) their deadlines have passed. It costs
///   one wait per server start, not one per key. `uptime_in_seconds` is the
///   difference of two whole-second clock readings, so it may run up to a
///   second ahead of the true uptime: one second is taken off, and the wait
///   errs on the long side. `INFO` is the dearest command of the script
///   (about half its server time), so `LASTSAVE` is asked first: the server
///   sets it to the clock when it starts and after each save, never
///   earlier, so a last save at least the quarantine (and a second) ago
///   means the server has been up that long, and `INFO` is skipped. A
///   server that saved within the quarantine is asked `INFO` as before.
pub(crate) const TAKE: &str = r"
local function mark(wait_key, pttl)
  redis.call('SET', wait_key, '1', 'PX', math.max(pttl, 0) + 5000)
end
local now_t = redis.call('TIME')
local clock = tonumber(now_t[1]) * 1000000 + tonumber(now_t[2])
local function advance(fence_key, stored)
  if stored == nil then
    stored = redis.call('GET', fence_key)
  end
  local fence = (tonumber(stored) or 0) + 1
  if clock > fence then fence = clock end
  local text = string.format('%.0f', fence)
  if keep > 0 then
    redis.call('SET', fence_key, text, 'PX', math.max(keep, ttl))
  else
    redis.call('SET', fence_key, text)
  end
  return text
end
local function take(lock, fence_key, info, token, stored, described)
  local text = advance(fence_key, stored)
  redis.call('SET', lock, token, 'PX', ttl)
  if described ~= false then
    redis.call('DEL', info)
  end
  return text
end
local function quarantined()
  if q <= 0 then
    return 0
  end
  if clock / 1000 - (tonumber(redis.call('LASTSAVE')) + 1) * 1000 >= q then
    return 0
  end
  local info = redis.call('INFO', 'server')
  local up = ((tonumber(string.match(info, 'uptime_in_seconds:(%d+)')) or 0) - 1) * 1000
  if up < q then
    return q - up
  end
  return 0
end
";

/// `KEYS`: lock, fence, info, wait mark, turns, next. `ARGV`: token, ttl
/// ms, fence retention ms (0: forever), restart quarantine ms (0: off), the
/// backend instance's id, `1` when that instance has a waiter subscribed to
/// the key's releases (else `0`). Takes a free key (SET NX PX in effect)
/// and advances the fence; or reports the holder and its PTTL, marking the
/// key waited for (see [`TAKE`]), or (no holder) the rest of the restart
/// quarantine (see [`TAKE`]).
///
/// Turns: a waiting instance that finds the key held also joins the key's
/// `turns` set, and a release that a waiter marked hands the next turn to
/// one instance of that set, drawn at random and taken out of it (see
/// [`RELEASE`]): the key stays free for it alone for a short while (the
/// `next` key); an instance that takes the key leaves the set. Another
/// instance that finds the key reserved so is told it is held (no holder)
/// for the rest of the turn, marks it and joins the set. So the releaser's
/// next attempt, which reaches the server before any woken waiter's, cannot
/// win the key again and again, and every waiting instance has an equal
/// chance at each hand-off: none starves.
///
/// Reply: `{1, fence, 0, clock}` or `{0, holder or false, pttl, clock}`,
/// `clock` the server's `TIME` in µs (the clock that judges `PX` expiry).
pub(crate) static ACQUIRE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::compose(&[
        r"
local ttl, keep, q = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
",
        TAKE,
        r"
local me, waiting = ARGV[5], ARGV[6] == '1'
local function wait_turn(pttl)
  mark(KEYS[4], pttl)
  if waiting then
    redis.call('SADD', KEYS[5], me)
    redis.call('PEXPIRE', KEYS[5], math.max(pttl, 0) + 5000)
  end
end
local got = redis.call('MGET', KEYS[1], KEYS[6], KEYS[2], KEYS[3])
local cur, next = got[1], got[2]
if cur then
  local pttl = redis.call('PTTL', KEYS[1])
  wait_turn(pttl)
  return {0, cur, pttl, clock}
end
if next and next ~= me then
  local turn = math.max(redis.call('PTTL', KEYS[6]), 1)
  wait_turn(turn)
  return {0, false, turn, clock}
end
local left = quarantined()
if left > 0 then
  return {0, false, left, clock}
end
if next or got[4] then
  redis.call('DEL', KEYS[3], KEYS[6])
end
if waiting then
  redis.call('SREM', KEYS[5], me)
end
return {1, take(KEYS[1], KEYS[2], KEYS[3], ARGV[1], got[3], false), 0, clock}
",
    ])
});

/// `KEYS`: lock, fence, info, wait mark for each key in turn. `ARGV`: token, ttl ms,
/// fence retention ms (0: forever), restart quarantine ms (0: off), `all`
/// or `any`. Each key is judged as [`ACQUIRE`] judges it. `all`: takes
/// every key if all are free, else nothing. `any`: takes the first free
/// key in order.
///
/// Reply: `{1, clock, {{index, fence, 0}, ...}}` for the keys taken, or
/// `{0, clock, {{index, holder or false, pttl}, ...}}` for the busy keys
/// (every busy key; for `any`, every key), indexes from 0.
pub(crate) static ACQUIRE_MULTI: LazyLock<Lua> = LazyLock::new(|| {
    Lua::compose(&[
        r"
local ttl, keep, q = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local all = ARGV[5] == 'all'
",
        TAKE,
        r"
local left
local busy = {}
for i = 1, #KEYS, 4 do
  local n = (i - 1) / 4
  local cur = redis.call('GET', KEYS[i])
  if cur then
    local pttl = redis.call('PTTL', KEYS[i])
    mark(KEYS[i + 3], pttl)
    busy[#busy + 1] = {n, cur, pttl}
  else
    left = left or quarantined()
    if left > 0 then
      busy[#busy + 1] = {n, false, left}
    elseif not all then
      return {1, clock, {{n, take(KEYS[i], KEYS[i + 1], KEYS[i + 2], ARGV[1]), 0}}}
    end
  end
end
if #busy > 0 or not all then
  return {0, clock, busy}
end
local taken = {}
for i = 1, #KEYS, 4 do
  taken[#taken + 1] = {(i - 1) / 4, take(KEYS[i], KEYS[i + 1], KEYS[i + 2], ARGV[1]), 0}
end
return {1, clock, taken}
",
    ])
});

/// `KEYS`: lock, fence, info. `ARGV`: expected, new, ttl ms, fence
/// retention ms (0: forever). When `expected`
/// holds the key: renews it (compare-and-PEXPIRE, same fence) if `new` is
/// `expected`, else hands it to `new` with a new fence. Same reply as
/// [`ACQUIRE`].
///
/// Never creates a lock key that is gone: a renewal of a vanished hold (as
/// after a restart without persistence) is refused, so the holder learns of
/// the loss. A hand-over needs `expected` to hold the key on the server, so
/// the server has not lost it; the restart quarantine has nothing to guard
/// there (and no quarantine key can coexist with a lock key).
pub(crate) static SWAP: LazyLock<Lua> = LazyLock::new(|| {
    Lua::compose(&[
        r"
local ttl, keep, q = tonumber(ARGV[3]), tonumber(ARGV[4]), 0
",
        TAKE,
        r"
local cur = redis.call('GET', KEYS[1])
if cur ~= ARGV[1] then
  return {0, cur, redis.call('PTTL', KEYS[1]), clock}
end
if ARGV[2] == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', KEYS[3], ttl)
  if keep > 0 then
    redis.call('PEXPIRE', KEYS[2], math.max(keep, ttl))
  end
  return {1, redis.call('GET', KEYS[2]) or '0', 0, clock}
end
return {1, take(KEYS[1], KEYS[2], KEYS[3], ARGV[2]), 0, clock}
",
    ])
});

/// `KEYS`: lock, info, wait mark, turns, next, fair queue. `ARGV`: token,
/// channel, turn ms. Compare-and-DEL (the description goes with the
/// hold), then, only when a waiter marked the key (see [`TAKE`]),
/// announces the release: `fair:<token>` when the fair queue has a head
/// (that waiter is woken at once); else it hands the next turn to one
/// waiting instance drawn at random from the turns set, for `turn ms` (see
/// [`ACQUIRE`]), and announces `turn:<instance id>` (that instance's
/// waiters are woken at once); else `released` (everyone is). Whoever is not named is woken a
/// turn later; an instance in the turns that a turn passed over, a turn
/// after the last turn announced, at least every 100 ms (see the `pubsub`
/// module). The instances not drawn stay in
/// the set and the queue keeps its places, and the key stays marked for
/// them, so the next release announces again. Reply: 1 if deleted, else 0.
pub(crate) static RELEASE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"
local got = redis.call('MGET', KEYS[1], KEYS[3])
if got[1] == ARGV[1] then
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
  if got[2] then
    local head = redis.call('ZRANGE', KEYS[6], 0, 0)[1]
    local who = false
    if not head then
      who = redis.call('SPOP', KEYS[4])
    end
    if who then
      redis.call('SET', KEYS[5], who, 'PX', ARGV[3])
    end
    local rest = math.max(redis.call('PTTL', KEYS[4]), redis.call('PTTL', KEYS[6]))
    if rest > 0 then
      redis.call('SET', KEYS[3], '1', 'PX', rest)
    end
    if head then
      redis.call('PUBLISH', ARGV[2], 'fair:' .. head)
    elseif who then
      redis.call('PUBLISH', ARGV[2], 'turn:' .. who)
    else
      redis.call('PUBLISH', ARGV[2], 'released')
    end
  end
  return 1
end
return 0
"
        .to_owned(),
    )
});

/// `KEYS`: lock, info, fence for each hold in turn. `ARGV`: fence
/// retention ms (0: forever), then token and ttl ms for each hold. Renews
/// every hold whose lock key `token` still holds (compare-and-`PEXPIRE`
/// of the lock and its description, and of the fence key when it has a
/// retention), as [`SWAP`] renews one, without creating a key that is gone:
/// three commands per hold and one `TIME` per call.
///
/// Reply: `{clock, {1 or 0 for each hold}}`, `clock` the server's `TIME`
/// in µs.
pub(crate) static RENEW_MANY: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"
local keep = tonumber(ARGV[1])
local now_t = redis.call('TIME')
local clock = tonumber(now_t[1]) * 1000000 + tonumber(now_t[2])
local done = {}
for i = 1, #KEYS, 3 do
  local n = (i - 1) / 3
  local ttl = tonumber(ARGV[3 + 2 * n])
  if redis.call('GET', KEYS[i]) == ARGV[2 + 2 * n] then
    redis.call('PEXPIRE', KEYS[i], ttl)
    redis.call('PEXPIRE', KEYS[i + 1], ttl)
    if keep > 0 then
      redis.call('PEXPIRE', KEYS[i + 2], math.max(keep, ttl))
    end
    done[#done + 1] = 1
  else
    done[#done + 1] = 0
  end
end
return {clock, done}
"
        .to_owned(),
    )
});

/// `KEYS`: fence. `ARGV`: minimum. Lifts the stored fence to `minimum` when it
/// is lower, keeping any expiry it has; later fences exceed it. Reply: 1.
pub(crate) static RAISE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"
local minimum = tonumber(ARGV[1])
local cur = tonumber(redis.call('GET', KEYS[1])) or 0
if minimum > cur then
  redis.call('SET', KEYS[1], string.format('%.0f', minimum), 'KEEPTTL')
end
return 1
"
        .to_owned(),
    )
});

/// `KEYS`: lock, fence, info, wait mark. `ARGV`: `1` to mark a held key
/// waited for as a failed acquire does (see [`TAKE`]: whoever inspects to
/// then wait, as an election's observer does, hears the release), `0` not
/// to. Reply: `{holder, fence, pttl, description}` (nils when free).
pub(crate) static INSPECT: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"
local cur = redis.call('GET', KEYS[1])
if not cur then
  return {false, false, -2, false}
end
local pttl = redis.call('PTTL', KEYS[1])
if ARGV[1] == '1' then
  redis.call('SET', KEYS[4], '1', 'PX', math.max(pttl, 0) + 5000)
end
return {cur, redis.call('GET', KEYS[2]), pttl, redis.call('GET', KEYS[3])}
"
        .to_owned(),
    )
});

/// `KEYS`: lock, info. `ARGV`: token, description. Stores the description
/// for the hold's time left, only if `token` holds the lock (renewals then
/// extend it with the lock; a new hold deletes it). Reply: 1 if stored.
pub(crate) static DESCRIBE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local left = redis.call('PTTL', KEYS[1])
if left <= 0 then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2], 'PX', left)
return 1
"
        .to_owned(),
    )
});

/// A script with its source, for `EVALSHA` with an `EVAL` fallback.
pub(crate) struct Lua {
    source: String,
    hash: String,
}

impl Lua {
    /// The script made of `parts`, in order.
    pub(crate) fn compose(parts: &[&str]) -> Self {
        Self::new(parts.concat())
    }

    pub(crate) fn new(source: String) -> Self {
        let hash = redis::Script::new(&source).get_hash().to_owned();
        Self { source, hash }
    }

    /// `EVALSHA` (or `EVAL` when `by_source`) of this script.
    pub(crate) fn cmd(&self, by_source: bool, keys: &[&str], args: &[&str]) -> Cmd {
        let (name, script) = match by_source {
            true => ("EVAL", self.source.as_str()),
            false => ("EVALSHA", self.hash.as_str()),
        };
        let data: usize = keys.iter().chain(args).map(|a| a.len()).sum();
        let mut cmd = Cmd::with_capacity(3 + keys.len() + args.len(), data + script.len() + 16);
        cmd.arg(name)
            .arg(script)
            .arg(keys.len())
            .arg(keys)
            .arg(args);
        cmd
    }

    /// Runs the script once, falling back to `EVAL` on `NOSCRIPT`.
    pub(crate) async fn run<T, C>(
        &self,
        conn: &mut C,
        keys: &[&str],
        args: &[&str],
    ) -> RedisResult<T>
    where
        T: FromRedisValue,
        C: redis::aio::ConnectionLike + Send,
    {
        match self.cmd(false, keys, args).query_async(conn).await {
            Err(e) if e.kind() == ErrorKind::NoScriptError => {
                self.cmd(true, keys, args).query_async(conn).await
            }
            other => other,
        }
    }
}

/// Runs a pipeline built by `build(by_source)`, rebuilding it with `EVAL`
/// when the script cache was flushed.
pub(crate) async fn run_pipeline<T, C>(
    conn: &mut C,
    build: impl Fn(bool) -> Pipeline,
) -> RedisResult<T>
where
    T: FromRedisValue,
    C: redis::aio::ConnectionLike + Send,
{
    match build(false).query_async(conn).await {
        Err(e) if e.kind() == ErrorKind::NoScriptError => build(true).query_async(conn).await,
        other => other,
    }
}
