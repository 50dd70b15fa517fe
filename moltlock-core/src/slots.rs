//! Slot keys: the N derived keys of a semaphore or of a read-write lock's
//! readers. Each slot is a mutex, so at most N holds exist at once while
//! every client uses the same N.

use crate::manager::LockManager;
use crate::{Error, HolderInfo, LockKey, RESERVED_MARK};

/// The most permits a semaphore (or readers a read-write lock) may have.
pub const MAX_PERMITS: u32 = 1024;

/// The slots of one primitive: `name#~<kind><i>` for `i` in `0..n`.
#[derive(Clone, Debug)]
pub(crate) struct SlotSet {
    name: LockKey,
    kind: &'static str,
    keys: Vec<LockKey>,
}

impl SlotSet {
    /// The `n` slots of `kind` under `name` (already checked as a caller's key).
    pub(crate) fn new(name: LockKey, kind: &'static str, n: u32) -> Result<Self, Error> {
        if n == 0 || n > MAX_PERMITS {
            return Err(Error::Config(format!(
                "{n} permits for {name:?}: the count must be 1 to {MAX_PERMITS}"
            )));
        }
        let keys = (0..n).map(|i| name.derive(&format!("{kind}{i}"))).collect();
        Ok(Self { name, kind, keys })
    }

    /// The primitive's name.
    pub(crate) fn name(&self) -> &LockKey {
        &self.name
    }

    /// Every slot key, slot 0 first.
    pub(crate) fn keys(&self) -> &[LockKey] {
        &self.keys
    }

    /// How many slots there are.
    pub(crate) fn count(&self) -> u32 {
        u32::try_from(self.keys.len()).unwrap_or(MAX_PERMITS)
    }

    /// The slot keys from a random start, so clients spread over the slots
    /// instead of all trying slot 0 first.
    pub(crate) fn rotated(&self) -> Vec<LockKey> {
        let start = fastrand::usize(..self.keys.len().max(1));
        let mut keys = self.keys.clone();
        keys.rotate_left(start);
        keys
    }

    /// The prefix every slot key of this set starts with.
    fn prefix(&self) -> String {
        format!("{}{RESERVED_MARK}{}", self.name, self.kind)
    }

    /// The slot number of a key of this set (also past this client's count).
    pub(crate) fn slot_of(&self, key: &str) -> Option<u32> {
        key.strip_prefix(&self.prefix())?.parse().ok()
    }

    /// The live holds on this set's slots (and on any slot past this
    /// client's count), where the backend can list.
    pub(crate) async fn in_use(&self, mgr: &LockManager) -> Result<Vec<HolderInfo>, Error> {
        let backend = mgr.backend();
        let lister = crate::forward::require(backend.name(), backend.inspector(), "list")?;
        let mut held = lister.list(&self.prefix()).await?;
        held.retain(|h| self.slot_of(&h.key).is_some());
        Ok(held)
    }

    /// [`Error::LimitMismatch`] when a slot at or past this client's count is
    /// held (another client uses a larger count). Without listing, nothing
    /// can be seen and the check passes.
    pub(crate) async fn check_limit(&self, mgr: &LockManager) -> Result<(), Error> {
        if mgr.backend().inspector().is_none() {
            return Ok(());
        }
        let n = self.count();
        let held = match self.in_use(mgr).await {
            Ok(held) => held,
            Err(e) => {
                tracing::debug!(name = %self.name, error = %e, "the permit count could not be checked");
                return Ok(());
            }
        };
        for h in held {
            if let Some(seen) = self.slot_of(&h.key).filter(|s| *s >= n) {
                return Err(Error::LimitMismatch {
                    key: self.name.to_string(),
                    permits: n,
                    seen,
                });
            }
        }
        Ok(())
    }
}
