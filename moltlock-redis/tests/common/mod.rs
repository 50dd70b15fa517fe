//! `cas_multi` checks shared by the single-server and Cluster tests, and
//! counters of the script calls a server ran.

#![allow(dead_code)] // each test file uses a part

use std::time::Duration;

use moltlock_core::{
    Backend, CasMulti, CasOutcome, Fence, Held, Inspect, LockKey, MultiMode, MultiOutcome, Token,
};
use moltlock_redis::{redis, RedisBackend};

/// A test's result.
pub type Res<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// The backend's own `CasMulti` (it must hand one out).
pub fn batch(b: &RedisBackend) -> Res<&dyn CasMulti> {
    b.batch_cas()
        .ok_or_else(|| "the Redis backend hands out no CasMulti".into())
}

/// Keys from text.
pub fn keys<const N: usize>(names: [&str; N]) -> Res<[LockKey; N]> {
    let mut out = Vec::new();
    for n in names {
        out.push(LockKey::new(n)?);
    }
    out.try_into().map_err(|_| "key count".into())
}

const TTL: Duration = Duration::from_secs(20);

/// The fences of an `Acquired`, by index, or an error naming what came.
pub fn acquired(out: MultiOutcome) -> Res<Vec<(usize, Fence)>> {
    match out {
        MultiOutcome::Acquired(v) => Ok(v),
        other => Err(format!("expected Acquired, got {other:?}").into()),
    }
}

/// The busy keys of a `Held`.
pub fn held(out: MultiOutcome) -> Res<Vec<(usize, Held)>> {
    match out {
        MultiOutcome::Held(v) => Ok(v),
        other => Err(format!("expected Held, got {other:?}").into()),
    }
}

async fn take(b: &RedisBackend, key: &LockKey, token: &Token, ttl: Duration) -> Res<Fence> {
    match b.cas(key, None, token, ttl).await? {
        CasOutcome::Acquired { fence } => Ok(fence),
        CasOutcome::Held(h) => Err(format!("{key:?} held: {h:?}").into()),
    }
}

async fn holder(b: &RedisBackend, key: &LockKey) -> Res<Option<Token>> {
    Ok(Inspect::inspect(b, key).await?.map(|i| i.holder))
}

async fn free_all(b: &RedisBackend, keys: &[LockKey], token: &Token) -> Res {
    for k in keys {
        b.delete(k, token).await?;
    }
    Ok(())
}

/// `All` with one key held by another token: `Held` naming that key and
/// holder, nothing else taken; a key the caller holds itself counts as
/// held; once free, every key is taken with its fence.
pub async fn all_is_atomic(b: &RedisBackend, k: &[LockKey; 3]) -> Res {
    let (me, other) = (Token::random(), Token::random());
    take(b, &k[1], &other, TTL).await?;
    let busy = held(batch(b)?.cas_multi(k, &me, TTL, MultiMode::All).await?)?;
    assert_eq!(busy.len(), 1, "{busy:?}");
    assert_eq!(busy[0].0, 1);
    assert_eq!(busy[0].1.holder.as_ref(), Some(&other));
    assert!(busy[0]
        .1
        .expires_in
        .is_some_and(|e| e <= TTL && !e.is_zero()));
    assert_eq!(holder(b, &k[0]).await?, None);
    assert_eq!(holder(b, &k[2]).await?, None);
    assert!(b.delete(&k[1], &other).await?);

    take(b, &k[2], &me, TTL).await?;
    let busy = held(batch(b)?.cas_multi(k, &me, TTL, MultiMode::All).await?)?;
    assert_eq!(busy.len(), 1, "{busy:?}");
    assert_eq!((busy[0].0, busy[0].1.holder.as_ref()), (2, Some(&me)));
    assert_eq!(holder(b, &k[0]).await?, None);
    assert!(b.delete(&k[2], &me).await?);

    let taken = acquired(batch(b)?.cas_multi(k, &me, TTL, MultiMode::All).await?)?;
    assert_eq!(taken.iter().map(|t| t.0).collect::<Vec<_>>(), [0, 1, 2]);
    for key in k {
        assert_eq!(holder(b, key).await?, Some(me.clone()));
    }
    free_all(b, k, &me).await
}

