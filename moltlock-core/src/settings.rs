//! The manager's settings as a service keeps them in its config file:
//! [`ManagerConfig`].

use std::time::Duration;

use crate::{Backend, Error, LockManager, LockManagerBuilder, RetryPolicy};

/// The drift allowance a config may give: the range
/// [`LockManagerBuilder::drift`] clamps to.
const DRIFT_RANGE: std::ops::RangeInclusive<f64> = 0.0..=0.5;

/// The [`LockManager`] settings a service would put in its config file,
/// each optional (`None` keeps the builder's default).
///
/// With the `serde` feature it is [`serde::Deserialize`]: durations are
/// written as URLs write them (`"250ms"`, `"5s"`, `"2m"`, `"1h"`) and an
/// unknown field is refused. In TOML:
///
/// ```toml
/// ttl = "30s"              # the default TTL of every hold
/// drift = 0.02             # the clock-drift allowance, 0 to 0.5
/// release_timeout = "5s"   # for the release a dropped guard spawns
/// retry_initial = "10ms"   # waiters back off from this …
/// retry_max = "1s"         # … doubling up to this
/// ```
///
/// ```
/// use std::time::Duration;
/// use moltlock_core::{ManagerConfig, MemoryBackend};
///
/// let mut settings = ManagerConfig::default();
/// settings.ttl = Some(Duration::from_secs(10));
/// let manager = settings.manager(MemoryBackend::new())?;
/// assert_eq!(manager.ttl(), Duration::from_secs(10));
/// # Ok::<(), moltlock_core::Error>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(try_from = "raw::Manager"))]
#[non_exhaustive]
pub struct ManagerConfig {
    /// The default TTL of every hold ([`LockManagerBuilder::ttl`]).
    pub ttl: Option<Duration>,
    /// The clock-drift allowance, 0 to 0.5 ([`LockManagerBuilder::drift`]).
    pub drift: Option<f64>,
    /// How long the release a dropped guard spawns may take
    /// ([`LockManagerBuilder::release_timeout`]).
    pub release_timeout: Option<Duration>,
    /// The first backoff delay of a waiter (default 10 ms); with
    /// [`retry_max`](Self::retry_max) it gives
    /// [`RetryPolicy::Exponential`].
    pub retry_initial: Option<Duration>,
    /// The longest backoff delay of a waiter (default 1 s).
    pub retry_max: Option<Duration>,
}

impl ManagerConfig {
    /// Checks the settings that the builder would otherwise clamp or take
    /// as they are: a drift allowance from 0 to 0.5, backoff delays above
    /// zero with `retry_initial` at most `retry_max`. The TTL is checked by
    /// [`LockManagerBuilder::build`], which knows the backend's shortest.
    ///
    /// # Errors
    /// [`Error::Config`] naming the setting.
    pub fn check(&self) -> Result<(), Error> {
        if let Some(drift) = self.drift {
            if !DRIFT_RANGE.contains(&drift) {
                return Err(Error::Config(format!(
                    "drift = {drift}: the clock-drift allowance is a fraction from 0 to 0.5 \
                     (0.02 is 2 %)"
                )));
            }
        }
        for (name, value) in [
            ("release_timeout", self.release_timeout),
            ("retry_initial", self.retry_initial),
            ("retry_max", self.retry_max),
        ] {
            if value.is_some_and(|d| d.is_zero()) {
                return Err(Error::Config(format!("{name} must be above zero")));
            }
        }
        if let RetryPolicy::Exponential { initial, max } = self.retry() {
            if initial > max {
                return Err(Error::Config(format!(
                    "retry_initial ({initial:?}) is above retry_max ({max:?})"
                )));
            }
        }
        Ok(())
    }

    /// The retry policy these settings give: the default exponential
    /// backoff with `retry_initial` and `retry_max` in place of its ends.
    fn retry(&self) -> RetryPolicy {
        match RetryPolicy::default() {
            RetryPolicy::Exponential { initial, max } => RetryPolicy::Exponential {
                initial: self.retry_initial.unwrap_or(initial),
                max: self.retry_max.unwrap_or(max),
            },
            other => other,
        }
    }

    /// Applies the settings given to `builder`, leaving the others as they
    /// are (so `on_lost` and the like can be set before or after).
    ///
    /// # Errors
    /// As [`check`](Self::check).
    pub fn apply(&self, mut builder: LockManagerBuilder) -> Result<LockManagerBuilder, Error> {
        self.check()?;
        if let Some(ttl) = self.ttl {
            builder = builder.ttl(ttl);
        }
        if let Some(drift) = self.drift {
            builder = builder.drift(drift);
        }
        if let Some(timeout) = self.release_timeout {
            builder = builder.release_timeout(timeout);
        }
        if self.retry_initial.is_some() || self.retry_max.is_some() {
            builder = builder.retry(self.retry());
        }
        Ok(builder)
    }

