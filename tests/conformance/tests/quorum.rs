//! The quorum backend's own points, over memory stores behind partition
//! and delay wrappers: it survives a minority down, refuses without a
//! majority (leaving nothing held), keeps fences rising across different
//! majorities, and cleans up a grant that lands late.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap

use std::sync::Arc;
use std::time::Duration;

use moltlock_conformance::{Bare, Delay, Partition};
use moltlock_core::{
    Backend, Error, Inspect, LockKey, LockManager, MemoryBackend, QuorumBackend, RaiseFence,
};

const TTL: Duration = Duration::from_secs(2);

/// Three memory stores, each behind a partition switch, and a manager over
/// a quorum of them.
fn three() -> (Vec<MemoryBackend>, Vec<Partition>, LockManager) {
    let stores = vec![
        MemoryBackend::new(),
        MemoryBackend::new(),
        MemoryBackend::new(),
    ];
    let (cuts, quorum) = behind_switches(&stores);
    let mgr = LockManager::builder(quorum).ttl(TTL).build().unwrap();
    (stores, cuts, mgr)
}

/// A quorum over `stores`, each behind a partition switch.
fn behind_switches(stores: &[MemoryBackend]) -> (Vec<Partition>, QuorumBackend) {
    let cuts: Vec<Partition> = stores
        .iter()
        .map(|s| Partition::new(Arc::new(s.clone())))
        .collect();
    let members: Vec<Arc<dyn Backend>> = cuts
        .iter()
        .map(|c| Arc::new(c.clone()) as Arc<dyn Backend>)
        .collect();
    (cuts, QuorumBackend::new(members).unwrap())
}

async fn holds(store: &MemoryBackend, key: &str) -> bool {
    store
        .inspect(&LockKey::new(key).unwrap())
        .await
        .unwrap()
        .is_some()
}

#[tokio::test]
async fn one_member_down_changes_nothing() {
    let (stores, cuts, mgr) = three();
    cuts[2].cut();
    let guard = mgr.lock("k").await.unwrap();
    tokio::time::sleep(TTL * 2).await;
    assert!(guard.is_held(), "renewal needs only a majority");
    assert!(holds(&stores[0], "k").await && holds(&stores[1], "k").await);
    guard.release().await.unwrap();
    assert!(!holds(&stores[0], "k").await, "the release missed a member");
    cuts[2].heal();
}

#[tokio::test]
async fn without_a_majority_nothing_is_acquired_or_left_held() {
    let (stores, cuts, mgr) = three();
    cuts[1].cut();
    cuts[2].cut();
    let got = mgr.lock_timeout("k", Duration::from_millis(800)).await;
    assert!(matches!(got, Err(Error::Timeout { .. })), "{got:?}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !holds(&stores[0], "k").await,
        "a minority grant was left held"
    );
    cuts[1].heal();
    cuts[2].heal();
}

#[tokio::test]
async fn a_holder_that_loses_its_majority_loses_the_lock() {
    let (_stores, cuts, mgr) = three();
    let guard = mgr.lock("k").await.unwrap();
    cuts[0].cut();
    cuts[1].cut();
    let reason = tokio::time::timeout(TTL * 2, guard.lost()).await;
    assert!(
        reason.is_ok(),
        "the holder kept the lock on one member of three"
    );
    cuts[0].heal();
    cuts[1].heal();
}

#[tokio::test]
async fn fences_rise_across_different_majorities() {
    let (_stores, cuts, mgr) = three();
    // Make member C's fence counter run far ahead, alone.
    let mut fences = Vec::new();
    for _ in 0..3 {
        cuts[0].cut();
        let g = mgr.lock("k").await.unwrap(); // {B, C}
        fences.push(g.fence());
        g.release().await.unwrap();
        cuts[0].heal();
        cuts[2].cut();
        let g = mgr.lock("k").await.unwrap(); // {A, B}
        fences.push(g.fence());
        g.release().await.unwrap();
        cuts[2].heal();
        cuts[1].cut();
        let g = mgr.lock("k").await.unwrap(); // {A, C}
        fences.push(g.fence());
        g.release().await.unwrap();
        cuts[1].heal();
    }
    assert!(
        fences.windows(2).all(|w| w[1] > w[0]),
        "fences went backwards across majorities: {fences:?}"
    );
}

