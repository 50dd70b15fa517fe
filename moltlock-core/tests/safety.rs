//! The manager's own safety points, on the in-memory backend behind
//! wrappers that misbehave the way real clients and stores do. Most run on
//! tokio's paused clock, so the timings they assert are exact.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test wrappers and tests unwrap

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use moltlock_core::{
    async_trait, hand_out, Backend, BackendExt, CasOutcome, Error, FairQueue, Fence, Forward,
    Limits, LockKey, LockManager, MemoryBackend, MigratingBackend, Phase, RenewItem, RenewMany,
    Token,
};
use tokio::time::{sleep, Instant};

/// A manager over `backend` with `ttl`.
fn manager(backend: impl Backend, ttl: Duration) -> LockManager {
    LockManager::builder(backend).ttl(ttl).build().unwrap()
}

/// Applies the first acquire twice, as a client that re-sends a request
/// after a lost reply, and answers with the second outcome.
#[derive(Clone, Default)]
struct AppliedTwice(MemoryBackend, Arc<AtomicU64>);

#[async_trait]
impl Backend for AppliedTwice {
    async fn cas(
        &self,
        key: &LockKey,
        expected: Option<&Token>,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error> {
        let first = self.0.cas(key, expected, new, ttl).await?;
        if expected.is_some() || self.1.fetch_add(1, Ordering::Relaxed) > 0 {
            return Ok(first);
        }
        self.0.cas(key, expected, new, ttl).await
    }

    async fn delete(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        self.0.delete(key, owner).await
    }
}

#[tokio::test(start_paused = true)]
async fn own_hold_applied_twice_is_not_waited_on() {
    let mgr = manager(AppliedTwice::default(), Duration::from_secs(30));
    let started = Instant::now();
    let guard = mgr.lock_timeout("k", Duration::from_secs(5)).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "waited {:?} on its own hold",
        started.elapsed()
    );
    assert!(guard.is_held());
    let first = guard.fence();
    guard.release().await.unwrap();
    let again = mgr.try_lock("k").await.unwrap().expect("the key is free");
    assert!(again.fence() > first);
    again.release().await.unwrap();
}

/// A fair backend whose grant reply takes 400 ms: the store starts the TTL
/// when it grants, and after the grant it stops answering renewals.
#[derive(Clone, Default)]
struct SlowFair {
    store: MemoryBackend,
    cut: Arc<Mutex<bool>>,
}

#[async_trait]
impl Forward for SlowFair {
    type Inner = MemoryBackend;

    fn inner(&self) -> &MemoryBackend {
        &self.store
    }

    async fn cas(
        &self,
        key: &LockKey,
        expected: Option<&Token>,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error> {
        if *self.cut.lock().unwrap() {
            std::future::pending::<()>().await;
        }
        self.store.cas(key, expected, new, ttl).await
    }

    /// None: renewals go through the `cas` above, which stops answering.
    fn renewer(&self) -> Option<&dyn RenewMany> {
        None
    }

    hand_out!(FairQueue);
}

#[async_trait]
impl FairQueue for SlowFair {
    async fn acquire(&self, key: &LockKey, token: &Token, ttl: Duration) -> Result<Fence, Error> {
        loop {
            if let CasOutcome::Acquired { fence } = self.store.cas(key, None, token, ttl).await? {
                *self.cut.lock().unwrap() = true;
                sleep(Duration::from_millis(400)).await;
                return Ok(fence);
            }
            sleep(Duration::from_millis(10)).await;
        }
    }
}

#[tokio::test(start_paused = true)]
async fn fair_grant_deadline_counts_from_before_the_call() {
    let backend = SlowFair::default();
    let store = backend.store.clone();
    let mgr = manager(backend, Duration::from_secs(1));
    let opts = moltlock_core::LockOptions::new().fair();
    let guard = mgr.acquire("k", opts).await.unwrap().unwrap();
    let key = LockKey::new("k").unwrap();
    // Step to the first instant at which the store no longer has the hold.
    while store.inspect(&key).await.unwrap().is_some() {
        sleep(Duration::from_millis(1)).await;
    }
    assert!(
        !guard.is_held(),
        "the store let the hold go while the holder still believed it held ({:?} left)",
        guard.valid_for()
    );
}

/// Renewals of the keys in `hang` never answer; every renewal is counted.
#[derive(Clone, Default)]
struct Hanging {
    store: MemoryBackend,
    hang: Arc<Mutex<HashSet<String>>>,
    renewals: Arc<Mutex<Vec<String>>>,
}

impl Hanging {
    fn hang(&self, key: &str) {
        self.hang.lock().unwrap().insert(key.to_owned());
    }

