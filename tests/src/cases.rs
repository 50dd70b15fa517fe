//! The cases of the suite, one function per point of the lock contract.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use moltlock_core::{
    Backend, BackendExt, CasOutcome, Error, Fence, LockManager, LockOptions, RetryPolicy, Token,
};
use tokio::time::Instant;

use crate::{
    Case, CaseResult, Delay, Factory, FencedResource, Need, Outcome, OverlapDetector, Partition,
    INCONCLUSIVE,
};

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

mod expiry;
mod fences;
mod optional;
mod ownership;

pub use expiry::*;
pub use fences::*;
pub use optional::*;
pub use ownership::*;

macro_rules! case {
    ($name:ident, $point:literal) => {
        Case {
            name: stringify!($name),
            point: $point,
            needs: None,
            run: |f| Box::pin($name(f)),
        }
    };
    ($name:ident, $point:literal, $need:ident) => {
        Case {
            name: stringify!($name),
            point: $point,
            needs: Some(Need::$need),
            run: |f| Box::pin($name(f)),
        }
    };
}

/// Every case of the suite, in the order `run_all` runs them, grouped by
/// the extension it needs (`always`: none), each with the contract point
/// (`docs/CONTRACT.md`) it proves. Written once: [`ALL`] and
/// `conformance_tests!` are both made from it, through the callback macro
/// given.
#[doc(hidden)]
#[macro_export]
macro_rules! __cases {
    ($callback:path; $($pass:tt)*) => {
        $callback! { $($pass)*;
            always: [
                acquire_and_release: "1 mutual exclusion",
                try_lock_on_held_key_returns_none: "1 mutual exclusion",
                distinct_keys_do_not_conflict: "1 mutual exclusion",
                mutual_exclusion_under_contention: "1 mutual exclusion",
                mutual_exclusion_across_clients: "1 mutual exclusion",
                expired_key_race_has_one_winner: "1 mutual exclusion, 3 expiry",
                release_with_foreign_token_changes_nothing: "2 owner checks",
                renew_with_foreign_token_changes_nothing: "2 owner checks",
                cas_with_wrong_expected_changes_nothing: "2 owner checks",
                double_release_reports_not_held: "2 owner checks",
                delete_of_expired_hold_reports_false: "2 owner checks, 3 expiry",
                hand_over_gives_a_fresh_fence: "2 owner checks, 5 fencing",
                tokens_are_compared_exactly: "2 owner checks",
                keys_are_distinct_exactly: "1 mutual exclusion",
                held_reply_names_the_real_holder: "1 mutual exclusion",
                key_expires_after_ttl: "3 expiry",
                fractional_ttls_are_honoured: "3 expiry, 4 validity deadline",
                shared_lease_reports_earliest_expiry: "4 validity deadline",
                waiter_acquires_after_holder_stops_renewing: "3 expiry",
                renewal_keeps_lock_past_several_ttls: "3 expiry",
                renewal_after_expiry_is_refused: "2 owner checks, 3 expiry",
                renewal_sets_expiry_from_now: "3 expiry",
                batch_renewal_keeps_many_locks: "3 expiry",
                renew_many_answers_per_item: "2 owner checks",
                renew_many_uses_each_items_ttl: "3 expiry",
                fences_increase_across_release: "5 fencing",
                fences_increase_across_expiry: "5 fencing",
                fences_increase_across_clients: "5 fencing",
                fences_rise_across_long_lived_clients: "5 fencing",
                fences_rise_under_contention: "5 fencing",
                fenced_resource_refuses_stale_holder: "5 fencing",
                lost_fires_when_key_deleted_behind_holder: "4 lost signals",
                lost_fires_before_store_expiry_when_cut_off: "4 validity deadline",
                lost_callback_is_called: "4 lost signals",
                duplicate_delivery_does_not_wait_on_itself: "6 no hold nobody owns",
                dropped_waiter_leaves_no_hold: "6 cancellation",
                cancelled_acquires_leave_no_orphan: "6 cancellation",
                dropped_guard_releases_key: "6 cancellation",
                longest_allowed_key_and_unicode_work: "8 input limits",
            ],
            watch: [
                release_wakes_waiter_quickly: "waiting",
                watch_subscribes_before_it_returns: "waiting",
                watch_fires_for_every_release: "waiting",
            ],
            inspect: [
                inspect_reports_holder: "inspect",
                inspect_and_list_are_exact: "inspect",
                inspect_hides_expired_holds: "inspect, 3 expiry",
            ],
            fair_queue: [
                fair_queue_serves_in_arrival_order: "fair queue",
                fair_newcomer_does_not_barge: "fair queue",
                fair_dropped_waiter_leaves_the_queue: "fair queue, 6 cancellation",
                fences_rise_across_fair_and_plain: "5 fencing, fair queue",
            ],
            raise_fence: [
                raise_fence_lifts_later_fences: "5 fencing",
                raise_fence_is_a_max: "5 fencing",
            ],
            describe: [
                descriptions_belong_to_their_hold: "2 owner checks",
            ],
        }
    };
}

