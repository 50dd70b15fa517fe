//! `impl Backend for RedisBackend`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use moltlock_core::{
    async_trait, check_ttl, hand_out, Backend, CasOutcome, Error, Fence, Held, Limits, LockKey,
    StoreClock, Token, Turns,
};
use redis::{Client, RedisResult};
use tokio::sync::OnceCell;
use tokio::time::Instant;

use crate::config::{Mode, RedisConfig};
use crate::conn::{self, Conn};
use crate::error::{bad_reply, map, timed_out, NAME};
use crate::keys::{Layout, FENCE, INFO, WAIT};
use crate::pubsub::{Notifier, TURN};
use crate::scripts::{self, ACQUIRE, RELEASE, SWAP};

/// The shortest TTL this backend accepts.
pub const MIN_TTL: Duration = Duration::from_millis(10);

/// The store's limits.
pub(crate) const LIMITS: Limits = Limits::new()
    .with_min_ttl(MIN_TTL)
    .with_max_key_len(moltlock_core::MAX_KEY_LEN);

/// A script's reply: `(1, fence, _)` when taken or renewed, `(0, holder, pttl)`
/// when someone else holds the key.
/// Status, fence or holder, PTTL, and the server's clock in µs.
pub(crate) type CasReply = (i64, Option<String>, i64, i64);

