//! The waiters of one key inside one manager queue in the manager: they
//! take turns in the order they asked, and only the head asks the store.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use moltlock_core::{
    async_trait, Backend, CasMulti, CasOutcome, Error, Forward, Limits, LockKey, LockManager,
    MemoryBackend, RetryPolicy, Token,
};
use tokio::time::{sleep, Instant};

const TTL: Duration = Duration::from_secs(3);

/// Counts the acquiring `cas` calls (not renewals) and keeps every other
/// capability of the memory store but batches, so each attempt is a `cas`.
#[derive(Clone, Default)]
struct Counting {
    store: MemoryBackend,
    acquires: Arc<AtomicUsize>,
}

#[async_trait]
impl Forward for Counting {
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
        if expected.is_none() {
            self.acquires.fetch_add(1, Ordering::SeqCst);
        }
        self.store.cas(key, expected, new, ttl).await
    }

    fn batch_cas(&self) -> Option<&dyn CasMulti> {
        None
    }
}

fn manager(backend: impl Backend) -> LockManager {
    LockManager::builder(backend).ttl(TTL).build().unwrap()
}

/// A manager whose waiters never wake by a timer of their own: only a
/// notice (a release in the manager, the store's watch, an expiry seen)
/// wakes them, so a lost notice shows as a wait of a minute.
fn untimed(backend: impl Backend) -> LockManager {
    LockManager::builder(backend)
        .ttl(TTL)
        .retry(RetryPolicy::Fixed(Duration::from_secs(60)))
        .build()
        .unwrap()
}

/// Deletes only after a pause, so a release can be dropped before the
/// store answers. It keeps the memory store's claim that its requests are
/// in order, which the pause makes wrong: a head woken as the release is
/// sent finds the key still held, and the end of the release wakes it
/// again.
#[derive(Clone, Default)]
struct SlowDelete(MemoryBackend);

#[async_trait]
impl Forward for SlowDelete {
    type Inner = MemoryBackend;

    fn inner(&self) -> &MemoryBackend {
        &self.0
    }

    async fn delete(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        sleep(Duration::from_millis(50)).await;
        self.0.delete(key, owner).await
    }
}

/// Deletes at once but answers only after a pause (a reply on its way
/// back), declaring its requests in order or not; with `validity`, it
/// promises each hold only that long (the store itself keeps it for the
/// TTL), and tells no waiter of a release (its waiters learn of one from
/// their manager or by looking again).
#[derive(Clone, Default)]
struct SlowReply {
    store: MemoryBackend,
    unordered: bool,
    validity: Option<Duration>,
}

#[async_trait]
impl Forward for SlowReply {
    type Inner = MemoryBackend;

    fn inner(&self) -> &MemoryBackend {
        &self.store
    }

    async fn delete(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        let deleted = self.store.delete(key, owner).await;
        sleep(Duration::from_millis(50)).await;
        deleted
    }

    fn limits(&self) -> Limits {
        self.store.limits().with_in_order(!self.unordered)
    }

    fn watcher(&self) -> Option<&dyn moltlock_core::Watch> {
        match self.validity {
            Some(_) => None,
            None => self.store.watcher(),
        }
    }

    fn earliest_expiry(&self, ttl: Duration, sent_at: Instant) -> Instant {
        match self.validity {
            Some(v) => sent_at + v,
            None => self.store.earliest_expiry(ttl, sent_at),
        }
    }
}

/// When the next waiter got the key, and when its manager's release that
/// freed the key returned.
async fn handed_on(backend: SlowReply) -> (Instant, Instant) {
    let mgr = untimed(backend);
    let first = mgr.lock("k").await.unwrap();
    let waiter = mgr.clone();
    let next = tokio::spawn(async move {
        let guard = waiter.lock("k").await.unwrap();
        (Instant::now(), guard)
    });
    sleep(Duration::from_millis(10)).await;
    first.release().await.unwrap();
    let released = Instant::now();
    let (got, guard) = next.await.unwrap();
    guard.release().await.unwrap();
    (got, released)
}

/// On a backend whose requests are in order, a release wakes the next
/// waiter of its manager as soon as it is sent: the waiter's attempt
/// follows the delete, and it holds the key before the release's reply is
/// back. Without the claim it asks only once the reply is in.
#[tokio::test(start_paused = true)]
async fn an_in_order_release_wakes_the_next_waiter_once_sent() {
    let (got, released) = handed_on(SlowReply::default()).await;
    assert!(
        got + Duration::from_millis(40) <= released,
        "the waiter got the key {:?} after the release returned",
        got.saturating_duration_since(released)
    );
    let unordered = SlowReply {
        unordered: true,
        ..SlowReply::default()
    };
    let (got, released) = handed_on(unordered).await;
    assert!(got >= released, "an unordered store's waiter asked early");
}

