//! The pending-delete ledger: owner-checked deletes asked for but not
//! confirmed (failed, timed out or dropped mid-request).
//!
//! Their keys hang on this session's lease, which further use of the
//! session keeps alive, so every acquisition and renewal round first
//! retries them. Each entry is flagged while a request for it is in flight,
//! so two callers never send the same delete at once.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use moltlock_core::{LockKey, Token};

/// The most unconfirmed deletes remembered; past it, holds live until the
/// session ends.
const MAX_PENDING: usize = 4096;

type Item = (LockKey, Token);

/// `(key, owner)` → whether a request for that delete is in flight.
#[derive(Default)]
pub(crate) struct Pending(Mutex<HashMap<Item, bool>>);

impl Pending {
    fn map(&self) -> MutexGuard<'_, HashMap<Item, bool>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a delete about to be sent, as in flight.
    pub(crate) fn begin(&self, key: &LockKey, owner: &Token) -> Claim<'_> {
        let item = (key.clone(), owner.clone());
        let mut map = self.map();
        if map.len() < MAX_PENDING {
            map.insert(item.clone(), true);
        }
        Claim {
            ledger: self,
            item,
            settled: false,
        }
    }

    /// Claims every recorded delete that nobody is sending now.
    pub(crate) fn idle(&self) -> Vec<Claim<'_>> {
        let mut map = self.map();
        map.iter_mut()
            .filter(|(_, busy)| !**busy)
            .map(|(item, busy)| {
                *busy = true;
                Claim {
                    ledger: self,
                    item: item.clone(),
                    settled: false,
                }
            })
            .collect()
    }
}

/// A delete in flight. [`settle`](Claim::settle) removes it from the
/// ledger; dropped unsettled (an error, or a dropped future), it goes back
/// to the ledger as idle, for the next flush.
pub(crate) struct Claim<'a> {
    ledger: &'a Pending,
    item: Item,
    settled: bool,
}

impl Claim<'_> {
    /// The lock key of the delete.
    pub(crate) fn key(&self) -> &LockKey {
        &self.item.0
    }

    /// The owner the delete checks.
    pub(crate) fn owner(&self) -> &Token {
        &self.item.1
    }

    /// etcd answered the delete: it is no longer pending.
    pub(crate) fn settle(mut self) {
        self.settled = true;
        self.ledger.map().remove(&self.item);
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        if let Some(busy) = self.ledger.map().get_mut(&self.item) {
            *busy = false;
        }
    }
}
