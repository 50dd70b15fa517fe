//! Connections kept checked out of the backend's own pool between
//! statements. sqlx's pool pings every connection handed back to it (a
//! round trip, in a task of its own) before lending it again: through the
//! pool, each lock statement would cost its connection two round trips.
//! A statement that succeeded leaves its connection here for the next
//! one; a statement that failed or was dropped mid-way lets its
//! connection go back to the pool, which pings it and closes it if broken.
//!
//! At most `max_connections - 2` are kept (none from a pool of two or
//! fewer), so the pool keeps connections for its other users: the
//! `LISTEN` connection, migrations, sweeps and reads. A statement that
//! finds as many kept connections in use waits in line for one to be
//! freed; after 50 ms it also asks the pool, takes whichever comes first,
//! and gives a connection of the pool back after: the backend runs as
//! many statements at once as the pool allows (none waits long behind
//! kept connections blocked on rows), and waits at most the pool's acquire
//! timeout. A kept connection unused for 10 s goes back to the pool when
//! the next statement ends; a backend that runs no statement at all keeps
//! its kept connections open (the pool's idle timeout and lifetime do not
//! reach them). A backend on an application's pool (`from_client`) keeps
//! none: the pool stays the application's.

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{Connection, Database, Pool};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::convert::PING_AFTER_IDLE;

/// How long a kept connection may sit unused before it goes back to the
/// pool.
const RETURN_AFTER_IDLE: Duration = Duration::from_secs(10);

/// How long a statement that finds every kept connection in use waits
/// for one to be freed before it also asks the pool. Under load a kept
/// connection is freed within a few statements' time, and a connection of
/// the pool costs a ping on its way back; a longer wait means the kept
/// ones are blocked (on rows another transaction locked, say), and the
/// statement should not wait behind them.
const OVERFLOW_AFTER: Duration = Duration::from_millis(50);

/// A pool and the connections kept out of it; clones share them.
pub(crate) struct Kept<DB: Database> {
    inner: Arc<Inner<DB>>,
}

impl<DB: Database> Clone for Kept<DB> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<DB: Database> {
    pool: Pool<DB>,
    /// One permit per connection that may be kept (held while one is in
    /// use); `None`: keep none.
    permits: Option<Arc<Semaphore>>,
    /// Kept connections not in use, with the time each was left.
    idle: Mutex<Vec<(PoolConnection<DB>, Instant)>>,
}

impl<DB: Database> Kept<DB> {
    /// Keeps up to `max_connections - 2` of `pool`'s connections when
    /// `keep`, none otherwise.
    pub(crate) fn new(pool: Pool<DB>, keep: bool) -> Self {
        let most = pool.options().get_max_connections().saturating_sub(2);
        let keep = keep && most > 0;
        let inner = Inner {
            pool,
            permits: keep.then(|| Arc::new(Semaphore::new(most as usize))),
            idle: Mutex::new(Vec::new()),
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    /// A connection for one statement: a kept one if free (pinged first
    /// when it sat idle for a second or more); else, while fewer than the
    /// most are kept, one from the pool to keep; else the first kept one
    /// freed, or, once the wait has lasted [`OVERFLOW_AFTER`], one of the
    /// pool if that comes first (it goes back after the statement). So the
    /// backend runs as many statements at once as the pool allows, and
    /// waits at most the pool's acquire timeout, pings included.
    pub(crate) async fn conn(&self) -> Result<Conn<DB>, sqlx::Error> {
        if let Some(ready) = self.ready() {
            return Ok(ready);
        }
        let limit = self.inner.pool.options().get_acquire_timeout();
        tokio::time::timeout(limit, self.lend())
            .await
            .map_err(|_| sqlx::Error::PoolTimedOut)?
    }

    /// A kept connection free and used within the last second, with its
    /// permit: no wait, no ping, so no timer either.
    fn ready(&self) -> Option<Conn<DB>> {
        let permits = self.inner.permits.as_ref()?;
        let permit = permits.clone().try_acquire_owned().ok()?;
        let mut idle = self.inner.idle.lock().ok()?;
        let (_, since) = idle.last()?;
        if since.elapsed() >= PING_AFTER_IDLE {
            return None;
        }
        let (conn, _) = idle.pop()?;
        drop(idle);
        Some(self.wrap(conn, Some(permit)))
    }

    async fn lend(&self) -> Result<Conn<DB>, sqlx::Error> {
        let pool = &self.inner.pool;
        let Some(permits) = &self.inner.permits else {
            return Ok(self.wrap(pool.acquire().await?, None));
        };
        let permit = match permits.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                // In line for a kept one from the start; the pool is asked
                // too once the wait has lasted `OVERFLOW_AFTER`.
                let overflow = async {
                    tokio::time::sleep(OVERFLOW_AFTER).await;
                    pool.acquire().await
                };
                tokio::select! {
                    permit = permits.clone().acquire_owned() => {
                        permit.map_err(|_| sqlx::Error::PoolClosed)?
                    }
                    conn = overflow => return Ok(self.wrap(conn?, None)),
                }
            }
        };
        let conn = match self.take_idle().await {
            Some(conn) => conn,
            None => pool.acquire().await?,
        };
        Ok(self.wrap(conn, Some(permit)))
    }

