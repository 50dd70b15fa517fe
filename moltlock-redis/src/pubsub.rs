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
//! the fair waiter, named is woken at once, so a release sets one waiter
//! going, not all. Everyone else is woken one [`TURN`] later, at most once
//! per key and turn; but an instance in the key's turns, passed over by
//! a turn handed to another, a turn after the last such announcement (and
//! at least every [`LONGEST_LATER`]). While hand-offs follow each other
//! within a turn (each announcement says the last turn was taken), such
//! an instance stays asleep: it stays in the turns set until a release
//! draws it, and its waiters are woken then. It looks when the
//! announcements stop for a turn (the named waiter took the key and holds
//! it, or its turn lapsed: it gave up or died). An instance not in the
//! turns is never drawn (its waiters of the key are multi-key takes, or
//! its turns are off), and neither are the plain waiters beside a fair
//! queue (a queue with places draws no turns): they look a turn after the
//! first announcement however many follow, in the gaps between
//! hand-offs.

use std::collections::{HashMap, HashSet};
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

/// The longest a run of turns handed to other instances keeps the
/// waiters of an instance in the key's turns asleep: they look at least
/// this often (its turn may come late, or its waiter that joined them may
/// have given up while a multi-key take of the same instance waits).
const LONGEST_LATER: Duration = Duration::from_millis(100);

/// When a channel's waiters are to be woken: `at`, which announcements of
/// other instances' turns push back, up to `cap`.
#[derive(Clone, Copy)]
struct Due {
    at: Instant,
    cap: Instant,
}

/// The announcement of a turn handed to an instance: this, then its id.
const TURN_TAG: &str = "turn:";
/// The announcement of a release to a fair queue's head: this, then the
/// head's token.
const FAIR_TAG: &str = "fair:";

/// State shared by the subscriber task and the waiters.
struct Shared {
    keys: Mutex<HashMap<String, watch::Sender<u64>>>,
    /// The channels whose waiters are to be woken later, and when.
    later: Mutex<HashMap<String, Due>>,
    /// The fair waiters, by token.
    tokens: Mutex<HashMap<String, watch::Sender<u64>>>,
    /// The channels whose turns this instance has joined (see
    /// [`Notifier::joined`]).
    joined: Mutex<HashSet<String>>,
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
            joined: Mutex::new(HashSet::new()),
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

