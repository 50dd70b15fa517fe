//! The shared state of one held lock, read by its guard and the renewal driver.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::job::Terms;
use crate::{Fence, LockKey, LostReason, Token};

/// The part of a hold that changes: how long it is valid and whether it was lost.
#[derive(Clone, Debug)]
pub(crate) struct HoldState {
    pub(crate) valid_until: Instant,
    pub(crate) lost: Option<LostReason>,
    /// Its owner released it: it can no longer be lost.
    pub(crate) released: bool,
}

/// What the store granted.
pub(crate) struct Grant {
    pub(crate) key: LockKey,
    pub(crate) token: Token,
    pub(crate) fence: Fence,
    pub(crate) terms: Terms,
}

/// One held lock.
pub(crate) struct Hold {
    pub(crate) id: u64,
    pub(crate) key: LockKey,
    pub(crate) token: Token,
    pub(crate) fence: Fence,
    pub(crate) ttl: Duration,
    /// The TTL with the job limits, counted from `first_sent`.
    pub(crate) terms: Terms,
    /// When the acquire request was sent.
    pub(crate) first_sent: Instant,
    pub(crate) interval: Duration,
    pub(crate) drift: f64,
    pub(crate) acquired_at: Instant,
    pub(crate) state: watch::Sender<HoldState>,
    next_renew: Mutex<Instant>,
    /// A renewal batch carrying this hold is in flight.
    renewing: AtomicBool,
    /// Its holder listens for release requests ([`crate::ask`]).
    pub(crate) listening: AtomicBool,
    /// A release request for this hold was seen; made when first asked
    /// or listened to (most holds never are, and a channel costs a few
    /// hundred bytes).
    asked: OnceLock<watch::Sender<bool>>,
}

impl Hold {
    /// A hold whose acquire request was sent at `sent_at`; the store will not
    /// expire it before `expiry`.
    /// `first_sent`: when the acquire request was sent (job limits count
    /// from it); `sent_at`: when the request that confirmed the hold was.
    pub(crate) fn new(
        id: u64,
        grant: Grant,
        drift: f64,
        (first_sent, sent_at): (Instant, Instant),
        expiry: Instant,
    ) -> Self {
        let interval = grant.terms.ttl / 3;
        let state = HoldState {
            valid_until: capped(
                valid_until(sent_at, expiry, drift),
                first_sent,
                &grant.terms,
            ),
            lost: None,
            released: false,
        };
        Self {
            id,
            key: grant.key,
            token: grant.token,
            fence: grant.fence,
            ttl: grant.terms.ttl,
            terms: grant.terms,
            first_sent,
            interval,
            drift,
            acquired_at: Instant::now(),
            state: watch::Sender::new(state),
            next_renew: Mutex::new(sent_at + interval),
            renewing: AtomicBool::new(false),
            listening: AtomicBool::new(false),
            asked: OnceLock::new(),
        }
    }

    /// Whether a release request for this hold was seen.
    pub(crate) fn was_asked(&self) -> bool {
        self.asked.get().is_some_and(|a| *a.borrow())
    }

    /// Records that a release request for this hold was seen.
    pub(crate) fn ask(&self) {
        self.asked_channel().send_replace(true);
    }

    /// The channel that tells whether a release request was seen.
    pub(crate) fn asked_channel(&self) -> &watch::Sender<bool> {
        self.asked.get_or_init(|| watch::Sender::new(false))
    }

    /// The TTL a request of this hold sent at `sent_at` asks for; `None`
    /// once its at-most time has passed.
    pub(crate) fn ttl_at(&self, sent_at: Instant) -> Option<Duration> {
        self.terms
            .ttl_at(sent_at.saturating_duration_since(self.first_sent))
    }

