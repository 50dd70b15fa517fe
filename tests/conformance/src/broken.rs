//! Deliberately broken backends: the suite's self-tests run cases against
//! them to show the suite catches each flaw.
//!
//! [`Flawed`] is one small in-memory store with every optional capability;
//! with [`Flaw::None`] it keeps the whole contract, and each other [`Flaw`]
//! breaks exactly one point, the way backend authors really do (a compare
//! that ignores expiry, a TTL rounded to seconds, a batch answered as a
//! whole, a `list` that ignores its prefix…). `tests/selftest.rs` shows each
//! one fails the suite.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use moltlock_core::{
    async_trait, Backend, CasOutcome, Describe, Error, FairQueue, Fence, Held, HolderInfo, Inspect,
    KeyEvents, LockKey, RaiseFence, ReleaseWatch, RenewItem, RenewMany, Token, Watch,
};
use tokio::time::Instant;

mod features;
mod flaw;
mod multi;

pub use flaw::Flaw;

/// How often a fair waiter of [`Flawed`] looks at its queue.
const FAIR_POLL: Duration = Duration::from_millis(20);

#[derive(Clone)]
struct Entry {
    holder: Token,
    fence: u64,
    expires_at: Instant,
    ttl: Duration,
    description: Option<String>,
}

struct QueuePlace {
    token: Token,
    /// Until when the place lives: each look of its waiter renews it for
    /// the TTL, so a waiter that stopped looking loses it.
    alive_until: Instant,
    /// Whether its waiter went away and the place stayed (a flaw).
    dropped: bool,
}

#[derive(Default)]
struct Store {
    entries: HashMap<String, Entry>,
    fence: u64,
    fair_fence: u64,
    queues: HashMap<String, VecDeque<QueuePlace>>,
    /// Descriptions kept apart from the holds (a flaw).
    descriptions: HashMap<String, String>,
    /// The first holder each key had (a flaw reports it).
    first_holders: HashMap<String, Token>,
}

/// What one client (one handle) keeps for itself.
#[derive(Default)]
struct Client {
    block: Option<(u64, u64)>,
    lease: Option<Instant>,
}

/// A small in-memory backend with one chosen [`Flaw`]. Clones share a store
/// and a client; [`handle`](Self::handle) opens another client on the
/// same store.
#[derive(Clone)]
pub struct Flawed {
    flaw: Flaw,
    store: Arc<Mutex<Store>>,
    events: Arc<KeyEvents>,
    client: Arc<Mutex<Client>>,
    epoch: Instant,
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl Flawed {
    /// An empty store with `flaw`.
    pub fn new(flaw: Flaw) -> Self {
        Self {
            flaw,
            store: Arc::default(),
            events: Arc::new(KeyEvents::new()),
            client: Arc::default(),
            epoch: Instant::now(),
        }
    }

    /// Another client on the same store.
    pub fn handle(&self) -> Self {
        Self {
            client: Arc::default(),
            ..self.clone()
        }
    }

    /// The flaw this store has.
    pub fn flaw(&self) -> Flaw {
        self.flaw
    }

    fn has(&self, flaw: Flaw) -> bool {
        self.flaw == flaw
    }

    fn store(&self) -> MutexGuard<'_, Store> {
        locked(&self.store)
    }

    /// The key as the store files it.
    fn norm(&self, key: &str) -> String {
        if self.has(Flaw::KeyCaseInsensitive) {
            return key.to_lowercase();
        }
        let width = match self.flaw {
            Flaw::KeyTruncated => 191,
            Flaw::KeyFixedWidth => 32,
            _ => key.len(),
        };
        let mut end = width.min(key.len());
        while !key.is_char_boundary(end) {
            end -= 1;
        }
        key[..end].to_owned()
    }

    fn same(&self, a: &Token, b: &Token) -> bool {
        let (a, b) = (a.as_str(), b.as_str());
        if self.has(Flaw::TokenPrefixCompare) {
            return a.chars().take(8).eq(b.chars().take(8));
        }
        if self.has(Flaw::TokenCaseInsensitive) {
            return a.eq_ignore_ascii_case(b);
        }
        a == b
    }

    /// When a hold written now with `ttl` expires.
    fn expiry(&self, now: Instant, ttl: Duration) -> Instant {
        match self.flaw {
            Flaw::IgnoresTtl => now + Duration::from_secs(3600),
            Flaw::WholeSecondTtl => now + Duration::from_secs(ttl.as_secs().max(1)),
            Flaw::EndsEarly => (now + ttl)
                .checked_sub(Duration::from_millis(2))
                .unwrap_or(now),
            Flaw::CoarseClock => {
                let secs = (now + ttl).saturating_duration_since(self.epoch).as_secs();
                self.epoch + Duration::from_secs(secs)
            }
            Flaw::SharedLeaseWrongBound => {
                let mut c = locked(&self.client);
                match c.lease {
                    Some(l) if l > now => l,
                    _ => {
                        c.lease = Some(now + ttl);
                        now + ttl
                    }
                }
            }
            _ => now + ttl,
        }
    }

