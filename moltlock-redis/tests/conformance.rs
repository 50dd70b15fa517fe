//! The whole conformance suite against one Redis: `MOLTLOCK_REDIS_URL` if
//! set (under a unique key prefix, with fence keys expiring after 10
//! minutes), else a `redis-server` this test starts (one per case).

use std::sync::Arc;
use std::time::Duration;

use moltlock_conformance::fixtures::redis as fx;
use moltlock_core::Error;
use moltlock_redis::{RedisBackend, RedisConfig};

fn store() -> moltlock_conformance::Factory {
    let server = Arc::new(fx::redis());
    let prefix = fx::unique_prefix();
    moltlock_conformance::factory(move || {
        let server = server.clone();
        let prefix = prefix.clone();
        async move {
            let server = match server.as_ref() {
                Ok(s) => s,
                Err(e) => return Err(Error::Config(e.clone())),
            };
            let mut cfg = RedisConfig::from_url(&server.url())?.key_prefix(prefix);
            if let fx::RedisServer::Shared(_) = server {
                // Leave nothing behind on a shared server for long.
                cfg = cfg.fence_retention(Duration::from_secs(600));
            }
            RedisBackend::connect(cfg).await
        }
    })
}

moltlock_conformance::conformance_tests!(store(), without: [fair_queue]);