    fn joined(&self) -> MutexGuard<'_, HashSet<String>> {
        self.joined.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self, channel: &str) {
        if let Some(tx) = self.keys().get(channel) {
            tx.send_modify(|g| *g = g.wrapping_add(1));
        }
    }

    /// Wakes `channel`'s waiters: at once, unless `payload` hands the turn
    /// to another instance (then a turn later; while this instance is in
    /// the key's turns, a turn after the last such announcement, see
    /// [`LONGEST_LATER`]) or names a fair waiter (then a turn later).
    fn announce(self: &Arc<Self>, channel: &str, payload: &str) {
        if let Some(head) = payload.strip_prefix(FAIR_TAG) {
            if let Some(tx) = self.tokens().get(head) {
                tx.send_modify(|g| *g = g.wrapping_add(1));
            }
            return self.bump_later(channel, false);
        }
        match payload.strip_prefix(TURN_TAG) {
            Some(who) if who != self.me => {
                let joined = self.joined().contains(channel);
                self.bump_later(channel, joined)
            }
            _ => self.bump(channel),
        }
    }

    /// Wakes `channel`'s waiters a turn from now; when `push`, a turn after
    /// a later such call instead, but no later than [`LONGEST_LATER`] after
    /// the first.
    fn bump_later(self: &Arc<Self>, channel: &str, push: bool) {
        let now = Instant::now();
        let first = {
            let mut later = self.later();
            if let Some(due) = later.get_mut(channel) {
                if push {
                    due.at = (now + TURN).min(due.cap);
                }
                return;
            }
            let due = Due {
                at: now + TURN,
                cap: now + LONGEST_LATER,
            };
            later.insert(channel.to_owned(), due);
            due.at
        };
        let (shared, channel) = (self.clone(), channel.to_owned());
        tokio::spawn(async move {
            let mut at = first;
            loop {
                tokio::time::sleep_until(at).await;
                let mut later = shared.later();
                match later.get(&channel) {
                    Some(due) if due.at > at => at = due.at,
                    _ => {
                        later.remove(&channel);
                        break;
                    }
                }
            }
            shared.bump(&channel);
        });
    }

    fn later(&self) -> MutexGuard<'_, HashMap<String, Due>> {
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

    /// Notes whether this instance is in `channel`'s turns: its waiting
    /// attempt found the key held and joined them (`true`), or it took the
    /// key and left them (`false`). While it is in them, a release draws
    /// it in its turn, so the turns handed to others push its waiters'
    /// wake back; otherwise (only multi-key takes wait, or turns are off)
    /// they look a turn after the first.
    pub(crate) fn joined(&self, channel: &str, joined: bool) {
        let mut set = self.shared.joined();
        if joined != set.contains(channel) {
            match joined {
                true => set.insert(channel.to_owned()),
                false => set.remove(channel),
            };
        }
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
                ended = self.serve(client) => match ended {
                    // A subscription that was up starts the count afresh:
                    // every drop of a working connection is followed by
                    // the shortest pause, however many came before.
                    Ended::Closed => {
                        tracing::debug!("the release subscription closed; subscribing again");
                        failures = 0;
                    }
                    Ended::Failed(e) => {
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
    async fn serve(&self, client: &Client) -> Ended {
        let pubsub = match self.subscribe(client).await {
            Ok(pubsub) => pubsub,
            Err(e) => return Ended::Failed(e),
        };
        self.shared.set_up(true);
        let mut messages = pubsub.into_on_message();
        while let Some(msg) = messages.next().await {
            let payload: String = msg.get_payload().unwrap_or_default();
            self.shared.announce(msg.get_channel_name(), &payload);
        }
        Ended::Closed
    }

    /// Opens a pub/sub connection and subscribes to the release channels.
    async fn subscribe(&self, client: &Client) -> Result<redis::aio::PubSub, Error> {
        let mut pubsub = tokio::time::timeout(self.connect_timeout, client.get_async_pubsub())
            .await
            .map_err(|_| timed_out("opening the pub/sub connection"))?
            .map_err(map)?;
        tokio::time::timeout(self.connect_timeout, pubsub.psubscribe(&self.pattern))
            .await
            .map_err(|_| timed_out("PSUBSCRIBE"))?
            .map_err(map)?;
        Ok(pubsub)
    }
}

/// How a run of [`Subscriber::serve`] ended.
enum Ended {
    /// No subscription was made.
    Failed(Error),
    /// The subscription was up, then its connection closed.
    Closed,
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
            drop(keys);
            self.shared.joined().remove(&self.channel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As [`waiting`], the instance in channel `c`'s turns.
    fn in_turns(me: &str) -> (Arc<Shared>, watch::Receiver<u64>) {
        let (shared, rx) = waiting(me);
        shared.joined().insert("c".to_owned());
        (shared, rx)
    }

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

    /// Announces `payload` on channel `c` every half turn for `turns`
    /// turns, from now.
    async fn announce_every_half_turn(shared: &Arc<Shared>, payload: &str, turns: u32) {
        for _ in 0..turns * 2 {
            shared.announce("c", payload);
            tokio::time::sleep(TURN / 2).await;
        }
    }

    const MS: Duration = Duration::from_millis(1);

    /// While turns handed to other instances follow each other within a
    /// turn, this instance's waiters sleep; a turn after the last one they
    /// wake, once.
    #[tokio::test(start_paused = true)]
    async fn others_turns_in_a_row_wake_nobody_until_they_stop() {
        let (shared, rx) = in_turns("me");
        let start = Instant::now();
        announce_every_half_turn(&shared, "turn:other", 3).await;
        assert_eq!(*rx.borrow(), 0, "woken while the turns kept being taken");
        let last = start + TURN * 5 / 2;
        tokio::time::sleep_until(last + TURN - MS).await;
        assert_eq!(*rx.borrow(), 0, "woken before a turn had passed");
        tokio::time::sleep_until(last + TURN + MS).await;
        assert_eq!(*rx.borrow(), 1, "not woken a turn after the last");
        tokio::time::sleep(TURN * 3).await;
        assert_eq!(*rx.borrow(), 1, "woken more than once");
    }

    /// However long the turns go on, this instance's waiters look every
    /// [`LONGEST_LATER`] (one that takes no turns is never drawn).
    #[tokio::test(start_paused = true)]
    async fn a_long_run_of_others_turns_wakes_at_the_longest_interval() {
        let (shared, rx) = in_turns("me");
        let start = Instant::now();
        let turns = 2 * (LONGEST_LATER.as_millis() / TURN.as_millis()) as u32;
        let seen = tokio::spawn({
            let rx = rx.clone();
            async move {
                tokio::time::sleep_until(start + LONGEST_LATER - MS).await;
                let before = *rx.borrow();
                tokio::time::sleep_until(start + LONGEST_LATER + MS).await;
                (before, *rx.borrow())
            }
        });
        announce_every_half_turn(&shared, "turn:other", turns).await;
        assert_eq!(
            seen.await.ok(),
            Some((0, 1)),
            "not woken at the longest interval"
        );
        tokio::time::sleep_until(start + LONGEST_LATER * 2 + TURN + MS).await;
        assert_eq!(*rx.borrow(), 2, "not woken once more in the next interval");
    }

    /// A fair queue's namings of other waiters wake this instance's
    /// waiters of the key a turn after the first, while they go on: a
    /// plain waiter beside a fair queue is never drawn. So do the turns
    /// of others for an instance not in the key's turns (its waiters are
    /// multi-key takes, or its turns are off), and for one that took the
    /// key and left them.
    #[tokio::test(start_paused = true)]
    async fn namings_wake_the_waiters_never_drawn_a_turn_after_the_first() {
        let (shared, rx) = in_turns("me");
        namings_wake_a_turn_after_the_first(&shared, &rx, "fair:other").await;
        let (shared, rx) = waiting("me");
        namings_wake_a_turn_after_the_first(&shared, &rx, "turn:other").await;
        let (shared, rx) = in_turns("me");
        let notifier = Notifier {
            shared: shared.clone(),
            _stop: oneshot::channel().0,
        };
        notifier.joined("c", false);
        namings_wake_a_turn_after_the_first(&shared, &rx, "turn:other").await;
    }

    async fn namings_wake_a_turn_after_the_first(
        shared: &Arc<Shared>,
        rx: &watch::Receiver<u64>,
        payload: &str,
    ) {
        let start = Instant::now();
        let seen = tokio::spawn({
            let rx = rx.clone();
            async move {
                tokio::time::sleep_until(start + TURN + MS).await;
                *rx.borrow()
            }
        });
        announce_every_half_turn(shared, payload, 3).await;
        let told = seen.await.ok();
        assert_eq!(told, Some(1), "{payload}: not woken a turn after the first");
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
