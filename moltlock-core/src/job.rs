//! Scheduled-job limits of a hold ([`LockOptions::at_most`] and
//! [`LockOptions::at_least`](crate::LockOptions::at_least)), and the TTL
//! each request of the hold asks for under them.
//!
//! [`LockOptions::at_most`]: crate::LockOptions::at_most

use std::time::Duration;

use crate::{Error, MIN_TTL};

/// How long a job's hold may last and must last, counted from the send of
/// its acquire request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Job {
    /// Renewal stops here; the hold is then lost ([`crate::LostReason::AtMost`]).
    pub(crate) at_most: Option<Duration>,
    /// The key stays blocked until here, even after a release or a crash.
    pub(crate) at_least: Option<Duration>,
}

impl Job {
    /// Checks the limits against each other and the TTL bounds.
    pub(crate) fn check(&self) -> Result<(), Error> {
        if let Some(most) = self.at_most {
            if most < MIN_TTL {
                return Err(Error::Config(format!(
                    "at_most {most:?} is below the shortest TTL {MIN_TTL:?}"
                )));
            }
        }
        if let Some(least) = self.at_least {
            if least > crate::MAX_TTL {
                return Err(Error::Config(format!(
                    "at_least {least:?} is above the longest TTL {:?}",
                    crate::MAX_TTL
                )));
            }
        }
        match (self.at_least, self.at_most) {
            (Some(least), Some(most)) if least > most => Err(Error::Config(format!(
                "at_least {least:?} is longer than at_most {most:?}"
            ))),
            _ => Ok(()),
        }
    }

    pub(crate) fn is_none(&self) -> bool {
        self.at_most.is_none() && self.at_least.is_none()
    }
}

/// The TTL of a hold with its job limits: what the manager renews with, and
/// what each request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Terms {
    /// The TTL the hold is renewed by (every TTL/3).
    pub(crate) ttl: Duration,
    pub(crate) job: Job,
}

impl From<Duration> for Terms {
    fn from(ttl: Duration) -> Self {
        Self {
            ttl,
            job: Job::default(),
        }
    }
}

impl Terms {
    /// The TTL every request of the hold asks for: the TTL, raised to
    /// `at_least` (so a crash still blocks the key that long), cut to
    /// `at_most`. One TTL for the whole hold, since a store may keep a
    /// hold's TTL with it (an etcd lease), so a renewal cannot change it.
    pub(crate) fn first_ttl(&self) -> Duration {
        let raised = self.ttl.max(self.job.at_least.unwrap_or_default());
        raised.min(self.job.at_most.unwrap_or(Duration::MAX))
    }

    /// The TTL a renewal sent `elapsed` after the acquire request asks
    /// for; `None` once less than the shortest TTL is left of `at_most`
    /// (the hold then ends).
    pub(crate) fn ttl_at(&self, elapsed: Duration) -> Option<Duration> {
        match self.job.at_most {
            Some(most) if most.saturating_sub(elapsed) < MIN_TTL => None,
            _ => Some(self.first_ttl()),
        }
    }

    /// What is left of `at_least`, `elapsed` after the acquire request
    /// (`None` once it has passed). However little is left, the key stays
    /// blocked for it: the throwaway hold then lasts 100 ms.
    pub(crate) fn at_least_left(&self, elapsed: Duration) -> Option<Duration> {
        let left = self.job.at_least?.saturating_sub(elapsed);
        (!left.is_zero()).then_some(left)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn terms(at_most: Option<u32>, at_least: Option<u32>) -> Terms {
        Terms {
            ttl: 30 * S,
            job: Job {
                at_most: at_most.map(|s| s * S),
                at_least: at_least.map(|s| s * S),
            },
        }
    }

    #[test]
    fn at_least_raises_and_at_most_cuts_the_ttl() {
        let t = terms(Some(100), Some(60));
        assert_eq!(t.ttl_at(Duration::ZERO), Some(60 * S));
        assert_eq!(t.ttl_at(80 * S), Some(60 * S));
        assert_eq!(t.ttl_at(100 * S), None);
        assert_eq!(terms(Some(10), None).first_ttl(), 10 * S);
        assert_eq!(terms(None, None).first_ttl(), 30 * S);
        assert_eq!(t.at_least_left(10 * S), Some(50 * S));
        assert_eq!(t.at_least_left(60 * S), None);
        let little = Duration::from_millis(1);
        assert_eq!(t.at_least_left(60 * S - little), Some(little));
    }

    #[test]
    fn limits_are_checked_against_each_other() {
        assert!(terms(Some(10), Some(20)).job.check().is_err());
        assert!(terms(Some(20), Some(20)).job.check().is_ok());
        assert!(terms(None, None).job.is_none());
        let tiny = Job {
            at_most: Some(Duration::from_millis(1)),
            at_least: None,
        };
        assert!(tiny.check().is_err());
    }
}
