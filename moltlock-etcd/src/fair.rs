//! The fair queue: revision-ordered entries under the lock's queue prefix,
//! each waiter watching only its immediate predecessor.
//!
//! A free key with an empty queue is taken at once, with no place: one Txn
//! takes the lock key only if no entry is under the queue prefix.
//! Otherwise a waiter puts `<prefix><key>\0queue/<token>` on its session
//! lease, and the same Txn reads the newest two entries: its own and the
//! one just before it, which it watches. The entry with the lowest create
//! revision is the head: it takes
//! the lock key with the same Txn as [`Backend::cas`](moltlock_core::Backend::cas),
//! whose compares also check that its entry is intact and none is ahead
//! of it (watching the lock key while someone else holds it). Every other
//! waiter watches only the entry just before its own. The holder keeps its
//! entry until it releases: the release deletes the lock key and the entry
//! in one Txn, which wakes exactly one waiter — the next in line — and it
//! tries the key at once, in one Txn. Fair and non-fair holders stay
//! mutually exclusive because everyone acquires the same lock key; a
//! non-fair `lock()` may still overtake the queue.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
    TxnResponse,
};
use moltlock_core::{CasOutcome, Error, Fence, LockKey, Token};

use crate::core::Core;
use crate::error::{is_lease_not_found, map};
use crate::txn::header_revision;
use crate::watch::{next_event, Wake};

/// Pause after a retryable failure while waiting in the queue.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// What one look at the queue led to.
enum Step {
    /// The key is ours.
    Taken(Fence),
    /// An event that concerns us came: try again at once.
    Woken,
    /// Nothing came within the period (or our place needs a look).
    Look,
}

/// Waits in the queue for `key`, then holds it as `token`. A free key with
/// an empty queue is taken at once, in one Txn and with no place.
pub(crate) async fn acquire(
    core: &Arc<Core>,
    key: &LockKey,
    token: &Token,
    ttl: Duration,
) -> Result<Fence, Error> {
    let empty = Compare::create_revision(core.keys.queue(key), CompareOp::Equal, 0).with_prefix();
    match core.create_if(key, token, ttl, &[empty]).await {
        Ok(CasOutcome::Acquired { fence }) => return Ok(fence),
        Ok(CasOutcome::Held(_)) => {}
        Err(e) if e.is_retryable() => {
            tracing::debug!(%key, error = %e, "fair take of a free key failed; queueing");
        }
        Err(e) => return Err(e),
    }
    let mut guard = EntryGuard {
        core: core.clone(),
        entry: Some(core.keys.queue_entry(key, token)),
    };
    let (mut my_rev, mut ahead) = retrying(key, || enqueue(core, key, token, ttl)).await?;
    let mut woken = false;
    loop {
        let place = Place {
            rev: my_rev,
            woken,
            ahead: ahead.take(),
        };
        match step(core, key, token, ttl, place).await {
            Ok(Step::Taken(fence)) => {
                guard.entry = None;
                return Ok(fence);
            }
            Ok(Step::Woken) => woken = true,
            Ok(Step::Look) => woken = false,
            Err(e) if e.is_retryable() => {
                tracing::debug!(%key, error = %e, "fair queue wait failed; retrying");
                tokio::time::sleep(RETRY_PAUSE).await;
                woken = false;
            }
            Err(e) => return Err(e),
        }
        if !woken {
            my_rev = retrying(key, || keep_place(core, key, token, ttl, my_rev)).await?;
        }
    }
}