/// C's requests land 1.6 s after they are sent and reply 100 ms later,
/// past the counting time (1.5 s: a 3 s TTL with drift 0.5), with B cut
/// off: refused, and C's grant, which would live until 4.6 s, is deleted
/// when its reply comes (the delete lands at 3.3 s).
#[tokio::test]
async fn a_grant_that_lands_after_the_decision_is_deleted() {
    let stores = [
        MemoryBackend::new(),
        MemoryBackend::new(),
        MemoryBackend::new(),
    ];
    let b_cut = Partition::new(Arc::new(stores[1].clone()));
    let slow = Delay::new(
        Arc::new(stores[2].clone()),
        Duration::from_millis(1600),
        Duration::from_millis(100),
    );
    let members: Vec<Arc<dyn Backend>> = vec![
        Arc::new(stores[0].clone()),
        Arc::new(b_cut.clone()),
        Arc::new(slow),
    ];
    let quorum = QuorumBackend::new(members).unwrap().drift(0.5);
    b_cut.cut();
    let started = tokio::time::Instant::now();
    // The backend alone, without a manager's cleanup behind it.
    let key = LockKey::new("k").unwrap();
    let token = moltlock_core::Token::random();
    let got = quorum.cas(&key, None, &token, Duration::from_secs(3)).await;
    assert!(
        !matches!(got, Ok(moltlock_core::CasOutcome::Acquired { .. })),
        "acquired on one member of three"
    );
    tokio::time::sleep_until(started + Duration::from_millis(1800)).await;
    assert!(
        holds(&stores[2], "k").await,
        "the slow request did not land"
    );
    tokio::time::sleep_until(started + Duration::from_millis(3700)).await;
    assert!(
        !holds(&stores[2], "k").await,
        "the late grant was left held"
    );
    assert!(
        !holds(&stores[0], "k").await,
        "the minority grant was left held"
    );
    b_cut.heal();
}

#[test]
fn members_must_raise_fences_and_inspect() {
    let members: Vec<Arc<dyn Backend>> =
        vec![Arc::new(Bare::default()), Arc::new(MemoryBackend::new())];
    assert!(matches!(QuorumBackend::new(members), Err(Error::Config(_))));
    assert!(matches!(
        QuorumBackend::new(Vec::<Arc<dyn Backend>>::new()),
        Err(Error::Config(_))
    ));
}

#[tokio::test]
async fn a_held_lock_survives_one_of_its_members_failing() {
    let (stores, cuts, mgr) = three();
    let guard = mgr.lock("k").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await; // every member granted
    assert!(holds(&stores[2], "k").await, "the third grant was not kept");
    cuts[0].cut();
    tokio::time::sleep(TTL * 2).await;
    assert!(guard.is_held(), "one member's failure lost a held lock");
    cuts[0].heal();
    guard.release().await.unwrap();
}

/// A member whose replies report its wall clock, which the test steps.
#[derive(Clone)]
struct Clocked(MemoryBackend, Arc<moltlock_core::StoreClock>);

#[moltlock_core::async_trait]
impl Backend for Clocked {
    async fn cas(
        &self,
        key: &LockKey,
        expected: Option<&moltlock_core::Token>,
        new: &moltlock_core::Token,
        ttl: Duration,
    ) -> Result<moltlock_core::CasOutcome, Error> {
        self.0.cas(key, expected, new, ttl).await
    }

    async fn delete(&self, key: &LockKey, owner: &moltlock_core::Token) -> Result<bool, Error> {
        self.0.delete(key, owner).await
    }

    fn store_clock(&self) -> Option<&moltlock_core::StoreClock> {
        Some(&self.1)
    }

    fn inspector(&self) -> Option<&dyn Inspect> {
        self.0.inspector()
    }

    fn fence_raiser(&self) -> Option<&dyn moltlock_core::RaiseFence> {
        self.0.fence_raiser()
    }
}

