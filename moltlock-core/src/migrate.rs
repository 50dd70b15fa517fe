//! Moving a live fleet from one store to another with no window in which two
//! nodes both hold a lock.
//!
//! A [`MigratingBackend`] sits over an old and a new backend and follows a
//! [`Phase`]. A fleet rolls through the phases one step at a time — every
//! node reaches a phase before any node moves to the next:
//!
//! | phase | a node acquires | its fence |
//! |---|---|---|
//! | [`Phase::Old`] | the old store only | the old store's |
//! | [`Phase::Both`] | the old store, then the new one; if the new one is held, it releases the old one and tries again later | the larger of the two, after lifting the other store's fences above it |
//! | [`Phase::New`] | the new store only | the new store's |
//!
//! **Why adjacent phases are safe.** `Old` and `Both` nodes all take the old
//! store's lock, and `Both` and `New` nodes all take the new store's, so two
//! nodes in adjacent phases always contend on a common store. Every `Both`
//! node takes the two locks in the same order (old first) and gives up the
//! first when the second is busy, so no two nodes wait for each other.
//!
//! **Why nodes two phases apart are not.** An `Old` node and a `New` node
//! share no store: both can hold the "same" lock at once. Never let a fleet
//! hold `Old` and `New` nodes at the same time; the tests show them
//! overlapping.
//!
//! **Fences.** A `Both` node reports `max(old fence, new fence)` and, before
//! returning, raises the other store's fence minimum for the key
//! ([`RaiseFence`]) above it. So every later fence from either store
//! exceeds every fence reported before: fences never go backwards for the
//! resource, whichever phases its writers are in. Both stores must hand out
//! [`Backend::fence_raiser`].
//!
//! In `Old` and `New` the migrating backend is exactly the store that
//! decides: the same limits and the same extensions (a fair queue
//! included).
//!
//! Rolling back is the same steps in reverse (`New` → `Both` → `Old`), each
//! safe for the same reasons.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use crate::forward::require;
use crate::{
    Backend, CasOutcome, Describe, Error, FairQueue, Fence, Held, Inspect, Limits, LockKey,
    RaiseFence, ReleaseWatch, RenewItem, RenewMany, Token, Watch,
};

/// Where a node stands in a migration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Lock in the old store only (where the fleet starts).
    Old,
    /// Lock in both stores, old first.
    Both,
    /// Lock in the new store only (where the fleet ends).
    New,
}

impl std::str::FromStr for Phase {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s.to_ascii_lowercase().as_str() {
            "old" => Ok(Self::Old),
            "both" => Ok(Self::Both),
            "new" => Ok(Self::New),
            other => Err(Error::Config(format!(
                "unknown migration phase {other:?}: use old, both or new"
            ))),
        }
    }
}

/// A backend over an old and a new store that locks according to a [`Phase`].
#[derive(Clone)]
pub struct MigratingBackend {
    old: Arc<dyn Backend>,
    new: Arc<dyn Backend>,
    phase: Phase,
    busy: Arc<BusySide>,
}

/// Which store refused the last `Both` attempt on each key, so a waiter
/// waits for a release on that store. A waiter facing a holder on the new
/// store gives its old-store hold back, and that delete's own release event
/// must not wake it (it would try again at once, in a loop).
#[derive(Default)]
struct BusySide {
    on_new: Mutex<HashSet<LockKey>>,
}

impl BusySide {
    fn set(&self, key: &LockKey, on_new: bool) {
        let mut keys = match self.on_new.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        if on_new {
            keys.insert(key.clone());
        } else {
            keys.remove(key);
        }
    }

    fn on_new(&self, key: &LockKey) -> bool {
        match self.on_new.lock() {
            Ok(g) => g.contains(key),
            Err(poisoned) => poisoned.into_inner().contains(key),
        }
    }
}

/// A `Both`-phase waiter's watch: on the store that refused its last attempt.
struct BothWatch {
    key: LockKey,
    busy: Arc<BusySide>,
    old: Option<Box<dyn ReleaseWatch>>,
    new: Option<Box<dyn ReleaseWatch>>,
}