/// A hold past its validity deadline (the store promised 100 ms; it still
/// holds the key) is not live: its release wakes the next waiter only once
/// the store answered, not as soon as it is sent, in-order store or not.
#[tokio::test(start_paused = true)]
async fn a_release_of_a_hold_past_its_deadline_wakes_nobody_early() {
    let mgr = untimed(SlowReply {
        validity: Some(Duration::from_millis(100)),
        ..SlowReply::default()
    });
    let first = mgr.lock("k").await.unwrap();
    let waiter = mgr.clone();
    let next = tokio::spawn(async move {
        let guard = waiter.lock("k").await.unwrap();
        (Instant::now(), guard)
    });
    sleep(Duration::from_millis(500)).await;
    assert!(!first.is_held(), "the hold is still within its deadline");
    let _ = first.release().await;
    let released = Instant::now();
    let (got, guard) = next.await.unwrap();
    assert!(
        got >= released,
        "the waiter got the key {:?} before the release returned",
        released.saturating_duration_since(got)
    );
    guard.release().await.ok();
}

#[tokio::test(start_paused = true)]
async fn waiters_of_one_manager_take_turns_in_the_order_they_asked() {
    let mgr = manager(MemoryBackend::new());
    let first = mgr.lock("k").await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..6 {
        let (mgr, order) = (mgr.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let guard = mgr.lock("k").await.unwrap();
            order.lock().unwrap().push(i);
            sleep(Duration::from_millis(1)).await;
            guard.release().await.unwrap();
        }));
        // Each asks well after the one before.
        sleep(Duration::from_millis(20)).await;
    }
    first.release().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), (0..6).collect::<Vec<_>>());
}