#[tokio::test]
async fn a_members_clock_step_shortens_the_quorums_holds() {
    let clock = Arc::new(moltlock_core::StoreClock::new());
    let first = Clocked(MemoryBackend::new(), clock.clone());
    let members: Vec<Arc<dyn Backend>> = vec![
        Arc::new(first.clone()),
        Arc::new(MemoryBackend::new()),
        Arc::new(MemoryBackend::new()),
    ];
    let mgr = LockManager::builder(QuorumBackend::new(members).unwrap())
        .ttl(Duration::from_secs(30))
        .build()
        .unwrap();
    let guard = mgr.lock("k").await.unwrap();
    let before = guard.valid_for().unwrap();
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let now = tokio::time::Instant::now();
    clock.observe(now, wall);
    clock.observe(tokio::time::Instant::now(), wall + Duration::from_secs(20));
    let after = guard.valid_for().unwrap_or_default();
    assert!(
        after + Duration::from_secs(15) < before,
        "a 20 s step of one member's clock left {after:?} of {before:?}"
    );
}

/// C grants 40 ms after A and B, inside the time a won acquisition still
/// counts stragglers, and with the largest fence. An inspection between the
/// two reports the fence the acquisition returns, not A's and B's. (On a
/// paused clock, so the order of the steps does not depend on the
/// machine's speed.)
#[tokio::test(start_paused = true)]
async fn inspect_between_a_majority_and_a_straggler_reports_the_final_fence() {
    let stores = [
        MemoryBackend::new(),
        MemoryBackend::new(),
        MemoryBackend::new(),
    ];
    let key = LockKey::new("k").unwrap();
    stores[2]
        .raise_fence(&key, moltlock_core::Fence(1000))
        .await
        .unwrap();
    let slow = Delay::new(
        Arc::new(stores[2].clone()),
        Duration::from_millis(40),
        Duration::ZERO,
    );
    let members: Vec<Arc<dyn Backend>> = vec![
        Arc::new(stores[0].clone()),
        Arc::new(stores[1].clone()),
        Arc::new(slow),
    ];
    let quorum = QuorumBackend::new(members).unwrap();
    let mgr = LockManager::builder(quorum.clone())
        .ttl(TTL)
        .build()
        .unwrap();
    let locking = tokio::spawn(async move { mgr.lock("k").await });
    tokio::time::sleep(Duration::from_millis(15)).await;
    assert!(holds(&stores[0], "k").await && !holds(&stores[2], "k").await);
    let seen = quorum.inspect(&key).await.unwrap().expect("a holder");
    let guard = locking.await.unwrap().unwrap();
    assert!(
        guard.fence() > moltlock_core::Fence(1000),
        "C did not count"
    );
    assert_eq!(seen.fence, Some(guard.fence()), "inspected mid-acquisition");
    guard.release().await.unwrap();
}

/// A member that does not answer (down or cut off) is no reason to look
/// again: an inspection of a hold the other two agree on waits only for
/// the late answer, not for the straggler window and a second look.
#[tokio::test(start_paused = true)]
async fn inspect_with_a_silent_member_looks_once() {
    let (_stores, cuts, mgr) = three();
    let guard = mgr.lock("k").await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    cuts[2].cut();
    let started = tokio::time::Instant::now();
    let seen = mgr.backend().inspector().unwrap();
    let seen = seen.inspect(&LockKey::new("k").unwrap()).await.unwrap();
    let took = started.elapsed();
    assert_eq!(seen.map(|h| h.holder), Some(guard.token().clone()));
    assert!(took < Duration::from_millis(400), "one look took {took:?}");
    cuts[2].heal();
    guard.release().await.unwrap();
}

/// Five members, E held by another token (so a first look doubts), a hold
/// of the quorum, and an inspection under way: its first look is done, its
/// second comes after the settling pause.
struct Doubt {
    stores: Vec<MemoryBackend>,
    cuts: Vec<Partition>,
    other: moltlock_core::Token,
    looking: tokio::task::JoinHandle<Result<Option<moltlock_core::HolderInfo>, Error>>,
    _mgr: LockManager,
}

