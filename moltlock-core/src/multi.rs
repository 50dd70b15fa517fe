//! Multi-locks: several keys held together, all or nothing.

use crate::guards::MultiGuard;
use crate::manager::LockManager;
use crate::options::LockOptions;
use crate::sets::{granted, within};
use crate::{Error, LockKey, MultiMode};

impl LockManager {
    /// Waits until every key in `keys` is held, all at once.
    ///
    /// The keys are deduplicated and taken in bytewise order, never the
    /// caller's, so two callers naming the same keys in opposite orders
    /// cannot deadlock. An attempt takes every key or none: a key held
    /// elsewhere gives back whatever the attempt took (nothing at all
    /// where the backend's [`CasMulti`](crate::CasMulti) takes them
    /// together, in one request; past its
    /// [`max_keys`](crate::CasMulti::max_keys) or for keys it cannot take
    /// together, such as keys of different Redis Cluster slots, one `cas` a
    /// key, and others may see a part of the set held meanwhile), so a
    /// waiter holds nothing while it waits. The timeout in `opts` is for
    /// the whole set, not per key.
    ///
    /// # Cancel safety
    /// Dropping the future holds nothing: holds taken are given back and
    /// attempts in flight deleted by token, as for [`lock`](Self::lock).
    ///
    /// # Errors
    /// [`Error::InvalidKey`] for a bad key, [`Error::Config`] for no keys
    /// or `fair`, [`Error::Timeout`], store errors that are not retryable.
    pub async fn lock_all<K: AsRef<str>>(
        &self,
        keys: impl IntoIterator<Item = K>,
        opts: LockOptions,
    ) -> Result<MultiGuard, Error> {
        let opts = LockOptions {
            no_wait: false,
            ..opts
        };
        let got = self.acquire_all(keys, opts).await?;
        granted(self, got)
    }

    /// One attempt at every key in `keys` (as [`lock_all`](Self::lock_all)):
    /// the guard, or `None` (holding nothing) when any key is held elsewhere.
    ///
    /// # Cancel safety
    /// As [`lock_all`](Self::lock_all).
    ///
    /// # Errors
    /// As [`lock_all`](Self::lock_all); [`Error::Timeout`] only when `opts`
    /// sets a timeout and the one attempt outlasts it.
    pub async fn try_lock_all<K: AsRef<str>>(
        &self,
        keys: impl IntoIterator<Item = K>,
        opts: LockOptions,
    ) -> Result<Option<MultiGuard>, Error> {
        self.acquire_all(keys, opts.no_wait()).await
    }

    async fn acquire_all<K: AsRef<str>>(
        &self,
        keys: impl IntoIterator<Item = K>,
        opts: LockOptions,
    ) -> Result<Option<MultiGuard>, Error> {
        let keys = self.sorted_keys(keys)?;
        let ttl = self.set_ttl(&opts)?;
        let label = keys.first().map(LockKey::as_str).unwrap_or_default();
        let work = self.acquire_set(&keys, MultiMode::All, ttl.into(), opts.no_wait, None);
        let Some(guards) = within(label, opts.timeout, work).await? else {
            return Ok(None);
        };
        self.describe_all(&guards, &opts).await;
        Ok(Some(MultiGuard::new(guards)))
    }

    /// The caller's keys, checked, deduplicated and sorted bytewise.
    fn sorted_keys<K: AsRef<str>>(
        &self,
        keys: impl IntoIterator<Item = K>,
    ) -> Result<Vec<LockKey>, Error> {
        let mut out = keys
            .into_iter()
            .map(|k| self.user_key(k.as_ref(), 0))
            .collect::<Result<Vec<_>, _>>()?;
        out.sort();
        out.dedup();
        if out.is_empty() {
            return Err(Error::Config("lock_all needs at least one key".into()));
        }
        Ok(out)
    }
}
