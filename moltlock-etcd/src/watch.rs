//! Watch-based waiting: a waiter watches one key from just after the
//! revision its failed attempt saw, so a release in between is never missed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, WatchOptions};
use moltlock_core::{async_trait, Error, Held, ReleaseWatch};

use crate::error::{call, NAME};

/// Why a watch ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wake {
    /// An event on the key (a release, or any change).
    Event,
    /// The start revision was compacted away: re-read and go on.
    Compacted,
}

/// Waits for the first event on `key` at or after revision `from` (any
/// revision below 1 means "from now").
pub(crate) async fn next_event(
    client: &Client,
    key: &[u8],
    from: i64,
    open_timeout: Duration,
) -> Result<Wake, Error> {
    let mut client = client.clone();
    let opts = if from > 0 {
        WatchOptions::new().with_start_revision(from)
    } else {
        WatchOptions::new()
    };
    let mut stream = call(
        "watch",
        open_timeout,
        client.watch(key.to_vec(), Some(opts)),
    )
    .await?;
    loop {
        let msg = stream.message().await.map_err(crate::error::map)?;
        let Some(resp) = msg else {
            return Err(Error::unavailable(NAME, "the watch stream closed"));
        };
        if resp.compact_revision() > 0 {
            tracing::debug!(
                from,
                compacted = resp.compact_revision(),
                "watch start compacted"
            );
            return Ok(Wake::Compacted);
        }
        if !resp.events().is_empty() {
            return Ok(Wake::Event);
        }
        if resp.canceled() {
            let why = resp.cancel_reason().to_owned();
            return Err(Error::unavailable(NAME, format!("watch cancelled: {why}")));
        }
    }
}

/// A [`ReleaseWatch`] on one lock key.
pub(crate) struct KeyWatch {
    pub(crate) client: Client,
    pub(crate) key: Vec<u8>,
    pub(crate) timeout: Duration,
    pub(crate) wakeups: Arc<AtomicU64>,
}

#[async_trait]
impl ReleaseWatch for KeyWatch {
    /// Watches the key from `held.revision + 1`; returns on any event or
    /// when that revision was compacted (a spurious wake). Cancel safe: the
    /// next call starts from the revision its `held` names again.
    async fn released(&mut self, held: &Held) -> Result<(), Error> {
        let from = held
            .revision
            .and_then(|r| i64::try_from(r).ok())
            .map_or(0, |r| r.saturating_add(1));
        next_event(&self.client, &self.key, from, self.timeout).await?;
        self.wakeups.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}
