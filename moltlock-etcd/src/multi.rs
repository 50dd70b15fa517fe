//! Taking several keys in one Txn: every key (`All`), or the first free one
//! (`Any`, a chain of nested Txns). Each key taken is written exactly as
//! `create` writes one: on the session lease, with the key's fence offset
//! read and its stale description deleted in the same Txn, its fence the
//! put's revision plus that offset, its write recorded for renewal rounds.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse};
use moltlock_core::{Error, Fence, Held, LockKey, MultiMode, MultiOutcome, Token};

use crate::core::Core;
use crate::error::{is_lease_not_found, map, NAME};
use crate::txn::{fence, header_revision, offset_in};

/// The operations taking one key costs: its put, the read of its fence
/// offset and the delete of a stale description.
const OPS_PER_KEY: usize = 3;

/// The longest `Any` chain: its answer nests two messages per key, and the
/// client decodes answers at most 100 messages deep (a chain of 50 keys
/// already fails to decode, after etcd applied it).
const MAX_CHAIN: usize = 42;

impl Core {
    /// The most keys one call names. `All` has 3 operations per key in its
    /// success list (and one per key in the others); each level of `Any`'s
    /// chain has 3 operations in its longest list, which the levels below
    /// it lose of their budget. So both fit `max_txn_ops / 3` keys (42 of
    /// etcd's default 128); one limit serves both modes, so it is never
    /// above [`MAX_CHAIN`] either.
    pub(crate) fn max_keys(&self) -> usize {
        (self.max_txn_ops / OPS_PER_KEY).min(MAX_CHAIN)
    }

    /// Takes `keys` for `token` in one Txn (see the module docs), with one
    /// more try on a fresh lease if the session's lease vanished. `None`
    /// when etcd refused the Txn as too large (a server whose
    /// `--max-txn-ops` is below the configured one): nothing was written.
    pub(crate) async fn cas_multi(
        &self,
        keys: &[LockKey],
        token: &Token,
        ttl: Duration,
        mode: MultiMode,
    ) -> Result<Option<MultiOutcome>, Error> {
        if keys.is_empty() {
            return Ok(Some(MultiOutcome::of_no_keys(mode)));
        }
        self.flush_pending().await;
        // Any of them may be written; until etcd answers, none is known.
        for key in keys {
            self.written.forget(&self.keys.lock(key));
        }
        let Some((resp, lease)) = self.send(keys, token, ttl, mode).await? else {
            return Ok(None);
        };
        let outcome = match mode {
            MultiMode::All => read_all(&resp, keys.len())?,
            MultiMode::Any => read_any(resp, keys.len())?,
        };
        self.settle(keys, token, ttl, lease, outcome)
            .await
            .map(Some)
    }

    /// Sends the Txn of `mode` on the session lease for `ttl` (one more
    /// try on a fresh lease if that lease vanished); the answer and the
    /// lease the keys went on, or `None` when etcd refused it as too large.
    async fn send(
        &self,
        keys: &[LockKey],
        token: &Token,
        ttl: Duration,
        mode: MultiMode,
    ) -> Result<Option<(TxnResponse, i64)>, Error> {
        let mut retried = false;
        loop {
            let lease = self.session.lease_for(ttl).await?;
            let txn = match mode {
                MultiMode::All => self.all_txn(keys, token, lease.id),
                MultiMode::Any => self.any_txn(keys, token, lease.id),
            };
            match self.io.txn(txn).await {
                Ok(resp) => return Ok(Some((resp, lease.id))),
                Err(e) if is_lease_not_found(&e) && !retried => {
                    self.session.forget(lease.id);
                    retried = true;
                }
                Err(e) if is_too_large(&e) => {
                    tracing::warn!(keys = keys.len(), error = %e,
                        "etcd refused a multi-key Txn as too large; taking the keys one at a time \
                         (EtcdConfig::max_txn_ops should be the server's --max-txn-ops)");
                    return Ok(None);
                }
                Err(e) => return Err(map(e)),
            }
        }
    }

    /// What taking `key` writes: the put on `lease`, the read of its fence
    /// offset, the delete of a stale description (in this order, as
    /// `create`'s).
    fn take_ops(&self, key: &LockKey, token: &Token, lease: i64) -> [TxnOp; OPS_PER_KEY] {
        let put = PutOptions::new().with_lease(lease);
        [
            TxnOp::put(self.keys.lock(key), token.as_str(), Some(put)),
            TxnOp::get(self.keys.offset(key), None),
            TxnOp::delete(self.keys.info(key), None),
        ]
    }

    /// `key` is free: it does not exist (an expired hold's lease deleted it).
    fn free(&self, key: &LockKey) -> Compare {
        Compare::create_revision(self.keys.lock(key), CompareOp::Equal, 0)
    }

    /// `Txn(if every key is free then take each else get each)`.
    fn all_txn(&self, keys: &[LockKey], token: &Token, lease: i64) -> Txn {
        let free: Vec<Compare> = keys.iter().map(|k| self.free(k)).collect();
        let take: Vec<TxnOp> = keys
            .iter()
            .flat_map(|k| self.take_ops(k, token, lease))
            .collect();
        let look: Vec<TxnOp> = keys
            .iter()
            .map(|k| TxnOp::get(self.keys.lock(k), None))
            .collect();
        Txn::new().when(free).and_then(take).or_else(look)
    }