    fn renewals_of(&self, key: &str) -> usize {
        self.renewals
            .lock()
            .unwrap()
            .iter()
            .filter(|k| *k == key)
            .count()
    }
}

impl Forward for Hanging {
    type Inner = MemoryBackend;

    fn inner(&self) -> &MemoryBackend {
        &self.store
    }

    hand_out!(RenewMany);
}

#[async_trait]
impl RenewMany for Hanging {
    async fn renew_many(&self, items: &[RenewItem]) -> Result<Vec<bool>, Error> {
        let hangs = {
            let hang = self.hang.lock().unwrap();
            let mut log = self.renewals.lock().unwrap();
            log.extend(items.iter().map(|i| i.key.as_str().to_owned()));
            items.iter().any(|i| hang.contains(i.key.as_str()))
        };
        if hangs {
            std::future::pending::<()>().await;
        }
        RenewMany::renew_many(&self.store, items).await
    }
}

#[tokio::test(start_paused = true)]
async fn hung_renewal_does_not_stall_other_holds() {
    let backend = Hanging::default();
    let mgr = manager(backend.clone(), Duration::from_secs(3));
    let slow = mgr.lock("slow").await.unwrap();
    backend.hang("slow");
    sleep(Duration::from_millis(1100)).await; // its renewal (at 1 s) hangs now
    let opts = moltlock_core::LockOptions::new().ttl(Duration::from_millis(600));
    let fast = mgr.acquire("fast", opts).await.unwrap().unwrap();
    sleep(Duration::from_millis(1500)).await;
    assert!(fast.is_held(), "a hold taken meanwhile was not renewed");
    assert!(
        backend.renewals_of("fast") >= 3,
        "{} renewals",
        backend.renewals_of("fast")
    );
    drop(slow);
}

#[tokio::test(start_paused = true)]
async fn on_lost_fires_at_the_deadline_while_a_renewal_hangs() {
    let backend = Hanging::default();
    let lost: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
    let seen = lost.clone();
    let mgr = LockManager::builder(backend.clone())
        .ttl(Duration::from_secs(3))
        .on_lost(move |e| {
            seen.lock()
                .unwrap()
                .push((e.key.to_string(), Instant::now()))
        })
        .build()
        .unwrap();
    let _slow = mgr.lock("slow").await.unwrap();
    backend.hang("slow");
    sleep(Duration::from_millis(1100)).await;
    let opts = moltlock_core::LockOptions::new().ttl(Duration::from_millis(600));
    let taken = Instant::now();
    let _fast = mgr.acquire("fast", opts).await.unwrap().unwrap();
    backend.hang("fast");
    let deadline = taken + Duration::from_millis(600).mul_f64(0.98);
    sleep(Duration::from_millis(1000)).await;
    let lost = lost.lock().unwrap().clone();
    let fast_lost = lost.iter().find(|(k, _)| k == "fast").map(|(_, at)| *at);
    let at = fast_lost.expect("on_lost was not called for the cut-off hold");
    assert!(
        at <= deadline + Duration::from_millis(5),
        "on_lost came {:?} after the deadline",
        at - deadline
    );
}

/// Counts `cas` calls.
#[derive(Clone)]
struct Counting {
    inner: MemoryBackend,
    calls: Arc<AtomicU64>,
}

#[async_trait]
impl Forward for Counting {
    type Inner = MemoryBackend;

    fn inner(&self) -> &MemoryBackend {
        &self.inner
    }