    fn wrap(&self, conn: PoolConnection<DB>, permit: Option<OwnedSemaphorePermit>) -> Conn<DB> {
        Conn {
            kept: self.clone(),
            conn,
            permit,
        }
    }

    /// The most recently left kept connection that still answers.
    async fn take_idle(&self) -> Option<PoolConnection<DB>> {
        loop {
            let (mut conn, since) = self.inner.idle.lock().ok()?.pop()?;
            if since.elapsed() < PING_AFTER_IDLE || conn.ping().await.is_ok() {
                return Some(conn);
            }
        }
    }

    /// Sends every idle kept connection back to the pool.
    fn give_back_idle(&self) {
        let idle = match self.inner.idle.lock() {
            Ok(mut idle) => std::mem::take(&mut *idle),
            Err(_) => return,
        };
        drop(idle);
    }

    /// Keeps `conn`; connections left unused for [`RETURN_AFTER_IDLE`] go
    /// back to the pool (after a burst, the pool's idle timeout and
    /// lifetime apply to them again).
    fn leave(&self, conn: PoolConnection<DB>) {
        let stale: Vec<_> = match self.inner.idle.lock() {
            Ok(mut idle) => {
                idle.push((conn, Instant::now()));
                // Oldest first: `take_idle` pops the newest.
                let n = idle
                    .iter()
                    .take_while(|(_, since)| since.elapsed() >= RETURN_AFTER_IDLE)
                    .count();
                idle.drain(..n).collect()
            }
            Err(_) => return,
        };
        drop(stale);
    }
}

/// A backend dropped outside a Tokio runtime (a blocking caller's, after
/// its runtime ended) cannot hand its kept connections back to the pool,
/// which needs a task for that: they are detached from the pool and
/// closed where they are.
impl<DB: Database> Drop for Inner<DB> {
    fn drop(&mut self) {
        if tokio::runtime::Handle::try_current().is_ok() {
            return;
        }
        let idle = match self.idle.get_mut() {
            Ok(idle) => std::mem::take(idle),
            Err(poisoned) => std::mem::take(poisoned.into_inner()),
        };
        for (conn, _) in idle {
            drop(conn.detach());
        }
    }
}

/// A connection lent for one statement. Hand the statement's result to
/// [`finish`](Self::finish): a connection whose statement succeeded is
/// kept for the next; one dropped or failed goes back to the pool.
pub(crate) struct Conn<DB: Database> {
    kept: Kept<DB>,
    conn: PoolConnection<DB>,
    permit: Option<OwnedSemaphorePermit>,
}

impl<DB: Database> Conn<DB> {
    /// Keeps the connection when `result` is a success; passes it through.
    /// A failure also sends every idle kept connection back to the pool,
    /// which pings each and closes the dead: after a server restart, one
    /// statement fails rather than one per kept connection.
    pub(crate) fn finish<T, E>(self, result: Result<T, E>) -> Result<T, E> {
        match (&result, &self.permit) {
            (Ok(_), Some(_)) => self.kept.leave(self.conn),
            (Ok(_), None) => {}
            (Err(_), _) => self.kept.give_back_idle(),
        }
        result
    }
}

impl<DB: Database> Deref for Conn<DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        &self.conn
    }
}

impl<DB: Database> DerefMut for Conn<DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        &mut self.conn
    }
}
