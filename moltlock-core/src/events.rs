//! Release events per key, for backends whose store pushes notifications
//! (pub/sub, LISTEN/NOTIFY) over one shared connection.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;

use crate::{Error, Held, ReleaseWatch};

/// A generation counter per key. A waiter subscribes *before* its acquire
/// attempt; a release heard afterwards bumps the counter, so the waiter sees
/// it even if it arrived before the waiter started waiting.
#[derive(Default)]
pub struct KeyEvents {
    keys: Mutex<HashMap<String, watch::Sender<u64>>>,
    /// The keys with a [`fire_later`](Self::fire_later) pending.
    later: Mutex<HashSet<String>>,
}

impl KeyEvents {
    /// No subscribers yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn with_keys<T>(&self, f: impl FnOnce(&mut HashMap<String, watch::Sender<u64>>) -> T) -> T {
        match self.keys.lock() {
            Ok(mut g) => f(&mut g),
            Err(poisoned) => f(&mut poisoned.into_inner()),
        }
    }

    /// A watch that resolves on the next [`fire`](Self::fire) of `key` (or
    /// [`fire_all`](Self::fire_all)). The key is forgotten when its last
    /// watch is dropped.
    pub fn subscribe(self: &Arc<Self>, key: &str) -> Box<dyn ReleaseWatch> {
        let rx = self.with_keys(|keys| {
            keys.entry(key.to_owned())
                .or_insert_with(|| watch::Sender::new(0))
                .subscribe()
        });
        Box::new(EventWatch {
            rx,
            events: Arc::downgrade(self),
            key: key.to_owned(),
        })
    }

    /// How many keys have a watch.
    pub fn watched(&self) -> usize {
        self.with_keys(|keys| keys.len())
    }

    /// Wakes every waiter of `key`.
    pub fn fire(&self, key: &str) {
        self.with_keys(|keys| {
            if let Some(tx) = keys.get(key) {
                tx.send_modify(|n| *n = n.wrapping_add(1));
                if tx.receiver_count() == 0 {
                    keys.remove(key);
                }
            }
        });
    }

    /// Wakes every waiter of `key` once `after` has passed, on a task of
    /// the current runtime; a call while one is pending for `key` adds
    /// nothing, so waiters told later are woken at most once per `after`.
    /// Nothing happens when nobody waits for `key` or no runtime runs.
    pub fn fire_later(self: &Arc<Self>, key: &str, after: Duration) {
        if !self.with_keys(|keys| keys.contains_key(key)) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let fresh = match self.later.lock() {
            Ok(mut g) => g.insert(key.to_owned()),
            Err(poisoned) => poisoned.into_inner().insert(key.to_owned()),
        };
        if !fresh {
            return;
        }
        let (events, key) = (self.clone(), key.to_owned());
        runtime.spawn(async move {
            tokio::time::sleep(after).await;
            match events.later.lock() {
                Ok(mut g) => g.remove(&key),
                Err(poisoned) => poisoned.into_inner().remove(&key),
            };
            events.fire(&key);
        });
    }

    /// Wakes every waiter of every key (after a reconnect, when events may
    /// have been missed), and forgets keys nobody waits for.
    pub fn fire_all(&self) {
        self.with_keys(|keys| {
            keys.retain(|_, tx| {
                tx.send_modify(|n| *n = n.wrapping_add(1));
                tx.receiver_count() > 0
            });
        });
    }
}

struct EventWatch {
    rx: watch::Receiver<u64>,
    events: Weak<KeyEvents>,
    key: String,
}

impl Drop for EventWatch {
    /// Forgets the key when this is its last watch (checked under the
    /// map's lock, which every new watch takes too): waiters' keys (a fair
    /// waiter's is named by its token) do not pile up.
    fn drop(&mut self) {
        let Some(events) = self.events.upgrade() else {
            return;
        };
        events.with_keys(|keys| {
            if keys
                .get(&self.key)
                .is_some_and(|tx| tx.receiver_count() <= 1)
            {
                keys.remove(&self.key);
            }
        });
    }
}

#[async_trait]
impl ReleaseWatch for EventWatch {
    async fn released(&mut self, _held: &Held) -> Result<(), Error> {
        if self.rx.changed().await.is_err() {
            // Nobody can fire any more: leave it to the retry delay.
            std::future::pending::<()>().await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::time::{timeout, Instant};

    use super::KeyEvents;
    use crate::Held;

    const AFTER: Duration = Duration::from_millis(20);

    #[tokio::test(start_paused = true)]
    async fn a_later_fire_wakes_once_after_its_delay() {
        let events = Arc::new(KeyEvents::new());
        let mut w = events.subscribe("k");
        let start = Instant::now();
        events.fire_later("k", AFTER);
        tokio::time::sleep(AFTER / 4).await;
        events.fire_later("k", AFTER);
        assert!(w.released(&Held::default()).await.is_ok());
        assert!(start.elapsed() >= AFTER, "woken before the delay");
        let again = timeout(AFTER * 3, w.released(&Held::default())).await;
        assert!(
            again.is_err(),
            "two later fires within one delay woke twice"
        );
        events.fire_later("k", AFTER);
        let third = timeout(AFTER * 2, w.released(&Held::default())).await;
        assert!(
            third.is_ok(),
            "a later fire after the first had run was dropped"
        );
    }

    #[test]
    fn a_key_is_forgotten_with_its_last_watch() {
        let events = Arc::new(KeyEvents::new());
        let (a, b) = (events.subscribe("k"), events.subscribe("k"));
        let other = events.subscribe("other");
        assert_eq!(events.watched(), 2);
        drop(a);
        assert_eq!(events.watched(), 2, "a key was forgotten while watched");
        drop(b);
        assert_eq!(events.watched(), 1, "a key nobody watches was kept");
        drop(other);
        assert_eq!(events.watched(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_later_fire_wakes_only_its_key() {
        let events = Arc::new(KeyEvents::new());
        let mut other = events.subscribe("other");
        events.fire_later("k", AFTER);
        events.fire_later("nobody", AFTER);
        let woke = timeout(AFTER * 3, other.released(&Held::default())).await;
        assert!(woke.is_err(), "a later fire of another key woke this one");
    }
}
