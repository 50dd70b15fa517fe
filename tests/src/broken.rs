//! Deliberately broken backends: the suite's self-tests run cases against
//! them to show the suite catches each flaw.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use moltlock_core::{async_trait, Backend, CasOutcome, Error, Fence, Held, LockKey, Token};
use tokio::time::Instant;

/// The flaw a [`Flawed`] backend has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flaw {
    /// None: a correct backend, to show the self-tests can pass.
    None,
    /// `delete` removes the key whoever holds it.
    UnconditionalDelete,
    /// `cas` reads, yields, then writes: not atomic.
    ReadThenWrite,
    /// Holds never expire.
    IgnoresTtl,
    /// Every acquisition gets fence 1.
    RepeatingFence,
    /// Renewal succeeds whatever token asks.
    RenewsForeignToken,
}

struct Entry {
    holder: Token,
    fence: u64,
    expires_at: Instant,
}

#[derive(Default)]
struct Store {
    entries: HashMap<String, Entry>,
    fence: u64,
}

/// A small in-memory backend with one chosen [`Flaw`]. Clones share a store.
#[derive(Clone)]
pub struct Flawed {
    flaw: Flaw,
    store: Arc<Mutex<Store>>,
}

impl Flawed {
    /// An empty store with `flaw`.
    pub fn new(flaw: Flaw) -> Self {
        Self {
            flaw,
            store: Arc::new(Mutex::new(Store::default())),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Store> {
        match self.store.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    fn holder(&self, key: &str) -> Option<Token> {
        live_holder(&self.lock(), key)
    }

    /// The compare and the write, under one lock unless the flaw splits them.
    async fn compare_and_write(
        &self,
        key: &str,
        expected: Option<&Token>,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error> {
        if self.flaw == Flaw::ReadThenWrite {
            let current = self.holder(key);
            tokio::time::sleep(Duration::from_millis(1)).await;
            let mut st = self.lock();
            return Ok(self.decide(&mut st, current, key, expected, new, ttl));
        }
        let mut st = self.lock();
        let current = live_holder(&st, key);
        Ok(self.decide(&mut st, current, key, expected, new, ttl))
    }

    fn decide(
        &self,
        st: &mut Store,
        current: Option<Token>,
        key: &str,
        expected: Option<&Token>,
        new: &Token,
        ttl: Duration,
    ) -> CasOutcome {
        let foreign_renewal = self.flaw == Flaw::RenewsForeignToken && expected == Some(new);
        if current.as_ref() != expected && !foreign_renewal {
            return CasOutcome::Held(Held {
                holder: current,
                ..Held::default()
            });
        }
        let renew = expected.is_some();
        CasOutcome::Acquired {
            fence: self.write(st, key, new, ttl, renew),
        }
    }

    fn write(&self, st: &mut Store, key: &str, new: &Token, ttl: Duration, renew: bool) -> Fence {
        let fence = match (renew, st.entries.get(key)) {
            (true, Some(e)) => e.fence,
            _ if self.flaw == Flaw::RepeatingFence => 1,
            _ => {
                st.fence += 1;
                st.fence
            }
        };
        let ttl = if self.flaw == Flaw::IgnoresTtl {
            Duration::from_secs(3600)
        } else {
            ttl
        };
        let entry = Entry {
            holder: new.clone(),
            fence,
            expires_at: Instant::now() + ttl,
        };
        st.entries.insert(key.to_owned(), entry);
        Fence(fence)
    }
}

fn live_holder(st: &Store, key: &str) -> Option<Token> {
    let e = st.entries.get(key)?;
    (e.expires_at > Instant::now()).then(|| e.holder.clone())
}

#[async_trait]
impl Backend for Flawed {
    async fn cas(
        &self,
        key: &LockKey,
        expected: Option<&Token>,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error> {
        self.compare_and_write(key.as_str(), expected, new, ttl)
            .await
    }

    async fn delete(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        let mut st = self.lock();
        let ours = live_holder(&st, key.as_str()).as_ref() == Some(owner);
        if ours || self.flaw == Flaw::UnconditionalDelete {
            return Ok(st.entries.remove(key.as_str()).is_some());
        }
        Ok(false)
    }

    fn name(&self) -> &'static str {
        "flawed"
    }
}