macro_rules! all_cases {
    (;
        always: [$($a:ident: $ap:literal,)*],
        watch: [$($w:ident: $wp:literal,)*],
        inspect: [$($i:ident: $ip:literal,)*],
        fair_queue: [$($f:ident: $fp:literal,)*],
        raise_fence: [$($r:ident: $rp:literal,)*],
        describe: [$($d:ident: $dp:literal,)*],
    ) => {
        /// Every case, in the order `run_all` runs them, with the contract
        /// point (`docs/CONTRACT.md`) each proves.
        pub const ALL: &[Case] = &[
            $(case!($a, $ap),)*
            $(case!($w, $wp, Watch),)*
            $(case!($i, $ip, Inspect),)*
            $(case!($f, $fp, FairQueue),)*
            $(case!($r, $rp, RaiseFence),)*
            $(case!($d, $dp, Describe),)*
        ];
    };
}

crate::__cases!(all_cases;);

fn err(e: Error) -> String {
    e.to_string()
}

/// A key under a prefix of its own, so cases can share a store.
fn key(case: &str) -> String {
    format!("mlconf/{case}/{}", uuid::Uuid::new_v4().simple())
}

/// The short TTL the expiry cases use: 1 s, or the backend's floor.
fn short_ttl(b: &Arc<dyn Backend>) -> Duration {
    b.limits().min_ttl.max(Duration::from_secs(1))
}

fn manager(b: &Arc<dyn Backend>, ttl: Duration) -> Result<LockManager, String> {
    LockManager::builder(b.clone())
        .ttl(ttl)
        .retry(RetryPolicy::Fixed(Duration::from_millis(20)))
        .build()
        .map_err(err)
}

async fn raw_acquire(
    b: &Arc<dyn Backend>,
    key: &str,
    ttl: Duration,
) -> Result<(Token, Fence), String> {
    let k = key.parse().map_err(err)?;
    let token = Token::random();
    match b.cas(&k, None, &token, ttl).await.map_err(err)? {
        CasOutcome::Acquired { fence } => Ok((token, fence)),
        CasOutcome::Held(h) => Err(format!("expected a free key, found it held: {h:?}")),
    }
}

async fn is_free(b: &Arc<dyn Backend>, key: &str, ttl: Duration) -> Result<bool, String> {
    let k = key.parse().map_err(err)?;
    let token = Token::random();
    match b.cas(&k, None, &token, ttl).await.map_err(err)? {
        CasOutcome::Acquired { .. } => {
            b.delete(&k, &token).await.map_err(err)?;
            Ok(true)
        }
        CasOutcome::Held(_) => Ok(false),
    }
}

