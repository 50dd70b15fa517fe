//! The waiters of one key inside one manager queue here, first come first
//! served. Only the head of a key's queue talks to the store, and a release
//! by this manager wakes the head alone, so a process is one contender per
//! key however many of its tasks wait, and its tasks take turns in the
//! order they asked.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{Notify, OwnedMutexGuard};

use crate::{LockKey, ReleaseWatch};

/// A release watch per key of a waiting acquisition (`None`: it polls).
pub(crate) type Watches = Vec<Option<Box<dyn ReleaseWatch>>>;

/// A future that resolves when a hold of the key by this manager ended.
pub(crate) type Freed<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// Every key some task of this manager waits for.
#[derive(Default)]
pub(crate) struct Queues {
    keys: Mutex<HashMap<LockKey, Arc<KeyQueue>>>,
}

/// The waiters of one key.
struct KeyQueue {
    /// Held by the head. It keeps the key's release watch, handed from
    /// head to head, so the store sees one subscription per key.
    turn: Arc<tokio::sync::Mutex<Watches>>,
    /// Told when a hold of the key by this manager ended: its delete was
    /// answered, or it was lost.
    freed: Notify,
    /// The id of the hold the last head took (0: none).
    holder: AtomicU64,
}

/// A waiter's place in its key's queue. Dropping it leaves the queue; the
/// queue goes once nobody is in it.
pub(crate) struct Place<'a> {
    queues: &'a Queues,
    key: LockKey,
    queue: Arc<KeyQueue>,
}

impl Queues {
    fn map(&self) -> MutexGuard<'_, HashMap<LockKey, Arc<KeyQueue>>> {
        match self.keys.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Takes a place at the end of `key`'s queue.
    pub(crate) fn join(&self, key: &LockKey) -> Place<'_> {
        let queue = self
            .map()
            .entry(key.clone())
            .or_insert_with(|| {
                Arc::new(KeyQueue {
                    turn: Arc::new(tokio::sync::Mutex::new(Vec::new())),
                    freed: Notify::new(),
                    holder: AtomicU64::new(0),
                })
            })
            .clone();
        Place {
            queues: self,
            key: key.clone(),
            queue,
        }
    }

    /// A hold of `key` by this manager ended: the head, if one waits, tries
    /// at once.
    pub(crate) fn freed(&self, key: &LockKey) {
        if let Some(queue) = self.map().get(key) {
            queue.freed.notify_waiters();
        }
    }

    /// How many keys have waiters now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.map().len()
    }
}

impl Place<'_> {
    /// Waits until every waiter ahead has left: the head's turn, with the
    /// key's release watch (empty until the first head opens it).
    pub(crate) async fn turn(&self) -> OwnedMutexGuard<Watches> {
        self.queue.turn.clone().lock_owned().await
    }

    /// The head took hold `id`: the heads after it wait for its end here,
    /// not at the store.
    pub(crate) fn took(&self, id: u64) {
        self.queue.holder.store(id, Ordering::Release);
    }

    /// The hold the last head took, if any.
    pub(crate) fn holder(&self) -> Option<u64> {
        match self.queue.holder.load(Ordering::Acquire) {
            0 => None,
            id => Some(id),
        }
    }

    /// Forgets the last head's hold (it ended).
    pub(crate) fn clear(&self) {
        self.queue.holder.store(0, Ordering::Release);
    }

    /// Resolves at the next end of a hold of the key by this manager;
    /// listening from the call on, so an end before the first poll counts.
    pub(crate) fn freed(&self) -> Freed<'_> {
        let mut notified = Box::pin(self.queue.freed.notified());
        notified.as_mut().enable();
        notified
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let mut map = self.queues.map();
        // The map's reference and ours: nobody else is in the queue.
        if Arc::strong_count(&self.queue) <= 2 {
            map.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[tokio::test]
    async fn a_queue_goes_with_its_last_waiter_and_keeps_its_order() {
        let queues = Queues::default();
        let key = LockKey::new("k").unwrap();
        let first = queues.join(&key);
        let second = queues.join(&key);
        let head = first.turn().await;
        let waiting = tokio::time::timeout(Duration::from_millis(20), second.turn()).await;
        assert!(
            waiting.is_err(),
            "the second waiter got the turn while the head had it"
        );
        drop(head);
        first.took(7);
        assert_eq!(
            second.holder(),
            Some(7),
            "the next head does not see the hold taken"
        );
        drop(first);
        assert_eq!(queues.len(), 1, "the queue went while a waiter was in it");
        let _turn = second.turn().await;
        drop(_turn);
        drop(second);
        assert_eq!(queues.len(), 0, "the queue outlived its waiters");
    }

    #[tokio::test]
    async fn freed_counts_an_end_before_the_first_poll() {
        let queues = Queues::default();
        let key = LockKey::new("k").unwrap();
        let place = queues.join(&key);
        let freed = place.freed();
        queues.freed(&key);
        tokio::time::timeout(Duration::from_millis(100), freed)
            .await
            .unwrap();
    }

    use std::time::Duration;
}
