//! Release wake-ups: ONE pub/sub connection per backend, shared by all its
//! waiters.
//!
//! A background task PSUBSCRIBEs to the prefix's release channels and bumps
//! a per-key generation counter (a `tokio::sync::watch`) on each message. A
//! waiter registers a receiver for its key *before* its acquire attempt, so
//! a release published between the attempt and the wait bumps a counter it
//! already watches and is never missed. When the connection drops, and again
//! when it comes back, every key is bumped once (releases may have been
//! missed meanwhile); in between a waiter's `released()` waits for the
//! reconnection and the manager's own timer polls.
//!
//! A release that hands the next turn to one instance (see the `ACQUIRE`
//! and `RELEASE` scripts) names it: `turn:<instance id>`, and one whose
//! key has a fair queue names its head: `fair:<token>`. The instance, or
//! the fair waiter, named is woken at once; everyone else one [`TURN`]
//! after the last announcement that named another, so a release sets one
//! waiter going, not all. While hand-offs follow each other within a turn
//! (each announcement says the last turn was taken), the others stay
//! asleep: they wake when announcements stop for a turn, because the
//! named waiter took the key and holds it, or its turn lapsed (it gave up
//! or died), and then look once. Every waiting instance stays in the
//! key's turns set until drawn, so the releases that follow draw it in
//! its turn, and its manager still looks again by the hold's expiry at
//! the latest.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use futures_util::StreamExt;
use moltlock_core::{async_trait, Error, Held, ReleaseWatch};
use redis::Client;
use tokio::sync::{oneshot, watch};

use crate::error::{map, timed_out, NAME};

/// The longest pause between two reconnection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// How long a release keeps the key for the waiting instance it drew
/// (see the `ACQUIRE` script): long enough for its woken waiter to send
/// its attempt on a busy machine, short enough that a turn drawn for a
/// waiter that has just given up costs little.
pub(crate) const TURN: Duration = Duration::from_millis(20);

/// The announcement of a turn handed to an instance: this, then its id.
const TURN_TAG: &str = "turn:";
/// The announcement of a release to a fair queue's head: this, then the
/// head's token.
const FAIR_TAG: &str = "fair:";

/// State shared by the subscriber task and the waiters.
struct Shared {
    keys: Mutex<HashMap<String, watch::Sender<u64>>>,
    /// The channels whose waiters are to be woken later, and when.
    later: Mutex<HashMap<String, Instant>>,
    /// The fair waiters, by token.
    tokens: Mutex<HashMap<String, watch::Sender<u64>>>,
    /// This instance's id, as a turn names it.
    me: String,
    /// `None` until the first connection attempt ends; then whether the
    /// subscription is live.
    up: watch::Sender<Option<bool>>,
}

impl Shared {
    fn new(me: String) -> Self {
        Self {
            keys: Mutex::new(HashMap::new()),
            later: Mutex::new(HashMap::new()),
            tokens: Mutex::new(HashMap::new()),
            me,
            up: watch::channel(None).0,
        }
    }

    fn keys(&self) -> MutexGuard<'_, HashMap<String, watch::Sender<u64>>> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn tokens(&self) -> MutexGuard<'_, HashMap<String, watch::Sender<u64>>> {
        self.tokens.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self, channel: &str) {
        if let Some(tx) = self.keys().get(channel) {
            tx.send_modify(|g| *g = g.wrapping_add(1));
        }
    }

    /// Wakes `channel`'s waiters: at once, unless `payload` hands the turn
    /// to another instance (or names a fair waiter); then a turn after
    /// the last such announcement.
    fn announce(self: &Arc<Self>, channel: &str, payload: &str) {
        if let Some(head) = payload.strip_prefix(FAIR_TAG) {
            if let Some(tx) = self.tokens().get(head) {
                tx.send_modify(|g| *g = g.wrapping_add(1));
            }
            return self.bump_later(channel);
        }
        match payload.strip_prefix(TURN_TAG) {
            Some(who) if who != self.me => self.bump_later(channel),
            _ => self.bump(channel),
        }
    }

