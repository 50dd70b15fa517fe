//! A cloneable, `'static` view of one hold: its lost signal to hand to a
//! watcher task, with the key and fence.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::hold::Hold;
use crate::registry::Inner;
use crate::{Error, Fence, LockKey, LostReason};

/// A handle on one hold's lost signal, from
/// [`LockGuard::lost_token`](crate::LockGuard::lost_token). Cheap to clone and `'static`: move it
/// into a task that must stop when the lock is lost, with no `Arc` around
/// the guard. It never keeps the lock held: the guard does.
///
/// Once the guard is released, the token reports the hold as gone
/// ([`LostReason::Released`]), so a task watching it stops too.
#[derive(Clone)]
pub struct LostToken {
    inner: Arc<Inner>,
    hold: Arc<Hold>,
}

impl fmt::Debug for LostToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LostToken")
            .field("key", &self.hold.key)
            .field("fence", &self.hold.fence)
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl LostToken {
    pub(crate) fn new(inner: Arc<Inner>, hold: Arc<Hold>) -> Self {
        Self { inner, hold }
    }

    /// The key of the hold.
    pub fn key(&self) -> &LockKey {
        &self.hold.key
    }

    /// The hold's fencing token: send it with every write.
    pub fn fence(&self) -> Fence {
        self.hold.fence
    }

    /// Whether the hold is gone in this process's view: lost, past its
    /// local validity deadline, or released.
    pub fn is_lost(&self) -> bool {
        self.reason().is_some()
    }

    /// Time left before the local validity deadline, unless renewed;
    /// `None` once the hold is gone.
    pub fn valid_for(&self) -> Option<Duration> {
        valid_for(&self.hold)
    }

    /// Why the hold is gone, or `None` while it is held.
    pub fn reason(&self) -> Option<LostReason> {
        gone(&self.hold)
    }

    /// The fence, while the hold is held; use it right before a write.
    ///
    /// # Errors
    /// [`Error::Lost`] once the hold is gone.
    pub fn check(&self) -> Result<Fence, Error> {
        check(&self.hold)
    }

    /// Resolves when the hold is lost (as [`LockGuard::lost`](crate::LockGuard::lost))
    /// or released.
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    pub async fn lost(&self) -> LostReason {
        wait_lost(&self.inner, &self.hold).await
    }
}

/// Time left before `hold`'s validity deadline; `None` once it is gone.
pub(crate) fn valid_for(hold: &Hold) -> Option<Duration> {
    if gone(hold).is_some() {
        return None;
    }
    hold.valid_until().checked_duration_since(Instant::now())
}

/// `hold`'s fence while it is held, else why it is not.
pub(crate) fn check(hold: &Hold) -> Result<Fence, Error> {
    match gone(hold) {
        None => Ok(hold.fence),
        Some(reason) => Err(Error::Lost {
            key: hold.key.to_string(),
            reason,
        }),
    }
}

/// Why `hold` is gone in this process's view, if it is.
pub(crate) fn gone(hold: &Hold) -> Option<LostReason> {
    let s = hold.snapshot();
    if let Some(reason) = s.lost {
        return Some(reason);
    }
    if s.released {
        return Some(LostReason::Released);
    }
    (Instant::now() >= s.valid_until).then_some(LostReason::Deadline)
}

/// Waits until `hold` is lost (a refused renewal, or its validity deadline
/// passed, which this fires itself) or released.
pub(crate) async fn wait_lost(inner: &Arc<Inner>, hold: &Hold) -> LostReason {
    let mut rx = hold.state.subscribe();
    loop {
        let s = rx.borrow_and_update().clone();
        if let Some(reason) = s.lost {
            return reason;
        }
        if s.released {
            return LostReason::Released;
        }
        tokio::select! {
            changed = rx.changed() => if changed.is_err() {
                return LostReason::Deadline;
            },
            _ = tokio::time::sleep_until(s.valid_until) => {
                crate::renew::lose_at_deadline(inner, hold);
            }
        }
    }
}
