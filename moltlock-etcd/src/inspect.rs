//! Reading holds: the holder of one key, every hold under a prefix, and
//! what they carry (fence with the key's raised minimum, time left on the
//! lease, description). Both paths build their answers with one function,
//! so `inspect` and `list` report the same fence for the same hold.

use std::collections::HashMap;
use std::time::Duration;

use etcd_client::{GetOptions, KeyValue};
use moltlock_core::{Error, Fence, HolderInfo, LockKey, Token};

use crate::core::Core;
use crate::keys::Stored;
use crate::txn::{offset_fence, parse_offset};

/// Time left per lease id, so a listing asks once per lease.
type LeaseTtls = HashMap<i64, Option<Duration>>;

impl Core {
    /// The current holder of `key`, if any.
    pub(crate) async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        let resp = self.io.get(self.keys.lock(key), None).await?;
        let Some(kv) = resp.kvs().first() else {
            return Ok(None);
        };
        let (_, offset) = self.read_offset(key).await?;
        let description = self.description(key).await?;
        let name = key.as_str().to_owned();
        let mut ttls = HashMap::new();
        let info = self.holder_info(name, kv, offset, description, &mut ttls);
        Ok(Some(info.await?))
    }

    /// Every hold whose key starts with `prefix`, read in one range: a
    /// key's fence offset (`<key>\0fence`) and description (`<key>\0info`)
    /// sort right after the key and are in the same range.
    pub(crate) async fn list(&self, prefix: &str) -> Result<Vec<HolderInfo>, Error> {
        let opts = GetOptions::new().with_prefix();
        let resp = self.io.get(self.keys.range(prefix), Some(opts)).await?;
        let mut offsets = HashMap::new();
        let mut descriptions = HashMap::new();
        let mut holds = Vec::new();
        for kv in resp.kvs() {
            let name = String::from_utf8_lossy(kv.key());
            match self.keys.classify(&name) {
                Some(Stored::Lock(key)) => holds.push((key.to_owned(), kv)),
                Some(Stored::Offset(key)) => {
                    offsets.insert(key.to_owned(), parse_offset(kv.value()));
                }
                Some(Stored::Info(key)) => {
                    let text = String::from_utf8_lossy(kv.value()).into_owned();
                    descriptions.insert(key.to_owned(), text);
                }
                Some(Stored::Other) | None => {}
            }
        }
        let mut ttls = HashMap::new();
        let mut out = Vec::with_capacity(holds.len());
        for (key, kv) in holds {
            let offset = offsets.get(&key).copied().unwrap_or(0);
            let description = descriptions.remove(&key);
            out.push(
                self.holder_info(key, kv, offset, description, &mut ttls)
                    .await?,
            );
        }
        Ok(out)
    }

    /// The current revision and the key's fence offset.
    pub(crate) async fn read_offset(&self, key: &LockKey) -> Result<(i64, i64), Error> {
        let resp = self.io.get(self.keys.offset(key), None).await?;
        let revision = resp.header().map_or(0, |h| h.revision());
        let offset = resp.kvs().first().map_or(0, |kv| parse_offset(kv.value()));
        Ok((revision, offset))
    }

    /// The description stored with `key`'s hold, if any.
    async fn description(&self, key: &LockKey) -> Result<Option<String>, Error> {
        let resp = self.io.get(self.keys.info(key), None).await?;
        Ok(resp
            .kvs()
            .first()
            .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()))
    }

    /// What `inspect` and `list` report for the hold `kv` of `key`.
    async fn holder_info(
        &self,
        key: String,
        kv: &KeyValue,
        offset: i64,
        description: Option<String>,
        ttls: &mut LeaseTtls,
    ) -> Result<HolderInfo, Error> {
        let expires_in = match ttls.get(&kv.lease()) {
            Some(t) => *t,
            None => {
                let t = self.lease_left(kv.lease()).await?;
                ttls.insert(kv.lease(), t);
                t
            }
        };
        Ok(HolderInfo {
            key,
            holder: Token::from_stored(String::from_utf8_lossy(kv.value())),
            // Only an acquisition or a hand-over writes the key, so its mod
            // revision is the revision that gave it to its holder.
            fence: u64::try_from(kv.mod_revision())
                .ok()
                .map(|r| offset_fence(Fence(r), offset)),
            expires_in,
            description,
        })
    }

    /// The time left on `lease` (`None` for no lease, or one that is gone).
    async fn lease_left(&self, lease: i64) -> Result<Option<Duration>, Error> {
        if lease == 0 {
            return Ok(None);
        }
        match self.io.lease_ttl(lease, false).await {
            Ok(r) => Ok(u64::try_from(r.ttl()).ok().map(Duration::from_secs)),
            Err(e) if e.is_retryable() => Err(e),
            Err(_) => Ok(None),
        }
    }
}
