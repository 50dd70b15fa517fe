//! Reader-writer locks: many readers or one writer, with writer preference.

use std::fmt;
use std::time::Duration;

use crate::guard::LockGuard;
use crate::guards::{MultiGuard, ReadGuard, SlotGuard, WriteGuard};
use crate::manager::LockManager;
use crate::options::LockOptions;
use crate::sets::{granted, within, Attempt};
use crate::slots::SlotSet;
use crate::{Error, Held, LockKey, MultiMode, Token, DERIVED_ROOM};

/// How a reader's pass through the writer key is told from a writer's
/// hold: its token starts with this (and goes on with a random token).
const PASS_PREFIX: &str = "moltlock-read-pass-";

/// What a reader found at the writer key.
enum Pass {
    /// The reader holds the writer key for its pass.
    Held(LockGuard),
    /// Another reader's pass holds it: no writer does.
    Reader,
    /// A writer holds it (or the store does not say who): wait.
    Writer(Held),
}

/// Whether a busy answer names a reader's pass as the holder.
fn is_pass(held: &Held) -> bool {
    held.holder
        .as_ref()
        .is_some_and(|t| t.as_str().starts_with(PASS_PREFIX))
}

/// The shape of a read-write lock.
#[derive(Clone, Copy, Debug)]
pub struct RwOptions {
    readers: u32,
}

impl Default for RwOptions {
    fn default() -> Self {
        Self { readers: 16 }
    }
}

impl RwOptions {
    /// At most 16 readers at once.
    pub fn new() -> Self {
        Self::default()
    }

    /// At most `n` readers at once (1 to [`MAX_PERMITS`](crate::MAX_PERMITS));
    /// every client of the lock must use the same number. A writer takes
    /// `n + 1` keys, so keep it small.
    pub fn readers(mut self, n: u32) -> Self {
        self.readers = n;
        self
    }
}

/// Many readers or one writer, on any backend.
///
/// Built from ordinary holds: a writer key (`name#~w`) and N reader slots
/// (`name#~r0` …). A reader passes through the writer key (holds it for
/// one round trip, under a token marked as a reader's pass), takes one free
/// slot, and lets the writer key go; a reader that finds another reader's
/// pass there (no writer holds it) goes straight to a slot, so readers do
/// not queue behind each other's passes (where the backend names the holder
/// of a busy key, as every built-in one does). A writer holds the writer
/// key, then every slot. So:
/// - a writer excludes every reader: it holds every slot a reader needs;
/// - writer preference: once a writer holds the writer key, new readers
///   wait at it, and the readers inside drain; a writer waits at most for
///   the longest read in progress;
/// - a dead reader frees only its own slot, when its hold expires by the
///   store's clock (no shared TTL, no count that never expires);
/// - writer fences ([`WriteGuard::fence`], the writer key's) strictly
///   increase from writer to writer; a reader's fence is its slot's and
///   rises per slot only.
#[derive(Clone)]
pub struct RwLock {
    mgr: LockManager,
    writer: LockKey,
    readers: SlotSet,
}

impl fmt::Debug for RwLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLock")
            .field("name", self.readers.name())
            .field("readers", &self.readers.count())
            .finish()
    }
}

impl LockManager {
    /// A read-write lock named `name`.
    ///
    /// # Errors
    /// As [`semaphore`](Self::semaphore), for the name and the reader count.
    pub fn rw_lock(&self, name: impl AsRef<str>, opts: RwOptions) -> Result<RwLock, Error> {
        let name = self.user_key(name.as_ref(), DERIVED_ROOM)?;
        Ok(RwLock {
            mgr: self.clone(),
            writer: name.derive("w"),
            readers: SlotSet::new(name, "r", opts.readers)?,
        })
    }
}

impl RwLock {
    /// The lock's name.
    pub fn name(&self) -> &LockKey {
        self.readers.name()
    }

    /// Waits for a shared hold.
    ///
    /// # Cancel safety
    /// Dropping the future holds nothing: the writer key's pass and any
    /// slot in flight are given back, as for [`LockManager::lock`].
    ///
    /// # Errors
    /// Store errors that are not retryable, [`Error::LimitMismatch`].
    pub async fn read(&self) -> Result<ReadGuard, Error> {
        let got = self.read_with(LockOptions::new()).await?;
        granted(&self.mgr, got)
    }

