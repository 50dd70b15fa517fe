//! MoltLock itself as a [`Locker`]: `acquire` through a `LockManager`, in
//! the default mode or the backend's fair queue.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use moltlock::{Backend, Error, LockGuard, LockManager, LockOptions};

use crate::workload::{Holding, Locker};

/// A manager and the mode it acquires in.
pub struct MoltLocker {
    manager: LockManager,
    fair: bool,
}

impl MoltLocker {
    /// A locker over `backend` with default manager settings.
    ///
    /// # Errors
    /// A TTL the backend rejects.
    pub fn new(backend: Arc<dyn Backend>, fair: bool) -> Result<Self, String> {
        let manager = LockManager::builder(backend)
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Self { manager, fair })
    }
}

#[async_trait]
impl Locker for MoltLocker {
    async fn lock(&self, key: &str, wait: Duration) -> Result<Option<Box<dyn Holding>>, String> {
        let mut opts = LockOptions::new().timeout(wait);
        if self.fair {
            opts = opts.fair();
        }
        match self.manager.acquire(key, opts).await {
            Ok(Some(guard)) => Ok(Some(Box::new(MoltHold(guard)))),
            Ok(None) | Err(Error::Timeout { .. }) => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }
}

struct MoltHold(LockGuard);

#[async_trait]
impl Holding for MoltHold {
    async fn release(self: Box<Self>) -> Result<(), String> {
        self.0.release().await.map_err(|e| e.to_string())
    }

    fn fence(&self) -> Option<u64> {
        Some(self.0.fence().0)
    }
}