    /// Whether the hold's validity reached its at-most time: the deadline
    /// a renewal cut to the at-most time gives, give or take the drift
    /// allowance of one interval.
    pub(crate) fn at_most_reached(&self, now: Instant) -> bool {
        let Some(most) = self.terms.job.at_most else {
            return false;
        };
        let slack = self.interval.mul_f64(self.drift) + Duration::from_millis(1);
        now + slack >= self.first_sent + most
    }

    /// What is left of the hold's at-least time.
    pub(crate) fn at_least_left(&self) -> Option<Duration> {
        self.terms.at_least_left(self.first_sent.elapsed())
    }

    pub(crate) fn snapshot(&self) -> HoldState {
        self.state.borrow().clone()
    }

    /// Lost or released: no longer renewed.
    pub(crate) fn is_lost(&self) -> bool {
        let s = self.state.borrow();
        s.lost.is_some() || s.released
    }

    pub(crate) fn valid_until(&self) -> Instant {
        self.state.borrow().valid_until
    }

    pub(crate) fn is_renewing(&self) -> bool {
        self.renewing.load(Ordering::Acquire)
    }

    pub(crate) fn set_renewing(&self, on: bool) {
        self.renewing.store(on, Ordering::Release);
    }

    pub(crate) fn next_renew(&self) -> Instant {
        match self.next_renew.lock() {
            Ok(t) => *t,
            Err(poisoned) => *poisoned.into_inner(),
        }
    }

    pub(crate) fn set_next_renew(&self, at: Instant) {
        match self.next_renew.lock() {
            Ok(mut t) => *t = at,
            Err(poisoned) => *poisoned.into_inner() = at,
        }
    }

    /// A renewal whose request was sent at `sent_at` was confirmed by the
    /// store, which will not expire it before `expiry`.
    pub(crate) fn confirm(&self, sent_at: Instant, expiry: Instant) {
        let until = capped(
            valid_until(sent_at, expiry, self.drift),
            self.first_sent,
            &self.terms,
        );
        self.state.send_if_modified(|s| {
            if s.lost.is_some() || until <= s.valid_until {
                return false;
            }
            s.valid_until = until;
            true
        });
        self.set_next_renew(sent_at + self.interval);
    }

    /// The store's clock stepped forward by `step`: the hold is valid that
    /// much less, and due for renewal now.
    pub(crate) fn shorten(&self, step: Duration) {
        let now = Instant::now();
        self.state.send_if_modified(|s| {
            if s.lost.is_some() {
                return false;
            }
            s.valid_until = s.valid_until.checked_sub(step).unwrap_or(now);
            true
        });
        self.set_next_renew(now);
    }

    /// Marks the hold lost unless it was lost or released before; returns
    /// whether this call did. A [`LostReason::Deadline`] is only taken once
    /// the deadline has passed.
    pub(crate) fn mark_lost(&self, reason: LostReason) -> bool {
        let now = Instant::now();
        self.state.send_if_modified(|s| {
            let early = reason == LostReason::Deadline && now < s.valid_until;
            if s.lost.is_some() || s.released || early {
                return false;
            }
            s.lost = Some(reason);
            true
        })
    }

    /// Marks the hold released unless it was lost or released before;
    /// returns whether this call did.
    pub(crate) fn mark_released(&self) -> bool {
        self.state.send_if_modified(|s| {
            if s.lost.is_some() || s.released {
                return false;
            }
            s.released = true;
            true
        })
    }
}

/// `sent_at + (expiry − sent_at) × (1 − drift)`: the drift allowance shortens
/// the span the store promised.
fn valid_until(sent_at: Instant, expiry: Instant, drift: f64) -> Instant {
    let span = expiry.saturating_duration_since(sent_at);
    sent_at + span.mul_f64((1.0 - drift).clamp(0.0, 1.0))
}

/// `until`, but no later than the at-most time of a hold whose acquire
/// request was sent at `first_sent`.
fn capped(until: Instant, first_sent: Instant, terms: &Terms) -> Instant {
    match terms.job.at_most {
        Some(most) => until.min(first_sent + most),
        None => until,
    }
}