#[tokio::test(start_paused = true)]
async fn only_the_head_of_the_queue_asks_the_store() {
    let backend = Counting::default();
    let acquires = backend.acquires.clone();
    let mgr = manager(backend);
    let taken = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (mgr, taken) = (mgr.clone(), taken.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..25 {
                let guard = mgr.lock("k").await.unwrap();
                taken.fetch_add(1, Ordering::SeqCst);
                sleep(Duration::from_millis(1)).await;
                guard.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (taken, asked) = (
        taken.load(Ordering::SeqCst),
        acquires.load(Ordering::SeqCst),
    );
    assert_eq!(taken, 200);
    // One attempt per acquisition, and a few for the first round.
    assert!(
        asked <= taken + taken / 10 + 8,
        "{asked} acquiring requests for {taken} acquisitions"
    );
}

#[tokio::test(start_paused = true)]
async fn the_releaser_asking_again_goes_behind_the_waiters() {
    let mgr = manager(MemoryBackend::new());
    let counts = Arc::new(Mutex::new([0usize; 4]));
    let mut tasks = Vec::new();
    for i in 0..4 {
        let (mgr, counts) = (mgr.clone(), counts.clone());
        tasks.push(tokio::spawn(async move {
            let until = tokio::time::Instant::now() + Duration::from_millis(400);
            while tokio::time::Instant::now() < until {
                let guard = mgr.lock("k").await.unwrap();
                counts.lock().unwrap()[i] += 1;
                sleep(Duration::from_millis(2)).await;
                guard.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let counts = *counts.lock().unwrap();
    let (least, most) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
    assert!(
        *least > 0 && most - least <= 2,
        "turns were not shared: {counts:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_waiter_dropped_in_the_queue_leaves_its_place() {
    let mgr = manager(MemoryBackend::new());
    let first = mgr.lock("k").await.unwrap();
    let second = {
        let mgr = mgr.clone();
        tokio::spawn(async move { mgr.lock("k").await.map(|g| g.fence()) })
    };
    sleep(Duration::from_millis(10)).await;
    // Times out while queued behind the head.
    let dropped = mgr.lock_timeout("k", Duration::from_millis(50)).await;
    assert!(matches!(dropped, Err(Error::Timeout { .. })), "{dropped:?}");
    let third = {
        let mgr = mgr.clone();
        tokio::spawn(async move { mgr.lock("k").await })
    };
    sleep(Duration::from_millis(10)).await;
    first.release().await.unwrap();
    let fence = second.await.unwrap().unwrap();
    let last = tokio::time::timeout(Duration::from_secs(1), third)
        .await
        .expect("the waiter behind a dropped one never got the key")
        .unwrap()
        .unwrap();
    assert!(last.fence() > fence);
}

#[tokio::test(start_paused = true)]
async fn a_head_dropped_at_the_store_hands_its_turn_on() {
    let store = MemoryBackend::new();
    let other = manager(store.clone());
    let mgr = untimed(store);
    let held = other.lock("k").await.unwrap();
    // The head waits at the store (the key is another manager's).
    let head = mgr.lock_timeout("k", Duration::from_millis(100));
    let next = {
        let mgr = mgr.clone();
        tokio::spawn(async move { mgr.lock("k").await })
    };
    assert!(matches!(head.await, Err(Error::Timeout { .. })));
    // The next head has made its attempt and waits on the watch it was
    // handed: only the release can wake it in time.
    sleep(Duration::from_millis(200)).await;
    held.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_millis(500), next)
        .await
        .expect("the next waiter did not take over the turn")
        .unwrap()
        .unwrap();
    assert!(guard.is_held());
}

#[tokio::test(start_paused = true)]
async fn a_lost_hold_of_the_manager_hands_the_key_to_the_head() {
    let store = MemoryBackend::new();
    let mgr = manager(store.clone());
    let admin = manager(store);
    let first = mgr.lock("k").await.unwrap();
    let spawn_waiter = || {
        let mgr = mgr.clone();
        tokio::spawn(async move { mgr.lock("k").await })
    };
    let (second, third) = (spawn_waiter(), spawn_waiter());
    sleep(Duration::from_millis(10)).await;
    first.release().await.unwrap();
    let second = second.await.unwrap().unwrap();
    // The third now waits behind its own manager's hold; it is taken away
    // in the store, and the holder finds out at its next renewal.
    admin.revoke("k").await.unwrap().expect("nothing revoked");
    let third = tokio::time::timeout(TTL, third)
        .await
        .expect("the waiter stayed behind a lost hold")
        .unwrap()
        .unwrap();
    assert!(third.fence() > second.fence());
    assert!(
        !second.is_held(),
        "two guards of one manager held the key at once"
    );
}

#[tokio::test(start_paused = true)]
async fn every_release_wakes_the_next_waiter_with_no_timer() {
    let mgr = untimed(MemoryBackend::new());
    let started = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let mgr = mgr.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                let guard = mgr.lock("k").await.unwrap();
                sleep(Duration::from_millis(1)).await;
                guard.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // 40 holds of 1 ms; a lost wake-up would wait for the minute's timer.
    let took = started.elapsed();
    assert!(took < Duration::from_secs(1), "40 turns took {took:?}");
}

#[tokio::test(start_paused = true)]
async fn a_release_dropped_before_the_store_answers_still_wakes_the_head() {
    let mgr = untimed(SlowDelete::default());
    let first = mgr.lock("k").await.unwrap();
    let waiter = {
        let mgr = mgr.clone();
        tokio::spawn(async move { mgr.lock("k").await })
    };
    sleep(Duration::from_millis(10)).await;
    let asked = tokio::time::Instant::now();
    // Dropped before the delete is sent: the key stays held until its TTL.
    let cut = tokio::time::timeout(Duration::from_millis(10), first.release()).await;
    assert!(cut.is_err(), "the release finished before it was dropped");
    let guard = tokio::time::timeout(TTL + Duration::from_secs(1), waiter)
        .await
        .expect("the head slept through the end of its manager's hold")
        .unwrap()
        .unwrap();
    assert!(guard.is_held());
    assert!(asked.elapsed() < TTL + Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn a_waiter_arriving_alone_waits_behind_its_managers_hold() {
    let store = MemoryBackend::new();
    let mgr = manager(store.clone());
    let admin = manager(store);
    // Taken with nobody waiting: the key's queue is gone when the waiter comes.
    let first = mgr.lock("k").await.unwrap();
    let waiter = {
        let mgr = mgr.clone();
        tokio::spawn(async move { mgr.lock("k").await })
    };
    sleep(Duration::from_millis(10)).await;
    admin.revoke("k").await.unwrap().expect("nothing revoked");
    let next = tokio::time::timeout(TTL, waiter)
        .await
        .expect("the waiter stayed behind a lost hold")
        .unwrap()
        .unwrap();
    assert!(next.fence() > first.fence());
    assert!(
        !first.is_held(),
        "two guards of one manager held the key at once"
    );
}
