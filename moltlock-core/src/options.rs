//! Options for one acquisition.

use std::time::Duration;

/// Options for one acquisition.
#[derive(Clone, Debug, Default)]
pub struct LockOptions {
    pub(crate) ttl: Option<Duration>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) no_wait: bool,
    pub(crate) fair: bool,
    pub(crate) description: Option<String>,
    pub(crate) job: crate::job::Job,
}

impl LockOptions {
    /// Wait as long as it takes, with the manager's TTL.
    pub fn new() -> Self {
        Self::default()
    }

    /// The TTL of this hold.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Give up with [`Error::Timeout`](crate::Error::Timeout) after waiting this long.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Try once and return `None` when the key is held elsewhere.
    pub fn no_wait(mut self) -> Self {
        self.no_wait = true;
        self
    }

    /// Store this description with the hold (host, pid, command, since
    /// when: who holds it, for `inspect`, `list` and `moltlock status`),
    /// where the backend stores descriptions
    /// ([`Backend::describer`](crate::Backend::describer)); elsewhere it is left out. At most
    /// [`MAX_DESCRIPTION_LEN`](crate::MAX_DESCRIPTION_LEN) bytes, no control
    /// characters. Costs one more round trip after the acquisition.
    pub fn description(mut self, text: impl Into<String>) -> Self {
        self.description = Some(text.into());
        self
    }

    /// Wait in the backend's first-come, first-served queue (backends with
    /// [`Backend::fair_queue`](crate::Backend::fair_queue) only).
    pub fn fair(mut self) -> Self {
        self.fair = true;
        self
    }

    /// A scheduled job's upper bound: the hold is trusted locally until
    /// `limit` after the acquire request was sent at the latest; then
    /// renewal stops, the guard's [`lost`](crate::LockGuard::lost) fires
    /// with [`LostReason::AtMost`](crate::LostReason::AtMost), and the key
    /// is deleted by its token. A holder cut off from the store (or killed)
    /// keeps the key until its TTL runs out after its last renewal: at
    /// most `limit` plus one TTL. Single-key locks only, not in fair mode.
    pub fn at_most(mut self, limit: Duration) -> Self {
        self.job.at_most = Some(limit);
        self
    }

    /// A scheduled job's lower bound: the key stays blocked until at least
    /// `limit` after the acquire request was sent, measured by the store's
    /// clock, even when the job ends sooner or its process crashes. Every
    /// request of the hold asks for a TTL of at least `limit` (one TTL for
    /// the whole hold, as a store may keep it with the hold), so a crash
    /// blocks the key until `limit` after the last renewal; a release before
    /// `limit` leaves a throwaway hold on the key for what is left (rounded
    /// up to the store's TTL granularity: whole seconds on etcd). Single-key
    /// locks only, not in fair mode; at most [`at_most`](Self::at_most).
    pub fn at_least(mut self, limit: Duration) -> Self {
        self.job.at_least = Some(limit);
        self
    }
}
