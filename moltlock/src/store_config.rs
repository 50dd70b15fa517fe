//! [`StoreConfig`]: the lock store and the manager's settings, as a
//! service's config file names them.

use std::fmt;
use std::sync::Arc;

use crate::{redact, Backend, Error, LockManager, LockManagerBuilder, ManagerConfig, Store};

/// The lock store a service uses — its URL — and the [`LockManager`]
/// settings, in one value a config file can hold.
///
/// With the `serde` feature it is `serde::Deserialize`: `url` (required)
/// and the fields of [`ManagerConfig`] beside it, flat, with durations
/// written `"250ms"`, `"5s"`, `"2m"`, `"1h"`. Options of the store go in
/// the URL's query, by the names its backend documents. An unknown field
/// or an unknown URL scheme is refused when the file is read; a store this
/// build has no backend for, when connecting. In TOML:
///
/// ```toml
/// [locks]
/// url = "postgres://app@db/locks?table=jobs_locks&acquire_timeout=2s"
/// ttl = "30s"
/// drift = 0.02
/// ```
///
/// `Debug` hides the URL's password.
#[derive(Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(try_from = "raw::Store"))]
#[non_exhaustive]
pub struct StoreConfig {
    /// The store's URL, as [`connect`](crate::connect) takes it.
    pub url: String,
    /// The manager's settings (TTL, drift, …).
    pub manager: ManagerConfig,
}

impl fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreConfig")
            .field("url", &redact(&self.url))
            .field("manager", &self.manager)
            .finish()
    }
}

impl StoreConfig {
    /// The store at `url` with the manager's default settings.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            manager: ManagerConfig::default(),
        }
    }

    /// The same store with these manager settings.
    pub fn with_manager(mut self, manager: ManagerConfig) -> Self {
        self.manager = manager;
        self
    }

    /// Connects to the store, as [`connect`](crate::connect).
    ///
    /// # Errors
    /// As [`connect`](crate::connect).
    pub async fn connect(&self) -> Result<Arc<dyn Backend>, Error> {
        crate::connect(&self.url).await
    }

    /// Connects to the store and returns a builder with these settings, for
    /// what a file cannot hold (an `on_lost` callback, say).
    ///
    /// # Errors
    /// As [`connect`](crate::connect), and [`ManagerConfig::check`].
    pub async fn builder(&self) -> Result<LockManagerBuilder, Error> {
        // Settings a config file got wrong fail before any connection is made.
        self.manager.check()?;
        self.manager.builder(self.connect().await?)
    }

    /// Connects to the store and returns a manager with these settings.
    ///
    /// # Errors
    /// As [`builder`](Self::builder), and [`Error::InvalidTtl`] for a TTL
    /// out of the store's range.
    pub async fn manager(&self) -> Result<LockManager, Error> {
        self.builder().await?.build()
    }

    /// Checks what can be checked without connecting: a URL with a known
    /// scheme and the manager's settings.
    ///
    /// # Errors
    /// [`Error::Config`] naming what is wrong.
    pub fn check(&self) -> Result<(), Error> {
        Store::of(&self.url)?;
        self.manager.check()
    }
}

/// The shape of [`StoreConfig`] in a config file, checked by `TryFrom`.
#[cfg(feature = "serde")]
mod raw {
    use std::time::Duration;

    use moltlock_core::duration::deserialize_option as duration;

    use super::StoreConfig;
    use crate::{Error, ManagerConfig};

    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct Store {
        url: String,
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

    impl TryFrom<Store> for StoreConfig {
        type Error = Error;

        fn try_from(raw: Store) -> Result<Self, Error> {
            let mut manager = ManagerConfig::default();
            manager.ttl = raw.ttl;
            manager.drift = raw.drift;
            manager.release_timeout = raw.release_timeout;
            manager.retry_initial = raw.retry_initial;
            manager.retry_max = raw.retry_max;
            let cfg = StoreConfig::new(raw.url).with_manager(manager);
            cfg.check()?;
            Ok(cfg)
        }
    }
}
