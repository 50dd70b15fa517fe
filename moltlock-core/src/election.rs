//! Leader election on the single-key hold: a candidate campaigns by
//! acquiring the election's key (in the backend's fair queue where it has
//! one), the leader's value is the hold's description, and its term is the
//! hold's fence.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::mpsc;

use crate::guard::LockGuard;
use crate::manager::LockManager;
use crate::options::LockOptions;
use crate::{
    check_description, Error, Fence, Held, HolderInfo, LockKey, LostReason, LostToken, Token,
};

/// What makes a leadership change: its term, its value, its holder.
type Identity = (Option<Fence>, Option<String>, Token);

/// How often [`Election::observe`] looks at the key while nothing notifies it.
const OBSERVE_POLL: Duration = Duration::from_millis(200);

/// An election over one key ([`LockManager::election`]).
#[derive(Clone)]
pub struct Election {
    mgr: LockManager,
    key: LockKey,
}

impl fmt::Debug for Election {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Election").field("key", &self.key).finish()
    }
}

/// The current leader of an election, as the store reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leader {
    /// The leader's value ([`Election::campaign`], [`Leadership::proclaim`]),
    /// where the backend stores descriptions. The store writes a new
    /// leader's value right after granting its hold, so for that moment a
    /// reader sees the leader without one.
    pub value: Option<String>,
    /// The leader's term: its hold's fence, strictly increasing from leader
    /// to leader (where the store keeps fences with holds).
    pub term: Option<Fence>,
    /// Time left before the leadership expires unless renewed.
    pub expires_in: Option<Duration>,
    /// The leader's owner token.
    pub holder: Token,
}

impl From<HolderInfo> for Leader {
    fn from(info: HolderInfo) -> Self {
        Self {
            value: info.description,
            term: info.fence,
            expires_in: info.expires_in,
            holder: info.holder,
        }
    }
}

impl LockManager {
    /// An election whose leader holds the key `name`.
    ///
    /// # Errors
    /// [`Error::InvalidKey`] for a bad name.
    pub fn election(&self, name: impl AsRef<str>) -> Result<Election, Error> {
        let key = self.user_key(name.as_ref(), 0)?;
        Ok(Election {
            mgr: self.clone(),
            key,
        })
    }
}

impl Election {
    /// The key the leader holds.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// Waits until this candidate leads, with `value` as the leader's value
    /// (at most [`MAX_DESCRIPTION_LEN`](crate::MAX_DESCRIPTION_LEN) bytes).
    /// Candidates wait in the backend's fair queue where it has one (etcd),
    /// so they win in arrival order. It returns only once the store has
    /// granted the hold and the hold is valid: never on a session that
    /// ended while it waited.
    ///
    /// # Cancel safety
    /// As [`LockManager::lock`]: a dropped campaign leaves no candidate and
    /// no leadership behind.
    ///
    /// # Errors
    /// [`Error::Config`] for a bad value; as [`LockManager::acquire`].
    pub async fn campaign(&self, value: impl Into<String>) -> Result<Leadership, Error> {
        let value = value.into();
        check_description(&value)?;
        let mut opts = LockOptions::new().description(value);
        if self.mgr.backend().fair_queue().is_some() {
            opts = opts.fair();
        }
        loop {
            let got = self.mgr.acquire(self.key.as_str(), opts.clone()).await?;
            let Some(guard) = got else { continue };
            if guard.is_held() {
                return Ok(Leadership { guard });
            }
        }
    }

    /// The current leader, or `None` when nobody leads.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the backend cannot inspect holds; store
    /// errors.
    pub async fn leader(&self) -> Result<Option<Leader>, Error> {
        let backend = self.mgr.backend();
        let inspector = crate::forward::require(backend.name(), backend.inspector(), "inspect")?;
        Ok(inspector.inspect(&self.key).await?.map(Leader::from))
    }

