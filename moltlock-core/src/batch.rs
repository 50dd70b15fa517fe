//! Taking several keys without a store batch: one `cas` per key.

use std::time::Duration;

use crate::records::{CasOutcome, MultiMode, MultiOutcome};
use crate::{Backend, Error, LockKey, Token};

/// Takes `keys` one `cas` at a time: what
/// [`BackendExt::cas_multi`](crate::BackendExt::cas_multi) does where the
/// backend has no [`CasMulti`](crate::CasMulti). With [`MultiMode::All`]
/// it stops at the first held key and deletes (owner-checked) what it
/// took, so nothing stays held; others may see a part of the set held
/// meanwhile, which is why the manager takes keys in one sorted order.
/// With [`MultiMode::Any`] it stops at the first key it gets.
///
/// # Cancel safety
/// A dropped call may leave some keys held by `token`; the manager's
/// cleanup deletes each key by `token`.
///
/// # Errors
/// The first store error; keys taken before it stay held by `token`, for
/// the caller's cleanup.
pub async fn cas_each<B: Backend + ?Sized>(
    backend: &B,
    keys: &[LockKey],
    token: &Token,
    ttl: Duration,
    mode: MultiMode,
) -> Result<MultiOutcome, Error> {
    let mut taken = Vec::new();
    let mut busy = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        match backend.cas(key, None, token, ttl).await? {
            CasOutcome::Acquired { fence } if mode == MultiMode::Any => {
                return Ok(MultiOutcome::Acquired(vec![(i, fence)]));
            }
            CasOutcome::Acquired { fence } => taken.push((i, fence)),
            CasOutcome::Held(held) if mode == MultiMode::Any => busy.push((i, held)),
            CasOutcome::Held(held) => {
                give_back(backend, keys, token, &taken).await?;
                return Ok(MultiOutcome::Held(vec![(i, held)]));
            }
        }
    }
    Ok(match mode {
        MultiMode::All => MultiOutcome::Acquired(taken),
        MultiMode::Any => MultiOutcome::Held(busy),
    })
}

/// Deletes, in reverse order, the keys an `All` attempt took.
async fn give_back<B: Backend + ?Sized>(
    backend: &B,
    keys: &[LockKey],
    token: &Token,
    taken: &[(usize, crate::Fence)],
) -> Result<(), Error> {
    for (i, _) in taken.iter().rev() {
        if let Some(key) = keys.get(*i) {
            backend.delete(key, token).await?;
        }
    }
    Ok(())
}