    fn next_fence(&self, st: &mut Store) -> u64 {
        if self.has(Flaw::RepeatingFence) {
            return 1;
        }
        if self.has(Flaw::PerClientFenceBlocks) {
            let mut c = locked(&self.client);
            let (next, end) = match c.block {
                Some((next, end)) if next < end => (next, end),
                _ => {
                    let start = st.fence + 1;
                    st.fence += 100;
                    (start, start + 100)
                }
            };
            c.block = Some((next + 1, end));
            return next;
        }
        st.fence += 1;
        st.fence
    }

    fn alive(&self, e: &Entry, now: Instant) -> bool {
        e.expires_at > now
    }

    /// The compare and the write, under one lock; `fence` is a fence drawn
    /// before the compare (a flaw), if any.
    #[allow(clippy::too_many_arguments)]
    fn cas_now(
        &self,
        st: &mut Store,
        key: &str,
        expected: Option<&Token>,
        new: &Token,
        ttl: Duration,
        drawn: Option<u64>,
        seen: Option<Option<Token>>,
    ) -> CasOutcome {
        let now = Instant::now();
        let nk = self.norm(key);
        let entry = st.entries.get(&nk).cloned();
        let live = entry.clone().filter(|e| self.alive(e, now));
        let revive = self.has(Flaw::RenewsExpiredHold) && expected.is_some();
        let current: Option<Token> = match seen {
            Some(s) => s,
            None if self.has(Flaw::TakesHeldKey) && expected.is_none() => None,
            None if revive => entry.as_ref().map(|e| e.holder.clone()),
            None => live.as_ref().map(|e| e.holder.clone()),
        };
        let foreign_renewal = self.has(Flaw::RenewsForeignToken) && expected == Some(new);
        let matches = match (&current, expected) {
            (None, None) => true,
            (Some(h), Some(x)) => self.same(h, x) || self.has(Flaw::CasIgnoresExpected),
            _ => false,
        };
        if !matches && !foreign_renewal {
            let holder = if self.has(Flaw::HeldEchoesCaller) {
                Some(new.clone())
            } else {
                current
            };
            return CasOutcome::Held(Held {
                holder,
                expires_in: live.map(|e| e.expires_at.saturating_duration_since(now)),
                revision: None,
            });
        }
        let renewal = expected.is_some_and(|x| self.same(x, new));
        let old = entry.filter(|_| expected.is_some() || revive);
        let kept = old
            .as_ref()
            .filter(|_| renewal)
            .and_then(|e| e.description.clone());
        let (holder, fence, expires_at) = match (expected, old) {
            (Some(_), Some(e)) if renewal => {
                let until = if self.has(Flaw::RenewalAddsTtl) {
                    e.expires_at + ttl
                } else if self.has(Flaw::RenewalIgnored) {
                    e.expires_at
                } else {
                    self.expiry(now, ttl)
                };
                (new.clone(), e.fence, until)
            }
            (Some(_), Some(e)) if self.has(Flaw::HandOverKeepsFence) => {
                (new.clone(), e.fence, self.expiry(now, ttl))
            }
            (Some(_), Some(e)) if self.has(Flaw::HandOverKeepsExpiry) => {
                let fence = drawn.unwrap_or_else(|| self.next_fence(st));
                (new.clone(), fence, e.expires_at)
            }
            _ => {
                let fence = match st.entries.get(&nk) {
                    Some(e) if self.has(Flaw::FenceRestartsAfterExpiry) && !self.alive(e, now) => 1,
                    _ => drawn.unwrap_or_else(|| self.next_fence(st)),
                };
                let holder = match st.entries.get(&nk) {
                    Some(e) if self.has(Flaw::TakeoverKeepsOldToken) && expected.is_none() => {
                        e.holder.clone()
                    }
                    _ => new.clone(),
                };
                (holder, fence, self.expiry(now, ttl))
            }
        };
        st.first_holders
            .entry(nk.clone())
            .or_insert_with(|| holder.clone());
        st.entries.insert(
            nk,
            Entry {
                holder,
                fence,
                expires_at,
                ttl,
                description: kept,
            },
        );
        CasOutcome::Acquired {
            fence: Fence(fence),
        }
    }

