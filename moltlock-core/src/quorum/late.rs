//! A quorum member whose store was down when the quorum was made.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::clock::{lock, StepListener};
use crate::{
    Backend, CasOutcome, Describe, Error, Fence, HolderInfo, Inspect, Limits, LockKey, RaiseFence,
    RenewItem, RenewMany, StoreClock, Token, Turns,
};

/// Opens a member's store: what [`LateMember`] calls until it succeeds.
pub type ConnectMember = Arc<
    dyn Fn() -> Pin<Box<dyn Future<Output = Result<Arc<dyn Backend>, Error>> + Send>> + Send + Sync,
>;

/// How long a failed connection keeps a member from trying again.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// [`LateMember::turns`] values: nothing asked yet, on, off.
const TURNS_UNSET: u8 = 0;
const TURNS_ON: u8 = 1;
const TURNS_OFF: u8 = 2;

/// How long one connection attempt may take.
const CONNECT_WAIT: Duration = Duration::from_secs(5);

/// A [`QuorumBackend`](crate::QuorumBackend) member whose store could not
/// be reached when the quorum was made, so the quorum starts while a
/// minority of its stores is down. Until its store answers it answers
/// every request [`Error::Unavailable`] (a member that grants nothing:
/// safe, it only takes its vote away); a request at least a second after
/// the last failed attempt tries to connect again (in the background of
/// that one request; the others do not wait), and from then on it is the
/// store's own backend.
///
/// Its [`limits`](Backend::limits) are the ones it was made with (the
/// manager reads limits once), so give it the store's: a store that
/// refuses a TTL or key the limits allow only takes its vote away.
pub struct LateMember {
    name: &'static str,
    limits: Limits,
    connect: ConnectMember,
    member: OnceLock<Arc<dyn Backend>>,
    next_try: Mutex<Instant>,
    trying: tokio::sync::Mutex<()>,
    clock: Arc<StoreClock>,
    relay: OnceLock<Arc<StepListener>>,
    /// The [`Turns`] choice asked of it, for its store's backend.
    turns: AtomicU8,
}

impl std::fmt::Debug for LateMember {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LateMember")
            .field("name", &self.name)
            .field("connected", &self.member.get().is_some())
            .finish()
    }
}

impl LateMember {
    /// A member named `name` (its store's backend name) with the store's
    /// `limits`, opened by `connect` once its store answers.
    pub fn new(name: &'static str, limits: Limits, connect: ConnectMember) -> Self {
        Self {
            name,
            limits,
            connect,
            member: OnceLock::new(),
            next_try: Mutex::new(Instant::now()),
            trying: tokio::sync::Mutex::new(()),
            clock: Arc::new(StoreClock::new()),
            relay: OnceLock::new(),
            turns: AtomicU8::new(TURNS_UNSET),
        }
    }

    /// Whether its store has been reached.
    pub fn is_connected(&self) -> bool {
        self.member.get().is_some()
    }

    fn down(&self, why: &str) -> Error {
        Error::unavailable(self.name, format!("this quorum member's store {why}"))
    }

    /// The store's backend, connecting first when it is time to try.
    async fn get(&self) -> Result<&Arc<dyn Backend>, Error> {
        if let Some(m) = self.member.get() {
            return Ok(m);
        }
        let due = *lock(&self.next_try) <= Instant::now();
        let Some(_turn) = due.then(|| self.trying.try_lock().ok()).flatten() else {
            return Err(self.down("has not been reached yet"));
        };
        if let Some(m) = self.member.get() {
            return Ok(m);
        }
        match tokio::time::timeout(CONNECT_WAIT, (self.connect)()).await {
            Ok(Ok(backend)) => Ok(self.connected(backend)),
            failed => {
                *lock(&self.next_try) = Instant::now() + RETRY_AFTER;
                let why = match &failed {
                    Ok(Err(e)) => format!("is still unreachable: {e}"),
                    _ => format!("did not answer within {CONNECT_WAIT:?}"),
                };
                match &failed {
                    Ok(Err(e)) if !matches!(e, Error::Unavailable { .. }) => {
                        tracing::warn!(member = self.name, %why, "quorum member refuses to connect");
                    }
                    _ => tracing::debug!(member = self.name, %why, "quorum member still down"),
                }
                Err(self.down(&why))
            }
        }
    }

