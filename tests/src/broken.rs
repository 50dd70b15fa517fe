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

/// The flaw a [`Flawed`] backend has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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
    /// Taking over an *expired* hold reads, yields, then writes (a free or
    /// live key is handled atomically).
    ExpiredTakeoverReadThenWrite,
    /// TTLs are truncated to whole seconds (`EX ttl.as_secs()`).
    WholeSecondTtl,
    /// Expiry instants are stored in whole seconds of the store's clock.
    CoarseClock,
    /// Holds of one client hang on one lease taken with its first hold, but
    /// `earliest_expiry` reports `sent_at + ttl` for every hold.
    SharedLeaseWrongBound,
    /// Renewal compares the holder but not the expiry: it revives an
    /// expired hold.
    RenewsExpiredHold,
    /// Renewal adds the TTL to the old expiry instead of setting now + TTL.
    RenewalAddsTtl,
    /// Taking over an expired hold updates its expiry and fence but keeps
    /// the old owner token.
    TakeoverKeepsOldToken,
    /// `cas(Some(a), b)` keeps `a`'s fence.
    HandOverKeepsFence,
    /// `delete` compares the owner but not the expiry: deleting one's own
    /// expired hold reports success.
    DeleteIgnoresExpiry,
    /// `delete` reports success whatever it did.
    DeleteAlwaysTrue,
    /// Each client draws fences from a block of 100 of its own.
    PerClientFenceBlocks,
    /// The fence is drawn before the compare (Postgres `nextval()` in the
    /// `VALUES` row): a slower winner gets an older fence.
    FenceDrawnBeforeConflict,
    /// `renew_many` answers every item with the first item's answer.
    BatchAnswersFirstForAll,
    /// `renew_many` renews every item with the first item's TTL.
    BatchUsesFirstTtl,
    /// `renew_many` upserts: it re-creates deleted or absent holds.
    BatchRecreatesDeleted,
    /// `watch()` subscribes only when `released()` is first awaited.
    WatchSubscribesLazily,
    /// A watch resolves once, then never again.
    WatchFiresOnce,
    /// `inspect` reports the full TTL as time left, always.
    InspectReportsFullTtl,
    /// `inspect` and `list` report expired holds.
    InspectShowsExpired,
    /// `list` ignores its prefix.
    ListIgnoresPrefix,
    /// `list` matches its prefix as a SQL `LIKE` pattern (`prefix%`,
    /// unescaped), so `_` and `%` in it are wildcards.
    ListPrefixAsPattern,
    /// `inspect` and `list` report the store's latest fence, not the hold's.
    InspectReportsLatestFence,
    /// A fair acquisition first tries to take a free key directly.
    FairBarges,
    /// A dropped fair waiter's queue place stays until its TTL.
    FairKeepsDroppedPlace,
    /// Fair acquisitions draw fences from a counter of their own.
    FairFenceSeparate,
    /// `raise_fence` sets the fence counter to the minimum (can lower it).
    RaiseFenceSets,
    /// Tokens are compared by their first 8 characters.
    TokenPrefixCompare,
    /// Tokens are compared ignoring ASCII case.
    TokenCaseInsensitive,
    /// Keys are compared ignoring case (a case-insensitive collation).
    KeyCaseInsensitive,
    /// Keys are truncated to 191 bytes (a `VARCHAR(191)` column).
    KeyTruncated,
    /// A refused `cas` names the caller as the holder.
    HeldEchoesCaller,
    /// `describe` stores the text whoever asks.
    DescribeIgnoresOwner,
    /// Descriptions live in a table of their own that nothing clears: a
    /// new hold reports the old hold's.
    DescriptionOutlivesHold,
    /// A request whose caller went away lands 5.3 s later (a client that
    /// re-sends queued requests after the caller is gone), past the few
    /// seconds the manager keeps cleaning up after a cancelled acquisition.
    LateLandingAfterCancel,
}

