//! Helpers the cases share: keys, managers, timing, contention.

pub(super) use std::sync::atomic::{AtomicU64, Ordering};
pub(super) use std::sync::{Arc, Mutex};
pub(super) use std::time::Duration;

pub(super) use moltlock_core::{
    Backend, CasOutcome, Error, Fence, LockManager, RetryPolicy, Token,
};
pub(super) use tokio::time::Instant;

pub(super) use crate::{
    CaseResult, Delay, Factory, FencedResource, Outcome, OverlapDetector, Partition, INCONCLUSIVE,
    SLOW,
};

/// A store error as a case's message; a retryable one (the store did not
/// answer in time) starts with [`SLOW`], so the case is run again.
pub(super) fn err(e: Error) -> String {
    if e.is_retryable() {
        format!("{SLOW}: {e}")
    } else {
        e.to_string()
    }
}

std::thread_local! {
    /// The keys [`key`] handed out on this thread (a case's own future runs
    /// on its test's thread), for the factory's cleanup.
    static HANDED_OUT: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A key under a prefix of its own, so cases can share a store.
pub(super) fn key(case: &str) -> String {
    let key = format!("mlconf/{case}/{}", uuid::Uuid::new_v4().simple());
    HANDED_OUT.with(|keys| keys.borrow_mut().push(key.clone()));
    key
}

/// The keys handed out on this thread since the last call; forgets them.
pub(crate) fn take_keys() -> Vec<String> {
    HANDED_OUT.with(|keys| std::mem::take(&mut *keys.borrow_mut()))
}

/// The short TTL the expiry cases use: 1 s, or the backend's floor.
pub(super) fn short_ttl(b: &Arc<dyn Backend>) -> Duration {
    b.limits().min_ttl.max(Duration::from_secs(1))
}

pub(super) fn manager(b: &Arc<dyn Backend>, ttl: Duration) -> Result<LockManager, String> {
    LockManager::builder(b.clone())
        .ttl(ttl)
        .retry(RetryPolicy::Fixed(Duration::from_millis(20)))
        .build()
        .map_err(err)
}

pub(super) async fn raw_acquire(
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

pub(super) async fn is_free(
    b: &Arc<dyn Backend>,
    key: &str,
    ttl: Duration,
) -> Result<bool, String> {
    Ok(holder_of(b, key, ttl).await?.is_none())
}

/// What holds `key`, found by trying to take it (with `ttl`): `None` when
/// it was free (the probe's own hold is deleted again).
pub(super) async fn holder_of(
    b: &Arc<dyn Backend>,
    key: &str,
    ttl: Duration,
) -> Result<Option<moltlock_core::Held>, String> {
    let k = key.parse().map_err(err)?;
    let token = Token::random();
    match b.cas(&k, None, &token, ttl).await.map_err(err)? {
        CasOutcome::Acquired { .. } => {
            b.delete(&k, &token).await.map_err(err)?;
            Ok(None)
        }
        CasOutcome::Held(h) => Ok(Some(h)),
    }
}

/// Polls until `key` is free, for at most `within`.
pub(super) async fn becomes_free(
    b: &Arc<dyn Backend>,
    key: &str,
    within: Duration,
) -> Result<bool, String> {
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
pub(super) const EXPIRY_SLACK: Duration = Duration::from_millis(750);

/// The manager's default clock-drift allowance.
pub(super) const DEFAULT_DRIFT: f64 = 0.02;

/// A hold taken by [`timed_acquire`], with when its request went out and
/// came back.
pub(super) struct Timed {
    pub(super) token: Token,
    pub(super) fence: Fence,
    pub(super) ttl: Duration,
    pub(super) sent: Instant,
    pub(super) replied: Instant,
    /// What the backend promised: it will not expire the hold before this.
    pub(super) expiry: Instant,
}

impl Timed {
    /// The local validity deadline a manager with the default drift gives
    /// this hold.
    pub(super) fn trusted(&self) -> Instant {
        let span = self.expiry.saturating_duration_since(self.sent);
        self.sent + span.mul_f64(1.0 - DEFAULT_DRIFT)
    }

    /// By when the store must have expired the hold: the request landed by
    /// `replied` at the latest, plus the span, plus [`EXPIRY_SLACK`].
    pub(super) fn surely_gone(&self) -> Instant {
        self.replied + self.expiry.saturating_duration_since(self.sent) + EXPIRY_SLACK
    }

    /// A renewal of this hold, sent now, was confirmed.
    pub(super) fn renewed(&mut self, b: &Arc<dyn Backend>, sent: Instant) {
        self.sent = sent;
        self.replied = Instant::now();
        self.expiry = b.earliest_expiry(self.ttl, sent);
    }
}

/// Acquires a free key with a fresh token, timing the request.
pub(super) async fn timed_acquire(
    b: &Arc<dyn Backend>,
    key: &str,
    ttl: Duration,
) -> Result<Timed, String> {
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
pub(super) async fn renew(
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
pub(super) async fn expect_held_until_deadline(
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
pub(super) async fn expect_gone_after_expiry(
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
pub(super) struct Contention {
    pub(super) detector: OverlapDetector,
    /// Hand-offs whose new fence was not above the previous holder's.
    pub(super) fence_errors: u64,
    pub(super) first_fence_error: Option<String>,
}

impl Contention {
    /// Passed when there were `entries` critical sections, none overlapping,
    /// and every hand-off raised the fence.
    pub(super) fn verdict(&self, entries: u64) -> CaseResult {
        let d = &self.detector;
        ensure!(
            d.entries() == entries,
            "expected {entries} entries, saw {}",
            d.entries()
        );
        ensure!(
            d.overlaps() == 0,
            "{} overlapping critical sections",
            d.overlaps()
        );
        ensure!(
            self.fence_errors == 0,
            "{} hand-offs did not raise the fence (first: {})",
            self.fence_errors,
            self.first_fence_error.clone().unwrap_or_default()
        );
        Ok(Outcome::Passed)
    }
}

pub(super) async fn contend(
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

/// The last fence seen, how many hand-offs did not raise it, and the first.
pub(super) type FenceLog = (Option<Fence>, u64, Option<String>);

/// A long TTL for holds that must not expire during a case.
pub(super) const LONG: Duration = Duration::from_secs(10);

/// Once a request cancelled at `last_cancel` can no longer land (the
/// backend's late-write bound, and a second more), every key must be free:
/// a late landing must not leave a hold nobody owns.
pub(super) async fn free_after_late_writes(
    b: &Arc<dyn Backend>,
    keys: &[String],
    last_cancel: Instant,
) -> CaseResult {
    tokio::time::sleep_until(last_cancel + b.limits().late_write + Duration::from_secs(1)).await;
    for k in keys {
        ensure!(
            is_free(b, k, LONG).await?,
            "a cancelled acquisition landed late on {k} and left a hold nobody owns"
        );
    }
    Ok(Outcome::Passed)
}

/// The longest a store may take to answer a probe of
/// [`ends_while_the_store_answers`] and still count as answering.
pub(super) const PROMPT: Duration = Duration::from_millis(500);

/// Waits up to `patience` more for `task` while probing the store on a
/// key of its own every 100 ms: its result, or `None` when it is still
/// running at the end although every probe was answered within
/// [`PROMPT`] (the store's doing, not load's). A probe answered late is an
/// error that starts with [`SLOW`].
pub(super) async fn ends_while_the_store_answers<T>(
    b: &Arc<dyn Backend>,
    task: &mut tokio::task::JoinHandle<T>,
    patience: Duration,
) -> Result<Option<Result<T, tokio::task::JoinError>>, String> {
    let until = Instant::now() + patience;
    let probe = key("probe");
    while Instant::now() < until {
        if task.is_finished() {
            return Ok(Some(task.await));
        }
        let sent = Instant::now();
        is_free(b, &probe, short_ttl(b)).await?;
        let took = sent.elapsed();
        if took > PROMPT {
            return Err(format!("{SLOW}: the store took {took:?} to answer a probe"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if task.is_finished() {
        return Ok(Some(task.await));
    }
    Ok(None)
}
