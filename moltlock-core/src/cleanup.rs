//! Best-effort, owner-checked cleanup for holds whose owner went away.

use std::sync::Arc;
use std::time::Duration;

use crate::manager::Inner;
use crate::{Backend, LockKey, Token};

/// Pauses before each further delete of a cancelled acquisition: its request
/// may still be in flight (on another connection, or in a blocking task) and
/// land after the first delete.
const CANCELLED_RETRIES: [Duration; 4] = [
    Duration::from_millis(50),
    Duration::from_millis(200),
    Duration::from_secs(1),
    Duration::from_secs(3),
];

/// Spawns an owner-checked delete bounded by `timeout`; with `in_flight`, it
/// tries again at growing pauses until a delete succeeds or time runs out.
/// Without a tokio runtime it does nothing: the hold then lives until its TTL.
pub(crate) fn spawn_release(
    backend: Arc<dyn Backend>,
    key: LockKey,
    token: Token,
    timeout: Duration,
    in_flight: bool,
) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        tracing::debug!(%key, "no runtime; the hold lives until its TTL");
        return;
    };
    let pauses: &'static [Duration] = if in_flight { &CANCELLED_RETRIES } else { &[] };
    let ticket = crate::pending::Ticket::new();
    handle.spawn(async move {
        let _ticket = ticket;
        let work = delete_until_gone(backend.as_ref(), &key, &token, pauses);
        if tokio::time::timeout(timeout, work).await.is_err() {
            tracing::debug!(%key, "best-effort release timed out");
        }
    });
}

async fn delete_until_gone(
    backend: &dyn Backend,
    key: &LockKey,
    token: &Token,
    pauses: &[Duration],
) {
    let mut pauses = pauses.iter();
    loop {
        match backend.delete(key, token).await {
            Ok(true) => return,
            Ok(false) => {}
            Err(e) => tracing::debug!(%key, error = %e, "best-effort release failed"),
        }
        let Some(pause) = pauses.next() else { return };
        tokio::time::sleep(*pause).await;
    }
}

/// Armed while an acquire request is in flight: if the acquiring future is
/// dropped (or the attempt failed with an error after the store may have
/// written), the token's hold is deleted in the background.
pub(crate) struct PendingAcquire {
    inner: Arc<Inner>,
    key: LockKey,
    token: Token,
    armed: bool,
}

impl PendingAcquire {
    pub(crate) fn new(inner: Arc<Inner>, key: &LockKey, token: &Token) -> Self {
        Self {
            inner,
            key: key.clone(),
            token: token.clone(),
            armed: true,
        }
    }

    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for PendingAcquire {
    fn drop(&mut self) {
        if self.armed {
            spawn_release(
                self.inner.backend.clone(),
                self.key.clone(),
                self.token.clone(),
                self.inner.cfg.release_timeout,
                true,
            );
        }
    }
}