/// Locks on Redis (one server or a Cluster).
///
/// Cheap to clone: clones share one command connection (which reconnects
/// by itself) and one pub/sub connection (opened on the first wait).
#[derive(Clone)]
pub struct RedisBackend {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) conn: Conn,
    pub(crate) layout: Layout,
    pub(crate) cfg: RedisConfig,
    pub(crate) clients: Vec<Client>,
    pub(crate) notifier: OnceCell<Notifier>,
    /// The server's clock, as replies report it (single-server mode only:
    /// the nodes of a Cluster each have a clock of their own, and a reply
    /// does not say which node sent it).
    pub(crate) clock: StoreClock,
    /// This instance's id, named in the turns of a key (see the `ACQUIRE`
    /// script).
    pub(crate) me: String,
    /// Whether this instance's waiters take turns (see [`RedisBackend::set_turns`]).
    pub(crate) turns: AtomicBool,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("config", &self.inner.cfg)
            .finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// Connects with `cfg`.
    ///
    /// On one server it then caches the release script (one request,
    /// bounded by the request timeout; a failure there is left to the
    /// first release).
    ///
    /// # Errors
    /// [`Error::Unavailable`] when no server answers within the connect
    /// timeout, [`Error::Auth`] for refused credentials, [`Error::Config`]
    /// for unusable TLS material.
    ///
    /// # Cancel safety
    /// Dropping the future drops the half-open connection.
    pub async fn connect(cfg: RedisConfig) -> Result<Self, Error> {
        cfg.check()?;
        let clients = conn::clients(&cfg)?;
        let conn = conn::connect(&cfg, &clients).await?;
        Ok(Self::assemble(cfg, clients, conn).cache_release().await)
    }

    /// A backend over the application's own client (one server): its
    /// connection settings (address, credentials, database, TLS) are the
    /// client's; `cfg` gives the rest (key prefix, timeouts, fence
    /// retention, restart quarantine). The backend opens its own command
    /// and pub/sub connections from the client, so the application's
    /// connections are never shared with lock traffic.
    ///
    /// # Errors
    /// [`Error::Config`] for a cluster configuration or bad settings, else
    /// as [`RedisBackend::connect`].
    ///
    /// # Cancel safety
    /// Dropping the future drops the half-open connection.
    pub async fn from_client(client: Client, cfg: RedisConfig) -> Result<Self, Error> {
        cfg.check()?;
        if cfg.mode == Mode::Cluster {
            return Err(Error::config(
                "from_client takes a single-server client; connect a cluster with connect()",
            ));
        }
        let clients = vec![client];
        let conn = conn::connect(&cfg, &clients).await?;
        Ok(Self::assemble(cfg, clients, conn).cache_release().await)
    }

    /// A backend over the application's own Redis Cluster client: lock
    /// commands go through a connection of `client` (its seeds,
    /// credentials, TLS and timeouts). `cfg` must be a cluster
    /// configuration (`redis+cluster://…`) and gives the rest; its nodes
    /// carry only the release notifications (a cluster delivers a publish
    /// to every node, so one reachable node is enough).
    ///
    /// # Errors
    /// [`Error::Config`] for a single-server configuration or bad settings,
    /// else as [`RedisBackend::connect`].
    ///
    /// # Cancel safety
    /// Dropping the future drops the half-open connection.
    pub async fn from_cluster_client(
        client: redis::cluster::ClusterClient,
        cfg: RedisConfig,
    ) -> Result<Self, Error> {
        cfg.check()?;
        if cfg.mode != Mode::Cluster {
            return Err(Error::config(
                "from_cluster_client takes a cluster configuration (redis+cluster://…); \
                 use from_client for one server",
            ));
        }
        let clients = conn::clients(&cfg)?;
        let conn = conn::cluster_of(&cfg, &client).await?;
        Ok(Self::assemble(cfg, clients, conn))
    }

    fn assemble(cfg: RedisConfig, clients: Vec<Client>, conn: Conn) -> Self {
        let layout = Layout::new(&cfg.prefix);
        let inner = Inner {
            conn,
            layout,
            cfg,
            clients,
            notifier: OnceCell::new(),
            clock: StoreClock::new(),
            me: Token::random().as_str().to_owned(),
            turns: AtomicBool::new(true),
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    /// Parses `url` (see [`RedisConfig::from_url`]) and connects.
    ///
    /// # Errors
    /// [`Error::Config`] for a bad URL, else as [`RedisBackend::connect`].
    pub async fn from_url(url: &str) -> Result<Self, Error> {
        Self::connect(RedisConfig::from_url(url)?).await
    }

    /// The configuration in use.
    pub fn config(&self) -> &RedisConfig {
        &self.inner.cfg
    }

    /// Runs one script with the command timeout.
    pub(crate) async fn script<T: redis::FromRedisValue>(
        &self,
        lua: &scripts::Lua,
        keys: &[&str],
        args: &[&str],
    ) -> Result<T, Error> {
        let mut conn = self.inner.conn.clone();
        self.timed(lua.run(&mut conn, keys, args)).await
    }

    /// The release script for the stored lock key `lock` and `owner`:
    /// 1 when it deleted the hold.
    async fn release(&self, lock: &str, owner: &str) -> Result<i64, Error> {
        let (info, wait) = (Layout::beside(lock, INFO), Layout::beside(lock, WAIT));
        let (turns, next) = Layout::turns(lock);
        let queue = Layout::queue_of(lock);
        let turn = millis(TURN);
        self.script(
            &RELEASE,
            &[lock, &info, &wait, &turns, &next, &queue],
            &[owner, Layout::channel_of(lock), &turn],
        )
        .await
    }

    /// Caches the release script on the server (one server only), so a
    /// release is one `EVALSHA` from the first: a `NOSCRIPT` reply would
    /// send it again as `EVAL` behind the requests sent after it, and
    /// releases are in order ([`Limits::in_order`]) only while the script
    /// is cached. The release of a key nobody holds changes nothing; a
    /// failure here shows again at the first real request.
    async fn cache_release(self) -> Self {
        if self.inner.cfg.mode != Mode::Single {
            return self;
        }
        let Ok(key) = LockKey::new("moltlock-release-script") else {
            return self;
        };
        let lock = self.inner.layout.lock(&key);
        if let Err(e) = self.release(&lock, "-").await {
            tracing::debug!(error = %e, "the release script was not cached at connect");
        }
        self
    }

    /// Bounds a request by the command timeout and maps its error.
    pub(crate) async fn timed<T>(
        &self,
        fut: impl std::future::Future<Output = RedisResult<T>>,
    ) -> Result<T, Error> {
        tokio::time::timeout(self.inner.cfg.request_timeout, fut)
            .await
            .map_err(|_| timed_out("a Redis command"))?
            .map_err(map)
    }

    /// The fence retention argument of the scripts (ms; 0: forever).
    pub(crate) fn keep(&self) -> String {
        self.inner
            .cfg
            .fence_retention
            .map_or_else(|| "0".to_owned(), millis)
    }

    /// The restart quarantine argument of the acquire script (ms; 0: off).
    pub(crate) fn quarantine(&self) -> String {
        self.inner
            .cfg
            .restart_quarantine
            .map_or_else(|| "0".to_owned(), millis)
    }

    pub(crate) fn check(&self, key: &LockKey, ttl: Duration) -> Result<(), Error> {
        key.check_len(LIMITS.max_key_len)?;
        check_ttl(ttl, LIMITS.min_ttl)
    }

    /// A new hold may not outlive the restart quarantine: after a restart
    /// without persistence its holder may believe it holds for up to its
    /// TTL, so a shorter quarantine would grant the key beside it.
    pub(crate) fn check_quarantine(&self, ttl: Duration) -> Result<(), Error> {
        match self.inner.cfg.restart_quarantine {
            Some(q) if ttl > q => Err(Error::InvalidTtl {
                ttl,
                reason: format!(
                    "the Redis restart quarantine is {q:?}, shorter than this TTL: after a \
                     restart another client could be granted the key while this holder still \
                     believes it holds it; raise restart_quarantine to at least the TTL, \
                     or turn it off (restart_quarantine=0s) for a durable Redis"
                ),
            }),
            _ => Ok(()),
        }
    }

    /// Whether a waiter of this instance is subscribed to `channel` (a key's
    /// release channel, named like its stored lock key).
    fn waits_for(&self, channel: &str) -> bool {
        self.inner
            .notifier
            .get()
            .is_some_and(|n| n.waits_for(channel))
    }

    /// Notes whether this instance is in the turns of `channel` (its
    /// waiting attempt joined them, or it took the key and left them).
    fn joined(&self, channel: &str, joined: bool) {
        if let Some(n) = self.inner.notifier.get() {
            n.joined(channel, joined);
        }
    }

    pub(crate) async fn notifier(&self) -> &Notifier {
        self.inner
            .notifier
            .get_or_init(|| async {
                Notifier::start(
                    self.inner.clients.clone(),
                    self.inner.layout.channel_pattern(),
                    self.inner.cfg.connect_timeout,
                    self.inner.me.clone(),
                )
            })
            .await
    }

    /// Feeds a reply's server clock (µs since the epoch) to the store clock.
    pub(crate) fn saw_clock(&self, sent_at: Instant, clock_us: i64) {
        let us = u64::try_from(clock_us).unwrap_or(0);
        self.inner.clock.observe(sent_at, Duration::from_micros(us));
    }
}

/// A TTL in whole milliseconds for `PX`, rounded up: the server never
/// holds a key for less than asked.
pub(crate) fn millis(ttl: Duration) -> String {
    ttl.as_nanos().div_ceil(1_000_000).max(1).to_string()
}

pub(crate) fn parse_fence(text: Option<String>) -> Result<Fence, Error> {
    text.as_deref()
        .and_then(|t| t.parse::<u64>().ok())
        .map(Fence)
        .ok_or_else(|| bad_reply(format!("fence {text:?}")))
}

pub(crate) fn expires_in(pttl: i64) -> Option<Duration> {
    u64::try_from(pttl).ok().map(Duration::from_millis)
}

pub(crate) fn outcome(reply: CasReply) -> Result<CasOutcome, Error> {
    match reply {
        (1, fence, _, _) => Ok(CasOutcome::Acquired {
            fence: parse_fence(fence)?,
        }),
        (0, holder, pttl, _) => Ok(CasOutcome::Held(Held {
            holder: holder.map(Token::from_stored),
            expires_in: expires_in(pttl),
            revision: None,
        })),
        (other, _, _, _) => Err(bad_reply(format!("status {other}"))),
    }
}

#[async_trait]
impl Backend for RedisBackend {
    /// One script, one round trip: takes a free key and advances its fence
    /// (`expected == None`), renews it (`expected == Some(new)`), or hands
    /// it over. A failed attempt reports the holder and its PTTL; a key in
    /// restart quarantine is reported held with no holder and the
    /// quarantine's PTTL.
    ///
    /// Cancel safe in the manager's sense: a dropped call may still land;
    /// the manager then deletes the hold by its token.
    async fn cas(
        &self,
        key: &LockKey,
        expected: Option<&Token>,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error> {
        self.check(key, ttl)?;
        if expected.is_none() {
            self.check_quarantine(ttl)?;
        }
        let lock = self.inner.layout.lock(key);
        let (fence, ttl) = (Layout::beside(&lock, FENCE), millis(ttl));
        let (info, wait) = (Layout::beside(&lock, INFO), Layout::beside(&lock, WAIT));
        let keep = self.keep();
        let sent_at = Instant::now();
        let reply: CasReply = match expected {
            None => {
                let (turns, next) = Layout::turns(&lock);
                let keys = [&lock, &fence, &info, &wait, &turns, &next];
                let takes_turns = self.inner.turns.load(Ordering::Relaxed);
                let waiting = if takes_turns && self.waits_for(&lock) {
                    "1"
                } else {
                    "0"
                };
                let me = &self.inner.me;
                let args = [new.as_str(), &ttl, &keep, &self.quarantine(), me, waiting];
                let reply: CasReply = self
                    .script(&ACQUIRE, &keys.map(String::as_str), &args)
                    .await?;
                if waiting == "1" {
                    self.joined(&lock, reply.0 == 0);
                }
                reply
            }
            Some(old) => {
                let keys = [&lock, &fence, &info, &wait].map(String::as_str);
                let args = [old.as_str(), new.as_str(), &ttl, &keep];
                self.script(&SWAP, &keys, &args).await?
            }
        };
        self.saw_clock(sent_at, reply.3);
        outcome(reply)
    }

    /// Compare-and-DEL in one script; a successful delete publishes on the
    /// key's release channel when a waiter marked the key.
    async fn delete(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        key.check_len(LIMITS.max_key_len)?;
        let done = self
            .release(&self.inner.layout.lock(key), owner.as_str())
            .await?;
        Ok(done == 1)
    }

    fn name(&self) -> &'static str {
        NAME
    }

    fn store_clock(&self) -> Option<&StoreClock> {
        (self.inner.cfg.mode == Mode::Single).then_some(&self.inner.clock)
    }

    /// One server's requests share one connection, in order (the release
    /// script is cached at connect; after a restart that flushed it, one
    /// release may land behind the request sent after it: a wasted
    /// attempt, not a safety matter); a cluster's go to several.
    fn limits(&self) -> Limits {
        LIMITS.with_in_order(self.inner.cfg.mode == Mode::Single)
    }

    hand_out!(Watch, Inspect, RenewMany, Describe, RaiseFence, FairQueue, CasMulti, Turns);
}

impl Turns for RedisBackend {
    /// Whether this instance's waiters take turns (on by default): a
    /// release that waiting instances marked keeps the key briefly for one
    /// of them, drawn at random, so no process starves (see the crate
    /// docs). A [`QuorumBackend`](moltlock_core::QuorumBackend) turns it
    /// off on its members: a turn decided by one member alone would split
    /// the members' votes.
    fn set_turns(&self, on: bool) {
        self.inner.turns.store(on, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ttl_in_millis_is_rounded_up() {
        assert_eq!(millis(Duration::from_millis(2000)), "2000");
        assert_eq!(millis(Duration::from_micros(1_999_600)), "2000");
        assert_eq!(millis(Duration::from_nanos(1_000_000_001)), "1001");
        assert_eq!(millis(Duration::from_nanos(1)), "1");
    }
}