impl Doubt {
    /// With `d_floor`, D's fence minimum, so its grant carries the largest
    /// fence of the hold.
    async fn start(d_floor: Option<u64>) -> (Self, moltlock_core::LockGuard) {
        let stores: Vec<MemoryBackend> = (0..5).map(|_| MemoryBackend::new()).collect();
        let key = LockKey::new("k").unwrap();
        if let Some(floor) = d_floor {
            let floor = moltlock_core::Fence(floor);
            stores[3].raise_fence(&key, floor).await.unwrap();
        }
        let other = moltlock_core::Token::random();
        stores[4]
            .cas(&key, None, &other, Duration::from_secs(60))
            .await
            .unwrap();
        let (cuts, quorum) = behind_switches(&stores);
        let mgr = LockManager::builder(quorum.clone())
            .ttl(TTL)
            .build()
            .unwrap();
        let guard = mgr.lock("k").await.unwrap();
        let looking = tokio::spawn(async move { quorum.inspect(&key).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let doubt = Self {
            stores,
            cuts,
            other,
            looking,
            _mgr: mgr,
        };
        (doubt, guard)
    }

    /// What the inspection reported, once the members at `silent` fell
    /// silent (before its second look).
    async fn seen_with(&mut self, silent: &[usize]) -> Option<moltlock_core::HolderInfo> {
        for i in silent {
            self.cuts[*i].cut();
        }
        (&mut self.looking).await.unwrap().unwrap()
    }

    /// Heals every member and frees E.
    async fn end(self) {
        for cut in &self.cuts {
            cut.heal();
        }
        let key = LockKey::new("k").unwrap();
        self.stores[4].delete(&key, &self.other).await.unwrap();
    }
}

/// The second look of an inspection hears fewer members of the hold than
/// the first (D, whose grant carried the largest fence, fell silent in
/// between): the fence reported stays the one the acquisition returned,
/// not the largest of the members still answering. E, held by another
/// token, is what makes the first look doubt.
#[tokio::test(start_paused = true)]
async fn inspect_whose_second_look_hears_fewer_keeps_the_fence() {
    let (mut doubt, guard) = Doubt::start(Some(1000)).await;
    assert!(
        guard.fence() > moltlock_core::Fence(1000),
        "D did not count"
    );
    let seen = doubt.seen_with(&[3]).await.expect("a holder");
    assert_eq!(seen.holder, guard.token().clone());
    assert_eq!(
        seen.fence,
        Some(guard.fence()),
        "the fence of fewer members"
    );
    doubt.end().await;
    guard.release().await.unwrap();
}

/// The second look of an inspection hears too few members to make a
/// majority (C and D fell silent in between), but only E denies the
/// holder: the hold stands, and the inspection still reports it.
#[tokio::test(start_paused = true)]
async fn inspect_whose_second_look_loses_the_majority_keeps_the_holder() {
    let (mut doubt, guard) = Doubt::start(None).await;
    let seen = doubt.seen_with(&[2, 3]).await;
    assert_eq!(
        seen.as_ref().map(|h| h.holder.clone()),
        Some(guard.token().clone()),
        "a hold two silent members still count for was reported gone"
    );
    let left = seen.and_then(|h| h.expires_in).expect("its time left");
    assert!(
        left + Duration::from_millis(150) <= TTL,
        "the time left the first look saw was reported unaged: {left:?}"
    );
    doubt.end().await;
    guard.release().await.unwrap();
}

/// The same doubtful first look, then the holder releases and C and D fall
/// silent before the second look: A and B report the key free and E
/// another holder, one denial more than a majority can spare, and the
/// inspection reports no holder.
#[tokio::test(start_paused = true)]
async fn inspect_whose_second_look_sees_the_release_reports_it() {
    let (mut doubt, guard) = Doubt::start(None).await;
    guard.release().await.unwrap();
    let seen = doubt.seen_with(&[2, 3]).await;
    assert!(seen.is_none(), "a released hold was reported: {seen:?}");
    doubt.end().await;
}

/// How a [`Down`] member answers.
const FAILS_AT_ONCE: u8 = 0;
const FAILS_AFTER_3S: u8 = 1;
const ANSWERS_AFTER_300MS: u8 = 2;

/// A member whose store is down: its client fails a request at once, or
/// only after 3 s (its reconnect attempts); or, back up, it answers from
/// its store 300 ms late.
#[derive(Clone)]
struct Down(MemoryBackend, Arc<std::sync::atomic::AtomicU8>);

impl Down {
    /// Fails as the mode says; `Ok` once the store is back (and late).
    async fn down(&self) -> Result<(), Error> {
        match self.1.load(std::sync::atomic::Ordering::SeqCst) {
            ANSWERS_AFTER_300MS => {
                tokio::time::sleep(Duration::from_millis(300)).await;
                return Ok(());
            }
            FAILS_AFTER_3S => tokio::time::sleep(Duration::from_secs(3)).await,
            _ => {}
        }
        Err(Error::store("down", "connection refused", true))
    }
}

#[moltlock_core::async_trait]
impl Backend for Down {
    async fn cas(
        &self,
        key: &LockKey,
        expected: Option<&moltlock_core::Token>,
        new: &moltlock_core::Token,
        ttl: Duration,
    ) -> Result<moltlock_core::CasOutcome, Error> {
        self.down().await?;
        self.0.cas(key, expected, new, ttl).await
    }

    async fn delete(&self, key: &LockKey, owner: &moltlock_core::Token) -> Result<bool, Error> {
        self.down().await?;
        self.0.delete(key, owner).await
    }

    fn inspector(&self) -> Option<&dyn Inspect> {
        self.0.inspector()
    }

    fn fence_raiser(&self) -> Option<&dyn moltlock_core::RaiseFence> {
        self.0.fence_raiser()
    }
}

/// C is down. Once it has failed a request, an attempt that A and B have
/// answered (split between two contenders: A held by the other, B granted)
/// waits for C only briefly: a split vote costs a fraction of a second,
/// not C's 3 s of reconnect attempts, round after round. Nothing the
/// refused attempt took is left held. Once C answers again (slowly), the
/// next attempt that hears from it waits for it again, and wins with B
/// and C.
#[tokio::test(start_paused = true)]
async fn a_split_vote_does_not_wait_for_a_member_known_down() {
    let stores = [MemoryBackend::new(), MemoryBackend::new()];
    let mode = Arc::new(std::sync::atomic::AtomicU8::new(FAILS_AT_ONCE));
    let members: Vec<Arc<dyn Backend>> = vec![
        Arc::new(stores[0].clone()),
        Arc::new(stores[1].clone()),
        Arc::new(Down(MemoryBackend::new(), mode.clone())),
    ];
    let quorum = QuorumBackend::new(members).unwrap();
    let key = LockKey::new("k").unwrap();
    let ttl = Duration::from_secs(10);
    let first = moltlock_core::Token::random();
    let got = quorum.cas(&key, None, &first, ttl).await;
    assert!(matches!(
        got,
        Ok(moltlock_core::CasOutcome::Acquired { .. })
    ));
    assert!(quorum.delete(&key, &first).await.unwrap());
    let other = moltlock_core::Token::random();
    stores[0].cas(&key, None, &other, ttl).await.unwrap();
    mode.store(FAILS_AFTER_3S, std::sync::atomic::Ordering::SeqCst);
    let started = tokio::time::Instant::now();
    let mine = moltlock_core::Token::random();
    let got = quorum.cas(&key, None, &mine, ttl).await;
    let took = started.elapsed();
    assert!(
        !matches!(got, Ok(moltlock_core::CasOutcome::Acquired { .. })),
        "acquired on one member of three"
    );
    assert!(
        took < Duration::from_secs(1),
        "the split waited {took:?} for the member known down"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!holds(&stores[1], "k").await, "B's grant was left held");
    // C comes back. The first attempt still finds it marked and does not
    // wait; its late answer, drained after the decision, clears the mark.
    mode.store(ANSWERS_AFTER_300MS, std::sync::atomic::Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let got = quorum
        .cas(&key, None, &moltlock_core::Token::random(), ttl)
        .await;
    assert!(!matches!(
        got,
        Ok(moltlock_core::CasOutcome::Acquired { .. })
    ));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let last = moltlock_core::Token::random();
    let got = quorum.cas(&key, None, &last, ttl).await;
    assert!(
        matches!(got, Ok(moltlock_core::CasOutcome::Acquired { .. })),
        "a member that answers again was not waited for: {got:?}"
    );
    assert!(quorum.delete(&key, &last).await.unwrap());
    stores[0].delete(&key, &other).await.unwrap();
}
