//! The waiters of one key inside one manager queue here, first come first
//! served. Only the head of a key's queue talks to the store, and a release
//! by this manager wakes the head alone, so a process is one contender per
//! key however many of its tasks wait, and its tasks take turns in the
//! order they asked.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{Notify, OwnedMutexGuard};

use crate::{LockKey, ReleaseWatch};

/// A release watch per key of a waiting acquisition (`None`: it polls).
pub(crate) type Watches = Vec<Option<Box<dyn ReleaseWatch>>>;

/// A future that resolves when a hold of the key by this manager ended.
pub(crate) type Freed<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// Every key some task of this manager waits for: its queue, and how many
/// wait in it (counted under the map's lock, so the last to leave removes
/// it, and a newcomer never makes a second queue of a key).
#[derive(Default)]
pub(crate) struct Queues {
    keys: Mutex<HashMap<LockKey, (Arc<KeyQueue>, usize)>>,
}

/// The waiters of one key.
struct KeyQueue {
    /// Held by the head. It keeps the key's release watch, handed from
    /// head to head, so the store sees one subscription per key.
    turn: Arc<tokio::sync::Mutex<Watches>>,
    /// Told when a hold of the key by this manager ended: its delete was
    /// answered, or it was lost.
    freed: Notify,
}

/// A waiter's place in its key's queue. Dropping it leaves the queue; the
/// queue goes once nobody is in it.
pub(crate) struct Place<'a> {
    queues: &'a Queues,
    key: LockKey,
    queue: Arc<KeyQueue>,
}

impl Queues {
    fn map(&self) -> MutexGuard<'_, HashMap<LockKey, (Arc<KeyQueue>, usize)>> {
        match self.keys.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Takes a place at the end of `key`'s queue.
    pub(crate) fn join(&self, key: &LockKey) -> Place<'_> {
        let mut map = self.map();
        let (queue, waiters) = map.entry(key.clone()).or_insert_with(|| {
            let queue = KeyQueue {
                turn: Arc::new(tokio::sync::Mutex::new(Vec::new())),
                freed: Notify::new(),
            };
            (Arc::new(queue), 0)
        });
        *waiters += 1;
        Place {
            queues: self,
            key: key.clone(),
            queue: queue.clone(),
        }
    }

    /// A hold of `key` by this manager ended: the head, if one waits, tries
    /// at once.
    pub(crate) fn freed(&self, key: &LockKey) {
        if let Some((queue, _)) = self.map().get(key) {
            queue.freed.notify_waiters();
        }
    }

    /// Tells `key`'s head when dropped: at the end of a release, also one
    /// whose future was dropped before the store answered.
    pub(crate) fn told_at_end<'a>(&'a self, key: &'a LockKey) -> ToldAtEnd<'a> {
        ToldAtEnd { queues: self, key }
    }

    /// Runs `release` (a delete of `key`) and tells `key`'s head once the
    /// delete has been sent: its first poll has returned, so on a backend
    /// whose requests are in order ([`Limits::in_order`](crate::Limits))
    /// the head's attempt follows the delete instead of a round trip later.
    pub(crate) async fn told_once_sent<T>(
        &self,
        key: &LockKey,
        release: impl Future<Output = T>,
    ) -> T {
        let mut release = std::pin::pin!(release);
        let mut sent = false;
        std::future::poll_fn(|cx| {
            let out = release.as_mut().poll(cx);
            if out.is_pending() && !sent {
                sent = true;
                self.freed(key);
            }
            out
        })
        .await
    }

    /// How many keys have waiters now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.map().len()
    }
}

impl Place<'_> {
    /// The key waited for.
    pub(crate) fn key(&self) -> &LockKey {
        &self.key
    }

    /// Waits until every waiter ahead has left: the head's turn, with the
    /// key's release watch (empty until the first head opens it).
    pub(crate) async fn turn(&self) -> OwnedMutexGuard<Watches> {
        self.queue.turn.clone().lock_owned().await
    }

    /// Resolves at the next end of a hold of the key by this manager;
    /// listening from the call on, so an end before the first poll counts.
    pub(crate) fn freed(&self) -> Freed<'_> {
        let mut notified = Box::pin(self.queue.freed.notified());
        notified.as_mut().enable();
        notified
    }
}

/// Tells its key's head when dropped ([`Queues::told_at_end`]).
pub(crate) struct ToldAtEnd<'a> {
    queues: &'a Queues,
    key: &'a LockKey,
}

impl Drop for ToldAtEnd<'_> {
    fn drop(&mut self) {
        self.queues.freed(self.key);
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let mut map = self.queues.map();
        if let Some((_, waiters)) = map.get_mut(&self.key) {
            *waiters = waiters.saturating_sub(1);
            if *waiters == 0 {
                map.remove(&self.key);
            }
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
        drop(first);
        assert_eq!(queues.len(), 1, "the queue went while a waiter was in it");
        let turn = tokio::time::timeout(Duration::from_millis(20), second.turn()).await;
        assert!(turn.is_ok(), "the next waiter did not get the turn");
        drop(turn);
        drop(second);
        assert_eq!(queues.len(), 0, "the queue outlived its waiters");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiters_leaving_at_once_leave_no_queue_behind() {
        let queues = Arc::new(Queues::default());
        let key = LockKey::new("k").unwrap();
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (queues, key) = (queues.clone(), key.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..2_000 {
                    let place = queues.join(&key);
                    tokio::task::yield_now().await;
                    drop(place);
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(queues.len(), 0, "a queue outlived its waiters");
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
