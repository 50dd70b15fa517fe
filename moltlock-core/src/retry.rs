//! How long a waiter sleeps between attempts when no notification wakes it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::{Held, Token};

/// The delay before the next acquire attempt of a waiting `lock()`.
///
/// With a backend that notifies on release, this is only the fallback for
/// missed notifications and expiries; the waiter wakes at once on a release.
///
/// A polling waiter (no release watch) that sees a busy key change hands
/// between two attempts starts its back-off afresh: the key is moving, and
/// a waiter that backed off through one long hold would otherwise look
/// once a second at a key taken and released many times a second, while
/// the waiters that came later look far more often and take it first.
/// Behind one long hold the delay grows as the policy says.
#[derive(Clone)]
pub enum RetryPolicy {
    /// The same delay every time, with ±25 % jitter so waiters spread out.
    Fixed(Duration),
    /// `initial × 2^attempt`, capped at `max`, with "equal jitter" (a random
    /// value between half the delay and the full delay).
    Exponential {
        /// The first delay.
        initial: Duration,
        /// The largest delay.
        max: Duration,
    },
    /// A closure from the attempt number (0 for the first retry) to a delay.
    Custom(Arc<dyn Fn(u32) -> Duration + Send + Sync>),
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::Exponential {
            initial: Duration::from_millis(10),
            max: Duration::from_secs(1),
        }
    }
}

impl fmt::Debug for RetryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Fixed(d) => write!(f, "Fixed({d:?})"),
            Self::Exponential { initial, max } => {
                write!(f, "Exponential {{ initial: {initial:?}, max: {max:?} }}")
            }
            Self::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

impl RetryPolicy {
    /// A policy from a closure (the attempt number to a delay).
    pub fn custom(f: impl Fn(u32) -> Duration + Send + Sync + 'static) -> Self {
        Self::Custom(Arc::new(f))
    }

    /// The delay before retry number `attempt` (0-based).
    pub fn delay(&self, attempt: u32) -> Duration {
        match self {
            Self::Fixed(d) => d.mul_f64(0.75 + fastrand::f64() * 0.5),
            Self::Exponential { initial, max } => {
                let factor = 2u32.saturating_pow(attempt.min(30));
                let full = initial.saturating_mul(factor).min(*max);
                full.mul_f64(0.5 + fastrand::f64() * 0.5)
            }
            Self::Custom(f) => f(attempt),
        }
    }
}

/// Which retry of a policy a waiting acquisition is at: one more per pause,
/// back to the first when a polling waiter sees a busy key's holder change.
#[derive(Default)]
pub(crate) struct Backoff {
    step: u32,
    seen: Vec<(usize, Token)>,
}

impl Backoff {
    /// The retry number for the pause after an attempt that found `busy`
    /// (index of the key, what the attempt saw); `polling` when no release
    /// watch will wake the waiter.
    pub(crate) fn next(&mut self, busy: &[(usize, Held)], polling: bool) -> u32 {
        let seen: Vec<(usize, Token)> = busy
            .iter()
            .filter_map(|(i, held)| held.holder.clone().map(|t| (*i, t)))
            .collect();
        let moved = seen
            .iter()
            .any(|(i, t)| self.seen.iter().any(|(j, u)| i == j && t != u));
        if polling && moved {
            self.step = 0;
        }
        self.seen = seen;
        let step = self.step;
        self.step = self.step.saturating_add(1);
        step
    }
}
