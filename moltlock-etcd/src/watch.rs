//! Watch-based waiting: a waiter watches one key for any change after the
//! revision its failed attempt saw, so a release in between is never missed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, WatchResponse, WatchStream};
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
///
/// The watch itself starts at the current revision, so etcd sends it each
/// later event as it happens; a watch started at a past revision would get
/// its events only from etcd's catch-up pass, which runs every 100 ms. What
/// happened between `from` and the watch's creation is covered by one read
/// of the key, sent once the watch exists: a key that is gone, or that
/// changed at or after `from`, counts as an event.
pub(crate) async fn next_event(
    client: &Client,
    key: &[u8],
    from: i64,
    open_timeout: Duration,
) -> Result<Wake, Error> {
    let mut watcher = client.clone();
    let mut stream = call("watch", open_timeout, watcher.watch(key.to_vec(), None)).await?;
    let created_at = loop {
        let resp = next_message(&mut stream).await?;
        if let Some(wake) = wake_of(&resp)? {
            return Ok(wake);
        }
        if resp.created() {
            break resp.header().map_or(0, |h| h.revision());
        }
    };
    // The read runs to its end (events meanwhile wait in the stream): a
    // request abandoned half way costs etcd a stream reset, and a client
    // that resets streams in bursts gets its connection refused.
    if from > 0 && from <= created_at && changed_since(client, key, from, open_timeout).await? {
        return Ok(Wake::Event);
    }
    next_wake(&mut stream).await
}

async fn next_message(stream: &mut WatchStream) -> Result<WatchResponse, Error> {
    stream
        .message()
        .await
        .map_err(crate::error::map)?
        .ok_or_else(|| Error::unavailable(NAME, "the watch stream closed"))
}

/// What a watch answer means for the waiter: `None` to keep waiting.
fn wake_of(resp: &WatchResponse) -> Result<Option<Wake>, Error> {
    if resp.compact_revision() > 0 {
        tracing::debug!(compacted = resp.compact_revision(), "watch start compacted");
        return Ok(Some(Wake::Compacted));
    }
    if !resp.events().is_empty() {
        return Ok(Some(Wake::Event));
    }
    if resp.canceled() {
        let why = resp.cancel_reason().to_owned();
        return Err(Error::unavailable(NAME, format!("watch cancelled: {why}")));
    }
    Ok(None)
}

async fn next_wake(stream: &mut WatchStream) -> Result<Wake, Error> {
    loop {
        if let Some(wake) = wake_of(&next_message(stream).await?)? {
            return Ok(wake);
        }
    }
}

/// Whether `key` is gone or was written at or after revision `from`.
async fn changed_since(
    client: &Client,
    key: &[u8],
    from: i64,
    timeout: Duration,
) -> Result<bool, Error> {
    let mut reader = client.clone();
    let resp = call("get", timeout, reader.get(key.to_vec(), None)).await?;
    Ok(resp
        .kvs()
        .first()
        .is_none_or(|kv| kv.mod_revision() >= from))
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
    /// Returns on any change of the key after `held.revision` (a release,
    /// or a spurious wake the caller's next attempt sorts out). Cancel safe:
    /// the next call looks from the revision its `held` names again.
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