impl Flaw {
    /// Every flaw but [`Flaw::None`].
    pub const ALL: &'static [Flaw] = &[
        Flaw::UnconditionalDelete,
        Flaw::ReadThenWrite,
        Flaw::IgnoresTtl,
        Flaw::RepeatingFence,
        Flaw::RenewsForeignToken,
        Flaw::ExpiredTakeoverReadThenWrite,
        Flaw::WholeSecondTtl,
        Flaw::CoarseClock,
        Flaw::SharedLeaseWrongBound,
        Flaw::RenewsExpiredHold,
        Flaw::RenewalAddsTtl,
        Flaw::TakeoverKeepsOldToken,
        Flaw::HandOverKeepsFence,
        Flaw::DeleteIgnoresExpiry,
        Flaw::DeleteAlwaysTrue,
        Flaw::PerClientFenceBlocks,
        Flaw::FenceDrawnBeforeConflict,
        Flaw::BatchAnswersFirstForAll,
        Flaw::BatchUsesFirstTtl,
        Flaw::BatchRecreatesDeleted,
        Flaw::WatchSubscribesLazily,
        Flaw::WatchFiresOnce,
        Flaw::InspectReportsFullTtl,
        Flaw::InspectShowsExpired,
        Flaw::ListIgnoresPrefix,
        Flaw::ListPrefixAsPattern,
        Flaw::InspectReportsLatestFence,
        Flaw::FairBarges,
        Flaw::FairKeepsDroppedPlace,
        Flaw::FairFenceSeparate,
        Flaw::RaiseFenceSets,
        Flaw::TokenPrefixCompare,
        Flaw::TokenCaseInsensitive,
        Flaw::KeyCaseInsensitive,
        Flaw::KeyTruncated,
        Flaw::HeldEchoesCaller,
        Flaw::DescribeIgnoresOwner,
        Flaw::DescriptionOutlivesHold,
        Flaw::LateLandingAfterCancel,
    ];
}

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
    /// Set when the waiter went away but its place stays (a flaw).
    stale_until: Option<Instant>,
}

#[derive(Default)]
struct Store {
    entries: HashMap<String, Entry>,
    fence: u64,
    fair_fence: u64,
    queues: HashMap<String, VecDeque<QueuePlace>>,
    /// Descriptions kept apart from the holds (a flaw).
    descriptions: HashMap<String, String>,
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
        if self.has(Flaw::KeyTruncated) && key.len() > 191 {
            let mut end = 191;
            while !key.is_char_boundary(end) {
                end -= 1;
            }
            return key[..end].to_owned();
        }
        key.to_owned()
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
            None if revive => entry.as_ref().map(|e| e.holder.clone()),
            None => live.as_ref().map(|e| e.holder.clone()),
        };
        let foreign_renewal = self.has(Flaw::RenewsForeignToken) && expected == Some(new);
        let matches = match (&current, expected) {
            (None, None) => true,
            (Some(h), Some(x)) => self.same(h, x),
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
                } else {
                    self.expiry(now, ttl)
                };
                (new.clone(), e.fence, until)
            }
            (Some(_), Some(e)) if self.has(Flaw::HandOverKeepsFence) => {
                (new.clone(), e.fence, self.expiry(now, ttl))
            }
            _ => {
                let fence = drawn.unwrap_or_else(|| self.next_fence(st));
                let holder = match st.entries.get(&nk) {
                    Some(e) if self.has(Flaw::TakeoverKeepsOldToken) && expected.is_none() => {
                        e.holder.clone()
                    }
                    _ => new.clone(),
                };
                (holder, fence, self.expiry(now, ttl))
            }
        };
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
            holder: e.holder.clone(),
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

    /// Takes the key for the head of its fair queue if the key is free.
    fn take_turn(&self, key: &str, token: &Token, ttl: Duration) -> Option<Fence> {
        let now = Instant::now();
        let nk = self.norm(key);
        let mut st = self.store();
        if let Some(q) = st.queues.get_mut(&nk) {
            q.retain(|p| p.stale_until.is_none_or(|t| t > now));
        }
        let head = st
            .queues
            .get(&nk)
            .and_then(|q| q.front())
            .map(|p| p.token.clone());
        if head.as_ref() != Some(token) {
            return None;
        }
        if st.entries.get(&nk).is_some_and(|e| self.alive(e, now)) {
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
            q.pop_front();
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

/// Leaves the fair queue when a waiter goes away.
struct QueueGuard {
    store: Flawed,
    key: String,
    token: Token,
    ttl: Duration,
    done: bool,
}

impl Drop for QueueGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let keep = self.store.has(Flaw::FairKeepsDroppedPlace);
        let until = Instant::now() + self.ttl;
        let mut st = self.store.store();
        if let Some(q) = st.queues.get_mut(&self.key) {
            if keep {
                for p in q.iter_mut().filter(|p| p.token == self.token) {
                    p.stale_until = Some(until);
                }
            } else {
                q.retain(|p| p.token != self.token);
            }
        }
    }
}