#[async_trait]
impl ReleaseWatch for BothWatch {
    async fn released(&mut self, held: &Held) -> Result<(), Error> {
        let watch = if self.busy.on_new(&self.key) {
            self.new.as_mut()
        } else {
            self.old.as_mut()
        };
        match watch {
            Some(w) => w.released(held).await,
            // No notifications from that store: the manager's retry delay
            // wakes the waiter.
            None => std::future::pending().await,
        }
    }
}

impl std::fmt::Debug for MigratingBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MigratingBackend")
            .field("old", &self.old.name())
            .field("new", &self.new.name())
            .field("phase", &self.phase)
            .finish()
    }
}

impl MigratingBackend {
    /// Composes `old` and `new` in `phase`.
    ///
    /// # Errors
    /// [`Error::Config`] when a store cannot raise its fences (monotonic
    /// fences across the switch need it).
    pub fn new(old: Arc<dyn Backend>, new: Arc<dyn Backend>, phase: Phase) -> Result<Self, Error> {
        for store in [&old, &new] {
            if store.fence_raiser().is_none() {
                return Err(Error::Config(format!(
                    "the {} backend cannot raise its fences, which a migration needs to keep \
                     fences monotonic",
                    store.name()
                )));
            }
        }
        Ok(Self {
            old,
            new,
            phase,
            busy: Arc::default(),
        })
    }

    /// The phase this node is in.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The old store.
    pub fn old(&self) -> &Arc<dyn Backend> {
        &self.old
    }

    /// The new store.
    pub fn new_store(&self) -> &Arc<dyn Backend> {
        &self.new
    }

    /// The store that decides in a single-store phase.
    fn single(&self) -> Option<&Arc<dyn Backend>> {
        match self.phase {
            Phase::Old => Some(&self.old),
            Phase::New => Some(&self.new),
            Phase::Both => None,
        }
    }

    async fn acquire_both(
        &self,
        key: &LockKey,
        token: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error> {
        let old_fence = match self.old.cas(key, None, token, ttl).await? {
            CasOutcome::Acquired { fence } => fence,
            held => {
                self.busy.set(key, false);
                return Ok(held);
            }
        };
        let second = self.new.cas(key, None, token, ttl).await;
        let new_fence = match second {
            Ok(CasOutcome::Acquired { fence }) => fence,
            other => {
                self.busy.set(key, matches!(other, Ok(CasOutcome::Held(_))));
                self.old.delete(key, token).await?;
                return other;
            }
        };
        self.busy.set(key, false);
        let fence = old_fence.max(new_fence);
        let lower = if old_fence < new_fence {
            &self.old
        } else {
            &self.new
        };
        let raised = crate::BackendExt::raise_fence(&**lower, key, fence).await;
        if let Err(e) = raised {
            self.delete(key, token).await?;
            return Err(e);
        }
        Ok(CasOutcome::Acquired { fence })
    }
}

fn both_held(a: &CasOutcome, b: &CasOutcome) -> bool {
    matches!(a, CasOutcome::Acquired { .. }) && matches!(b, CasOutcome::Acquired { .. })
}

#[async_trait]
impl Backend for MigratingBackend {
    async fn cas(
        &self,
        key: &LockKey,
        expected: Option<&Token>,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error> {
        if let Some(store) = self.single() {
            return store.cas(key, expected, new, ttl).await;
        }
        if expected.is_none() {
            return self.acquire_both(key, new, ttl).await;
        }
        let a = self.old.cas(key, expected, new, ttl).await?;
        let b = self.new.cas(key, expected, new, ttl).await?;
        match (both_held(&a, &b), a) {
            (true, CasOutcome::Acquired { fence }) => Ok(CasOutcome::Acquired { fence }),
            _ => Ok(CasOutcome::Held(Held::default())),
        }
    }

    async fn delete(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        if let Some(store) = self.single() {
            return store.delete(key, owner).await;
        }
        let new = self.new.delete(key, owner).await;
        let old = self.old.delete(key, owner).await?;
        Ok(new? || old)
    }

    fn name(&self) -> &'static str {
        "migrating"
    }

