//! MoltLock core: distributed locks over any store that can do two atomic
//! things to one key — compare-and-set with a TTL, and owner-checked delete.
//!
//! A [`Backend`] implements those two operations ([`Backend::cas`],
//! [`Backend::delete`]); the [`LockManager`] does the rest: waiting with
//! notifications or backoff, timeouts, cancel-safe acquisition, one renewal
//! driver for all holds, a local validity deadline, lost-lock signals
//! ([`LockGuard::lost`]) and fencing tokens ([`LockGuard::fence`]).
//!
//! ```
//! use std::time::Duration;
//! use moltlock_core::{LockManager, MemoryBackend};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), moltlock_core::Error> {
//! let manager = LockManager::builder(MemoryBackend::new())
//!     .ttl(Duration::from_secs(10))
//!     .build()?;
//! let guard = manager.lock("jobs/nightly-report").await?;
//! let fence = guard.fence(); // send it with every write the lock protects
//! assert!(manager.try_lock("jobs/nightly-report").await?.is_none());
//! guard.release().await?;
//! # let _ = fence;
//! # Ok(())
//! # }
//! ```

mod ask;
mod backend;
mod batch;
pub mod blocking;
mod cleanup;
mod clock;
pub mod duration;
mod election;
mod error;
mod events;
mod features;
mod forward;
mod guard;
mod guards;
mod hold;
mod job;
mod lost;
mod manager;
mod memory;
pub mod metrics;
pub mod migrate;
mod multi;
mod options;
mod owner;
mod pending;
mod queue;
mod quorum;
mod records;
mod redact;
mod registry;
mod renew;
mod retry;
mod rwlock;
mod scoped;
mod semaphore;
mod sets;
mod settings;
mod slots;
mod types;

pub use async_trait::async_trait;
pub use backend::{Backend, Limits, DEFAULT_LATE_WRITE};
pub use clock::StoreClock;
pub use duration::parse_duration;
pub use election::{Election, Leader, Leadership, Observer};
pub use error::{redact_error, BoxError, Error, LostReason};
pub use events::KeyEvents;
pub use features::{
    CasMulti, Describe, FairQueue, Inspect, RaiseFence, ReleaseWatch, RenewMany, Turns, Watch,
};
pub use forward::{BackendExt, Forward};
pub use guard::LockGuard;
pub use guards::{MultiGuard, Permit, ReadGuard, SlotGuard, WriteGuard};
pub use lost::LostToken;
pub use manager::{LockManager, LockManagerBuilder};
pub use memory::MemoryBackend;
pub use migrate::{MigratingBackend, Phase};
pub use options::LockOptions;
pub use owner::{OwnedGuard, Owner};
pub use pending::{pending_cleanups, wait_for_cleanups};
pub use quorum::{ConnectMember, LateMember, QuorumBackend};
pub use records::{CasOutcome, Held, HolderInfo, MultiMode, MultiOutcome, RenewItem};
pub use redact::{redact, Secret};
pub use registry::LostEvent;
pub use retry::RetryPolicy;
pub use rwlock::{RwLock, RwOptions};
pub use scoped::{Busy, TryAcquire};
pub use semaphore::Semaphore;
pub use settings::ManagerConfig;
pub use slots::MAX_PERMITS;
pub use types::{
    check_description, check_ttl, Fence, LockKey, Token, DERIVED_ROOM, MAX_DESCRIPTION_LEN,
    MAX_KEY_LEN, MAX_TTL, MIN_TTL, RESERVED_MARK,
};

/// Helpers for optional backend features: which extensions a backend
/// hands out, requiring one, and renewing without a batch.
pub mod extension {
    pub use crate::batch::cas_each;
    pub use crate::forward::{extensions, renew_each, require};
}
