//! Release events per key, for backends whose store pushes notifications
//! (pub/sub, LISTEN/NOTIFY) over one shared connection.

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;
use tokio::sync::watch;

use crate::{Error, Held, ReleaseWatch};

/// A generation counter per key. A waiter subscribes *before* its acquire
/// attempt; a release heard afterwards bumps the counter, so the waiter sees
/// it even if it arrived before the waiter started waiting.
#[derive(Default)]
pub struct KeyEvents {
    keys: Mutex<HashMap<String, watch::Sender<u64>>>,
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
    /// [`fire_all`](Self::fire_all)).
    pub fn subscribe(&self, key: &str) -> Box<dyn ReleaseWatch> {
        let rx = self.with_keys(|keys| {
            keys.entry(key.to_owned())
                .or_insert_with(|| watch::Sender::new(0))
                .subscribe()
        });
        Box::new(EventWatch { rx })
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
