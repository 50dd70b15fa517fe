//! An in-process backend that meets the whole contract: for tests of code
//! that uses locks, and as the reference the conformance suite is checked on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::{
    Backend, CasMulti, CasOutcome, Describe, Error, Fence, Held, HolderInfo, Inspect, KeyEvents,
    LockKey, MultiMode, MultiOutcome, RaiseFence, ReleaseWatch, RenewItem, RenewMany, Token, Watch,
};

struct Entry {
    holder: Token,
    fence: Fence,
    expires_at: Instant,
    description: Option<String>,
}

#[derive(Default)]
struct State {
    entries: HashMap<String, Entry>,
    last_fence: u64,
}

/// An in-memory store. Clones share one store, so a clone is a "second
/// handle" on the same locks. Fences come from one counter and never repeat.
#[derive(Clone, Default)]
pub struct MemoryBackend {
    state: Arc<Mutex<State>>,
    events: Arc<KeyEvents>,
}

impl MemoryBackend {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        match self.state.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

impl State {
    fn live(&mut self, key: &str, now: Instant) -> Option<&Entry> {
        if self.entries.get(key).is_some_and(|e| e.expires_at <= now) {
            self.entries.remove(key);
        }
        self.entries.get(key)
    }

    /// What an attempt on a held key saw, or `None` when the key is free.
    fn busy(&mut self, key: &str, now: Instant) -> Option<Held> {
        self.live(key, now).map(|e| Held {
            holder: Some(e.holder.clone()),
            expires_in: Some(e.expires_at.saturating_duration_since(now)),
            revision: None,
        })
    }

    /// Makes `token` the holder of a free key, with a fresh fence.
    fn take(&mut self, key: &str, token: &Token, expires_at: Instant) -> Fence {
        self.last_fence += 1;
        let fence = Fence(self.last_fence);
        let entry = Entry {
            holder: token.clone(),
            fence,
            expires_at,
            description: None,
        };
        self.entries.insert(key.to_owned(), entry);
        fence
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    async fn cas(
        &self,
        key: &LockKey,
        expected: Option<&Token>,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error> {
        let now = Instant::now();
        let mut st = self.lock();
        let current = st.live(key.as_str(), now);
        let matches = current.map(|e| &e.holder) == expected;
        if !matches {
            return Ok(CasOutcome::Held(Held {
                holder: current.map(|e| e.holder.clone()),
                expires_in: current.map(|e| e.expires_at.saturating_duration_since(now)),
                revision: None,
            }));
        }
        let (fence, description) = match current {
            Some(e) if &e.holder == new => (e.fence, e.description.clone()),
            _ => {
                st.last_fence += 1;
                (Fence(st.last_fence), None)
            }
        };
        let entry = Entry {
            holder: new.clone(),
            fence,
            expires_at: now + ttl,
            description,
        };
        st.entries.insert(key.as_str().to_owned(), entry);
        Ok(CasOutcome::Acquired { fence })
    }

    async fn delete(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        let mut st = self.lock();
        let ours = st.live(key.as_str(), Instant::now()).map(|e| &e.holder) == Some(owner);
        if ours {
            st.entries.remove(key.as_str());
            drop(st);
            self.events.fire(key.as_str());
        }
        Ok(ours)
    }

    fn name(&self) -> &'static str {
        "memory"
    }

    /// Every request takes effect when first polled: in order.
    fn limits(&self) -> crate::Limits {
        crate::Limits::new().with_in_order(true)
    }

    crate::hand_out!(Watch, Inspect, RenewMany, Describe, RaiseFence, CasMulti);
}

#[async_trait]
impl CasMulti for MemoryBackend {
    /// Takes the keys under one lock of the store.
    async fn cas_multi(
        &self,
        keys: &[LockKey],
        token: &Token,
        ttl: Duration,
        mode: MultiMode,
    ) -> Result<MultiOutcome, Error> {
        let now = Instant::now();
        let mut st = self.lock();
        let mut busy = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            match st.busy(key.as_str(), now) {
                Some(held) => busy.push((i, held)),
                None if mode == MultiMode::Any => {
                    let fence = st.take(key.as_str(), token, now + ttl);
                    return Ok(MultiOutcome::Acquired(vec![(i, fence)]));
                }
                None => {}
            }
        }
        if !busy.is_empty() || mode == MultiMode::Any {
            return Ok(MultiOutcome::Held(busy));
        }
        let taken = keys
            .iter()
            .enumerate()
            .map(|(i, key)| (i, st.take(key.as_str(), token, now + ttl)))
            .collect();
        Ok(MultiOutcome::Acquired(taken))
    }
}

#[async_trait]
impl Describe for MemoryBackend {
    async fn describe(&self, key: &LockKey, owner: &Token, text: &str) -> Result<bool, Error> {
        let mut st = self.lock();
        let now = Instant::now();
        if st.live(key.as_str(), now).map(|e| &e.holder) != Some(owner) {
            return Ok(false);
        }
        if let Some(e) = st.entries.get_mut(key.as_str()) {
            e.description = Some(text.to_owned());
        }
        Ok(true)
    }
}

#[async_trait]
impl RaiseFence for MemoryBackend {
    async fn raise_fence(&self, _key: &LockKey, minimum: Fence) -> Result<(), Error> {
        let mut st = self.lock();
        st.last_fence = st.last_fence.max(minimum.0);
        Ok(())
    }
}

#[async_trait]
impl Watch for MemoryBackend {
    async fn watch(&self, key: &LockKey) -> Result<Box<dyn ReleaseWatch>, Error> {
        Ok(self.events.subscribe(key.as_str()))
    }
}

#[async_trait]
impl RenewMany for MemoryBackend {
    /// Renews the batch under one lock of the store.
    async fn renew_many(&self, items: &[RenewItem]) -> Result<Vec<bool>, Error> {
        let now = Instant::now();
        let mut st = self.lock();
        Ok(items
            .iter()
            .map(|item| {
                let live = st.live(item.key.as_str(), now).map(|e| &e.holder) == Some(&item.token);
                if let (true, Some(e)) = (live, st.entries.get_mut(item.key.as_str())) {
                    e.expires_at = now + item.ttl;
                }
                live
            })
            .collect())
    }
}

#[async_trait]
impl Inspect for MemoryBackend {
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        let now = Instant::now();
        let mut st = self.lock();
        Ok(st
            .live(key.as_str(), now)
            .map(|e| info(key.as_str(), e, now)))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<HolderInfo>, Error> {
        let now = Instant::now();
        let st = self.lock();
        let mut out: Vec<HolderInfo> = st
            .entries
            .iter()
            .filter(|(k, e)| k.starts_with(prefix) && e.expires_at > now)
            .map(|(k, e)| info(k, e, now))
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }
}

fn info(key: &str, e: &Entry, now: Instant) -> HolderInfo {
    HolderInfo {
        key: key.to_owned(),
        holder: e.holder.clone(),
        fence: Some(e.fence),
        expires_in: Some(e.expires_at.saturating_duration_since(now)),
        description: e.description.clone(),
    }
}
