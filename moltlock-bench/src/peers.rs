//! What users would pick instead, run with the same workloads: the `rslock`
//! crate (Redlock, here on one Redis instance) with its default retry
//! settings, and etcd's own Lock RPC through `etcd-client`'s lock client.

use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::workload::{Holding, Locker};

/// rslock's lock TTL in these runs.
const RSLOCK_TTL: Duration = Duration::from_secs(30);
/// The lease TTL of the etcd Lock RPC peer (seconds); revoked at the end.
const ETCD_LEASE_SECS: i64 = 120;

/// Redlock through the `rslock` crate, on one Redis.
pub struct Rslock {
    manager: rslock::LockManager,
}

impl Rslock {
    /// A Redlock manager on the one server `url` names.
    ///
    /// # Errors
    /// A URL the Redis client cannot parse.
    pub fn new(url: &str) -> Result<Self, String> {
        // rslock panics on a bad URL; check it with the other client first.
        redis::Client::open(url).map_err(|e| format!("rslock: {e}"))?;
        Ok(Self {
            manager: rslock::LockManager::new(vec![url.to_owned()]),
        })
    }
}

#[async_trait]
impl Locker for Rslock {
    /// rslock's `lock` tries three times with a random delay of up to
    /// 200 ms, then gives up; like its own `acquire`, ask again until the
    /// wait runs out.
    async fn lock(&self, key: &str, wait: Duration) -> Result<Option<Box<dyn Holding>>, String> {
        let until = Instant::now() + wait;
        loop {
            match self.manager.lock(key, RSLOCK_TTL).await {
                Ok(lock) => {
                    let hold = RslockHold {
                        manager: self.manager.clone(),
                        lock,
                    };
                    return Ok(Some(Box::new(hold)));
                }
                Err(rslock::LockError::Unavailable) => {}
                Err(e) => return Err(format!("rslock: {e}")),
            }
            if Instant::now() >= until {
                return Ok(None);
            }
        }
    }
}

struct RslockHold {
    manager: rslock::LockManager,
    lock: rslock::Lock,
}

#[async_trait]
impl Holding for RslockHold {
    async fn release(self: Box<Self>) -> Result<(), String> {
        self.manager.unlock(&self.lock).await;
        Ok(())
    }
}

/// etcd's Lock RPC (the server-side lock of `etcdctl lock`), on a lease of
/// its own.
pub struct EtcdLockRpc {
    client: etcd_client::Client,
    lease: i64,
    prefix: String,
}

impl EtcdLockRpc {
    /// Connects and grants the lease its locks hang on.
    ///
    /// # Errors
    /// Connection errors, as text.
    pub async fn connect(endpoints: &[String], prefix: &str) -> Result<Self, String> {
        let mut client = etcd_client::Client::connect(endpoints, None)
            .await
            .map_err(|e| format!("etcd: {e}"))?;
        let lease = client
            .lease_grant(ETCD_LEASE_SECS, None)
            .await
            .map_err(|e| format!("etcd: {e}"))?
            .id();
        Ok(Self {
            client,
            lease,
            prefix: prefix.to_owned(),
        })
    }
}

#[async_trait]
impl Locker for EtcdLockRpc {
    async fn lock(&self, key: &str, wait: Duration) -> Result<Option<Box<dyn Holding>>, String> {
        let mut client = self.client.clone();
        let opts = etcd_client::LockOptions::new().with_lease(self.lease);
        let name = format!("{}rpc/{key}", self.prefix);
        match tokio::time::timeout(wait, client.lock(name, Some(opts))).await {
            Err(_) => Ok(None),
            Ok(Err(e)) => Err(format!("etcd lock: {e}")),
            Ok(Ok(resp)) => Ok(Some(Box::new(EtcdRpcHold {
                client: self.client.clone(),
                key: resp.key().to_vec(),
            }))),
        }
    }

    async fn close(&self) {
        let mut client = self.client.clone();
        let _ = client.lease_revoke(self.lease).await;
    }
}

struct EtcdRpcHold {
    client: etcd_client::Client,
    key: Vec<u8>,
}

#[async_trait]
impl Holding for EtcdRpcHold {
    async fn release(self: Box<Self>) -> Result<(), String> {
        let mut client = self.client.clone();
        client
            .unlock(self.key)
            .await
            .map(|_| ())
            .map_err(|e| format!("etcd unlock: {e}"))
    }
}