    /// Keeps `backend` and passes its clock's steps on, and the choice of
    /// [`Turns`] made before it was reached.
    fn connected(&self, backend: Arc<dyn Backend>) -> &Arc<dyn Backend> {
        let member = self.member.get_or_init(|| backend);
        // After the member is set: a choice made meanwhile finds it.
        if let (Some(t), Some(on)) = (member.turns(), self.turns_wanted()) {
            t.set_turns(on);
        }
        if let Some(member_clock) = member.store_clock() {
            let _ = self.relay.set(StoreClock::relay(&self.clock, member_clock));
        }
        tracing::info!(member = self.name, "quorum member reached");
        member
    }

    fn turns_wanted(&self) -> Option<bool> {
        match self.turns.load(Ordering::SeqCst) {
            TURNS_ON => Some(true),
            TURNS_OFF => Some(false),
            _ => None,
        }
    }

    fn unsupported(&self, what: &'static str) -> Error {
        Error::Unsupported {
            backend: self.name,
            what,
        }
    }
}

#[async_trait]
impl Backend for LateMember {
    async fn cas(
        &self,
        key: &LockKey,
        expected: Option<&Token>,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error> {
        self.get().await?.cas(key, expected, new, ttl).await
    }

    async fn delete(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        self.get().await?.delete(key, owner).await
    }

    fn name(&self) -> &'static str {
        self.name
    }

    fn limits(&self) -> Limits {
        self.limits
    }

    fn earliest_expiry(&self, ttl: Duration, sent_at: Instant) -> Instant {
        match self.member.get() {
            Some(m) => m.earliest_expiry(ttl, sent_at),
            None => sent_at + ttl,
        }
    }

    fn store_clock(&self) -> Option<&StoreClock> {
        Some(&self.clock)
    }

    fn inspector(&self) -> Option<&dyn Inspect> {
        Some(self)
    }

    fn fence_raiser(&self) -> Option<&dyn RaiseFence> {
        Some(self)
    }

    fn renewer(&self) -> Option<&dyn RenewMany> {
        Some(self)
    }

    fn describer(&self) -> Option<&dyn Describe> {
        Some(self)
    }

    fn turns(&self) -> Option<&dyn Turns> {
        Some(self)
    }
}

impl Turns for LateMember {
    /// Passes the choice on to the store's backend, now if it has been
    /// reached, else once it is.
    fn set_turns(&self, on: bool) {
        let wanted = if on { TURNS_ON } else { TURNS_OFF };
        self.turns.store(wanted, Ordering::SeqCst);
        if let Some(t) = self.member.get().and_then(|m| m.turns()) {
            t.set_turns(on);
        }
    }
}

#[async_trait]
impl RenewMany for LateMember {
    async fn renew_many(&self, items: &[RenewItem]) -> Result<Vec<bool>, Error> {
        let m = self.get().await?;
        match m.renewer() {
            Some(r) => r.renew_many(items).await,
            None => crate::forward::renew_each(&**m, items).await,
        }
    }
}

#[async_trait]
impl Describe for LateMember {
    async fn describe(&self, key: &LockKey, owner: &Token, text: &str) -> Result<bool, Error> {
        let m = self.get().await?;
        let describer = m.describer().ok_or_else(|| self.unsupported("describe"))?;
        describer.describe(key, owner, text).await
    }
}

#[async_trait]
impl Inspect for LateMember {
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        let m = self.get().await?;
        let inspector = m.inspector().ok_or_else(|| self.unsupported("inspect"))?;
        inspector.inspect(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<HolderInfo>, Error> {
        let m = self.get().await?;
        let inspector = m.inspector().ok_or_else(|| self.unsupported("list"))?;
        inspector.list(prefix).await
    }
}

#[async_trait]
impl RaiseFence for LateMember {
    async fn raise_fence(&self, key: &LockKey, minimum: Fence) -> Result<(), Error> {
        let m = self.get().await?;
        let raiser = m
            .fence_raiser()
            .ok_or_else(|| self.unsupported("raise_fence"))?;
        raiser.raise_fence(key, minimum).await
    }
}
