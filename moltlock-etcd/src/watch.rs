//! Watch-based waiting: a waiter watches one key for any change after the
//! revision its failed attempt saw, so a release in between is never missed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use etcd_client::{Client, WatchOptions, WatchResponse, WatchStream};
use moltlock_core::{async_trait, Error, Held, ReleaseWatch};
use tokio::sync::mpsc;

use crate::error::{call, NAME};

/// Why a watch ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wake {
    /// An event on the key (a release, or any change).
    Event,
    /// The start revision was compacted away: re-read and go on.
    Compacted,
}

/// One watch stream per backend, shared by every waiter: each wait adds a
/// watch (with an id of its own) to the stream and cancels it when done,
/// so waiting costs no stream of its own. A stream opened and reset per
/// wait costs etcd an HTTP/2 stream reset each, and a client that resets
/// streams in bursts gets its connection refused (`ENHANCE_YOUR_CALM`).
/// The stream opens with the first wait and again after it fails; a failure
/// ends every wait on it with an error (the waiters poll meanwhile).
pub(crate) struct WatchHub {
    client: Client,
    timeout: Duration,
    next_id: AtomicI64,
    conn: tokio::sync::Mutex<Option<HubConn>>,
    opened: AtomicU64,
}

/// The open stream: commands to its task, and where its answers go.
#[derive(Clone)]
struct HubConn {
    cmds: mpsc::UnboundedSender<Cmd>,
    routes: Arc<Mutex<HashMap<i64, mpsc::UnboundedSender<Msg>>>>,
}

enum Cmd {
    Watch(i64, Vec<u8>),
    Cancel(i64),
}

/// What the stream said to one watch.
enum Msg {
    Created(i64),
    Wake(Wake),
    Ended(String),
}

impl HubConn {
    fn routes(&self) -> std::sync::MutexGuard<'_, HashMap<i64, mpsc::UnboundedSender<Msg>>> {
        self.routes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn alive(&self) -> bool {
        !self.cmds.is_closed()
    }
}

/// A watch on the shared stream; dropping it cancels the watch.
struct Registration {
    conn: HubConn,
    id: i64,
    rx: mpsc::UnboundedReceiver<Msg>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.conn.routes().remove(&self.id);
        let _ = self.conn.cmds.send(Cmd::Cancel(self.id));
    }
}

impl WatchHub {
    pub(crate) fn new(client: Client, timeout: Duration) -> Self {
        Self {
            client,
            timeout,
            next_id: AtomicI64::new(1),
            conn: tokio::sync::Mutex::new(None),
            opened: AtomicU64::new(0),
        }
    }

    /// How many watch streams this backend has opened.
    pub(crate) fn streams_opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }

    /// Adds a watch on `key` to the stream, opening the stream if needed.
    async fn register(&self, key: &[u8]) -> Result<Registration, Error> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        let mut conn = self.conn.lock().await;
        if let Some(c) = conn.as_ref().filter(|c| c.alive()) {
            c.routes().insert(id, tx);
            let _ = c.cmds.send(Cmd::Watch(id, key.to_vec()));
            return Ok(Registration {
                conn: c.clone(),
                id,
                rx,
            });
        }
        let mut watcher = self.client.clone();
        let opts = WatchOptions::new().with_watch_id(id);
        let stream = call(
            "watch",
            self.timeout,
            watcher.watch(key.to_vec(), Some(opts)),
        )
        .await?;
        self.opened.fetch_add(1, Ordering::Relaxed);
        let (cmds, cmd_rx) = mpsc::unbounded_channel();
        let fresh = HubConn {
            cmds,
            routes: Arc::default(),
        };
        fresh.routes().insert(id, tx);
        tokio::spawn(pump(stream, cmd_rx, fresh.clone()));
        *conn = Some(fresh.clone());
        Ok(Registration {
            conn: fresh,
            id,
            rx,
        })
    }
}

