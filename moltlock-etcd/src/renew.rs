//! Renewal rounds: one keep-alive per lease in use, then a check that each
//! hold still carries its token, by one lease query per lease (trusting the
//! written-token cache) and reads only for the keys whose last write is
//! uncertain.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use etcd_client::{Txn, TxnOp, TxnOpResponse};
use moltlock_core::{Error, RenewItem};

use crate::core::Core;
use crate::error::{map, NAME};

/// etcd's default limit of operations in one Txn is 128; batches stay below.
const TXN_CHUNK: usize = 100;

impl Core {
    /// Renews every item's lease; returns, per item, whether it still holds.
    /// A lease that is gone makes every hold on it report not held.
    pub(crate) async fn renew_many(
        self: &Arc<Self>,
        items: &[RenewItem],
    ) -> Result<Vec<bool>, Error> {
        // Deletes left over from an outage (up to 4,096, one request each)
        // must not hold up the keep-alive: they run beside it.
        let core = self.clone();
        tokio::spawn(async move { core.flush_pending().await });
        let mut groups: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        for (i, item) in items.iter().enumerate() {
            groups
                .entry(self.session.secs_for(item.ttl))
                .or_default()
                .push(i);
        }
        let mut out = vec![false; items.len()];
        for idx in groups.values() {
            let Some(first) = idx.first() else { continue };
            let Some(lease) = self.session.renew(items[*first].ttl).await? else {
                continue;
            };
            let group: Vec<&RenewItem> = idx.iter().map(|i| &items[*i]).collect();
            let held = self.still_held_on(lease.id, &group).await?;
            for (i, h) in idx.iter().zip(held) {
                out[*i] = h;
            }
        }
        Ok(out)
    }

    /// Which of `items` (all on lease `lease`) still hold their keys: one
    /// lease query for the keys whose last write by this session is known,
    /// a read for the rest (and for all, should the query fail).
    async fn still_held_on(&self, lease: i64, items: &[&RenewItem]) -> Result<Vec<bool>, Error> {
        let attached = self.attached_keys(lease).await;
        let mut out = vec![false; items.len()];
        let mut unknown = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let k = self.keys.lock(&item.key);
            match &attached {
                Some(keys) if self.written.is(&k, &item.token) => out[i] = keys.contains(&k),
                _ => unknown.push(i),
            }
        }
        if !unknown.is_empty() {
            let rest: Vec<&RenewItem> = unknown.iter().map(|i| items[*i]).collect();
            for (i, h) in unknown.iter().zip(self.still_held(&rest).await?) {
                out[*i] = h;
            }
        }
        Ok(out)
    }

    /// The keys attached to `lease`, or `None` when etcd would not say.
    async fn attached_keys(&self, lease: i64) -> Option<HashSet<Vec<u8>>> {
        match self.io.lease_ttl(lease, true).await {
            Ok(r) if r.ttl() > 0 => Some(r.keys().iter().cloned().collect()),
            Ok(_) => Some(HashSet::new()),
            Err(e) => {
                tracing::debug!(error = %e, "lease query failed; reading keys instead");
                None
            }
        }
    }

    /// Whether each `(key, token)` still holds, in Txns of at most
    /// [`TXN_CHUNK`] reads.
    async fn still_held(&self, items: &[&RenewItem]) -> Result<Vec<bool>, Error> {
        let mut out = Vec::with_capacity(items.len());
        for chunk in items.chunks(TXN_CHUNK) {
            let gets: Vec<TxnOp> = chunk
                .iter()
                .map(|i| TxnOp::get(self.keys.lock(&i.key), None))
                .collect();
            let resp = self.io.txn(Txn::new().and_then(gets)).await.map_err(map)?;
            let answers = resp.op_responses();
            if answers.len() != chunk.len() {
                return Err(Error::store(NAME, "a renewal read answered short", true));
            }
            for (item, answer) in chunk.iter().zip(answers) {
                out.push(matches!(&answer, TxnOpResponse::Get(g)
                    if g.kvs().first().is_some_and(|kv| kv.value() == item.token.as_str().as_bytes())));
            }
        }
        Ok(out)
    }
}