    /// Every change of leadership (a new term, a new value, or nobody
    /// leading), starting with the current state. Woken by the backend's
    /// release notifications where it has them, else by polling; a
    /// leadership shorter than the poll interval (200 ms) may be missed.
    /// Dropping the stream stops the watching.
    ///
    /// # Errors
    /// The stream yields a store error and goes on; it ends only when
    /// dropped. Called off a tokio runtime, it yields one
    /// [`Error::Config`] and ends.
    pub fn observe(&self) -> Observer {
        let (tx, rx) = mpsc::channel(16);
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                let election = self.clone();
                handle.spawn(async move { election.watch_changes(tx).await });
            }
            Err(_) => {
                let why = "observe() needs a tokio runtime to watch from".to_string();
                let _ = tx.try_send(Err(Error::Config(why)));
            }
        }
        Observer { rx }
    }

    async fn watch_changes(self, tx: mpsc::Sender<Result<Option<Leader>, Error>>) {
        let mut watch = self.mgr.open_watch(&self.key).await;
        let mut last: Option<Option<Identity>> = None;
        loop {
            let now = self.leader().await;
            let seen = match &now {
                Ok(l) => Some(
                    l.as_ref()
                        .map(|l| (l.term, l.value.clone(), l.holder.clone())),
                ),
                Err(_) => None,
            };
            let leading = now.as_ref().ok().and_then(Option::clone);
            if seen.is_none() || seen != last {
                if tx.send(now).await.is_err() {
                    return;
                }
                last = seen;
            }
            let pause = leading
                .as_ref()
                .and_then(|l| l.expires_in)
                .map_or(OBSERVE_POLL, |left| left.min(OBSERVE_POLL));
            let released = async {
                match (watch.as_mut(), leading) {
                    (Some(w), Some(l)) => {
                        let held = Held {
                            holder: Some(l.holder),
                            expires_in: l.expires_in,
                            revision: None,
                        };
                        w.released(&held).await
                    }
                    _ => std::future::pending().await,
                }
            };
            tokio::select! {
                r = released => if r.is_err() { watch = None; },
                _ = tokio::time::sleep(pause) => {}
                _ = tx.closed() => return,
            }
        }
    }
}

/// The leadership changes of an election ([`Election::observe`]): a
/// [`Stream`](futures_core::Stream), or [`next`](Self::next) for one.
#[derive(Debug)]
pub struct Observer {
    rx: mpsc::Receiver<Result<Option<Leader>, Error>>,
}

impl Observer {
    /// The next change: the new leader, or `None` inside `Ok` when nobody
    /// leads.
    ///
    /// # Cancel safety
    /// Cancel safe: a change not yet taken stays for the next call.
    pub async fn next(&mut self) -> Option<Result<Option<Leader>, Error>> {
        self.rx.recv().await
    }
}

impl futures_core::Stream for Observer {
    type Item = Result<Option<Leader>, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

/// This candidate leads ([`Election::campaign`]). It leads while this
/// lives and is renewed; dropped, it resigns in the background.
#[derive(Debug)]
#[must_use = "dropping the leadership resigns"]
pub struct Leadership {
    guard: LockGuard,
}

impl Leadership {
    /// The term: the hold's fence, strictly greater than every earlier
    /// leader's. Send it with every write the leader makes.
    pub fn term(&self) -> Fence {
        self.guard.fence()
    }

    /// Whether this candidate still leads in this process's view.
    pub fn is_leader(&self) -> bool {
        self.guard.is_held()
    }

    /// The term, while this candidate leads; use it right before a write.
    ///
    /// # Errors
    /// [`Error::Lost`] once the leadership is lost.
    pub fn check(&self) -> Result<Fence, Error> {
        self.guard.check()
    }

    /// Replaces the leader's value, owner-checked: only while this
    /// candidate still holds the leadership in the store.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when another leader (or nobody) holds it now;
    /// [`Error::Unsupported`] when the backend stores no values;
    /// [`Error::Config`] for a bad value.
    pub async fn proclaim(&self, value: &str) -> Result<(), Error> {
        check_description(value)?;
        let backend = self.guard.manager_backend();
        let describer = crate::forward::require(backend.name(), backend.describer(), "describe")?;
        if describer
            .describe(self.guard.key(), self.guard.token(), value)
            .await?
        {
            Ok(())
        } else {
            Err(Error::NotHeld {
                key: self.guard.key().to_string(),
            })
        }
    }

    /// Resolves when the leadership is lost, before the store could grant
    /// it to another candidate (as [`LockGuard::lost`]).
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    pub async fn lost(&self) -> LostReason {
        self.guard.lost().await
    }

    /// A cloneable handle on the loss, for another task.
    pub fn lost_token(&self) -> LostToken {
        self.guard.lost_token()
    }

    /// The hold behind the leadership.
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// Steps down: the next candidate can win at once.
    ///
    /// # Errors
    /// As [`LockGuard::release`].
    pub async fn resign(self) -> Result<(), Error> {
        self.guard.release().await
    }
}