/// Runs one stream: sends the waiters' watch and cancel requests, routes
/// every answer to its watch, and ends every watch when the stream fails.
async fn pump(stream: WatchStream, mut cmds: mpsc::UnboundedReceiver<Cmd>, conn: HubConn) {
    let (mut sender, mut answers) = stream.split();
    let why = loop {
        tokio::select! {
            cmd = cmds.recv() => {
                let sent = match cmd {
                    Some(Cmd::Watch(id, key)) => {
                        sender.watch(key, Some(WatchOptions::new().with_watch_id(id))).await
                    }
                    Some(Cmd::Cancel(id)) => sender.cancel(id).await,
                    None => break "the backend was dropped".to_owned(),
                };
                if let Err(e) = sent {
                    break format!("watch request failed: {e}");
                }
            }
            answer = answers.message() => match answer {
                Ok(Some(resp)) => route(&conn, &resp),
                Ok(None) => break "the watch stream closed".to_owned(),
                Err(e) => break format!("the watch stream failed: {e}"),
            },
        }
    };
    tracing::debug!(%why, "watch stream ended");
    cmds.close();
    for (_, tx) in conn.routes().drain() {
        let _ = tx.send(Msg::Ended(why.clone()));
    }
}

fn route(conn: &HubConn, resp: &WatchResponse) {
    let msg = if resp.compact_revision() > 0 {
        tracing::debug!(compacted = resp.compact_revision(), "watch start compacted");
        Msg::Wake(Wake::Compacted)
    } else if !resp.events().is_empty() {
        Msg::Wake(Wake::Event)
    } else if resp.canceled() {
        Msg::Ended(format!("watch cancelled: {}", resp.cancel_reason()))
    } else if resp.created() {
        Msg::Created(resp.header().map_or(0, |h| h.revision()))
    } else {
        return; // progress notifications
    };
    if let Some(tx) = conn.routes().get(&resp.watch_id()) {
        let _ = tx.send(msg);
    }
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
pub(crate) async fn next_event(hub: &WatchHub, key: &[u8], from: i64) -> Result<Wake, Error> {
    let mut reg = hub.register(key).await?;
    let created = tokio::time::timeout(hub.timeout, reg.rx.recv()).await;
    let created_at = match created {
        Err(_) => {
            return Err(Error::unavailable(
                NAME,
                "the watch was not created in time",
            ))
        }
        Ok(Some(Msg::Created(rev))) => rev,
        Ok(Some(Msg::Wake(wake))) => return Ok(wake),
        Ok(Some(Msg::Ended(why))) => return Err(Error::unavailable(NAME, why)),
        Ok(None) => return Err(Error::unavailable(NAME, "the watch stream closed")),
    };
    if from > 0 && from <= created_at && changed_since(&hub.client, key, from, hub.timeout).await? {
        return Ok(Wake::Event);
    }
    loop {
        match reg.rx.recv().await {
            Some(Msg::Wake(wake)) => return Ok(wake),
            Some(Msg::Created(_)) => {}
            Some(Msg::Ended(why)) => return Err(Error::unavailable(NAME, why)),
            None => return Err(Error::unavailable(NAME, "the watch stream closed")),
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
    pub(crate) hub: Arc<WatchHub>,
    pub(crate) key: Vec<u8>,
    pub(crate) wakeups: Arc<AtomicU64>,
}

#[async_trait]
impl ReleaseWatch for KeyWatch {
    /// Returns on any change of the key after `held.revision` (a release,
    /// or a spurious wake the caller's next attempt sorts out).
    ///
    /// # Cancel safety
    /// Dropping the future cancels its watch on the shared stream and
    /// writes nothing; the next call looks from the revision its `held`
    /// names again, so a release in between is not missed.
    async fn released(&mut self, held: &Held) -> Result<(), Error> {
        let from = held
            .revision
            .and_then(|r| i64::try_from(r).ok())
            .map_or(0, |r| r.saturating_add(1));
        next_event(&self.hub, &self.key, from).await?;
        self.wakeups.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}