    /// One attempt at a shared hold: `None` while a writer holds or waits,
    /// or every reader slot is taken.
    ///
    /// # Cancel safety
    /// As [`read`](Self::read).
    ///
    /// # Errors
    /// As [`read`](Self::read).
    pub async fn try_read(&self) -> Result<Option<ReadGuard>, Error> {
        self.read_with(LockOptions::new().no_wait()).await
    }

    /// A shared hold with explicit options (TTL, cumulative timeout,
    /// `no_wait`, description). Returns `None` only with `no_wait`.
    ///
    /// # Cancel safety
    /// As [`read`](Self::read).
    ///
    /// # Errors
    /// As [`read`](Self::read), and [`Error::Timeout`].
    pub async fn read_with(&self, opts: LockOptions) -> Result<Option<ReadGuard>, Error> {
        let ttl = self.mgr.set_ttl(&opts)?;
        let work = self.read_loop(ttl, opts.no_wait);
        let got = within(self.name().as_str(), opts.timeout, work).await?;
        if let Some(g) = &got {
            self.mgr
                .describe_all(std::slice::from_ref(g.guard()), &opts)
                .await;
        }
        Ok(got)
    }

    async fn read_loop(&self, ttl: Duration, no_wait: bool) -> Result<Option<ReadGuard>, Error> {
        let mut watches = Vec::new();
        let mut gate = Vec::new();
        let mut checked = false;
        let mut attempt = 0u32;
        loop {
            let found = match self.pass(ttl).await {
                Err(e) if e.is_retryable() && !no_wait => {
                    self.backoff(&e, attempt).await;
                    attempt = attempt.saturating_add(1);
                    continue;
                }
                found => found?,
            };
            let pass = match found {
                Pass::Held(guard) => Some(guard),
                Pass::Reader => None,
                Pass::Writer(_) if no_wait => return Ok(None),
                Pass::Writer(held) => {
                    if gate.is_empty() {
                        gate = self
                            .mgr
                            .open_watches(std::slice::from_ref(&self.writer))
                            .await;
                    }
                    self.mgr
                        .pause_set(
                            &mut gate,
                            std::slice::from_ref(&self.writer),
                            &[(0, held)],
                            attempt,
                            None,
                        )
                        .await;
                    attempt = attempt.saturating_add(1);
                    continue;
                }
            };
            let keys = self.readers.rotated();
            let tried = self
                .mgr
                .attempt_set(&keys, MultiMode::Any, ttl.into())
                .await;
            if let Some(pass) = pass {
                self.mgr.release_or_retry(pass).await;
            }
            let tried = match tried {
                Err(e) if e.is_retryable() && !no_wait => {
                    self.backoff(&e, attempt).await;
                    attempt = attempt.saturating_add(1);
                    continue;
                }
                tried => tried?,
            };
            let busy = match tried {
                Attempt::Got(mut guards) => match guards.pop() {
                    Some(g) => return Ok(Some(self.slot_guard(g))),
                    None => continue,
                },
                Attempt::Busy(busy) | Attempt::Own(busy) => busy,
            };
            if !checked {
                self.readers.check_limit(&self.mgr).await?;
                checked = true;
            }
            if no_wait {
                return Ok(None);
            }
            if watches.is_empty() {
                watches = self.mgr.open_watches(self.readers.keys()).await;
            }
            let busy = self.by_slot(&keys, busy);
            let slots = self.readers.keys();
            self.mgr
                .pause_set(&mut watches, slots, &busy, attempt, None)
                .await;
            attempt = attempt.saturating_add(1);
        }
    }

    /// Sleeps the retry delay after a transient store error.
    async fn backoff(&self, e: &Error, attempt: u32) {
        tracing::debug!(name = %self.name(), error = %e, "read attempt failed; retrying");
        tokio::time::sleep(self.mgr.retry_delay(attempt)).await;
    }