    /// A builder over `backend` with these settings.
    ///
    /// # Errors
    /// As [`check`](Self::check).
    pub fn builder(&self, backend: impl Backend) -> Result<LockManagerBuilder, Error> {
        self.apply(LockManager::builder(backend))
    }

    /// A manager over `backend` with these settings.
    ///
    /// # Errors
    /// As [`check`](Self::check), and [`Error::InvalidTtl`] for a TTL out
    /// of the backend's range.
    pub fn manager(&self, backend: impl Backend) -> Result<LockManager, Error> {
        self.builder(backend)?.build()
    }
}

/// The shape of the settings in a config file, checked into the public
/// types by `TryFrom`.
#[cfg(feature = "serde")]
pub(crate) mod raw {
    use std::time::Duration;

    use crate::duration::deserialize_option as duration;

    /// [`super::ManagerConfig`] as written.
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(crate) struct Manager {
        #[serde(default, deserialize_with = "duration")]
        ttl: Option<Duration>,
        #[serde(default)]
        drift: Option<f64>,
        #[serde(default, deserialize_with = "duration")]
        release_timeout: Option<Duration>,
        #[serde(default, deserialize_with = "duration")]
        retry_initial: Option<Duration>,
        #[serde(default, deserialize_with = "duration")]
        retry_max: Option<Duration>,
    }

    impl TryFrom<Manager> for super::ManagerConfig {
        type Error = crate::Error;

        fn try_from(raw: Manager) -> Result<Self, crate::Error> {
            let cfg = Self {
                ttl: raw.ttl,
                drift: raw.drift,
                release_timeout: raw.release_timeout,
                retry_initial: raw.retry_initial,
                retry_max: raw.retry_max,
            };
            cfg.check()?;
            Ok(cfg)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryBackend;

    #[test]
    fn settings_reach_the_manager() -> Result<(), Error> {
        let cfg = ManagerConfig {
            ttl: Some(Duration::from_secs(7)),
            ..ManagerConfig::default()
        };
        assert_eq!(
            cfg.manager(MemoryBackend::new())?.ttl(),
            Duration::from_secs(7)
        );
        let defaults = ManagerConfig::default().manager(MemoryBackend::new())?;
        assert_eq!(defaults.ttl(), Duration::from_secs(30));
        Ok(())
    }

    #[test]
    fn bad_settings_are_config_errors() {
        let bad = [
            ManagerConfig {
                drift: Some(0.7),
                ..ManagerConfig::default()
            },
            ManagerConfig {
                drift: Some(f64::NAN),
                ..ManagerConfig::default()
            },
            ManagerConfig {
                retry_initial: Some(Duration::from_secs(2)),
                ..ManagerConfig::default()
            },
            ManagerConfig {
                release_timeout: Some(Duration::ZERO),
                ..ManagerConfig::default()
            },
        ];
        for cfg in bad {
            assert!(matches!(cfg.check(), Err(Error::Config(_))), "{cfg:?}");
        }
        let short = ManagerConfig {
            ttl: Some(Duration::from_millis(1)),
            ..ManagerConfig::default()
        };
        assert!(matches!(
            short.manager(MemoryBackend::new()),
            Err(Error::InvalidTtl { .. })
        ));
    }

    #[cfg(feature = "serde")]
    #[test]
    fn settings_from_json() -> Result<(), serde_json::Error> {
        let cfg: ManagerConfig = serde_json::from_str(
            r#"{"ttl": "2m", "drift": 0.05, "release_timeout": "250ms",
                "retry_initial": "20ms", "retry_max": "2s"}"#,
        )?;
        assert_eq!(cfg.ttl, Some(Duration::from_secs(120)));
        assert_eq!(cfg.drift, Some(0.05));
        assert_eq!(cfg.release_timeout, Some(Duration::from_millis(250)));
        assert_eq!(cfg.retry_initial, Some(Duration::from_millis(20)));
        assert_eq!(cfg.retry_max, Some(Duration::from_secs(2)));
        assert_eq!(
            serde_json::from_str::<ManagerConfig>("{}")?,
            ManagerConfig::default()
        );
        for (json, says) in [
            (r#"{"ttl": "30"}"#, "\"30\" is not a duration"),
            (r#"{"ttl": 30}"#, "expected a duration such as"),
            (r#"{"drift": 0.9}"#, "drift = 0.9"),
            (r#"{"retry_initial": "5s"}"#, "retry_initial"),
            (r#"{"tll": "30s"}"#, "unknown field `tll`"),
        ] {
            let err = match serde_json::from_str::<ManagerConfig>(json) {
                Ok(cfg) => panic!("{json} gave {cfg:?}"),
                Err(e) => e.to_string(),
            };
            assert!(err.contains(says), "{json}: {err}");
        }
        Ok(())
    }
}
