//! Revocation of another holder, and reentrancy scoped to an explicit owner
//! handle (never to a thread or a task, which async code moves between).

use std::collections::HashMap;
use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use crate::guard::LockGuard;
use crate::manager::LockManager;
use crate::{Error, HolderInfo, LockKey};

impl LockManager {
    /// Removes whoever holds `key` now: reads the holder, then deletes by
    /// that holder's token, so it never removes a newer holder that took
    /// the key in between. The victim's [`lost`](LockGuard::lost) fires at
    /// its next renewal (within a third of its TTL), and its fence stops
    /// its late writes at any fenced resource. Returns the holder removed,
    /// or `None` when the key was free (or changed hands meanwhile).
    ///
    /// Any valid key can be revoked, a primitive's derived slot keys
    /// included (`moltlock status` lists them).
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the backend cannot inspect holds;
    /// [`Error::InvalidKey`]; store errors.
    pub async fn revoke(&self, key: impl AsRef<str>) -> Result<Option<HolderInfo>, Error> {
        let key = LockKey::new(key.as_ref())?;
        key.check_len(self.inner().limits.max_key_len)?;
        let backend = self.backend();
        let inspector = crate::forward::require(backend.name(), backend.inspector(), "inspect")?;
        let Some(holder) = inspector.inspect(&key).await? else {
            return Ok(None);
        };
        if backend.delete(&key, &holder.holder).await? {
            tracing::info!(%key, fence = ?holder.fence, "revoked the holder");
            Ok(Some(holder))
        } else {
            Ok(None)
        }
    }

    /// Asks the current holder of `key` to release it, and returns that
    /// holder (`None` when nobody holds the key, or its holder changed
    /// while asking: ask again to reach the new one). Unlike
    /// [`revoke`](Self::revoke) it takes nothing away: the holder's
    /// [`LockGuard::release_requested`](crate::LockGuard::release_requested) resolves at its next renewal, and
    /// the holder decides when to let go. The request is meant for that
    /// one hold: a later holder of the key does not see it.
    ///
    /// The holder hears of it only while it listens (it called
    /// `release_requested`, as `moltlock run` of one plain key does). The
    /// request lives about as long as the hold has left, which the
    /// holder's next renewal falls within; a holder that heard it removes
    /// it when it releases.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the backend cannot inspect holds;
    /// [`Error::InvalidKey`] for a bad or reserved key, or one too long for
    /// its request key; store errors.
    pub async fn request_release(&self, key: impl AsRef<str>) -> Result<Option<HolderInfo>, Error> {
        let key = self.user_key(
            key.as_ref(),
            crate::ask::ASK.len() + crate::RESERVED_MARK.len(),
        )?;
        let backend = self.backend();
        let inspector = crate::forward::require(backend.name(), backend.inspector(), "inspect")?;
        let Some(holder) = inspector.inspect(&key).await? else {
            return Ok(None);
        };
        let ttl = crate::ask::ask_ttl(&holder, self.inner().limits.min_ttl);
        if !crate::ask::post(backend.as_ref(), &key, &holder.holder, ttl).await? {
            return Ok(None);
        }
        tracing::info!(%key, fence = ?holder.fence, "asked the holder to release");
        Ok(Some(holder))
    }

    /// A handle whose locks are reentrant: locking a key it already holds
    /// returns another counted guard on the same hold, without touching the
    /// store. The store is touched on the first acquire and the last
    /// release only. Reentrancy belongs to the handle, not to a thread or a
    /// task: clone the handle to share it, make another for a separate
    /// owner (two handles exclude each other as two managers do).
    pub fn owner(&self) -> Owner {
        Owner {
            manager: self.clone(),
            holds: Arc::new(Mutex::new(HashMap::new())),
            gates: Arc::new(Mutex::new(HashMap::new())),
        }
    }
}

/// One owner's reentrant locks ([`LockManager::owner`]). Cheap to clone;
/// clones are the same owner.
#[derive(Clone)]
pub struct Owner {
    manager: LockManager,
    holds: Arc<Mutex<HashMap<LockKey, Weak<LockGuard>>>>,
    /// One acquisition at a time per key, so two first locks of one key by
    /// the same owner do not both go to the store.
    gates: Arc<Mutex<HashMap<LockKey, Arc<tokio::sync::Mutex<()>>>>>,
}

impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Owner")
            .field("held", &self.held_count())
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

impl Owner {
    /// Waits for `key`, or joins this owner's hold of it: the guard counts
    /// one use of the hold, and the key is released when the last guard
    /// goes. A hold that was lost is not joined: the key is acquired anew.
    ///
    /// # Errors
    /// As [`LockManager::lock`].
    pub async fn lock(&self, key: impl AsRef<str>) -> Result<OwnedGuard, Error> {
        let key = LockKey::new(key.as_ref())?;
        if let Some(guard) = self.join(&key) {
            return Ok(guard);
        }
        let gate = self.gate(&key);
        let _turn = gate.lock().await;
        if let Some(guard) = self.join(&key) {
            return Ok(guard);
        }
        let guard = Arc::new(self.manager.lock(key.as_str()).await?);
        lock(&self.holds).insert(key, Arc::downgrade(&guard));
        Ok(OwnedGuard { guard })
    }

    /// How many keys this owner holds.
    pub fn held_count(&self) -> usize {
        let mut holds = lock(&self.holds);
        holds.retain(|_, w| w.strong_count() > 0);
        holds.len()
    }

    fn join(&self, key: &LockKey) -> Option<OwnedGuard> {
        let holds = lock(&self.holds);
        let guard = holds.get(key)?.upgrade()?;
        guard.is_held().then_some(OwnedGuard { guard })
    }

    fn gate(&self, key: &LockKey) -> Arc<tokio::sync::Mutex<()>> {
        let mut gates = lock(&self.gates);
        gates.retain(|_, g| Arc::strong_count(g) > 1);
        gates.entry(key.clone()).or_default().clone()
    }
}

/// One use of an [`Owner`]'s hold. Reads as the [`LockGuard`] it shares;
/// the hold is released when the last of its guards is released or
/// dropped.
#[must_use = "dropping the last guard of a hold releases the lock"]
pub struct OwnedGuard {
    guard: Arc<LockGuard>,
}

impl fmt::Debug for OwnedGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedGuard")
            .field("guard", &*self.guard)
            .field("uses", &Arc::strong_count(&self.guard))
            .finish()
    }
}

impl Deref for OwnedGuard {
    type Target = LockGuard;
    fn deref(&self) -> &LockGuard {
        &self.guard
    }
}

impl OwnedGuard {
    /// How many guards share this hold now.
    pub fn uses(&self) -> usize {
        Arc::strong_count(&self.guard)
    }

    /// Ends this use; the last one releases the hold (as
    /// [`LockGuard::release`]), the others only count down.
    ///
    /// # Errors
    /// As [`LockGuard::release`], for the last use.
    pub async fn release(self) -> Result<(), Error> {
        match Arc::try_unwrap(self.guard) {
            Ok(guard) => guard.release().await,
            Err(_shared) => Ok(()),
        }
    }
}