/// Subscribes only when first awaited (a flaw).
struct LazyWatch {
    events: Arc<KeyEvents>,
    key: String,
    inner: Option<Box<dyn ReleaseWatch>>,
}

#[async_trait]
impl ReleaseWatch for LazyWatch {
    async fn released(&mut self, held: &Held) -> Result<(), Error> {
        let events = self.events.clone();
        let key = self.key.clone();
        let w = self.inner.get_or_insert_with(|| events.subscribe(&key));
        w.released(held).await
    }
}

/// Resolves once, then never again (a flaw).
struct OnceWatch {
    inner: Box<dyn ReleaseWatch>,
    fired: bool,
}

#[async_trait]
impl ReleaseWatch for OnceWatch {
    async fn released(&mut self, held: &Held) -> Result<(), Error> {
        if self.fired {
            std::future::pending::<()>().await;
        }
        self.inner.released(held).await?;
        self.fired = true;
        Ok(())
    }
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
        if !self.has(Flaw::LateLandingAfterCancel) {
            return Ok(self.cas_flawed(key.as_str(), expected, new, ttl).await);
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (me, key2, expected2, new2) = (
            self.clone(),
            key.as_str().to_owned(),
            expected.cloned(),
            new.clone(),
        );
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            if tx.is_closed() {
                tokio::time::sleep(Duration::from_millis(5_300)).await;
            }
            let out = me.cas_flawed(&key2, expected2.as_ref(), &new2, ttl).await;
            let _ = tx.send(out);
        });
        rx.await
            .map_err(|_| Error::store("flawed", "the request task went away", true))
    }

    async fn delete(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        let now = Instant::now();
        let nk = self.norm(key.as_str());
        let removed = {
            let mut st = self.store();
            let ours = st.entries.get(&nk).is_some_and(|e| {
                self.same(&e.holder, owner)
                    && (self.alive(e, now) || self.has(Flaw::DeleteIgnoresExpiry))
            });
            (ours || self.has(Flaw::UnconditionalDelete)) && st.entries.remove(&nk).is_some()
        };
        if removed {
            self.events.fire(&nk);
        }
        Ok(removed || self.has(Flaw::DeleteAlwaysTrue))
    }

    fn name(&self) -> &'static str {
        "flawed"
    }

    fn watcher(&self) -> Option<&dyn Watch> {
        Some(self)
    }

    fn inspector(&self) -> Option<&dyn Inspect> {
        Some(self)
    }

    fn renewer(&self) -> Option<&dyn RenewMany> {
        Some(self)
    }

    fn describer(&self) -> Option<&dyn Describe> {
        Some(self)
    }

    fn fence_raiser(&self) -> Option<&dyn RaiseFence> {
        Some(self)
    }

    fn fair_queue(&self) -> Option<&dyn FairQueue> {
        Some(self)
    }
}

#[async_trait]
impl Watch for Flawed {
    async fn watch(&self, key: &LockKey) -> Result<Box<dyn ReleaseWatch>, Error> {
        let nk = self.norm(key.as_str());
        if self.has(Flaw::WatchSubscribesLazily) {
            return Ok(Box::new(LazyWatch {
                events: self.events.clone(),
                key: nk,
                inner: None,
            }));
        }
        let w = self.events.subscribe(&nk);
        if self.has(Flaw::WatchFiresOnce) {
            return Ok(Box::new(OnceWatch {
                inner: w,
                fired: false,
            }));
        }
        Ok(w)
    }
}

