//! The whole conformance suite against one Redis: `MOLTLOCK_REDIS_URL` if
//! set, else a `redis-server` this test starts (one per case).

use std::sync::Arc;

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
            let url = match server.as_ref() {
                Ok(s) => s.url(),
                Err(e) => return Err(Error::Config(e.clone())),
            };
            let cfg = RedisConfig::builder()
                .url(&url)?
                .key_prefix(prefix)
                .build()?;
            RedisBackend::connect(cfg).await
        }
    })
}

moltlock_conformance::conformance_tests!(store());
