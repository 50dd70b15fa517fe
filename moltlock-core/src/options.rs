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
}