    async fn cas(
        &self,
        key: &LockKey,
        expected: Option<&Token>,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.cas(key, expected, new, ttl).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_phase_waiter_behind_a_new_phase_holder_does_not_spin() {
    let (old, new) = (MemoryBackend::new(), MemoryBackend::new());
    let calls = Arc::new(AtomicU64::new(0));
    let counted_old = Arc::new(Counting {
        inner: old,
        calls: calls.clone(),
    });
    let new: Arc<dyn Backend> = Arc::new(new);
    let in_new = MigratingBackend::new(counted_old.clone(), new.clone(), Phase::New).unwrap();
    let in_both = MigratingBackend::new(counted_old, new, Phase::Both).unwrap();
    let holder = LockManager::new(in_new).lock("k").await.unwrap();
    let waiter = LockManager::new(in_both);
    let res = waiter.lock_timeout("k", Duration::from_secs(1)).await;
    assert!(matches!(res, Err(Error::Timeout { .. })), "{res:?}");
    let n = calls.load(Ordering::Relaxed);
    assert!(n <= 40, "{n} attempts on the old store in 1 s");
    holder.release().await.unwrap();
}

/// Every acquire lands in the store 8 s after it was sent, whether or not
/// its caller still waits (a statement queued behind another writer's lock).
#[derive(Clone, Default)]
struct LandsLate(MemoryBackend);

#[async_trait]
impl Backend for LandsLate {
    async fn cas(
        &self,
        key: &LockKey,
        expected: Option<&Token>,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error> {
        let store = self.0.clone();
        let (key, expected, new) = (key.clone(), expected.cloned(), new.clone());
        let late = tokio::spawn(async move {
            sleep(Duration::from_secs(8)).await;
            store.cas(&key, expected.as_ref(), &new, ttl).await
        });
        late.await
            .map_err(|e| Error::store("late", e.to_string(), false))?
    }

    async fn delete(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        self.0.delete(key, owner).await
    }

    fn limits(&self) -> Limits {
        Limits::new().with_late_write(Duration::from_secs(9))
    }
}

#[tokio::test(start_paused = true)]
async fn cancelled_acquire_that_lands_late_leaves_no_orphan() {
    let backend = LandsLate::default();
    let store = backend.0.clone();
    let mgr = manager(backend, Duration::from_secs(60));
    let res = mgr.lock_timeout("k", Duration::from_millis(200)).await;
    assert!(matches!(res, Err(Error::Timeout { .. })), "{res:?}");
    let key = LockKey::new("k").unwrap();
    sleep(Duration::from_millis(8100)).await;
    assert!(
        store.inspect(&key).await.unwrap().is_some(),
        "the write never landed"
    );
    sleep(Duration::from_secs(3)).await;
    assert!(
        store.inspect(&key).await.unwrap().is_none(),
        "the late write left a hold nobody owns"
    );
}

/// Lands every acquire in the store at once, and answers 100 ms later.
#[derive(Clone, Default)]
struct SlowReply(MemoryBackend);

#[async_trait]
impl Backend for SlowReply {
    async fn cas(
        &self,
        key: &LockKey,
        expected: Option<&Token>,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error> {
        let out = self.0.cas(key, expected, new, ttl).await;
        sleep(Duration::from_millis(100)).await;
        out
    }

    async fn delete(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        self.0.delete(key, owner).await
    }
}

/// An acquire whose request already landed, dropped on a thread with no
/// runtime by a manager that holds nothing (so no renewal driver runs): the
/// cleanup runs on the manager's own runtime, not at the TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_dropped_off_the_runtime_is_cleaned_up_on_the_managers_runtime() {
    let backend = SlowReply::default();
    let store = backend.0.clone();
    let mgr = manager(backend, Duration::from_secs(30));
    let waiter = mgr.clone();
    let mut fut = Box::pin(async move { waiter.lock("cancelled").await });
    let early = tokio::time::timeout(Duration::from_millis(30), &mut fut).await;
    assert!(
        early.is_err(),
        "the acquire answered before it could be dropped"
    );
    let key = LockKey::new("cancelled").unwrap();
    assert!(
        store.inspect(&key).await.unwrap().is_some(),
        "the request did not land"
    );
    std::thread::spawn(move || drop(fut)).join().unwrap();
    let until = Instant::now() + Duration::from_secs(3);
    while store.inspect(&key).await.unwrap().is_some() {
        assert!(
            Instant::now() < until,
            "the cancelled acquire's hold outlived its cleanup"
        );
        sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn guard_dropped_without_a_runtime_is_released_on_the_managers_runtime() {
    let store = MemoryBackend::new();
    let mgr = manager(store.clone(), Duration::from_secs(3));
    let _other = mgr.lock("other").await.unwrap();
    let dropped = mgr.lock("dropped").await.unwrap();
    std::thread::spawn(move || drop(dropped)).join().unwrap();
    sleep(Duration::from_millis(1100)).await;
    let key = LockKey::new("dropped").unwrap();
    assert!(
        store.inspect(&key).await.unwrap().is_none(),
        "a guard dropped off the runtime kept its key past a renewal interval"
    );
}

/// Reports a store clock the test can step, with every reply.
struct Stepped {
    store: MemoryBackend,
    clock: moltlock_core::StoreClock,
    base: Instant,
    offset: Mutex<Duration>,
    renewals: AtomicU64,
}

#[async_trait]
impl Backend for Stepped {
    async fn cas(
        &self,
        key: &LockKey,
        expected: Option<&Token>,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error> {
        let sent_at = Instant::now();
        if expected.is_some() {
            self.renewals.fetch_add(1, Ordering::Relaxed);
        }
        let out = self.store.cas(key, expected, new, ttl).await?;
        let offset = *self.offset.lock().unwrap();
        let store_now = Duration::from_secs(1_800_000_000) + self.base.elapsed() + offset;
        self.clock.observe(sent_at, store_now);
        Ok(out)
    }

    async fn delete(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        self.store.delete(key, owner).await
    }

    fn store_clock(&self) -> Option<&moltlock_core::StoreClock> {
        Some(&self.clock)
    }
}

#[tokio::test(start_paused = true)]
async fn forward_store_clock_step_shortens_every_hold_at_once() {
    let backend = Arc::new(Stepped {
        store: MemoryBackend::new(),
        clock: moltlock_core::StoreClock::new(),
        base: Instant::now(),
        offset: Mutex::new(Duration::ZERO),
        renewals: AtomicU64::new(0),
    });
    let mgr = LockManager::builder(backend.clone())
        .ttl(Duration::from_secs(30))
        .build()
        .unwrap();
    let a = mgr.lock("a").await.unwrap();
    sleep(Duration::from_secs(5)).await;
    let before = a.valid_for().unwrap();
    *backend.offset.lock().unwrap() = Duration::from_secs(20);
    // Another hold's reply is the first to show the step.
    let _b = mgr.lock("b").await.unwrap();
    let after = a.valid_for().unwrap_or_default();
    assert!(
        after + Duration::from_secs(20) <= before + Duration::from_millis(10),
        "a 20 s step left {after:?} of {before:?}"
    );
    let renewed = backend.renewals.load(Ordering::Relaxed);
    sleep(Duration::from_millis(10)).await;
    assert!(
        backend.renewals.load(Ordering::Relaxed) > renewed,
        "the shortened hold was not renewed at once"
    );
    assert!(
        a.valid_for().unwrap() > Duration::from_secs(29),
        "{:?}",
        a.valid_for()
    );
}

#[tokio::test(start_paused = true)]
async fn step_larger_than_the_validity_loses_the_hold() {
    let backend = Arc::new(Stepped {
        store: MemoryBackend::new(),
        clock: moltlock_core::StoreClock::new(),
        base: Instant::now(),
        offset: Mutex::new(Duration::ZERO),
        renewals: AtomicU64::new(0),
    });
    let lost: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = lost.clone();
    let mgr = LockManager::builder(backend.clone())
        .ttl(Duration::from_secs(3))
        .on_lost(move |e| seen.lock().unwrap().push(e.key.to_string()))
        .build()
        .unwrap();
    let a = mgr.lock("a").await.unwrap();
    sleep(Duration::from_millis(500)).await;
    *backend.offset.lock().unwrap() = Duration::from_secs(10);
    let _b = mgr.lock("b").await.unwrap();
    assert!(
        !a.is_held(),
        "a hold the store has already expired still looks held"
    );
    sleep(Duration::from_millis(1)).await;
    assert_eq!(lost.lock().unwrap().as_slice(), ["a"]);
}

/// Renewals wait until `answer` is notified, then report every hold gone.
#[derive(Clone, Default)]
struct RefusesLate {
    store: MemoryBackend,
    answer: Arc<tokio::sync::Notify>,
    asked: Arc<tokio::sync::Notify>,
}

impl Forward for RefusesLate {
    type Inner = MemoryBackend;

    fn inner(&self) -> &MemoryBackend {
        &self.store
    }

    hand_out!(RenewMany);
}

#[async_trait]
impl RenewMany for RefusesLate {
    async fn renew_many(&self, items: &[RenewItem]) -> Result<Vec<bool>, Error> {
        self.asked.notify_one();
        self.answer.notified().await;
        Ok(vec![false; items.len()])
    }
}

/// A renewal in flight when its guard is released, refused after the
/// release, is no loss: the lost callback is not called.
#[tokio::test(start_paused = true)]
async fn renewal_refused_after_release_is_no_loss() {
    let backend = RefusesLate::default();
    let lost = Arc::new(AtomicU64::new(0));
    let seen = lost.clone();
    let mgr = LockManager::builder(backend.clone())
        .ttl(Duration::from_secs(3))
        .on_lost(move |_| {
            seen.fetch_add(1, Ordering::SeqCst);
        })
        .build()
        .unwrap();
    let guard = mgr.lock("k").await.unwrap();
    backend.asked.notified().await; // the renewal at 1 s is in flight
    guard.release().await.unwrap();
    backend.answer.notify_one();
    sleep(Duration::from_secs(5)).await;
    assert_eq!(
        lost.load(Ordering::SeqCst),
        0,
        "a released hold was reported lost"
    );
}