/// Polls until `key` is free, for at most `within`.
async fn becomes_free(b: &Arc<dyn Backend>, key: &str, within: Duration) -> Result<bool, String> {
    let until = Instant::now() + within;
    loop {
        if is_free(b, key, Duration::from_secs(5).max(short_ttl(b))).await? {
            return Ok(true);
        }
        if Instant::now() >= until {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// How long after the latest instant a store could expire a hold it may
/// still show it: covers stores that purge expired holds on a timer (etcd
/// revokes expired leases every 500 ms).
const EXPIRY_SLACK: Duration = Duration::from_millis(750);

/// The manager's default clock-drift allowance.
const DEFAULT_DRIFT: f64 = 0.02;

/// A hold taken by [`timed_acquire`], with when its request went out and
/// came back.
struct Timed {
    token: Token,
    fence: Fence,
    ttl: Duration,
    sent: Instant,
    replied: Instant,
    /// What the backend promised: it will not expire the hold before this.
    expiry: Instant,
}

impl Timed {
    /// The local validity deadline a manager with the default drift gives
    /// this hold.
    fn trusted(&self) -> Instant {
        let span = self.expiry.saturating_duration_since(self.sent);
        self.sent + span.mul_f64(1.0 - DEFAULT_DRIFT)
    }

    /// By when the store must have expired the hold: the request landed by
    /// `replied` at the latest, plus the span, plus [`EXPIRY_SLACK`].
    fn surely_gone(&self) -> Instant {
        self.replied + self.expiry.saturating_duration_since(self.sent) + EXPIRY_SLACK
    }

    /// A renewal of this hold, sent now, was confirmed.
    fn renewed(&mut self, b: &Arc<dyn Backend>, sent: Instant) {
        self.sent = sent;
        self.replied = Instant::now();
        self.expiry = b.earliest_expiry(self.ttl, sent);
    }
}

/// Acquires a free key with a fresh token, timing the request.
async fn timed_acquire(b: &Arc<dyn Backend>, key: &str, ttl: Duration) -> Result<Timed, String> {
    let sent = Instant::now();
    let (token, fence) = raw_acquire(b, key, ttl).await?;
    Ok(Timed {
        token,
        fence,
        ttl,
        sent,
        replied: Instant::now(),
        expiry: b.earliest_expiry(ttl, sent),
    })
}

/// `cas(key, Some(token), token, ttl)`: whether the renewal was granted.
async fn renew(
    b: &Arc<dyn Backend>,
    key: &str,
    token: &Token,
    ttl: Duration,
) -> Result<bool, String> {
    let k = key.parse().map_err(err)?;
    let out = b.cas(&k, Some(token), token, ttl).await.map_err(err)?;
    Ok(matches!(out, CasOutcome::Acquired { .. }))
}

/// Just before the default-drift deadline of `t`, a probe from `probe`
/// must find `key` held. A probe that found it free and was answered
/// before the promised expiry proves the store expired it early; one
/// answered later proves nothing (inconclusive).
async fn expect_held_until_deadline(
    probe: &Arc<dyn Backend>,
    key: &str,
    t: &Timed,
    what: &str,
) -> Result<(), String> {
    tokio::time::sleep_until(t.trusted() - Duration::from_millis(5)).await;
    let k = key.parse().map_err(err)?;
    let token = Token::random();
    let out = probe
        .cas(&k, None, &token, t.ttl.max(Duration::from_secs(2)))
        .await
        .map_err(err)?;
    let replied = Instant::now();
    if matches!(out, CasOutcome::Held(_)) {
        return Ok(());
    }
    probe.delete(&k, &token).await.map_err(err)?;
    if replied < t.expiry {
        return Err(format!(
            "{what}: a hold of TTL {:?} was free {:?} after its request was sent, {:?} before the \
             earliest expiry the backend promised (the manager would still trust it)",
            t.ttl,
            replied - t.sent,
            t.expiry - replied
        ));
    }
    Err(format!(
        "{INCONCLUSIVE}: the probe of {what} was answered only {:?} after the promised expiry",
        replied - t.expiry
    ))
}

/// Once `t` has surely expired, a probe must find `key` free.
async fn expect_gone_after_expiry(
    probe: &Arc<dyn Backend>,
    key: &str,
    t: &Timed,
    what: &str,
) -> Result<(), String> {
    tokio::time::sleep_until(t.surely_gone()).await;
    ensure!(
        is_free(probe, key, t.ttl.max(Duration::from_secs(2))).await?,
        "{what}: a hold of TTL {:?} was still held {:?} after its request was answered ({:?} \
         past the latest instant its TTL allows)",
        t.ttl,
        Instant::now() - t.replied,
        Instant::now().saturating_duration_since(t.surely_gone() - EXPIRY_SLACK)
    );
    Ok(())
}

/// What [`contend`] saw.
struct Contention {
    detector: OverlapDetector,
    /// Hand-offs whose new fence was not above the previous holder's.
    fence_errors: u64,
    first_fence_error: Option<String>,
}

/// Acquire, see the hold, release, acquire again.
pub async fn acquire_and_release(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let m = manager(&b, Duration::from_secs(10))?;
    let k = key("acquire");
    let g = m.lock(&k).await.map_err(err)?;
    ensure!(g.is_held(), "a fresh guard must be held");
    ensure!(g.key().as_str() == k, "the guard names another key");
    ensure!(g.check().is_ok(), "check() must pass on a fresh guard");
    g.release().await.map_err(err)?;
    let again = m.try_lock(&k).await.map_err(err)?;
    ensure!(again.is_some(), "the key must be free after release");
    Ok(Outcome::Passed)
}

/// `try_lock` returns `None` at once while another owner holds the key.
pub async fn try_lock_on_held_key_returns_none(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let m = manager(&b, Duration::from_secs(10))?;
    let k = key("trylock");
    let g = m.lock(&k).await.map_err(err)?;
    let other = manager(&f.open().await?, Duration::from_secs(10))?;
    let started = Instant::now();
    let second = other.try_lock(&k).await.map_err(err)?;
    ensure!(second.is_none(), "try_lock on a held key must return None");
    ensure!(
        started.elapsed() < Duration::from_secs(2),
        "try_lock must not wait (took {:?})",
        started.elapsed()
    );
    ensure!(g.is_held(), "the holder must still hold");
    Ok(Outcome::Passed)
}

/// Holds on different keys are independent.
pub async fn distinct_keys_do_not_conflict(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let m = manager(&b, Duration::from_secs(10))?;
    let base = key("distinct");
    let mut guards = Vec::new();
    for i in 0..5 {
        let g = m.try_lock(format!("{base}/{i}")).await.map_err(err)?;
        ensure!(g.is_some(), "key {i} of 5 distinct keys was not free");
        guards.push(g);
    }
    Ok(Outcome::Passed)
}

/// The last fence seen, how many hand-offs did not raise it, and the first.
type FenceLog = (Option<Fence>, u64, Option<String>);

async fn contend(
    managers: Vec<LockManager>,
    k: String,
    tasks_per_manager: usize,
    rounds: usize,
) -> Result<Contention, String> {
    let detector = OverlapDetector::new();
    let last: Arc<Mutex<FenceLog>> = Arc::default();
    let mut handles = Vec::new();
    for m in managers {
        for _ in 0..tasks_per_manager {
            let (m, k, d, last) = (m.clone(), k.clone(), detector.clone(), last.clone());
            handles.push(tokio::spawn(async move {
                for _ in 0..rounds {
                    let g = m.lock(&k).await.map_err(err)?;
                    d.enter();
                    if let Ok(mut l) = last.lock() {
                        if let Some(prev) = l.0 {
                            if g.fence() <= prev {
                                l.1 += 1;
                                if l.2.is_none() {
                                    l.2 = Some(format!("fence {} after {prev}", g.fence()));
                                }
                            }
                        }
                        l.0 = Some(g.fence());
                    }
                    tokio::task::yield_now().await;
                    d.exit();
                    g.release().await.map_err(err)?;
                }
                Ok::<(), String>(())
            }));
        }
    }
    for h in handles {
        h.await
            .map_err(|e| format!("a contending task panicked: {e}"))??;
    }
    let (fence_errors, first_fence_error) = match last.lock() {
        Ok(l) => (l.1, l.2.clone()),
        Err(_) => (0, None),
    };
    Ok(Contention {
        detector,
        fence_errors,
        first_fence_error,
    })
}

/// 16 tasks × 50 acquisitions of one key: never two inside at once.
pub async fn mutual_exclusion_under_contention(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let m = manager(&b, Duration::from_secs(10))?;
    let c = contend(vec![m], key("mutex"), 16, 50).await?;
    let d = &c.detector;
    ensure!(
        d.entries() == 800,
        "expected 800 entries, saw {}",
        d.entries()
    );
    ensure!(
        d.overlaps() == 0,
        "{} overlapping critical sections",
        d.overlaps()
    );
    ensure!(
        c.fence_errors == 0,
        "{} hand-offs did not raise the fence (first: {})",
        c.fence_errors,
        c.first_fence_error.unwrap_or_default()
    );
    Ok(Outcome::Passed)
}

/// 4 clients (separate handles) × 4 tasks × 10 acquisitions: no overlap.
pub async fn mutual_exclusion_across_clients(f: Factory) -> CaseResult {
    let mut managers = Vec::new();
    for _ in 0..4 {
        managers.push(manager(&f.open().await?, Duration::from_secs(10))?);
    }
    let c = contend(managers, key("mutex-clients"), 4, 10).await?;
    let d = &c.detector;
    ensure!(
        d.entries() == 160,
        "expected 160 entries, saw {}",
        d.entries()
    );
    ensure!(
        d.overlaps() == 0,
        "{} overlapping critical sections",
        d.overlaps()
    );
    ensure!(
        c.fence_errors == 0,
        "{} hand-offs did not raise the fence (first: {})",
        c.fence_errors,
        c.first_fence_error.unwrap_or_default()
    );
    Ok(Outcome::Passed)
}

/// Deleting with a token that does not hold the key changes nothing.
pub async fn release_with_foreign_token_changes_nothing(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let k = key("foreign-release");
    let (_owner, _) = raw_acquire(&b, &k, Duration::from_secs(10)).await?;
    let lk = k.parse().map_err(err)?;
    let deleted = b.delete(&lk, &Token::random()).await.map_err(err)?;
    ensure!(!deleted, "delete with a foreign token reported success");
    ensure!(
        !is_free(&b, &k, Duration::from_secs(10)).await?,
        "a foreign delete freed the key"
    );
    let free_key = key("foreign-release-free");
    let lk = free_key.parse().map_err(err)?;
    let deleted = b.delete(&lk, &Token::random()).await.map_err(err)?;
    ensure!(!deleted, "delete of a free key reported success");
    Ok(Outcome::Passed)
}

/// Renewing with a token that does not hold the key changes nothing.
pub async fn renew_with_foreign_token_changes_nothing(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let ttl = short_ttl(&b);
    let k = key("foreign-renew");
    let (_owner, _) = raw_acquire(&b, &k, ttl).await?;
    let lk = k.parse().map_err(err)?;
    let stranger = Token::random();
    let out = b
        .cas(&lk, Some(&stranger), &stranger, Duration::from_secs(60))
        .await
        .map_err(err)?;
    ensure!(
        matches!(out, CasOutcome::Held(_)),
        "renewal with a foreign token succeeded: {out:?}"
    );
    let other = f.open().await?;
    ensure!(
        becomes_free(&other, &k, ttl * 3).await?,
        "a foreign renewal extended the hold past its TTL"
    );
    Ok(Outcome::Passed)
}

/// `cas` with the wrong `expected` holder fails, on held and on free keys.
pub async fn cas_with_wrong_expected_changes_nothing(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let k = key("wrong-expected");
    let (owner, _) = raw_acquire(&b, &k, Duration::from_secs(10)).await?;
    let lk = k.parse().map_err(err)?;
    let (a, c) = (Token::random(), Token::random());
    let out = b
        .cas(&lk, Some(&a), &c, Duration::from_secs(10))
        .await
        .map_err(err)?;
    ensure!(
        matches!(out, CasOutcome::Held(_)),
        "cas with a wrong expected holder succeeded"
    );
    ensure!(
        b.delete(&lk, &owner).await.map_err(err)?,
        "the owner lost the key after a failed cas"
    );
    let out = b
        .cas(&lk, Some(&a), &c, Duration::from_secs(10))
        .await
        .map_err(err)?;
    ensure!(
        matches!(out, CasOutcome::Held(_)),
        "cas expecting a holder succeeded on a free key"
    );
    Ok(Outcome::Passed)
}

/// A second release of the same hold says it was not held.
pub async fn double_release_reports_not_held(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let m = manager(&b, Duration::from_secs(10))?;
    let k = key("double-release");
    let g = m.lock(&k).await.map_err(err)?;
    let (lk, token) = (g.key().clone(), g.token().clone());
    g.release().await.map_err(err)?;
    let again = b.delete(&lk, &token).await.map_err(err)?;
    ensure!(
        !again,
        "a second delete of a released hold reported success"
    );
    let g2 = m.lock(&k).await.map_err(err)?;
    let stale = b.delete(&lk, &token).await.map_err(err)?;
    ensure!(!stale, "a stale token deleted the next holder's key");
    ensure!(g2.is_held(), "the next holder must still hold");
    Ok(Outcome::Passed)
}

/// A hold nobody renews is still held before its TTL and free after it.
pub async fn key_expires_after_ttl(f: Factory) -> CaseResult {
    let holder = f.open().await?;
    let other = f.open().await?;
    let ttl = short_ttl(&holder);
    let k = key("expiry");
    let t = timed_acquire(&holder, &k, ttl).await?;
    let probes = [
        ("right after acquisition", t.replied),
        ("at half its TTL", t.sent + ttl / 2),
    ];
    for (what, at) in probes {
        tokio::time::sleep_until(at).await;
        if is_free(&other, &k, ttl).await? {
            ensure!(Instant::now() >= t.expiry, "the key was free {what}");
            return Err(format!("{INCONCLUSIVE}: the probe {what} ran past the TTL"));
        }
    }
    tokio::time::sleep_until(t.expiry).await;
    ensure!(
        becomes_free(&other, &k, ttl + EXPIRY_SLACK * 2).await?,
        "the key was still held long after its TTL"
    );
    Ok(Outcome::Passed)
}

/// A waiting `lock()` gets the key once an unrenewed hold expires.
pub async fn waiter_acquires_after_holder_stops_renewing(f: Factory) -> CaseResult {
    let holder = f.open().await?;
    let ttl = short_ttl(&holder);
    let k = key("waiter-expiry");
    let started = Instant::now();
    raw_acquire(&holder, &k, ttl).await?;
    let m = manager(&f.open().await?, ttl)?;
    let g = m.lock_timeout(&k, ttl * 4).await.map_err(err)?;
    let waited = started.elapsed();
    ensure!(
        waited >= ttl.mul_f64(0.9),
        "acquired after {waited:?}, before the TTL {ttl:?}"
    );
    ensure!(g.is_held(), "the waiter's guard must be held");
    // The takeover must have made the waiter the owner: its renewals over
    // the next TTL keep it held.
    let probe = f.open().await?;
    tokio::time::sleep(ttl).await;
    ensure!(
        g.is_held(),
        "the waiter lost the key it took over within one TTL (its renewals were refused)"
    );
    ensure!(
        !is_free(&probe, &k, ttl).await?,
        "the key taken over from an expired holder was free a TTL later"
    );
    Ok(Outcome::Passed)
}

/// A guard that lives for several TTLs keeps its key all along.
pub async fn renewal_keeps_lock_past_several_ttls(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let ttl = short_ttl(&b);
    let m = manager(&b, ttl)?;
    let k = key("renewal");
    let g = m.lock(&k).await.map_err(err)?;
    let other = manager(&f.open().await?, ttl)?;
    let until = Instant::now() + ttl * 3;
    while Instant::now() < until {
        ensure!(g.is_held(), "the guard stopped being held while renewed");
        let stolen = other.try_lock(&k).await.map_err(err)?;
        ensure!(stolen.is_none(), "another client acquired a renewed key");
        tokio::time::sleep(ttl / 4).await;
    }
    g.release().await.map_err(err)?;
    Ok(Outcome::Passed)
}

/// 20 holds of one manager all stay held across three TTLs.
pub async fn batch_renewal_keeps_many_locks(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let ttl = short_ttl(&b);
    let m = manager(&b, ttl)?;
    let base = key("batch");
    let mut guards = Vec::new();
    for i in 0..20 {
        guards.push(m.lock(format!("{base}/{i}")).await.map_err(err)?);
    }
    tokio::time::sleep(ttl * 3).await;
    let other = f.open().await?;
    for (i, g) in guards.iter().enumerate() {
        ensure!(g.is_held(), "hold {i} of 20 was lost");
        ensure!(
            !is_free(&other, &format!("{base}/{i}"), ttl).await?,
            "key {i} of 20 expired"
        );
    }
    ensure!(
        m.held_count() == 20,
        "the manager renews {} holds, not 20",
        m.held_count()
    );
    Ok(Outcome::Passed)
}

/// Fences grow strictly from one acquisition to the next after release.
pub async fn fences_increase_across_release(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let m = manager(&b, Duration::from_secs(10))?;
    let k = key("fence-release");
    let mut last: Option<Fence> = None;
    for i in 0..10 {
        let g = m.lock(&k).await.map_err(err)?;
        if let Some(prev) = last {
            ensure!(
                g.fence() > prev,
                "fence {} after {prev} at round {i}",
                g.fence()
            );
        }
        last = Some(g.fence());
        g.release().await.map_err(err)?;
    }
    Ok(Outcome::Passed)
}

/// A fence after expiry exceeds the expired hold's fence.
pub async fn fences_increase_across_expiry(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let ttl = short_ttl(&b);
    let k = key("fence-expiry");
    let (_, first) = raw_acquire(&b, &k, ttl).await?;
    let m = manager(&f.open().await?, ttl)?;
    let g = m.lock_timeout(&k, ttl * 4).await.map_err(err)?;
    ensure!(
        g.fence() > first,
        "fence {} after expiry of fence {first}",
        g.fence()
    );
    Ok(Outcome::Passed)
}

/// Fences keep growing when a new client (a restarted process) takes over.
pub async fn fences_increase_across_clients(f: Factory) -> CaseResult {
    let k = key("fence-clients");
    let mut last: Option<Fence> = None;
    for i in 0..4 {
        let m = manager(&f.open().await?, Duration::from_secs(10))?;
        let g = m.lock(&k).await.map_err(err)?;
        if let Some(prev) = last {
            ensure!(
                g.fence() > prev,
                "client {i} got fence {} after {prev}",
                g.fence()
            );
        }
        last = Some(g.fence());
        g.release().await.map_err(err)?;
    }
    Ok(Outcome::Passed)
}

/// A resource that remembers fences refuses the expired holder's late write.
pub async fn fenced_resource_refuses_stale_holder(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let ttl = short_ttl(&b);
    let k = key("fenced");
    let resource = FencedResource::new();
    let (_, stale) = raw_acquire(&b, &k, ttl).await?;
    ensure!(
        resource.write(stale),
        "the first holder's write was refused"
    );
    let m = manager(&f.open().await?, ttl)?;
    let g = m.lock_timeout(&k, ttl * 4).await.map_err(err)?;
    ensure!(
        resource.write(g.fence()),
        "the new holder's write was refused"
    );
    ensure!(
        !resource.write(stale),
        "the stale holder's late write was accepted"
    );
    ensure!(resource.accepted() == 2, "expected 2 accepted writes");
    Ok(Outcome::Passed)
}

/// Deleting the key behind the holder's back fires `lost()` within about one
/// renewal interval (TTL/3).
pub async fn lost_fires_when_key_deleted_behind_holder(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let ttl = short_ttl(&b) * 3;
    let m = manager(&b, ttl)?;
    let k = key("lost-deleted");
    let g = m.lock(&k).await.map_err(err)?;
    let other = f.open().await?;
    ensure!(
        other.delete(g.key(), g.token()).await.map_err(err)?,
        "the second handle could not delete the hold"
    );
    let deleted_at = Instant::now();
    let bound = ttl / 3 + ttl / 6;
    let reason = tokio::time::timeout(bound, g.lost()).await;
    ensure!(
        reason.is_ok(),
        "lost() did not fire within {bound:?} of the deletion"
    );
    ensure!(!g.is_held(), "is_held() is true after lost()");
    ensure!(g.check().is_err(), "check() passes after lost()");
    ensure!(
        deleted_at.elapsed() < ttl,
        "lost() fired only after a whole TTL"
    );
    Ok(Outcome::Passed)
}

/// When renewals stop reaching the store, `lost()` fires before the store
/// could hand the key to anyone else, with the manager's default drift
/// allowance (2 %) and a TTL that is not a whole number of seconds.
pub async fn lost_fires_before_store_expiry_when_cut_off(f: Factory) -> CaseResult {
    let store = f.open().await?;
    let ttl = short_ttl(&store) * 2 + Duration::from_millis(250);
    let cut = Partition::new(store);
    let m = LockManager::builder(cut.clone())
        .ttl(ttl)
        .build()
        .map_err(err)?;
    let k = key("lost-cut");
    let other = f.open().await?;
    let asked_at = Instant::now();
    let g = m.lock(&k).await.map_err(err)?;
    cut.cut();
    // A store whose holds hang on a lease of whole seconds may promise more
    // than the TTL; `lost()` must come before what it promised.
    let promised = (asked_at + ttl).max(cut.earliest_expiry(ttl, asked_at));
    // A timer of our own for the guard's deadline: if it too wakes well past
    // it, the runtime stalled and a late lost() proves nothing.
    let deadline = Instant::now() + g.valid_for().unwrap_or_default();
    let own_timer = tokio::spawn(async move {
        tokio::time::sleep_until(deadline).await;
        Instant::now()
    });
    let reason = tokio::time::timeout(ttl * 2, g.lost()).await;
    let lost_at = Instant::now();
    let own_woke = own_timer.await.map_err(|e| e.to_string())?;
    let margin = promised.saturating_duration_since(deadline);
    if lost_at >= promised && own_woke >= deadline + margin / 2 {
        return Err(format!(
            "{INCONCLUSIVE}: a timer for the guard's deadline woke {:?} late",
            own_woke - deadline
        ));
    }
    let still_held = !is_free(&other, &k, ttl).await?;
    let probed_at = Instant::now();
    ensure!(reason.is_ok(), "lost() never fired while cut off");
    ensure!(
        lost_at < promised,
        "lost() fired {:?} after the acquire was sent, past the TTL {ttl:?} and the store's \
         promise ({:?})",
        lost_at - asked_at,
        promised - asked_at
    );
    if !still_held && probed_at >= promised {
        return Err(format!(
            "{INCONCLUSIVE}: the probe after lost() was answered only {:?} after the acquire \
             was sent (TTL {ttl:?})",
            probed_at - asked_at
        ));
    }
    ensure!(
        still_held,
        "the store had already freed the key when lost() fired ({:?} after the acquire was \
         sent, TTL {ttl:?})",
        lost_at - asked_at
    );
    ensure!(!g.is_held(), "is_held() is true after lost()");
    cut.heal();
    drop(g);
    ensure!(
        becomes_free(&other, &k, ttl * 2).await?,
        "the key never became free after the cut-off holder gave up"
    );
    Ok(Outcome::Passed)
}

/// The manager's lost callback runs once for a lost hold, not for releases.
pub async fn lost_callback_is_called(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let ttl = short_ttl(&b) * 3;
    let calls = Arc::new(AtomicU64::new(0));
    let seen = calls.clone();
    let m = LockManager::builder(b.clone())
        .ttl(ttl)
        .on_lost(move |_| {
            seen.fetch_add(1, Ordering::SeqCst);
        })
        .build()
        .map_err(err)?;
    let released = m.lock(key("callback-released")).await.map_err(err)?;
    released.release().await.map_err(err)?;
    let g = m.lock(key("callback-lost")).await.map_err(err)?;
    let other = f.open().await?;
    other.delete(g.key(), g.token()).await.map_err(err)?;
    let until = Instant::now() + ttl;
    while calls.load(Ordering::SeqCst) == 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(ttl / 3).await;
    let n = calls.load(Ordering::SeqCst);
    ensure!(n == 1, "the lost callback ran {n} times, not once");
    Ok(Outcome::Passed)
}

/// Dropping a waiting `lock()` future leaves no hold once the holder releases.
pub async fn dropped_waiter_leaves_no_hold(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let m = manager(&b, Duration::from_secs(10))?;
    let k = key("dropped-waiter");
    let g = m.lock(&k).await.map_err(err)?;
    let waiter = manager(&f.open().await?, Duration::from_secs(10))?;
    let w = tokio::time::timeout(Duration::from_millis(200), waiter.lock(&k)).await;
    ensure!(w.is_err(), "the waiter acquired a held key");
    g.release().await.map_err(err)?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let third = f.open().await?;
    ensure!(
        is_free(&third, &k, Duration::from_secs(10)).await?,
        "a dropped waiter left a hold"
    );
    ensure!(
        waiter.held_count() == 0,
        "the dropped waiter's manager renews a hold"
    );
    Ok(Outcome::Passed)
}

/// Acquisitions cancelled mid-request leave no hold behind. A delay wrapper
/// makes every request take 15 ms on each side of the store, and the
/// acquisitions are dropped at budgets spread over that window: before the
/// request leaves, while the store works, and after it granted the hold but
/// before the reply arrives. The key (TTL 30 s) must be free soon after,
/// and still free once every cleanup has had its time (a request that lands
/// late must not leave an orphan either).
pub async fn cancelled_acquires_leave_no_orphan(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let ttl = Duration::from_secs(30);
    let side = Duration::from_millis(15);
    let slow = Delay::new(b, side, side);
    let m = LockManager::builder(slow.clone())
        .ttl(ttl)
        .retry(RetryPolicy::Fixed(Duration::from_millis(20)))
        .build()
        .map_err(err)?;
    let k = key("cancelled");
    let budgets_ms = [2u64, 10, 16, 20, 24, 28, 33, 40];
    for i in 0..32u64 {
        let fixed = budgets_ms[usize::try_from(i).unwrap_or(0) % budgets_ms.len()];
        let jitter = fastish_random(i) % 4_000;
        let budget = Duration::from_millis(fixed) + Duration::from_micros(jitter);
        if let Ok(r) = tokio::time::timeout(budget, m.lock(&k)).await {
            r.map_err(err)?.release().await.map_err(err)?;
        }
    }
    let last_cancel = Instant::now();
    ensure!(
        slow.landed_then_dropped() >= 2,
        "{INCONCLUSIVE}: only {} acquisitions were cancelled after the store granted them",
        slow.landed_then_dropped()
    );
    let other = f.open().await?;
    ensure!(
        becomes_free(&other, &k, Duration::from_secs(5)).await?,
        "a cancelled acquire left a hold that outlived its cleanup (TTL is {ttl:?})"
    );
    tokio::time::sleep_until(last_cancel + Duration::from_secs(6)).await;
    ensure!(
        is_free(&other, &k, Duration::from_secs(5)).await?,
        "a cancelled acquire landed after its cleanup and left a hold nobody owns (TTL {ttl:?})"
    );
    Ok(Outcome::Passed)
}

fn fastish_random(seed: u64) -> u64 {
    let x = uuid::Uuid::new_v4().as_u128() as u64;
    x ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Dropping a guard releases its key in the background, soon.
pub async fn dropped_guard_releases_key(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let m = manager(&b, Duration::from_secs(30))?;
    let k = key("dropped-guard");
    let g = m.lock(&k).await.map_err(err)?;
    drop(g);
    let other = f.open().await?;
    ensure!(
        becomes_free(&other, &k, Duration::from_secs(3)).await?,
        "a dropped guard kept its key"
    );
    ensure!(
        m.held_count() == 0,
        "the manager still renews a dropped guard"
    );
    Ok(Outcome::Passed)
}

/// The longest key the backend declares, and non-ASCII keys, work.
pub async fn longest_allowed_key_and_unicode_work(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let m = manager(&b, Duration::from_secs(10))?;
    let limit = b.limits().max_key_len;
    let prefix = key("long");
    let mut longest = prefix.clone();
    while longest.len() < limit {
        longest.push('x');
    }
    let g = m.try_lock(&longest).await.map_err(err)?;
    ensure!(
        g.is_some(),
        "a key of exactly {limit} bytes was not acquired"
    );
    let uni = format!("{prefix}/ключ/锁/🔒 space'quote\"");
    let g = m.try_lock(&uni).await.map_err(err)?;
    ensure!(g.is_some(), "a Unicode key was not acquired");
    let again = manager(&f.open().await?, Duration::from_secs(10))?;
    ensure!(
        again.try_lock(&uni).await.map_err(err)?.is_none(),
        "the Unicode key was not exclusive"
    );
    Ok(Outcome::Passed)
}

/// With release notifications, a waiter gets the key well before its next
/// poll would (the retry policy here waits 5 s).
pub async fn release_wakes_waiter_quickly(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let holder = manager(&b, Duration::from_secs(10))?;
    let waiter = LockManager::builder(f.open().await?)
        .ttl(Duration::from_secs(10))
        .retry(RetryPolicy::Fixed(Duration::from_secs(5)))
        .build()
        .map_err(err)?;
    let k = key("wakeup");
    let g = holder.lock(&k).await.map_err(err)?;
    let k2 = k.clone();
    let task = tokio::spawn(async move {
        let g = waiter.lock(&k2).await.map_err(err)?;
        Ok::<_, String>((Instant::now(), g))
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let released_at = Instant::now();
    g.release().await.map_err(err)?;
    let (acquired_at, _g) = task.await.map_err(|e| e.to_string())??;
    let gap = acquired_at - released_at;
    ensure!(
        gap < Duration::from_secs(1),
        "the waiter took {gap:?} after the release"
    );
    Ok(Outcome::Passed)
}

/// `inspect` and `list` report the holder, its fence and time left.
pub async fn inspect_reports_holder(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let m = manager(&b, Duration::from_secs(10))?;
    let k = key("inspect");
    let g = m.lock(&k).await.map_err(err)?;
    let info = b.inspect(g.key()).await.map_err(err)?;
    let info = info.ok_or("inspect found no holder of a held key")?;
    ensure!(&info.holder == g.token(), "inspect reports another holder");
    ensure!(info.key == k, "inspect reports the key {:?}", info.key);
    if let Some(fence) = info.fence {
        ensure!(
            fence == g.fence(),
            "inspect reports fence {fence}, not {}",
            g.fence()
        );
    }
    if let Some(left) = info.expires_in {
        ensure!(
            left <= Duration::from_secs(10),
            "inspect reports {left:?} left of a 10 s TTL"
        );
    }
    let prefix = k.rsplit_once('/').map(|(p, _)| p).unwrap_or(&k);
    let listed = b.list(prefix).await.map_err(err)?;
    ensure!(
        listed.iter().any(|i| i.key == k),
        "list under {prefix:?} misses the hold"
    );
    g.release().await.map_err(err)?;
    let info = b.inspect(&k.parse().map_err(err)?).await.map_err(err)?;
    ensure!(info.is_none(), "inspect reports a holder after release");
    Ok(Outcome::Passed)
}

/// In fair mode waiters get the key strictly in arrival order.
pub async fn fair_queue_serves_in_arrival_order(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let m = manager(&b, Duration::from_secs(10))?;
    let k = key("fair");
    let first = m
        .acquire(&k, LockOptions::new().fair())
        .await
        .map_err(err)?;
    let first = first.ok_or("fair acquire returned no guard")?;
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..5usize {
        let (m, k, order) = (
            manager(&f.open().await?, Duration::from_secs(10))?,
            k.clone(),
            order.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let g = m
                .acquire(&k, LockOptions::new().fair())
                .await
                .map_err(err)?;
            let g = g.ok_or("fair acquire returned no guard")?;
            if let Ok(mut o) = order.lock() {
                o.push(i);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            g.release().await.map_err(err)
        }));
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    first.release().await.map_err(err)?;
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    let got = order.lock().map(|o| o.clone()).unwrap_or_default();
    ensure!(
        got == vec![0, 1, 2, 3, 4],
        "served in the order {got:?}, not arrival order"
    );
    Ok(Outcome::Passed)
}

/// `raise_fence` makes every later fence of the key exceed the minimum, and
/// later fences keep rising from there.
pub async fn raise_fence_lifts_later_fences(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let m = manager(&b, Duration::from_secs(10))?;
    let k = key("raise");
    let g = m.lock(&k).await.map_err(err)?;
    let minimum = Fence(g.fence().get().saturating_add(1_000_000));
    b.raise_fence(g.key(), minimum).await.map_err(err)?;
    g.release().await.map_err(err)?;
    let other = manager(&f.open().await?, Duration::from_secs(10))?;
    let mut last = minimum;
    let inspect = b.inspector().is_some();
    for _ in 0..3 {
        let g = other.lock(&k).await.map_err(err)?;
        ensure!(
            g.fence() > last,
            "fence {} after {last} (the minimum was raised to {minimum})",
            g.fence()
        );
        last = g.fence();
        if inspect {
            // What inspect and list report is the hold's own fence, minimum
            // included.
            let info = b.inspect(g.key()).await.map_err(err)?;
            let reported = info.and_then(|i| i.fence);
            ensure!(
                reported.is_none_or(|r| r == g.fence()),
                "inspect reports fence {reported:?} for a hold of fence {}",
                g.fence()
            );
            let listed = b.list(&k).await.map_err(err)?;
            let reported = listed.iter().find(|i| i.key == k).and_then(|i| i.fence);
            ensure!(
                reported.is_none_or(|r| r == g.fence()),
                "list reports fence {reported:?} for a hold of fence {}",
                g.fence()
            );
        }
        g.release().await.map_err(err)?;
    }
    Ok(Outcome::Passed)
}