    fn limits(&self) -> Limits {
        match self.single() {
            Some(store) => store.limits(),
            None => self.old.limits().both(self.new.limits()),
        }
    }

    fn earliest_expiry(
        &self,
        ttl: Duration,
        sent_at: tokio::time::Instant,
    ) -> tokio::time::Instant {
        match self.single() {
            Some(store) => store.earliest_expiry(ttl, sent_at),
            None => self
                .old
                .earliest_expiry(ttl, sent_at)
                .min(self.new.earliest_expiry(ttl, sent_at)),
        }
    }

    /// The single store's clock readings; none in `Both` (two clocks).
    fn store_clock(&self) -> Option<&crate::StoreClock> {
        self.single()?.store_clock()
    }

    /// In `Both`, waits on the store that refused the last attempt (the old
    /// one, unless the new one was held).
    fn watcher(&self) -> Option<&dyn Watch> {
        match self.single() {
            Some(store) => store.watcher(),
            None if self.old.watcher().is_some() || self.new.watcher().is_some() => Some(self),
            None => None,
        }
    }

    /// In `Both`, the old store's (where every node still locks).
    fn inspector(&self) -> Option<&dyn Inspect> {
        self.single().unwrap_or(&self.old).inspector()
    }

    /// In `Both`, one batch on each store when both can.
    fn renewer(&self) -> Option<&dyn RenewMany> {
        match self.single() {
            Some(store) => store.renewer(),
            None if self.old.renewer().is_some() && self.new.renewer().is_some() => Some(self),
            None => None,
        }
    }

    /// In `Both`, on the old store (where `inspect` reads).
    fn describer(&self) -> Option<&dyn Describe> {
        self.single().unwrap_or(&self.old).describer()
    }

    fn fence_raiser(&self) -> Option<&dyn RaiseFence> {
        match self.single() {
            Some(store) => store.fence_raiser(),
            None => Some(self),
        }
    }

    /// Only in `Old` and `New`: two queues cannot hand a key out in one order.
    fn fair_queue(&self) -> Option<&dyn FairQueue> {
        self.single()?.fair_queue()
    }

    /// Only in `Old` and `New`; in `Both`, one `cas` per key (each on both
    /// stores).
    fn batch_cas(&self) -> Option<&dyn crate::CasMulti> {
        self.single()?.batch_cas()
    }
}

#[async_trait]
impl Watch for MigratingBackend {
    async fn watch(&self, key: &LockKey) -> Result<Box<dyn ReleaseWatch>, Error> {
        let old = open_watch(&*self.old, key).await?;
        let new = open_watch(&*self.new, key).await?;
        Ok(Box::new(BothWatch {
            key: key.clone(),
            busy: self.busy.clone(),
            old,
            new,
        }))
    }
}

async fn open_watch(
    store: &dyn Backend,
    key: &LockKey,
) -> Result<Option<Box<dyn ReleaseWatch>>, Error> {
    match store.watcher() {
        Some(w) => w.watch(key).await.map(Some),
        None => Ok(None),
    }
}

#[async_trait]
impl RenewMany for MigratingBackend {
    async fn renew_many(&self, items: &[RenewItem]) -> Result<Vec<bool>, Error> {
        let old = require(self.old.name(), self.old.renewer(), "batch renewal")?;
        let new = require(self.new.name(), self.new.renewer(), "batch renewal")?;
        let a = old.renew_many(items).await?;
        let b = new.renew_many(items).await?;
        Ok(a.iter().zip(&b).map(|(x, y)| *x && *y).collect())
    }
}

#[async_trait]
impl RaiseFence for MigratingBackend {
    async fn raise_fence(&self, key: &LockKey, minimum: Fence) -> Result<(), Error> {
        for store in [&self.old, &self.new] {
            require(store.name(), store.fence_raiser(), "raising fences")?
                .raise_fence(key, minimum)
                .await?;
        }
        Ok(())
    }
}