    async fn cas_flawed(
        &self,
        key: &str,
        expected: Option<&Token>,
        new: &Token,
        ttl: Duration,
    ) -> CasOutcome {
        match self.flaw {
            Flaw::ReadThenWrite => {
                let seen = {
                    let st = self.store();
                    let now = Instant::now();
                    st.entries
                        .get(&self.norm(key))
                        .filter(|e| self.alive(e, now))
                        .map(|e| e.holder.clone())
                };
                tokio::time::sleep(Duration::from_millis(1)).await;
                self.cas_now(&mut self.store(), key, expected, new, ttl, None, Some(seen))
            }
            Flaw::ExpiredTakeoverReadThenWrite if expected.is_none() => {
                let expired = {
                    let st = self.store();
                    let now = Instant::now();
                    st.entries
                        .get(&self.norm(key))
                        .is_some_and(|e| !self.alive(e, now))
                };
                if !expired {
                    return self.cas_now(&mut self.store(), key, expected, new, ttl, None, None);
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
                self.cas_now(&mut self.store(), key, expected, new, ttl, None, Some(None))
            }
            Flaw::FenceDrawnBeforeConflict if expected.is_none() => {
                let drawn = {
                    let mut st = self.store();
                    st.fence += 1;
                    st.fence
                };
                tokio::task::yield_now().await;
                tokio::time::sleep(Duration::from_micros(200)).await;
                self.cas_now(
                    &mut self.store(),
                    key,
                    expected,
                    new,
                    ttl,
                    Some(drawn),
                    None,
                )
            }
            _ => self.cas_now(&mut self.store(), key, expected, new, ttl, None, None),
        }
    }

    fn info(&self, st: &Store, key: &str, e: &Entry, now: Instant) -> HolderInfo {
        HolderInfo {
            key: key.to_owned(),
            holder: match st.first_holders.get(key) {
                Some(first) if self.has(Flaw::InspectReportsFirstHolder) => first.clone(),
                _ => e.holder.clone(),
            },
            fence: Some(Fence(if self.has(Flaw::InspectReportsLatestFence) {
                st.fence
            } else {
                e.fence
            })),
            expires_in: Some(if self.has(Flaw::InspectReportsFullTtl) {
                e.ttl
            } else {
                e.expires_at.saturating_duration_since(now)
            }),
            description: if self.has(Flaw::DescriptionOutlivesHold) {
                st.descriptions.get(key).cloned()
            } else {
                e.description.clone()
            },
        }
    }

    fn shown(&self, e: &Entry, now: Instant) -> bool {
        self.has(Flaw::InspectShowsExpired) || self.alive(e, now)
    }

    /// Takes the key for the head of its fair queue if the key is free;
    /// with `ahead` (the place that was just ahead of ours), also once
    /// that place is gone.
    fn take_turn(
        &self,
        key: &str,
        token: &Token,
        ttl: Duration,
        ahead: Option<&Token>,
    ) -> Option<Fence> {
        let now = Instant::now();
        let nk = self.norm(key);
        let mut st = self.store();
        let keep_frozen = self.has(Flaw::FairKeepsFrozenPlace);
        if let Some(q) = st.queues.get_mut(&nk) {
            for p in q.iter_mut().filter(|p| &p.token == token) {
                p.alive_until = now + ttl;
            }
            q.retain(|p| p.alive_until > now || (keep_frozen && !p.dropped));
        }
        let head = st
            .queues
            .get(&nk)
            .and_then(|q| q.front())
            .map(|p| p.token.clone());
        let passes = ahead.is_some_and(|a| {
            st.queues
                .get(&nk)
                .is_none_or(|q| q.iter().all(|p| &p.token != a))
        });
        if head.as_ref() != Some(token) && !passes {
            return None;
        }
        // A hold of the waiter's own token is an earlier attempt of its
        // that landed unseen: it is taken again, with a fresh fence.
        let own = |e: &Entry| &e.holder == token && !self.has(Flaw::FairWaitsOnOwnHold);
        if st
            .entries
            .get(&nk)
            .is_some_and(|e| self.alive(e, now) && !own(e))
        {
            return None;
        }
        let fence = if self.has(Flaw::FairFenceSeparate) {
            st.fair_fence += 1;
            st.fair_fence
        } else {
            self.next_fence(&mut st)
        };
        let expires_at = self.expiry(now, ttl);
        st.entries.insert(
            nk.clone(),
            Entry {
                holder: token.clone(),
                fence,
                expires_at,
                ttl,
                description: None,
            },
        );
        if let Some(q) = st.queues.get_mut(&nk) {
            q.retain(|p| &p.token != token);
        }
        Some(Fence(fence))
    }
}

/// Whether `text` matches the SQL `LIKE` pattern `pattern%` (`_`: any one
/// byte, `%`: any run), as an unescaped `LIKE ? || '%'` would.
fn like(text: &[u8], pattern: &[u8]) -> bool {
    match pattern.split_first() {
        None => true,
        Some((b'%', rest)) => (0..=text.len()).any(|i| like(&text[i..], rest)),
        Some((b'_', rest)) => !text.is_empty() && like(&text[1..], rest),
        Some((c, rest)) => text.first() == Some(c) && like(&text[1..], rest),
    }
}
