//! Counting semaphores: at most N holders of one name at once.

use std::fmt;
use std::time::Duration;

use crate::guards::{Permit, SlotGuard};
use crate::manager::LockManager;
use crate::options::LockOptions;
use crate::sets::{granted, within};
use crate::slots::SlotSet;
use crate::{Error, HolderInfo, LockKey, MultiMode, DERIVED_ROOM};

/// At most N holders of one name at once, on any backend.
///
/// A semaphore of N permits is N slot keys (`name#~s0` … `name#~s<N-1>`,
/// [`RESERVED_MARK`](crate::RESERVED_MARK)); a permit is one ordinary hold
/// on a free slot, tried from a random start (in one round trip where the
/// backend has [`CasMulti`](crate::CasMulti)). So each permit is renewed
/// by the manager's one renewal driver, expires by the store's clock when
/// its holder dies, and has its own fence and lost signal. Because each
/// slot is a mutex, more than N holders is impossible while every client
/// uses the same N; a client that finds a slot at or past its own N held
/// fails with [`Error::LimitMismatch`] (where the backend can list).
///
/// Waiters sleep until a slot's release (where the backend notifies and
/// N ≤ 16) or the retry delay, capped by the earliest expiry seen. There
/// is no queue: permits are not handed out in arrival order.
#[derive(Clone)]
pub struct Semaphore {
    mgr: LockManager,
    slots: SlotSet,
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", self.slots.name())
            .field("permits", &self.slots.count())
            .finish()
    }
}

impl LockManager {
    /// A semaphore of `permits` permits named `name`. Every client of the
    /// name must use the same count.
    ///
    /// # Errors
    /// [`Error::InvalidKey`] for a bad name (or one that leaves no room for
    /// its [`DERIVED_ROOM`] bytes of slot suffix), [`Error::Config`] for a
    /// count outside 1..=[`MAX_PERMITS`](crate::MAX_PERMITS).
    pub fn semaphore(&self, name: impl AsRef<str>, permits: u32) -> Result<Semaphore, Error> {
        let name = self.user_key(name.as_ref(), DERIVED_ROOM)?;
        Ok(Semaphore {
            mgr: self.clone(),
            slots: SlotSet::new(name, "s", permits)?,
        })
    }
}

impl Semaphore {
    /// The semaphore's name.
    pub fn name(&self) -> &LockKey {
        self.slots.name()
    }

    /// How many permits it has.
    pub fn permits(&self) -> u32 {
        self.slots.count()
    }

    /// The store keys of its slots, slot 0 first (for tools and tests).
    pub fn slot_keys(&self) -> &[LockKey] {
        self.slots.keys()
    }

    /// Waits for a permit.
    ///
    /// # Cancel safety
    /// Dropping the future holds no permit: an attempt in flight is
    /// deleted by its token, as for [`LockManager::lock`].
    ///
    /// # Errors
    /// Store errors that are not retryable, [`Error::LimitMismatch`].
    pub async fn acquire(&self) -> Result<Permit, Error> {
        let got = self.acquire_with(LockOptions::new()).await?;
        granted(&self.mgr, got)
    }

    /// Waits at most `timeout` for a permit, then fails with [`Error::Timeout`].
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire).
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire), and [`Error::Timeout`].
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<Permit, Error> {
        let got = self
            .acquire_with(LockOptions::new().timeout(timeout))
            .await?;
        granted(&self.mgr, got)
    }

    /// One attempt: a permit, or `None` when every slot is held.
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire).
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    pub async fn try_acquire(&self) -> Result<Option<Permit>, Error> {
        self.acquire_with(LockOptions::new().no_wait()).await
    }

    /// A permit with explicit options (TTL, timeout, `no_wait`,
    /// description; not `fair`). Returns `None` only with `no_wait`.
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire).
    ///
    /// # Errors
    /// As [`acquire_timeout`](Self::acquire_timeout); [`Error::Config`]
    /// for `fair`.
    pub async fn acquire_with(&self, opts: LockOptions) -> Result<Option<Permit>, Error> {
        let ttl = self.mgr.set_ttl(&opts)?;
        let keys = self.slots.rotated();
        let work = self.mgr.acquire_set(
            &keys,
            MultiMode::Any,
            ttl.into(),
            opts.no_wait,
            Some(&self.slots),
        );
        let got = within(self.slots.name().as_str(), opts.timeout, work).await?;
        let Some(guard) = got.and_then(|mut g| g.pop()) else {
            return Ok(None);
        };
        self.mgr
            .describe_all(std::slice::from_ref(&guard), &opts)
            .await;
        let slot = self.slots.slot_of(guard.key().as_str()).unwrap_or(0);
        Ok(Some(SlotGuard::new(guard, slot)))
    }

    /// The permits held now, by anyone (backends that can list).
    ///
    /// # Cancel safety
    /// Read only.
    ///
    /// # Errors
    /// [`Error::Unsupported`] without listing; store errors.
    pub async fn in_use(&self) -> Result<Vec<HolderInfo>, Error> {
        self.slots.in_use(&self.mgr).await
    }
}
