//! Batch renewal on one server: many scripts' worth of holds in one call,
//! each answered for itself, none recreated.

use std::time::Duration;

use moltlock_core::{Backend, BackendExt, LockKey, RenewItem, Token};
use moltlock_fixtures::redis as fx;
use moltlock_redis::{redis, RedisBackend, RedisConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renews_thousands_of_holds_each_for_itself() -> Result<(), Box<dyn std::error::Error>> {
    let server = fx::redis()?;
    let prefix = fx::unique_prefix();
    let cfg = RedisConfig::from_url(&server.url())?
        .key_prefix(prefix.clone())
        .fence_retention(Duration::from_secs(60));
    let backend = RedisBackend::connect(cfg).await?;
    let short = Duration::from_secs(5);
    let mut items = Vec::new();
    for i in 0..2_500 {
        let key = LockKey::new(format!("renew/{i}"))?;
        let token = Token::random();
        if i % 11 != 5 {
            backend.cas(&key, None, &token, short).await?; // 5 and every 11th: never held
        }
        // Every 7th item names a token that does not hold its key.
        let token = if i % 7 == 3 { Token::random() } else { token };
        items.push(RenewItem {
            key,
            token,
            ttl: Duration::from_secs(60),
        });
    }
    let done = backend.renew_many(&items).await?;
    assert_eq!(done.len(), items.len());
    let mut conn = redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?;
    for (i, (item, renewed)) in items.iter().zip(&done).enumerate() {
        let expected = i % 11 != 5 && i % 7 != 3;
        assert_eq!(*renewed, expected, "item {i}");
        let stored = format!("{prefix}{{{}}}", item.key.as_str());
        let pttl: i64 = redis::cmd("PTTL")
            .arg(&stored)
            .query_async(&mut conn)
            .await?;
        match (i % 11 != 5, expected) {
            (false, _) => assert_eq!(pttl, -2, "item {i}: a key never held was created"),
            (true, true) => assert!(pttl > 10_000, "item {i}: not renewed ({pttl} ms)"),
            (true, false) => assert!(pttl <= 5_000, "item {i}: renewed by a stranger"),
        }
    }
    let _: () = redis::cmd("EVAL")
        .arg("for _, k in ipairs(redis.call('KEYS', ARGV[1])) do redis.call('DEL', k) end")
        .arg(0)
        .arg(format!("{prefix}*"))
        .query_async(&mut conn)
        .await?;
    Ok(())
}
