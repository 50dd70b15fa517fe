//! Hold operations: acquire, renew one hold, hand over, release (with the
//! retries of unconfirmed releases), describe a hold and raise a key's
//! fence minimum. Each is one Txn, or one read and one Txn.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use moltlock_core::{CasOutcome, Error, Fence, Held, LockKey, Token};

use crate::core::Core;
use crate::error::{is_lease_not_found, map, NAME};
use crate::txn::{fence, first_kv, header_revision, held, offset_in};

/// How many times a fence raise re-reads after losing a race to another.
const RAISE_TRIES: u32 = 16;

impl Core {
    /// `Txn(if create_revision(key) == 0 then put(key, token, lease) else get(key))`,
    /// with one more try on a fresh lease if the session's lease vanished.
    /// The fence is the put's revision plus the key's fence offset.
    pub(crate) async fn create(
        &self,
        key: &LockKey,
        token: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error> {
        self.create_if(key, token, ttl, &[]).await
    }

    /// As [`create`](Self::create), taking the key only when `also` holds
    /// too (the fair queue's order); held without a holder when the key
    /// was free but `also` failed.
    pub(crate) async fn create_if(
        &self,
        key: &LockKey,
        token: &Token,
        ttl: Duration,
        also: &[Compare],
    ) -> Result<CasOutcome, Error> {
        self.flush_pending().await;
        let k = self.keys.lock(key);
        self.written.forget(&k);
        let mut retried = false;
        loop {
            let lease = self.session.lease_for(ttl).await?;
            let put = PutOptions::new().with_lease(lease.id);
            let mut when = vec![Compare::create_revision(k.clone(), CompareOp::Equal, 0)];
            when.extend_from_slice(also);
            let txn = Txn::new()
                .when(when)
                .and_then([
                    TxnOp::put(k.clone(), token.as_str(), Some(put)),
                    TxnOp::get(self.keys.offset(key), None),
                    TxnOp::delete(self.keys.info(key), None),
                ])
                .or_else([TxnOp::get(k.clone(), None)]);
            match self.io.txn(txn).await {
                Err(e) if is_lease_not_found(&e) && !retried => {
                    self.session.forget(lease.id);
                    retried = true;
                }
                Err(e) => return Err(map(e)),
                Ok(resp) if resp.succeeded() => {
                    self.written.record(k, token);
                    // `earliest_expiry` reports the session's current lease;
                    // if the one this key went on was replaced meanwhile (a
                    // slow request), that bound is not the key's. Give the
                    // hold back and let the caller retry.
                    if self.session.current(ttl).map(|l| l.id) != Some(lease.id) {
                        self.give_back(key, token).await?;
                        return Err(Error::store(
                            NAME,
                            "the session lease was replaced while the key was being taken",
                            true,
                        ));
                    }
                    let offset = offset_in(&resp, 1);
                    return Ok(CasOutcome::Acquired {
                        fence: fence(header_revision(&resp)?.saturating_add(offset))?,
                    });
                }
                Ok(resp) => return Ok(CasOutcome::Held(held(&resp))),
            }
        }
    }

    /// Renewal of one hold: compare the value, then keep its lease alive.
    pub(crate) async fn renew_one(
        &self,
        key: &LockKey,
        token: &Token,
    ) -> Result<CasOutcome, Error> {
        let k = self.keys.lock(key);
        let txn = Txn::new()
            .when([Compare::value(k.clone(), CompareOp::Equal, token.as_str())])
            .and_then([TxnOp::get(k.clone(), None)])
            .or_else([TxnOp::get(k, None)]);
        let resp = self.io.txn(txn).await.map_err(map)?;
        if !resp.succeeded() {
            return Ok(CasOutcome::Held(held(&resp)));
        }
        let Some(kv) = first_kv(&resp) else {
            return Ok(CasOutcome::Held(held(&resp)));
        };
        if kv.lease() != 0 && self.session.keep_alive(kv.lease()).await?.is_none() {
            return Ok(CasOutcome::Held(Held::default()));
        }
        Ok(CasOutcome::Acquired {
            fence: fence(kv.mod_revision())?,
        })
    }

    /// Hands a hold from `old` to `new`: compare value == old, then put new.
    /// The new holder's fence is the revision of that put (the key's mod
    /// revision), above the old holder's: the key's create revision stays
    /// the old holder's, so it cannot be the fence of a hand-over.
    pub(crate) async fn replace(
        &self,
        key: &LockKey,
        old: &Token,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error> {
        let k = self.keys.lock(key);
        self.written.forget(&k);
        // A lease of its own: a session lease would live as long as other
        // holds of the same TTL keep it alive.
        let lease = self.session.lease_of_its_own(ttl).await?;
        let put = PutOptions::new().with_lease(lease);
        let txn = Txn::new()
            .when([Compare::value(k.clone(), CompareOp::Equal, old.as_str())])
            .and_then([
                TxnOp::put(k.clone(), new.as_str(), Some(put)),
                TxnOp::get(k.clone(), None),
                TxnOp::get(self.keys.offset(key), None),
                TxnOp::delete(self.keys.info(key), None),
            ])
            .or_else([TxnOp::get(k.clone(), None)]);
        // A failed request may still have landed: its lease stays, to its TTL.
        let resp = self.io.txn(txn).await.map_err(map)?;
        if !resp.succeeded() {
            self.session.revoke_unused(lease);
        }
        match first_kv(&resp) {
            Some(kv) if resp.succeeded() => {
                self.written.record(k, new);
                Ok(CasOutcome::Acquired {
                    fence: fence(kv.mod_revision().saturating_add(offset_in(&resp, 2)))?,
                })
            }
            _ => Ok(CasOutcome::Held(held(&resp))),
        }
    }

    /// Owner-checked release: the key goes only if `owner` holds it; the
    /// owner's fair-queue entry (if any) goes either way. A release that
    /// fails, or whose future is dropped before etcd answers, stays in the
    /// pending ledger and is retried by the session's next use.
    pub(crate) async fn release(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        let claim = self.pending.begin(key, owner);
        let deleted = self.release_once(key, owner).await?;
        claim.settle();
        Ok(deleted)
    }

    /// Deletes `owner`'s hold of `key` (and its description), keeping its
    /// fair-queue place, if it has one.
    pub(crate) async fn give_back(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        self.delete_owned(key, owner, false).await
    }

    async fn release_once(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        self.delete_owned(key, owner, true).await
    }

    /// Deletes `owner`'s hold of `key` and its description, and with
    /// `place` its fair-queue place too (held or not).
    async fn delete_owned(&self, key: &LockKey, owner: &Token, place: bool) -> Result<bool, Error> {
        let k = self.keys.lock(key);
        self.written.forget(&k);
        let mut held = vec![
            TxnOp::delete(k.clone(), None),
            TxnOp::delete(self.keys.info(key), None),
        ];
        let mut not_held = Vec::new();
        if place {
            let entry = self.keys.queue_entry(key, owner);
            held.push(TxnOp::delete(entry.clone(), None));
            not_held.push(TxnOp::delete(entry, None));
        }
        let txn = Txn::new()
            .when([Compare::value(k, CompareOp::Equal, owner.as_str())])
            .and_then(held)
            .or_else(not_held);
        Ok(self.io.txn(txn).await.map_err(map)?.succeeded())
    }

    /// Retries the unconfirmed deletes that nobody is sending now; stops at
    /// the first failure (the store is likely unreachable, and the caller's
    /// own request will say so). The deletes not sent stay pending.
    pub(crate) async fn flush_pending(&self) {
        for claim in self.pending.idle() {
            match self.release_once(claim.key(), claim.owner()).await {
                Ok(_) => claim.settle(),
                Err(e) => {
                    tracing::debug!(key = %claim.key(), error = %e, "a pending release failed again");
                    break;
                }
            }
        }
    }

    /// Puts the description on the hold's own lease, in a Txn that checks
    /// the token and the lease, so it ends with the hold.
    pub(crate) async fn describe(
        &self,
        key: &LockKey,
        owner: &Token,
        text: &str,
    ) -> Result<bool, Error> {
        let k = self.keys.lock(key);
        let resp = self.io.get(k.clone(), None).await?;
        let Some(kv) = resp
            .kvs()
            .first()
            .filter(|kv| kv.value() == owner.as_str().as_bytes())
        else {
            return Ok(false);
        };
        let lease = kv.lease();
        let put = PutOptions::new().with_lease(lease);
        let txn = Txn::new()
            .when([
                Compare::value(k.clone(), CompareOp::Equal, owner.as_str()),
                Compare::lease(k, CompareOp::Equal, lease),
            ])
            .and_then([TxnOp::put(self.keys.info(key), text, Some(put))]);
        Ok(self.io.txn(txn).await.map_err(map)?.succeeded())
    }

    /// Lifts the key's fence offset so that `create revision + offset`
    /// exceeds `minimum` for every later hold: revisions only grow and the
    /// offset never shrinks.
    pub(crate) async fn raise_fence(&self, key: &LockKey, minimum: Fence) -> Result<(), Error> {
        let minimum = i64::try_from(minimum.get()).map_err(|_| {
            Error::config(format!("fence minimum {minimum} exceeds etcd's revisions"))
        })?;
        let offset_key = self.keys.offset(key);
        for _ in 0..RAISE_TRIES {
            let resp = self.io.get(offset_key.clone(), None).await?;
            let revision = resp.header().map_or(0, |h| h.revision());
            let stored = resp.kvs().first();
            let offset = stored.map_or(0, |kv| crate::txn::parse_offset(kv.value()));
            let needed = minimum.saturating_sub(revision);
            if needed <= offset {
                return Ok(());
            }
            // Written only if no other raise wrote since the read, so a
            // raise that lands late (its caller gave up on it) can never
            // lower an offset a later raise set.
            let seen = stored.map_or(0, |kv| kv.mod_revision());
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    offset_key.clone(),
                    CompareOp::Equal,
                    seen,
                )])
                .and_then([TxnOp::put(offset_key.clone(), needed.to_string(), None)]);
            if self.io.txn(txn).await.map_err(map)?.succeeded() {
                return Ok(());
            }
        }
        Err(Error::store(
            NAME,
            format!("raising the fence of {key:?} lost {RAISE_TRIES} races in a row"),
            true,
        ))
    }
}
