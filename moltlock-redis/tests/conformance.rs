//! The whole conformance suite against one Redis: `MOLTLOCK_REDIS_URL` if
//! set (under a unique key prefix, with fence keys expiring after 10
//! minutes, as the fixture's URL of a shared server says), else a
//! `redis-server` this test starts (one per case).

use moltlock_fixtures::redis as fx;
use moltlock_redis::{RedisBackend, RedisConfig};

fn store() -> moltlock_conformance::Factory {
    let prefix = fx::unique_prefix();
    moltlock_fixtures::conformance_factory(fx::redis(), move |server| {
        let prefix = prefix.clone();
        async move {
            let cfg = RedisConfig::from_url(&server.url())?.key_prefix(prefix);
            RedisBackend::connect(cfg).await
        }
    })
}

moltlock_conformance::conformance_tests!(store());