    /// Wakes `channel`'s waiters a turn from now, or a turn after a later
    /// call, whichever is last.
    fn bump_later(self: &Arc<Self>, channel: &str) {
        let at = Instant::now() + TURN;
        let fresh = self.later().insert(channel.to_owned(), at).is_none();
        if !fresh {
            return;
        }
        let (shared, channel) = (self.clone(), channel.to_owned());
        tokio::spawn(async move {
            let mut at = at;
            loop {
                tokio::time::sleep_until(at).await;
                let mut later = shared.later();
                match later.get(&channel) {
                    Some(&then) if then > at => at = then,
                    _ => {
                        later.remove(&channel);
                        break;
                    }
                }
            }
            shared.bump(&channel);
        });
    }

    fn later(&self) -> MutexGuard<'_, HashMap<String, Instant>> {
        self.later.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump_all(&self) {
        for tx in self.keys().values() {
            tx.send_modify(|g| *g = g.wrapping_add(1));
        }
    }

    fn set_up(&self, up: bool) {
        self.up.send_replace(Some(up));
        self.bump_all();
    }
}

/// The subscriber of one backend; stops its task when dropped.
pub(crate) struct Notifier {
    shared: Arc<Shared>,
    _stop: oneshot::Sender<()>,
}

impl Notifier {
    /// Starts the subscriber task on `clients` (tried in turn) for `pattern`,
    /// for the instance `me`.
    pub(crate) fn start(
        clients: Vec<Client>,
        pattern: String,
        connect_timeout: Duration,
        me: String,
    ) -> Self {
        let shared = Arc::new(Shared::new(me));
        let (stop_tx, stop_rx) = oneshot::channel();
        let task = Subscriber {
            shared: shared.clone(),
            clients,
            pattern,
            connect_timeout,
        };
        tokio::spawn(task.run(stop_rx));
        Self {
            shared,
            _stop: stop_tx,
        }
    }

    /// Whether a waiter is registered for `channel` and the subscription is
    /// live (a waiter that cannot hear its turn announced is not offered
    /// one).
    pub(crate) fn waits_for(&self, channel: &str) -> bool {
        *self.shared.up.borrow() == Some(true) && self.shared.keys().contains_key(channel)
    }

    /// Registers a waiter for `channel`. Errors (the manager then polls) when
    /// the subscription is down, or when the first connection attempt does
    /// not succeed within `within`.
    pub(crate) async fn watch(&self, channel: String, within: Duration) -> Result<KeyWatch, Error> {
        let rx = {
            let mut keys = self.shared.keys();
            keys.entry(channel.clone())
                .or_insert_with(|| watch::channel(0).0)
                .subscribe()
        };
        let w = KeyWatch {
            shared: self.shared.clone(),
            channel,
            rx,
            own: None,
        };
        let mut up = self.shared.up.subscribe();
        let live = matches!(
            tokio::time::timeout(within, up.wait_for(Option::is_some)).await,
            Ok(Ok(state)) if *state == Some(true)
        );
        if live {
            Ok(w)
        } else {
            Err(timed_out("subscribing to release notifications"))
        }
    }
}

/// The background task holding the pub/sub connection.
struct Subscriber {
    shared: Arc<Shared>,
    clients: Vec<Client>,
    pattern: String,
    connect_timeout: Duration,
}

impl Subscriber {
    async fn run(self, mut stop: oneshot::Receiver<()>) {
        let mut failures = 0u32;
        for attempt in 0usize.. {
            let Some(client) = self.clients.get(attempt % self.clients.len().max(1)) else {
                break;
            };
            tokio::select! {
                done = self.serve(client) => match done {
                    Ok(()) => failures = 0,
                    Err(e) => {
                        tracing::debug!(error = %e, "release subscription failed");
                        failures = failures.saturating_add(1);
                    }
                },
                _ = &mut stop => break,
            }
            self.shared.set_up(false);
            let pause = backoff(failures);
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = &mut stop => break,
            }
        }
        self.shared.set_up(false);
    }

    /// Subscribes and dispatches until the connection ends.
    async fn serve(&self, client: &Client) -> Result<(), Error> {
        let mut pubsub = tokio::time::timeout(self.connect_timeout, client.get_async_pubsub())
            .await
            .map_err(|_| timed_out("opening the pub/sub connection"))?
            .map_err(map)?;
        tokio::time::timeout(self.connect_timeout, pubsub.psubscribe(&self.pattern))
            .await
            .map_err(|_| timed_out("PSUBSCRIBE"))?
            .map_err(map)?;
        self.shared.set_up(true);
        let mut messages = pubsub.into_on_message();
        while let Some(msg) = messages.next().await {
            let payload: String = msg.get_payload().unwrap_or_default();
            self.shared.announce(msg.get_channel_name(), &payload);
        }
        Err(Error::unavailable(NAME, "the pub/sub connection closed"))
    }
}