#[async_trait]
impl Inspect for Flawed {
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        let now = Instant::now();
        let st = self.store();
        Ok(st
            .entries
            .get(&self.norm(key.as_str()))
            .filter(|e| self.shown(e, now))
            .map(|e| self.info(&st, key.as_str(), e, now)))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<HolderInfo>, Error> {
        let now = Instant::now();
        let st = self.store();
        let mut out: Vec<HolderInfo> = st
            .entries
            .iter()
            .filter(|(k, e)| {
                let under = match self.flaw {
                    Flaw::ListIgnoresPrefix => true,
                    Flaw::ListPrefixAsPattern => like(k.as_bytes(), prefix.as_bytes()),
                    _ => k.starts_with(prefix),
                };
                under && self.shown(e, now)
            })
            .map(|(k, e)| self.info(&st, k, e, now))
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }
}

#[async_trait]
impl RenewMany for Flawed {
    async fn renew_many(&self, items: &[RenewItem]) -> Result<Vec<bool>, Error> {
        let first_ttl = items.first().map(|i| i.ttl);
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            let ttl = match first_ttl {
                Some(t) if self.has(Flaw::BatchUsesFirstTtl) => t,
                _ => item.ttl,
            };
            let expected = if self.has(Flaw::BatchRecreatesDeleted) {
                let now = Instant::now();
                let st = self.store();
                let live = st
                    .entries
                    .get(&self.norm(item.key.as_str()))
                    .is_some_and(|e| self.alive(e, now));
                (live).then_some(&item.token)
            } else {
                Some(&item.token)
            };
            let outcome = self.cas_now(
                &mut self.store(),
                item.key.as_str(),
                expected,
                &item.token,
                ttl,
                None,
                None,
            );
            out.push(matches!(outcome, CasOutcome::Acquired { .. }));
        }
        if self.has(Flaw::BatchAnswersFirstForAll) {
            let first = out.first().copied().unwrap_or(false);
            return Ok(vec![first; out.len()]);
        }
        Ok(out)
    }
}

#[async_trait]
impl Describe for Flawed {
    async fn describe(
        &self,
        key: &LockKey,
        owner: &Token,
        description: &str,
    ) -> Result<bool, Error> {
        let now = Instant::now();
        let nk = self.norm(key.as_str());
        let mut st = self.store();
        let ignore_owner = self.has(Flaw::DescribeIgnoresOwner);
        let ours = st
            .entries
            .get(&nk)
            .is_some_and(|e| self.alive(e, now) && (ignore_owner || self.same(&e.holder, owner)));
        if !ours {
            return Ok(false);
        }
        if let Some(e) = st.entries.get_mut(&nk) {
            e.description = Some(description.to_owned());
        }
        st.descriptions.insert(nk, description.to_owned());
        Ok(true)
    }
}

#[async_trait]
impl RaiseFence for Flawed {
    async fn raise_fence(&self, _key: &LockKey, minimum: Fence) -> Result<(), Error> {
        let mut st = self.store();
        st.fence = if self.has(Flaw::RaiseFenceSets) {
            minimum.get()
        } else {
            st.fence.max(minimum.get())
        };
        Ok(())
    }
}

#[async_trait]
impl FairQueue for Flawed {
    async fn fair_acquire(
        &self,
        key: &LockKey,
        token: &Token,
        ttl: Duration,
    ) -> Result<Fence, Error> {
        if self.has(Flaw::FairBarges) {
            if let CasOutcome::Acquired { fence } =
                self.cas_flawed(key.as_str(), None, token, ttl).await
            {
                return Ok(fence);
            }
        }
        let nk = self.norm(key.as_str());
        self.store()
            .queues
            .entry(nk.clone())
            .or_default()
            .push_back(QueuePlace {
                token: token.clone(),
                stale_until: None,
            });
        let mut guard = QueueGuard {
            store: self.clone(),
            key: nk,
            token: token.clone(),
            ttl,
            done: false,
        };
        loop {
            if let Some(fence) = self.take_turn(key.as_str(), token, ttl) {
                guard.done = true;
                return Ok(fence);
            }
            tokio::time::sleep(FAIR_POLL).await;
        }
    }
}