    /// `Txn(if key0 is free then take key0 else [get key0, Txn(if key1 is
    /// free then take key1 else [get key1, …])])`: etcd runs one branch per
    /// level, so the first free key is taken and every key before it read.
    fn any_txn(&self, keys: &[LockKey], token: &Token, lease: i64) -> Txn {
        let mut chain: Option<Txn> = None;
        for key in keys.iter().rev() {
            let mut look = vec![TxnOp::get(self.keys.lock(key), None)];
            if let Some(rest) = chain.take() {
                look.push(TxnOp::txn(rest));
            }
            let level = Txn::new()
                .when([self.free(key)])
                .and_then(self.take_ops(key, token, lease))
                .or_else(look);
            chain = Some(level);
        }
        chain.unwrap_or_default()
    }

    /// Records the keys taken. Should the session's lease for `ttl` have
    /// been replaced meanwhile (a slow request), `earliest_expiry` no longer
    /// bounds them: they are given back, as `create` does, and the caller
    /// retries.
    async fn settle(
        &self,
        keys: &[LockKey],
        token: &Token,
        ttl: Duration,
        lease: i64,
        outcome: MultiOutcome,
    ) -> Result<MultiOutcome, Error> {
        let MultiOutcome::Acquired(taken) = outcome else {
            return Ok(outcome);
        };
        let taken_keys: Vec<&LockKey> = taken.iter().filter_map(|(i, _)| keys.get(*i)).collect();
        for key in &taken_keys {
            self.written.record(self.keys.lock(key), token);
        }
        if self.session.current(ttl).map(|l| l.id) == Some(lease) {
            return Ok(MultiOutcome::Acquired(taken));
        }
        for key in taken_keys {
            self.release(key, token).await?;
        }
        Err(Error::store(
            NAME,
            "the session lease was replaced while the keys were being taken",
            true,
        ))
    }
}

/// The answer of [`Core::all_txn`]: a fence per key, or what the busy keys
/// hold.
fn read_all(resp: &TxnResponse, n: usize) -> Result<MultiOutcome, Error> {
    let revision = header_revision(resp)?;
    if resp.succeeded() {
        let taken = (0..n)
            .map(|i| {
                Ok((
                    i,
                    key_fence(revision, offset_in(resp, i * OPS_PER_KEY + 1))?,
                ))
            })
            .collect::<Result<Vec<_>, Error>>()?;
        return Ok(MultiOutcome::Acquired(taken));
    }
    let answers = resp.op_responses();
    if answers.len() != n {
        return Err(short());
    }
    let busy: Vec<(usize, Held)> = answers
        .iter()
        .enumerate()
        .filter_map(|(i, answer)| held_in(answer, revision).map(|h| (i, h)))
        .collect();
    if busy.is_empty() {
        return Err(Error::store(
            NAME,
            "a Txn whose keys were not all free read none of them held",
            true,
        ));
    }
    Ok(MultiOutcome::Held(busy))
}

/// The answer of [`Core::any_txn`], followed down the chain to the level
/// that took its key (or to the end, every key busy).
fn read_any(resp: TxnResponse, n: usize) -> Result<MultiOutcome, Error> {
    let revision = header_revision(&resp)?;
    let mut busy = Vec::with_capacity(n);
    let mut level = Some(resp);
    while let Some(here) = level.take() {
        let i = busy.len();
        if here.succeeded() {
            let fence = key_fence(revision, offset_in(&here, 1))?;
            return Ok(MultiOutcome::Acquired(vec![(i, fence)]));
        }
        let mut answers = here.op_responses().into_iter();
        let seen = answers.next().and_then(|a| held_in(&a, revision));
        busy.push((i, seen.unwrap_or_else(|| seen_at(revision))));
        if let Some(TxnOpResponse::Txn(next)) = answers.next() {
            level = Some(next);
        }
    }
    if busy.len() != n {
        return Err(short());
    }
    Ok(MultiOutcome::Held(busy))
}

/// Whether etcd refused a Txn for its size (checked before it is applied,
/// so nothing of it was written).
fn is_too_large(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s)
        if s.message().contains("too many operations") || s.message().contains("too large"))
}

/// The fence of a key put at `revision` with fence offset `offset`, as
/// `create` computes it.
fn key_fence(revision: i64, offset: i64) -> Result<Fence, Error> {
    fence(revision.saturating_add(offset))
}

/// What a Get of a lock key saw, if the key exists.
fn held_in(answer: &TxnOpResponse, revision: i64) -> Option<Held> {
    let TxnOpResponse::Get(get) = answer else {
        return None;
    };
    let kv = get.kvs().first()?;
    Some(Held {
        holder: Some(Token::from_stored(String::from_utf8_lossy(kv.value()))),
        ..seen_at(revision)
    })
}

/// A Txn answer with fewer answers than keys.
fn short() -> Error {
    Error::store(NAME, "a multi-key Txn answered short", true)
}

/// A busy key seen at `revision`, its holder not (yet) known.
fn seen_at(revision: i64) -> Held {
    Held {
        holder: None,
        expires_in: None,
        revision: u64::try_from(revision).ok(),
    }
}