fn backoff(failures: u32) -> Duration {
    let ms = 50u64.saturating_mul(1 << failures.min(6));
    Duration::from_millis(ms).min(MAX_BACKOFF)
}

/// One waiter's subscription to one key's releases.
pub(crate) struct KeyWatch {
    shared: Arc<Shared>,
    channel: String,
    rx: watch::Receiver<u64>,
    /// A fair waiter's token and the announcements naming it.
    own: Option<(String, watch::Receiver<u64>)>,
}

impl KeyWatch {
    /// Also wakes for the announcements naming `token` (a fair waiter's).
    pub(crate) fn for_token(mut self, token: &str) -> Self {
        let rx = self
            .shared
            .tokens()
            .entry(token.to_owned())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe();
        self.own = Some((token.to_owned(), rx));
        self
    }
}

/// A wait outlives a dropped subscription: the drop and the reconnection
/// each wake every waiter (a release may have gone unheard meanwhile), and
/// while the subscription is down a wait lasts until it is back, the
/// manager's own timer looking again meanwhile. So a waiter that waited
/// across a drop hears the releases after the reconnection.
#[async_trait]
impl ReleaseWatch for KeyWatch {
    async fn released(&mut self, _held: &Held) -> Result<(), Error> {
        let told = match self.own.as_mut() {
            Some((_, own)) => tokio::select! {
                told = self.rx.changed() => told,
                told = own.changed() => told,
            },
            None => self.rx.changed().await,
        };
        told.map_err(|_| Error::unavailable(NAME, "release notifications stopped"))
    }
}

impl Drop for KeyWatch {
    fn drop(&mut self) {
        if let Some((token, _)) = &self.own {
            self.shared.tokens().remove(token);
        }
        let mut keys = self.shared.keys();
        let last = keys
            .get(&self.channel)
            .is_some_and(|tx| tx.receiver_count() <= 1);
        if last {
            keys.remove(&self.channel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shared state for the instance `me` with a waiter on channel `c`.
    fn waiting(me: &str) -> (Arc<Shared>, watch::Receiver<u64>) {
        let shared = Arc::new(Shared::new(me.to_owned()));
        let rx = shared
            .keys()
            .entry("c".to_owned())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe();
        (shared, rx)
    }

    /// While turns handed to other instances follow each other within a
    /// turn, this instance's waiters sleep; a turn after the last one they
    /// wake, once.
    #[tokio::test(start_paused = true)]
    async fn others_turns_in_a_row_wake_nobody_until_they_stop() {
        let (shared, rx) = waiting("me");
        for _ in 0..10 {
            shared.announce("c", "turn:other");
            tokio::time::sleep(TURN / 2).await;
            assert_eq!(*rx.borrow(), 0, "woken while the turns kept being taken");
        }
        tokio::time::sleep(TURN / 2 - Duration::from_millis(1)).await;
        assert_eq!(*rx.borrow(), 0, "woken before a turn had passed");
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert_eq!(*rx.borrow(), 1, "not woken a turn after the last");
        tokio::time::sleep(TURN * 3).await;
        assert_eq!(*rx.borrow(), 1, "woken more than once");
    }

    /// A turn for this instance, a plain release, and a fair head's naming
    /// of this waiter wake at once.
    #[tokio::test(start_paused = true)]
    async fn a_naming_of_this_instance_wakes_at_once() {
        let (shared, rx) = waiting("me");
        shared.announce("c", "turn:me");
        assert_eq!(*rx.borrow(), 1, "its own turn did not wake it");
        shared.announce("c", "released");
        assert_eq!(*rx.borrow(), 2, "a plain release did not wake it");
        let own = shared
            .tokens()
            .entry("t".to_owned())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe();
        shared.announce("c", "fair:t");
        assert_eq!(*own.borrow(), 1, "the named fair waiter was not woken");
        assert_eq!(*rx.borrow(), 2, "the key's other waiters woke at once");
    }
}