/// `Any` takes the first free key in the order given; with none free it
/// reports every key (the caller's own hold as held by it).
pub async fn any_takes_first_free(b: &RedisBackend, k: &[LockKey; 3]) -> Res {
    let (me, other) = (Token::random(), Token::random());
    take(b, &k[0], &other, TTL).await?;
    let taken = acquired(batch(b)?.cas_multi(k, &me, TTL, MultiMode::Any).await?)?;
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].0, 1);
    assert_eq!(holder(b, &k[1]).await?, Some(me.clone()));
    assert_eq!(holder(b, &k[2]).await?, None);

    let two = &k[..2];
    let busy = held(batch(b)?.cas_multi(two, &me, TTL, MultiMode::Any).await?)?;
    let holders: Vec<_> = busy.iter().map(|(i, h)| (*i, h.holder.clone())).collect();
    assert_eq!(holders, [(0, Some(other.clone())), (1, Some(me.clone()))]);

    let taken = acquired(batch(b)?.cas_multi(k, &me, TTL, MultiMode::Any).await?)?;
    assert_eq!(taken.iter().map(|t| t.0).collect::<Vec<_>>(), [2]);
    assert!(b.delete(&k[0], &other).await?);
    free_all(b, k, &me).await
}

/// Each fence a `cas_multi` hands out is greater than every earlier fence
/// of its key (from `cas` or `cas_multi`), and later ones exceed it.
pub async fn fences_are_fresh(b: &RedisBackend, k: &[LockKey; 3]) -> Res {
    let me = Token::random();
    let mut last = Vec::new();
    for key in k {
        last.push(take(b, key, &me, TTL).await?);
    }
    free_all(b, k, &me).await?;
    for round in 0..3 {
        let mode = if round == 1 {
            MultiMode::Any
        } else {
            MultiMode::All
        };
        let taken = acquired(batch(b)?.cas_multi(k, &me, TTL, mode).await?)?;
        for (i, fence) in taken {
            assert!(
                fence > last[i],
                "round {round} key {i}: {fence:?} after {:?}",
                last[i]
            );
            let seen = Inspect::inspect(b, &k[i]).await?.and_then(|h| h.fence);
            assert_eq!(seen, Some(fence));
            last[i] = fence;
        }
        free_all(b, k, &me).await?;
    }
    for (i, key) in k.iter().enumerate() {
        let fence = take(b, key, &me, TTL).await?;
        assert!(fence > last[i]);
    }
    free_all(b, k, &me).await
}

/// Holds taken by `cas_multi` expire by the server's clock (`PX`): busy
/// until their TTL has passed, then free for another token.
pub async fn expiry_by_server_clock(b: &RedisBackend, k: &[LockKey; 3]) -> Res {
    let (first, second) = (Token::random(), Token::random());
    let ttl = Duration::from_millis(300);
    acquired(batch(b)?.cas_multi(k, &first, ttl, MultiMode::All).await?)?;
    let busy = held(batch(b)?.cas_multi(k, &second, TTL, MultiMode::All).await?)?;
    assert!(!busy.is_empty(), "an All reports a busy key");
    for (_, h) in &busy {
        assert_eq!(h.holder.as_ref(), Some(&first));
        assert!(h.expires_in.is_some_and(|e| e <= ttl), "{h:?}");
    }
    tokio::time::sleep(ttl + Duration::from_millis(200)).await;
    let taken = acquired(batch(b)?.cas_multi(k, &second, TTL, MultiMode::All).await?)?;
    assert_eq!(taken.len(), 3);
    free_all(b, k, &second).await
}

/// Every check above, in turn, on the same keys (each leaves them free).
pub async fn all_checks(b: &RedisBackend, k: &[LockKey; 3]) -> Res {
    all_is_atomic(b, k).await?;
    any_takes_first_free(b, k).await?;
    fences_are_fresh(b, k).await?;
    expiry_by_server_clock(b, k).await
}

async fn conn(url: &str) -> Res<redis::aio::MultiplexedConnection> {
    Ok(redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?)
}

/// Resets the command statistics of every server at `urls`.
pub async fn reset_stats(urls: &[String]) -> Res {
    for url in urls {
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut conn(url).await?)
            .await?;
    }
    Ok(())
}

/// The `EVALSHA` and `EVAL` calls the servers at `urls` ran since their
/// statistics were reset (each one request from a client).
pub async fn script_calls(urls: &[String]) -> Res<(u64, u64)> {
    let (mut evalsha, mut eval) = (0, 0);
    for url in urls {
        let stats: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn(url).await?)
            .await?;
        evalsha += calls(&stats, "evalsha");
        eval += calls(&stats, "eval");
    }
    Ok((evalsha, eval))
}

fn calls(stats: &str, command: &str) -> u64 {
    let head = format!("cmdstat_{command}:calls=");
    stats
        .lines()
        .find_map(|l| l.strip_prefix(head.as_str()))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}
