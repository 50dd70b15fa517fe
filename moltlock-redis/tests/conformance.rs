//! The whole conformance suite against one Redis: `MOLTLOCK_REDIS_URL` if
//! set (under a unique key prefix, with fence keys expiring after 10
//! minutes), else a `redis-server` this test starts (one per case).

use std::time::Duration;

use moltlock_fixtures::redis as fx;
use moltlock_redis::{RedisBackend, RedisConfig};

fn store() -> moltlock_conformance::Factory {
    let prefix = fx::unique_prefix();
    moltlock_fixtures::conformance_factory(fx::redis(), move |server| {
        let prefix = prefix.clone();
        async move {
            let mut cfg = RedisConfig::from_url(&server.url())?.key_prefix(prefix);
            if let fx::RedisServer::Shared(_) = server.as_ref() {
                // Leave nothing behind on a shared server for long.
                cfg = cfg.fence_retention(Duration::from_secs(600));
            }
            RedisBackend::connect(cfg).await
        }
    })
}

moltlock_conformance::conformance_tests!(store());
