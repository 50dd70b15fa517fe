//! The guards of the primitives built on several holds: a held slot (a
//! semaphore's permit, a read lock), a multi-lock and a write lock.

use std::fmt;
use std::ops::Deref;
use std::time::Duration;

use crate::guard::LockGuard;
use crate::sets::first_of;
use crate::{Error, Fence, LockKey, LostReason};

/// One held slot of a semaphore ([`Permit`]) or of a read-write lock's
/// readers ([`ReadGuard`]): an ordinary hold, renewed while the guard
/// lives, with its own fence, [`lost`](LockGuard::lost) signal and
/// deadline (all through `Deref` to its [`LockGuard`]). Fences rise per
/// slot, not across slots.
#[must_use = "dropping the guard gives the slot back at once"]
#[clippy::has_significant_drop]
pub struct SlotGuard {
    guard: LockGuard,
    slot: u32,
}

/// A semaphore's permit.
pub type Permit = SlotGuard;

/// A shared (read) hold of a read-write lock.
pub type ReadGuard = SlotGuard;

impl fmt::Debug for SlotGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotGuard")
            .field("slot", &self.slot)
            .field("guard", &self.guard)
            .finish()
    }
}

impl SlotGuard {
    pub(crate) fn new(guard: LockGuard, slot: u32) -> Self {
        Self { guard, slot }
    }

    /// Which slot is held (0-based, below the permit count).
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// The hold behind the slot.
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// Stops renewal and gives the slot back (owner-checked).
    ///
    /// # Cancel safety
    /// As [`LockGuard::release`].
    ///
    /// # Errors
    /// As [`LockGuard::release`].
    pub async fn release(self) -> Result<(), Error> {
        self.guard.release().await
    }
}

impl Deref for SlotGuard {
    type Target = LockGuard;
    fn deref(&self) -> &LockGuard {
        &self.guard
    }
}

/// Several keys held together ([`LockManager::lock_all`](crate::LockManager::lock_all)),
/// in bytewise key order. Valid while every hold is; dropped, it gives
/// every key back in the background.
#[must_use = "dropping the guard releases every key at once"]
#[clippy::has_significant_drop]
pub struct MultiGuard {
    guards: Vec<LockGuard>,
}

impl fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(&self.guards).finish()
    }
}

impl MultiGuard {
    pub(crate) fn new(guards: Vec<LockGuard>) -> Self {
        Self { guards }
    }

    /// The holds, in key order.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// The keys held, in bytewise order.
    pub fn keys(&self) -> Vec<&LockKey> {
        self.guards.iter().map(LockGuard::key).collect()
    }

    /// Each key's fence, in key order: pass each to the resource its key guards.
    pub fn fences(&self) -> Vec<(&LockKey, Fence)> {
        self.guards.iter().map(|g| (g.key(), g.fence())).collect()
    }

    /// Whether every hold is still valid in this process's view.
    pub fn is_held(&self) -> bool {
        self.guards.iter().all(LockGuard::is_held)
    }

    /// Time left before the earliest local validity deadline; `None` once
    /// any hold is not held.
    pub fn valid_for(&self) -> Option<Duration> {
        self.guards
            .iter()
            .map(LockGuard::valid_for)
            .try_fold(Duration::MAX, |least, left| Some(least.min(left?)))
    }

    /// Every fence, if every hold is still valid; use it right before a write.
    ///
    /// # Errors
    /// [`Error::Lost`] for the first hold lost or past its deadline.
    pub fn check(&self) -> Result<Vec<Fence>, Error> {
        self.guards.iter().map(LockGuard::check).collect()
    }

    /// Resolves when the first hold is lost, with its key and why.
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes; call it again to keep waiting.
    pub async fn lost(&self) -> (LockKey, LostReason) {
        let waits = self
            .guards
            .iter()
            .map(|g| {
                Box::pin(async move { (g.key().clone(), g.lost().await) })
                    as crate::sets::Pinned<'_, _>
            })
            .collect();
        first_of(waits).await
    }

    /// Releases every key, last key first; every key is released even when
    /// one fails.
    ///
    /// # Cancel safety
    /// Each hold leaves renewal when its turn comes; dropping the future
    /// releases the rest in the background.
    ///
    /// # Errors
    /// The first failure ([`Error::NotHeld`] for a key that had expired or
    /// was taken over).
    pub async fn release(mut self) -> Result<(), Error> {
        let mut first = Ok(());
        while let Some(g) = self.guards.pop() {
            let done = g.release().await;
            if first.is_ok() {
                first = done;
            }
        }
        first
    }
}

impl Drop for MultiGuard {
    fn drop(&mut self) {
        while let Some(g) = self.guards.pop() {
            drop(g);
        }
    }
}

/// The exclusive (write) hold of a read-write lock: its writer key and
/// every reader slot. Its [`fence`](Self::fence) (the writer key's)
/// strictly increases from writer to writer.
#[must_use = "dropping the guard releases the write lock at once"]
#[clippy::has_significant_drop]
pub struct WriteGuard {
    readers: MultiGuard,
    writer: LockGuard,
}

impl fmt::Debug for WriteGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteGuard")
            .field("writer", &self.writer)
            .finish_non_exhaustive()
    }
}

impl WriteGuard {
    pub(crate) fn new(writer: LockGuard, readers: MultiGuard) -> Self {
        Self { readers, writer }
    }

    /// The fencing token: strictly greater for every new writer.
    pub fn fence(&self) -> Fence {
        self.writer.fence()
    }

    /// The writer key's hold.
    pub fn writer(&self) -> &LockGuard {
        &self.writer
    }

    /// Whether the writer key and every reader slot are still held.
    pub fn is_held(&self) -> bool {
        self.writer.is_held() && self.readers.is_held()
    }

    /// Time left before the earliest local validity deadline.
    pub fn valid_for(&self) -> Option<Duration> {
        Some(self.writer.valid_for()?.min(self.readers.valid_for()?))
    }

    /// The fence, if every hold is still valid; use it right before a write.
    ///
    /// # Errors
    /// [`Error::Lost`] once any hold is lost or past its deadline.
    pub fn check(&self) -> Result<Fence, Error> {
        self.readers.check()?;
        self.writer.check()
    }

    /// Resolves when the first hold is lost, with its key and why.
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    pub async fn lost(&self) -> (LockKey, LostReason) {
        tokio::select! {
            reason = self.writer.lost() => (self.writer.key().clone(), reason),
            lost = self.readers.lost() => lost,
        }
    }

    /// Releases the reader slots, then the writer key.
    ///
    /// # Cancel safety
    /// As [`MultiGuard::release`].
    ///
    /// # Errors
    /// The first failure.
    pub async fn release(self) -> Result<(), Error> {
        let Self { readers, writer } = self;
        let first = readers.release().await;
        let last = writer.release().await;
        first.and(last)
    }
}
