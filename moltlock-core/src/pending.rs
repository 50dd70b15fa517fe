//! A count of best-effort cleanups still running, so a short-lived program
//! (the CLI) can let them finish before its runtime shuts down.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

static PENDING: AtomicUsize = AtomicUsize::new(0);

/// Counts one cleanup while it lives.
pub(crate) struct Ticket(());

impl Ticket {
    pub(crate) fn new() -> Self {
        PENDING.fetch_add(1, Ordering::SeqCst);
        Self(())
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        PENDING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How many best-effort releases (of dropped guards and cancelled or
/// timed-out acquisitions) are still running in this process.
pub fn pending_cleanups() -> usize {
    PENDING.load(Ordering::SeqCst)
}

/// Waits until no best-effort release is running, or `limit` passed;
/// returns whether all finished. Call it before a runtime shuts down
/// (shutting down drops the spawned releases, and their holds then live
/// until their TTL). Each release is itself bounded by the manager's
/// release timeout; one sent again after a retryable failure, also by the
/// time its hold had left.
///
/// # Cancel safety
/// Cancel safe: it only observes.
pub async fn wait_for_cleanups(limit: Duration) -> bool {
    let until = tokio::time::Instant::now() + limit;
    loop {
        if pending_cleanups() == 0 {
            return true;
        }
        if tokio::time::Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