    /// One attempt at the writer key for a reader's pass: held now, held
    /// by another reader's pass (no writer holds it, so go on to a slot),
    /// or held by a writer (wait).
    async fn pass(&self, ttl: Duration) -> Result<Pass, Error> {
        let token = Token::from_stored(format!("{PASS_PREFIX}{}", Token::random()));
        let key = std::slice::from_ref(&self.writer);
        let tried = self
            .mgr
            .attempt_as(key, MultiMode::All, ttl.into(), token)
            .await?;
        Ok(match tried {
            Attempt::Got(mut guards) => match guards.pop() {
                Some(g) => Pass::Held(g),
                None => Pass::Writer(Held::default()),
            },
            Attempt::Busy(mut busy) | Attempt::Own(mut busy) => match busy.pop() {
                Some((_, held)) if is_pass(&held) => Pass::Reader,
                Some((_, held)) => Pass::Writer(held),
                None => Pass::Writer(Held::default()),
            },
        })
    }

    /// Holds the writer key for a writer; `None` with `no_wait` while
    /// another holds it.
    async fn claim(&self, ttl: Duration, no_wait: bool) -> Result<Option<LockGuard>, Error> {
        let key = std::slice::from_ref(&self.writer);
        let got = self
            .mgr
            .acquire_set(key, MultiMode::All, ttl.into(), no_wait, None)
            .await?;
        Ok(got.and_then(|mut g| g.pop()))
    }

    /// Busy answers of an attempt on `keys` (rotated), indexed by slot
    /// number as the watches are.
    fn by_slot(&self, keys: &[LockKey], busy: Vec<(usize, Held)>) -> Vec<(usize, Held)> {
        let slot = |i: usize| {
            let key = keys.get(i)?;
            usize::try_from(self.readers.slot_of(key.as_str())?).ok()
        };
        busy.into_iter()
            .filter_map(|(i, h)| Some((slot(i)?, h)))
            .collect()
    }

    fn slot_guard(&self, guard: LockGuard) -> SlotGuard {
        let slot = self.readers.slot_of(guard.key().as_str()).unwrap_or(0);
        SlotGuard::new(guard, slot)
    }

    /// Waits for the exclusive hold.
    ///
    /// # Cancel safety
    /// Dropping the future holds nothing: the writer key and the slots
    /// taken so far are given back, attempts in flight deleted by token.
    ///
    /// # Errors
    /// Store errors that are not retryable; [`Error::LimitMismatch`] when
    /// a reader of a client with more reader slots holds a slot past ours.
    pub async fn write(&self) -> Result<WriteGuard, Error> {
        let got = self.write_with(LockOptions::new()).await?;
        granted(&self.mgr, got)
    }

    /// One attempt at the exclusive hold: `None` when a writer or any
    /// reader holds the lock.
    ///
    /// # Cancel safety
    /// As [`write`](Self::write).
    ///
    /// # Errors
    /// As [`write`](Self::write).
    pub async fn try_write(&self) -> Result<Option<WriteGuard>, Error> {
        self.write_with(LockOptions::new().no_wait()).await
    }

    /// The exclusive hold with explicit options (TTL, cumulative timeout,
    /// `no_wait`, description). Returns `None` only with `no_wait`.
    ///
    /// # Cancel safety
    /// As [`write`](Self::write).
    ///
    /// # Errors
    /// As [`write`](Self::write), and [`Error::Timeout`].
    pub async fn write_with(&self, opts: LockOptions) -> Result<Option<WriteGuard>, Error> {
        let ttl = self.mgr.set_ttl(&opts)?;
        let work = self.write_once(ttl, opts.no_wait);
        let got = within(self.name().as_str(), opts.timeout, work).await?;
        if let Some(w) = &got {
            self.mgr
                .describe_all(std::slice::from_ref(w.writer()), &opts)
                .await;
        }
        Ok(got)
    }

    async fn write_once(&self, ttl: Duration, no_wait: bool) -> Result<Option<WriteGuard>, Error> {
        let Some(writer) = self.claim(ttl, no_wait).await? else {
            return Ok(None);
        };
        let slots = self.readers.keys();
        let got = self
            .mgr
            .acquire_set(slots, MultiMode::All, ttl.into(), no_wait, None)
            .await?;
        let Some(readers) = got else {
            self.mgr.release_or_retry(writer).await;
            return Ok(None);
        };
        let guard = WriteGuard::new(writer, MultiGuard::new(readers));
        // Readers of a client with more slots could sit past ours.
        if let Err(e) = self.readers.check_limit(&self.mgr).await {
            guard.release().await.ok();
            return Err(e);
        }
        Ok(Some(guard))
    }
}