/// Runs `request` until it succeeds or fails for good, pausing
/// [`RETRY_PAUSE`] after each retryable failure: a waiter keeps waiting
/// while the store is down or restarting (a caller that wants a bound
/// sets a timeout, which drops the wait).
async fn retrying<T, F, Fut>(key: &LockKey, mut request: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    loop {
        match request().await {
            Err(e) if e.is_retryable() => {
                tracing::debug!(%key, error = %e, "fair queue request failed; retrying");
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            done => return done,
        }
    }
}

/// The entry just before ours and the header revision of the read that
/// found it (`None`: no entry is ahead of ours).
type Ahead = Option<(Vec<u8>, i64)>;

/// Where a waiter stands before one look.
struct Place {
    /// The create revision of its entry.
    rev: i64,
    /// Whether an event that concerns it just came.
    woken: bool,
    /// The entry ahead, when the Txn that queued it has just read it.
    ahead: Option<Ahead>,
}

/// One look at the queue: take the key if we are the head and it is free,
/// otherwise wait for the one event that concerns us (or a refresh period).
/// Just `woken` by such an event, we try the key at once: the Txn itself
/// checks that our place is intact and none is ahead of it, so a hand-off
/// costs the one Txn.
async fn step(
    core: &Core,
    key: &LockKey,
    token: &Token,
    ttl: Duration,
    place: Place,
) -> Result<Step, Error> {
    let (my_rev, woken) = (place.rev, place.woken);
    let period = core.session.secs_for(ttl);
    let period = Duration::from_secs(period) / 3;
    if !woken {
        let ahead = match place.ahead {
            Some(known) => known,
            None => predecessor(core, key, my_rev).await?,
        };
        if let Some((pred, seen)) = ahead {
            return wait(core, &pred, seen + 1, period).await;
        }
    }
    let held = match take_as_head(core, key, token, ttl, my_rev).await? {
        CasOutcome::Acquired { fence } => return Ok(Step::Taken(fence)),
        CasOutcome::Held(h) => h,
    };
    match &held.holder {
        // An earlier Txn of ours landed though its caller saw it fail (a
        // timeout): its fence is unknown, so give it back and try again.
        Some(holder) if holder == token => {
            core.give_back(key, token).await?;
            Ok(Step::Woken)
        }
        // Held, and we were the head when we looked: wait for its end.
        Some(_) if !woken => {
            let seen = held
                .revision
                .and_then(|r| i64::try_from(r).ok())
                .unwrap_or(0);
            wait(core, &core.keys.lock(key), seen + 1, period).await
        }
        // Woken and not taken (held again, a place still ahead, or ours
        // gone): look at the queue before waiting again.
        _ => Ok(Step::Look),
    }
}

/// Takes the key if it is free, our place (created at `my_rev`) is still
/// there, and no place is ahead of it.
async fn take_as_head(
    core: &Core,
    key: &LockKey,
    token: &Token,
    ttl: Duration,
    my_rev: i64,
) -> Result<CasOutcome, Error> {
    let mine = core.keys.queue_entry(key, token);
    let queue = core.keys.queue(key);
    let order = [
        Compare::create_revision(mine, CompareOp::Equal, my_rev),
        Compare::create_revision(queue, CompareOp::Greater, my_rev - 1).with_prefix(),
    ];
    core.create_if(key, token, ttl, &order).await
}

/// Watches `key` from `from` for at most `period`.
async fn wait(core: &Core, key: &[u8], from: i64, period: Duration) -> Result<Step, Error> {
    let watch = next_event(&core.watches, key, from);
    match tokio::time::timeout(period, watch).await {
        Ok(Ok(Wake::Event)) => {
            core.wakeups
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(Step::Woken)
        }
        Ok(Ok(Wake::Compacted)) | Err(_) => Ok(Step::Look),
        Ok(Err(e)) => Err(e),
    }
}

/// Puts our queue entry on the session lease; returns its create revision
/// and, read by the same Txn, the entry just before it (`None` when the
/// answer does not show it plainly: the caller reads it then).
async fn enqueue(
    core: &Core,
    key: &LockKey,
    token: &Token,
    ttl: Duration,
) -> Result<(i64, Option<Ahead>), Error> {
    let entry = core.keys.queue_entry(key, token);
    // The newest two entries, after our put: ours, and the one before it.
    let newest = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(2)
        .with_keys_only();
    let mut retried = false;
    loop {
        let lease = core.session.lease_for(ttl).await?;
        let put = TxnOp::put(
            entry.clone(),
            token.as_str(),
            Some(PutOptions::new().with_lease(lease.id)),
        );
        let read = TxnOp::get(core.keys.queue(key), Some(newest.clone()));
        match core.io.txn(Txn::new().and_then([put, read])).await {
            Err(e) if is_lease_not_found(&e) && !retried => {
                core.session.forget(lease.id);
                retried = true;
            }
            Err(e) => return Err(map(e)),
            Ok(resp) => return placed(&resp, &entry),
        }
    }
}

/// Our entry's create revision and the entry ahead of it, from the answer
/// of [`enqueue`]'s Txn. The entry ahead is known only when the newest
/// entry is ours, created by this very Txn.
fn placed(resp: &TxnResponse, entry: &[u8]) -> Result<(i64, Option<Ahead>), Error> {
    let rev = header_revision(resp)?;
    let newest = resp.op_responses().into_iter().find_map(|op| match op {
        TxnOpResponse::Get(g) => Some(g),
        _ => None,
    });
    let Some(newest) = newest else {
        return Ok((rev, None));
    };
    let kvs = newest.kvs();
    let ours = kvs
        .first()
        .is_some_and(|kv| kv.key() == entry && kv.create_revision() == rev);
    let ahead = kvs.get(1).map(|kv| (kv.key().to_vec(), rev));
    Ok((rev, ours.then_some(ahead)))
}

/// The entry just before ours (highest create revision below `my_rev`) and
/// the header revision of the read that found it.
async fn predecessor(
    core: &Core,
    key: &LockKey,
    my_rev: i64,
) -> Result<Option<(Vec<u8>, i64)>, Error> {
    let opts = GetOptions::new()
        .with_prefix()
        .with_max_create_revision(my_rev - 1)
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(1)
        .with_keys_only();
    let resp = core.io.get(core.keys.queue(key), Some(opts)).await?;
    let seen = resp.header().map_or(0, |h| h.revision());
    Ok(resp.kvs().first().map(|kv| (kv.key().to_vec(), seen)))
}

/// Keeps the session lease fresh while we wait, and puts our entry back
/// (at the end of the queue) if it vanished with a lost lease.
async fn keep_place(
    core: &Core,
    key: &LockKey,
    token: &Token,
    ttl: Duration,
    my_rev: i64,
) -> Result<i64, Error> {
    core.session.lease_for(ttl).await?;
    let resp = core.io.get(core.keys.queue_entry(key, token), None).await?;
    if resp
        .kvs()
        .first()
        .is_some_and(|kv| kv.create_revision() == my_rev)
    {
        return Ok(my_rev);
    }
    tracing::warn!(%key, "the fair-queue entry vanished with its lease; queueing again");
    Ok(enqueue(core, key, token, ttl).await?.0)
}

/// Removes the queue entry of a fair acquire that was dropped or failed.
struct EntryGuard {
    core: Arc<Core>,
    entry: Option<Vec<u8>>,
}

impl Drop for EntryGuard {
    fn drop(&mut self) {
        let Some(entry) = self.entry.take() else {
            return;
        };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let core = self.core.clone();
        handle.spawn(async move {
            let del = Txn::new().and_then([TxnOp::delete(entry, None)]);
            if let Err(e) = core.io.txn(del).await {
                tracing::debug!(error = %e, "could not remove a fair-queue entry; it lives until its lease ends");
            }
        });
    }
}
